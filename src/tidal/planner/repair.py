"""A greedy repair of a packed plan on one-stage pipelines: repack, drop a micro-batch, rebalance (issue 27,
decisions 131, 134; the `repair` pass of passes.py).

A one-stage pipeline (PP = 1, priced as the sum of its micro-batches, decision 94) takes V c + W: a micro-batch that
holds a few tokens over (V - 1) MaxLen costs a whole c. On a packed plan whose every pipeline is one-stage:
  1. repack: each pipeline whose token count fits fewer micro-batches than it has is repacked by Minimum Bin Slack
     (Gupta and Ho: each micro-batch takes the longest document left and the subset of the others that fills it
     best, an exact subset sum on a bitset), kept where it needs fewer; if none does, the repair stops here (the
     drops below gained only after a repack, decision 134); then (3);
  2. drop: pipelines "near" a drop (tokens over (V - 1) MaxLen by at most `excess` of MaxLen) hand their shortest
     documents (summing to at least that excess, then one more at a time, `tries` counts) to micro-batches with room
     on the least loaded other pipelines and are MBS-packed in V - 1. A round tries the `drops` near pipelines of
     least excess alone and every near pipeline at once (least excess first), each followed by (3), and keeps the
     one that lowers the step time most; rounds repeat while one does (at most `rounds`);
  3. rebalance: while a move of one document out of the slowest pipeline (into the micro-batch with most room on
     any other pipeline) or a swap with a document of one of the `partners` least loaded pipelines (both
     micro-batches still <= MaxLen) lowers the larger of the two pipelines' times under the step time, the best one
     is made (at most `moves`).
Every document stays on one micro-batch of one pipeline and every micro-batch within its MaxLen by construction; the
pass checks the result again and times it with packing.pipeline_time (the packer's floats).
"""

from __future__ import annotations

import itertools

import numpy as np


def best_subset(lengths: list[int], room: int) -> list[int]:
    """Positions into `lengths` of a subset with the largest sum <= room (exact subset sum on a Python-int bitset)."""
    mask, reach, hist = (1 << (room + 1)) - 1, 1, []
    for x in lengths:
        hist.append(reach)
        if x <= room:
            reach = (reach | (reach << x)) & mask
        if reach >> room & 1:
            break
    s = reach.bit_length() - 1
    out = []
    for k in range(len(hist) - 1, -1, -1):
        if s == 0:
            break
        if not (hist[k] >> s & 1):  # s not reachable without item k: take it
            out.append(k)
            s -= lengths[k]
    return out


