"""Selection of the hand-written extraction rules on training notes only (issue 17's "tuned inside the folds").

The unknown-setting engine is a trained NER plus rules: recognizers beside the NER (dictionaries,
patterns for dates, phones, facilities, IDs, ages...), vetoes of clinical numbers and generic places,
mention propagation, initials, and Presidio's score threshold. Which of them to run is a choice; made on
the notes it is then scored on, the figures would be optimistic. Here the choice is made on a set of
*tuning* notes whose NER predictions come from models that never saw them (an inner cross-validation),
so that the outer cross-validation's held-out fold plays no part in it.

The search is a greedy backward elimination from the configured engine: each step tries every single
change (one rule off, or another threshold) and takes the one that most raises F-beta of the tuning
notes (beta 2 by default: recall weighs four times precision, as de-identification wants); it stops when
no change raises it. A rule that changes nothing on the tuning notes stays as configured (the notes of
one corpus cannot say a MIMIC placeholder rule is useless). Presidio's analysis runs once per note
(:meth:`~ctrlgen.extract.presidio.PresidioExtractor.recognizer_results`); each candidate is then scored
from it by :func:`analysis_under` and the engine's own post-processing, which gives what an engine built
with that configuration finds (tested).

Example:
    >>> f_beta(0.8, 1.0, 2.0) > f_beta(1.0, 0.8, 2.0)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctrlgen.config import BarTuningConfig, ExtractionConfig
from ctrlgen.extract.quality import span_scores
from ctrlgen.schema import Document, Entity

__all__ = [
    "Analysed",
    "BarSelection",
    "RuleSelection",
    "analysis_under",
    "bar_objective",
    "candidate_changes",
    "f_beta",
    "select_bars",
    "select_rules",
]

#: The switches a selection may turn off (when the configuration has them on).
FLAGS = ("clinical_number_veto", "propagate_mentions", "expand_initials")
#: Never turned off: the trained NER is what the rules are added to.
KEEP = ("SpacyRecognizer",)


def f_beta(precision: float, recall: float, beta: float) -> float:
    """F-beta of a precision and a recall (0 when both are 0 or undefined)."""
    p = precision if precision == precision else 0.0  # NaN (nothing predicted) -> 0
    r = recall if recall == recall else 0.0
    b2 = beta * beta
    return (1 + b2) * p * r / (b2 * p + r) if b2 * p + r > 0 else 0.0


@dataclass
class Analysed:
    """One tuning note: its gold document and every recognizer's results on it (name, result)."""

    gold: Document
    results: list[tuple[str, Any]]


def analysis_under(results: Sequence[tuple[str, Any]], cfg: ExtractionConfig) -> list[Any]:
    """What Presidio's analyzer returns for an engine of ``cfg``'s recognizers and threshold.

    The analyzer keeps results at or above the threshold, then drops duplicates
    (``EntityRecognizer.remove_duplicates``); so here, on the results of the recognizers ``cfg`` runs.
    """
    from presidio_analyzer import EntityRecognizer

    wanted = set(cfg.recognizers)
    kept = [r for name, r in results if name in wanted and r.score >= cfg.score_threshold]
    return list(EntityRecognizer.remove_duplicates(kept))


def candidate_changes(cfg: ExtractionConfig, thresholds: Sequence[float]) -> list[tuple[str, ExtractionConfig]]:
    """Every single change a selection step may make: one rule off, or another threshold."""
    out = []
    for name in cfg.recognizers:
        if name not in KEEP:
            rest = [r for r in cfg.recognizers if r != name]
            out.append((f"-{name}", cfg.model_copy(update={"recognizers": rest})))
    for flag in FLAGS:
        if getattr(cfg, flag):
            out.append((f"-{flag}", cfg.model_copy(update={flag: False})))
    for t in sorted(set(thresholds)):
        if t != cfg.score_threshold:
            out.append((f"threshold {t:g}", cfg.model_copy(update={"score_threshold": t})))
    return out


@dataclass
class RuleSelection:
    """The configuration chosen on the tuning notes, and how it was reached."""

    cfg: ExtractionConfig
    steps: list[str] = field(default_factory=list)  # the changes taken, in order
    start: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (F-beta, precision, recall) as configured
    end: tuple[float, float, float] = (0.0, 0.0, 0.0)  # ... as chosen
    tuning_notes: int = 0
    evaluated: int = 0  # configurations scored

    def text(self) -> str:
        what = ", ".join(self.steps) if self.steps else "no change"
        return (
            f"{what} (tuning notes {self.tuning_notes}: F-beta {self.start[0]:.3f} -> {self.end[0]:.3f}, "
            f"precision {100 * self.end[1]:.1f}%, recall {100 * self.end[2]:.1f}%)"
        )


