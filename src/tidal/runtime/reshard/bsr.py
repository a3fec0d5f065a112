"""Batched send/receive planning (Hetu v2 §4.3, §6.2): topology, the three sender heuristics, message fusion, and the
per-rank volume accounting of a plan. Pure python."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.runtime.reshard.plan import Collective, RankStats


@dataclass(frozen=True)
class Topology:
    """Node of every rank and link bandwidths, precomputed from a ClusterSpec (rank i is device i)."""

    nodes: tuple[int, ...]
    bw: tuple[tuple[float, ...], ...]

    @staticmethod
    def from_cluster(cluster: ClusterSpec, ranks: int | None = None) -> Topology:
        n = cluster.num_devices if ranks is None else ranks
        if n > cluster.num_devices:
            raise TidalError(f"topology needs {n} ranks but cluster {cluster.name} has {cluster.num_devices} devices")
        nodes = tuple(cluster.node_of(d) for d in range(n))
        bw = tuple(tuple(cluster.bandwidth(a, b) for b in range(n)) for a in range(n))
        return Topology(nodes, bw)

    @staticmethod
    def uniform(ranks: int, per_node: int | None = None) -> Topology:
        """`ranks` ranks, `per_node` to a node (default: one node), intra links 10x faster than inter links."""
        per = per_node or ranks
        nodes = tuple(r // per for r in range(ranks))
        bw = tuple(tuple(float("inf") if a == b else (10.0 if nodes[a] == nodes[b] else 1.0) for b in range(ranks))
                   for a in range(ranks))
        return Topology(nodes, bw)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def check(self, devices: Iterable[int]) -> None:
        bad = [d for d in devices if d >= self.size]
        if bad:
            raise TidalError(f"devices {sorted(set(bad))} are outside the topology of {self.size} ranks")


@dataclass(frozen=True)
class Links:
    """Node of every rank and the bandwidth of a link, in O(N) (no N x N table)."""

    nodes: tuple[int, ...]
    intra: tuple[float, ...]  # per rank: bandwidth to a peer of its node
    inter: tuple[float, ...]  # ... to a peer of another node
    table: tuple[tuple[float, ...], ...] | None = None  # explicit bandwidths (from a Topology) override the above

    def bw(self, a: int, b: int) -> float:
        if self.table is not None:
            return self.table[a][b]
        if a == b:
            return float("inf")
        if self.nodes[a] == self.nodes[b]:
            return min(self.intra[a], self.intra[b])
        return min(self.inter[a], self.inter[b])

    @staticmethod
    def from_cluster(cluster: ClusterSpec, ranks: int | None = None) -> Links:
        """The same nodes and bandwidths as `Topology.from_cluster` (ClusterSpec.bandwidth)."""
        n = cluster.num_devices if ranks is None else ranks
        if n > cluster.num_devices:
            raise TidalError(f"links need {n} ranks but cluster {cluster.name} has {cluster.num_devices} devices")
        nodes, intra, inter = [], [], []
        node = 0
        for g in cluster.groups:
            for i in range(g.devices):
                if i and i % g.device.per_node == 0:
                    node += 1
                nodes.append(node)
                intra.append(g.device.intra_bw)
                inter.append(g.device.inter_bw)
            node += 1
        return Links(tuple(nodes[:n]), tuple(intra[:n]), tuple(inter[:n]))

    @staticmethod
    def from_topology(topo: Topology) -> Links:
        return Links(topo.nodes, (), (), topo.bw)


class Load:
    """Cumulative send/recv bytes per rank, shared across the tensors of a fused plan."""

    def __init__(self) -> None:
        self.send: dict[int, int] = defaultdict(int)
        self.recv: dict[int, int] = defaultdict(int)


def choose_sender(holders: Sequence[int], receiver: int, nbytes: int, topo: Topology, load: Load,
                  heuristics: bool) -> int:
    """Heuristic (I) is applied by the caller (a receiver already holding the cell copies locally). (II) highest
    bandwidth link to the receiver, (III) lowest cumulative send load, then lowest rank. Without heuristics: the lowest
    rank."""
    if len(holders) == 1:
        s = holders[0]
    elif not heuristics:
        s = min(holders)
    else:
        row = topo.bw
        s = min(holders, key=lambda h: (-row[h][receiver], load.send[h], h))
    load.send[s] += nbytes
    load.recv[receiver] += nbytes
    return s


def choose_root(contributors: Sequence[int], needers: Sequence[int], nbytes: int, topo: Topology, load: Load,
                heuristics: bool) -> int:
    """Root of a point-to-point reduction: a contributor that needs the result if any (it then holds it locally), else
    the single needer (contributions travel one hop, straight to it), else the contributor with the best link to the
    first needer and the lowest receive load."""
    inside = [c for c in contributors if c in needers]
    pool = inside or (list(needers) if len(needers) == 1 else list(contributors))
    if not heuristics:
        root = min(pool)
    else:
        first = min(needers) if needers else pool[0]
        root = min(pool, key=lambda c: (-topo.bw[c][first] if c != first else float("-inf"), load.recv[c], c))
    k = sum(c != root for c in contributors)
    load.recv[root] += k * nbytes
    for c in contributors:
        if c != root:
            load.send[c] += nbytes
    return root


def _stats(stats: dict[int, RankStats], r: int) -> RankStats:
    if r not in stats:
        stats[r] = RankStats()
    return stats[r]


def add_p2p(stats: dict[int, RankStats], topo: Topology, sender: int, receiver: int, nbytes: int) -> None:
    inter = topo.nodes[sender] != topo.nodes[receiver]
    s, r = _stats(stats, sender), _stats(stats, receiver)
    if inter:
        s.send_inter += nbytes
        r.recv_inter += nbytes
    else:
        s.send_intra += nbytes
        r.recv_intra += nbytes


def ring_order(ranks: Sequence[int], topo: Topology) -> list[int]:
    return sorted(ranks, key=lambda r: (topo.nodes[r], r))


def add_collective(stats: dict[int, RankStats], topo: Topology, col: Collective, itemsize: int) -> None:
    """Ring model: AR sends 2(k-1)/k of the buffer per member, RS and AG (k-1) chunks (the buffer is k chunks)."""
    k = len(col.ranks)
    chunk = col.chunk_elems() * itemsize
    per = 2 * (k - 1) * chunk // k if col.kind == "AR" else (k - 1) * chunk
    ring = ring_order(col.ranks, topo)
    for i, r in enumerate(ring):
        _stats(stats, r).collectives += 1
        if k > 1:
            add_p2p(stats, topo, r, ring[(i + 1) % k], per)