def mbs_pack(l_: np.ndarray, docs: list[int], cap: int, most: int) -> list[list[int]] | None:
    """Minimum Bin Slack: micro-batches (document ids) of at most `cap` tokens; None if it needs > `most`."""
    ln = l_[docs].tolist()
    if ln and (-(-sum(ln) // cap) > most or max(ln) > cap):
        return None
    rest = sorted(zip(ln, docs), key=lambda x: (-x[0], x[1]))  # (length, id), longest first
    bins: list[list[int]] = []
    while rest:
        if len(bins) == most:
            return None
        (first, i0), others = rest[0], rest[1:]
        take = set(best_subset([x for x, _ in others], cap - first))
        bins.append([i0] + [others[k][1] for k in sorted(take)])
        rest = [x for k, x in enumerate(others) if k not in take]
    return bins


class OneStage:
    """A plan on one-stage pipelines as each pipeline's micro-batches, lists of document ids (none empty): the state
    the repair and the exchange (exchange.Exchange) change, and their check of the result."""

    def __init__(self, l_: np.ndarray, pipes, bins: list[list[list[int]]]):
        self.l, self.pipes = np.asarray(l_, dtype=np.int64), pipes
        self.m = np.array([p.max_len for p in pipes], dtype=np.int64)
        self.bins = [[list(b) for b in bs if b] for bs in bins]

    def docs(self, j: int) -> list[int]:
        return [i for b in self.bins[j] for i in b]

    def valid(self) -> bool:
        """Every document of l on exactly one micro-batch, every micro-batch non-empty and within its pipeline's
        MaxLen."""
        ids = [i for bs in self.bins for b in bs for i in b]
        seen = np.bincount(np.array(ids, dtype=np.int64), minlength=self.l.size) if ids else np.zeros(self.l.size)
        fits = all(b and int(self.l[b].sum()) <= int(m) for m, bs in zip(self.m, self.bins) for b in bs)
        return fits and len(ids) == self.l.size and bool((seen == 1).all())


class Repair(OneStage):
    """One plan's micro-batches per pipeline and their times; the module doc's steps."""

    def __init__(self, l_: np.ndarray, pipes, bins: list[list[list[int]]]):
        super().__init__(l_, pipes, bins)
        self.w = np.stack([p.work(l_) for p in pipes]) if pipes else np.zeros((0, l_.size))  # work per pipeline, doc
        self.c = np.array([p.c for p in pipes], dtype=np.float64)

    def copy_bins(self) -> list[list[list[int]]]:
        return [[list(b) for b in bs] for bs in self.bins]

    def times(self) -> np.ndarray:
        """Every pipeline's time, V c + W, in one pass over all documents (the pass times its result with
        packing.pipeline_time)."""
        sizes = [sum(len(b) for b in bs) for bs in self.bins]
        ids = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(self.bins)), dtype=np.int64)
        po = np.repeat(np.arange(len(self.pipes)), sizes)
        work = np.bincount(po, weights=self.w[po, ids], minlength=len(self.pipes))
        return np.array([len(bs) for bs in self.bins]) * self.c + work

    def over(self, j: int) -> int:
        """Pipeline j's tokens over (V - 1) MaxLen."""
        return int(self.l[self.docs(j)].sum()) - (len(self.bins[j]) - 1) * self.pipes[j].max_len

    def place(self, i: int, avoid: set[int], t: np.ndarray) -> bool:
        """Document i into a micro-batch with room on the least loaded pipeline not in `avoid` (best fit there)."""
        for o in np.argsort(t + self.w[:, i], kind="stable").tolist():
            if o in avoid:
                continue
            fit = [(self.pipes[o].max_len - int(self.l[b].sum()), k) for k, b in enumerate(self.bins[o])]
            fit = [f for f in fit if f[0] >= self.l[i]]
            if fit:
                self.bins[o][min(fit)[1]].append(i)
                t[o] += self.w[o, i]
                return True
        return False

    def drop(self, j: int, excess: float, tries: int, avoid: set[int]) -> bool:
        """Step 2 on pipeline j, its documents moved to pipelines not in `avoid`: whether it now runs one micro-batch
        fewer (unchanged when not)."""
        p, V, docs, over = self.pipes[j], len(self.bins[j]), self.docs(j), self.over(j)
        if V < 2 or over > excess * p.max_len:
            return False
        small = sorted(docs, key=lambda i: (int(self.l[i]), i))
        k = int(np.searchsorted(np.cumsum(self.l[small]), over)) + 1 if over > 0 else 0
        for kk in range(k, min(k + tries, len(small))):
            saved = self.copy_bins()
            moved = set(small[:kk])
            got = mbs_pack(self.l, [i for i in docs if i not in moved], p.max_len, V - 1)
            if got is not None:
                self.bins[j] = got
                t = self.times()
                if all(self.place(i, avoid | {j}, t) for i in small[:kk]):
                    return True
            self.bins = saved
        return False

    def drop_all(self, js: list[int], excess: float, tries: int) -> int:
        """Step 2 on the pipelines js at once, the least over (V - 1) MaxLen first; their documents go to the other
        pipelines and to those of js that failed to drop. Returns how many dropped."""
        over = {j: self.over(j) for j in js}
        avoid, made = set(js), 0
        for j in sorted(js, key=lambda j: (over[j], j)):
            if self.drop(j, excess, tries, avoid):
                made += 1
            else:
                avoid.discard(j)
        return made

    def _flat(self, j: int):
        """Pipeline j's documents, their micro-batch index and each micro-batch's free tokens, as arrays."""
        ids = np.fromiter((i for b in self.bins[j] for i in b), dtype=np.int64)
        at = np.repeat(np.arange(len(self.bins[j])), [len(b) for b in self.bins[j]])
        tok = np.bincount(at, weights=self.l[ids], minlength=len(self.bins[j]))
        free = self.pipes[j].max_len - tok.astype(np.int64)
        return ids, at, free

    def rebalance(self, moves: int, partners: int) -> int:
        """Step 3; returns the moves and swaps made. The best move and the best swap are each searched in one compiled
        loop (kernels_batch.rebal_move, rebal_swap; decision 146: numpy's picks and floats)."""
        from tidal.planner import kernels_batch  # lazily: importing numba takes a second

        P, made = len(self.pipes), 0
        if P < 2:
            return 0
        t = self.times()
        flat = [self._flat(o) for o in range(P)]
        room_all, extra_all = np.zeros(P, dtype=np.int64), np.zeros(P)

        def rooms(o: int) -> None:  # o's largest free room (a new micro-batch, at c more, if it has none)
            room_all[o] = flat[o][2].max() if flat[o][2].size else self.pipes[o].max_len
            extra_all[o] = 0.0 if flat[o][2].size else self.c[o]
        for o in range(P):
            rooms(o)
        kb = kernels_batch.loops()
        while made < moves:
            j = int(np.argmax(t))
            ij, aj, fj = flat[j]
            if ij.size == 0:
                return made
            # moves: into each other pipeline's micro-batch with most room (kernels_batch.rebal_move)
            v, o, c = kb.rebal_move(t, self.w, self.l, self.c, j, ij, aj, room_all, extra_all)
            best = (v, ("move", c, o, -1))
            # swaps: with a document of the `partners` least loaded other pipelines
            others = np.delete(np.arange(P), j)
            ps = [o for o in others[np.argsort(t[others], kind="stable")][:partners].tolist() if flat[o][0].size]
            if ps and not best[0] < t[j] * (1 - 1e-12):  # only when no move helps
                K = np.concatenate([flat[o][0] for o in ps])
                po = np.repeat(ps, [flat[o][0].size for o in ps])
                fk = np.concatenate([flat[o][2][flat[o][1]] for o in ps])
                v, r, c = kb.rebal_swap(t, self.w, self.l, j, ij, aj, fj, K, po, fk)
                if v < best[0]:
                    best = (v, ("swap", r, int(po[c]), int(K[c])))
            if not best[0] < t[j] * (1 - 1e-12):
                return made
            kind, r, o, k = best[1]
            i, bj = int(ij[r]), int(aj[r])
            self.bins[j][bj].remove(i)
            if kind == "move":
                if not self.bins[o]:
                    self.bins[o].append([])
                self.bins[o][int(np.argmax(flat[o][2])) if flat[o][2].size else 0].append(i)
            else:
                bo = next(b for b in self.bins[o] if k in b)
                bo.remove(k)
                bo.append(i)
                self.bins[j][bj].append(k)
            self.bins[j] = [b for b in self.bins[j] if b]
            made += 1
            for x in (j, o):  # V c + W of x, its work summed over _flat's documents
                flat[x] = self._flat(x)
                t[x] = len(self.bins[x]) * self.c[x] + float(self.w[x][flat[x][0]].sum())
                rooms(x)
        return made

