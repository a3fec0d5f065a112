"""Hydraulis Alg. 1's dispatch, a planner part (decision 106): select.assign packs its best shuffle too (never worse
than Alg. 1 + the same packer), and the Hydraulis baseline dispatches with it. `alg1_trial` (one shuffle, written
once) runs compiled where numba is installed, else as the same plain Python (decision 89); the result is re-scored
with the pipelines' own pricing rule (`PipeCost.eq1`, decision 97). When every pipeline has one stage (Q = 0),
`alg1_trial_classes` makes the same choices, float for float, in O(classes log D) per sequence instead of O(D)
(issue 27: 20 ms of a 1024-GPU proposal step's plan time went to this loop).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from tidal.planner.bounds import PipeCost
from tidal.planner.dispatch import DispatchResult, check_dispatch, owner_result
from tidal.planner.pipecost import pipe_coeffs


def alg1_trial(l_, perm, A, B, C, Q, M):
    """One shuffle of Hydraulis Alg. 1: sequences in `perm` order, each to the pipeline j with MaxLen M[j] >= its
    length x that minimises max(C_j + T_j(x) + E_j', max over k != j of C_k + E_k), T_j(l) = A l^2 + B l + C (C holds
    Hydraulis' per-sequence constant c + d), E_j = T_j(l_max,j) Q[j] (Q = PP - 1); ties to the lowest j. The largest
    C_k + E_k and the largest over the others are kept incrementally (totals only grow). Returns (owner, objective
    max_j C_j + E_j); objective -1.0 when a sequence fits no pipeline."""
    D = A.size
    Cj = np.zeros(D)
    tot = np.zeros(D)  # C_j + E_j
    lmax = np.zeros(D, np.int64)
    owner = np.empty(l_.size, np.int64)
    k1 = 0  # first index of the largest C_k + E_k
    second = 0.0  # the largest over the others
    for t in range(perm.size):
        i = perm[t]
        x = l_[i]
        o_min = np.inf
        jb = -1
        for j in range(D):
            if x > M[j]:
                continue
            lm = x if x > lmax[j] else lmax[j]
            o = Cj[j] + A[j] * x * x + B[j] * x + C[j] + (A[j] * lm * lm + B[j] * lm + C[j]) * Q[j]
            oth = second if j == k1 else tot[k1]
            if oth > o:
                o = oth
            if o < o_min:
                o_min = o
                jb = j
        if jb < 0:
            return owner, -1.0
        Cj[jb] += A[jb] * x * x + B[jb] * x + C[jb]
        if x > lmax[jb]:
            lmax[jb] = x
        lm = lmax[jb]
        tt = Cj[jb] + (A[jb] * lm ** 2 + B[jb] * lm + C[jb]) * Q[jb]
        tot[jb] = tt
        if jb != k1 and (tt > tot[k1] or (tt == tot[k1] and jb < k1)):
            second = tot[k1]
            k1 = jb
        elif jb != k1 and tt > second:
            second = tt
        owner[i] = jb
    return owner, max(0.0, tot.max())


def alg1_trial_classes(l_, perm, A, B, C, Q, M, cls, pos, cP, toff, crep, jat):
    """`alg1_trial` when every Q[j] = 0 (E_j = 0, so C_j + E_j = C_j): the same owners and objective, float for float.
    The pipelines fall into classes of equal (A, B, C, M) (cls[j], its position pos[j] among the class's pipelines in
    index order; crep[c]: one of them). Within a class, a pipeline j != k1 scores max(C_j + T(x), C_k1), which does not
    decrease with C_j (float sums are monotone), so the class's least score is that of its least C_j, and the lowest j
    reaching it is the leftmost leaf of a min-tree over C_j (class c's nodes at toff[c] + 1 .. toff[c] + 2 cP[c] - 1,
    leaves from toff[c] + cP[c], jat: the pipeline of each leaf, -1 padding) whose score is <= it. k1 is scored as in
    alg1_trial (against the second largest) and kept out of the trees (its leaf at inf). Candidates compare by
    (score, j), as alg1_trial's first strict minimum over j does. alg1_trial's E terms are (finite) x 0.0, a zero here,
    and adding a zero leaves these non-negative sums unchanged: they and the lengths they need are left out."""
    D = A.size
    nC = cP.size
    Cj = np.zeros(D)
    tot = np.zeros(D)
    owner = np.empty(l_.size, np.int64)
    tree = np.full(jat.size, np.inf)
    for j in range(1, D):  # k1 = 0 stays out
        tree[toff[cls[j]] + cP[cls[j]] + pos[j]] = 0.0
    for c in range(nC):
        for nd in range(cP[c] - 1, 0, -1):
            a_, b_ = tree[toff[c] + 2 * nd], tree[toff[c] + 2 * nd + 1]
            tree[toff[c] + nd] = a_ if a_ < b_ else b_
    k1 = 0
    second = 0.0
    for t in range(perm.size):
        i = perm[t]
        x = l_[i]
        o_min = np.inf
        jb = -1
        if x <= M[k1]:  # k1, as alg1_trial scores it
            o = Cj[k1] + A[k1] * x * x + B[k1] * x + C[k1]
            if second > o:
                o = second
            o_min = o
            jb = k1
        for c in range(nC):
            r = crep[c]
            base, P = toff[c], cP[c]
            mn = tree[base + 1]
            if x > M[r] or mn == np.inf:
                continue
            ob = mn + A[r] * x * x + B[r] * x + C[r]
            if tot[k1] > ob:
                ob = tot[k1]
            nd = 1
            while nd < P:  # the leftmost leaf whose score is <= ob
                nd = 2 * nd if tree[base + 2 * nd] + A[r] * x * x + B[r] * x + C[r] <= ob else 2 * nd + 1
            j = jat[base + nd]
            if ob < o_min or (ob == o_min and j < jb):
                o_min = ob
                jb = j
        if jb < 0:
            return owner, -1.0
        Cj[jb] += A[jb] * x * x + B[jb] * x + C[jb]
        tt = Cj[jb]
        tot[jb] = tt
        old = k1
        if jb != k1 and (tt > tot[k1] or (tt == tot[k1] and jb < k1)):
            second = tot[k1]
            k1 = jb
        elif jb != k1 and tt > second:
            second = tt
        for u in range(2):  # jb's leaf (inf if it is k1), then the former k1's back in its tree if k1 changed
            if u == 0:
                j, v = jb, (np.inf if jb == k1 else Cj[jb])
            elif old != k1:
                j, v = old, Cj[old]
            else:
                break
            base, nd = toff[cls[j]], cP[cls[j]] + pos[j]
            tree[base + nd] = v
            nd //= 2
            while nd >= 1:
                a_, b_ = tree[base + 2 * nd], tree[base + 2 * nd + 1]
                tree[base + nd] = a_ if a_ < b_ else b_
                nd //= 2
        owner[i] = jb
    return owner, max(0.0, tot.max())


def class_layout(A, B, C, M):
    """alg1_trial_classes' classes of pipelines with equal (A, B, C, M), numbered by first appearance: (cls, pos,
    cP, toff, crep, jat)."""
    ids: dict = {}
    cls = np.array([ids.setdefault(k, len(ids)) for k in zip(A.tolist(), B.tolist(), C.tolist(), M.tolist())],
                   dtype=np.int64)
    size = np.bincount(cls, minlength=len(ids))
    order = np.argsort(cls, kind="stable")  # by class, index order within
    starts = np.concatenate(([0], np.cumsum(size)[:-1]))
    pos = np.empty(cls.size, np.int64)
    pos[order] = np.arange(cls.size) - np.repeat(starts, size)
    cP = np.array([1 << max(0, int(n - 1).bit_length()) for n in size.tolist()], dtype=np.int64)
    toff = np.concatenate(([0], np.cumsum(2 * cP)[:-1])).astype(np.int64)
    jat = np.full(int(2 * cP.sum()), -1, np.int64)
    jat[toff[cls] + cP[cls] + pos] = np.arange(cls.size)
    crep = order[starts].astype(np.int64)
    return cls, pos, cP, toff, crep, jat


def class_trial(kernel: Callable, fallback: Callable) -> Callable:
    """A trial with alg1_trial's signature that runs `kernel` (alg1_trial_classes, compiled or plain) on
    class_layout's classes when every Q is 0, else `fallback` (alg1_trial, compiled or plain)."""
    def trial(l_, perm, A, B, C, Q, M):
        if Q.size == 0 or (Q != 0).any():
            return fallback(l_, perm, A, B, C, Q, M)
        return kernel(l_, perm, A, B, C, Q, M, *class_layout(A, B, C, M))
    return trial


