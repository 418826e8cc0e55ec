#!/usr/bin/env bash
# The GPU check: what a session runs first on a lent GPU: `headroom bench --gpu`'s benchmarks (peak memory and
# where evaluation runs first, asserting evaluation on cuda), each under its own time limit so that one slow
# benchmark cannot take the rest with it. Reads only torch and the benchmark scripts: it runs where Ray and MLflow
# are not installed. JSON files go to $1 (default
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
# each benchmark under its own limit, with the arguments `headroom bench --gpu` uses (benchmarks/gpu_sizes.json);
# ONLY="a b" runs just those
while read -r name limit args; do
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    t0=$SECONDS
    echo "== $name (limit ${limit}s): $args"
    # shellcheck disable=SC2086  # the arguments are words of the JSON list
    timeout "$limit" "$py" "benchmarks/$name.py" $args --out "$out/$name.json" 2>&1 \
        | grep -v -E "^(GPU|TPU|HPU|LOCAL_RANK|💡)"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || status=1
done < <("$py" -c "
import json
for name, v in json.load(open('benchmarks/gpu_sizes.json')).items():
    if name != '_doc':
        print(name, v['limit_s'], ' '.join(v['args']))")
exit $status
