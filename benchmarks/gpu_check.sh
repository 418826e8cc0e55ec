#!/usr/bin/env bash
# The GPU check: what a session runs first on a lent GPU. Measures peak memory and where evaluation runs
# (benchmarks/gpu_memory.py, asserting evaluation on cuda), then `headroom bench --gpu`'s benchmarks, each under its
# own time limit so that one slow benchmark cannot take the rest with it. JSON files go to $1 (default
# benchmarks/results/gpu). On a machine without CUDA it says so in one line and exits 2.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
export HEADROOM_CACHE="${HEADROOM_CACHE:-/tmp/headroom-cache}"
py="${PYTHON:-python3}"
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU is visible on this machine" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, transformers, pytorch_lightning as pl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', pl.__version__)"
status=0
run() {  # run LIMIT_S NAME ARGS...: one benchmark under its limit (ONLY="a b": just those)
    local limit=$1 name=$2; shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$py" "benchmarks/$name.py" "$@" --out "$out/$name.json" 2>&1 | grep -v -E "^(GPU|TPU|HPU|LOCAL_RANK|💡)" 
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || status=1
}
run "${GPU_MEMORY_LIMIT:-120}" gpu_memory --steps 30
run "${PRUNE_SPEED_LIMIT:-60}" prune_speed --scale l --batch-size 64 --seq-len 512 --dtype bfloat16 --device cuda \
    --repeats 15 --passes 10 --warmup 2
run "${TRAIN_OVERHEAD_LIMIT:-150}" train_overhead --scale m --steps 60 --warmup 10 --repeats 3 --mfu-scales l,xl \
    --mfu-steps 60
run "${ABLATION_LIMIT:-50}" ablation_batched --scale l --batches 2 --batch-size 8 --seq-len 256 --max-rows 256 \
    --device cuda --repeats 5
run "${KERNELS_LIMIT:-120}" train_kernels --scale l --steps 30 --warmup 10 --repeats 5 --batch-size 16 --seq-len 512
exit $status