# with fewer pipelines than this, alg1_trial's plain scan is as fast (the same choices either way)
CLASS_MIN = 48


@functools.cache
def compiled(trial: Callable) -> Callable | None:
    """`trial` (alg1_trial or alg1_trial_classes) compiled (numba.njit, no fastmath: the same floats; cached on disk),
    None without numba."""
    from tidal.planner.kernels import AVAILABLE, njit

    return njit(cache=True)(trial) if AVAILABLE else None


def dispatch_hydraulis(lengths, pipes: Sequence[PipeCost], *, trials: int = 100, seed: int = 0,
                       trial: Callable | None = None) -> DispatchResult:
    """Hydraulis Alg. 1 (baseline): `trials` random shuffles (numpy default_rng(seed) permutations), each dispatched
    by `alg1_trial` with Hydraulis' per-sequence T(l) = a l^2 + b l + c (+ d, our per-document term) and E_j =
    T(l_max) (PP - 1). Returns the best trial, re-scored with our cost (dispatch.owner_result). `trial`: the function
    that runs one shuffle; None takes the compiled one where numba is installed, else `alg1_trial` as plain Python
    (the same choices, float for float)."""
    l_ = check_dispatch(lengths, pipes)
    M = np.array([p.max_len for p in pipes], dtype=np.int64)
    if trial is None:
        base = compiled(alg1_trial) or alg1_trial
        by_class = compiled(alg1_trial_classes) or alg1_trial_classes
        trial = base if len(pipes) < CLASS_MIN else class_trial(by_class, base)
    rng = np.random.default_rng(seed)
    A, B, c, d = pipe_coeffs(pipes)
    C = c + d  # per-sequence constant c + d
    Q1 = np.array([p.pp - 1 for p in pipes], dtype=np.float64)
    best_obj, best_owner = float("inf"), None
    for _ in range(trials):
        owner, obj = trial(l_, rng.permutation(l_.size), A, B, C, Q1, M)
        if obj < best_obj:
            best_obj, best_owner = obj, owner
    if best_owner is None:
        return DispatchResult(tuple(() for _ in pipes), 0.0, tuple(0.0 for _ in pipes))
    return owner_result(l_, pipes, best_owner)
