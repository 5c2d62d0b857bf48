"""The Ray Data extraction job on a real local Ray cluster started by the test."""

import json

import pyarrow.dataset as pads
import pytest

from ctrlgen.codes import build_control_code, format_control_code
from ctrlgen.config import load_config
from ctrlgen.errors import CtrlgenError
from ctrlgen.schema import table_to_documents

pytestmark = pytest.mark.integration


def _ok_documents(out):
    return table_to_documents(pads.dataset(str(out / "status=ok"), format="parquet").to_table())


def test_known_setting_on_the_generated_corpus(ray_cluster, tmp_path):
    from ray_jobs.extract import run

    cfg = load_config(
        "configs/extract_demo.yaml",
        [
            f"output_dir={tmp_path}",
            "demo_corpus.n_notes=3000",
            f"demo_corpus.output_dir={tmp_path / 'notes'}",
            "demo_corpus.shard_size=1000",
        ],
    )
    summary = run(cfg)
    assert summary.rows_in == 3000 == summary.documents + summary.quarantined
    assert 0 < summary.quarantined < 30  # the generator's ISERROR=1 notes
    out = tmp_path / "extracted"
    docs = _ok_documents(out)
    assert len(docs) == summary.documents
    assert sum(len(d.entities) for d in docs) == sum(summary.entities_by_category.values())
    table = pads.dataset(str(out / "status=ok"), format="parquet").to_table(columns=["doc_id", "control_code"])
    codes = dict(zip(table.column("doc_id").to_pylist(), table.column("control_code").to_pylist(), strict=True))
    for d in docs[:100]:
        assert all(d.text[e.start : e.end] == e.text for e in d.entities)
        assert codes[d.doc_id] == format_control_code(build_control_code(d.entities))
    bad = pads.dataset(str(out / "status=quarantined"), format="parquet").to_table().to_pylist()
    assert all("ISERROR=1" in r["reason"] and r["text"] == "" for r in bad)


