"""Compound document exchanges around the bottleneck of a packed plan on one-stage pipelines (issue 27, decision 136;
the `exchange` pass of passes.py).

Decisions 130 and 132 found plans 0.9-3.2 % faster than the planner's on open 256- and 1024-GPU steps, all by moving
documents between pipelines with the micro-batch counts unchanged. The dispatch's local search and polish only make
single moves and swaps that lower the max at once, so they cannot move a document d of the slowest pipeline P into a
pipeline Q that then becomes the slowest. A compound move does:
  1. d out of P (P loses d's work, and c when d was alone in its micro-batch);
  2. d into Q's micro-batch with most room (Q's MaxLen >= len(d); one of the `partners` pipelines of least time with
     d, of those that can hold it), after Q ejects the fewest of its shortest documents that make room for d in that
     micro-batch and bring Q under the step time T (at most `eject` of them);
  3. each ejected document into a micro-batch with room of the least loaded other pipeline that stays under T (a
     distinct one each, not Q; P, lighter by d, may take them); with `depth` > 1 such a pipeline may in turn eject
     (step 2, one level down) to make room.
If some pipeline with room stays under T with d, step 2 is that plain move.
The move is kept when the largest time of the pipelines it touched is under T; of the `cands` heaviest documents of P
times the partners, the move of least such time is made, and the search repeats on the new slowest pipeline (at most
`moves` moves); a document whose pipeline without it is no faster than the best move so far is not searched (its
move could not be chosen), and the direct placement is one compiled loop (kernels_batch.fit_first; decision 142: the
same moves, 1.7x cheaper on 1024-GPU heavytail steps), as is the ejection's pick (kernels_batch.eject_pick; decision
143: the same picks). Only one-stage pipelines (PP = 1, priced V c + W, decision 94): with q > 0 a pipeline's time
is (q + V) x its slowest micro-batch, which these sums do not track. Every micro-batch stays within its MaxLen and
every document on one micro-batch by construction; the pass checks the result and times it with
packing.pipeline_time.
"""

from __future__ import annotations

import numpy as np

from tidal.planner.pipecost import pipe_coeffs
from tidal.planner.repair import OneStage

EPS = 1e-12  # a move must lower the touched pipelines' max below T (1 - EPS): float noise is no gain


