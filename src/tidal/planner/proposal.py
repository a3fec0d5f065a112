"""Strategy proposal (Hydraulis §7): a few heterogeneous candidate strategies for a dataset's length distribution:
the DP in dual form with its roundings, the homogeneous strategies and mixes, planned on sampled steps and reduced to
a greedy cover; `refine` adds proposal_search's local search (decision 99). docs/planner.md, "Strategy proposal".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.core.cluster import DeviceType
from tidal.core.errors import TidalError
from tidal.core.scheme import ParallelScheme
from tidal.core.strategy import Strategy, place
from tidal.costmodel.base import CostModel
from tidal.costmodel.sync import SyncPricing
from tidal.planner.bounds import PipeCost, strategy_bound, work_capacity
from tidal.planner.proposal_search import ProfileCache, evaluate, sample_steps, search

# refine=True (decision 99): the local search's starts (best pool strategies; its rounds, width and ways are
# proposal_search's REFINE_*), chosen on tuning seeds 0 and 1 of paper_tables.py's Fig. 13 cells
REFINE_STARTS = 2
REFINE_PHASES = 3  # climbs from: 1 the best pool strategies; 2 the cover's picks, as replacements; 3 as complements
EVAL_STEPS = 10  # sampled evaluation steps, with refine or without (propose's default eval_steps)
# the DP's length bins (tokens), the step of its fractional pipeline counts and its cutoffs L (the longest bin and
# CUTOFFS - 1 shorter ones); the pool takes the FAMILY_QUOTA best of each family (every homogeneous strategy), the
# final set at most MAX_CANDIDATES
BIN_WIDTH = 256
D_STEP = 0.1
CUTOFFS = 4
FAMILY_QUOTA = 8
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class Proposal:
    strategies: tuple[Strategy, ...]  # placed candidates, in greedy selection order (best single strategy first)
    expected: tuple[float, ...]  # expected_cost of each on the whole distribution (s): the DP's objective
    simulated: tuple[float, ...]  # mean estimated step time on the sampled evaluation steps (s; inf: too short)
    dp_best: float  # least expected_cost among the DP's rounded strategies (before the homogeneous baselines join)


def scheme_space(cost_model: CostModel, *, max_tp: int | None = None, max_cp: int = 8, max_pp: int = 8,
                 pp_divisors: bool = True) -> tuple[ParallelScheme, ...]:
    m, cl = cost_model.model, cost_model.cluster
    dev = _device(cost_model)
    max_tp = max_tp or dev.per_node
    tps = [t for t in range(1, max_tp + 1) if m.heads % t == 0 and m.kv_heads % t == 0]
    pps = [p for p in range(1, min(max_pp, m.layers) + 1) if not pp_divisors or m.layers % p == 0]
    cps = [1 << i for i in range(0, 31) if (1 << i) <= max_cp]
    out = []
    for t, p, c in itertools.product(tps, pps, cps):
        s = ParallelScheme(t, p, c)
        if s.num_devices <= cl.num_devices and cost_model.max_len(s, dev) > 0:
            out.append(s)
    if not out:
        raise TidalError(f"no parallel scheme of {m.name} fits on {cl.name}")
    return tuple(out)


def _device(cost_model: CostModel):
    """The device type schemes are costed and sized on. Mixed clusters: the elementwise weakest of all types (least
    compute, memory and bandwidth), since placement may put any pipeline on any type; so the proposal never offers a
    scheme that does not fit on the type it lands on (e.g. tp2 of llama-32b fits a 96 GB H20, not an 80 GB H800)."""
    types = sorted({g.device for g in cost_model.cluster.groups}, key=lambda t: t.name)
    if len(types) == 1:
        return types[0]
    return DeviceType("+".join(t.name for t in types), min(t.peak_flops for t in types),
                      min(t.memory_bytes for t in types), min(t.intra_bw for t in types),
                      min(t.inter_bw for t in types), min(t.per_node for t in types))


def _histogram(lengths, tokens_per_step: float, max_len: int):
    """Per length bin (BIN_WIDTH tokens): upper edge, expected count, sum l and sum l^2 per step."""
    l_ = np.minimum(np.asarray(lengths, dtype=np.float64), max_len)
    if l_.size == 0 or l_.min() < 1:
        raise TidalError("proposal needs a non-empty sample of lengths >= 1")
    scale = tokens_per_step / l_.sum()  # expected copies of each sampled document per step
    nb = -(-max_len // BIN_WIDTH)
    b = np.minimum(((l_ - 1) // BIN_WIDTH).astype(np.int64), nb - 1)
    cnt = np.bincount(b, minlength=nb) * scale
    s1 = np.bincount(b, weights=l_, minlength=nb) * scale
    s2 = np.bincount(b, weights=l_ * l_, minlength=nb) * scale
    hi = np.zeros(nb)
    np.maximum.at(hi, b, l_)  # longest document per bin
    return hi, cnt, s1, s2


def _cover(hist, max_len: int, count: float = 1e-3):
    """The histogram plus `count` expected documents of exactly `max_len` tokens per step: the proposal must offer
    strategies that run a max_len sequence even when its sample holds none (Hydraulis sizes its strategies for the
    longest length it must serve). The count is tiny, so the work terms barely move; the longest-document terms
    (expected_cost's doc term, the DP's eligibility, top_len) now require a pipeline with MaxLen >= max_len."""
    hi, cnt, s1, s2 = (a.copy() for a in hist)
    if hi.max() >= max_len:
        return hist
    cnt[-1] += count
    s1[-1] += count * max_len
    s2[-1] += count * float(max_len) ** 2
    hi[-1] = max_len
    return hi, cnt, s1, s2


def expected_cost(hist, pipes: Sequence[PipeCost]) -> float:
    """The proposal objective: step lower bound (bounds.strategy_bound, doc + work terms) of the expected step."""
    hi, cnt, s1, s2 = hist
    keep = cnt > 0
    rep = s2[keep] / s1[keep]  # one representative length per bin with the bin's exact sum l and sum l^2
    w = s1[keep] ** 2 / s2[keep]
    lb = strategy_bound(rep, pipes, weights=w, top=0)
    # the longest document of the distribution must fit and run somewhere
    top = hi[keep].max()
    doc = min((p.pp * (p.c + p.w1(top)) for p in pipes if p.max_len >= top), default=math.inf)
    return max(lb, doc)


def _dp(t: float, K: dict, hist):
    """n_t[l] for every bin prefix, with backtracking pointers."""
    hi, cnt, s1, s2 = hist
    A, B, C, P, M, Nd, Dd = K["a"], K["b"], K["c"], K["pp"], K["max_len"], K["n"], K["d"]
    cap = work_capacity(np.full(A.size, t), C, P)
    nb = hi.size
    W = np.cumsum(A[:, None] * s2[None, :] + B[:, None] * s1[None, :] + Dd[:, None] * cnt[None, :], axis=1)  # prefix
    W = np.hstack([np.zeros((A.size, 1)), W])
    n = np.zeros(nb + 1)
    arg = np.zeros((nb + 1, 2), dtype=np.int64)
    for l in range(1, nb + 1):
        if cnt[l - 1] == 0:  # nothing new to cover: carry over
            n[l], arg[l] = n[l - 1], (-1, l - 1)
            continue
        x = hi[l - 1]
        ok = (x <= M) & (P * (C + A * x * x + B * x + Dd) <= t) & (cap > 0)
        if not ok.any():
            n[l:] = np.inf
            return n, arg
        work = W[:, l:l + 1] - W[:, :l]  # K x l: interval (l', l]
        pipes = np.ceil(work / np.where(cap > 0, cap, 1.0)[:, None] / D_STEP - 1e-9) * D_STEP
        tot = np.where(ok[:, None], Nd[:, None] * pipes + n[None, :l], np.inf)
        flat = int(np.argmin(tot))
        k, lp = divmod(flat, l)
        n[l], arg[l] = tot[k, lp], (k, lp)
    return n, arg


def _backtrack(arg, L: int, t: float, K: dict, hist) -> np.ndarray:
    hi, cnt, s1, s2 = hist
    d = np.zeros(K["a"].size)
    cap = work_capacity(np.full(K["a"].size, t), K["c"], K["pp"])
    l = L
    while l > 0:
        k, lp = arg[l]
        if k >= 0:
            work = float(K["a"][k] * s2[lp:l].sum() + K["b"][k] * s1[lp:l].sum() + K["d"][k] * cnt[lp:l].sum())
            d[k] += math.ceil(work / cap[k] / D_STEP - 1e-9) * D_STEP
        l = lp
    return d


def _canon(combo, K: dict) -> tuple[int, ...]:
    """A strategy as scheme indices in canonical order: most devices first, then index."""
    return tuple(sorted(combo, key=lambda k: (-K["n"][k], k)))


def _fill(combo, used, K: dict, N: int) -> list[int]:
    """`combo` with its leftover devices filled by more pipelines of the smallest `used` scheme that still fits."""
    c, dev = list(combo), sum(K["n"][k] for k in combo)
    for k in sorted(used, key=lambda k: (K["n"][k], k)):
        while dev + K["n"][k] <= N:
            c.append(k)
            dev += K["n"][k]
    return c


def _roundings(d: np.ndarray, K: dict, N: int, top_len: float, limit: int = 64) -> list[tuple[int, ...]]:
    used = [k for k in range(d.size) if d[k] > 1e-9]
    out = set()
    for combo in itertools.islice(itertools.product(*[(math.floor(d[k]), math.ceil(d[k])) for k in used]), limit):
        cnt = dict(zip(used, combo))
        dev = sum(K["n"][k] * v for k, v in cnt.items())
        # over budget: drop pipelines of the most over-rounded scheme, keeping one that holds the longest documents
        while dev > N:
            longs = sum(v for k, v in cnt.items() if K["max_len"][k] >= top_len)
            drop = [k for k, v in cnt.items() if v > 0 and not (K["max_len"][k] >= top_len and longs == 1)]
            if not drop:
                break
            k = max(drop, key=lambda k: (cnt[k] - d[k], K["n"][k], -k))
            cnt[k] -= 1
            dev -= K["n"][k]
        if dev > N or sum(cnt.values()) == 0:
            continue
        c = _fill([k for k, v in cnt.items() for _ in range(v)], used, K, N)
        if any(K["max_len"][k] >= top_len for k in c):
            out.add(_canon(c, K))
    return sorted(out)


def _improve(combo: tuple[int, ...], val: float, used: list[int], K: dict, N: int, hist, pc, rounds: int = 20):
    """Integer local search around a rounding: add, remove (and refill) or swap one pipeline among the schemes the
    fractional solution used, while expected_cost improves."""
    for _ in range(rounds):
        dev = sum(K["n"][k] for k in combo)
        neigh = set()
        for k in used:
            if dev + K["n"][k] <= N:
                neigh.add(_canon(list(combo) + [k], K))
            if k in combo:
                rest = list(combo)
                rest.remove(k)
                for k2 in used:
                    if k2 == k:
                        continue
                    room = sorted(rest, key=lambda x: (K["n"][x], x))  # make room by dropping the smallest pipelines
                    while room and sum(K["n"][x] for x in room) + K["n"][k2] > N:
                        room.pop(0)
                    if sum(K["n"][x] for x in room) + K["n"][k2] <= N:
                        neigh.add(_canon(_fill(room + [k2], used, K, N), K))
        best = (val, combo)
        for c in sorted(neigh):
            if c:
                v = expected_cost(hist, [pc[k] for k in c])
                if (v, c) < best:
                    best = (v, c)
        if best[1] == combo:
            break
        val, combo = best
    return combo, val


def propose(lengths, cost_model: CostModel, *, tokens_per_step: int, max_len: int,
            schemes: Sequence[ParallelScheme] | None = None, eval_steps: int = EVAL_STEPS, seed: int = 0,
            sync: SyncPricing | None = None, cp_policy: str | None = None, refine: bool = False) -> Proposal:
    """Candidate strategies for `lengths` (a sample of the dataset's document lengths) on cost_model's cluster.
    Pool: the DP's roundings (two per cutoff), the homogeneous strategies and mixes, best FAMILY_QUOTA of each family
    by expected_cost (every homogeneous one); final set: greedy cover of `eval_steps` steps sampled with `seed` and
    planned by select.assign (with `sync` / `cp_policy`, charged as StepPlanner charges them: charges.charge). The set
    always holds a strategy that runs a max_len sequence when the pool has one (`_keep_long`)."""
    N = cost_model.cluster.num_devices
    if tokens_per_step < 1 or max_len < 1:
        raise TidalError("propose needs tokens_per_step and max_len >= 1")
    space = tuple(schemes) if schemes is not None else scheme_space(cost_model)
    dev = _device(cost_model)
    pc = [PipeCost.of(cost_model.coeffs(s, dev), s.pp, cost_model.max_len(s, dev)) for s in space]
    K = {f: np.array([getattr(p, f) for p in pc], dtype=np.float64) for f in ("a", "b", "c", "d", "pp", "max_len")}
    K["n"] = np.array([s.num_devices for s in space], dtype=np.float64)
    sample_top = int(min(np.max(lengths), max_len)) if np.size(lengths) else 0
    full = _cover(_histogram(lengths, tokens_per_step, max_len), max_len)
    nonempty = np.flatnonzero(full[1] > 0)
    top_bin = int(nonempty[-1]) + 1
    if full[0][top_bin - 1] > K["max_len"].max():
        raise TidalError(f"no scheme holds a {int(full[0][top_bin - 1])}-token document; lower max_len")
    scored = _dp_pool(lengths, K, pc, full, top_bin, N, tokens_per_step, max_len, np.arange(len(space)))
    dp_best = min(scored.values(), default=math.inf)
    families: list[dict[tuple[int, ...], float]] = [dict(scored), {}, {}, {}]
    cp1 = np.array([k for k, s in enumerate(space) if s.cp == 1], dtype=np.int64)
    if refine and 0 < cp1.size < len(space):
        # the DP over the CP = 1 schemes alone: CP schemes can crowd out, in the relaxation, the TP mixes that run
        # faster once the sync and the CP imbalance are charged
        families[3] = {c: v for c, v in _dp_pool(lengths, K, pc, full, top_bin, N, tokens_per_step, max_len,
                                                 cp1).items() if c not in scored}
    # homogeneous strategies of every scheme that holds the longest document (the classical baselines)
    top_len = full[0][top_bin - 1]
    longs = [k for k in range(len(space)) if K["max_len"][k] >= top_len]
    for k in longs:
        m = int(N // K["n"][k])
        if m >= 1:
            families[1][(k,) * m] = expected_cost(full, [pc[k]] * m)
    # mixes: 1/8, 1/4 or 1/2 of the devices on one of the 4 fastest long-capable schemes, the rest on one PP = 1
    # scheme of at most 4 devices (e.g. 2*tp8+12*tp4): the relaxation undervalues such mid-size pools
    fast = sorted(longs, key=lambda k: (K["pp"][k] * (K["c"][k] + K["a"][k] * top_len ** 2 + K["b"][k] * top_len), k))
    small = [k for k in range(len(space)) if K["pp"][k] == 1 and K["n"][k] <= 4]
    for k in fast[:4]:
        for frac in (8, 4, 2):
            m = max(1, int(N // frac // K["n"][k]))
            rest = N - m * K["n"][k]
            for k2 in small:
                m2 = int(rest // K["n"][k2])
                if k2 != k and m2 >= 1:
                    combo = _canon((k,) * m + (k2,) * m2, K)
                    families[2][combo] = expected_cost(full, [pc[x] for x in combo])
    if not any(families):
        raise TidalError(f"strategy proposal found no strategy within {N} devices")
    for fam in families[1:]:
        scored.update(fam)
    pool: list[tuple[tuple[int, ...], Strategy]] = []
    for f, fam in enumerate(families):
        taken = 0
        for combo in sorted(fam, key=lambda c: (fam[c], c)):
            if taken >= (len(fam) if f == 1 else FAMILY_QUOTA):  # every homogeneous baseline is simulated
                break
            if combo in (c for c, _ in pool):
                continue
            try:
                pool.append((combo, place(tuple(space[k] for k in combo), cost_model.cluster, cost_model.model)))
            except TidalError:
                continue
            taken += 1
    # refine: always one step with a max_len document, so that the search and the cover value how fast a candidate set
    # runs one (rare in the sample, yet frequent enough in the steps: a 16-GPU 32K run without it lost 6 %)
    steps = sample_steps(lengths, tokens_per_step, max_len, eval_steps, seed,
                         long_step=sample_top < max_len or refine)
    cache = ProfileCache(cost_model, sync, cp_policy)  # each strategy profiled once, for its bound and its estimate
    E = evaluate(steps, [st for _, st in pool], cache, seed)
    if refine:
        E = _refine(pool, E, scored, full, pc, space, N, steps, seed, cache)
    lens = [p.max_len for p in cache([st for _, st in pool])]
    chosen = _keep_long(_greedy_cover(E, MAX_CANDIDATES), E, lens, max_len, MAX_CANDIDATES)
    return Proposal(tuple(pool[i][1] for i in chosen), tuple(scored[pool[i][0]] for i in chosen),
                    tuple(float(E[i].mean()) for i in chosen), dp_best)


def _dp_pool(lengths, K0: dict, pc0, full, top_bin: int, N: int, tokens_per_step: int, max_len: int,
             subset: np.ndarray) -> dict[tuple[int, ...], float]:
    """The DP's strategies over the schemes `subset` (indices into the scheme space): its two best roundings per
    cutoff L, by expected_cost on the full histogram, as combos of scheme-space indices."""
    K = {f: v[subset] for f, v in K0.items()}
    pc = [pc0[k] for k in subset]
    scored: dict[tuple[int, ...], float] = {}
    # cutoffs L: the longest bin and a few shorter ones (steps without the longest documents)
    Ls = sorted({max(1, int(round(top_bin / 2 ** i))) for i in range(CUTOFFS)}, reverse=True)
    l_all = np.asarray(lengths, dtype=np.float64)
    for L in Ls:
        sub = l_all[np.minimum(l_all, max_len) <= L * BIN_WIDTH]
        if sub.size == 0:
            continue
        hist = _histogram(sub, tokens_per_step, max_len)
        if top_bin <= L:  # the full sample: cover max_len
            hist = _cover(hist, max_len)
        Lb = int(np.flatnonzero(hist[1] > 0)[-1]) + 1
        lo, hi_t = 0.0, max(float(np.min(K["pp"] * (K["c"] + K["a"] * hist[0][Lb - 1] ** 2 + K["b"] * hist[0][Lb - 1])
                                           + np.where(K["max_len"] >= hist[0][Lb - 1], 0, np.inf))), 1e-6)
        for _ in range(80):
            if _dp(hi_t, K, hist)[0][Lb] <= N:
                break
            lo, hi_t = hi_t, hi_t * 2
        else:
            continue
        for _ in range(30):
            mid = 0.5 * (lo + hi_t)
            if _dp(mid, K, hist)[0][Lb] <= N:
                hi_t = mid
            else:
                lo = mid
        n, arg = _dp(hi_t, K, hist)
        d = _backtrack(arg, Lb, hi_t, K, hist)
        local: dict[tuple[int, ...], float] = {}
        for combo in _roundings(d, K, N, hist[0][Lb - 1]):
            local[combo] = expected_cost(hist, [pc[k] for k in combo])
        if local:
            start = min(local, key=lambda c: (local[c], c))
            used = sorted({k for k in range(d.size) if d[k] > 1e-9} | set(start))
            combo, val = _improve(start, local[start], used, K, N, hist, pc)
            local[combo] = val
        for combo in sorted(local, key=lambda c: (local[c], c))[:2]:
            g = tuple(int(subset[k]) for k in combo)
            if g not in scored:
                scored[g] = expected_cost(full, [pc[k] for k in combo])
    return scored


def _refine(pool, E, scored, full, pc, space, N, steps, seed, cache):
    """proposal_search.search from the REFINE_STARTS best pool strategies (score: the mean estimate), then from each
    of the greedy cover's first REFINE_STARTS picks (score: the mean of its minimum with the other picks' rows); every
    strategy evaluated joins `pool` (in place) and `scored`, and its row the returned rows of estimates."""
    for phase in range(REFINE_PHASES):
        if phase == 0:
            order = sorted(range(len(pool)), key=lambda i: (float(np.mean(E[i])), pool[i][0]))
            starts = [(pool[i][0], np.mean) for i in order[:REFINE_STARTS] if np.isfinite(E[i]).all()]
        elif phase == 1:
            cover = _greedy_cover(E, MAX_CANDIDATES)
            starts = []
            for i in cover[:REFINE_STARTS]:
                rest = [j for j in cover if j != i]
                other = E[rest].min(axis=0) if rest else np.full(E.shape[1], np.inf)
                starts.append((pool[i][0], lambda row, o=other: float(np.mean(np.minimum(row, o)))))
        else:
            cover = _greedy_cover(E, MAX_CANDIDATES)
            both = E[cover].min(axis=0)
            starts = [(pool[i][0], lambda row, o=both: float(np.mean(np.minimum(row, o))))
                      for i in cover[:REFINE_STARTS]]
        found = search(starts, space, N, {c: E[i] for i, (c, _) in enumerate(pool)}, steps, cache, seed)
        for c, (st, row) in found.items():
            pool.append((c, st))
            scored[c] = expected_cost(full, [pc[x] for x in c])
            E = np.vstack([E, row[None, :]])
    return E


def _keep_long(chosen: list[int], E: np.ndarray, max_lens: Sequence[int], max_len: int, k: int) -> list[int]:
    """`chosen` with a strategy that runs a max_len sequence: when none of them can (the sampled steps held no
    document long enough to make the cover need one), the pool's fastest such strategy (least mean over the steps
    it runs) replaces the last pick, or joins when fewer than k were picked; unchanged when the pool has none."""
    if not chosen or any(max_lens[i] >= max_len for i in chosen):
        return chosen
    longs = [i for i in range(E.shape[0]) if max_lens[i] >= max_len]
    if not longs:
        return chosen
    best = min(longs, key=lambda i: (float(np.mean(E[i][np.isfinite(E[i])])) if np.isfinite(E[i]).any()
                                     else np.inf, i))
    return (chosen if len(chosen) < k else chosen[:-1]) + [best]


def _greedy_cover(E: np.ndarray, k: int) -> list[int]:
    """Greedily pick strategies minimising the mean over sampled steps of the best chosen strategy's time (what
    per-step selection achieves with that candidate set); the first pick is the best single strategy."""
    chosen: list[int] = []
    cur = np.full(E.shape[1], np.inf)
    for _ in range(min(k, E.shape[0])):
        scores = []
        for i in range(E.shape[0]):
            if i in chosen:
                continue
            m = np.minimum(cur, E[i])
            scores.append((float(np.mean(m)) if np.all(np.isfinite(m)) else np.inf, -int(np.isfinite(E[i]).sum()), i))
        if not scores:
            break
        val, _, i = min(scores)
        if chosen and not val < float(np.mean(cur)) * (1 - 1e-4):
            break
        chosen.append(i)
        cur = np.minimum(cur, E[i])
    return chosen
