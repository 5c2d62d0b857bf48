"""How many inner validation folds choose the bars (``extraction.bar_tuning.validation_folds``: 1 or 3) in the
patient-level cross-validation of ``configs/extract_physionet_veto.yaml``'s two engines (the veto; the veto with the
second pass), issue 41.

Why: each outer fold's bars are chosen on one inner patient fold of ~400 notes, scored by an inner NER and tagger
trained on the other two; the choice moves from fold to fold (docs/extraction_veto.md's bars tables). With 3, every
note of the training fold scores the bars, each by inner models that did not see its patient: 2 more inner taggers
per outer fold (the inner NERs are the rule selection's, cached).

**The rule, set at 15:44 UTC on 2026-12-07 at the launch of the run that trained the extra inner taggers, before any
had finished**: adopt validation_folds 3 in configs/extract_physionet.yaml and configs/extract_physionet_veto.yaml only
if, pooled over the 5 outer folds, both engines reach a higher targets objective, min(recall / 0.985, precision /
0.85), than with 1 validation fold, and find no fewer gold spans. Otherwise 1 stays. Both settings run here on the
same cached models and folds (``ctrlgen extract-report``'s cache keys; the rules chosen in-fold), so the rows at 1 are
docs/extraction_veto.md's CV rows.

Writes docs/benchmarks/bar_validation_folds.json and the section ``TITLE`` of docs/benchmarks.md; ``--render``
rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/bar_validation_folds.py
    .venv/bin/python benchmarks/bar_validation_folds.py --render
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from bar_tie_break import CONFIG, ENGINES, cv_runs  # noqa: E402
from ner_threshold import provenance  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "bar_validation_folds.json"
TITLE = "Entity extraction: how many inner folds choose the bars"
VALUES = ("1", "3")
RULE = "set at 15:44 UTC on 2026-12-07, at the launch of the run that trained the extra inner taggers"


def measure() -> dict[str, Any]:
    runs = cv_runs("validation_folds", VALUES)
    return {**provenance("bar_validation_folds.py", []), "config": CONFIG, "machine": cpu_name(), "runs": runs}


def report(r: dict[str, Any]) -> str:
    from ctrlgen.config import BarTuningConfig
    from ctrlgen.extract.rules import bar_objective

    targets = BarTuningConfig(objective="targets")  # the defaults the configs keep: recall 0.985, precision 0.85

    def objective(run: dict[str, Any]) -> float:
        return bar_objective(targets, run["correct"] / run["predicted"], run["found"] / run["gold"])

    rows = ["| engine | validation folds | found / gold | recall % | predicted | precision % | objective | "
            "bars per fold (veto / union) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in r["runs"]:
        bars = "; ".join(f"{f['fold']}: {f['veto_bar']:g}" + (f" / {f['union_bar']:g}" if f["union_bar"] is not None
                                                               else "") for f in run["folds"])  # fmt: skip
        rows.append(f"| {run['label']} | {run['validation_folds']} | {run['found']} / {run['gold']} | "
                    f"{100 * run['found'] / run['gold']:.1f} | {run['predicted']} | "
                    f"{100 * run['correct'] / run['predicted']:.1f} | {objective(run):.4f} | {bars} |")  # fmt: skip
    by = {(run["engine"], run["validation_folds"]): run for run in r["runs"]}
    ok = all(objective(by[k, "3"]) > objective(by[k, "1"]) and by[k, "3"]["found"] >= by[k, "1"]["found"]
             for k, _, _ in ENGINES)  # fmt: skip
    verdict = "**adopted**: the configs choose their bars on 3 inner folds." if ok else (
        "**not adopted**: the configs keep 1 inner fold.")  # fmt: skip
    return (
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/{JSON.name}). Machine: "
        f"{r['machine']}. `{r['config']}`'s two engines by `ctrlgen extract-report`'s patient-level 5-fold CV (the "
        "same cached fold and inner models, the rules chosen in-fold, the bars chosen in-fold by "
        "`extraction.bar_tuning`'s targets objective) with the bars chosen on 1 or on 3 of each training fold's 3 "
        "inner patient folds (`extraction.bar_tuning.validation_folds`). The objective is min(recall / 0.985, "
        "precision / 0.85). A gold span is found when a predicted span overlaps it.\n\n"
        "Pooled over the 5 folds:\n\n"
        + "\n".join(rows)
        + f"\n\nThe rule ({RULE}): adopt 3 only if, for both engines, the objective is higher and no fewer gold "
        f"spans are found. {verdict}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    if args.render:
        if not JSON.is_file():
            raise SystemExit(f"{JSON} does not exist: run the benchmark first")
        publish(TITLE, JSON, report, None)
        return
    publish(TITLE, JSON, report, measure())


if __name__ == "__main__":
    main()
