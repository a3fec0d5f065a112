"""A communication-order checker: record every torch.distributed call a rank makes (on gloo), then replay all ranks'
records under NCCL's rules to find deadlocks and mismatched collective sequences that gloo's buffering hides.

* :class:`Recorder` (a context manager, used inside a rank worker) wraps the collectives, the point-to-point calls,
  ``batch_isend_irecv`` (one grouped op), work handles' ``wait`` and ``new_group`` of the ``torch.distributed``
  module while it is open, and lists :class:`Op` records in call order. Instrumentation only: the calls themselves
  run unchanged.
* :func:`replay` runs the ranks' records against the model below and returns a :class:`Replay`.

The replay model (docs/runtime.md, "Communication-order checker"):

1. Each rank issues its records in program order. A blocking call (every collective without ``async_op``, ``send``,
   ``recv``) is posted and then waited; ``isend`` / ``irecv`` / ``batch_isend_irecv`` / async collectives are posted
   and the rank goes on until it waits on their handle. A wait on an incomplete operation stops the rank: under NCCL
   the compute stream waits, and every later operation is ordered after it.
2. Each process group is one communicator with one FIFO stream per rank: an operation starts only when every earlier
   operation of that rank on that group has completed. Groups progress independently of each other.
3. A ``batch_isend_irecv`` is one unit: at the head of its FIFO all its sends and receives are posted together, and it
   completes when all of them have.
4. A collective completes when every member of its group has it at the head of that group's FIFO; the i-th
   collectives of all members must agree in kind and bytes.
5. Point-to-point messages between two ranks on one group match in posting order (NCCL ignores tags). A receive
   completes when its send is posted; a send of more than `buffer_bytes` bytes (all of them with the default 0)
   completes only when its matching receive is at the head of the receiver's FIFO, i.e. it blocks until matched;
   smaller sends complete on posting (buffered).

It is more conservative than NCCL in two ways: one FIFO per group, where NCCL runs ``send``/``recv`` outside a
batch on a separate communicator per peer pair (so an order the replay accepts is safe under either); and, at
`buffer_bytes` = 0, sends that never complete into a buffer. It is less conservative in one: it knows nothing about
the GPU streams beyond the waits recorded (an async operation that is never waited before a later dependent kernel is
not modelled), and it sees only the order of one run's calls, not other possible interleavings of threads.
"""

from __future__ import annotations

import inspect
from collections import defaultdict, deque
from dataclasses import dataclass, field

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
               "barrier", "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list")
_PAYLOAD = ("tensor", "input_tensor", "input", "output", "input_tensor_list")  # the argument whose bytes are recorded


@dataclass(frozen=True)
class P2P:
    op: str  # "send" | "recv"
    peer: int  # global rank (-1: any source)
    nbytes: int


@dataclass(frozen=True)
class Op:
    """One recorded call. kind: a collective's name, "p2p" (send / recv / isend / irecv: one part), "batch"
    (batch_isend_irecv: its parts), "wait" (of op `ref`, an index into the same rank's list) or "new_group"."""

    kind: str
    comm: str = ""  # the process group's name (unique per group, equal on every rank)
    ranks: tuple[int, ...] = ()  # the group's global ranks
    nbytes: int | None = None  # a collective's payload bytes on this rank (None: object collectives)
    parts: tuple[P2P, ...] = ()
    blocking: bool = True
    ref: int = -1

    def describe(self) -> str:
        if self.kind in ("p2p", "batch"):
            body = ", ".join(f"{p.op} {'to' if p.op == 'send' else 'from'} {p.peer} {p.nbytes} B" for p in self.parts)
            return f"{self.kind}[{body}] on group {list(self.ranks)}"
        return f"{self.kind} {self.nbytes} B on group {list(self.ranks)}"


