"""Elastic restarts (runtime/elastic.py, cli/elastic.py): which failures restart, on how many ranks, with which
strategies; the agent loop driven by a stand-in for the launch (the real 8 -> 7 rank run is benchmarks/elastic.py)."""

import pytest

from tidal.cli.elastic import run_elastic, torchrun_config
from tidal.core import TidalError, get_cluster
from tidal.runtime.config import PlannerConfig, TrainConfig, TrainSection, WorldConfig
from tidal.runtime.elastic import dead_ranks, for_world, shrink_cluster

pytestmark = [pytest.mark.reliability, pytest.mark.unit]

DIED = "distributed worker failed: rank {r} died with exit code -9 before reporting (crashed at start-up or was killed)"


def _cfg(tmp_path, strategies="4*tp1+2*tp2", cluster="cpux8"):
    return TrainConfig(world=WorldConfig(cluster), planner=PlannerConfig(strategies),
                       train=TrainSection(steps=16, checkpoint_dir=str(tmp_path / "ckpt")))


def test_dead_ranks_and_shrunk_clusters():
    assert dead_ranks(DIED.format(r=3) + "; then rank 1 raised:\nRuntimeError: Connection closed by peer") == [(3, -9)]
    assert dead_ranks("distributed worker failed: rank 1 raised:\nTidalError: bad") == []
    assert shrink_cluster("cpux8", [3]) == "cpux7"
    assert shrink_cluster("h800x16+h20x32", [20, 47]) == "h800x16+h20x30"
    assert shrink_cluster("h800x16+h20x32", [0]) == "h800x15+h20x32"
    assert get_cluster(shrink_cluster("a800x8+h20x8", list(range(8)))).num_devices == 8
    with pytest.raises(TidalError, match="no device"):
        shrink_cluster("cpux2", [0, 1])


def test_restart_config_replans_for_every_survivor(tmp_path):
    cfg, note = for_world(_cfg(tmp_path), "cpux7", True)
    assert cfg.world.cluster == "cpux7" and cfg.planner.strategies == "auto" and cfg.train.resume
    assert "do not use all 7 devices" in note
    same, note = for_world(_cfg(tmp_path, "tp2+5*tp1;7*tp1"), "cpux7", False)
    assert same.planner.strategies == "tp2+5*tp1;7*tp1" and note == "" and not same.train.resume


def test_agent_restarts_on_rank_death_only(tmp_path):
    calls = []

    def run(cfg, world):
        calls.append((world, cfg.world.cluster, cfg.planner.strategies, cfg.train.resume))
        if len(calls) == 1:
            (tmp_path / "ckpt" / "step-000010").mkdir(parents=True)  # what the first run left
            raise RuntimeError(DIED.format(r=3))
        return ["done"]

    assert run_elastic(_cfg(tmp_path), 8, 3, run) == ["done"]
    assert calls == [(8, "cpux8", "4*tp1+2*tp2", False), (7, "cpux7", "auto", True)]

    def raises(cfg, world):
        raise RuntimeError("distributed worker failed: rank 2 raised:\nValueError: a bug")

    with pytest.raises(RuntimeError, match="a bug"):  # a rank that raises is not a lost device
        run_elastic(_cfg(tmp_path), 8, 3, raises)
    deaths = []

    def dies(cfg, world):
        deaths.append(world)
        raise RuntimeError(DIED.format(r=0))

    with pytest.raises(RuntimeError, match="died"):
        run_elastic(_cfg(tmp_path), 8, 2, dies)
    assert deaths == [8, 7, 6]  # two restarts, then the third death ends the run
    with pytest.raises(TidalError, match="needs a checkpoint directory"):
        run_elastic(_cfg(tmp_path).__class__(), 8, 3, run)


def test_torchrun_worker_sizes_the_cluster_to_its_world(tmp_path):
    cfg = torchrun_config(_cfg(tmp_path), 6)
    assert cfg.world.cluster == "cpux6" and cfg.planner.strategies == "auto" and not cfg.train.resume
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("step-000004\n")
    assert torchrun_config(_cfg(tmp_path, "8*tp1"), 8).train.resume
