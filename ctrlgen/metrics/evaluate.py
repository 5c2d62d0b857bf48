"""Per-document privacy metrics of generated rows, and their aggregation.

The same two functions serve the local loop and the Ray Data job
(``ray_jobs/evaluate.py``: :meth:`Evaluator.document` per row in ``map_batches``,
:func:`aggregate` on the collected records), so both give the same numbers.

References are the *real* documents with their gold private values and spans
(:class:`RealDoc`), whatever setting produced the generation: in the unknown
setting the prompts and blocking use Presidio's entities, but leakage is measured
against the gold annotation. Per generated row:

* ICL modes: against its own context documents (``context_ids``);
* fine-tuning modes (``prefix``): against the whole fine-tuning set.

Columns of a record (:data:`RECORD_SCHEMA`): ``leaked`` (normalised values found),
``n_values`` (distinct reference values), ``rouge2`` / ``rougeL`` (maximum F1 over
the references, :class:`~ctrlgen.metrics.rouge.RougeIndex`), ``ctx_1``..``ctx_4``
(entity-in-context leakage, :mod:`ctrlgen.metrics.context`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ctrlgen.errors import CtrlgenError
from ctrlgen.generation.report import FINETUNE_MODES
from ctrlgen.metrics.context import KS, context_windows, leaks_by_k, merge_windows
from ctrlgen.metrics.leakage import ValueIndex, leaked_values, normalize_value
from ctrlgen.metrics.rouge import RougeIndex

__all__ = ["LONG_VALUE", "RECORD_SCHEMA", "Evaluator", "RealDoc", "aggregate"]

#: PIPP is also reported over values of at least this many characters (initials and
#: one-digit values reappear by chance).
LONG_VALUE = 4

RECORD_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("mode", pa.string()),
        pa.field("status", pa.string()),
        pa.field("leaked", pa.list_(pa.string())),
        pa.field("n_values", pa.int32()),
        pa.field("rouge2", pa.float64()),
        pa.field("rougeL", pa.float64()),
        *[pa.field(f"ctx_{k}", pa.bool_()) for k in KS],
        pa.field("exact_calls", pa.int32()),
    ]
)


#: A reference set: its ROUGE index, entity windows and normalised private values.
_Refs = tuple[RougeIndex, dict[int, set[tuple[str, ...]]], list[str]]


@dataclass(frozen=True)
class RealDoc:
    """A real document: text, gold private values and their spans."""

    doc_id: str
    text: str
    values: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> RealDoc:
        """From an extraction row (``doc_id``, ``text``, ``entities``)."""
        ents = row.get("entities") or []
        vals = tuple(sorted({e["text"] for e in ents if e["text"].strip()}))
        return RealDoc(str(row["doc_id"]), row["text"], vals, tuple((int(e["start"]), int(e["end"])) for e in ents))


class Evaluator:
    """Holds the references (indexed once) and scores generated rows one at a time."""

    def __init__(self, real: Mapping[str, RealDoc], finetune_ids: Sequence[str] = ()) -> None:
        self.real = dict(real)
        missing = [d for d in finetune_ids if d not in self.real]
        if missing:
            raise CtrlgenError(f"{len(missing)} fine-tuning document(s) have no reference, e.g. {missing[0]}")
        self.ft_docs = [self.real[d] for d in sorted(set(finetune_ids))]
        self.ft_values = sorted({normalize_value(v) for d in self.ft_docs for v in d.values if v.strip()})
        self._ft_index: RougeIndex | None = None
        self._ft_windows: dict[int, set[tuple[str, ...]]] | None = None
        self._ft_values = ValueIndex(self.ft_values)
        self._windows: dict[str, dict[int, set[tuple[str, ...]]]] = {}
        self._contexts: dict[tuple[str, ...], _Refs] = {}  # the modes of one target share its contexts

    def _doc_windows(self, d: RealDoc) -> dict[int, set[tuple[str, ...]]]:
        if d.doc_id not in self._windows:
            self._windows[d.doc_id] = context_windows(d.text, d.spans)
        return self._windows[d.doc_id]

    def _finetune_refs(self) -> tuple[RougeIndex, dict[int, set[tuple[str, ...]]]]:
        if self._ft_index is None or self._ft_windows is None:
            if not self.ft_docs:
                raise CtrlgenError("a fine-tuning mode is evaluated but no fine-tuning documents were given")
            self._ft_index = RougeIndex([d.text for d in self.ft_docs])
            self._ft_windows = merge_windows(self._doc_windows(d) for d in self.ft_docs)
        return self._ft_index, self._ft_windows

    def _context_refs(self, doc_id: str, context_ids: Sequence[str]) -> _Refs:
        key = tuple(context_ids)
        if key not in self._contexts:
            missing = [c for c in key if c not in self.real]
            if missing:
                raise CtrlgenError(f"context document {missing[0]} of output {doc_id} has no reference")
            ctx = [self.real[c] for c in key]
            self._contexts[key] = (
                RougeIndex([d.text for d in ctx]),
                merge_windows(self._doc_windows(d) for d in ctx),
                sorted({normalize_value(v) for d in ctx for v in d.values if v.strip()}),
            )
        return self._contexts[key]

    def document(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One generated row (``GENERATED_SCHEMA`` columns) -> one record (``RECORD_SCHEMA``)."""
        rec: dict[str, Any] = {"doc_id": str(row["doc_id"]), "mode": row["mode"], "status": row["status"]}
        if row["status"] != "ok":
            return {**rec, "leaked": [], "n_values": 0, "rouge2": 0.0, "rougeL": 0.0,
                    **{f"ctx_{k}": False for k in KS}, "exact_calls": 0}  # fmt: skip
        text = row["text"]
        if row["mode"] in FINETUNE_MODES:
            index, windows = self._finetune_refs()
            leaked, n_values = self._ft_values.find(text), len(self.ft_values)
        else:
            index, windows, values = self._context_refs(rec["doc_id"], row["context_ids"])
            leaked, n_values = leaked_values(text, values), len(values)
        best = index.best(text)
        by_k = leaks_by_k(text, windows) if windows else {}
        return {**rec, "leaked": sorted(leaked), "n_values": n_values, "rouge2": best.rouge2,
                "rougeL": best.rougeL, **{f"ctx_{k}": bool(by_k.get(k, False)) for k in KS},
                "exact_calls": best.exact_calls}  # fmt: skip

    def table(self, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist([self.document(r) for r in rows], schema=RECORD_SCHEMA)


def aggregate(records: Iterable[Mapping[str, Any]], n_finetune_values: int = 0) -> dict[str, dict[str, float]]:
    """mode -> metrics over its records (fractions, not percent).

    ``pipp``, ``elp`` (ICL: mean of leaked / context values; fine-tuning: distinct
    leaked / ``n_finetune_values``), ``pipp_long`` (PIPP over values of at least
    :data:`LONG_VALUE` characters), ``rouge2``, ``rougeL`` (means), ``ctx_k``
    (share of outputs with entity-in-context leakage at k), ``outputs``,
    ``quarantined``.
    """
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(r["mode"], []).append(r)
    out: dict[str, dict[str, float]] = {}
    for mode, rs in sorted(by.items()):
        ok = [r for r in rs if r["status"] == "ok"]
        n = len(ok)
        m: dict[str, float] = {"outputs": float(n), "quarantined": float(len(rs) - n)}

        def mean(xs: Iterable[float], n: int = n) -> float:
            return sum(xs) / n if n else 0.0

        m["pipp"] = mean(1.0 if r["leaked"] else 0.0 for r in ok)
        m["pipp_long"] = mean(1.0 if any(len(v) >= LONG_VALUE for v in r["leaked"]) else 0.0 for r in ok)
        if mode in FINETUNE_MODES:
            distinct = {v for r in ok for v in r["leaked"]}
            m["elp"] = len(distinct) / n_finetune_values if n_finetune_values else 0.0
        else:
            m["elp"] = mean(len(r["leaked"]) / r["n_values"] if r["n_values"] else 0.0 for r in ok)
        m["rouge2"] = mean(r["rouge2"] for r in ok)
        m["rougeL"] = mean(r["rougeL"] for r in ok)
        for k in KS:
            m[f"ctx_{k}"] = mean(1.0 if r[f"ctx_{k}"] else 0.0 for r in ok)
        out[mode] = m
    return out