def test_unknown_setting_on_the_shared_clinical_notes(ray_cluster, tmp_path, shared, capsys):
    from ctrlgen.cli import main

    rc = main(
        [
            "extract",
            "-c",
            "configs/extract_physionet.yaml",
            f"corpus.path={shared / 'physionet-deid'}",
            "corpus.limit=80",
            f"output_dir={tmp_path}",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "rows in 80 = documents out 80 + quarantined 0" in out
    assert "models (the driver's, loaded by every actor): extraction.ner_model sha256 " in out
    assert "extraction.ner_veto sha256 " in out
    docs = _ok_documents(tmp_path / "extracted")
    assert sorted(d.doc_id for d in docs)[:2] == ["1-1", "1-10"]
    assert any(e.source == "presidio" for d in docs for e in d.entities)
    for d in docs:
        assert all(d.text[e.start : e.end] == e.text for e in d.entities)
        assert json.loads(json.dumps(d.metadata))["corpus"] == "physionet-deid"


def test_an_actor_whose_node_holds_other_models_loads_the_drivers(ray_cluster, tmp_path, shared):
    """A node whose `make setup` trained other weights (another CPU) or none: that node's actors load the driver's
    NER and veto tagger, shipped through the object store, and find what the driver's node finds."""
    import shutil

    import pyarrow as pa

    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.ner import model_digest
    from ctrlgen.schema import DOCUMENT_SCHEMA
    from ray_jobs.extract import ExtractActor, ship_models
    from ray_jobs.submit import absolute_paths

    cfg = absolute_paths(load_config("configs/extract_physionet.yaml", [f"corpus.path={shared / 'physionet-deid'}"]))[0]
    models = ship_models(cfg)
    assert set(models) == {"ner_model", "ner_veto"}, "make setup trains both of the default engine's models"
    other = tmp_path / "node" / "ner"  # the NER another CPU trained: one byte of its weights differs
    shutil.copytree(cfg.extraction.ner_model, other)
    weights = other / "ner" / "model"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    node = cfg.model_copy(update={"extraction": cfg.extraction.model_copy(
        update={"ner_model": str(other), "ner_veto": str(tmp_path / "node" / "never-trained")})})  # fmt: skip
    docs = load_corpus(cfg.corpus)[0][:24]
    table = pa.Table.from_pylist([d.to_row() for d in docs], schema=DOCUMENT_SCHEMA)
    cache = tmp_path / "node-cache"
    actor = ray_cluster.remote(ExtractActor).options(num_cpus=1, runtime_env={"env_vars": {"CTRLGEN_CACHE": str(cache)}})
    drivers, nodes = (actor.remote(c.model_dump_json(), "documents", models) for c in (cfg, node))
    want, got = ray_cluster.get([drivers.__call__.remote(table), nodes.__call__.remote(table)])
    assert got.column("entities").to_pylist() == want.column("entities").to_pylist()
    assert sum(len(e) for e in want.column("entities").to_pylist()) > 0
    copies = sorted((cache / "extraction-models").iterdir())
    assert sorted(model_digest(c) for c in copies) == sorted(d for d, _ in models.values())
    assert not (tmp_path / "node" / "never-trained").exists()  # the node's own paths are left as they were
    for a in (drivers, nodes):
        ray_cluster.kill(a)


def test_bad_csv_rows_are_quarantined_by_the_job(ray_cluster, tmp_path):
    from ctrlgen.demo import NOTE_COLUMNS
    from ray_jobs.extract import run

    (tmp_path / "in").mkdir()
    rows = [
        b'1,10,100,,,,Nursing,R,,,"Pt [**Known lastname 5**] ok."',
        b'2,10,100,,,,Nursing,R,,,"bad \xff"',
        b'3,10,100,,,,Nursing,R,,,""',
        b'4,11,100,,,,Nursing,R,,1,"error note"',
    ]
    (tmp_path / "in" / "NOTEEVENTS.csv").write_bytes(b"\n".join([",".join(NOTE_COLUMNS).encode(), *rows]) + b"\n")
    cfg = load_config(
        None,
        ["corpus.format=mimic", f"corpus.path={tmp_path / 'in'}", f"output_dir={tmp_path}", "extraction.num_actors=1"],
    )
    summary = run(cfg)
    assert (summary.rows_in, summary.documents, summary.quarantined) == (4, 1, 3)


def test_a_malformed_csv_fails_the_job_naming_file_and_shape_not_the_rows_text(ray_cluster, tmp_path, capfd):
    """Arrow's CSV error quotes the offending row; the job's error (and what Ray prints) keeps its shape only.
    The driver reads the header alone: the read fails inside a Ray task."""
    from ctrlgen.demo import NOTE_COLUMNS
    from ray_jobs.extract import run

    (tmp_path / "in").mkdir()
    rows = [b'%d,10,100,,,,Nursing,R,,,"note %d"' % (i, i) for i in range(1, 50)]
    rows.append(b'50,10,100,,,,Nursing,"Zelda Quixote was seen"')
    (tmp_path / "in" / "NOTEEVENTS.csv").write_bytes(b"\n".join([",".join(NOTE_COLUMNS).encode(), *rows]) + b"\n")
    cfg = load_config(
        None,
        ["corpus.format=mimic", f"corpus.path={tmp_path / 'in'}", f"output_dir={tmp_path}", "extraction.num_actors=1"],
    )
    with pytest.raises(CtrlgenError, match=r"NOTEEVENTS.csv is not a (readable CSV file|well-formed CSV after data row \d+) "
                       rf"\(ArrowInvalid: (Row #\d+: )?Expected {len(NOTE_COLUMNS)} columns, got 8\)") as info:  # fmt: skip
        run(cfg)
    seen = str(info.value) + "".join(capfd.readouterr())
    assert "Zelda" not in seen and "Quixote" not in seen


def test_unreadable_parquet_shard_is_named_before_any_work(ray_cluster, tmp_path):
    from ctrlgen.config import DemoCorpusConfig
    from ctrlgen.demo import write_demo_corpus
    from ray_jobs.extract import run

    notes = write_demo_corpus(DemoCorpusConfig(n_notes=20, output_dir=str(tmp_path / "in")), progress=False)
    (notes / "noteevents-99999.parquet").write_bytes(b"not parquet at all")
    cfg = load_config(None, ["corpus.format=mimic", f"corpus.path={notes}", f"output_dir={tmp_path}"])
    with pytest.raises(CtrlgenError, match="noteevents-99999.parquet: not a readable Parquet file"):
        run(cfg)
    assert not (tmp_path / "extracted").exists()


def test_main_job_runs_end_to_end_on_the_embedded_default(ray_cluster, tmp_path, capsys):
    from ctrlgen.cli import main

    rc = main(
        [
            "demo",
            "-c",
            "configs/demo.yaml",
            "demo_corpus.n_notes=500",
            # 2 of the default's 8 notes to synthesize (one per generation actor): `make demo` runs all 8
            "generation.num_documents=2",
            f"demo_corpus.output_dir={tmp_path / 'n'}",
            f"output_dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "rows in 500 = documents out" in out and "--- control code of document" in out
    assert "PERSON: " in out
    # the generation and service stages ran too (2 notes x ICL, ICL + blocking), then the demo's end
    assert "targets 2 x modes -> rows 4" in out and "== 5/5 the synthesis service" in out and "done; outputs in" in out


def test_status_sink_writes_every_row_once_by_status(tmp_path):
    """The job's writer on its own (no cluster): ok rows stay zero-copy slices around the
    quarantined ones, each status in its own hive directory, and an unknown status is an
    error rather than a row dropped."""
    from types import SimpleNamespace

    import pyarrow as pa

    from ctrlgen.config import MimicCorpusConfig
    from ctrlgen.extract import KnownExtractor
    from ctrlgen.extract.stage import extract_rows
    from ray_jobs.extract import StatusParquetSink

    texts = ["Pt [**Known lastname 5**] seen.", "", "ok note", None, "x [**2101-1-2**]", "", "last"]
    rows = [{"ROW_ID": i, "SUBJECT_ID": 1, "CATEGORY": "Nursing", "TEXT": t} for i, t in enumerate(texts)]
    corpus = MimicCorpusConfig(path="x", identifiers="direct+quasi")
    blocks = [
        extract_rows(rows[:4], KnownExtractor(), corpus, "noteevents"),
        extract_rows(rows[4:], KnownExtractor(), corpus, "noteevents"),
    ]
    sink = StatusParquetSink(tmp_path, rows_per_file=100)
    sink.write(blocks, SimpleNamespace(task_idx=3))
    ok = pads.dataset(str(tmp_path / "status=ok"), format="parquet").to_table()
    bad = pads.dataset(str(tmp_path / "status=quarantined"), format="parquet").to_table()
    assert ok.column("doc_id").to_pylist() == ["0", "2", "4", "6"]
    assert bad.num_rows == 3 and set(bad.column("text").to_pylist()) == {""}
    assert "status" not in ok.schema.names and "status" not in bad.schema.names
    assert [p.name.endswith("_000003.parquet") for p in (tmp_path / "status=ok").iterdir()] == [True]

    odd = blocks[0].set_column(5, "status", pa.array(["ok", "lost", None, "ok"]))
    with pytest.raises(CtrlgenError, match="2 extracted rows with a status other than"):
        StatusParquetSink(tmp_path / "odd", rows_per_file=100).write([odd], SimpleNamespace(task_idx=0))
    StatusParquetSink(tmp_path / "none", rows_per_file=100).write([blocks[0].slice(0, 0)], SimpleNamespace(task_idx=0))
    assert not (tmp_path / "none").exists()


def test_a_corpus_whose_every_row_is_quarantined_by_the_reader(ray_cluster, tmp_path):
    from ray_jobs.extract import run

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.jsonl").write_text('{"body": "no text field"}\n{"text": 3}\n')
    cfg = load_config(None, ["corpus.format=generic", f"corpus.path={tmp_path / 'in'}", f"output_dir={tmp_path}"])
    summary = run(cfg)
    assert (summary.rows_in, summary.documents, summary.quarantined) == (2, 0, 2)
    bad = pads.dataset(str(tmp_path / "extracted" / "reader-quarantine.parquet")).to_table()
    assert bad.num_rows == 2 and "text" not in bad.schema.names
