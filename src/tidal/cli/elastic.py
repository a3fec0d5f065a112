"""`tidal train --elastic`: when a rank dies, restart on the surviving ranks from the newest verified checkpoint, with
strategies re-planned for all of them (runtime/elastic.py; docs/training.md, "Elastic training").

With `--nproc N` this process is the agent: it spawns the ranks, and when one dies (killed, crashed: a lost device)
it restarts the job on N - (dead) ranks, up to `--max-restarts` times, printing one line per restart with the
downtime. A rank that *raises* (a bug, bad input) is not a lost device: that error ends the run as without
--elastic. Under torchrun, torchrun's agent is the one that restarts (`torchrun --max-restarts=K --nnodes=MIN:MAX`):
every (re)started worker resumes from the newest verified checkpoint, on the world size torchrun gives it.
"""

from __future__ import annotations

from pathlib import Path

from tidal.core.errors import TidalError


def _has_checkpoint(directory: str) -> bool:
    from tidal.runtime import ckptdir

    return bool(directory) and (bool(ckptdir.checkpoints(directory)) or (Path(directory) / "latest").exists())


def torchrun_config(cfg, world: int):
    """A torchrun worker's config under --elastic: the cluster sized to the world torchrun gives (devices of the
    configured first type), strategies re-planned if they do not use it all, resumed if a checkpoint exists."""
    from tidal.core.cluster import get_cluster
    from tidal.runtime import ckptdir
    from tidal.runtime.elastic import for_world

    cluster = get_cluster(cfg.world.cluster)
    name = cfg.world.cluster if cluster.num_devices == world else f"{cluster.groups[0].device.name}x{world}"
    cfg, note = for_world(cfg, name, _has_checkpoint(cfg.train.checkpoint_dir))
    if note:
        ckptdir.say(f"elastic: {note}")
    return cfg


def run_elastic(cfg, nproc: int, max_restarts: int, run) -> list:
    """Run `run(cfg, world)` (prepare and launch one job); after a rank death, shrink the world and run again."""
    from tidal.runtime import ckptdir
    from tidal.runtime.elastic import dead_ranks, for_world, shrink_cluster

    if not cfg.train.checkpoint_dir:
        raise TidalError("--elastic needs a checkpoint directory ([train] checkpoint_dir or --checkpoint-dir)")
    if max_restarts < 0:
        raise TidalError(f"--max-restarts must be >= 0, got {max_restarts}")
    world, restarts = nproc, 0
    while True:
        try:
            return run(cfg, world)
        except (RuntimeError, TidalError) as e:
            dead = dead_ranks(str(e))
            if not dead or restarts >= max_restarts:
                raise
            restarts += 1
            cluster = shrink_cluster(cfg.world.cluster, [r for r, _ in dead])
            resume = _has_checkpoint(cfg.train.checkpoint_dir)
            cfg, note = for_world(cfg, cluster, resume)
            world -= len(dead)
            where = "the newest verified checkpoint" if resume else "the start (no checkpoint yet)"
            ranks = ", ".join(f"{r} (exit code {c})" for r, c in dead)
            ckptdir.say(f"elastic: rank {ranks} died; restart {restarts}/{max_restarts} on {world} ranks "
                        f"({cluster}) from {where}" + (f"; {note}" if note else ""))
