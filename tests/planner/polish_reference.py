"""polish as it was before decision 121 (main e799719): each round as numpy expressions over the bottleneck's documents
and every candidate partner. Kept as the reference that the compiled round (kernels_polish.polish_rounds) must equal,
float for float and move for move."""

import itertools

import numpy as np

from tidal.core.errors import TidalError
from tidal.core.plan import PipelinePlan
from tidal.planner.config import DEFAULT
from tidal.planner.packing import pipeline_time
from tidal.planner.pipecost import pipe_coeffs


def polish_reference(lengths: np.ndarray, pipes, plans: tuple[PipelinePlan, ...], est: float, *, target: float = 0.0,
                     rounds: int = 40, max_docs: int = 16, min_gain: float = 1e-4, light: int = DEFAULT.polish_light):
    """polish.polish's contract, as main e799719 computed it."""
    P = len(pipes)
    mb_docs = [list(mb) for p in plans for mb in p.micro_batches]
    if P < 2 or not mb_docs:
        return est, plans
    lf = np.asarray(lengths, dtype=np.float64)
    A, B, C, Dd = pipe_coeffs(pipes)
    M = np.array([p.max_len for p in pipes], dtype=np.float64)
    mb_pipe = np.array([j for j, p in enumerate(plans) for _ in p.micro_batches], dtype=np.int64)
    n_mb = len(mb_docs)
    doc_mb = np.full(lf.size, -1, dtype=np.int64)
    sizes = [len(mb) for mb in mb_docs]
    doc_mb[np.fromiter(itertools.chain.from_iterable(mb_docs), dtype=np.int64, count=sum(sizes))] = \
        np.repeat(np.arange(n_mb), sizes)
    if np.any(doc_mb < 0):
        raise TidalError(f"polish: sequence {int(np.flatnonzero(doc_mb < 0)[0])} is in no micro-batch of the plan")
    alive = np.ones(n_mb, dtype=bool)
    w_own = A[mb_pipe[doc_mb]] * lf * lf + B[mb_pipe[doc_mb]] * lf + Dd[mb_pipe[doc_mb]]  # work where it is
    mb_t = C[mb_pipe] + np.bincount(doc_mb, weights=w_own, minlength=n_mb)
    mb_tok = np.bincount(doc_mb, weights=lf, minlength=n_mb)
    Q1 = np.array([p.pp - 1 for p in pipes], dtype=np.float64)
    changed = np.zeros(P, dtype=bool)

    # a pipeline's micro-batches are contiguous in mb_pipe (plans' order): per-pipeline extremes by reduceat over
    # the pipelines that have any (the same values as ufunc.at from -inf / n_mb, without its per-element cost)
    per = np.bincount(mb_pipe, minlength=P)
    has = per > 0
    starts = (np.cumsum(per) - per)[has]
    mb_idx = np.arange(n_mb)

    def per_pipe(ufunc, x, fill):
        out = np.full(P, fill, dtype=x.dtype)
        out[has] = ufunc.reduceat(x, starts)
        return out

    def pipe_state():
        t = np.where(alive, mb_t, -np.inf)
        top1 = per_pipe(np.maximum, t, -np.inf)
        is_top = alive & (t == top1[mb_pipe])
        arg = per_pipe(np.minimum, np.where(is_top, mb_idx, n_mb), n_mb)  # first micro-batch at the top (n_mb: none)
        t2 = np.where(mb_idx == arg[mb_pipe], -np.inf, t)
        top2 = per_pipe(np.maximum, t2, -np.inf)
        V = np.bincount(mb_pipe[alive], minlength=P).astype(np.float64)
        tot = np.bincount(mb_pipe[alive], weights=mb_t[alive], minlength=P)  # one stage: the sum (decision 94)
        time = np.where(V > 0, np.where(Q1 > 0, (Q1 + V) * np.maximum(top1, 0.0), tot), 0.0)
        return top1, top2, arg, V, time

    for _ in range(rounds):
        top1, top2, arg, V, time = pipe_state()
        j = int(np.argmax(time))
        tj = time[j]
        if tj <= target:
            break
        ms = int(arg[j])
        mine = np.flatnonzero(doc_mb == ms)
        xs_all = lf[mine]
        order = np.argsort(-xs_all, kind="stable")[:max_docs]
        sel, xs = mine[order], xs_all[order]
        wj = A[j] * xs * xs + B[j] * xs + Dd[j]
        fj = Q1[j] + V[j]
        sec = max(top2[j], 0.0)
        left = mb_t[ms] - wj
        if Q1[j] > 0:
            new_j = np.where(mine.size == 1, (fj - 1) * sec if fj - 1 > Q1[j] else 0.0, fj * np.maximum(sec, left))
        else:
            new_j = tj - wj - (C[j] if mine.size == 1 else 0.0)
        best_val, best = tj * (1 - min_gain), None
        if Q1[j] > 0 and mine.size > 1 and fj * sec >= best_val:
            # no move or swap can win: j's new time is fj * max(sec, .) >= fj * sec (fj > 0, the same float product
            # as new_j's and nj's), and every entry is the max of it and the partner's (decision 120)
            break
        # moves: documents of ms into any live micro-batch of another pipeline with token room
        cand = np.flatnonzero(alive & (mb_pipe != j))
        if cand.size:
            k = mb_pipe[cand]
            wk = A[k][None, :] * xs[:, None] ** 2 + B[k][None, :] * xs[:, None] + Dd[k][None, :]
            other = np.where(cand == arg[k], top2[k], top1[k])[None, :]
            nk = np.where(Q1[k][None, :] > 0, (Q1[k] + V[k])[None, :] * np.maximum(other, mb_t[cand][None, :] + wk),
                          time[k][None, :] + wk)
            ok = mb_tok[cand][None, :] + xs[:, None] <= M[k][None, :]
            val = np.where(ok, np.maximum(new_j[:, None], nk), np.inf)
            u = int(np.argmin(val))
            if val.flat[u] < best_val:
                a, b = divmod(u, cand.size)
                best_val, best = float(val.flat[u]), (int(sel[a]), int(cand[b]), -1)
        # swaps: a document of ms with any document of another pipeline (on large steps, of the `light` least loaded
        # pipelines only, as in the dispatch's local search: that is where the bottleneck's work can go)
        if lf.size > 256 and light < P:
            near = np.zeros(P, dtype=bool)  # np.isin's answer by a lookup table (np.isin sorts: ~0.1 ms a call)
            near[np.argsort(time, kind="stable")[:light]] = True
            near[j] = False
            e_idx = np.flatnonzero(near[mb_pipe[doc_mb]])
        else:
            e_idx = np.flatnonzero(mb_pipe[doc_mb] != j)
        if e_idx.size:
            # only partners that can win with some document of ms: j's new time (below) grows with the partner's
            # work on j from the same least base over the rows, the partner's with x (least at the shortest,
            # xs[-1]), so each side's least over the rows is one value per partner, in the same float operations;
            # a partner where either is >= best_val has no entry below it (decision 117)
            lc = lf[e_idx]
            mc = doc_mb[e_idx]
            kc = mb_pipe[mc]
            wjc = A[j] * lc * lc + B[j] * lc + Dd[j]
            njc = fj * np.maximum(sec, (mb_t[ms] - wj).min() + wjc) if Q1[j] > 0 else (tj - wj).min() + wjc
            x1 = xs[-1:]
            wkc = A[kc] * lc * lc + B[kc] * lc + Dd[kc]
            wx1 = A[kc] * x1 ** 2 + B[kc] * x1 + Dd[kc]
            nkc = np.where(Q1[kc] > 0, (Q1[kc] + V[kc]) * np.maximum(np.where(mc == arg[kc], top2[kc], top1[kc]),
                                                                      mb_t[mc] - wkc + wx1), time[kc] - wkc + wx1)
            e_idx = e_idx[(njc < best_val) & (nkc < best_val)]
        if e_idx.size:
            me = doc_mb[e_idx]
            k = mb_pipe[me]
            le = lf[e_idx][None, :]
            wje = A[j] * le * le + B[j] * le + Dd[j]
            nj = fj * np.maximum(sec, mb_t[ms] - wj[:, None] + wje) if Q1[j] > 0 else tj - wj[:, None] + wje
            wkd = A[k][None, :] * xs[:, None] ** 2 + B[k][None, :] * xs[:, None] + Dd[k][None, :]
            wke = (A[k] * le * le + B[k] * le + Dd[k])  # 1 x E
            other = np.where(me == arg[k], top2[k], top1[k])[None, :]
            nk = np.where(Q1[k][None, :] > 0,
                          (Q1[k] + V[k])[None, :] * np.maximum(other, mb_t[me][None, :] - wke + wkd),
                          time[k][None, :] - wke + wkd)
            ok = ((mb_tok[ms] - xs[:, None] + le <= M[j]) & (mb_tok[me][None, :] - le + xs[:, None] <= M[k][None, :])
                  & (le != xs[:, None]))
            val = np.where(ok, np.maximum(nj, nk), np.inf)
            u = int(np.argmin(val))
            if val.flat[u] < best_val:
                a, b = divmod(u, e_idx.size)
                best_val, best = float(val.flat[u]), (int(sel[a]), int(me[b]), int(e_idx[b]))
        if best is None:
            break
        d, m2, e = best
        k2 = int(mb_pipe[m2])

        def place(doc: int, src: int, dst: int) -> None:
            ps, pd = mb_pipe[src], mb_pipe[dst]
            x = lf[doc]
            mb_t[src] -= A[ps] * x * x + B[ps] * x + Dd[ps]
            mb_tok[src] -= x
            mb_t[dst] += A[pd] * x * x + B[pd] * x + Dd[pd]
            mb_tok[dst] += x
            doc_mb[doc] = dst
            mb_docs[src].remove(doc)
            mb_docs[dst].append(doc)
            alive[dst] = True  # a swap refills the micro-batch its first half emptied
            alive[src] = bool(mb_docs[src])

        place(d, ms, m2)
        if e >= 0:
            place(e, m2, ms)
        changed[j] = changed[k2] = True
    if not changed.any():
        return est, plans
    out = list(plans)
    for j in np.flatnonzero(changed):
        mbs = sorted((tuple(sorted(mb_docs[m])) for m in np.flatnonzero(alive & (mb_pipe == j))), key=lambda g: g[0])
        p = plans[j]
        out[j] = PipelinePlan(p.tp, p.pp, p.cp, p.devices, p.max_len, tuple(mbs),
                              pipeline_time(lf, mbs, pipes[j].coeffs, pipes[j].pp), (), p.layer_split)
    new = max(p.est_time for p in out)
    return (new, tuple(out)) if new < est else (est, plans)
