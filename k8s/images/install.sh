#!/usr/bin/env bash
# Install headroom and its locked dependencies into the current Python environment. The headroom image's
# Dockerfile runs this; tests/test_k8s.py runs it in a fresh virtual environment. Usage:
#   k8s/images/install.sh [SOURCE_DIR]     (default: the repository this script belongs to)
# PYTHON selects the interpreter (default: python3 on PATH); LOCK the lock file (default: requirements-cpu.lock
# beside this script; the GPU image uses requirements-gpu.lock).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${1:-$(cd "$here/../.." && pwd)}"
py="${PYTHON:-python3}"
lock="${LOCK:-$here/requirements-cpu.lock}"

# every dependency at the version of the lock (ray must equal the manifests' rayVersion)
"$py" -m pip install --no-cache-dir -r "$lock"
# headroom itself, without letting pip re-resolve what the lock fixed; its build backend (setuptools) is locked too
"$py" -m pip install --no-cache-dir --no-deps --no-build-isolation "$src"
"$py" -m pip check
"$py" -m orchestration.cli --help > /dev/null
echo "headroom installed into $("$py" -c 'import sys; print(sys.prefix)')"
