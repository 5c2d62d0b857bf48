"""PIPP / ELP on hand-made cases (METHOD.md section 6)."""

from __future__ import annotations

import pytest

from ctrlgen.metrics.leakage import elp_finetune, elp_icl, leaked_values, pipp_finetune, pipp_icl


@pytest.mark.parametrize(
    ("text", "values", "found"),
    [
        ("Seen by Dr. SMITH today.", ["Smith"], {"smith"}),
        ("Smithson came.", ["Smith"], set()),
        ("Pay $87,500 now", ["$87,500"], {"$87,500"}),
        ("John   Smith\nleft", ["John Smith", "Smith"], {"john smith", "smith"}),
        ("call 555-1234.", ["555-1234", "1234"], {"555-1234", "1234"}),
        ("nothing here", [], set()),
        ("Dr. Lee", ["Dr."], {"dr."}),
    ],
)
def test_case_insensitive_word_boundary_matching(text: str, values: list[str], found: set[str]) -> None:
    assert leaked_values(text, values) == found


def test_icl_pipp_and_elp() -> None:
    outputs = ["Alice met Bob", "nobody", "ALICE"]
    contexts = [["Alice", "Bob", "Carol", "Dave"], ["Alice"], ["Alice", "alice", "Eve"]]
    assert pipp_icl(outputs, contexts) == pytest.approx(2 / 3)
    # 2/4, 0/1, 1/2 (alice counted once)
    assert elp_icl(outputs, contexts) == pytest.approx((0.5 + 0 + 0.5) / 3)


def test_context_without_values_counts_zero() -> None:
    assert elp_icl(["x"], [[]]) == 0.0
    assert pipp_icl([], []) == 0.0


def test_finetune_definitions_use_the_whole_set() -> None:
    outputs = ["Alice here", "Alice and Bob", "none"]
    values = ["Alice", "Bob", "Carol", "Dave"]
    assert pipp_finetune(outputs, values) == pytest.approx(2 / 3)
    assert elp_finetune(outputs, values) == pytest.approx(2 / 4)


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError):
        pipp_icl(["a"], [])
