import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrlgen.config import GenericCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.errors import CorpusError
from ctrlgen.io import write_records
from ctrlgen.schema import Document, Entity


def test_jsonl_bad_lines_are_quarantined_with_line_numbers(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_bytes(
        b'{"id": 1, "text": "First note."}\n'
        b"{broken\n"
        b'{"id": 3, "body": "no text field"}\n'
        b'{"id": 4, "text": "bad \xff byte"}\n'
        b"\n"
        b'{"id": 5, "text": ""}\n'
        b'{"id": 6, "text": "Last.", "site": "A"}\n'
    )
    docs, bad, report = load_corpus(GenericCorpusConfig(path=str(f), id_column="id"))
    assert [d.doc_id for d in docs] == ["1", "6"] and docs[1].metadata["site"] == "A"
    assert [q.location for q in bad] == ["line 2", "line 3", "line 4", "line 6"]
    assert report.rows_in == 6


def test_csv_and_parquet_with_named_text_column(tmp_path):
    (tmp_path / "a.csv").write_bytes(b'note,n\n"multi\nline",1\n"bad \xfe",2\n')
    pq.write_table(pa.table({"note": ["p1", "p2"]}), tmp_path / "b.parquet")
    docs, bad, _ = load_corpus(GenericCorpusConfig(path=str(tmp_path), text_column="note"))
    assert [d.text for d in docs] == ["multi\nline", "p1", "p2"]
    assert [d.doc_id for d in docs] == ["a-1", "b-1", "b-2"]
    assert len(bad) == 1 and "not valid UTF-8" in bad[0].reason and bad[0].location == "row 2"


def test_a_malformed_csv_row_is_named_by_row_and_shape_never_by_its_text(tmp_path):
    (tmp_path / "a.csv").write_bytes(b'note,n\nfine,1\n"Zelda Quixote came",2,extra\n')
    shape = r"\(ArrowInvalid: (Row #3: )?Expected 2 columns, got 3\)"
    with pytest.raises(CorpusError, match=r"a.csv is not (a readable CSV file|well-formed csv after data row 0) " + shape) as info:
        load_corpus(GenericCorpusConfig(path=str(tmp_path), text_column="note"))
    assert "Zelda" not in str(info.value)


def test_csv_error_summary_keeps_io_errors_and_drops_unknown_messages():
    from ctrlgen.corpora._common import csv_error_summary

    assert csv_error_summary(FileNotFoundError("no such file: x.csv")) == "FileNotFoundError: no such file: x.csv"
    assert csv_error_summary(pa.ArrowInvalid("CSV conversion error to int64: invalid value 'Zelda'")) == (
        "ArrowInvalid (its message is not shown: it may quote the file's content)"
    )


def test_missing_text_column_is_an_error_naming_the_file(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(CorpusError, match=r"b.parquet has no column 'text'"):
        load_corpus(GenericCorpusConfig(path=str(tmp_path / "b.parquet")))


def test_stage_output_reads_back_with_entities(tmp_path):
    doc = Document("d", "Ann Lee left.", {"corpus": "x"}, [Entity(0, 7, "Ann Lee", "PERSON", "DIRECT", "gold")])
    write_records([doc], tmp_path / "out")
    docs, bad, _ = load_corpus(
        GenericCorpusConfig(path=str(tmp_path / "out" / "documents-00000.parquet"), id_column="doc_id")
    )
    assert docs == [doc] and not bad


def test_unknown_extension_needs_file_format(tmp_path):
    (tmp_path / "c.txt").write_text(json.dumps({"text": "x"}))
    with pytest.raises(CorpusError, match="set file_format"):
        load_corpus(GenericCorpusConfig(path=str(tmp_path / "c.txt")))
    docs, _, _ = load_corpus(GenericCorpusConfig(path=str(tmp_path / "c.txt"), file_format="jsonl"))
    assert docs[0].text == "x"


def test_escaped_undecodable_bytes_are_found_by_their_character_offset():
    from ctrlgen.corpora._common import BadRow, check_no_surrogates

    check_no_surrogates("plain ascii", "TEXT")
    check_no_surrogates("Zoë, 𝔘nicode, 漢字", "TEXT")
    bad = b"ab\xffc\xfe".decode("utf-8", errors="surrogateescape")
    with pytest.raises(BadRow, match=r"^TEXT is not valid UTF-8 \(character 2\)$"):
        check_no_surrogates(bad, "TEXT")
    with pytest.raises(BadRow, match=r"character 4\)"):
        check_no_surrogates("Zoë " + "\udcff", "TEXT")
