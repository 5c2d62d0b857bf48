import pytest
import torch

from ctrlgen.config import ModelConfig
from ctrlgen.errors import ModelError
from ctrlgen.models import load_causal_lm, resolve_model_dir, tiny_llama


def test_tiny_llama_is_a_llama_and_is_seeded():
    m1, tok = tiny_llama(seed=3)
    m2, _ = tiny_llama(seed=3)
    m3, _ = tiny_llama(seed=4)
    assert type(m1).__name__ == "LlamaForCausalLM"
    ids = tok("The patient was seen by Dr. Smith.", return_tensors="pt")
    with torch.no_grad():
        a, b, c = (m(**ids).logits for m in (m1, m2, m3))
    assert a.shape == (1, ids["input_ids"].shape[1], len(tok))  # [batch, seq, vocab]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_tiny_tokenizer_is_byte_level_like_smollm2():
    _, tok = tiny_llama()
    # Leading-space variants are different tokens, as with SmolLM2's byte-level BPE.
    assert tok("Smith").input_ids != tok(" Smith").input_ids
    # Any bytes tokenize and decode back.
    text = "Zoë 36244/06 — ß"
    assert tok.decode(tok(text).input_ids) == text


def test_tiny_llama_generates_with_left_padding():
    model, tok = load_causal_lm("tiny-llama")
    tok.padding_side = "left"
    batch = tok(["PERSON: Ann", "a much longer prompt than the first one"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (2, batch["input_ids"].shape[1] + 5)


def test_local_checkpoint_directory_loads(tmp_path):
    model, tok = tiny_llama(seed=1)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    loaded, tok2 = load_causal_lm(ModelConfig(name=str(tmp_path / "ckpt")))
    ids = tok("hello there", return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(model(**ids).logits, loaded(**ids).logits)


def test_unknown_hub_id_is_not_downloaded_and_says_why():
    with pytest.raises(ModelError, match="never downloads"):
        load_causal_lm("no-such-org/no-such-model-xyz")


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model_dir(str(tmp_path))
