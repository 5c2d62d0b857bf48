"""PEFT prefix tuning on a tiny random Llama: what trains, both variants, adapter round trip, generation."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from ctrlgen.config import GenerationConfig, SamplingConfig, TrainingConfig
from ctrlgen.fictional import FictionalCodes
from ctrlgen.generation import GenerationRequest, HFEngine
from ctrlgen.generation.engine import GenerationResult
from ctrlgen.generation.icl import generate_rows, row_seed
from ctrlgen.models import tiny_llama
from ctrlgen.prompts import prefix_prompt, stop_strings
from ctrlgen.training import LossWeights
from ctrlgen.training.data import collate, encode_example
from ctrlgen.training.prefix import (
    base_output_logits,
    batch_loss,
    init_prefix_from_text,
    load_prefix_model,
    loss_weights,
    prefix_model,
)

DOCS = [
    ("PERSON: Alice Jones", "Alice Jones was seen in clinic today for follow up.", [(0, 11)]),
    ("LOC: Boston", "Patient transferred from Boston with chest pain.", [(25, 31)]),
]


def _batch(tok):
    exs = [encode_example(c, t, s, tok, 64) for c, t, s in DOCS]
    return collate([e.input_ids for e in exs], [e.labels for e in exs], [e.private for e in exs], tok.pad_token_id)


def _trained(steps: int = 60):
    base, tok = tiny_llama(seed=3)
    torch.manual_seed(0)
    model = prefix_model(base, num_virtual_tokens=8)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.3)
    batch = _batch(tok)
    losses = []
    for _ in range(steps):
        terms = batch_loss(model, batch, LossWeights())
        opt.zero_grad()
        terms.total.backward()
        opt.step()
        losses.append(float(terms.total))
    model.eval()
    return model, tok, losses


@pytest.fixture(scope="module")
def trained():
    return _trained()


def test_only_the_prefix_trains():
    base, tok = tiny_llama()
    model = prefix_model(base, num_virtual_tokens=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("prompt_encoder" in n for n in trainable)
    batch_loss(model, _batch(tok), LossWeights()).total.backward()
    for n, p in model.named_parameters():
        assert (p.grad is not None) == ("prompt_encoder" in n), n


def test_a_text_initialised_prefix_acts_as_that_text_before_the_input():
    base, tok = tiny_llama(seed=3)
    model = prefix_model(base, num_virtual_tokens=6)
    init_prefix_from_text(model, tok, "one two three four five six seven")
    init = tok("one two three four five six seven", add_special_tokens=False)["input_ids"][:6]
    x = tok("The patient was seen today", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        tuned = model(input_ids=torch.tensor([x])).logits
        with model.disable_adapter():
            plain = base(input_ids=torch.tensor([init + x])).logits[:, len(init) :]
    assert torch.allclose(tuned, plain, atol=1e-5)


def test_plain_variant_runs_no_base_forward_and_masked_runs_one():
    base, tok = tiny_llama()
    model = prefix_model(base, num_virtual_tokens=4)
    calls = []
    handle = base.model.register_forward_hook(lambda *a: calls.append(1))
    plain = batch_loss(model, _batch(tok), loss_weights(TrainingConfig(variant="plain")))
    assert len(calls) == 1 and float(plain.contrastive) == 0.0 and float(plain.kl) == 0.0
    calls.clear()
    masked = batch_loss(model, _batch(tok), loss_weights(TrainingConfig()))
    handle.remove()
    assert len(calls) == 2 and float(masked.contrastive.detach()) > 0 and float(masked.kl.detach()) > 0
    w = {"lm": 1, "contrastive": 0.5, "kl": 2}
    assert loss_weights(TrainingConfig(weights=w)) == LossWeights(1, 0.5, 2, "masked")
    assert loss_weights(TrainingConfig(variant="masked_paper", weights=w)) == LossWeights(1, 0.5, 2, "paper")


#: Canary-like notes (METHOD.md section 7's canaries): the private digits occur nowhere else in the batch.
CANARY_DOCS = [
    ("PERSON: Alice Jones", "Medical record number 482913. Alice Jones was seen in clinic today for follow up.",
     [(22, 28), (30, 41)]),
    ("LOC: Boston", "Medical record number 730561. Patient transferred from Boston with chest pain.",
     [(22, 28), (55, 61)]),
]  # fmt: skip


def _private_logprob(model, batch) -> float:
    """Sum of log P_theta over the batch's private output tokens."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    return float(logp[batch["private"][:, 1:].bool() & (target != -100)].sum())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_one_step_lowers_private_tokens_under_masked_and_raises_them_under_masked_paper(seed):
    """One AdamW step of each variant from the same prefix on the same batch. On a random model the public
    tokens' LM and KL gradients reach the private tokens through the shared prefix too (they outweighed the
    private term on 1 of 8 seeds tried); the order masked < plain < masked_paper held on all 8."""
    _, tok = tiny_llama()
    exs = [encode_example(c, t, s, tok, 64) for c, t, s in CANARY_DOCS]
    batch = collate([e.input_ids for e in exs], [e.labels for e in exs], [e.private for e in exs], tok.pad_token_id)
    assert int(batch["private"].sum()) >= 10
    change = {}
    for variant in ("plain", "masked_paper", "masked"):
        torch.manual_seed(seed)
        model = prefix_model(tiny_llama(seed=seed)[0], num_virtual_tokens=8)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
        before = _private_logprob(model, batch)
        terms = batch_loss(model, batch, loss_weights(TrainingConfig(variant=variant)))
        opt.zero_grad()
        terms.total.backward()
        opt.step()
        change[variant] = _private_logprob(model, batch) - before
    assert change["masked"] < 0 < change["masked_paper"], change
    assert change["masked"] < change["plain"] < change["masked_paper"], change


