"""The spaCy NER's capacity and training, by patient-level CV folds (issue 41): recall and precision of the NER
alone and of the engine with its rules (frozen), and the engine's speed, for each variant of ``VARIANTS``.

The configured NER (``configs/extract_physionet_ner.yaml``: a fresh tok2vec of width 64, depth 2, 12 epochs)
reaches 67.4% recall alone by patient-level CV (docs/extraction.md): the engine's recall rests on the rules. The
variants change only ``extraction.ner_training`` (capacity, epochs, notes without spans per epoch, or
en_core_web_sm's own NER fine-tuned: a tok2vec pretrained on OntoNotes). For each fold of ``--folds``, every
variant's model is trained on the other folds' patients (the cache keys of ``ctrlgen extract-report``: a fold model
either trains is the other's), the fold's held-out notes are extracted by the NER alone and by the engine with the
configured rules (rules frozen, no in-fold selection), and each engine's speed on them is timed on one core.

**Protocol.** Fold 1 is the choice fold (as for the transformer's settings, benchmarks/ner_threshold.py): the
variant is chosen there by a rule fixed before measuring, the highest F2 of the engine (recall weighs 4x: every
guarantee of ICL + blocking rests on it) among variants whose engine speed there is at least ``MIN_SPEED`` of the
configured engine's. Its figures on the other folds are the out-of-sample comparison; a variant chosen on folds
it is measured on would be chosen on its test notes.

Writes docs/benchmarks/ner_spacy.json and the section "Entity extraction: the spaCy NER's capacity and training"
of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_spacy.py                    # fold 1, every variant (~40 min on 2 cores)
    .venv/bin/python benchmarks/ner_spacy.py --folds 1,2,3,4,5  # the whole CV (~3 h on 2 cores uncached)
    .venv/bin/python benchmarks/ner_spacy.py --render
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from ner_threshold import PHYSIONET, _pct, _pr, _scores, _sum, provenance  # noqa: E402

CONFIG = "configs/extract_physionet_ner.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_spacy.json"
TITLE = "Entity extraction: the spaCy NER's capacity and training"
#: name -> overrides of ``extraction.ner_training`` (the first: the config as it is)
VARIANTS: dict[str, list[str]] = {
    "configured: width 64, depth 2, 12 epochs": [],
    "width 64, depth 2, 24 epochs": ["epochs=24"],
    "width 64, depth 2, 24 epochs, negatives 0.1": ["epochs=24", "negatives=0.1"],
    "width 96, depth 4, 16 epochs": ["width=96", "depth=4", "epochs=16"],
    "en_core_web_sm's NER fine-tuned, 12 epochs": ["width=null", "epochs=12"],
}
CHOOSE_ON = 1
BETA = 2.0
MIN_SPEED = 0.75  # of the configured engine's notes/s on the choice fold: the Ray job's 100 notes/s per core


def _fbeta(s: Any, beta: float = BETA) -> float:
    r, p = s.recall, s.precision
    return 0.0 if not r or not p else (1 + beta**2) * p * r / (beta**2 * p + r)


def measure(folds: list[int], names: list[str], overrides: list[str]) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.report import NER_CACHE, _ner_alone, rules_digest

    exs = {}
    for name in names:
        extra = [f"extraction.ner_training.{o}" for o in VARIANTS[name]]
        cfg = load_config(str(ROOT / CONFIG), [*overrides, *extra])
        ex = cfg.extraction.model_copy(update={"setting": "unknown"})
        exs[name] = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    spacy_model = cfg.nlp.spacy_model
    workers = cfg.extraction.ner_training.workers
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    outer = {
        name: _fold_jobs(docs, ex.ner_training.folds, ex, ROOT / NER_CACHE, spacy_model, "physionet-deid")
        for name, ex in exs.items()
    }
    jobs = [(name, f) for f in folds for name in names]
    t0 = time.perf_counter()
    trained = train_cached([outer[name][f - 1][0] for name, f in jobs], workers)
    train_s = time.perf_counter() - t0
    model_of = dict(zip(jobs, trained, strict=True))
    result: dict[str, Any] = {}
    for name, ex in exs.items():
        per_fold = []
        for f in folds:
            _, patients, gold = outer[name][f - 1]
            model = model_of[(name, f)]
            fold: dict[str, Any] = {"fold": f, "patients": len(patients), "notes": len(gold),
                                    "model": Path(model).name, "by": {}, "notes_per_s": {}}  # fmt: skip
            for engine, ecfg in (("NER alone", _ner_alone(ex)), ("NER + rules", ex)):
                ext = PresidioExtractor(ecfg.model_copy(update={"ner_model": model}), spacy_model, "direct+quasi")
                # one core, as a Ray actor of 1 CPU runs it (Ray sets its OMP_NUM_THREADS to 1): numpy's OpenBLAS,
                # which runs the NER's matrix products, would otherwise take every core
                with threadpool_limits(1):
                    ext(gold[:8])  # warm: models loaded, first calls made
                    t1 = time.perf_counter()
                    pred = ext(gold)
                    secs = time.perf_counter() - t1
                fold["by"][engine] = _scores(gold, pred)
                fold["notes_per_s"][engine] = round(len(gold) / secs, 1)
                print(f"[ner_spacy] {name}, fold {f}, {engine}: {len(gold) / secs:.1f} notes/s", file=sys.stderr,
                      flush=True)  # fmt: skip
            per_fold.append(fold)
        result[name] = per_fold
    args = [*(["--folds", ",".join(map(str, folds))] if folds != [CHOOSE_ON] else []), *overrides]
    return {
        **provenance("ner_spacy.py", args),
        "config": CONFIG,
        "rules_digest": rules_digest(),
        "folds": folds,
        "variants": {name: {"overrides": VARIANTS[name], "folds": result[name]} for name in names},
        "train_seconds": round(train_s, 1),
        "cpu": cpu_name(),
        "blas_threads": 1,
    }


def choose(r: dict[str, Any]) -> str | None:
    """The rule fixed before measuring: on the choice fold, the engine's highest F2 among variants whose engine runs
    at >= MIN_SPEED of the configured one's notes/s there (the configured variant on a tie); None without fold 1."""
    on = {name: next((f for f in v["folds"] if f["fold"] == CHOOSE_ON), None) for name, v in r["variants"].items()}
    if any(f is None for f in on.values()):
        return None
    first = next(iter(on))
    base_speed = on[first]["notes_per_s"]["NER + rules"]
    ok = [n for n, f in on.items() if f["notes_per_s"]["NER + rules"] >= MIN_SPEED * base_speed]
    f2 = {n: _fbeta(_sum([on[n]["by"]["NER + rules"]])["ALL"]) for n in ok}
    return max(ok, key=lambda n: (round(f2[n], 6), n == first))


