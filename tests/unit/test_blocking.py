"""Per-row hard token blocking: same semantics as transformers' bad_words_ids, per row."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig

from ctrlgen.generation.blocking import RowBannedTokens, banned_sequences, casing_variants
from ctrlgen.models import tiny_llama

NEG = float("-inf")


def reference_mask(input_ids: list[list[int]], banned: list[list[list[int]]], vocab: int) -> list[set[int]]:
    """The stock rule, one row and one sequence at a time."""
    out = []
    for ids, seqs in zip(input_ids, banned, strict=True):
        hit = set()
        for s in seqs:
            prefix = s[:-1]
            if len(prefix) > len(ids):
                continue
            if not prefix or ids[len(ids) - len(prefix) :] == prefix:
                hit.add(s[-1])
        out.append(hit)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda b: st.tuples(
            st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=b, max_size=b),
            st.lists(
                st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=5), max_size=12), min_size=b, max_size=b
            ),
        )
    )
)
def test_matches_reference_rule_per_row(case: tuple[list[list[int]], list[list[list[int]]]]) -> None:
    ids, banned = case
    width = max(len(r) for r in ids)
    ids = [[0] * (width - len(r)) + r for r in ids]  # left padding, as in batched generation
    proc = RowBannedTokens(banned, vocab_size=6)
    got = proc.banned_mask(torch.tensor(ids))
    want = reference_mask(ids, banned, 6)
    for b in range(len(ids)):
        assert set(got[b].nonzero().flatten().tolist()) == want[b]


def test_rows_do_not_share_bans() -> None:
    proc = RowBannedTokens([[[7]], [[1, 2]]], vocab_size=10)
    scores = proc(torch.tensor([[1, 1], [3, 1]]), torch.zeros(2, 10))
    assert scores[0, 7] == NEG and scores[1, 7] == 0
    assert scores[1, 2] == NEG and scores[0, 2] == 0


def test_out_of_vocabulary_ids_are_an_error() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        RowBannedTokens([[[3, 99]]], vocab_size=10)


def test_identical_greedy_outputs_to_transformers_bad_words_ids() -> None:
    model, tok = tiny_llama(seed=3)
    tok.padding_side = "left"
    prompts = ["The patient is a 58 year old", "Plan: continue heparin,", "PERSON: Alice Jones"]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    cfg = GenerationConfig(max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    free = model.generate(**enc, generation_config=cfg)
    # Ban n-grams the unconstrained model actually produced, so blocking has to change the output.
    new = free[:, enc["input_ids"].shape[1] :].tolist()
    banned = sorted({tuple(row[i : i + n]) for row in new for n in (1, 2, 3) for i in range(2, 20, 5)})
    banned_lists = [list(s) for s in banned]
    theirs = model.generate(**enc, generation_config=cfg, bad_words_ids=banned_lists)
    vocab = model.get_output_embeddings().weight.shape[0]
    ours = model.generate(
        **enc, generation_config=cfg, logits_processor=[RowBannedTokens([banned_lists] * len(prompts), vocab)]
    )
    assert not torch.equal(theirs, free), "the banned n-grams must change the greedy output"
    assert torch.equal(ours, theirs)


def test_casing_variants_cover_the_method() -> None:
    assert casing_variants("mcDonald smith") == [
        "mcDonald smith",
        "mcdonald smith",
        "MCDONALD SMITH",
        "Mcdonald Smith",
        "McDonald smith",
    ]


def test_banned_sequences_include_leading_space_variant() -> None:
    _, tok = tiny_llama()
    seqs = banned_sequences(tok, ["Smith"])
    assert tok.encode(" Smith", add_special_tokens=False) in seqs
    assert tok.encode("SMITH", add_special_tokens=False) in seqs
    assert banned_sequences(tok, ["Smith"], leading_space=False) == [
        s for s in seqs if not tok.decode(s).startswith(" ")
    ]
