"""PIPP / ELP on hand-made cases (METHOD.md section 6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlgen.metrics.leakage import (
    ValueIndex,
    elp_finetune,
    elp_icl,
    leaked_values,
    normalize_value,
    pipp_finetune,
    pipp_icl,
)


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


# --- ValueIndex: hashed keys, the same matches as the per-value regex ---

_ALPHABET = "ab Z.$-_,1é\n\tß"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=_ALPHABET, max_size=40),
    values=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=6), max_size=8),
)
def test_value_index_finds_what_the_regex_finds(text, values):
    assert ValueIndex(values).find(text) == leaked_values(text, values)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["John", "Smith", "smith,", "J.", "10/20/2101", "Oct", "20,", "2101", "555-1234",
                                    "5551234", " ", "\n", "x", "Dr.", "-", "_", "é"]), max_size=30),
    values=st.lists(st.tuples(st.sampled_from(["John Smith", "Smith", "2101-10-20", "10/20", "555-1234", "Dr. J",
                                                "é", "x_"]),
                              st.sampled_from([None, "PERSON", "DATETIME", "CODE", "LOC"])), max_size=6),
)  # fmt: skip
def test_value_index_finds_the_variants_the_regex_finds(parts, values):
    """Typed values (their name, date and number variants) in texts made of their pieces: the hashed index and
    the per-variant regex find the same values, and each span is the variant at its offsets."""
    text = " ".join(parts)
    index = ValueIndex(values)
    assert index.find(text) == leaked_values(text, values)
    norm = normalize_value(text)
    for start, end, variant, stands_for in index.spans(text):
        assert norm[start:end] == variant and stands_for


def test_value_index_from_its_arrays_finds_the_same():
    index = ValueIndex([("John Smith", "PERSON"), ("2101-10-20", "DATETIME"), "Ann", ("555-1234", "CODE")])
    again = ValueIndex.from_arrays(index.to_arrays(), list(index))
    text = "Smith, John and ANN called 555 1234 on Oct 20, 2101"
    assert again.find(text) == index.find(text) == {"john smith", "ann", "555-1234", "2101-10-20"}
    assert again.spans(text) == index.spans(text) and again.nbytes == index.nbytes
    empty = ValueIndex([])
    assert ValueIndex.from_arrays(empty.to_arrays(), []).find("anything") == set()


def test_value_index_boundaries_overlaps_and_pickling():
    import pickle

    index = ValueIndex(["Smith", "John Smith", "Dr.", "$87,500", "  ", "Ann"])
    assert len(index) == 5  # blank values are not values
    assert index.find("Seen by DR. john\n smith, paid $87,500.") == {"dr.", "john smith", "smith", "$87,500"}
    assert index.find("Smithson and Joann and x$87,500") == set()  # word characters on a side: no match
    assert pickle.loads(pickle.dumps(index)).find("ann") == {"ann"}
    assert ValueIndex([]).find("anything") == set() and leaked_values("Ann", index) == {"ann"}
