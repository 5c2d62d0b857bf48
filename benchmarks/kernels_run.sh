#!/usr/bin/env bash
# On a lent machine, from the repository root (the device tool's `run`, carrying .gpu; its CPU is the point, not
# its GPU): the clinical NER's weights on that CPU (issue 41 item 4; benchmarks/ner_kernels.py).
#   here:  bash benchmarks/gpu_prepare.sh --kernels
#   there: bash benchmarks/kernels_run.sh [ner_kernels.py options, e.g. --cv --workers 5; or, in a second call,
#          --cv-only --workers 5: the CV alone, for a CPU whose hashes the first call recorded; no veto_gpu then]
#   here:  .venv/bin/python benchmarks/ner_kernels.py --merge <files_at>/ner_kernels_entry.json
# Unpacks the carried site (.gpu/kernels-site.tar.xz: the locked spaCy / Presidio / numpy for CPython 3.12; the
# machine reaches no registry) and runs ner_kernels.py on the carried notes and lists; its entry (this CPU's
# hashes, and the CV with --cv) and log land in $OUT (default runs/kernels). Where CUDA is, then
# benchmarks/veto_gpu.py (the veto engine with its tagger on the GPU): back here, `veto_gpu.py --render FILE`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-runs/kernels}"
mkdir -p "$OUT"
[ -f .gpu/kernels-site.tar.xz ] || { echo "[kernels_run] no .gpu/kernels-site.tar.xz: run benchmarks/gpu_prepare.sh --kernels" >&2; exit 1; }
site="${TMPDIR:-/tmp}/kernels-site"
rm -rf "$site" && mkdir -p "$site" && tar -C "$site" -xJf .gpu/kernels-site.tar.xz || {
  echo "[kernels_run] unpacking the carried site failed" >&2; exit 1; }
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONNOUSERSITE=1
export KERNELS_RUN="bash benchmarks/kernels_run.sh${*:+ $*}"  # the command the entry records
"$PY" benchmarks/ner_kernels.py --physionet .gpu/data/physionet-deid --deid-lists .gpu/deid \
  --commit "$(cat .gpu/COMMIT 2>/dev/null || echo '?')" --entry "$OUT/ner_kernels_entry.json" "$@" \
  2>&1 | tee "$OUT/ner_kernels.log"
rc="${PIPESTATUS[0]}"
# the veto engine with its tagger on the GPU (benchmarks/veto_gpu.py), where there is one
if [[ " $* " != *" --cv-only "* ]] && "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  CTRLGEN_PHYSIONET=.gpu/data/physionet-deid timeout 240 "$PY" benchmarks/veto_gpu.py --out "$OUT/veto_gpu.json" \
    2>&1 | tee "$OUT/veto_gpu.log"
fi
exit "$rc"
