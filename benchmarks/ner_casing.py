"""Word-shape features for the uncased encoder of the transformer NER (issue 41), by patient-level CV folds.

The MiniLM encoder of ``configs/extract_physionet_transformer.yaml`` is uncased: its tokenizer lowercases every
note, so the capitals that mark most names in a clinical note never reach it. ``ner_training.case_features``
adds a learned embedding of each word piece's word shape (lower, Title, UPPER, a capital, digits, other) to its
input embedding. This script trains, for each fold of ``--folds``, the configured tagger and the same tagger with
case features (in one run, side by side), tags the fold's held-out notes with both, and scores the NER alone and
the NER with the configured rules (frozen) at the decodings of ``--bars``.

The default, fold 1 only, is the fold on which the config's epochs and learning rate were chosen (and
benchmarks/ner_threshold.py's bar): a choice made there does not see folds 2-5. ``--folds 1,2,3,4,5`` gives the
whole cross-validation (~3 h on 2 cores).

Writes docs/benchmarks/ner_casing.json and the section "Entity extraction: word-shape features for the uncased
transformer NER" of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_casing.py              # fold 1: ~35 min on 2 cores
    .venv/bin/python benchmarks/ner_casing.py --render
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402
from ner_threshold import CONFIG, PHYSIONET, _bar_name, _pct, _pr, _sum, provenance, score_fold  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "ner_casing.json"
TITLE = "Entity extraction: word-shape features for the uncased transformer NER"
VARIANTS = {"uncased (the config)": [], "case features": ["extraction.ner_training.case_features=true"]}


def measure(
    folds: list[int],
    bars: list[float | None],
    overrides: list[str],
    variants: dict[str, list[str]] = VARIANTS,
    script: str = "ner_casing.py",
) -> dict[str, Any]:
    """Each variant's tagger (the config with its overrides) trained on each fold's other patients, side by side,
    and scored on the fold's held-out notes (NER alone, NER + the frozen rules) at each bar."""
    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.report import NER_CACHE, _ner_alone, rules_digest

    exs = {}
    for name, extra in variants.items():
        cfg = load_config(str(ROOT / CONFIG), [*overrides, *extra])
        ex = cfg.extraction.model_copy(update={"setting": "unknown"})
        exs[name] = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    spacy_model = cfg.nlp.spacy_model
    workers = max(cfg.extraction.ner_training.workers, 2)  # the two taggers train side by side
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    outer = {
        name: _fold_jobs(docs, ex.ner_training.folds, ex, ROOT / NER_CACHE, spacy_model, "physionet-deid")
        for name, ex in exs.items()
    }
    jobs = [(name, f) for f in folds for name in variants]
    t0 = time.perf_counter()
    trained = train_cached([outer[name][f - 1][0] for name, f in jobs], workers)
    train_s = time.perf_counter() - t0
    model_of = dict(zip(jobs, trained, strict=True))
    result: dict[str, Any] = {}
    for name, ex in exs.items():
        engines = {"NER alone": _ner_alone(ex), "NER + rules": ex}
        per_fold = []
        for f in folds:
            _, patients, gold = outer[name][f - 1]
            fold: dict[str, Any] = {"fold": f, "patients": len(patients), "notes": len(gold),
                                    "model": Path(model_of[(name, f)]).name}  # fmt: skip
            fold["by"] = score_fold(
                engines, model_of[(name, f)], gold, bars, spacy_model, f"ner_casing, {name}, fold {f}"
            )
            per_fold.append(fold)
        result[name] = per_fold
    return {
        **provenance(script, [*(["--folds", ",".join(map(str, folds))] if folds != [1] else []), *overrides]),
        "config": CONFIG,
        "rules_digest": rules_digest(),
        "folds": folds,
        "bars": [_bar_name(b) for b in bars],
        "variants": result,
        "train_seconds": round(train_s, 1),
    }


def report(r: dict[str, Any]) -> str:
    folds = r["folds"]
    notes = sum(f["notes"] for f in next(iter(r["variants"].values())))
    which = f"fold {folds[0]}" if len(folds) == 1 else f"folds {', '.join(map(str, folds))} (pooled)"
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_casing.json). "
        f"The tagger of `{r['config']}` trained on the other folds' patients, without and with "
        f"`ner_training.case_features` (the only difference), both trained in this run; scored on {which}'s "
        f"held-out notes ({notes} notes). The rules are frozen (digest `{r['rules_digest']}`). A bar t: a word "
        f"piece with P(O) < t takes its most probable entity tag; `argmax`: its most probable tag.",
        "",
        "| tagger | engine | bar | recall % | precision % | PERSON recall % | LOC recall % | DATETIME recall % "
        "| CODE recall % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per_fold in r["variants"].items():
        for engine in ("NER alone", "NER + rules"):
            for b in r["bars"]:
                s = _sum([f["by"][f"{engine}|{b}"] for f in per_fold])
                rec, prec = _pr(s.get("ALL"))
                cats = " | ".join(_pct(_pr(s.get(c))[0]) for c in ("PERSON", "LOC", "DATETIME", "CODE"))
                lines.append(f"| {name} | {engine} | {b} | {_pct(rec)} | {_pct(prec)} | {cats} |")
    models = {name: ", ".join(f["model"] for f in per_fold) for name, per_fold in r["variants"].items()}
    lines += [
        "",
        "Models (`.cache/ner`): " + "; ".join(f"{name}: `{m}`" for name, m in models.items()) + ". "
        f"Trained in this run in {r['train_seconds'] / 60:.1f} min (0 when cached). Targets (issue 41, by "
        "patient-level CV): NER alone recall >= 95%; the engine recall >= 98.5% and precision >= 85%.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folds", default="1", help="comma-separated patient folds to train and score (1-based)")
    ap.add_argument("--bars", default="argmax,0.9", help="decodings: 'argmax' or a bar on P(O)")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("overrides", nargs="*", help="config overrides for both taggers, key=value")
    args = ap.parse_args()
    measured = None
    if not args.render:
        folds = [int(f) for f in args.folds.split(",") if f.strip()]
        bars = [None if b.strip() == "argmax" else float(b) for b in args.bars.split(",") if b.strip()]
        measured = measure(folds, bars, args.overrides)
    publish(TITLE, JSON, report, measured)


if __name__ == "__main__":
    main()
