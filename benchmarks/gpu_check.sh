#!/usr/bin/env bash
# The GPU check: what a session runs first on a lent GPU. Within GPU_CHECK_BUDGET_S seconds (default 480: 8 minutes)
# it runs `headroom bench --gpu`'s benchmarks (peak memory against the plan's estimate and where evaluation runs,
# MFU and tokens/s, batched ablation, pruned latency in bf16), each under its own limit so that one slow benchmark
# cannot take the rest with it, then, where Ray and MLflow are installed, the check sweep sweeps/gpu-check.yaml
# in what time is left. benchmarks/gpu_summary.py gathers it all into one JSON, OUT_DIR/gpu_check.json, and fails
# unless every evaluation ran on cuda. The benchmarks read only torch and the benchmark scripts: they run where Ray
# and MLflow are not installed. On a machine without CUDA it says so in one line and exits 2.
#   bash benchmarks/gpu_check.sh [OUT_DIR]     (default benchmarks/results/gpu; ONLY="a b" runs just those)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
export HEADROOM_CACHE="${HEADROOM_CACHE:-/tmp/headroom-cache}"
py="${PYTHON:-python3}"
budget="${GPU_CHECK_BUDGET_S:-480}"
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU is visible on this machine" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, transformers, pytorch_lightning as pl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', pl.__version__)"
# nothing from an earlier run is summarised as measured now
rm -f "$out/sweep.json" "$out/gpu_check.json"
"$py" -c "
import json
print('\n'.join(n for n in json.load(open('benchmarks/gpu_sizes.json')) if n != '_doc'))" \
    | while read -r name; do rm -f "$out/$name.json"; done
# each benchmark under its own limit (never past the budget), with the arguments `headroom bench --gpu` uses
# (benchmarks/gpu_sizes.json)
while read -r name limit args; do
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    left=$((budget - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 5 ]; then echo "== $name: skipped, the budget is spent"; continue; fi
    t0=$SECONDS
    echo "== $name (limit ${limit}s): $args"
    # shellcheck disable=SC2086  # the arguments are words of the JSON list
    timeout -k 10 "$limit" "$py" "benchmarks/$name.py" $args --out "$out/$name.json" < /dev/null 2>&1 \
        | grep -v -E "^(GPU|TPU|HPU|LOCAL_RANK|💡)"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
done < <("$py" -c "
import json
for name, v in json.load(open('benchmarks/gpu_sizes.json')).items():
    if name != '_doc':
        print(name, v['limit_s'], ' '.join(v['args']))")
left=$((budget - SECONDS))
if [ -z "${ONLY:-}" ] && "$py" -c "import ray, mlflow" 2> /dev/null && [ "$left" -gt 60 ]; then
    echo "== sweep sweeps/gpu-check.yaml (limit ${left}s)"
    rm -rf "$out/mlflow.db" "$out/sweep"
    uri="sqlite:///$PWD/$out/mlflow.db"
    timeout -k 10 "$left" "$py" -m orchestration.cli sweep sweeps/gpu-check.yaml --quiet --storage "$PWD/$out/sweep" \
        --tracking-uri "$uri" < /dev/null
    printf '{"exit": %d, "tracking_uri": "%s", "experiment": "gpu-check"}\n' $? "$uri" > "$out/sweep.json"
else
    echo "== sweep: not run (needs Ray and MLflow installed, and a minute of the budget)"
fi
"$py" benchmarks/gpu_summary.py "$out"
