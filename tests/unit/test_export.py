"""The releasable corpus: only released rows of gated modes, checked again, no real value or id, a release card."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrlgen.config import MimicCorpusConfig, load_config
from ctrlgen.corpora import load_corpus
from ctrlgen.errors import ConfigError, CtrlgenError
from ctrlgen.export import export_run

# Real notes: ids and values that must never reach a release.
EXTRACTED = [
    ("real-101", "John Smith seen 2101-10-20.", "PERSON: John Smith\nDATETIME: 2101-10-20"),
    ("real-102", "Mary Brennan at Mercy Hospital.", "PERSON: Mary Brennan\nORG: Mercy Hospital"),
    ("real-103", "A note with an MRN 7741-2290.", "CODE: 7741-2290\nPERSON: Al"),
]
CTX = ["real-101", "real-103"]


def _row(doc, text, *, released=True, status="ok", leaked_first=()):
    return {
        "doc_id": doc, "context_ids": CTX, "fictional_code": "PERSON: Ann Cole", "text": text,
        "context_values": ["John Smith", "2101-10-20", "7741-2290", "Al"], "leaked_first": list(leaked_first),
        "leaked": [], "attempts": 1, "released": released, "new_tokens": 10, "finish": "length", "status": status,
        "reason": "",
    }  # fmt: skip


GENERATED = {
    "baseline": [_row("real-101", "John Smith again: a copy of a real note.")],
    "icl": [_row("real-102", "Seen by Mary Brennan.")],
    "icl_blocking": [
        _row("real-101", "Ann Cole was seen today; stable.", leaked_first=["john smith"]),  # exported
        _row("real-102", "Seen by Smith, John on Oct 20, 2101."),  # a variant of its own contexts' values
        _row("real-103", "Transferred from Mercy Hospital."),  # another note's value (ORG, 14 characters)
        _row("real-104", "Al came in."),  # a 2-letter value of its own contexts: still caught (with variants)
        _row("real-105", "Withheld by the gate.", released=False),
        _row("real-106", "", status="error"),
        _row("real-107", "Patient Ann Cole, afebrile, discharged home."),  # exported
    ],
}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    ext = out / "extracted" / "status=ok"
    ext.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{"doc_id": d, "text": t, "control_code": c} for d, t, c in EXTRACTED]),
        ext / "part-0.parquet",
    )
    for mode, rows in GENERATED.items():
        d = out / "generated" / f"mode={mode}"
        d.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), d / "part-0.parquet")
    return out


def _cfg(run_dir: Path, *overrides: str):
    return load_config(None, [f"output_dir={run_dir}", *overrides])


def _all_text(where: Path) -> str:
    return "\n".join(
        (pq.read_table(f).to_pandas().to_csv() if f.suffix == ".parquet" else f.read_text())
        for f in sorted(where.rglob("*"))
        if f.is_file()
    )


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "hf"])
def test_export_releases_only_clean_released_rows_of_gated_modes(run_dir: Path, fmt: str) -> None:
    s = export_run(_cfg(run_dir, f"export.format={fmt}"))
    c = s.modes["icl_blocking"]
    assert list(s.modes) == ["icl_blocking"]  # baseline and icl are never exported
    assert (c.generated, c.exported, c.failed, c.withheld_gate) == (7, 2, 1, 1)
    assert (c.withheld_own, c.withheld_corpus, c.first_leaks) == (2, 1, 1)
    rel = run_dir / "release"
    everything = _all_text(rel)
    for doc_id, _, _ in EXTRACTED:
        assert doc_id not in everything
    for value in ("John Smith", "Mary Brennan", "Mercy Hospital", "7741-2290", "2101", "Smith"):
        assert value.lower() not in everything.lower(), value
    assert "real-10" not in everything
    for f in rel.rglob("*.parquet"):  # only the release's own columns
        assert pq.read_table(f).column_names == ["id", "mode", "text", "control_code"]
    assert "Ann Cole was seen today" in everything and "afebrile" in everything
    card = json.loads((rel / "release.json").read_text())
    assert card["exported"] == 2 and card["modes"]["icl_blocking"]["pipp_first"]["k"] == 1
    assert card["modes"]["icl_blocking"]["pipp_exported"]["wilson95"][1] > 0.5  # 0 of 2: a wide upper bound
    md = (rel / "RELEASE.md").read_text()
    assert "| icl_blocking | 7 | 1 | 1 | 2 | 1 | 2 |" in md and "No differential privacy holds" in md
    if fmt == "hf":
        assert (rel / "data" / "train-00000.parquet").is_file()
        assert "path: data/train-*.parquet" in (rel / "README.md").read_text()
    if fmt == "csv":  # NOTEEVENTS: ctrlgen's own mimic reader reads the release back
        docs, bad, _ = load_corpus(MimicCorpusConfig(path=str(rel / "notes-00000.csv")))
        assert not bad and [d.text for d in docs] == [
            "Ann Cole was seen today; stable.",
            "Patient Ann Cole, afebrile, discharged home.",
        ]


def test_export_refuses_leaky_modes_and_foreign_directories(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="leak by design"):
        export_run(_cfg(run_dir, "export.modes=[icl]"))
    with pytest.raises(CtrlgenError, match="did not generate"):
        export_run(_cfg(run_dir, "export.modes=[prefix]"))
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("a user's file")
    with pytest.raises(CtrlgenError, match="not an earlier export"):
        export_run(_cfg(run_dir, f"export.output={other}"))
    assert (other / "keep.txt").exists()
    export_run(_cfg(run_dir))
    export_run(_cfg(run_dir))  # an earlier export is replaced


def test_export_of_only_leaky_modes_says_what_to_do(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(run_dir / "generated" / "mode=icl_blocking")
    with pytest.raises(CtrlgenError, match="add icl_blocking"):
        export_run(_cfg(run_dir))


def _prefix_run(run_dir: Path, privacy: dict | None) -> None:
    d = run_dir / "generated" / "mode=prefix"
    d.mkdir(parents=True)
    rows = [_row("real-101", "A prefix note about Ann Cole."), _row("real-102", "Mary Brennan, from training.")]
    pq.write_table(pa.Table.from_pylist(rows), d / "part-0.parquet")
    td = run_dir / "train_data" / "status=ok"
    td.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"control_code": "PERSON: Mary Brennan"}]), td / "part-0.parquet")
    if privacy is not None:
        (run_dir / "adapter").mkdir()
        (run_dir / "adapter" / "privacy.json").write_text(json.dumps(privacy))


def test_prefix_rows_are_checked_against_the_fine_tuning_values_and_dp_is_stated_per_unit(run_dir: Path) -> None:
    _prefix_run(run_dir, {"epsilon": 7.9, "delta": 1e-5, "unit": "patient"})
    s = export_run(_cfg(run_dir))
    assert (s.modes["prefix"].exported, s.modes["prefix"].withheld_own) == (1, 1)
    g = s.card["guarantee"]
    assert "(7.9, 1e-05)-differentially private per patient" in g["formal"]
    assert "icl_blocking rows" in g["formal"] and "same_counts" in g["formal"]
    assert "differentially private per patient" in (run_dir / "release" / "RELEASE.md").read_text()


def test_a_reproducible_dp_run_is_stated_not_private(run_dir: Path) -> None:
    _prefix_run(run_dir, {"epsilon": 7.9, "delta": 1e-5, "unit": "note", "not_private": "noise from training.seed"})
    g = export_run(_cfg(run_dir)).card["guarantee"]
    assert g["formal"] is None and "no differential privacy holds" in g["dp_not_private"]


def test_the_unknown_setting_card_names_the_extractor_caveat(run_dir: Path) -> None:
    g = export_run(_cfg(run_dir, "extraction.setting=unknown")).card["guarantee"]
    assert "missed" in g["extraction"]