def repair(l_: np.ndarray, pipes, bins, *, excess: float = 0.02, tries: int = 3, rounds: int = 3, drops: int = 1,
           moves: int = 64, partners: int = 3, deadline_ok=lambda: True) -> tuple[Repair | None, int, int, int]:
    """The module doc's repair of one plan (micro-batches of document ids per pipeline): (the Repair, or None when
    no pipeline repacks into fewer micro-batches; pipelines repacked in step 1, micro-batches dropped in step 2,
    moves and swaps). `deadline_ok()`: checked between drop rounds and candidates."""
    bins = [[list(b) for b in bs if b] for bs in bins]
    repacked = 0
    for j, (p, bs) in enumerate(zip(pipes, bins)):  # step 1: >= 2 micro-batches whose tokens fit one fewer
        got = mbs_pack(l_, [i for b in bs for i in b], p.max_len, len(bs) - 1) if len(bs) >= 2 else None
        if got is not None:
            bins[j], repacked = got, repacked + 1
    if not repacked:
        return None, 0, 0, 0
    rp = Repair(l_, pipes, bins)
    made = rp.rebalance(moves, partners)
    dropped = 0
    for _ in range(rounds):  # each round: the drop (one pipeline or all) that, rebalanced, lowers the step time most
        if not deadline_ok():
            break
        start, best = rp.copy_bins(), (float(rp.times().max()), None, 0)
        over = {j: rp.over(j) for j in range(len(pipes)) if len(rp.bins[j]) >= 2}
        near = sorted((j for j, v in over.items() if v <= excess * pipes[j].max_len), key=lambda j: (over[j], j))
        for js in [[j] for j in near[:drops]] + [near] * (len(near) > 1):
            if not deadline_ok():
                break
            rp.bins = [[list(b) for b in bs] for bs in start]
            if rp.drop_all(js, excess, tries):
                m = rp.rebalance(moves, partners)
                tm = float(rp.times().max())
                if tm < best[0] * (1 - 1e-12):
                    best = (tm, rp.copy_bins(), m)
        rp.bins = start if best[1] is None else best[1]
        if best[1] is None:
            break
        dropped, made = dropped + 1, made + best[2]
    return rp, repacked, dropped, made