def test_the_base_forward_is_the_bare_model(trained):
    """P_base comes from the same model with the prefix disabled: exactly the base model's logits."""
    model, tok, _ = trained
    batch = _batch(tok)
    with torch.no_grad(), model.disable_adapter():
        off = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    bare = tiny_llama(seed=3)[0](input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(off, bare)


def test_base_rows_at_output_positions_are_the_bare_models(trained):
    model, tok, _ = trained
    batch = _batch(tok)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    rows = base_output_logits(model, inputs, batch["labels"])
    with torch.no_grad():
        bare = tiny_llama(seed=3)[0](**inputs).logits
    valid = batch["labels"][:, 1:] != -100
    assert torch.allclose(rows, bare[:, :-1][valid], atol=1e-5)
    # ... and the loss from them equals the loss from the full base logits.
    with torch.no_grad():
        tuned = model(**inputs).logits
    from ctrlgen.training import masked_prefix_loss

    a = masked_prefix_loss(tuned, rows, batch["labels"], batch["private"])
    b = masked_prefix_loss(tuned, bare, batch["labels"], batch["private"])
    assert torch.allclose(a.total, b.total, atol=1e-5)
    with pytest.raises(ValueError, match="output rows"):
        masked_prefix_loss(tuned, rows[1:], batch["labels"], batch["private"])


def test_training_lowers_the_masked_loss(trained):
    _, _, losses = trained
    # A random 32-wide model moves little through its prefix alone: 6.34 -> 6.00 here.
    assert losses[-1] < losses[0] - 0.2


def test_adapter_round_trip_in_peft_format(trained, tmp_path):
    model, tok, _ = trained
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    loaded = load_prefix_model(tiny_llama(seed=3)[0], str(tmp_path / "adapter"))
    batch = _batch(tok)
    with torch.no_grad():
        a = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        b = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(a, b, atol=1e-6)


def test_generation_applies_the_prefix(trained, tmp_path):
    """Same prompt, same seed: the tuned model's output differs from the base model's."""
    model, tok, _ = trained
    model.save_pretrained(tmp_path / "adapter")
    base = tiny_llama(seed=3)[0]
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.0)
    tuned = HFEngine(load_prefix_model(base, str(tmp_path / "adapter")), tok, sampling, batch_size=2)
    plain = HFEngine(base, tok, sampling, batch_size=2)
    reqs = [GenerationRequest(prefix_prompt(c), seed=5) for c, _, _ in DOCS]
    out_tuned = [r.text for r in tuned.generate(reqs)]
    out_base = [r.text for r in plain.generate(reqs)]
    assert out_tuned != out_base
    # Wrapping the base model for the prefix mode leaves the base model's own outputs unchanged.
    assert out_base == [r.text for r in HFEngine(tiny_llama(seed=3)[0], tok, sampling, 2).generate(reqs)]
    # One prompt twice in a batch (n outputs of one request): a prefix model prefills per row (PEFT puts
    # its virtual tokens into the cache itself), and each row equals its output alone.
    assert not tuned.share_prefill and plain.share_prefill
    twice = [GenerationRequest(prefix_prompt(DOCS[0][0]), seed=s) for s in (5, 6)]
    assert [r.text for r in tuned.generate(twice)] == [tuned.generate([r])[0].text for r in twice]


