"""Per-document privacy metrics of generated rows, and their aggregation.

The same functions serve the local loop and the Ray Data job (``ray_jobs/evaluate.py``:
:meth:`ShardEvaluator.partial` per row and reference shard, :func:`merge_partials` per row,
:func:`record_terms` summed per mode, :func:`metrics_from_sums`), so both give the same numbers.

References are the *real* documents with their gold private values and spans
(:class:`RealDoc`), whatever setting produced the generation: in the unknown
setting the prompts and blocking use Presidio's entities, but leakage is measured
against the gold annotation. Per generated row:

* ICL modes: against its own context documents (``context_ids``);
* fine-tuning modes (``prefix``): against the whole fine-tuning set (values, entity windows); ROUGE
  against all of it up to ``rouge_sample`` documents, beyond that against a seeded sample of that
  expected size (:func:`rouge_sample_rate`, :func:`in_rouge_sample`: a fixed hash of doc_id, so every
  shard and every run picks the same documents).

Columns of a record (:data:`RECORD_SCHEMA`): ``leaked`` (normalised values found),
``n_values`` (distinct reference values), ``rouge2`` / ``rougeL`` (maximum F1 over
the references, :class:`~ctrlgen.metrics.rouge.RougeIndex`), ``ctx_1``..``ctx_4``
(entity-in-context leakage, :mod:`ctrlgen.metrics.context`).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ctrlgen.errors import CtrlgenError
from ctrlgen.generation.report import FINETUNE_MODES
from ctrlgen.metrics.context import KS, WindowSets, context_windows, leaks_by_k, merge_windows
from ctrlgen.metrics.leakage import ValueIndex, normalize_value
from ctrlgen.metrics.rouge import RougeIndex
from ctrlgen.variants import Value

__all__ = [
    "LONG_VALUE",
    "PARTIAL_SCHEMA",
    "RECORD_SCHEMA",
    "TERMS",
    "Evaluator",
    "RealDoc",
    "ShardEvaluator",
    "aggregate",
    "in_rouge_sample",
    "merge_partials",
    "metrics_from_sums",
    "record_terms",
    "rouge_sample_rate",
    "shard_of",
]

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

#: One generated row scored against one shard of the references (:meth:`Evaluator.partial`).
PARTIAL_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("mode", pa.string()),
        pa.field("status", pa.string()),
        pa.field("n_context", pa.int32()),  # context documents the row names (ICL)
        pa.field("found", pa.int32()),  # of which this shard holds (fine-tuning: documents held)
        pa.field("leaked", pa.list_(pa.string())),
        pa.field("values", pa.list_(pa.string())),  # normalised values of the held contexts (ICL)
        pa.field("rouge2", pa.float64()),
        pa.field("rougeL", pa.float64()),
        *[pa.field(f"ctx_{k}", pa.bool_()) for k in KS],
        pa.field("exact_calls", pa.int32()),
    ]
)


#: A reference set: its ROUGE index, entity windows and normalised private values.
#: The index finds the values' variants (their categories ride on the :class:`~ctrlgen.variants.Value` strings).
_Refs = tuple[RougeIndex, WindowSets, list[str], ValueIndex]


@dataclass(frozen=True)
class RealDoc:
    """A real document: text, gold private values (:class:`~ctrlgen.variants.Value` strings from
    :meth:`from_row`: they carry their category, so the metrics match their variants) and their spans."""

    doc_id: str
    text: str
    values: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> RealDoc:
        """From an extraction row (``doc_id``, ``text``, ``entities``)."""
        ents = row.get("entities") or []
        typed = {(e["text"], e.get("category")): Value(e["text"], e.get("category")) for e in ents if e["text"].strip()}
        vals = tuple(sorted(typed.values()))
        return RealDoc(str(row["doc_id"]), row["text"], vals, tuple((int(e["start"]), int(e["end"])) for e in ents))


def distinct_values(docs: Iterable[RealDoc]) -> list[str]:
    """The documents' distinct private values (normalised), sorted: the denominator of a fine-tuning set's ELP."""
    return sorted({normalize_value(v) for d in docs for v in d.values if v.strip()})


def rouge_sample_rate(sample: int | None, n_docs: int) -> float:
    """The share of the fine-tuning documents a fine-tuning output's ROUGE maximum is taken over: all of them
    when there are at most ``sample`` (or ``sample`` is None), else ``sample / n_docs``.

    >>> rouge_sample_rate(2000, 64), rouge_sample_rate(2000, 200_000)
    (1.0, 0.01)
    """
    return 1.0 if sample is None or n_docs <= sample else sample / n_docs


def in_rouge_sample(doc_id: str, rate: float) -> bool:
    """Whether a fine-tuning document is in the ROUGE sample of this ``rate``: a 64-bit hash of its id below
    ``rate * 2**64`` (independent of the shard, the order and the run; nested: a smaller rate's sample is
    inside a larger one's)."""
    if rate >= 1.0:
        return True
    h = int.from_bytes(hashlib.blake2b(f"rouge-sample:{doc_id}".encode(), digest_size=8).digest(), "big")
    return h < rate * 2.0**64


class Evaluator:
    """Holds the references (indexed once) and scores generated rows one at a time.

    ``rouge_rate``: fine-tuning outputs' ROUGE is the maximum over the fine-tuning documents
    :func:`in_rouge_sample` keeps at this rate (1.0: all of them); leaked values and entity windows
    are always tested against the whole fine-tuning set.
    """

    def __init__(
        self,
        real: Mapping[str, RealDoc],
        finetune_ids: Sequence[str] = (),
        rouge_rate: float = 1.0,
        keep_texts: bool = True,
    ) -> None:
        """``keep_texts=False``: an evaluator of fine-tuning outputs only (a shard's): once the fine-tuning set's
        ROUGE index and hashed windows are built, its documents (texts, values, spans) are let go."""
        self.rouge_rate = rouge_rate
        self.keep_texts = keep_texts
        self.real = dict(real)
        missing = [d for d in finetune_ids if d not in self.real]
        if missing:
            raise CtrlgenError(f"{len(missing)} fine-tuning document(s) have no reference, e.g. {missing[0]}")
        self.ft_docs = [self.real[d] for d in sorted(set(finetune_ids))]
        self.n_finetune = len(self.ft_docs)
        self.ft_values = distinct_values(self.ft_docs)
        self._ft_index: RougeIndex | None = None
        self._ft_windows: WindowSets | None = None
        self._ft_values = ValueIndex([v for d in self.ft_docs for v in d.values if v.strip()])
        self._windows: dict[str, dict[int, set[tuple[str, ...]]]] = {}
        self._contexts: dict[tuple[str, ...], _Refs] = {}  # the modes of one target share its contexts

    def _doc_windows(self, d: RealDoc) -> dict[int, set[tuple[str, ...]]]:
        if d.doc_id not in self._windows:
            self._windows[d.doc_id] = context_windows(d.text, d.spans)
        return self._windows[d.doc_id]

    def _finetune_refs(self) -> tuple[RougeIndex, WindowSets]:
        if self._ft_index is None or self._ft_windows is None:
            if not self.n_finetune:
                raise CtrlgenError("a fine-tuning mode is evaluated but no fine-tuning documents were given")
            self._ft_index = RougeIndex([d.text for d in self.ft_docs if in_rouge_sample(d.doc_id, self.rouge_rate)])
            # not through the per-document cache: only the set's hashed windows are kept
            self._ft_windows = merge_windows(context_windows(d.text, d.spans) for d in self.ft_docs)
            if not self.keep_texts:  # everything a fine-tuning output is scored against is built: let the notes go
                self.ft_docs, self.real = [], {}
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
                ValueIndex([v for d in ctx for v in d.values if v.strip()]),
            )
        return self._contexts[key]

    def partial(self, row: Mapping[str, Any], require_all: bool = True) -> dict[str, Any]:
        """One generated row -> its :data:`PARTIAL_SCHEMA` terms against the references held here.

        ``require_all=False`` (a shard of the references, :class:`ShardEvaluator`): context
        documents held elsewhere are skipped and ``found`` says how many were here; the
        shards' partials of a row are merged by :func:`merge_partials`.
        """
        rec: dict[str, Any] = {"doc_id": str(row["doc_id"]), "mode": row["mode"], "status": row["status"],
                               "n_context": 0, "found": 0, "leaked": [], "values": [], "rouge2": 0.0, "rougeL": 0.0,
                               **{f"ctx_{k}": False for k in KS}, "exact_calls": 0}  # fmt: skip
        if row["status"] != "ok":
            return rec
        text = row["text"]
        values: list[str] = []
        if row["mode"] in FINETUNE_MODES:
            if not self.n_finetune and not require_all:
                return rec
            index, windows = self._finetune_refs()
            leaked, found = self._ft_values.find(text), self.n_finetune
        else:
            ctx = list(row["context_ids"] or [])
            rec["n_context"] = len(ctx)
            held = ctx if require_all else [c for c in ctx if c in self.real]
            if not held:
                return rec
            index, windows, values, matcher = self._context_refs(rec["doc_id"], held)
            leaked, found = matcher.find(text), len(held)
        best = index.best(text)
        by_k = leaks_by_k(text, windows) if windows else {}
        return {**rec, "found": found, "leaked": sorted(leaked), "values": values, "rouge2": best.rouge2,
                "rougeL": best.rougeL, **{f"ctx_{k}": bool(by_k.get(k, False)) for k in KS},
                "exact_calls": best.exact_calls}  # fmt: skip

    def document(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """One generated row (``GENERATED_SCHEMA`` columns) -> one record (``RECORD_SCHEMA``)."""
        return merge_partials([self.partial(row)], len(self.ft_values))

    def table(self, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist([self.document(r) for r in rows], schema=RECORD_SCHEMA)


def shard_of(doc_id: str, num_shards: int) -> int:
    """The reference shard of a document (a stable hash of its id)."""
    return zlib.crc32(str(doc_id).encode("utf-8")) % num_shards


class ShardEvaluator:
    """One shard of the references: ICL context documents and fine-tuning documents.

    The distributed evaluation (``ray_jobs/evaluate.py``) sends each generated row to the
    shards holding its context documents (a fine-tuning row to every shard); every shard
    scores it against what it holds and :func:`merge_partials` combines the partials. Each
    metric decomposes over disjoint reference sets: leaked values are a union (every value
    is tested on its own), ROUGE maxima a maximum, entity-in-context hits an "any".
    """

    def __init__(self, real: Mapping[str, RealDoc], finetune: Mapping[str, RealDoc], rouge_rate: float = 1.0) -> None:
        self.icl = Evaluator(real)
        self.ft = Evaluator(finetune, sorted(finetune), rouge_rate, keep_texts=False)

    def partial(self, row: Mapping[str, Any]) -> dict[str, Any]:
        ev = self.ft if row["mode"] in FINETUNE_MODES else self.icl
        return ev.partial(row, require_all=False)

    def table(self, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist([self.partial(r) for r in rows], schema=PARTIAL_SCHEMA)


def merge_partials(parts: Sequence[Mapping[str, Any]], n_finetune_values: int) -> dict[str, Any]:
    """The record (:data:`RECORD_SCHEMA`) of one generated row from its partials over disjoint reference sets.

    ``exact_calls`` is summed (each shard searches its own references, so it may differ
    from one search over all of them; the metrics do not use it). Raises when an ICL
    row's context documents were not all found.
    """
    if not parts:
        raise CtrlgenError("no partial records to merge")
    first = parts[0]
    rec: dict[str, Any] = {"doc_id": first["doc_id"], "mode": first["mode"], "status": first["status"]}
    ft = first["mode"] in FINETUNE_MODES
    if first["status"] == "ok" and not ft:
        found = sum(int(p["found"]) for p in parts)
        if found != first["n_context"]:
            raise CtrlgenError(
                f"{first['n_context'] - found} context document(s) of output {first['doc_id']} have no reference"
            )
    if first["status"] != "ok":
        n_values = 0
    elif ft:
        n_values = n_finetune_values
    else:
        n_values = len({v for p in parts for v in p["values"]})
    return {**rec, "leaked": sorted({v for p in parts for v in p["leaked"]}), "n_values": n_values,
            "rouge2": max(float(p["rouge2"]) for p in parts), "rougeL": max(float(p["rougeL"]) for p in parts),
            **{f"ctx_{k}": any(bool(p[f"ctx_{k}"]) for p in parts) for k in KS},
            "exact_calls": sum(int(p["exact_calls"]) for p in parts)}  # fmt: skip


#: Per-record numeric terms; a mode's metrics are their sums over its records (divided by ``outputs``).
TERMS = ("outputs", "quarantined", "pipp", "pipp_long", "elp", "rouge2", "rougeL", *(f"ctx_{k}" for k in KS))


def record_terms(r: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`TERMS` of one record (``elp``: the ICL term, leaked / context values)."""
    if r["status"] != "ok":
        return {t: (1.0 if t == "quarantined" else 0.0) for t in TERMS}
    leaked = r["leaked"]
    return {"outputs": 1.0, "quarantined": 0.0, "pipp": 1.0 if leaked else 0.0,
            "pipp_long": 1.0 if any(len(v) >= LONG_VALUE for v in leaked) else 0.0,
            "elp": len(leaked) / r["n_values"] if r["n_values"] else 0.0,
            "rouge2": float(r["rouge2"]), "rougeL": float(r["rougeL"]),
            **{f"ctx_{k}": 1.0 if r[f"ctx_{k}"] else 0.0 for k in KS}}  # fmt: skip


def metrics_from_sums(
    sums: Mapping[str, Mapping[str, float]], distinct: Mapping[str, int], n_finetune_values: int = 0
) -> dict[str, dict[str, float]]:
    """mode -> metrics from the per-mode sums of :func:`record_terms` and, for fine-tuning
    modes, the number of distinct leaked values (their ELP)."""
    out: dict[str, dict[str, float]] = {}
    for mode, s in sorted(sums.items()):
        n = s["outputs"]
        m: dict[str, float] = {"outputs": float(n), "quarantined": float(s["quarantined"])}
        for t in TERMS[2:]:
            m[t] = s[t] / n if n else 0.0
        if mode in FINETUNE_MODES:
            m["elp"] = distinct.get(mode, 0) / n_finetune_values if n_finetune_values else 0.0
        out[mode] = {k: m[k] for k in ("outputs", "quarantined", *TERMS[2:])}
    return out


def aggregate(records: Iterable[Mapping[str, Any]], n_finetune_values: int = 0) -> dict[str, dict[str, float]]:
    """mode -> metrics over its records (fractions, not percent).

    ``pipp``, ``elp`` (ICL: mean of leaked / context values; fine-tuning: distinct
    leaked / ``n_finetune_values``), ``pipp_long`` (PIPP over values of at least
    :data:`LONG_VALUE` characters), ``rouge2``, ``rougeL`` (means), ``ctx_k``
    (share of outputs with entity-in-context leakage at k), ``outputs``,
    ``quarantined``. The distributed job sums the same :func:`record_terms` with Ray Data.
    """
    sums: dict[str, dict[str, float]] = {}
    leaked: dict[str, set[str]] = {}
    for r in records:
        s = sums.setdefault(r["mode"], dict.fromkeys(TERMS, 0.0))
        for t, v in record_terms(r).items():
            s[t] += v
        if r["status"] == "ok" and r["mode"] in FINETUNE_MODES:
            leaked.setdefault(r["mode"], set()).update(r["leaked"])
    return metrics_from_sums(sums, {m: len(v) for m, v in leaked.items()}, n_finetune_values)
