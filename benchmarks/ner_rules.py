"""The engine's rules chosen on one fold for issue 41's two targets at once (issue 41).

benchmarks/rules_ceiling.py shows that the rules as configured leave a perfect NER at most ~85.5% precision: the
precision target needs rules that predict fewer false spans. ``extraction.rule_tuning`` chooses which rules run
inside each training fold by F2 (beta 2: recall weighs four times precision), which keeps the rules that bring
recall whatever their false spans. The transformer NER finds more by itself (93% recall alone against the spaCy
NER's 68.5%), so with it some rules may cost more precision than the recall they add. Here the choice is made on
held-out notes for the targets themselves.

**Protocol, fixed before the fold models were trained or any figure seen:**

1. The 5 patient-fold taggers of ``configs/extract_physionet_transformer.yaml`` (as configured: 4 epochs, argmax
   decoding), trained or taken from ``.cache/ner`` under ``ctrlgen extract-report``'s keys; then the same for the
   configured engine, ``configs/extract_physionet_ner.yaml`` and its spaCy fold NERs. Each fold's held-out
   notes are analysed once (every recognizer's results, the tagger's included); each rule configuration is then
   scored from that analysis and the engine's own post-processing (``ctrlgen.extract.rules``' scoring path).
2. **Chosen on fold 1's notes only** (scored by the tagger trained without their patients), by the greedy
   backward elimination of ``extraction.rule_tuning`` (one recognizer off, a veto, propagation or initials off,
   or another score threshold per step, from the configured rules), under two objectives:
   - **F2** (beta 2): the configured in-fold objective (``ctrlgen.extract.rules.select_rules``);
   - **both targets**: the lower of recall / 0.985 and precision / 0.85 (the worse of the two as a share of its
     target; 1 or more when both are met), the objective the issue's targets define.
3. The chosen rule sets run on folds 2-5 (pooled; no note of theirs chose anything), beside the configured rules.
4. One more row, *not* chosen on fold 1: the configured rules without ``DictionaryRecognizer``, the recognizer that
   rules_ceiling.py (over all notes, folds 2-5 included) found behind most false spans. It is named from an
   in-sample look, so its folds 2-5 figure is a diagnostic, not an out-of-sample result.

Writes docs/benchmarks/ner_rules.json and the section "Entity extraction: the rules chosen for both targets" of
docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_rules.py            # ~95 min on 2 cores when the fold taggers are not cached
    .venv/bin/python benchmarks/ner_rules.py --render
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402
from ner_threshold import _pct, _scores, _sum, frozen_fold_models, provenance  # noqa: E402

#: The engines, each with its NER's kind: the transformer (the NER that finds most by itself), then the configured one.
CONFIGS = {"configs/extract_physionet_transformer.yaml": "transformer", "configs/extract_physionet_ner.yaml": "spacy"}
JSON = ROOT / "docs" / "benchmarks" / "ner_rules.json"
TITLE = "Entity extraction: the rules chosen for both targets"
TARGET_R, TARGET_P, BETA = 0.985, 0.85, 2.0
CHOOSE_ON = 0  # fold 1
CONFIGURED, DICT_OFF = "configured rules", "configured rules without DictionaryRecognizer (in-sample diagnostic)"


def both_targets(precision: float, recall: float) -> float:
    """The lower of recall / 0.985 and precision / 0.85: 1 or more when both targets are met (bar_tuning's
    ``targets`` objective at its default targets)."""
    from ctrlgen.config import BarTuningConfig
    from ctrlgen.extract.rules import bar_objective

    return bar_objective(BarTuningConfig(), precision, recall)


def select_for(
    notes: Sequence[Any], cfg: Any, finish: Callable[..., Any], objective: str, thresholds: Sequence[float]
) -> Any:
    """:func:`ctrlgen.extract.rules.select_rules` (the in-fold selection's own elimination) scoring each
    configuration by ``objective``: "F2", or "both targets" (:func:`both_targets` in place of its F-beta)."""
    from unittest import mock

    from ctrlgen.extract import rules

    if objective == "F2":
        return rules.select_rules(notes, cfg, finish, beta=BETA, thresholds=thresholds)
    with mock.patch.object(rules, "f_beta", lambda p, r, _beta: both_targets(p, r)):
        return rules.select_rules(notes, cfg, finish, beta=BETA, thresholds=thresholds)


def _run(notes: Sequence[Any], c: Any, finish: Callable[..., Any]) -> list[Any]:
    from ctrlgen.extract.rules import analysis_under
    from ctrlgen.schema import Document

    return [
        Document(a.gold.doc_id, a.gold.text, a.gold.metadata, finish(a.gold.text, analysis_under(a.results, c), c))
        for a in notes
    ]


def measure_engine(config: str, kind: str, overrides: Sequence[str] = (), limit: int | None = None) -> dict[str, Any]:
    """One engine's fold NERs, its rule sets chosen on fold 1 and every fold's scores under each."""
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.rules import Analysed

    cfg, ex, outer, models, train_s = frozen_fold_models(config, kind, overrides, limit)
    analysed, finish = [], None
    for i, ((_, _patients, gold), model) in enumerate(zip(outer, models, strict=True)):
        ext = PresidioExtractor(ex.model_copy(update={"ner_model": model}), cfg.nlp.spacy_model, "direct+quasi")
        t0 = time.perf_counter()
        raw = ext.recognizer_results([d.text for d in gold])
        analysed.append([Analysed(d, r) for d, r in zip(gold, raw, strict=True)])
        finish = ext.finish  # the post-processing depends on the configuration passed, not on the fold's model
        print(f"[ner_rules] {kind}: fold {i + 1} analysed in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    assert finish is not None
    t = ex.rule_tuning
    chosen = {o: select_for(analysed[CHOOSE_ON], ex, finish, o, t.thresholds) for o in ("F2", "both targets")}
    rule_sets = {
        CONFIGURED: (ex, []),
        **{f"chosen on fold {CHOOSE_ON + 1} by {o}": (sel.cfg, sel.steps) for o, sel in chosen.items()},
        DICT_OFF: (ex.model_copy(update={"recognizers": [r for r in ex.recognizers if r != "DictionaryRecognizer"]}),
                   ["-DictionaryRecognizer"]),
    }  # fmt: skip
    folds = []
    for i, notes in enumerate(analysed):
        gold = [a.gold for a in notes]
        folds.append({
            "notes": len(notes), "model": Path(models[i]).name,
            "by": {name: _scores(gold, _run(notes, c, finish)) for name, (c, _) in rule_sets.items()},
        })  # fmt: skip
    return {
        "steps": {name: steps for name, (_, steps) in rule_sets.items()},
        "train_seconds": round(train_s, 1),
        "folds": folds,
    }


def measure(overrides: Sequence[str] = (), limit: int | None = None) -> dict[str, Any]:
    from ctrlgen.extract.report import rules_digest

    return {
        **provenance("ner_rules.py", list(overrides)),
        "rules_digest": rules_digest(),
        "chosen_on_fold": CHOOSE_ON + 1,
        "engines": {config: measure_engine(config, kind, overrides, limit) for config, kind in CONFIGS.items()},
    }


def _row(name: str, s: Any) -> str:
    from ctrlgen.extract.rules import f_beta

    met = s.recall >= TARGET_R and s.precision >= TARGET_P
    return (
        f"| {name} | {_pct(s.recall)} | {_pct(s.precision)} | {f_beta(s.precision, s.recall, BETA):.3f} | "
        f"{both_targets(s.precision, s.recall):.3f} | {s.detected} / {s.gold} | {s.predicted} | "
        f"{'yes' if met else 'no'} |"
    )


def _engine(config: str, e: dict[str, Any], k: int) -> list[str]:
    names = list(e["steps"])
    rest = [f for i, f in enumerate(e["folds"]) if i != k]
    header = [
        "| rules | recall % | precision % | F2 | both targets (min of R/0.985, P/0.85) | found / gold | predicted "
        "| both targets met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    steps = "; ".join(f"{n}: {', '.join(s) if s else 'no change'}" for n, s in e["steps"].items() if n != CONFIGURED)
    lines = [
        f"### `{config}`",
        "",
        f"Chosen: {steps}.",
        "",
        f"Fold {k + 1} (the choice; {e['folds'][k]['notes']} notes):",
        "",
        *header,
        *(_row(n, _sum([e["folds"][k]["by"][n]])["ALL"]) for n in names),
        "",
        f"Folds {', '.join(str(i + 1) for i in range(len(e['folds'])) if i != k)} "
        f"({sum(f['notes'] for f in rest):,} notes, none of which chose anything), pooled:",
        "",
        *header,
        *(_row(n, _sum([f["by"][n] for f in rest])["ALL"]) for n in names),
        "",
        "Per category on those notes (recall / precision %):",
        "",
        "| rules | PERSON | LOC | DATETIME | CODE |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        s = _sum([f["by"][n] for f in rest])
        cells = [f"{_pct(s[c].recall)} / {_pct(s[c].precision)}" if c in s else "-" for c in ("PERSON", "LOC",
                 "DATETIME", "CODE")]  # fmt: skip
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Fold NERs: {', '.join(f['model'] for f in e['folds'])} (`.cache/ner`; trained in this run in "
        f"{e['train_seconds'] / 60:.1f} min, 0 when all were cached).",
        "",
    ]
    return lines


def report(r: dict[str, Any]) -> str:
    k = r["chosen_on_fold"] - 1
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_rules.json). For each "
        "engine below, its patient-fold NERs (the keys of `ctrlgen extract-report`; the transformer decoded at "
        f"argmax, as configured), the rules frozen at digest `{r['rules_digest']}` and then chosen **on fold "
        f"{k + 1}'s held-out notes only** by the greedy backward elimination of `extraction.rule_tuning` (one "
        "recognizer, veto, propagation or initials off, or another threshold per step) under two objectives fixed "
        "before the run: F2 (beta 2, the configured in-fold objective) and **both targets** (the lower of recall / "
        "0.985 and precision / 0.85). The chosen sets then run on the other folds' notes, which chose nothing. The "
        f"last row of each table is not chosen on fold {k + 1}: the configured rules without DictionaryRecognizer, "
        "named from benchmarks/rules_ceiling.py's in-sample look at all notes (a diagnostic, not an out-of-sample "
        f"figure). Targets (issue 41, by patient-level CV): recall >= {100 * TARGET_R:.1f}%, precision >= "
        f"{100 * TARGET_P:.0f}%.",
        "",
    ]
    for config, e in r["engines"].items():
        lines += _engine(config, e, k)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("--limit", type=int, help="the first N notes only (a smoke run: JSON to /tmp, no section)")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value (with --limit: a smoke run)")
    args = ap.parse_args()
    measured = None if args.render else measure(args.overrides, args.limit)
    publish(TITLE, JSON, report, measured, smoke=bool(args.limit))


if __name__ == "__main__":
    main()
