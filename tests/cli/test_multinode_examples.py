"""The multi-node examples (examples/multinode/) agree with each other and pass `tidal train`'s launch check."""

import re
from pathlib import Path

import pytest

from tidal.cli.multinode import check_launch, torchrun_shape
from tidal.core.cluster import get_cluster
from tidal.runtime.config import load_config

pytestmark = pytest.mark.unit
EX = Path(__file__).resolve().parents[2] / "examples" / "multinode"


@pytest.mark.parametrize("script", ["torchrun-2nodes.sh", "slurm-2nodes.sbatch"])
def test_scripts_launch_the_cluster_of_the_config(script):
    text = (EX / script).read_text()
    cfg = load_config(EX / re.search(r"examples/multinode/(\S+\.toml)", text).group(1))
    cluster = get_cluster(cfg.world.cluster)
    per_node = int(re.search(r"--nproc-per-node (\d+)", text).group(1))
    nodes = 2 if script.endswith(".sh") else int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    assert torchrun_shape(cluster) == f"--nnodes {nodes} --nproc-per-node {per_node}"
    for node in range(nodes):  # every worker's environment as torchrun sets it
        check_launch({"WORLD_SIZE": str(nodes * per_node), "LOCAL_WORLD_SIZE": str(per_node),
                      "GROUP_RANK": str(node), "RANK": str(node * per_node)}, cluster)
    for var in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert f"export {var}=" in text
    assert "--rdzv-backend c10d" in text
