"""Extraction quality against gold spans: precision and recall per category.

A gold span is *detected* when some predicted span overlaps it, and *typed* when an
overlapping prediction has the same category. A predicted span is *correct* when it
overlaps some gold span. Overlap (not exact match) is the measure that matters for
privacy: a partly covered name is still hidden from the control code's perspective
of "this is private". Exact-span figures are given as well.

Example:
    >>> from ctrlgen.schema import Document, Entity
    >>> g = [Document("d", "Ann Lee", entities=[Entity(0, 7, "Ann Lee", "PERSON", "DIRECT", "gold")])]
    >>> p = [Document("d", "Ann Lee", entities=[Entity(0, 3, "Ann", "PERSON", "DIRECT", "presidio")])]
    >>> s = span_scores(g, p)
    >>> s["PERSON"].recall, s["ALL"].exact_recall
    (1.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctrlgen.schema import CATEGORIES, Document

__all__ = ["Scores", "found_by_label", "scores_table", "span_scores"]


@dataclass
class Scores:
    gold: int = 0
    detected: int = 0  # gold spans overlapped by any prediction
    typed: int = 0  # ... by a prediction of the same category
    exact: int = 0  # ... by a prediction with the same start and end
    predicted: int = 0
    correct: int = 0  # predictions overlapping any gold span

    @property
    def recall(self) -> float:
        return self.detected / self.gold if self.gold else float("nan")

    @property
    def typed_recall(self) -> float:
        return self.typed / self.gold if self.gold else float("nan")

    @property
    def exact_recall(self) -> float:
        return self.exact / self.gold if self.gold else float("nan")

    @property
    def precision(self) -> float:
        return self.correct / self.predicted if self.predicted else float("nan")

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0


def span_scores(gold: Sequence[Document], predicted: Sequence[Document]) -> dict[str, Scores]:
    """Per-category scores (gold category for recall, predicted category for precision) and ``ALL``.

    Documents are matched by ``doc_id``; a gold document without a prediction counts
    as predicting nothing.
    """
    pred_by_id = {d.doc_id: d for d in predicted}
    out = {c: Scores() for c in (*CATEGORIES, "ALL")}
    for g in gold:
        p = pred_by_id.get(g.doc_id)
        preds = p.entities if p is not None else []
        for e in g.entities:
            hits = [q for q in preds if q.start < e.end and e.start < q.end]
            for key in (e.category, "ALL"):
                s = out[key]
                s.gold += 1
                s.detected += bool(hits)
                s.typed += any(q.category == e.category for q in hits)
                s.exact += any(q.start == e.start and q.end == e.end for q in hits)
        for q in preds:
            ok = any(q.start < e.end and e.start < q.end for e in g.entities)
            for key in (q.category, "ALL"):
                out[key].predicted += 1
                out[key].correct += ok
    return out


def found_by_label(gold: Sequence[Document], predicted: Sequence[Document]) -> dict[str, int]:
    """Per gold label (the corpus' own types, finer than the categories), how many gold spans some predicted span
    overlaps; documents matched by ``doc_id`` as in :func:`span_scores`. ``found_by_label(gold, gold)`` counts the
    gold spans per label."""
    pred_by_id = {d.doc_id: d for d in predicted}
    found: dict[str, int] = {}
    for g in gold:
        p = pred_by_id.get(g.doc_id)
        preds = p.entities if p is not None else []
        for e in g.entities:
            found[e.label] = found.get(e.label, 0) + any(q.start < e.end and e.start < q.end for q in preds)
    return found


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def scores_table(scores: dict[str, dict[str, Scores]]) -> str:
    """Markdown table: one row per (engine, category) with gold / predicted counts, P, R, F1."""
    lines = [
        "| engine | category | gold | predicted | precision % | recall % | typed recall % | exact recall % | F1 % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for engine, per_cat in scores.items():
        for cat, s in per_cat.items():
            if s.gold == 0 and s.predicted == 0:
                continue
            lines.append(
                f"| {engine} | {cat} | {s.gold} | {s.predicted} | {_pct(s.precision)} | {_pct(s.recall)} | "
                f"{_pct(s.typed_recall)} | {_pct(s.exact_recall)} | {_pct(s.f1)} |"
            )
    return "\n".join(lines)