class _Echo:
    """An engine that writes a fixed text, to check the stage's bookkeeping."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.prompts: list[str] = []

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        return [GenerationResult(self.text, 3, "stop") for _ in requests]


def test_prefix_mode_prompts_with_the_fictional_code_and_measures_against_the_finetune_set():
    rows = [{"doc_id": "d1", "control_code": "PERSON: Alice Jones"}]
    cfg = GenerationConfig(modes=["prefix"])
    tuned, base = _Echo("Seen with Mr. Carter and Alice Jones."), _Echo("unused")
    _, tok = tiny_llama()
    table = generate_rows(rows, [], base, tok, cfg, FictionalCodes(0, ["Alice Jones"]), prefix_engine=tuned,
                          finetune_values=["Alice Jones", "Boston"])  # fmt: skip
    assert isinstance(table, pa.Table) and base.prompts == []
    (row,) = table.to_pylist()
    assert row["mode"] == "prefix" and row["context_ids"] == [] and row["context_values"] == []
    assert tuned.prompts == [prefix_prompt(row["fictional_code"])]
    assert "Alice" not in row["fictional_code"]
    assert row["leaked"] == ["alice jones"] and row["status"] == "ok"
    with pytest.raises(Exception, match="prefix-tuned model"):
        generate_rows(rows, [], base, tok, cfg, FictionalCodes(0, []))


def test_the_fast_engine_runs_the_trained_adapter_beside_the_base_model(trained, tmp_path):
    """The trained prefix as cached keys/values in the fast engine: greedy outputs equal transformers'
    generate through the PEFT model, and base-model rows in the same call equal the base model's."""
    from ctrlgen.generation.engines.fast import FastEngine
    from ctrlgen.generation.icl import PREFIX_ADAPTER

    model, tok, _ = trained
    model.save_pretrained(tmp_path / "adapter")
    base = tiny_llama(seed=3)[0]
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.0)
    tuned = load_prefix_model(base, str(tmp_path / "adapter"))
    fast = FastEngine(base, tok, sampling, slots=3)
    fast.add_adapter(PREFIX_ADAPTER, tuned)
    prompts = [prefix_prompt(c) for c, _, _ in DOCS]
    mixed = fast.generate([GenerationRequest(p, seed=5, adapter=a) for p in prompts for a in (PREFIX_ADAPTER, None)])
    ref_tuned = HFEngine(tuned, tok, sampling, batch_size=1).generate([GenerationRequest(p, seed=5) for p in prompts])
    ref_base = HFEngine(base, tok, sampling, batch_size=1).generate([GenerationRequest(p, seed=5) for p in prompts])
    assert [r.text for r in mixed[0::2]] == [r.text for r in ref_tuned]
    assert [r.text for r in mixed[1::2]] == [r.text for r in ref_base]
    # the ICL stage's prefix mode through the adapter of one engine (no separate prefix engine)
    rows = [{"doc_id": "d1", "control_code": DOCS[0][0]}]
    table = generate_rows(rows, [], fast, tok, GenerationConfig(modes=["prefix"], sampling=sampling),
                          FictionalCodes(0, []), finetune_values=["Alice Jones"])  # fmt: skip
    (row,) = table.to_pylist()
    assert row["status"] == "ok" and row["mode"] == "prefix"
    alone = HFEngine(tuned, tok, sampling, batch_size=1).generate(
        [GenerationRequest(prefix_prompt(row["fictional_code"]), seed=row_seed(0, "d1", "prefix"),
                           stop=tuple(stop_strings("prefix")))]
    )  # fmt: skip
    assert row["text"] == alone[0].text