def _rows(r: dict[str, Any], folds: list[int]) -> list[str]:
    out = []
    for name, v in r["variants"].items():
        per = [f for f in v["folds"] if f["fold"] in folds]
        if not per:
            continue
        for engine in ("NER alone", "NER + rules"):
            s = _sum([f["by"][engine] for f in per])
            rec, prec = _pr(s.get("ALL"))
            cats = " | ".join(_pct(_pr(s.get(c))[0]) for c in ("PERSON", "LOC", "DATETIME", "CODE"))
            notes = sum(f["notes"] for f in per)
            secs = sum(f["notes"] / f["notes_per_s"][engine] for f in per)
            f2 = _fbeta(s["ALL"])
            out.append(f"| {name} | {engine} | {_pct(rec)} | {_pct(prec)} | {f2:.3f} | {cats} | {notes / secs:.1f} |")
    return out


_HEAD = [
    "| NER | engine | recall % | precision % | F2 | PERSON recall % | LOC recall % | DATETIME recall % "
    "| CODE recall % | notes/s (one core) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def _commands(r: dict[str, Any]) -> str:
    runs = r.get("runs") or [{"date": r["date"], "command": r["command"]}]
    if len(runs) == 1:
        return f"Command: `{runs[0]['command']}`"
    return "Commands, one run each, their folds merged: " + "; ".join(f"`{x['command']}` ({x['date']})" for x in runs)


def report(r: dict[str, Any]) -> str:
    folds = r["folds"]
    chosen = choose(r)
    lines = [
        f"{_commands(r)} (`--render` rewrites this section from docs/benchmarks/ner_spacy.json). The NER of "
        f"`{r['config']}` and variants of its `ner_training` (the only difference), each trained on the other folds' "
        f"patients (the fold models of `ctrlgen extract-report`) and scored on the held-out fold's notes: the NER alone "
        f"(no hand-written recognizer, veto or mention propagation) and the engine with the configured rules, frozen "
        f"(digest `{r['rules_digest']}`, no in-fold selection). Speed: the held-out notes per second of extraction in "
        f"this process on one core ({r['cpu']}; numpy's OpenBLAS on one thread), models loaded; each table's rows ran in one run, the tables in "
        f"different runs (compare speeds within a table).",
        "",
    ]
    if chosen is not None:
        rest = [f for f in folds if f != CHOOSE_ON]
        lines += [
            f"**Chosen on fold {CHOOSE_ON}'s notes only** (rule fixed before measuring: the engine's highest F2, "
            f"beta {BETA:g}, among variants whose engine runs at >= {MIN_SPEED:.0%} of the configured one's "
            f"speed there): **{chosen}**.",
            "",
            f"Fold {CHOOSE_ON} (the choice fold):",
            "",
            *_HEAD,
            *_rows(r, [CHOOSE_ON]),
        ]
        if rest:
            lines += [
                "",
                f"Folds {', '.join(map(str, rest))} (pooled; no note of theirs chose anything):",
                "",
                *_HEAD,
                *_rows(r, rest),
            ]
    else:
        lines += [f"Folds {', '.join(map(str, folds))} (pooled):", "", *_HEAD, *_rows(r, folds)]
    lines += [
        "",
        "Variants (`extraction.ner_training` overrides): "
        + "; ".join(f"{n}: `{' '.join(v['overrides']) or 'as configured'}`" for n, v in r["variants"].items())
        + f". Training took {r['train_seconds'] / 60:.1f} min on 2 processes over the runs (0 when cached). Targets "
        "(issue 41, by patient-level CV): the NER alone >= 95% recall; the engine >= 98.5% recall, >= 85% "
        "precision; the Ray job >= 100 notes/s per core.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folds", default=str(CHOOSE_ON), help="comma-separated patient folds (1-based)")
    ap.add_argument("--variants", default="", help="comma-separated indices into VARIANTS (0-based; default all)")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("overrides", nargs="*", help="config overrides for every variant, key=value")
    args = ap.parse_args()
    measured = None
    if not args.render:
        folds = [int(f) for f in args.folds.split(",") if f.strip()]
        names = list(VARIANTS)
        if args.variants:
            names = [names[int(i)] for i in args.variants.split(",")]
            if names[0] != next(iter(VARIANTS)):
                names.insert(0, next(iter(VARIANTS)))  # the configured NER: the reference of every comparison
        measured = merge(json.loads(JSON.read_text()) if JSON.is_file() else None, measure(folds, names, args.overrides))
    publish(TITLE, JSON, report, measured)


def merge(before: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A run's folds added to the saved JSON's (a fold measured again replaces its earlier figures), when both
    measured the same config and rules; otherwise the new run alone. Each run's command is kept in ``runs``."""
    if not before or before.get("rules_digest") != new["rules_digest"] or before.get("config") != new["config"]:
        return {**new, "runs": [{"date": new["date"], "command": new["command"]}]}
    variants = {n: dict(v, folds=list(v["folds"])) for n, v in before["variants"].items()}
    for name, v in new["variants"].items():
        kept = [f for f in variants.get(name, {"folds": []})["folds"] if f["fold"] not in new["folds"]]
        variants[name] = {"overrides": v["overrides"], "folds": sorted([*kept, *v["folds"]], key=lambda f: f["fold"])}
    folds = sorted({f["fold"] for v in variants.values() for f in v["folds"]})
    runs = [*before.get("runs", [{"date": before["date"], "command": before["command"]}]),
            {"date": new["date"], "command": new["command"]}]  # fmt: skip
    return {**new, "folds": folds, "variants": variants, "runs": runs,
            "train_seconds": round(before.get("train_seconds", 0) + new["train_seconds"], 1)}  # fmt: skip


if __name__ == "__main__":
    main()
