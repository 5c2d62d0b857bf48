"""The transformer NER's training length (``extraction.ner_training.epochs``), chosen on fold 1 and reported on
folds 2-5 of the patient-level cross-validation on the PhysioNet notes (issue 41).

The configured 4 epochs were chosen on fold 1 against 3 epochs (at another learning rate and batch size); longer
training was never tried. Inner taggers of fold 1 hinted that it may pay: on fold 1's 1,438 training notes, the
engine with 6-epoch inner taggers reached 98.9 recall / 75.2 precision at argmax (F2 0.930), against 96.5 / 79.2
(F2 0.924) with 4-epoch ones (docs/benchmarks.md, "the transformer span filter, inner taggers trained for the
outer tagger's steps"). So, with the rule fixed before any 6-epoch tagger was scored:

1. For each of ``--epochs`` (default 4, the configured, and 6) the patient-fold models of
   ``configs/extract_physionet_transformer.yaml`` at that many epochs, all else as configured, are trained or
   taken from ``.cache/ner`` (the same cache keys as ``ctrlgen extract-report`` and benchmarks/ner_threshold.py).
2. Each fold's held-out notes are tagged once per model and decoded at every bar of ``--bars``, through the NER
   alone and the NER with the configured rules (frozen).
3. **The epochs are chosen on fold 1's notes only**: those whose engine (NER + rules, argmax) has the higher F2
   there (beta 2, ``rule_tuning.beta``); a tie keeps the configured epochs. Folds 2-5 are trained for a chosen
   length other than the configured one only then (``--folds 1`` runs the choice alone), and their figures, both
   lengths side by side, are the out-of-sample result. For each length, benchmarks/ner_threshold.py's bar rule
   (chosen on fold 1 too) is applied as well.
4. The spaCy engine (``configs/extract_physionet_ner.yaml``: its fold NERs, cached, the rules frozen as here) is
   scored on the same notes beside them.

Writes docs/benchmarks/ner_epochs.json and the section "Entity extraction: the transformer NER's training length"
of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_epochs.py --folds 1     # the choice: ~10 min when fold 1's models are cached
    .venv/bin/python benchmarks/ner_epochs.py --folds 1,2   # the choice and fold 2 (a part: the others "not run yet")
    .venv/bin/python benchmarks/ner_epochs.py               # every fold: ~35 min per uncached fold model alone
    .venv/bin/python benchmarks/ner_epochs.py --render
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
from ner_threshold import BARS, PHYSIONET, TARGET_ALONE, _bar_name, _pct, _pr, _scores, _sum, provenance, score_fold  # noqa: E402

CONFIG = "configs/extract_physionet_transformer.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_epochs.json"
SPACY_CONFIG = "configs/extract_physionet_ner.yaml"
TITLE = "Entity extraction: the transformer NER's training length"
EPOCHS = (4, 6)
CHOOSE_ON = 0  # fold 1
ENGINE, ALONE = "NER + rules", "NER alone"


def measure(
    config: str, epochs: Sequence[int], folds: Sequence[int] | None, bars: Sequence[float | None],
    overrides: Sequence[str] = (), spacy_config: str = SPACY_CONFIG,
) -> dict[str, Any]:  # fmt: skip
    """``folds``: the outer folds to score (1-based; None: every fold)."""
    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.report import NER_CACHE, _ner_alone, rules_digest

    base = load_config(str(ROOT / config), list(overrides))
    if base.extraction.ner_training.kind != "transformer":
        raise SystemExit(f"{config}: extraction.ner_training.kind is not transformer")
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    runs: dict[str, Any] = {str(n): {"train_seconds": 0.0, "folds": []} for n in epochs}
    k = base.extraction.ner_training.folds
    picked = list(range(k)) if folds is None else [f - 1 for f in folds]
    if any(not 0 <= i < k for i in picked):
        raise SystemExit(f"--folds: folds are 1..{k}")
    if CHOOSE_ON not in picked:
        raise SystemExit(f"--folds: the choice needs fold {CHOOSE_ON + 1}")

    def run(n: int, which: Sequence[int]) -> None:
        """Train (or take from the cache) and score ``n`` epochs' models of the folds ``which`` (0-based)."""
        cfg = load_config(str(ROOT / config), [*overrides, f"extraction.ner_training.epochs={n}"])
        ex = cfg.extraction.model_copy(update={"setting": "unknown"})
        ex = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
        outer = _fold_jobs(docs, k, ex, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid")
        t0 = time.perf_counter()
        models = train_cached([outer[i][0] for i in which], ex.ner_training.workers)
        runs[str(n)]["train_seconds"] += round(time.perf_counter() - t0, 1)
        engines = {ALONE: _ner_alone(ex), ENGINE: ex}
        for i, model in zip(which, models, strict=True):
            _, patients, gold = outer[i]
            by = score_fold(engines, model, gold, bars, cfg.nlp.spacy_model, f"ner_epochs, {n} epochs, fold {i + 1}")
            runs[str(n)]["folds"].append({"fold": i + 1, "patients": len(patients), "notes": len(gold),
                                          "model": Path(model).name, "by": by,
                                          "held_out": sorted(patients)})  # fmt: skip

    conf = base.extraction.ner_training.epochs
    head = {"configured_epochs": conf, "beta": base.extraction.rule_tuning.beta, "chosen_on_fold": CHOOSE_ON + 1,
            "epochs": list(epochs), "runs": runs}  # fmt: skip
    for n in epochs:  # the choice first: the other folds train only for the configured and chosen lengths
        run(n, [CHOOSE_ON])
    chosen = choose(head)
    print(f"[ner_epochs] chosen on fold {CHOOSE_ON + 1}: {chosen} epochs", file=sys.stderr, flush=True)
    rest = [i for i in picked if i != CHOOSE_ON]
    if rest:
        for n in epochs if chosen is None else dict.fromkeys([chosen, conf]):  # the chosen length's models first
            run(n, rest)
    sp = spacy_engine(spacy_config, docs, picked, k)
    held = {f["fold"]: f.pop("patients") for f in sp["folds"]}
    if any(held[f["fold"]] != f["held_out"] for r in runs.values() for f in r["folds"]):
        raise SystemExit(f"{spacy_config}: its folds are not {config}'s patients")
    for r in runs.values():
        for f in r["folds"]:
            del f["held_out"]
    args = [*(["--config", config] if config != CONFIG else [])]
    args += [] if spacy_config == SPACY_CONFIG else ["--spacy-config", spacy_config]
    args += [] if list(epochs) == list(EPOCHS) else ["--epochs", ",".join(map(str, epochs))]
    args += [] if folds is None else ["--folds", ",".join(map(str, folds))]
    return {
        **provenance("ner_epochs.py", [*args, *overrides]),
        "config": config,
        **head,
        "rules_digest": rules_digest(),
        "bars": [_bar_name(b) for b in bars],
        "k": k,
        "spacy": sp,
    }


def spacy_engine(config: str, docs: Sequence[Any], which: Sequence[int], k: int) -> dict[str, Any]:
    """The spaCy engine of ``config`` (its fold NERs, trained or cached; the rules frozen, as the transformer's) on
    the held-out notes of the folds ``which`` (0-based): per fold, the counts and the held-out patients."""
    from ctrlgen.config import load_config
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.report import NER_CACHE

    cfg = load_config(str(ROOT / config))
    ex = cfg.extraction.model_copy(update={"setting": "unknown"})
    ex = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    if ex.ner_training.kind != "spacy" or ex.ner_training.folds != k:
        raise SystemExit(f"{config}: not a spaCy NER of {k} folds")
    outer = _fold_jobs(docs, k, ex, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid")
    models = train_cached([outer[i][0] for i in which], ex.ner_training.workers)
    folds = []
    for i, model in zip(which, models, strict=True):
        _, patients, gold = outer[i]
        ext = PresidioExtractor(ex.model_copy(update={"ner_model": model}), cfg.nlp.spacy_model, "direct+quasi")
        folds.append(
            {"fold": i + 1, "patients": sorted(patients), "model": Path(model).name, "by": _scores(gold, ext(gold))}
        )
        print(f"[ner_epochs] spaCy engine, fold {i + 1}", file=sys.stderr, flush=True)
    return {"config": config, "folds": folds}


def _fbeta(s: Any, beta: float) -> float:
    from ctrlgen.extract.rules import f_beta

    return float("nan") if s is None else f_beta(s.precision, s.recall, beta)


def _fold(r: dict[str, Any], n: int | str, fold: int) -> dict[str, Any] | None:
    return next((f for f in r["runs"][str(n)]["folds"] if f["fold"] == fold), None)


def choose(r: dict[str, Any]) -> int | None:
    """The rule fixed before measuring: on the choice fold's notes, the epochs whose engine (argmax) has the higher
    F-beta; a tie (or a length without that fold) keeps the configured epochs. None without the configured length's
    choice-fold figures."""
    c = r["chosen_on_fold"]
    at = {n: _fold(r, n, c) for n in r["epochs"]}
    if at.get(r["configured_epochs"]) is None:
        return None
    f = {n: _fbeta(_sum([a["by"][f"{ENGINE}|argmax"]]).get("ALL"), r["beta"]) for n, a in at.items() if a}
    best = max(f.values())
    return r["configured_epochs"] if f[r["configured_epochs"]] >= best - 1e-12 else max(f, key=lambda n: f[n])


def choose_bar(r: dict[str, Any], n: int) -> str | None:
    """benchmarks/ner_threshold.py's rule on the choice fold, for ``n`` epochs: the lowest bar whose NER-alone recall
    there is >= 0.95, else the bar of the highest NER-alone recall there (the lower bar on a tie)."""
    a = _fold(r, n, r["chosen_on_fold"])
    if a is None:
        return None
    recall = {b: _pr(_sum([a["by"][f"{ALONE}|{b}"]]).get("ALL"))[0] for b in r["bars"]}
    reaching = [b for b in r["bars"] if recall[b] >= TARGET_ALONE]
    return reaching[0] if reaching else max(r["bars"], key=lambda b: (recall[b], -r["bars"].index(b)))


def _row(label: str, parts: Sequence[dict[str, Any]], beta: float) -> str:
    s = _sum(parts)
    rec, prec = _pr(s.get("ALL"))
    f = _fbeta(s.get("ALL"), beta)
    cats = " | ".join(_pct(_pr(s.get(c))[0]) for c in ("PERSON", "LOC", "DATETIME", "CODE"))
    return f"| {label} | {_pct(rec)} | {_pct(prec)} | {'-' if f != f else f'{f:.3f}'} | {cats} |"


def _table(r: dict[str, Any], folds: Sequence[int]) -> list[str]:
    """Rows of each length (both engines; argmax and that length's bar chosen on fold 1), then the spaCy engine, on
    ``folds`` pooled; a length without every one of them is left out."""
    head = ["| epochs, engine, decoding | recall % | precision % | F2 | PERSON recall % | LOC recall % | "
            "DATETIME recall % | CODE recall % |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines = list(head)
    for n in r["epochs"]:
        got = [_fold(r, n, f) for f in folds]
        if any(g is None for g in got):
            continue
        bar = choose_bar(r, n)
        for engine in (ALONE, ENGINE):
            for b in dict.fromkeys(["argmax", *([bar] if bar else [])]):
                lines.append(_row(f"{n}, {engine}, {b}", [g["by"][f"{engine}|{b}"] for g in got if g], r["beta"]))
    sp = {f["fold"]: f["by"] for f in r["spacy"]["folds"]}
    if all(f in sp for f in folds):
        lines.append(_row(f"spaCy engine (`{r['spacy']['config']}`), NER + rules", [sp[f] for f in folds], r["beta"]))
    return lines if len(lines) > len(head) else []


def report(r: dict[str, Any]) -> str:
    c, k, conf = r["chosen_on_fold"], r["k"], r["configured_epochs"]
    chosen = choose(r)
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_epochs.json). "
        f"The patient-fold models of `{r['config']}` trained for each of {', '.join(map(str, r['epochs']))} epochs, "
        f"all else as configured ({conf} epochs), the rules frozen (digest `{r['rules_digest']}`); each fold's notes "
        f"tagged once per model and decoded at argmax and at the bar benchmarks/ner_threshold.py's rule picks on "
        f"fold {c} for that length. F2: F-beta with beta {r['beta']:g}.",
        "",
        f"**The rule, fixed before any longer-trained tagger was scored:** on fold {c}'s notes only, the length whose "
        f"engine (NER + rules, argmax) has the higher F2; a tie keeps the configured {conf}. Folds other than {c} are "
        f"trained for it only if it is not the configured length.",
        "",
        f"Fold {c} (the choice; {(_fold(r, conf, c) or {}).get('notes', '-')} notes):",
        "",
        *_table(r, [c]),
        "",
        f"**Chosen: {chosen if chosen is not None else '-'} epochs.**",
    ]
    others = [f for f in range(1, k + 1) if f != c]
    rest = [f for f in others if all(_fold(r, n, f) for n in dict.fromkeys([conf, chosen]) if n is not None)]
    table = _table(r, rest) if rest else []
    if table:
        notes = sum((_fold(r, conf, f) or {}).get("notes", 0) for f in rest)
        which = f"Folds {', '.join(map(str, rest))}" if len(rest) > 1 else f"Fold {rest[0]}"
        lines += ["", f"{which} ({notes} notes, none of which chose anything){', pooled' if len(rest) > 1 else ''}:",
                  "", *table]  # fmt: skip
    missing = [f for f in others if f not in rest]
    if missing and chosen not in (None, conf):
        lines += ["", f"Fold{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: not run yet."]
    train = ", ".join(f"{n} epochs {r['runs'][str(n)]['train_seconds'] / 60:.1f} min" for n in r["epochs"])
    lines += [
        "",
        f"Targets (issue 41, by patient-level CV): the engine recall >= 98.5% and precision >= 85%; the NER alone "
        f"recall >= 95%. Fold models trained in this run: {train} (0 when cached).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--epochs", default=",".join(map(str, EPOCHS)), help="comma-separated training lengths")
    ap.add_argument("--spacy-config", default=SPACY_CONFIG, help="the spaCy engine scored beside, rules frozen")
    ap.add_argument("--folds", help="comma-separated outer folds to score (1-based; default every fold)")
    ap.add_argument("--bars", default=",".join(_bar_name(b) for b in BARS),
                    help="comma-separated bars on P(O); 'argmax' for the default decoding")  # fmt: skip
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    measured = None
    if not args.render:
        bars = [None if b.strip() == "argmax" else float(b) for b in args.bars.split(",") if b.strip()]
        epochs = [int(e) for e in args.epochs.split(",") if e.strip()]
        folds = [int(f) for f in args.folds.split(",")] if args.folds else None
        if "argmax" not in [_bar_name(b) for b in bars]:
            raise SystemExit("--bars: the choice needs argmax")
        measured = measure(args.config, epochs, folds, bars, args.overrides, args.spacy_config)
    publish(TITLE, JSON, report, measured)


if __name__ == "__main__":
    main()
