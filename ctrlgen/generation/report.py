"""PIPP / ELP per generation mode, from the generated rows (the job's Parquet output).

ICL modes use the ICL definitions, the prefix mode the fine-tuning ones (see
:mod:`ctrlgen.metrics.leakage`). For each mode: outputs, quarantined rows, PIPP and ELP of the first attempt (what
the method alone achieves) and, for the released outputs, PIPP and ELP recomputed
from the released text with :mod:`ctrlgen.metrics.leakage` (for a gated mode this
is zero by construction), plus how many outputs the gate withheld.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ctrlgen.errors import CtrlgenError
from ctrlgen.metrics.leakage import elp_finetune, elp_icl, normalize_value, pipp_finetune, pipp_icl

__all__ = ["FINETUNE_MODES", "ModeLeakage", "finetune_values", "leakage_by_mode", "leakage_table", "read_generated"]

_ORDER = ("baseline", "icl", "icl_blocking", "prefix")
#: Modes measured with the fine-tuning definitions (against the whole fine-tuning set).
FINETUNE_MODES = ("prefix",)


@dataclass(frozen=True)
class ModeLeakage:
    mode: str
    outputs: int
    quarantined: int
    pipp_first: float
    elp_first: float
    released: int
    withheld: int
    pipp_released: float
    elp_released: float
    retried: int


def read_generated(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a generation output directory (Parquet partitioned by ``mode=...``), sorted by (mode, doc_id).

    The order does not depend on the writer's file names (Ray names files by task),
    so order-sensitive consumers (downstream fine-tuning, MAUVE's clustering, BM25
    ties) see the same sequence in every run. ``path`` may be a URI (``s3://...``).
    """
    from ctrlgen import storage

    root = str(path)
    files = storage.parquet_files(root)
    if not files:
        raise CtrlgenError(f"{root} holds no generated Parquet files (run `ctrlgen generate` first)")
    table = storage.dataset(files, base=root).to_table()
    return sorted(table.to_pylist(), key=lambda r: (str(r["mode"]), str(r["doc_id"])))


def finetune_values(path: str | Path) -> list[str]:
    """The distinct private values of a fine-tuning set (the ``control_code`` column of its Parquet)."""
    from ctrlgen import storage
    from ctrlgen.codes import parse_control_code
    from ctrlgen.fictional import code_values

    files = storage.parquet_files(str(path), within="status=ok")
    if not files:
        raise CtrlgenError(f"{path} holds no training examples (the prefix mode needs `ctrlgen train`'s train_data)")
    codes = storage.dataset(files).to_table(columns=["control_code"]).column("control_code")
    return sorted({v for c in codes.to_pylist() for v in code_values(parse_control_code(c or ""))})


def _norm(vs: Iterable[str]) -> set[str]:
    return {normalize_value(v) for v in vs if v and v.strip()}


def leakage_by_mode(rows: Iterable[dict[str, Any]], finetune: Iterable[str] | None = None) -> list[ModeLeakage]:
    """Rows with the columns of ``GENERATED_SCHEMA`` -> one :class:`ModeLeakage` per mode.

    ICL modes use the ICL definitions (each output against its own contexts' values);
    the prefix mode the fine-tuning ones, against ``finetune`` (all private values of
    the adapter's training set; required when prefix rows are present).
    """
    ft = sorted(_norm(finetune or ()))
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r)
    out = []
    for mode in sorted(by, key=lambda m: (_ORDER.index(m) if m in _ORDER else 99, m)):
        rs = by[mode]
        ok = [r for r in rs if r["status"] == "ok"]
        first = [len(r["leaked_first"]) > 0 for r in ok]
        rel = [r for r in ok if r["released"]]
        texts = [r["text"] for r in rel]
        if mode in FINETUNE_MODES:
            if not ft and ok:
                raise CtrlgenError(f"mode {mode} is measured against the fine-tuning set: pass its values")
            leaked_any = set().union(*(_norm(r["leaked_first"]) for r in ok)) if ok else set()
            elp_first = len(leaked_any) / len(ft) if ft else 0.0
            pipp_rel, elp_rel = pipp_finetune(texts, ft), elp_finetune(texts, ft)
        else:
            elp_terms = [
                len(_norm(r["leaked_first"])) / len(_norm(r["context_values"])) if _norm(r["context_values"]) else 0.0
                for r in ok
            ]
            elp_first = sum(elp_terms) / len(ok) if ok else 0.0
            ctx = [r["context_values"] for r in rel]
            pipp_rel, elp_rel = pipp_icl(texts, ctx), elp_icl(texts, ctx)
        out.append(
            ModeLeakage(
                mode=mode,
                outputs=len(ok),
                quarantined=len(rs) - len(ok),
                pipp_first=sum(first) / len(ok) if ok else 0.0,
                elp_first=elp_first,
                released=len(rel),
                withheld=len(ok) - len(rel),
                pipp_released=pipp_rel,
                elp_released=elp_rel,
                retried=sum(1 for r in ok if r["attempts"] > 1),
            )
        )
    return out


def leakage_table(stats: list[ModeLeakage], fmt: str = "markdown") -> str:
    """Markdown (or JSON) table of :func:`leakage_by_mode` results; percentages in the table."""
    if fmt == "json":
        return json.dumps([asdict(s) for s in stats], indent=2)
    lines = [
        "| mode | outputs | quarantined | PIPP % | ELP % | retried | withheld | released | PIPP % released | ELP % released |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in stats:
        lines.append(
            f"| {s.mode} | {s.outputs} | {s.quarantined} | {100 * s.pipp_first:.2f} | {100 * s.elp_first:.2f} | "
            f"{s.retried} | {s.withheld} | {s.released} | {100 * s.pipp_released:.2f} | {100 * s.elp_released:.2f} |"
        )
    return "\n".join(lines)
