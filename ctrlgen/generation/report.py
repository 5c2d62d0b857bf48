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
from ctrlgen.metrics.leakage import ValueIndex, as_index, leaked_values, normalize_value

__all__ = [
    "FINETUNE_MODES",
    "TERM_COLUMNS",
    "VALUE_COLUMNS",
    "ModeLeakage",
    "finetune_values",
    "leakage_by_mode",
    "leakage_from_terms",
    "leakage_table",
    "leakage_terms",
    "read_generated",
]

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
    """The distinct private values of a fine-tuning set (the ``control_code`` column of its Parquet).

    They are :class:`~ctrlgen.variants.Value` strings: they carry their category, so an index of them
    matches their variants.
    """
    from ctrlgen import storage
    from ctrlgen.codes import parse_control_code
    from ctrlgen.variants import code_items

    files = storage.parquet_files(str(path), within="status=ok")
    if not files:
        raise CtrlgenError(f"{path} holds no training examples (the prefix mode needs `ctrlgen train`'s train_data)")
    codes = storage.dataset(files).to_table(columns=["control_code"]).column("control_code")
    return sorted({v for c in codes.to_pylist() for v in code_items(parse_control_code(c or ""))})


def _norm(vs: Iterable[str]) -> set[str]:
    return {normalize_value(v) for v in vs if v and v.strip()}


#: Per-row numeric leakage terms; a mode's figures are their sums (and distinct-value counts).
TERM_COLUMNS = (
    "outputs", "quarantined", "leak_first", "elp_first", "retried", "released", "leak_released", "elp_released",
)  # fmt: skip
#: Per-row lists of leaked (normalised) values, fine-tuning modes only: ELP counts them distinct over rows.
VALUE_COLUMNS = ("values_first", "values_released")


def leakage_terms(rows: Iterable[dict[str, Any]], finetune: ValueIndex | None = None) -> list[dict[str, Any]]:
    """One record of :data:`TERM_COLUMNS` and :data:`VALUE_COLUMNS` per generated row.

    Rows are independent, so the terms can be computed anywhere (the Ray job computes
    them in actors) and summed per mode (:func:`leakage_from_terms`).
    """
    out = []
    for r in rows:
        mode, ok = str(r["mode"]), r["status"] == "ok"
        t: dict[str, Any] = {"mode": mode, **dict.fromkeys(TERM_COLUMNS, 0), "values_first": [], "values_released": []}
        t["outputs"], t["quarantined"] = int(ok), int(not ok)
        if ok:
            released = bool(r["released"])
            t["leak_first"] = int(len(r["leaked_first"]) > 0)
            t["retried"] = int(r["attempts"] > 1)
            t["released"] = int(released)
            if mode in FINETUNE_MODES:
                if finetune is None or not len(finetune):
                    raise CtrlgenError(f"mode {mode} is measured against the fine-tuning set: pass its values")
                t["values_first"] = sorted(_norm(r["leaked_first"]))
                if released:
                    found = finetune.find(r["text"])
                    t["leak_released"], t["values_released"] = int(bool(found)), sorted(found)
            else:
                ctx = _norm(r["context_values"])
                t["elp_first"] = len(_norm(r["leaked_first"])) / len(ctx) if ctx else 0.0
                if released:  # recounted; the gate's own find (variants of the categorised values) counts too
                    found = leaked_values(r["text"], ctx) | (_norm(r.get("leaked") or []) & ctx)
                    t["leak_released"] = int(bool(found))
                    t["elp_released"] = len(found) / len(ctx) if ctx else 0.0
        out.append(t)
    return out


def leakage_from_terms(
    sums: dict[str, dict[str, float]], distinct: dict[str, dict[str, int]], n_finetune: int
) -> list[ModeLeakage]:
    """Per-mode sums of the terms (and, for fine-tuning modes, distinct leaked values per value
    column) -> one :class:`ModeLeakage` per mode."""
    out = []
    for mode in sorted(sums, key=lambda m: (_ORDER.index(m) if m in _ORDER else 99, m)):
        t = sums[mode]
        ok, rel = int(t["outputs"]), int(t["released"])
        if mode in FINETUNE_MODES:
            d = distinct.get(mode, {})
            elp_first = d.get("values_first", 0) / n_finetune if n_finetune else 0.0
            elp_rel = d.get("values_released", 0) / n_finetune if n_finetune else 0.0
        else:
            elp_first = t["elp_first"] / ok if ok else 0.0
            elp_rel = t["elp_released"] / rel if rel else 0.0
        out.append(
            ModeLeakage(
                mode=mode,
                outputs=ok,
                quarantined=int(t["quarantined"]),
                pipp_first=t["leak_first"] / ok if ok else 0.0,
                elp_first=elp_first,
                released=rel,
                withheld=ok - rel,
                pipp_released=t["leak_released"] / rel if rel else 0.0,
                elp_released=elp_rel,
                retried=int(t["retried"]),
            )
        )
    return out


def leakage_by_mode(
    rows: Iterable[dict[str, Any]], finetune: Iterable[str] | ValueIndex | None = None
) -> list[ModeLeakage]:
    """Rows with the columns of ``GENERATED_SCHEMA`` -> one :class:`ModeLeakage` per mode.

    ICL modes use the ICL definitions (each output against its own contexts' values);
    the prefix mode the fine-tuning ones, against ``finetune`` (all private values of
    the adapter's training set; required when prefix rows are present). The Ray job
    computes the same terms in actors and aggregates them with Ray Data.
    """
    index = as_index(finetune or ())
    sums: dict[str, dict[str, float]] = {}
    seen: dict[str, dict[str, set[str]]] = {}
    for t in leakage_terms(rows, index):
        acc = sums.setdefault(t["mode"], dict.fromkeys(TERM_COLUMNS, 0))
        for c in TERM_COLUMNS:
            acc[c] += t[c]
        vals = seen.setdefault(t["mode"], {c: set() for c in VALUE_COLUMNS})
        for c in VALUE_COLUMNS:
            vals[c].update(t[c])
    distinct = {m: {c: len(v) for c, v in d.items()} for m, d in seen.items()}
    return leakage_from_terms(sums, distinct, len(index))


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
