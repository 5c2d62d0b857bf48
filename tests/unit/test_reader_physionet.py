from collections import Counter

import pytest

from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.corpora.physionet import format_record
from ctrlgen.errors import CorpusError
from ctrlgen.schema import Document


def _cfg(path, **kw):
    return PhysionetCorpusConfig(path=str(path), **kw)


def test_reads_all_notes_and_gold_spans(shared):
    docs, bad, report = load_corpus(_cfg(shared / "physionet-deid", identifiers="direct+quasi"))
    assert (len(docs), len(bad)) == (1818, 0)
    assert sum(len(d.entities) for d in docs) == 1382
    for d in docs:
        for e in d.entities:
            assert d.text[e.start : e.end] == e.text
    labels = Counter(e.label for d in docs for e in d.entities)
    assert labels["HCPName"] == 423 and labels["Date"] == 379 and labels["Location"] == 288
    assert report.rows_in == 1818


def test_default_keeps_only_direct_identifiers(shared):
    docs, _, report = load_corpus(_cfg(shared / "physionet-deid"))
    assert set(report.entities_by_kind) == {"DIRECT"}
    assert set(report.entities_by_category) == {"PERSON", "CODE"}
    assert report.entities == 625 + 50


def test_phi_types_map_onto_categories(shared):
    docs, _, _ = load_corpus(_cfg(shared / "physionet-deid", identifiers="direct+quasi", limit=200))
    pairs = {(e.label, e.category) for d in docs for e in d.entities}
    assert ("HCPName", "PERSON") in pairs and ("Location", "LOC") in pairs and ("Date", "DATETIME") in pairs


def _write(tmp_path, notes, phi):
    (tmp_path / "id.text").write_bytes(notes)
    (tmp_path / "id-phi.phrase").write_bytes(phi)
    return tmp_path


def test_bad_rows_are_quarantined_with_reasons_and_counted(tmp_path):
    notes = b"".join(
        format_record("1", str(i), t)
        for i, t in enumerate(
            [b"Mr Smith went home.\n", b"Bad byte \xff here.\n", b"   \n", b"Dr Jones.\n", b"Ok note.\n"], 1
        )
    )
    phi = (
        b"1 1 3 8 HCPName Smith\n"
        b"1 4 3 8 HCPName Smith\n"  # text does not match
        b"1 5 3 80 HCPName note.\n"  # outside the text
        b"1 1 x 8 HCPName Smith\n"  # malformed
        b"9 9 0 1 PTName A\n"  # refers to a missing note
        b"1 1 3 8 Zelda Quixote\n"  # a name where the PHI type belongs
    )
    docs, bad, report = load_corpus(_cfg(_write(tmp_path, notes, phi)))
    assert [d.doc_id for d in docs] == ["1-1"]
    reasons = sorted(q.reason for q in bad)
    assert any("not valid UTF-8" in r for r in reasons)
    assert any("empty document" in r for r in reasons)
    assert any("does not match" in r for r in reasons)
    assert any("outside the text" in r for r in reasons)
    assert any("not non-negative integers" in r for r in reasons)
    assert any("not in the notes file" in r for r in reasons)
    assert any("unknown PHI type" in r for r in reasons)
    assert report.documents == 1 and report.quarantined == 7
    # Private text never appears in a reason.
    assert not any("Smith" in r or "Jones" in r or "Zelda" in r for r in reasons)


def test_errors_raise_mode_names_file_and_row(tmp_path):
    path = _write(tmp_path, format_record("1", "1", b"Dr Jones.\n"), b"1 1 3 8 HCPName Smith\n")
    with pytest.raises(CorpusError, match=r"id.text, record 1 \(note 1-1\): entity 0 span"):
        load_corpus(_cfg(path, errors="raise"))


def test_missing_directory_or_file_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(_cfg(tmp_path / "nope"))
    (tmp_path / "id.text").write_text("")
    with pytest.raises(CorpusError, match="id-phi.phrase does not exist"):
        load_corpus(_cfg(tmp_path))


def test_file_without_records_is_an_error(tmp_path):
    path = _write(tmp_path, b"just some text\n", b"")
    with pytest.raises(CorpusError, match="no START_OF_RECORD"):
        load_corpus(_cfg(path))


def test_limit_stops_early(shared):
    docs, _, _ = load_corpus(_cfg(shared / "physionet-deid", limit=10))
    assert len(docs) == 10 and all(isinstance(d, Document) for d in docs)
