"""Hydraulis Alg. 1, one random shuffle, in Python: the reference versions behind dispatch.dispatch_hydraulis (the
paper's per-pipeline loop, and the same choices with the scan over pipelines vectorised; kernels.alg1_trial is the
compiled one)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tidal.core.errors import TidalError
from tidal.planner.bounds import PipeCost


def _alg1_trial_loop(l_: np.ndarray, pipes: Sequence[PipeCost], perm: np.ndarray) -> tuple[np.ndarray, float]:
    """One shuffle of Hydraulis Alg. 1, one pipeline at a time as the paper writes it."""
    D = len(pipes)
    Cj, Ej, lmax = [0.0] * D, [0.0] * D, [0] * D
    cost = [(p.a, p.b, p.c + p.d, p.pp - 1, p.max_len) for p in pipes]  # Hydraulis' per-sequence constant: c + d
    owner = np.empty(l_.size, dtype=np.int64)
    tot = [0.0] * D
    k1, second = 0, 0.0  # first index of the largest C_k + E_k, and the largest over the others
    for i in perm.tolist():
        x = int(l_[i])
        o_min, j_best = float("inf"), -1
        for j, (a, b, c, q, M) in enumerate(cost):
            if x > M:
                continue
            lm = x if x > lmax[j] else lmax[j]
            o = max(Cj[j] + a * x * x + b * x + c + (a * lm * lm + b * lm + c) * q, second if j == k1 else tot[k1])
            if o < o_min:
                o_min, j_best = o, j
        if j_best < 0:
            raise TidalError(f"sequence of length {x} exceeds the MaxLen of every pipeline")
        a, b, c, q, _ = cost[j_best]
        Cj[j_best] += a * x * x + b * x + c
        lmax[j_best] = max(lmax[j_best], x)
        Ej[j_best] = (a * lmax[j_best] ** 2 + b * lmax[j_best] + c) * q
        t = tot[j_best] = Cj[j_best] + Ej[j_best]
        if j_best != k1 and (t > tot[k1] or (t == tot[k1] and j_best < k1)):  # totals only grow
            k1, second = j_best, tot[k1]
        elif j_best != k1 and t > second:
            second = t
        owner[i] = j_best
    return owner, max(Cj[k] + Ej[k] for k in range(D))


def _alg1_trial_numpy(l_, pipes, perm, A, B, C, Q1, M, has_e, m_min) -> tuple[np.ndarray, float]:
    """One shuffle of Hydraulis Alg. 1 with the scan over pipelines vectorised (same choices, float for float)."""
    D = len(pipes)
    Cj = np.zeros(D)
    Ej = np.zeros(D)
    tot = np.zeros(D)  # C_j + E_j
    lmax = np.zeros(D)
    owner = np.empty(l_.size, dtype=np.int64)
    for i in perm.tolist():
        x = int(l_[i])
        k1 = int(tot.argmax())
        top = tot[k1]
        if D > 1:
            tot[k1] = -np.inf
            second = float(tot.max())
            tot[k1] = top
        else:
            second = 0.0
        o = Cj + A * x * x  # same operation order as the paper's loop: ((C_j + a x x) + b x) + c
        o += B * x
        o += C
        if has_e:
            lm = np.maximum(lmax, x)
            o += (A * lm * lm + B * lm + C) * Q1
        own = max(o[k1], second)  # the max over k != j of C_k + E_k is `second` for j = k1, `top` otherwise
        np.maximum(o, top, out=o)
        o[k1] = own
        if x > m_min:
            o[x > M] = np.inf
        j = int(o.argmin())
        if not o[j] < np.inf:
            raise TidalError(f"sequence of length {x} exceeds the MaxLen of every pipeline")
        Cj[j] += A[j] * x * x + B[j] * x + C[j]
        lm_j = max(int(lmax[j]), x)
        lmax[j] = lm_j
        Ej[j] = (A[j] * lm_j ** 2 + B[j] * lm_j + C[j]) * Q1[j]
        tot[j] = Cj[j] + Ej[j]
        owner[i] = j
    return owner, float(np.max(Cj + Ej)) if D else 0.0
