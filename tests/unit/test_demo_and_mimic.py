import re

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ctrlgen.config import DemoCorpusConfig, MimicCorpusConfig
from ctrlgen.corpora import load_corpus, read_corpus
from ctrlgen.demo import NOTE_COLUMNS, NOTE_SCHEMA, generate_batch, write_demo_corpus
from ctrlgen.errors import CorpusError
from ctrlgen.schema import CATEGORIES


def _demo(tmp_path, name, **kw):
    return write_demo_corpus(DemoCorpusConfig(output_dir=str(tmp_path / name), **kw), progress=False)


def test_same_seed_same_notes_whatever_the_shard_and_batch_size(tmp_path):
    a = _demo(tmp_path, "a", n_notes=700, seed=7, shard_size=250, batch_size=100)
    b = _demo(tmp_path, "b", n_notes=700, seed=7, shard_size=1000, batch_size=333)
    c = _demo(tmp_path, "c", n_notes=700, seed=8)
    ta, tb, tc = (pq.read_table(sorted(p.glob("*.parquet"))).to_pydict() for p in (a, b, c))
    assert len(list(a.glob("*.parquet"))) == 3 and len(list(b.glob("*.parquet"))) == 1
    assert ta == tb
    assert ta["TEXT"] != tc["TEXT"]


def test_a_slice_can_be_generated_on_its_own():
    whole = generate_batch(seed=1, start_row=0, n=50)
    part = generate_batch(seed=1, start_row=20, n=10)
    assert part["TEXT"] == whole["TEXT"][20:30] and part["ROW_ID"] == list(range(21, 31))


def test_demo_notes_read_back_with_placeholder_entities(tmp_path):
    out = _demo(tmp_path, "d", n_notes=3000, seed=0, shard_size=1000)
    docs, bad, report = load_corpus(MimicCorpusConfig(path=str(out), identifiers="direct+quasi"))
    assert report.rows_in == 3000 and len(docs) + len(bad) == 3000
    assert all("ISERROR=1" in q.reason for q in bad)  # the generator marks a few notes erroneous
    cats = set(report.entities_by_category)
    assert {"PERSON", "CODE", "LOC", "ORG", "DATETIME"} <= cats and cats <= set(CATEGORIES)
    for d in docs[:200]:
        assert d.entities, d.doc_id
        for e in d.entities:
            assert d.text[e.start : e.end] == e.text and e.text.startswith("[**")


def test_existing_complete_corpus_is_reused(tmp_path):
    out = _demo(tmp_path, "r", n_notes=10)
    stamp = (out / "noteevents-00000.parquet").stat().st_mtime_ns
    assert _demo(tmp_path, "r", n_notes=10) == out
    assert (out / "noteevents-00000.parquet").stat().st_mtime_ns == stamp


def test_csv_output_reads_like_noteevents_csv(tmp_path):
    out = _demo(tmp_path, "csv", n_notes=300, file_format="csv")
    parquet_out = _demo(tmp_path, "pq", n_notes=300)
    from_csv, _, r1 = load_corpus(MimicCorpusConfig(path=str(out / "NOTEEVENTS.csv")))
    from_pq, _, r2 = load_corpus(MimicCorpusConfig(path=str(parquet_out)))
    assert [d.text for d in from_csv] == [d.text for d in from_pq]
    assert [d.doc_id for d in from_csv] == [d.doc_id for d in from_pq]
    assert r1.rows_in == r2.rows_in == 300


def _csv(tmp_path, rows, columns=NOTE_COLUMNS):
    path = tmp_path / "NOTEEVENTS.csv"
    lines = [",".join(columns)]
    lines += rows
    path.write_bytes("\n".join(lines).encode() if isinstance(rows[0], str) else b"\n".join([lines[0].encode(), *rows]))
    return path


def test_bad_rows_are_quarantined_and_counted(tmp_path):
    rows = [
        b'1,10,100,2101-01-01,,,Nursing,Report,,,"Pt [**Known lastname 5**] ok."',
        b'2,10,100,2101-01-01,,,Nursing,Report,,,"bad \xff bytes"',
        b'3,10,100,2101-01-01,,,Nursing,Report,,1,"marked as error"',
        b'4,10,100,2101-01-01,,,Radiology,Report,,,""',
        b'5,11,101,2101-01-02,,,Radiology,Report,,,"multi\nline [**2101-1-2**]"',
    ]
    path = _csv(tmp_path, rows)
    docs, bad, report = load_corpus(MimicCorpusConfig(path=str(path)))
    assert [d.doc_id for d in docs] == ["1", "5"]
    assert [e.category for e in docs[0].entities] == ["PERSON"]
    reasons = {q.location.split("(")[1].rstrip(")"): q.reason for q in bad}
    assert "not valid UTF-8" in reasons["ROW_ID 2"]
    assert "ISERROR=1" in reasons["ROW_ID 3"]
    assert "empty document" in reasons["ROW_ID 4"]
    assert report.rows_in == 5 and report.documents == 2
    # With the default DIRECT-only choice the date placeholder is not private.
    assert docs[1].entities == []


def test_category_filter_counts_what_it_sets_aside(tmp_path):
    rows = [b'1,10,100,,,,Nursing,R,,,"a"', b'2,10,100,,,,Radiology,R,,,"b"']
    docs, bad, report = load_corpus(MimicCorpusConfig(path=str(_csv(tmp_path, rows)), categories=["Radiology"]))
    assert [d.doc_id for d in docs] == ["2"] and report.quarantined == 1


def test_a_malformed_csv_row_is_named_by_row_and_shape_never_by_its_text(tmp_path):
    """Arrow's parse error quotes the offending row (note text): the error keeps its row and shape only."""
    path = _csv(tmp_path, [b'1,10,100,,,,Nursing,R,,,"ok"', b'2,10,100,,,,Nursing,R,"Zelda Quixote seen"'])
    with pytest.raises(CorpusError) as info:
        list(read_corpus(MimicCorpusConfig(path=str(path))))
    msg = str(info.value)
    assert re.search(r"NOTEEVENTS.csv is not a (readable CSV file|well-formed CSV after data row 0) \(ArrowInvalid: ", msg)
    assert f"Expected {len(NOTE_COLUMNS)} columns, got 9" in msg
    assert "Zelda" not in msg and "Quixote" not in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_missing_columns_name_file_and_columns(tmp_path):
    path = _csv(tmp_path, [b"1,x"], columns=("ROW_ID", "NOTE"))
    with pytest.raises(
        CorpusError,
        match=r"NOTEEVENTS.csv is not in the NOTEEVENTS schema: missing column\(s\) \['SUBJECT_ID', 'CATEGORY', 'TEXT'\]",
    ):
        list(read_corpus(MimicCorpusConfig(path=str(path))))
    pq.write_table(pa.table({"ROW_ID": [1]}), tmp_path / "x.parquet")
    with pytest.raises(CorpusError, match="x.parquet is not in the NOTEEVENTS schema"):
        list(read_corpus(MimicCorpusConfig(path=str(tmp_path / "x.parquet"))))


def test_missing_path_and_gzip(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        list(read_corpus(MimicCorpusConfig(path=str(tmp_path / "none.csv"))))
    table = pa.Table.from_pydict(generate_batch(0, 0, 20), schema=NOTE_SCHEMA)
    with pa.CompressedOutputStream(str(tmp_path / "NOTEEVENTS.csv.gz"), "gzip") as fh:
        pacsv.write_csv(table, fh)
    docs, bad, _ = load_corpus(MimicCorpusConfig(path=str(tmp_path / "NOTEEVENTS.csv.gz")))
    assert len(docs) + len(bad) == 20