@dataclass
class Recorder:
    """Inside a spawned rank: ``with Recorder() as rec: ...``; ``rec.ops`` then holds the rank's calls in order."""

    ops: list[Op] = field(default_factory=list)
    _saved: dict = field(default_factory=dict)

    def __enter__(self) -> Recorder:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self._dist, self._c10d = dist, c10d
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(name, self._collective(name, getattr(dist, name)))
        for name in ("send", "recv", "isend", "irecv"):
            self._patch(name, self._p2p(name, getattr(dist, name)))
        self._patch("batch_isend_irecv", self._batch(dist.batch_isend_irecv))
        self._patch("new_group", self._new_group(dist.new_group))
        orig_op, unwrap = dist.P2POp, {self._dist.isend: c10d.isend, self._dist.irecv: c10d.irecv}

        def p2p_op(op, tensor, peer=None, group=None, tag=0, group_peer=None):
            return orig_op(unwrap.get(op, op), tensor, peer, group, tag, group_peer)

        self._patch("P2POp", p2p_op)
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(self._dist, name, fn)
        self._saved.clear()

    def _patch(self, name: str, fn) -> None:
        self._saved.setdefault(name, getattr(self._dist, name))
        setattr(self._dist, name, fn)

    def _group(self, group) -> tuple[str, tuple[int, ...]]:
        g = self._dist.group.WORLD if group is None else group
        return str(g.group_name), tuple(self._dist.get_process_group_ranks(g))

    def _add(self, op: Op, work):
        self.ops.append(op)
        if work is None or op.blocking:
            return work
        ref = len(self.ops) - 1
        if isinstance(work, list):
            return [_Work(w, self, ref) for w in work]
        return _Work(work, self, ref)

    def _collective(self, name: str, fn):
        sig = inspect.signature(fn)

        def wrapper(*args, **kwargs):
            b = sig.bind(*args, **kwargs)
            b.apply_defaults()
            a = b.arguments
            comm, ranks = self._group(a.get("group"))
            payload = next((a[k] for k in _PAYLOAD if k in a), None)
            nbytes = 0 if name in ("barrier", "monitored_barrier") else _nbytes(payload)
            if name.endswith("_object") or name.endswith("_object_list"):
                nbytes = None
            work = fn(*args, **kwargs)
            return self._add(Op(name, comm, ranks, nbytes, blocking=not a.get("async_op", False)), work)

        return wrapper

    def _p2p(self, name: str, fn):
        sig = inspect.signature(fn)
        send = name.endswith("send")

        def wrapper(*args, **kwargs):
            b = sig.bind(*args, **kwargs)
            b.apply_defaults()
            a = b.arguments
            group = a.get("group")
            comm, ranks = self._group(group)
            peer = a.get("dst" if send else "src")
            local = a.get("group_dst" if send else "group_src")
            if peer is None and local is not None:
                peer = ranks[local]
            part = P2P("send" if send else "recv", -1 if peer is None else int(peer), _nbytes(a["tensor"]))
            work = fn(*args, **kwargs)
            return self._add(Op("p2p", comm, ranks, parts=(part,), blocking=not name.startswith("i")), work)

        return wrapper

    def _batch(self, fn):
        def wrapper(p2p_op_list):
            comm, ranks = self._group(p2p_op_list[0].group if p2p_op_list else None)
            parts = tuple(P2P("send" if p.op is self._c10d.isend else "recv", int(p.peer), _nbytes(p.tensor))
                          for p in p2p_op_list)
            works = fn(p2p_op_list)
            return self._add(Op("batch", comm, ranks, parts=parts, blocking=False), list(works))

        return wrapper

    def _new_group(self, fn):
        def wrapper(ranks=None, *args, **kwargs):
            group = fn(ranks, *args, **kwargs)
            world = self._dist.get_world_size()
            members = tuple(sorted(int(r) for r in (range(world) if ranks is None else ranks)))
            self.ops.append(Op("new_group", ranks=members))
            return group

        return wrapper


class _Work:
    """A work handle whose wait() is recorded (then done)."""

    def __init__(self, work, rec: Recorder, ref: int) -> None:
        self._work, self._rec, self._ref = work, rec, ref

    def wait(self, *args, **kwargs):
        self._rec.ops.append(Op("wait", ref=self._ref))
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _nbytes(x) -> int | None:
    if isinstance(x, (list, tuple)):
        sizes = [_nbytes(t) for t in x]
        return None if any(s is None for s in sizes) else sum(sizes)
    if hasattr(x, "numel") and hasattr(x, "element_size"):
        return int(x.numel()) * int(x.element_size())
    return None


