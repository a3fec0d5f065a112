"""Under torchrun: does the launch match the cluster description? (issue 26 item 2; docs/multinode.md)

torchrun tells each worker the world (`WORLD_SIZE`), the ranks on its node (`LOCAL_WORLD_SIZE`) and its node's index
(`GROUP_RANK`), and numbers ranks node by node. `[world] cluster` tells the planner how many devices each node holds
(`DeviceType.per_node`: 8 for the GPU types; the last node may hold fewer): which groups are intra-node (NVLink) and
which cross the network. A launch that disagrees would plan TP over the network or price fast links as slow, so
`tidal train` refuses it before any process group exists, saying what to change (exit 2).

CPU clusters check the world size only: `cpu`'s eight per node is a nominal figure that no cluster name can change,
and a CPU run's placement only moves the planner's bandwidth estimates.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError


def torchrun_shape(cluster: ClusterSpec) -> str:
    """The torchrun arguments that launch `cluster`: '--nnodes N --nproc-per-node P' (nodes of unequal size: one
    launch per node, each with its own --nproc-per-node)."""
    sizes = cluster.node_sizes()
    if len(set(sizes)) == 1:
        return f"--nnodes {len(sizes)} --nproc-per-node {sizes[0]}"
    return f"--nnodes {len(sizes)} with --nproc-per-node {' '.join(map(str, sizes))} on nodes 0..{len(sizes) - 1}"


def check_launch(env: Mapping[str, str], cluster: ClusterSpec) -> None:
    """Raise a one-line TidalError when torchrun's `env` (WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK) does not match
    `cluster`'s device count or devices per node. Variables torchrun did not set are not checked."""
    sizes = cluster.node_sizes()
    shape = f"{len(sizes)} node{'s' if len(sizes) > 1 else ''} of {'/'.join(map(str, sorted(set(sizes))))}"
    world = _int(env, "WORLD_SIZE")
    if world is not None and world != cluster.num_devices:
        kind = cluster.groups[0].device.name if len(cluster.groups) == 1 else "TYPE"
        raise TidalError(f"torchrun started {world} ranks (WORLD_SIZE) but cluster {cluster.name} has "
                         f"{cluster.num_devices} devices ({shape}): launch with {torchrun_shape(cluster)}, or set "
                         f"[world] cluster = \"{kind}x{world}\"")
    local = _int(env, "LOCAL_WORLD_SIZE")
    if local is None or all(g.device.name == "cpu" for g in cluster.groups):
        return
    node = _int(env, "GROUP_RANK")
    if node is None:  # torchrun sets it; without it, the node of this rank
        rank = _int(env, "RANK")
        node = cluster.node_of(rank) if rank is not None and rank < cluster.num_devices else 0
    want = sizes[node] if node < len(sizes) else 0
    if local != want:
        dev = cluster.device_type(min(sum(sizes[:node]), cluster.num_devices - 1))
        raise TidalError(f"torchrun runs {local} ranks on node {node} (LOCAL_WORLD_SIZE) but cluster {cluster.name} "
                         f"puts {want} devices there ({shape}; {dev.name} nodes hold {dev.per_node}): launch with "
                         f"{torchrun_shape(cluster)}")


def _int(env: Mapping[str, str], key: str) -> int | None:
    v = env.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise TidalError(f"torchrun variable {key}={v!r} is not an integer") from None
