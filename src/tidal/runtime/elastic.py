"""Elastic restarts: after a rank dies, continue on the surviving devices from the newest verified checkpoint, with
candidate strategies re-planned for all of them (docs/training.md, "Elastic training").

A restart is a new job: the cluster loses the dead ranks' devices (:func:`shrink_cluster`), the candidates are
re-proposed for the new world (:func:`for_world`: ``[planner] strategies = "auto"``, the proposal DP over every
surviving device, e.g. 7 CPUs as cp4+3*tp1), and the run resumes: weights and moments load at any world size (the
optimizer's layout depends on the world only), the planner's stream carries over whole (`stepper.carry_state`), the
metrics rows after the checkpoint are dropped. Nothing here starts processes: `tidal train --elastic` (cli/elastic.py)
drives the spawned ranks; under torchrun, torchrun's agent restarts the workers (`--max-restarts`) and each restart
calls :func:`for_world` with the world torchrun gives.
"""

from __future__ import annotations

import dataclasses
import re

from tidal.core.cluster import get_cluster
from tidal.core.errors import TidalError
from tidal.core.scheme import parse_strategies

_DIED = re.compile(r"rank (\d+) died with exit code (-?\d+)")


def dead_ranks(error: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every rank a launcher error reports dead (`runtime.launch.run_distributed`'s message);
    empty when the failure was a rank raising an error (not a lost device: no restart)."""
    return sorted({(int(r), int(c)) for r, c in _DIED.findall(error)})


def shrink_cluster(name: str, lost: list[int]) -> str:
    """The cluster spec string without the devices of ranks `lost` (rank r runs on device r): `cpux8` minus one is
    `cpux7`; `h800x16+h20x32` minus device 20 is `h800x16+h20x31`."""
    cluster = get_cluster(name)
    counts, start = [], 0
    for g in cluster.groups:
        gone = sum(start <= r < start + g.devices for r in set(lost))
        counts.append((g.device.name, g.devices - gone))
        start += g.devices
    terms = [f"{dev}x{n}" for dev, n in counts if n > 0]
    if not terms:
        raise TidalError(f"elastic: no device of cluster {name} survives")
    return "+".join(terms)


def for_world(cfg, cluster: str, resume: bool):
    """`cfg` for a restart on `cluster`: candidates re-proposed for every device of it ("auto") unless the
    configured strategies already use all of them, and `resume` set. Returns (config, one-line note or "")."""
    world = get_cluster(cluster).num_devices
    strategies = cfg.planner.strategies
    note = ""
    if strategies.strip().lower() != "auto":
        used = {sum(s.num_devices for s in sch) for sch in parse_strategies(strategies)}
        if used != {world}:
            note = f"strategies {strategies!r} do not use all {world} devices: re-planned with 'auto'"
            strategies = "auto"
    planner = dataclasses.replace(cfg.planner, strategies=strategies)
    world_cfg = dataclasses.replace(cfg.world, cluster=cluster)
    train = dataclasses.replace(cfg.train, resume=resume)
    return dataclasses.replace(cfg, planner=planner, world=world_cfg, train=train), note
