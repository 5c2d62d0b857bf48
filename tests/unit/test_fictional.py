"""Fictional control codes: shape kept, seeded, never a real value."""

from __future__ import annotations

import re

import pytest

from ctrlgen.errors import CtrlgenError
from ctrlgen.fictional import FictionalCodes, placeholder_kind
from ctrlgen.schema import CATEGORIES

REAL = {
    "PERSON": ["Alice Jones", "Smith", "Dr. Ann Lee"],
    "CODE": ["36244/06", "MRN 1234"],
    "LOC": ["Boston"],
    "ORG": ["Hospital1 18"],
    "DEM": ["58 year old"],
    "DATETIME": ["31 August 2006", "2101-10-20"],
    "QUANTITY": ["45%"],
    "MISC": ["the Sunrise Act"],
}


def test_every_category_keeps_its_value_count() -> None:
    fake = FictionalCodes(seed=1).fictionalize(REAL, "d1")
    assert list(fake) == list(REAL)
    assert {c: len(v) for c, v in fake.items()} == {c: len(v) for c, v in REAL.items()}
    assert set(fake) <= set(CATEGORIES)


def test_same_seed_and_document_give_the_same_code() -> None:
    a = FictionalCodes(seed=5).fictionalize(REAL, "d1")
    b = FictionalCodes(seed=5).fictionalize(REAL, "d1")
    c = FictionalCodes(seed=6).fictionalize(REAL, "d1")
    d = FictionalCodes(seed=5).fictionalize(REAL, "d2")
    assert a == b and a != c and a != d


def test_code_does_not_depend_on_other_documents() -> None:
    gen = FictionalCodes(seed=2)
    first = gen.fictionalize(REAL, "d7")
    gen.fictionalize({"PERSON": ["X Y"]}, "other")
    assert gen.fictionalize(REAL, "d7") == first


def test_never_emits_a_real_value_of_the_corpus() -> None:
    # Exclude everything the generator produced for many documents, then draw again.
    probe = FictionalCodes(seed=0)
    produced = {v for i in range(200) for vs in probe.fictionalize(REAL, f"d{i}").values() for v in vs}
    gen = FictionalCodes(seed=0, exclude={v.upper() for v in produced})
    for i in range(200):
        for vs in gen.fictionalize(REAL, f"d{i}").values():
            assert not {v.casefold() for v in vs} & {p.casefold() for p in produced}


def test_gives_up_with_a_clear_error_rather_than_a_real_value() -> None:
    gen = FictionalCodes(seed=0, exclude={f"{n}%" for n in range(100)} | {f"${n * 500:,}" for n in range(201)})
    with pytest.raises(CtrlgenError, match="QUANTITY"):
        gen.fictionalize({"QUANTITY": ["45%"]}, "d1")


def test_paper_patterns() -> None:
    fake = FictionalCodes(seed=3).fictionalize(REAL, "d1")
    assert re.fullmatch(r"\d{5}/\d{2}", fake["CODE"][0])
    assert re.fullmatch(r"[A-Z]{3} \d{4}", fake["CODE"][1])
    assert re.fullmatch(r"\d{2} [A-Z][a-z]+ (199\d|20[01]\d|202[0-4])", fake["DATETIME"][0])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", fake["DATETIME"][1])  # placeholder date keeps its format
    assert re.fullmatch(r"\d+%|\$[\d,]+", fake["QUANTITY"][0])
    assert len(fake["PERSON"][0].split()) == 2 and len(fake["PERSON"][1].split()) == 1
    assert fake["PERSON"][2].split()[0] in {"Mr.", "Mrs.", "Ms.", "Dr.", "Prof."}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("Hospital1 18", "Hospital1"),
        ("First Name (NamePattern1) 1234", "First Name (NamePattern1)"),
        ("2101-10-20", "Date"),
        ("Telephone/Fax (1) 5551", "Telephone/Fax (1)"),
        ("36244/06", None),
        ("MRN 1234", None),
        ("Alice Jones", None),
    ],
)
def test_placeholder_values_are_recognised(value: str, kind: str | None) -> None:
    assert placeholder_kind(value) == kind


def test_placeholder_types_get_values_of_their_type() -> None:
    fake = FictionalCodes(seed=4).fictionalize(
        {"PERSON": ["First Name (NamePattern1) 1234"], "CODE": ["Telephone/Fax (1) 5551", "Medical Record Number 77"]},
        "d1",
    )
    assert len(fake["PERSON"][0].split()) == 1 and fake["PERSON"][0].isalpha()
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", fake["CODE"][0])
    assert re.fullmatch(r"\d{7}", fake["CODE"][1])


def test_one_value_per_category_when_counts_are_not_kept() -> None:
    fake = FictionalCodes(seed=1, same_counts=False).fictionalize(REAL, "d1")
    assert all(len(v) == 1 for v in fake.values())
