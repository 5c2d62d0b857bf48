"""Device plumbing, exercised on the CPU through the code paths a GPU run takes (no GPU here)."""

import pytest
import torch

from ctrlgen.config import ModelConfig
from ctrlgen.generation.blocking import RowBannedTokens
from ctrlgen.generation.engine import GenerationRequest, HFEngine, RowSampler
from ctrlgen.models import load_causal_lm, resolve_device


def test_device_names():
    assert ModelConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError):
        ModelConfig(device="gpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_the_model_is_placed_where_asked():
    model, _ = load_causal_lm("tiny-llama", device=torch.device("cpu"))
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def _reference_draws(seeds, probs_rows):
    """The sampler's draws as first written: one CPU generator per row, multinomial per row."""
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    return [int(torch.multinomial(p, 1, generator=g)[0]) for p, g in zip(probs_rows, gens, strict=True)]


def test_row_sampler_generators_follow_the_logits_device_and_keep_the_draws():
    torch.manual_seed(0)
    scores = torch.randn(3, 50)
    scores[1] = float("-inf")  # a row with every token banned keeps its argmax and draws nothing
    sampler = RowSampler([11, 12, 13], temperature=1.0, top_p=1.0)
    out = sampler(torch.zeros(3, 1, dtype=torch.long), scores.clone())
    assert all(g.device == scores.device for g in sampler.generators)
    picked = out.argmax(-1).tolist()
    probs = torch.softmax(torch.sort(scores[[0, 2]], descending=True).values, -1)
    idx = torch.sort(scores[[0, 2]], descending=True).indices
    ref = _reference_draws([11, 13], probs)
    assert [picked[0], picked[2]] == [int(idx[0, ref[0]]), int(idx[1, ref[1]])]


def test_row_sampler_top_p_draws_equal_a_full_sort_and_do_not_depend_on_the_batch():
    """The top-k shortcut samples the exact nucleus: the draws of a full sort of the vocabulary (a peaked row,
    whose nucleus is among the top RowSampler.TOP_K tokens, and a flat one, whose nucleus is not), and a row
    draws the same token alone as beside a row that takes the other path."""
    torch.manual_seed(0)
    vocab = 4 * RowSampler.TOP_K
    peaked, flat = torch.randn(vocab) * 4, torch.randn(vocab) * 0.05
    seeds = [21, 22]
    rows = torch.stack([peaked, flat])
    picked = RowSampler(seeds, temperature=0.7, top_p=0.9)(torch.zeros(2, 1, dtype=torch.long), rows.clone())
    picked = picked.argmax(-1).tolist()
    srt, idx = torch.sort(rows / 0.7, descending=True)
    probs = torch.softmax(srt, -1)
    probs = probs.masked_fill((probs.cumsum(-1) - probs) >= 0.9, 0.0)
    assert int((probs[1] > 0).sum()) > RowSampler.TOP_K > int((probs[0] > 0).sum())  # both paths taken
    ref = _reference_draws(seeds, probs)
    assert picked == [int(idx[0, ref[0]]), int(idx[1, ref[1]])]
    for b, s in enumerate(seeds):  # each row alone, with its seed
        one = RowSampler([s], temperature=0.7, top_p=0.9)(torch.zeros(1, 1, dtype=torch.long), rows[b : b + 1].clone())
        assert one.argmax(-1).tolist() == [picked[b]]


def test_banned_token_tensors_live_on_the_given_device():
    proc = RowBannedTokens([[[3], [4, 5]], [[6]]], 10, torch.device("cpu"))
    assert proc.single_rows.device.type == "cpu"
    scores = proc(torch.tensor([[1, 4], [1, 2]]), torch.zeros(2, 10))
    assert torch.isinf(scores[0, 3]) and torch.isinf(scores[0, 5]) and torch.isinf(scores[1, 6])


def test_engine_sends_inputs_to_the_model_device():
    model, tok = load_causal_lm("tiny-llama", device=torch.device("cpu"))
    seen = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["input_ids"].device), with_kwargs=True)
    try:
        HFEngine(model, tok).generate([GenerationRequest("the patient", seed=1, max_new_tokens=3)])
    finally:
        hook.remove()
    assert seen and all(d == model.device for d in seen)