@dataclass(frozen=True)
class Replay:
    deadlock: bool
    completed: int  # operations completed: each p2p part and each collective, per rank
    total: int
    stuck: tuple[str, ...] = ()  # where each unfinished rank waits (deadlock only)
    mismatches: tuple[str, ...] = ()  # collective sequences, message sizes or group creation that differ
    first_call: tuple[str, ...] = ()  # groups carrying batched p2p whose first call on a member is no collective

    @property
    def ok(self) -> bool:
        return not self.deadlock and not self.mismatches and not self.first_call


def replay(traces: list[list[Op]], buffer_bytes: int = 0) -> Replay:
    """Replay `traces[r]` (rank r's records) under the model in the module docstring. `buffer_bytes`: sends of at
    most this many bytes complete into a buffer when `buffer_bytes` > 0; every other send blocks until matched."""
    return _Sim(traces, buffer_bytes).run()


Unit = tuple[int, int]  # (rank, index of the op in that rank's trace)


class _Sim:
    def __init__(self, traces: list[list[Op]], buffer_bytes: int) -> None:
        self.traces, self.buffer = traces, int(buffer_bytes)
        self.mismatches: list[str] = []
        self.match: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # p2p part -> its counterpart
        self.coll_seq: dict[str, dict[int, list[int]]] = defaultdict(dict)  # comm -> rank -> collective op indices
        self.coll_pos: dict[Unit, int] = {}
        self.members: dict[str, tuple[int, ...]] = {}
        self._index()

    def _index(self) -> None:
        sends, recvs = defaultdict(list), defaultdict(list)
        created = []
        for r, ops in enumerate(self.traces):
            created.append([op.ranks for op in ops if op.kind == "new_group"])
            for j, op in enumerate(ops):
                if op.kind in ("wait", "new_group"):
                    continue
                self.members.setdefault(op.comm, op.ranks)
                if op.kind in ("p2p", "batch"):
                    for p, part in enumerate(op.parts):
                        if part.op == "send":
                            sends[(op.comm, r, part.peer)].append((r, j, p))
                        else:
                            recvs[(op.comm, part.peer, r)].append((r, j, p))
                else:
                    seq = self.coll_seq[op.comm].setdefault(r, [])
                    self.coll_pos[(r, j)] = len(seq)
                    seq.append(j)
        if any(c != created[0] for c in created):
            first = next(r for r, c in enumerate(created) if c != created[0])
            self.mismatches.append(f"rank {first} creates process groups in another order than rank 0")
        for key in set(sends) | set(recvs):
            s, q = sends.get(key, []), recvs.get(key, [])
            for a, b in zip(s, q):
                self.match[a], self.match[b] = b, a
                na, nb = self._part(a).nbytes, self._part(b).nbytes
                if na != nb:
                    self.mismatches.append(f"group {key[0]}: message {key[1]} -> {key[2]} sends {na} B into {nb} B")
            if len(s) != len(q):
                self.mismatches.append(f"group {key[0]}: {len(s)} sends {key[1]} -> {key[2]}, {len(q)} receives")
        for comm, per in self.coll_seq.items():
            ranks = self.members[comm]
            sigs = {r: [(self.traces[r][j].kind, self.traces[r][j].nbytes) for j in per.get(r, [])] for r in ranks}
            ref = sigs[ranks[0]]
            for r in ranks[1:]:
                if len(sigs[r]) != len(ref) or any(a[0] != b[0] or (a[1] is not None and b[1] is not None and
                                                                    a[1] != b[1]) for a, b in zip(sigs[r], ref)):
                    self.mismatches.append(f"group {list(ranks)}: rank {r}'s collectives {_short(sigs[r])} differ "
                                           f"from rank {ranks[0]}'s {_short(ref)}")

    def _part(self, key: tuple[int, int, int]) -> P2P:
        return self.traces[key[0]][key[1]].parts[key[2]]

    def run(self) -> Replay:
        n = len(self.traces)
        pc, posted = [0] * n, [False] * n
        fifo: dict[tuple[str, int], deque] = defaultdict(deque)
        done_unit: set[Unit] = set()
        done_part: set[tuple[int, int, int]] = set()
        first_unit: dict[tuple[str, int], Op] = {}
        completed = 0
        total = sum(len(op.parts) if op.kind in ("p2p", "batch") else 1 for ops in self.traces for op in ops
                    if op.kind not in ("wait", "new_group"))
        progress = True
        while progress:
            progress = False
            for r, ops in enumerate(self.traces):  # each rank posts until it waits
                while pc[r] < len(ops):
                    op = ops[pc[r]]
                    if op.kind == "new_group":
                        pc[r] += 1
                    elif op.kind == "wait":
                        if (r, op.ref) not in done_unit:
                            break
                        pc[r] += 1
                    else:
                        if not posted[r]:
                            fifo[(op.comm, r)].append((r, pc[r]))
                            first_unit.setdefault((op.comm, r), op)
                            posted[r], progress = True, True
                        if op.blocking and (r, pc[r]) not in done_unit:
                            break
                        pc[r], posted[r] = pc[r] + 1, False
                    progress = True

            def head(comm: str, r: int) -> Unit | None:
                q = fifo.get((comm, r))
                return q[0] if q else None

            for (comm, r), q in list(fifo.items()):  # each FIFO head progresses
                if not q:
                    continue
                u = q[0]
                op = self.traces[r][u[1]]
                if op.kind not in ("p2p", "batch"):
                    i = self.coll_pos[u]
                    peers = []
                    for m in self.members[comm]:
                        seq = self.coll_seq[comm].get(m, [])
                        if i >= len(seq) or head(comm, m) != (m, seq[i]):
                            break
                        peers.append((m, seq[i]))
                    else:
                        for v in peers:
                            done_unit.add(v)
                            fifo[(comm, v[0])].popleft()
                        completed += len(peers)
                        progress = True
                    continue
                for p, part in enumerate(op.parts):
                    key = (r, u[1], p)
                    if key in done_part:
                        continue
                    other = self.match.get(key)
                    if part.op == "send" and self.buffer > 0 and part.nbytes <= self.buffer:
                        done_part.add(key)  # buffered: done on posting
                        completed += 1
                        progress = True
                    elif other is not None and part.op == "recv" and other in done_part:
                        done_part.add(key)  # its (buffered) send was posted
                        completed += 1
                        progress = True
                    elif other is not None and head(comm, other[0]) == other[:2] and other not in done_part:
                        done_part.update((key, other))  # both ends at their heads: the message moves
                        completed += 2
                        progress = True
                if all((r, u[1], p) in done_part for p in range(len(op.parts))):
                    done_unit.add(u)
                    q.popleft()
                    progress = True
        stuck = []
        for r, ops in enumerate(self.traces):
            if pc[r] < len(ops):
                op = ops[pc[r]]
                what = ops[op.ref] if op.kind == "wait" else op
                heads = [self.traces[r][q[0][1]].describe() for (c, x), q in fifo.items() if x == r and q]
                stuck.append(f"rank {r} waits on op {pc[r]} ({what.describe()}); FIFO heads: {'; '.join(heads)}")
            elif any(q for (c, x), q in fifo.items() if x == r):
                stuck.append(f"rank {r} finished with operations that never complete")
        return Replay(bool(stuck), completed, total, tuple(stuck), tuple(self.mismatches),
                      tuple(self._first_calls(first_unit)))

    def _first_calls(self, first_unit: dict[tuple[str, int], Op]) -> list[str]:
        out = []
        batched = {op.comm for ops in self.traces for op in ops if op.kind == "batch"}
        for comm in sorted(batched):
            for r in self.members[comm]:
                op = first_unit.get((comm, r))
                if op is None or op.kind in ("p2p", "batch"):
                    out.append(f"group {list(self.members[comm])}: rank {r}'s first call is "
                               f"{'nothing' if op is None else op.describe()}, not a collective of all members")
        return out


def _short(sig: list) -> str:
    return str(sig if len(sig) <= 6 else sig[:6] + ["..."])
