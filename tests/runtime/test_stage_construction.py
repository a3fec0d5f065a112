"""A llama2-7b-shaped stage (tp2, pp4) is constructed on CPU without materialising the model: each rank's resident
memory grows by about its shard (measured with getrusage's peak RSS), and its weights equal the matching slice of the
unsharded model's initialisation (models/init.py), compared exactly (bf16)."""

import pytest

from tidal.runtime.launch import run_distributed

from _construct_cases import NAMES, construct_worker  # isort: skip

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_llama2_7b_stage_is_built_shard_by_shard():
    for r in run_distributed(construct_worker, 2, timeout_s=600):
        assert r["layers"] == list(range(8, 16)) and not r["has_embed"] and not r["has_head"]
        shard = r["shard_bytes"]
        assert 0.75e9 < shard < 0.85e9 * 2  # 8 layers x 202M params / tp2 in bf16 ~ 1.6 GB
        # peak RSS grows by the shard plus one initialisation block of the widest row, never the 13.5 GB model
        assert r["rss_growth"] < 1.25 * shard + 300e6, (r["rss_growth"], shard)
        assert r["rss_growth"] < 0.2 * r["full_model_bytes"]
        for name in NAMES:
            shape, equal = r["checks"][name]
            assert equal, (name, shape)
