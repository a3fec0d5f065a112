#!/usr/bin/env bash
# Two nodes of 8 GPUs, by hand: run this on both nodes with NODE_RANK=0 and NODE_RANK=1 and HEAD=<node 0's address>.
#   HEAD=10.0.0.1 NODE_RANK=0 bash examples/multinode/torchrun-2nodes.sh   # on node 0
#   HEAD=10.0.0.1 NODE_RANK=1 bash examples/multinode/torchrun-2nodes.sh   # on node 1
# docs/multinode.md explains every variable. `tidal train` refuses a launch that does not match [world] cluster.
set -euo pipefail
: "${HEAD:?set HEAD to the address of node 0}"
: "${NODE_RANK:?set NODE_RANK to 0 or 1}"
CONFIG=${CONFIG:-examples/multinode/llama2-7b-a800x16.toml}
CKPT=${CKPT:-/shared/runs/llama2-7b/ckpt}   # the config's [train] checkpoint_dir
RESUME=$([ -e "$CKPT/latest" ] && echo --resume || true)  # a restarted or requeued job continues from it

# NCCL: the network to use and how loudly to report (adapt the names to your nodes: `ip -br link`, `ibv_devices`)
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}        # bootstrap/socket interface; "^lo,docker0" excludes
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5_0,mlx5_1,mlx5_2,mlx5_3}  # InfiniBand adapters for inter-node traffic
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}                       # INFO once, to see which transport NCCL picked
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}  # a failed collective ends the job
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

exec torchrun --nnodes 2 --nproc-per-node 8 --node-rank "$NODE_RANK" \
  --rdzv-id "${RDZV_ID:-tidal-llama2-7b}" --rdzv-backend c10d --rdzv-endpoint "$HEAD:29500" \
  -m tidal train --config "$CONFIG" $RESUME