def select_rules(
    notes: Sequence[Analysed],
    cfg: ExtractionConfig,
    finish: Callable[[str, Sequence[Any], ExtractionConfig], list[Entity]],
    beta: float = 2.0,
    thresholds: Sequence[float] = (0.3, 0.4, 0.5, 0.6, 0.7),
) -> RuleSelection:
    """Greedy backward elimination of rules on ``notes`` (see the module docstring).

    ``finish``: the engine's post-processing (:meth:`~ctrlgen.extract.presidio.PresidioExtractor.finish`).
    """
    gold = [a.gold for a in notes]
    evaluated = 0

    def score(c: ExtractionConfig) -> tuple[float, float, float]:
        nonlocal evaluated
        evaluated += 1
        pred = [
            Document(a.gold.doc_id, a.gold.text, a.gold.metadata, finish(a.gold.text, analysis_under(a.results, c), c))
            for a in notes
        ]
        s = span_scores(gold, pred)["ALL"]
        return f_beta(s.precision, s.recall, beta), s.precision, s.recall

    current, best = cfg, score(cfg)
    sel = RuleSelection(cfg, start=best, tuning_notes=len(notes))
    while True:
        scored = [(score(c), label, c) for label, c in candidate_changes(current, thresholds)]
        better = [t for t in scored if t[0][0] > best[0] + 1e-12]
        if not better:
            break
        best, label, current = max(better, key=lambda t: t[0][0])
        sel.steps.append(label)
    sel.cfg, sel.end, sel.evaluated = current, best, evaluated
    return sel


@dataclass
class BarSelection:
    """The veto tagger's bars chosen on validation notes (``extraction.bar_tuning``), and how they scored there."""

    veto: float  # ner_veto_p_outside
    union: float | None  # ner_union_p_outside (None: no second pass)
    chosen: tuple[float, float, float]  # (objective, precision, recall) at the chosen bars
    configured: tuple[float, float, float]  # ... at the config's bars
    notes: int = 0
    evaluated: int = 0  # bar (pairs) scored

    def text(self) -> str:
        bars = f"ner_veto_p_outside {self.veto:g}" + ("" if self.union is None else f", ner_union_p_outside {self.union:g}")
        (_, p, r), (_, p0, r0) = self.chosen, self.configured
        return (f"{bars} (validation notes {self.notes}: precision {100 * p:.1f}%, recall {100 * r:.1f}%; "
                f"at the config's bars {100 * p0:.1f}% / {100 * r0:.1f}%)")  # fmt: skip


def bar_objective(t: BarTuningConfig, precision: float, recall: float) -> float:
    """``t.objective`` of a precision and a recall: F-beta, or the lower of recall / recall_target and precision /
    precision_target (1 or more when both targets are met)."""
    if t.objective == "f_beta":
        return f_beta(precision, recall, t.beta)
    return min(_target_ratios(t, precision, recall))


def _target_ratios(t: BarTuningConfig, precision: float, recall: float) -> tuple[float, float]:
    """recall / recall_target and precision / precision_target, an undefined (NaN) score counting as 0."""
    p = precision if precision == precision else 0.0
    r = recall if recall == recall else 0.0
    return r / t.recall_target, p / t.precision_target


def select_bars(
    gold: Sequence[Document],
    first: Sequence[Sequence[Entity]],
    second: Sequence[Sequence[Entity]] | None,
    pieces: Sequence[Any],
    tuning: BarTuningConfig,
    configured: tuple[float, float | None],
) -> BarSelection:
    """Every bar of ``tuning.veto_bars`` (with ``second``: every pair with ``tuning.union_bars``) scored on ``gold``'s
    notes, and the best by ``tuning.objective``; a tie goes by ``tuning.tie_break`` (leximin: to the higher other
    ratio of the targets objective, then more spans; more_spans: to the bars that keep more spans), then to the earlier.

    ``first``: the engine's spans before the veto; ``second``: the second pass's (None without one); ``pieces``: the
    tagger's (:meth:`~ctrlgen.extract.presidio.PresidioExtractor.veto_inputs`). ``configured``: the config's bars,
    scored beside them."""
    from ctrlgen.extract.transformer_ner import union_spans, veto_spans

    def scored(veto: float, union: float | None) -> tuple[tuple[float, float, float], int]:
        pred = []
        for i, (d, ents, p) in enumerate(zip(gold, first, pieces, strict=True)):
            kept = veto_spans(ents, p, veto) if second is None or union is None else union_spans(
                ents, second[i], p, veto, union)  # fmt: skip
            pred.append(Document(d.doc_id, d.text, d.metadata, kept))
        s = span_scores(gold, pred)["ALL"]
        return (bar_objective(tuning, s.precision, s.recall), s.precision, s.recall), s.predicted

    unions: list[float | None] = list(tuning.union_bars) if second is not None else [None]
    pairs = [(v, u) for v in tuning.veto_bars for u in unions]
    results = [scored(v, u) for v, u in pairs]

    def other(i: int) -> float:  # leximin's second term: the ratio that is not the lower one
        if tuning.tie_break != "leximin" or tuning.objective != "targets":
            return 0.0
        _, p, r = results[i][0]
        return max(_target_ratios(tuning, p, r))

    best = max(range(len(pairs)), key=lambda i: (results[i][0][0], other(i), results[i][1], -i))
    veto, union = pairs[best]
    return BarSelection(veto, union, results[best][0], scored(*configured)[0], notes=len(gold), evaluated=len(pairs))
