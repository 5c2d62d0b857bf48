from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import read_corpus
from ctrlgen.io import read_documents, read_quarantine, write_records
from ctrlgen.schema import Document, Quarantined


def test_records_stream_to_shards_and_back(tmp_path, shared):
    cfg = PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=120)
    report = write_records(read_corpus(cfg), tmp_path, shard_size=50)
    assert sorted(p.name for p in tmp_path.glob("documents-*.parquet")) == [
        "documents-00000.parquet",
        "documents-00001.parquet",
        "documents-00002.parquet",
    ]
    docs = read_documents(tmp_path)
    assert len(docs) == report.documents == 120
    assert sum(len(d.entities) for d in docs) == report.entities
    assert read_quarantine(tmp_path) == []


def test_empty_corpus_still_writes_schema_and_quarantine(tmp_path):
    bad = Quarantined("f", "row 1", "empty document")
    report = write_records([bad], tmp_path)
    assert read_documents(tmp_path) == [] and read_quarantine(tmp_path) == [bad]
    assert (report.rows_in, report.documents, report.quarantined) == (1, 0, 1)


def test_rewriting_replaces_old_shards(tmp_path):
    write_records([Document(str(i), "x") for i in range(5)], tmp_path, shard_size=1)
    write_records([Document("a", "y")], tmp_path, shard_size=1)
    assert [d.doc_id for d in read_documents(tmp_path)] == ["a"]
