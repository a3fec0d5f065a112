"""ClusterSpec: nodes of devices, possibly of several types, with peak FLOPs, memory and link bandwidths."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType

from tidal.core.errors import TidalError

GB = 1e9
GiB = 2**30


@dataclass(frozen=True)
class DeviceType:
    name: str
    peak_flops: float  # dense 16-bit FLOP/s
    memory_bytes: float
    intra_bw: float  # bytes/s per device to a peer in the same node
    inter_bw: float  # bytes/s per device to a peer in another node: its share of the node's NICs (node bw / per_node)
    per_node: int = 8
    # attention kernel shape for the CP sharding choice (costmodel.kernel): query tile rows and the padded query length
    # at which the kernel reaches half its peak. GPU flash kernels: 128 and 174 (WLB-LLM Fig. 10). CPU SDPA has no
    # tile padding to speak of.
    attn_tile: int = 128
    attn_q_half: float = 174.0
    # True where the attention kernel computes a CP piece's whole [Lq, Lk] rectangle instead of skipping masked key
    # blocks (CPU SDPA with a bottom-right mask): per-doc CP then does (2CP+1)/(2CP) times the causal work per rank
    attn_cp_rect: bool = False
    # True where the analytic model's calibrated efficiencies apply (GPUs; calibrated on A800 profiles, extrapolated to
    # others by peak FLOP/s and link bandwidths); False: the pre-calibration figures (costmodel.analytic.EFFICIENCY_V1)
    calibrated: bool = True
    hbm_bw: float = 2.0e12  # bytes/s of device memory (vendor spec): the simulator's optimizer step


@dataclass(frozen=True)
class NodeGroup:
    """`nodes` nodes of `device.per_node` devices each (the last node may hold fewer: `devices` is exact)."""

    device: DeviceType
    devices: int

    @property
    def nodes(self) -> int:
        return -(-self.devices // self.device.per_node)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    groups: tuple[NodeGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups or any(g.devices < 1 for g in self.groups):
            raise TidalError(f"cluster {self.name!r} has no devices")

    @property
    def num_devices(self) -> int:
        return sum(g.devices for g in self.groups)

    def node_sizes(self) -> tuple[int, ...]:
        """Device count of every node, in device-id order."""
        out: list[int] = []
        for g in self.groups:
            full, rest = divmod(g.devices, g.device.per_node)
            out += [g.device.per_node] * full + ([rest] if rest else [])
        return tuple(out)

    def node_of(self, device: int) -> int:
        self._check(device)
        start = 0
        for node, size in enumerate(self.node_sizes()):
            if device < start + size:
                return node
            start += size
        raise AssertionError("unreachable")

    def device_type(self, device: int) -> DeviceType:
        self._check(device)
        start = 0
        for g in self.groups:
            if device < start + g.devices:
                return g.device
            start += g.devices
        raise AssertionError("unreachable")

    def bandwidth(self, a: int, b: int) -> float:
        """Bytes/s of the link between two devices (the slower end's figure); infinite to itself."""
        if a == b:
            return float("inf")
        ta, tb = self.device_type(a), self.device_type(b)
        if self.node_of(a) == self.node_of(b):
            return min(ta.intra_bw, tb.intra_bw)
        return min(ta.inter_bw, tb.inter_bw)

    def _check(self, device: int) -> None:
        if not 0 <= device < self.num_devices:
            raise TidalError(f"device {device} is not in cluster {self.name} of {self.num_devices} devices")

    def to_dict(self) -> dict:
        return {"name": self.name}


DEVICE_TYPES: MappingProxyType[str, DeviceType] = MappingProxyType(
    {
        # inter_bw is per GPU: the node's inter-node bandwidth / 8. Hydraulis §8: 200 GB/s InfiniBand per A800 node
        # (25 GB/s per GPU); A100 nodes the same; H100/H800 nodes 8 x 400 Gb/s NDR (50 GB/s per GPU); H20's is not
        # published with its Hetu cluster (Hetu v2 App. A.1): 200 GB/s per node assumed.
        "a800": DeviceType("a800", 312e12, 80 * GB, 400 * GB, 25 * GB, hbm_bw=2.039e12),
        "a100": DeviceType("a100", 312e12, 80 * GB, 600 * GB, 25 * GB, hbm_bw=2.039e12),
        # A100-SXM4-40GB: Hydraulis' 7b_A100 strategy pool (gpu_memory_bound 39.6 GiB)
        "a100-40": DeviceType("a100-40", 312e12, 40 * GB, 600 * GB, 25 * GB, hbm_bw=1.555e12),
        "h100": DeviceType("h100", 989e12, 80 * GB, 900 * GB, 50 * GB, hbm_bw=3.35e12),
        "h800": DeviceType("h800", 990e12, 80 * GB, 400 * GB, 50 * GB, hbm_bw=3.35e12),
        # H200 SXM: the H100's chip (dense bf16 989 TFLOP/s by the datasheet) with 141 GB of HBM3e at 4.8 TB/s
        "h200": DeviceType("h200", 989e12, 141 * GB, 900 * GB, 50 * GB, hbm_bw=4.8e12),
        "h20": DeviceType("h20", 148e12, 96 * GB, 900 * GB, 25 * GB, hbm_bw=4.0e12),
        # One CPU rank of this class of machine (gloo over shared memory). Figures are nominal: fit a cost model with
        # `tidal profile` for real numbers. Memory is per rank.
        "cpu": DeviceType("cpu", 5e10, 2 * GiB, 5 * GB, 1 * GB, per_node=8, attn_tile=1, attn_q_half=1.0,
                          attn_cp_rect=True, calibrated=False, hbm_bw=50 * GB),
    }
)

def with_memory(cluster: ClusterSpec, memory_bytes: float) -> ClusterSpec:
    """The same cluster with every device's memory set to `memory_bytes` (a budget to plan for, e.g. `[world]
    memory_gib`: the planner and memory model use it; nothing enforces it on the device)."""
    if not memory_bytes > 0:
        raise TidalError(f"device memory must be positive, got {memory_bytes}")
    groups = tuple(NodeGroup(replace(g.device, memory_bytes=float(memory_bytes)), g.devices) for g in cluster.groups)
    return ClusterSpec(cluster.name, groups)


_TERM = re.compile(r"^([a-z][a-z0-9-]*?)x(\d+)$")


def get_cluster(name: str) -> ClusterSpec:
    """Parse `TYPExN[+TYPExM...]`, e.g. `a800x64`, `h800x16+h20x32`, `cpux4`."""
    groups = []
    for term in name.strip().lower().split("+"):
        m = _TERM.match(term)
        if not m or m.group(1) not in DEVICE_TYPES:
            raise TidalError(
                f"unknown cluster preset {name!r}; use TYPExN joined by '+', TYPE in {', '.join(DEVICE_TYPES)}"
            )
        n = int(m.group(2))
        if n < 1:
            raise TidalError(f"cluster {name!r}: device count must be >= 1")
        groups.append(NodeGroup(DEVICE_TYPES[m.group(1)], n))
    return ClusterSpec(name, tuple(groups))
