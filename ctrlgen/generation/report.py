"""PIPP / ELP per generation mode, from the generated rows (the job's Parquet output).

For each mode: outputs, quarantined rows, PIPP and ELP of the first attempt (what
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
from ctrlgen.metrics.leakage import elp_icl, normalize_value, pipp_icl

__all__ = ["ModeLeakage", "leakage_by_mode", "leakage_table", "read_generated"]

_ORDER = ("baseline", "icl", "icl_blocking")


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
    """Rows of a generation output directory (Parquet partitioned by ``mode=...``)."""
    import pyarrow.dataset as pads

    root = Path(path)
    files = sorted(str(f) for f in root.rglob("*.parquet")) if root.is_dir() else []
    if not files:
        raise CtrlgenError(f"{root} holds no generated Parquet files (run `ctrlgen generate` first)")
    ds = pads.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(root))
    return ds.to_table().to_pylist()


def _norm(vs: Iterable[str]) -> set[str]:
    return {normalize_value(v) for v in vs if v and v.strip()}


def leakage_by_mode(rows: Iterable[dict[str, Any]]) -> list[ModeLeakage]:
    """Rows with the columns of ``GENERATED_SCHEMA`` -> one :class:`ModeLeakage` per mode."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r)
    out = []
    for mode in sorted(by, key=lambda m: (_ORDER.index(m) if m in _ORDER else 99, m)):
        rs = by[mode]
        ok = [r for r in rs if r["status"] == "ok"]
        first = [len(r["leaked_first"]) > 0 for r in ok]
        elp_terms = [
            len(_norm(r["leaked_first"])) / len(_norm(r["context_values"])) if _norm(r["context_values"]) else 0.0
            for r in ok
        ]
        rel = [r for r in ok if r["released"]]
        texts = [r["text"] for r in rel]
        ctx = [r["context_values"] for r in rel]
        out.append(
            ModeLeakage(
                mode=mode,
                outputs=len(ok),
                quarantined=len(rs) - len(ok),
                pipp_first=sum(first) / len(ok) if ok else 0.0,
                elp_first=sum(elp_terms) / len(ok) if ok else 0.0,
                released=len(rel),
                withheld=len(ok) - len(rel),
                pipp_released=pipp_icl(texts, ctx),
                elp_released=elp_icl(texts, ctx),
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
