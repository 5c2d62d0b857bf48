"""Rule-based anonymisation baselines (ctrlgen.anonymize): Presidio's operators over ctrlgen's spans."""

import pytest

from ctrlgen.anonymize import anonymize
from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.fictional import FictionalCodes
from ctrlgen.metrics.leakage import leaked_values
from ctrlgen.schema import Entity

TEXT = "Alice Jones was seen on 12/03/2001 by Dr. Smith. Alice Jones is well. Call 555-1234."
ENTS = [
    Entity(0, 11, "Alice Jones", "PERSON", "DIRECT", "gold", "Name"),
    Entity(24, 34, "12/03/2001", "DATETIME", "QUASI", "gold", "Date"),
    Entity(42, 47, "Smith", "PERSON", "DIRECT", "gold", "Name"),
    Entity(49, 60, "Alice Jones", "PERSON", "DIRECT", "gold", "Name"),
    Entity(75, 83, "555-1234", "CODE", "DIRECT", "gold", "Phone"),
    Entity(0, 5, "Alice", "PERSON", "DIRECT", "gold", "Name"),  # overlaps the first span: merged
]


def test_redact_tags_every_span_and_merges_overlaps() -> None:
    out = anonymize(TEXT, ENTS, "redact")
    assert out.text == "<PERSON> was seen on <DATETIME> by Dr. <PERSON>. <PERSON> is well. Call <CODE>."
    assert out.replaced == 5


def test_surrogates_are_fictional_consistent_and_seeded() -> None:
    gen = FictionalCodes(seed=1, exclude=["alice jones", "smith", "12/03/2001", "555-1234"])
    out = anonymize(TEXT, ENTS, "surrogate", gen, "d1")
    for real in ("Alice", "Jones", "Smith", "12/03/2001", "555-1234"):
        assert real not in out.text
    first, rest = out.text.split(" was seen on ", 1)
    assert rest.count(first) == 1  # the same person gets the same surrogate twice
    assert out.text.endswith(".") and "Dr. " in out.text and "<" not in out.text
    assert anonymize(TEXT, ENTS, "surrogate", FictionalCodes(seed=1), "d1") == anonymize(
        TEXT, ENTS, "surrogate", FictionalCodes(seed=1), "d1"
    )
    assert anonymize(TEXT, ENTS, "surrogate", FictionalCodes(seed=2), "d1").text != out.text


def test_bad_input_is_named_without_the_value() -> None:
    assert anonymize("no identifiers here", [], "redact").text == "no identifiers here"
    with pytest.raises(ValueError, match=r"span \[3, 99\) outside a text of 5 characters") as err:
        anonymize("short", [Entity(3, 99, "SECRETVALUE", "PERSON", "DIRECT", "gold", "Name")], "redact", doc_id="x")
    assert "SECRETVALUE" not in str(err.value)
    with pytest.raises(ValueError, match="unknown anonymisation method"):
        anonymize(TEXT, ENTS, "shuffle")  # type: ignore[arg-type]


def test_gold_spans_of_real_notes_leave_no_gold_value(shared) -> None:
    docs, _, _ = load_corpus(PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi",
                                                   limit=40))  # fmt: skip
    gen = FictionalCodes(seed=0, exclude={e.text for d in docs for e in d.entities})
    for d in docs:
        values = sorted({e.text for e in d.entities if len(e.text) >= 4})
        for method in ("redact", "surrogate"):
            out = anonymize(d.text, d.entities, method, gen, d.doc_id)
            assert not leaked_values(out.text, values), (d.doc_id, method)
