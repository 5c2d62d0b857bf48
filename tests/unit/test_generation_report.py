"""PIPP/ELP per mode from generated rows."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrlgen.cli import main
from ctrlgen.generation.icl import GENERATED_SCHEMA
from ctrlgen.generation.report import leakage_by_mode, leakage_table


def _row(mode: str, text: str, ctx: list[str], first: list[str], released: bool = True, attempts: int = 1) -> dict:
    return {
        "doc_id": "d", "mode": mode, "context_ids": [], "fictional_code": "", "text": text, "context_values": ctx,
        "leaked_first": first, "leaked": [], "attempts": attempts, "released": released, "new_tokens": 1,
        "finish": "stop", "status": "ok", "reason": "",
    }  # fmt: skip


ROWS = [
    _row("icl", "Alice was here", ["Alice", "Bob"], ["alice"]),
    _row("icl", "nobody", ["Carol"], []),
    _row("icl_blocking", "clean text", ["Alice", "Bob"], ["bob"], attempts=2),
    _row("icl_blocking", "Bob again", ["Bob"], ["bob"], released=False, attempts=4),
    {**_row("baseline", "", [], []), "status": "quarantined"},
]


def test_first_attempt_and_released_figures() -> None:
    stats = {s.mode: s for s in leakage_by_mode(ROWS)}
    assert list(stats) == ["baseline", "icl", "icl_blocking"]
    assert stats["baseline"].quarantined == 1 and stats["baseline"].outputs == 0
    icl = stats["icl"]
    assert icl.pipp_first == pytest.approx(0.5) and icl.elp_first == pytest.approx(0.25)
    assert icl.pipp_released == pytest.approx(0.5)  # recomputed from the text
    gated = stats["icl_blocking"]
    assert gated.pipp_first == 1.0 and gated.withheld == 1 and gated.released == 1 and gated.retried == 2
    assert gated.pipp_released == 0.0 and gated.elp_released == 0.0
    assert "| icl_blocking | 2 | 0 | 100.00 |" in leakage_table(list(stats.values()))


def test_leakage_verb_reads_partitioned_output(tmp_path, capsys) -> None:
    for mode in ("icl", "icl_blocking"):
        d = tmp_path / "generated" / f"mode={mode}"
        d.mkdir(parents=True)
        rows = [{k: v for k, v in r.items() if k != "mode"} for r in ROWS if r["mode"] == mode]
        pq.write_table(pa.Table.from_pylist(rows, schema=GENERATED_SCHEMA.remove(1)), d / "part.parquet")
    (tmp_path / "generated" / "leakage.md").write_text("not parquet")
    assert main(["leakage", f"output_dir={tmp_path}", "--format", "json"]) == 0
    assert '"mode": "icl_blocking"' in capsys.readouterr().out
    assert main(["leakage", f"output_dir={tmp_path / 'missing'}"]) == 2


def test_prefix_mode_uses_the_fine_tuning_definitions(tmp_path, capsys) -> None:
    """PIPP: share of outputs with any value of the fine-tuning set; ELP: distinct leaked / distinct values."""
    rows = [
        _row("prefix", "Alice met Bob", [], ["alice", "bob"]),
        _row("prefix", "Alice again", [], ["alice"]),
        _row("prefix", "nothing", [], []),
    ]
    finetune = ["Alice", "Bob", "Carol", "Dan"]
    (s,) = leakage_by_mode(rows, finetune)
    assert s.pipp_first == pytest.approx(2 / 3) and s.elp_first == pytest.approx(2 / 4)
    assert s.pipp_released == pytest.approx(2 / 3) and s.elp_released == pytest.approx(2 / 4)
    with pytest.raises(Exception, match="fine-tuning set"):
        leakage_by_mode(rows)
    # The verb finds the fine-tuning values in the training examples `ctrlgen train` wrote.
    from ctrlgen.training.data import TRAIN_SCHEMA

    d = tmp_path / "generated" / "mode=prefix"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "mode"} for r in rows],
                                        schema=GENERATED_SCHEMA.remove(1)), d / "part.parquet")  # fmt: skip
    t = tmp_path / "train_data" / "status=ok"
    t.mkdir(parents=True)
    codes = [
        {"doc_id": "a", "control_code": "PERSON: Alice, Bob"},
        {"doc_id": "b", "control_code": "PERSON: Carol, Dan"},
    ]
    pq.write_table(
        pa.Table.from_pylist(
            codes, schema=pa.schema([TRAIN_SCHEMA.field("doc_id"), TRAIN_SCHEMA.field("control_code")])
        ),
        t / "p.parquet",
    )
    assert main(["leakage", f"output_dir={tmp_path}"]) == 0
    assert "| prefix | 3 | 0 | 66.67 | 50.00 |" in capsys.readouterr().out


def test_read_generated_order_does_not_depend_on_file_names(tmp_path) -> None:
    from ctrlgen.generation.report import read_generated

    rows = [{**_row("icl", "t", [], []), "doc_id": f"d{i}"} for i in (3, 1, 0, 2)]
    rows.append({**_row("baseline", "t", [], []), "doc_id": "d0"})
    orders = []
    for name, first in (("a", rows[2:]), ("b", rows[:2])):
        d = tmp_path / name
        for j, part in enumerate((first, [r for r in rows if r not in first])):
            for mode in {r["mode"] for r in part}:
                (d / f"mode={mode}").mkdir(parents=True, exist_ok=True)
                sub = [{k: v for k, v in r.items() if k != "mode"} for r in part if r["mode"] == mode]
                pq.write_table(pa.Table.from_pylist(sub), d / f"mode={mode}" / f"{j}-{name}.parquet")
        orders.append([(r["mode"], r["doc_id"]) for r in read_generated(d)])
    assert orders[0] == orders[1] == sorted(orders[0])
