#!/usr/bin/env bash
# The checks of one lent GPU session, in one call (docs/runtime.md "On a GPU" records what they gave):
#   bash benchmarks/gpu_session.sh OUTDIR [PART ...]      (no PART: all of them)
# 1. the `cuda` tests; 2. a one-GPU `tidal verify` in bf16; 3. one-GPU training of a ~1B model (tokens/s, MFU, peak
# memory against the memory model); 4. the attention backends; 5. `tidal profile` of llama2-7b's layer shape (4 layers)
# at 1K-16K tokens, for the cost model's H200 check; 6. activation bytes per layer and per vocabulary entry
# (benchmarks/act_bytes.py) of llama3.2-1b and llama2-7b's shapes against the memory model; 7. GEMM and attention
# efficiency at llama2-7b's TP shards (benchmarks/gpu_kernels.py: sdpa at TP 1-8, flex at TP 1 and 8), for the analytic
# model's Hopper efficiencies; 8. part 5 with the sdpa backend (the runtime's overhead apart from flex's); 9. part 5
# and llama3.2-1b with the per-micro-batch backend `mixed` (decision 119; named only since decision 133):
# against parts 5 and 8 (and benchmarks/data/h200-llama3.2-1b-profile-*.csv), the rule's measured gain; 10. part 3
# with `mixed` and with `flex` in one call (train-1b-mixed, train-1b-flex): mixed's end-to-end gain in training;
# train-1b-sdpa: the same with sdpa (no cuDNN since decision 133); train-1b-mixed-compiled: mixed with
# `[model] compile = "dense"` (decision 140); train-1b-eager-cm: the defaults planned with the cost model fitted on
# Hopper (`--cost-model analytic-eager`), for decision 141's predicted / measured compute (every train part prints it);
# 11. benchmarks/gpu_compile.py (compile): llama3.2-1b eager against its dense parts compiled, on repeated and on new
# document lengths.
# Each part has its own time limit and goes on after a failure; everything lands in OUTDIR/session.log.
set -u
OUT=${1:-gpu-out}
shift || true
PARTS=" $* "
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
part() {
  local name=$1 limit=$2
  shift 2
  [ "$PARTS" = "  " ] || [[ "$PARTS" == *" $name "* ]] || return 0
  local t0
  t0=$(date +%s)
  echo "=== $name: $*" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name rc=$? in $(($(date +%s) - t0)) s" | tee -a "$LOG"
}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
} >>"$LOG" 2>&1
part cuda-tests 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/runtime/test_cuda.py \
  tests/runtime/test_gpu_defaults.py
part verify-bf16 80 python3 -m tidal.cli.main verify --model tiny --nproc 1 --strategies tp1 --steps 3 \
  --dtype bfloat16
part train-1b 150 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 12 \
  --out "$OUT/train_1b.json"
part train-1b-mixed 130 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 10 \
  --attn-backend mixed --out "$OUT/train_1b_mixed.json"
part train-1b-flex 100 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 10 \
  --attn-backend flex --out "$OUT/train_1b_flex.json"
part train-1b-mixed-compiled 130 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 10 \
  --attn-backend mixed --compile dense --out "$OUT/train_1b_mixed_compiled.json"
part train-1b-sdpa 100 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 10 \
  --attn-backend sdpa --out "$OUT/train_1b_sdpa.json"
part train-1b-eager-cm 120 python3 benchmarks/gpu_run.py --model llama3.2-1b --cluster h200x1 --steps 10 \
  --cost-model analytic-eager --out "$OUT/train_1b_eager_cm.json"
part attention 50 python3 benchmarks/attention_backends.py --repeats 5
part profile-7b 110 python3 -m tidal.cli.main profile --model examples/model-llama2-7b-4layers.toml \
  --cluster h200x1 --schemes tp1 --totals 1024,4096,16384 --mixes 2 --repeats 3 --attn-backend flex \
  --out "$OUT/profile.json"
part act-bytes-1b 40 python3 benchmarks/act_bytes.py --model llama3.2-1b --tokens 4096,16384 --attn-backend sdpa
part act-bytes-7b 40 python3 benchmarks/act_bytes.py --model llama2-7b --tokens 4096,16384 --attn-backend sdpa
part kernels 110 python3 benchmarks/gpu_kernels.py --backends sdpa --out "$OUT/kernels.json"
part kernels-flex 80 python3 benchmarks/gpu_kernels.py --backends flex --tps 1,8 --tokens "" --lengths 4096,16384 \
  --out "$OUT/kernels_flex.json"
part profile-7b-sdpa 110 python3 -m tidal.cli.main profile --model examples/model-llama2-7b-4layers.toml \
  --cluster h200x1 --schemes tp1 --totals 1024,4096,16384 --mixes 2 --repeats 3 --attn-backend sdpa \
  --out "$OUT/profile_sdpa.json"
part profile-7b-mixed 110 python3 -m tidal.cli.main profile --model examples/model-llama2-7b-4layers.toml \
  --cluster h200x1 --schemes tp1 --totals 1024,4096,16384 --mixes 2 --repeats 3 --attn-backend mixed \
  --out "$OUT/profile_mixed.json"
part profile-1b-mixed 150 python3 -m tidal.cli.main profile --model llama3.2-1b --cluster h200x1 --schemes tp1 \
  --totals 1024,4096,16384,32768 --mixes 2 --repeats 3 --attn-backend mixed --out "$OUT/profile_1b_mixed.json"
part compile 200 python3 benchmarks/gpu_compile.py --model llama3.2-1b
grep "^===" "$LOG"
