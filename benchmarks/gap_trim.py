"""A cheap repair of a packed plan: drop a micro-batch, repack, rebalance (issue 27, decision 131; measurement only).

Works on the plan `select_step` returns, for its chosen candidate, when every pipeline has one stage priced as the sum
of its micro-batches (time V c + W, decision 94; skipped otherwise). It assumes nothing else about the plan: it keeps
each pipeline's documents and micro-batches as the plan has them, then
  1. repacks every pipeline by Minimum Bin Slack (Gupta and Ho: each micro-batch takes the longest document left and
     the subset of the others that fills it best, an exact subset sum on a bitset), keeping the packing when it needs
     fewer micro-batches than the plan's; then rebalances (3);
  2. "near" pipelines: those whose tokens exceed (V - 1) MaxLen by at most --excess of MaxLen (or not at all). One
     drop: the pipeline's shortest documents (summing to at least the excess, then one more at a time, at most
     --drop-tries counts) go into micro-batches with room on other pipelines, the least loaded first, and the rest is
     MBS-packed in V - 1 micro-batches. A round tries each near pipeline alone and every near pipeline at once (least
     excess first; one that fails to drop then takes documents), each followed by (3), and keeps the one that lowers
     the step time most; rounds repeat while one does (at most --rounds);
  3. rebalances: while a move of one document (into the micro-batch with most room) or a swap of two (both micro-
     batches still <= MaxLen) out of the slowest pipeline lowers the larger of the two pipelines' times under the
     step time, makes the best one; with --repack-tries N, when none does, also tries the N best moves into a
     pipeline without room, kept when MBS repacks it in its count.
The result is checked (every document once, every micro-batch <= MaxLen, no empty micro-batch) and timed as the
planner times a one-stage pipeline: the sum over its micro-batches of c + work (the plan's own time is recomputed
so and must equal its est_time). Printed: plan / bound, repaired / plan, repaired / bound, CPU ms of the repair.

    cd benchmarks && python gap_trim.py --model llama2-13b --cluster a800x16 --source flanv2 --seeds 0,1,2 --steps 0:5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from planner_grid import probe_args, probe_steps, q

from tidal.planner.select import select_step
from tidal.proof.lp import prove_selection


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
    assert s == 0
    return out


def mbs_pack(l_: np.ndarray, docs: list[int], cap: int, most: int) -> list[list[int]] | None:
    """Minimum Bin Slack: micro-batches (document ids) of at most `cap` tokens; None if it needs > `most`."""
    rest = sorted(docs, key=lambda i: -int(l_[i]))
    bins: list[list[int]] = []
    while rest:
        if len(bins) == most or int(l_[rest[0]]) > cap:
            return None
        first, others = rest[0], rest[1:]
        take = best_subset([int(l_[i]) for i in others], cap - int(l_[first]))
        chosen = set(take)
        bins.append([first] + [others[k] for k in take])
        rest = [i for k, i in enumerate(others) if k not in chosen]
    return bins


class Trim:
    """The plan's micro-batches per pipeline (lists of document ids) with their times; the module doc's passes."""

    def __init__(self, l_: np.ndarray, pipes, bins: list[list[list[int]]]):
        self.l, self.pipes = l_, pipes
        self.bins = [[list(b) for b in bs if b] for bs in bins]
        self.w = [p.work(l_) for p in pipes]  # work of every document on every pipeline

    def load(self, j: int, b: int) -> int:
        return int(self.l[self.bins[j][b]].sum())

    def time(self, j: int) -> float:
        return sum(self.pipes[j].c + float(self.w[j][b].sum()) for b in self.bins[j])

    def times(self) -> list[float]:
        return [self.time(j) for j in range(len(self.pipes))]

    def docs(self, j: int) -> list[int]:
        return [i for b in self.bins[j] for i in b]

    def repack(self) -> int:
        """Step 1: the pipelines MBS packs in fewer micro-batches, repacked; returns how many."""
        n = 0
        for j, p in enumerate(self.pipes):
            got = mbs_pack(self.l, self.docs(j), p.max_len, len(self.bins[j]) - 1)
            if got is not None:
                self.bins[j], n = got, n + 1
        return n

    def place(self, i: int, avoid: set[int]) -> bool:
        """Document i into a micro-batch with room on the least loaded pipeline not in `avoid` (best fit there)."""
        t = self.times()
        for o in sorted(range(len(self.pipes)), key=lambda o: t[o] + self.w[o][i]):
            if o in avoid:
                continue
            room = [(self.pipes[o].max_len - self.load(o, b), b) for b in range(len(self.bins[o]))]
            fit = [r for r in room if r[0] >= self.l[i]]
            if fit:
                self.bins[o][min(fit)[1]].append(i)
                return True
        return False

    def drop(self, j: int, excess: float, tries: int, avoid: set[int]) -> bool:
        """Step 2 on pipeline j, its documents moved to pipelines not in `avoid`: whether it now runs one micro-batch
        fewer (unchanged when not)."""
        p, V, docs = self.pipes[j], len(self.bins[j]), self.docs(j)
        over = int(self.l[docs].sum()) - (V - 1) * p.max_len
        if V < 2 or over > excess * p.max_len:
            return False
        small = sorted(docs, key=lambda i: int(self.l[i]))
        k = int(np.searchsorted(np.cumsum(self.l[small]), over)) + 1 if over > 0 else 0
        for kk in range(k, min(k + tries, len(small))):
            saved = [[list(b) for b in bs] for bs in self.bins]
            moved = set(small[:kk])
            got = mbs_pack(self.l, [i for i in docs if i not in moved], p.max_len, V - 1)
            if got is not None:
                self.bins[j] = got
                if all(self.place(i, avoid | {j}) for i in small[:kk]):
                    return True
            self.bins = saved
        return False

    def drop_all(self, js: list[int], excess: float, tries: int) -> int:
        """Step 2 on the pipelines js at once, the least over (V - 1) MaxLen first; their documents go to the other
        pipelines and to those of js that failed to drop. Returns how many dropped."""
        over = {j: int(self.l[self.docs(j)].sum()) - (len(self.bins[j]) - 1) * self.pipes[j].max_len for j in js}
        avoid, made = set(js), 0
        for j in sorted(js, key=over.get):
            if self.drop(j, excess, tries, avoid):
                made += 1
            else:
                avoid.discard(j)
        return made

    def _flat(self, j: int):
        """Pipeline j's documents, their micro-batch index and that micro-batch's free tokens, as arrays."""
        ids = np.asarray(self.docs(j), dtype=np.int64)
        at = np.asarray([b for b, bs in enumerate(self.bins[j]) for _ in bs], dtype=np.int64)
        free = np.asarray([self.pipes[j].max_len - self.load(j, b) for b in range(len(self.bins[j]))], dtype=np.int64)
        return ids, at, free

    def _move_repacked(self, j, t, out_j, ij, aj, tries: int) -> bool:
        """Step 3 where no micro-batch has room: the `tries` best moves of one document out of j that lower the step
        time if the receiver, MBS-repacked, still needs no more micro-batches; makes the first that does."""
        cands = []
        for o in range(len(self.pipes)):
            if o == j:
                continue
            p, tok = self.pipes[o], int(self.l[self.docs(o)].sum())
            new = np.maximum(out_j, t[o] + self.w[o][ij])
            ok = (new < t[j] - 1e-12) & (tok + self.l[ij] <= p.max_len * len(self.bins[o]))
            cands += [(float(new[m]), o, m) for m in np.nonzero(ok)[0].tolist()]
        for _, o, m in sorted(cands)[:tries]:
            i = int(ij[m])
            got = mbs_pack(self.l, self.docs(o) + [i], self.pipes[o].max_len, len(self.bins[o]))
            if got is not None:
                self.bins[o] = got
                self.bins[j][int(aj[m])].remove(i)
                self.bins[j] = [b for b in self.bins[j] if b]
                return True
        return False

    def rebalance(self, repack_tries: int = 0) -> int:
        """Step 3; returns the moves and swaps made. `repack_tries`: see _move_repacked (0: off)."""
        made, t, flat = 0, None, None
        while True:
            if t is None:  # every pipeline's time and (documents, micro-batch, free room); then only the two changed
                t, flat = self.times(), [self._flat(o) for o in range(len(self.pipes))]
            j = int(np.argmax(t))
            ij, aj, fj = flat[j]
            single = np.asarray([len(self.bins[j][b]) == 1 for b in aj])
            out_j = t[j] - self.w[j][ij] - np.where(single, self.pipes[j].c, 0.0)  # j's time without document i
            best = (t[j], None)
            for o in range(len(self.pipes)):
                if o == j:
                    continue
                io, ao, fo = flat[o]
                bo = int(np.argmax(fo))  # a move goes where the room is largest
                new = np.where(self.l[ij] <= fo[bo], np.maximum(out_j, t[o] + self.w[o][ij]), np.inf)
                m = int(np.argmin(new))
                if new[m] < best[0] - 1e-12:
                    best = (float(new[m]), ("move", int(ij[m]), j, int(aj[m]), o, bo, None))
                if io.size == 0:
                    continue
                dl = self.l[io][None, :] - self.l[ij][:, None]  # swap i (row) and k (column): j's bin gains dl
                ok = (dl <= fj[aj][:, None]) & (-dl <= fo[ao][None, :]) & (dl != 0)
                tj = (t[j] - self.w[j][ij])[:, None] + self.w[j][io][None, :]
                to = (t[o] - self.w[o][io])[None, :] + self.w[o][ij][:, None]
                new2 = np.where(ok, np.maximum(tj, to), np.inf)
                m = int(np.argmin(new2))
                r, c = divmod(m, io.size)
                if new2[r, c] < best[0] - 1e-12:
                    best = (float(new2[r, c]), ("swap", int(ij[r]), j, int(aj[r]), o, int(ao[c]), int(io[c])))
            if best[1] is None:
                if not self._move_repacked(j, t, out_j, ij, aj, repack_tries):
                    return made
                made, t = made + 1, None
                continue
            kind, i, j, bj, o, bo, k = best[1]
            self.bins[j][bj].remove(i)
            self.bins[o][bo].append(i)
            if kind == "swap":
                self.bins[o][bo].remove(k)
                self.bins[j][bj].append(k)
            self.bins[j] = [b for b in self.bins[j] if b]
            made += 1
            for x in (j, o):
                t[x], flat[x] = self.time(x), self._flat(x)

    def check(self) -> float:
        """Every document once, every micro-batch non-empty and <= MaxLen; returns the step time."""
        if sorted(i for bs in self.bins for b in bs for i in b) != list(range(self.l.size)):
            raise ValueError("the plan does not hold every document exactly once")
        for p, bs in zip(self.pipes, self.bins):
            if not all(b and int(self.l[b].sum()) <= p.max_len for b in bs):
                raise ValueError("the plan has an empty micro-batch or one over MaxLen")
        return max(self.times())


def trim(l_: np.ndarray, pipes, bins, excess: float = 0.02, tries: int = 3, rounds: int = 3, repack_tries: int = 0):
    """The module doc's repair of one plan: (the Trim, its checked step time, micro-batches dropped in step 2,
    pipelines repacked in step 1, moves and swaps)."""
    tr = Trim(l_, pipes, bins)
    repacked = tr.repack()
    moves = tr.rebalance(repack_tries)
    dropped = 0
    for _ in range(rounds):  # each round: the drop (one pipeline or all) that, rebalanced, lowers the step time most
        start, best = [[list(b) for b in bs] for bs in tr.bins], (max(tr.times()), None, 0)
        near = [j for j in range(len(pipes)) if len(tr.bins[j]) >= 2 and int(l_[tr.docs(j)].sum())
                - (len(tr.bins[j]) - 1) * pipes[j].max_len <= excess * pipes[j].max_len]
        for js in [[j] for j in near] + [near] * (len(near) > 1):  # one pipeline, or every one near a drop at once
            tr.bins = [[list(b) for b in bs] for bs in start]
            if tr.drop_all(js, excess, tries):
                m = tr.rebalance(repack_tries)
                if max(tr.times()) < best[0] * (1 - 1e-12):
                    best = (max(tr.times()), [[list(b) for b in bs] for bs in tr.bins], m)
        tr.bins = start if best[1] is None else best[1]
        if best[1] is None:
            break
        dropped, moves = dropped + 1, moves + best[2]
    return tr, tr.check(), dropped, repacked, moves


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    probe_args(ap, "llama2-13b", "a800x16", "flanv2", "0,1,2", "0:5")
    ap.add_argument("--excess", type=float, default=0.02, help="step 2 tries pipelines over (V - 1) MaxLen by at "
                                                               "most this fraction of MaxLen")
    ap.add_argument("--drop-tries", type=int, default=3, help="step 2: document counts tried per pipeline")
    ap.add_argument("--rounds", type=int, default=3, help="steps 2-3 repeated at most this often")
    ap.add_argument("--repack-tries", type=int, default=0,
                    help="step 3 also tries this many moves into a pipeline with no room, MBS-repacked (0: off)")
    ap.add_argument("--prove", choices=["none", "lp", "pool"], default="lp",
                    help="the bound: none, the LP proof, or the pooled proof with count rows (--pool-s s per solve)")
    ap.add_argument("--pool-s", type=float, default=5.0, help="seconds per pooled solve (--prove pool)")
    args = ap.parse_args(argv)
    if not (0 < args.excess <= 1 and args.drop_tries >= 1 and args.rounds >= 1 and args.pool_s > 0
            and args.repack_tries >= 0):
        raise SystemExit(f"error: --excess in (0, 1], --drop-tries and --rounds >= 1, --pool-s > 0, --repack-tries "
                         f">= 0; got {args.excess}, {args.drop_tries}, {args.rounds}, {args.pool_s}, "
                         f"{args.repack_tries}")
    names, profs, steps = probe_steps(args.model, args.cluster, args.candidates, args.source, args.seeds,
                                      args.steps)
    print(f"# {args.model} {args.cluster} {args.candidates} {args.source}: candidates {', '.join(names)}; bound "
          f"{args.prove}; excess {args.excess:g}, drop tries {args.drop_tries}, rounds {args.rounds}, repack tries "
          f"{args.repack_tries}")
    print("| seed | step | docs | candidate | plan s | plan / bound | repaired / plan | repaired / bound | V before | "
          "V after | repacked | dropped | moves | repair CPU ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, after, cpu = [], [], []
    for seed, k, l_ in steps:
        sel = select_step(l_, profs, seed=0)
        if args.prove != "none":
            sel = prove_selection(l_, profs, sel, pool_s=args.pool_s if args.prove == "pool" else 0.0,
                                  pool_counts=args.prove == "pool")
        plan, est = sel.plan, sel.plan.est_step_time
        lb = plan.lower_bound if args.prove != "none" else np.nan
        pipes = list(profs[plan.strategy].pipes)
        if any(p.pp != 1 or p.eq1 for p in pipes):
            print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | {est:.5f} | {est / lb:.4f} | (not one-stage: "
                  f"skipped) | | | | | | | |")
            continue
        bins = [[list(mb) for mb in pp.micro_batches] for pp in plan.pipelines]
        own = Trim(l_, pipes, bins).check()
        if abs(own - est) > 1e-9 * est:
            raise SystemExit(f"error: the plan's time {own} is not its est_time {est} (seed {seed} step {k})")
        c0 = time.thread_time()
        tr, got, dropped, repacked, moves = trim(l_, pipes, bins, args.excess, args.drop_tries, args.rounds,
                                                     args.repack_tries)
        ms = (time.thread_time() - c0) * 1e3
        tr_v = [len([b for b in bs if b]) for bs in bins]
        ratios.append(got / est)
        after.append(got / lb)
        cpu.append(ms)
        print(f"| {seed} | {k} | {l_.size} | {names[plan.strategy]} | {est:.5f} | {est / lb:.4f} | {got / est:.4f} | "
              f"{got / lb:.4f} | {tr_v} | {[len(bs) for bs in tr.bins]} | {repacked} | {dropped} | {moves} | "
              f"{ms:.0f} |", flush=True)
    if ratios:
        print(f"# repaired / plan: median {q(ratios, 0.5):.4f}, p90 {q(ratios, 0.9):.4f}, worst {max(ratios):.4f}; "
              f"repaired / bound: median {q(after, 0.5):.4f}, p90 {q(after, 0.9):.4f}, worst {max(after):.4f}, "
              f"<= 1.01 on {sum(a <= 1.01 for a in after)} of {len(after)}; CPU ms median {q(cpu, 0.5):.0f}, "
              f"p90 {q(cpu, 0.9):.0f}, worst {max(cpu):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