class Exchange(OneStage):
    """One plan's micro-batches per pipeline, their token counts and the pipelines' times."""

    def __init__(self, l_: np.ndarray, pipes, bins: list[list[list[int]]]):
        super().__init__(l_, pipes, bins)
        self.lf = self.l.astype(np.float64)
        self.a, self.b, self.c, self.d = pipe_coeffs(pipes)
        self.tok, self.t, self.room = self._sums()
        self.op = np.where(self.room == self.m, self.c, 0.0)  # c where a pipeline has no micro-batch (a new one)
        self._cache: dict = {}
        self._wcols: dict[int, np.ndarray] = {}
        from tidal.planner import kernels_batch  # lazily: importing numba takes a second

        self._kb = kernels_batch.loops()

    def _sums(self) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """Every micro-batch's tokens, every pipeline's time (_time's floats: each pipeline's work summed as np.sum
        sums it, by kernels_sums.mb_works over the pipelines of equal coefficients at once; issue 27: a numpy call per
        pipeline cost 17 ms on 1024-GPU steps) and room (_room's)."""
        from tidal.planner import kernels_sums

        nmb = [len(bs) for bs in self.bins]
        per_mb = [len(b) for bs in self.bins for b in bs]
        flat = np.fromiter((i for bs in self.bins for b in bs for i in b), dtype=np.int64, count=sum(per_mb))
        starts = np.concatenate(([0], np.cumsum(per_mb)[:-1])).astype(np.int64)
        tok_all = np.add.reduceat(self.l[flat], starts).tolist() if per_mb else []
        ends = np.cumsum(nmb).tolist()
        tok = [tok_all[e - n:e] for n, e in zip(nmb, ends)]
        docs = np.array([sum(len(b) for b in bs) for bs in self.bins], dtype=np.int64)
        dend = np.cumsum(docs)
        t = np.zeros(len(self.bins))
        groups: dict = {}
        for j in range(len(self.bins)):
            groups.setdefault((float(self.a[j]), float(self.b[j]), float(self.d[j])), []).append(j)
        loops = kernels_sums.loops()
        for (a, b, d), js in groups.items():
            ids = np.concatenate([flat[dend[j] - docs[j]:dend[j]] for j in js])
            w = loops.mb_works(self.lf, ids, docs[js], a, b, d)
            t[js] = np.array(nmb)[js] * self.c[js] + w
        room = self.m - np.array([min(x, default=0) for x in tok], dtype=np.int64)  # MaxLen with no micro-batch
        return tok, t, room

    def work(self, j: int, i: int) -> float:
        return self.pipes[j].w1(float(self.lf[i]))

    def wcol(self, i: int) -> np.ndarray:
        """Document i's work on every pipeline (PipeCost.work, across pipelines); kept per document (read-only: the
        coefficients never change; issue 27, decision 142)."""
        w = self._wcols.get(i)
        if w is None:
            x = self.lf[i]
            w = self._wcols[i] = self.a * x * x + self.b * x + self.d
        return w

    def _set(self, j: int, t: float, room: int) -> None:
        """Pipeline j's time and room, and its op (c when it has no micro-batch)."""
        self.t[j], self.room[j] = t, room
        self.op[j] = self.c[j] if room == self.m[j] else 0.0

    def _time(self, j: int) -> float:
        ids = np.array(self.docs(j), dtype=np.int64)
        return len(self.bins[j]) * float(self.c[j]) + float(self.pipes[j].work(self.lf[ids]).sum())

    def _room(self, j: int) -> int:
        """Pipeline j's largest free room (MaxLen when it has no micro-batch: a new one, at c more)."""
        return int(self.m[j]) - min(self.tok[j]) if self.tok[j] else int(self.m[j])

    def _docs(self, q: int):
        """Pipeline q's documents by (length, id): ids, lengths, micro-batch index, work on q (cached until q
        changes)."""
        if q not in self._cache:
            got = sorted((int(self.l[x]), x, kk) for kk, b in enumerate(self.bins[q]) for x in b)
            ln, ids, kk = (np.array(c, dtype=np.int64) for c in zip(*got)) if got else (np.zeros(0, np.int64),) * 3
            self._cache[q] = (ids, ln, kk, self.pipes[q].work(self.lf[ids]))
        return self._cache[q]

    def _eject(self, q: int, k: int, i: int, limit: float) -> list[int] | None:
        """The fewest of q's shortest documents whose removal leaves room for document i in micro-batch k and q's
        time with i under `limit`: the shortest single one that does, else the shortest of micro-batch k until it
        has room, then the shortest anywhere; None if more than `eject` would be needed. One loop,
        kernels_batch.eject_pick (compiled where numba is installed; issue 27, decision 143: numpy's pick)."""
        need_tok = self.tok[q][k] + int(self.l[i]) - int(self.m[q])
        need_w = self.t[q] + self.work(q, i) - limit
        if need_tok <= 0 and need_w < 0:
            return []
        ids, ln, kk, w = self._docs(q)
        found, take = self._kb.eject_pick(ln, kk, w, k, need_tok, float(need_w), self.eject)
        return ids[take].tolist() if found else None

    def _direct(self, x: int, off: list[int], limit: float) -> tuple[int, float]:
        """The least loaded pipeline not in `off` with room for document x that stays under `limit` with it (an empty
        one opens a micro-batch, at c more), the first on ties: (pipeline, its time with x), or (-1, inf). One loop,
        kernels_batch.fit_first (decision 142: numpy's pick and float; room >= len(x) implies MaxLen >= len(x))."""
        r, v = self._kb.fit_first(self.t, self.wcol(x), self.op, self.room, int(self.l[x]), float(limit),
                                  np.array(off, dtype=np.int64))
        return int(r), float(v)

    def _place(self, x: int, used: set[int], limit: float, depth: int, partners: int, skip: int = -1):
        """Document x into a pipeline not in `used` that stays under `limit`: the least loaded one with room if any,
        else (depth > 0) the best of the `partners` least loaded able to hold it after ejecting some of its documents
        (_eject), each placed the same way one level down. (largest time touched, [(doc, pipeline, ejected)] in
        order) or None; `used` gains the pipelines taken."""
        off = list(used) + ([skip] if skip >= 0 else [])
        r, v = self._direct(x, off, limit)
        if r >= 0:
            used.add(r)
            return v, [(x, r, [])]
        if depth == 0:
            return None
        cand = self.t + self.wcol(x) + self.op  # an empty one opens a micro-batch
        able = self.m >= self.l[x]
        able[off] = False
        rs = able.nonzero()[0]
        best = None
        for r in rs[np.argsort(cand[rs], kind="stable")][:partners].tolist():
            if not self.bins[r]:
                continue
            k = self.tok[r].index(min(self.tok[r]))  # the first micro-batch of fewest tokens
            ej = self._eject(r, k, x, limit)
            if not ej:  # None, or [] (then it was direct)
                continue
            worst = float(cand[r]) - sum(self.work(r, e) for e in ej)
            sub, acts = used | {r}, [(x, r, ej)]
            for e in sorted(ej, key=lambda e: -int(self.l[e])):
                got = self._place(e, sub, limit, depth - 1, partners)
                if got is None:
                    break
                worst, acts = max(worst, got[0]), acts + got[1]
            else:
                if worst < limit and (best is None or worst < best[0]):
                    best = (worst, acts, sub)
        if best is None:
            return None
        used |= best[2]
        return best[0], best[1]

    def _move(self, j: int, i: int, depth: int, partners: int, beat: float = np.inf):
        """The best compound move of document i out of pipeline j (which may take ejected documents back): (largest
        time touched, actions) or None; None too, without searching, when j's own time without i is >= `beat` (the
        move's largest time is at least that, so it could not be < beat)."""
        saved = ([list(b) for b in self.bins[j]], list(self.tok[j]), self.t[j], self.room[j])
        limit = float(self.t[j]) * (1 - EPS)
        self._take(j, i)
        self._set(j, self._time(j), self._room(j))
        self._cache.pop(j, None)
        tj = float(self.t[j])
        got = self._place(i, set(), limit, depth, partners, skip=j) if tj < beat else None
        self.bins[j], self.tok[j] = saved[:2]
        self._set(j, *saved[2:])
        self._cache.pop(j, None)
        return None if got is None else (max(tj, got[0]), got[1])

    def _put(self, r: int, x: int) -> None:
        """Document x into r's micro-batch with most room (a new one when r has none)."""
        if not self.bins[r]:
            self.bins[r].append([])
            self.tok[r].append(0)
        k = min(range(len(self.bins[r])), key=lambda kk: self.tok[r][kk])
        self.bins[r][k].append(x)
        self.tok[r][k] += int(self.l[x])

    def _take(self, j: int, x: int, keep: bool = False) -> None:
        """Document x out of pipeline j; its micro-batch goes when emptied unless `keep`."""
        k = next(kk for kk, b in enumerate(self.bins[j]) if x in b)
        self.bins[j][k].remove(x)
        self.tok[j][k] -= int(self.l[x])
        if not self.bins[j][k] and not keep:
            del self.bins[j][k], self.tok[j][k]

    def apply(self, j: int, i: int, acts: list[tuple[int, int, list[int]]]) -> None:
        """Document i out of j, then each (doc, pipeline, ejected): the ejected out, the document in (into the
        micro-batch with most room, which _eject emptied enough; emptied micro-batches kept until then)."""
        self._take(j, i)
        for x, r, ej in acts:
            for e in ej:
                self._take(r, e, keep=True)
            self._put(r, x)
            keep = [k for k, b in enumerate(self.bins[r]) if b]
            self.bins[r], self.tok[r] = [self.bins[r][k] for k in keep], [self.tok[r][k] for k in keep]
        for p in {j, *(r for _, r, _ in acts)}:
            self._set(p, self._time(p), self._room(p))
            self._cache.pop(p, None)

    def run(self, moves: int, cands: int, partners: int, eject: int, depth: int = 1, deadline_ok=lambda: True) -> int:
        """Compound moves on the slowest pipeline until none helps; returns how many were made."""
        self.eject, made = eject, 0
        while made < moves and deadline_ok() and len(self.bins) > 1:
            j = int(np.argmax(self.t))
            docs = sorted(self.docs(j), key=lambda i: (-self.work(j, i), i))[:cands]
            best = None
            for i in docs:  # a document whose move cannot beat the best so far is not searched (same choice)
                mv = self._move(j, i, depth, partners, np.inf if best is None else best[0][0])
                if mv is not None and (best is None or mv[0] < best[0][0]):
                    best = (mv, i)
            if best is None:
                break
            (_, acts), i = best
            self.apply(j, i, acts)
            made += 1
        return made


def exchange(l_: np.ndarray, pipes, bins, *, moves: int = 16, cands: int = 4, partners: int = 32, eject: int = 3,
             depth: int = 1, deadline_ok=lambda: True) -> tuple[Exchange, int]:
    """The module doc's compound moves on one plan (micro-batches of document ids per pipeline, every pipeline
    one-stage): (the Exchange, moves made). `deadline_ok()`: checked before each move."""
    ex = Exchange(l_, pipes, bins)
    return ex, ex.run(moves, cands, partners, eject, depth, deadline_ok)
