#!/usr/bin/env bash
# On a lent GPU machine, from the repository root (the device tool's `run`, carrying .gpu):
#   bash benchmarks/gpu_run.sh
# Installs the wheels benchmarks/gpu_prepare.sh gathered into .gpu/whl (the machine reaches no registry),
# then runs benchmarks/gpu_run.py: the gpu test tier, the engine benchmark on CUDA, a short Ray Train +
# DeepSpeed run and a small synthesize on PhysioNet, every figure as JSON under $OUT (default runs/gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ls .gpu/whl/*.whl >/dev/null 2>&1 || ls .gpu/whl/*.tar.gz >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || { echo "[gpu_run] installing the carried wheels failed" >&2; exit 1; }
  for sdist in .gpu/whl/*.tar.gz; do  # DeepSpeed ships as an sdist: build it here (ninja, nvcc are there)
    [ -e "$sdist" ] && DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
      --target /tmp/site "$sdist" || true
  done
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" benchmarks/gpu_run.py "$@"
