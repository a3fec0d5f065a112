"""Hydraulis Alg. 1's dispatch, a planner part (decision 106): select.assign packs its best shuffle too (never worse
than Alg. 1 + the same packer), and the Hydraulis baseline dispatches with it. `alg1_trial` (one shuffle, written
once) runs compiled where numba is installed, else as the same plain Python (decision 89); the result is re-scored
with the pipelines' own pricing rule (`PipeCost.eq1`, decision 97).
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


@functools.cache
def compiled_trial() -> Callable | None:
    """`alg1_trial` compiled (numba.njit, no fastmath: the same floats; cached on disk), None without numba."""
    from tidal.planner.kernels import AVAILABLE, njit

    return njit(cache=True)(alg1_trial) if AVAILABLE else None


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
        trial = compiled_trial() or alg1_trial
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
