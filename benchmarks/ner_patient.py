"""Names and places spread over all the notes of a patient, not only within a note: the configured engine with and
without it, by patient-level CV on the PhysioNet notes (issue 41).

The engine already spreads a name or place it found once to its other occurrences in the same note
(``extraction.propagate_mentions``). A patient's notes share names (the patient's, the relatives', the doctors') and
places; a value found in one of them is likely private in the others too. ``propagate_across_notes``
(ctrlgen/extract/presidio.py) spreads the words of every PERSON or LOC entity the engine found in any note of a patient
to that patient's other notes, by the same word rules (3+ letters, not a common word, only where no entity is).

**Protocol, fixed before any figure was seen** (issue 41's frozen-rule protocol: the rule was written from a
general convention of clinical records, not from this corpus' errors, and is measured once): the configured engine
(``configs/extract_physionet_ner.yaml``, rules frozen: no in-fold selection) extracts each fold's held-out notes
with the NER trained on the other folds' patients (the cache keys of ``ctrlgen extract-report``); the same
predictions are then spread over each patient's notes (a fold holds all notes of its patients, so nothing crosses
folds). The rule is adopted (a config flag, the Ray job grouping notes by patient) only if the pooled F2 (beta 2,
``rule_tuning.beta``) over all 5 folds is higher with it. Recall by gold type is listed beside the deid tool's
(docs/extraction.md) for the issue's per-type target.

Writes docs/benchmarks/ner_patient.json and the section "Entity extraction: names and places spread over a
patient's notes" of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_patient.py          # ~10 min on 2 cores when the fold models are not cached
    .venv/bin/python benchmarks/ner_patient.py --render
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402
from ner_threshold import PHYSIONET, _pct, _scores, _sum, provenance  # noqa: E402

CONFIG = "configs/extract_physionet_ner.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_patient.json"
TITLE = "Entity extraction: names and places spread over a patient's notes"
BETA = 2.0
VARIANTS = ("configured engine", "spread over the patient's notes")


def _by_type(gold: Sequence[Any], pred: Sequence[Any]) -> dict[str, list[int]]:
    """Per gold type (the corpus' own labels): [found, gold], a gold span found when a prediction overlaps it."""
    out: dict[str, list[int]] = {}
    for g, p in zip(gold, pred, strict=True):
        spans = [(e.start, e.end) for e in p.entities]
        for e in g.entities:
            row = out.setdefault(e.label or e.category, [0, 0])
            row[1] += 1
            row[0] += any(s < e.end and e.start < t for s, t in spans)
    return out


def measure() -> dict[str, Any]:
    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.presidio import PresidioExtractor, propagate_across_notes
    from ctrlgen.extract.report import NER_CACHE, rules_digest

    cfg = load_config(str(ROOT / CONFIG))
    ex = cfg.extraction.model_copy(update={"setting": "unknown"})
    ex = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    t0 = time.perf_counter()
    outer = _fold_jobs(docs, ex.ner_training.folds, ex, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid")
    models = train_cached([job for job, _, _ in outer], ex.ner_training.workers)
    train_s = time.perf_counter() - t0
    folds: list[dict[str, Any]] = []
    for i, ((_, patients, gold), model) in enumerate(zip(outer, models, strict=True)):
        ext = PresidioExtractor(ex.model_copy(update={"ner_model": model}), cfg.nlp.spacy_model, "direct+quasi")
        t1 = time.perf_counter()
        pred = ext(gold)
        t2 = time.perf_counter()
        spread = propagate_across_notes(pred, ext._common)
        t3 = time.perf_counter()
        folds.append({
            "patients": len(patients), "notes": len(gold), "model": Path(model).name,
            "seconds": {VARIANTS[0]: round(t2 - t1, 2), VARIANTS[1]: round(t3 - t2, 2)},
            "by": {VARIANTS[0]: _scores(gold, pred), VARIANTS[1]: _scores(gold, spread)},
            "types": {VARIANTS[0]: _by_type(gold, pred), VARIANTS[1]: _by_type(gold, spread)},
        })  # fmt: skip
        print(f"[ner_patient] fold {i + 1} scored", file=sys.stderr, flush=True)
    return {
        **provenance("ner_patient.py", []),
        "config": CONFIG,
        "rules_digest": rules_digest(),
        "train_seconds": round(train_s, 1),
        "folds": folds,
    }


def _types(r: dict[str, Any], variant: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in r["folds"]:
        for t, (found, gold) in f["types"][variant].items():
            row = out.setdefault(t, [0, 0])
            row[0] += found
            row[1] += gold
    return out


def report(r: dict[str, Any]) -> str:
    pooled = {v: _sum([f["by"][v] for f in r["folds"]])["ALL"] for v in VARIANTS}
    from ctrlgen.extract.rules import f_beta

    f2 = {v: f_beta(pooled[v].precision, pooled[v].recall, BETA) for v in VARIANTS}
    adopted = f2[VARIANTS[1]] > f2[VARIANTS[0]]
    notes = sum(f["notes"] for f in r["folds"])
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_patient.json). "
        f"The configured engine ({r['config']}, rules frozen at digest `{r['rules_digest']}`: no in-fold selection) "
        f"by patient-level CV, each fold's held-out notes extracted by the NER trained on the other folds' patients; "
        "then the same predictions with the words of every PERSON or LOC entity found in any note of a patient "
        "marked in that patient's other notes too (`propagate_across_notes`, the within-note rule's word tests). "
        "**Rule fixed before the run:** adopted only if the pooled F2 (beta 2) is higher with it. "
        f"{notes:,} notes, {len(r['folds'])} folds pooled; spreading took "
        f"{sum(f['seconds'][VARIANTS[1]] for f in r['folds']):.1f} s over all notes.",
        "",
        "| engine | recall % | precision % | F2 | found / gold | predicted |",
        "|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        a = pooled[v]
        lines.append(f"| {v} | {_pct(a.recall)} | {_pct(a.precision)} | {f2[v]:.3f} | {a.detected} / {a.gold} | "
                     f"{a.predicted} |")  # fmt: skip
    types = {v: _types(r, v) for v in VARIANTS}
    lines += ["", "Recall by gold type (found / gold):", "", "| gold type | " + " | ".join(VARIANTS) + " |",
              "|---|---|---|"]  # fmt: skip
    for t in sorted(types[VARIANTS[0]], key=lambda t: -types[VARIANTS[0]][t][1]):
        cells = [f"{types[v][t][0]} / {types[v][t][1]} ({100 * types[v][t][0] / types[v][t][1]:.1f}%)"
                 for v in VARIANTS]  # fmt: skip
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    per = [f"{i + 1}: {_pct(_sum([f['by'][v]])['ALL'].recall)} / {_pct(_sum([f['by'][v]])['ALL'].precision)}"
           for v in VARIANTS[1:] for i, f in enumerate(r["folds"])]  # fmt: skip
    lines += [
        "",
        f"Per fold with the spread (recall / precision %): {'; '.join(per)}. The spread added "
        f"{pooled[VARIANTS[1]].predicted - pooled[VARIANTS[0]].predicted} predicted spans, "
        f"{pooled[VARIANTS[1]].detected - pooled[VARIANTS[0]].detected} more gold spans found.",
        "",
        f"**{'Adopted' if adopted else 'Not adopted'}** by the rule: F2 {f2[VARIANTS[0]]:.3f} configured, "
        f"{f2[VARIANTS[1]]:.3f} with the spread.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure())


if __name__ == "__main__":
    main()
