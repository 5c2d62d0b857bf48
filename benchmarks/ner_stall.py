"""The transformer tagger's stall check (``ner_training.min_fit_recall``) and the inner taggers' training length
(``bar_tuning.match_updates``), on the tagger that chose outer fold 1's bars in docs/extraction_veto.md.

That page's run chose each outer fold's veto bars with an inner tagger trained on 2 of 3 inner patient folds of the
training fold, for the fold tagger's 4 epochs. Fold 1's inner tagger ended with losses 305, 80, 78, 75 where the
others reached 14-22. This benchmark takes the same tagger job (``ctrlgen extract-report``'s cache keys, so cached
models are reused) in three trainings, each through ``crossval.train_cached`` (the product's path):

1. **as that run trained it**: 4 epochs, seed 0, no stall check (``min_fit_recall`` 0, ``match_updates`` off);
2. **the check's retry**: the same from seed 1, which is what the check trains after a stall at seed 0 (its second
   attempt is the seed-1 training, byte for byte: tests/unit/test_transformer_ner.py);
3. **as extract-report trains it now**: the epochs matched to the fold tagger's updates (``matched_epochs``), seed
   0, the check on (it retrains from the next seed if this one stalls; the attempts are in the metadata).

Each tagger then tags (argmax) the check's 64 training notes (``fit_notes``, seed 0 for all three) and the inner
held-out notes that choose the bars; a gold span is found when a predicted span overlaps it.

``--bars`` then runs fold 1 of the CV as ``cross_validate`` runs it, once per inner tagger: the fold's rules
chosen in-fold, the bars chosen with that inner tagger on the validation notes (``choose_bars``: the veto alone,
and the veto with the second pass, ``ner_union_p_outside`` 0.2 as in docs/extraction_veto.md), then fold 1's
held-out notes scored by the fold's NER and fold tagger at those bars, and at the config's. Fold 1 is where the
config's bars were chosen, so it is not a fresh test of anything: it shows what the stalled tagger did to the choice.

Writes docs/benchmarks/ner_stall.json and the section "Entity extraction: the transformer tagger's stall check" of
docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone. No note text is written.

    .venv/bin/python benchmarks/ner_stall.py            # ~35 min on 2 cores (two uncached trainings)
    .venv/bin/python benchmarks/ner_stall.py --bars     # and fold 1's bars (+ the fold tagger: ~30 min more)
    .venv/bin/python benchmarks/ner_stall.py --render
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from ner_threshold import PHYSIONET, provenance  # noqa: E402

CONFIG = "configs/extract_physionet_veto.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_stall.json"
TITLE = "Entity extraction: the transformer tagger's stall check"
SECOND_PASS = 0.2  # docs/extraction_veto.md's second pass (--also ... extraction.ner_union_p_outside=0.2)
VETO_BARS = (0.99, 0.999)  # the bars fold 1's veto was chosen from in docs/extraction_veto.md's run of 4279d84
#: (name, overrides of the config): the three trainings of the module's docstring
CASES: list[tuple[str, list[str]]] = [
    ("the fold tagger's epochs, seed 0, no check (docs/extraction_veto.md's run of 4279d84)",
     ["extraction.bar_tuning.match_updates=false", "extraction.ner_veto_training.min_fit_recall=0"]),
    ("the fold tagger's epochs, seed 1, no check (the check's retry)",
     ["extraction.bar_tuning.match_updates=false", "extraction.ner_veto_training.min_fit_recall=0",
      "extraction.ner_veto_training.seed=1"]),
    ("matched updates, seed 0, the check on (extract-report now)", []),
]  # fmt: skip


def _found(tagger: Any, docs: Sequence[Any]) -> dict[str, int]:
    """Gold spans of ``docs`` a span of ``tagger`` overlaps, the gold spans, the spans it predicts, and the gold spans
    it would veto (P(O) >= the bar on every piece: ``span_p_outside``) at each bar of :data:`VETO_BARS`."""
    from ctrlgen.extract.transformer_ner import _gold_spans, overlapped, span_p_outside

    c = {"found": 0, "gold": 0, "predicted": 0, **{f"vetoed_{b:g}": 0 for b in VETO_BARS}}
    for b in range(0, len(docs), 16):
        part = docs[b : b + 16]
        pieces = tagger.piece_logprobs([x.text for x in part])
        for d, p in zip(part, pieces, strict=True):
            pred = tagger.decode(d.text, p)
            spans = _gold_spans(d)
            c["gold"] += len(spans)
            c["predicted"] += len(pred)
            c["found"] += overlapped(spans, pred)
            for s, e, _ in spans:
                po = span_p_outside(p, s, e)
                for bar in VETO_BARS:
                    c[f"vetoed_{bar:g}"] += po is not None and po >= bar
    return c


def fold_bars(config: str, fold: int, docs: Sequence[Any]) -> list[dict[str, Any]]:
    """Fold ``fold`` of the CV of ``config`` as ``cross_validate`` runs it, with the bars chosen by each case's
    inner tagger (and the config's bars), the veto alone and with the second pass: a row each."""
    from ctrlgen.config import load_config
    from ctrlgen.extract.crossval import _bar_jobs, _fold_jobs, _tune, choose_bars, train_cached, veto_training
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.quality import span_scores
    from ctrlgen.extract.report import NER_CACHE

    cfg = load_config(str(ROOT / config))
    ex, cache, base = cfg.extraction.model_copy(update={"setting": "unknown"}), ROOT / NER_CACHE, cfg.nlp.spacy_model
    k, i = ex.ner_training.folds, fold - 1
    job, _, held = _fold_jobs(docs, k, ex, cache, base, "physionet-deid")[i]
    tagger = _fold_jobs(docs, k, ex, cache, base, "physionet-deid", how=veto_training(ex))[i][0]
    inner = _fold_jobs(job.docs, ex.rule_tuning.inner_folds, ex, cache, base, "physionet-deid", within=(i, k))
    train_cached([job, tagger] + [j for j, _, _ in inner], ex.ner_training.workers)
    rules = _tune(inner, ex, "direct+quasi", f"fold {fold}/{k}")
    rows = []
    for union in (None, SECOND_PASS):
        run = rules.cfg.model_copy(update={"ner_model": str(job.out), "ner_veto": str(tagger.out),
                                           "ner_union_p_outside": union, "ner_veto_context": None})  # fmt: skip
        picks: list[tuple[str, float, float | None, Any]] = [
            ("the config's bars", ex.ner_veto_p_outside, union, None)
        ]
        for name, overrides in CASES:
            case = load_config(str(ROOT / config), overrides).extraction.model_copy(update={"setting": "unknown"})
            validation = [(str(n.out), str(t.out), d)
                          for n, t, d in _bar_jobs(job.docs, case, cache, base, "physionet-deid", (i, k))[:1]]  # fmt: skip
            sel = choose_bars(validation, run.model_copy(update={"bar_tuning": case.bar_tuning}), "direct+quasi", name)
            picks.append((name, sel.veto, sel.union, sel))
        for name, veto, second, sel in picks:
            pred = PresidioExtractor(run.model_copy(update={"ner_veto_p_outside": veto, "ner_union_p_outside": second}),
                                     identifiers="direct+quasi")(held)  # fmt: skip
            a = span_scores(held, pred)["ALL"]
            rows.append({
                "bars_of": name, "second_pass": union is not None, "veto": veto, "union": second,
                "validation": None if sel is None else {"precision": sel.chosen[1], "recall": sel.chosen[2],
                                                         "notes": sel.notes},
                "held_out": {"gold": a.gold, "detected": a.detected, "predicted": a.predicted, "correct": a.correct,
                             "notes": len(held)},
            })  # fmt: skip
    return rows


def measure(config: str, fold: int, bars: bool = False) -> dict[str, Any]:
    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _bar_jobs, _fold_jobs, train_cached
    from ctrlgen.extract.ner import META_FILE
    from ctrlgen.extract.report import NER_CACHE
    from ctrlgen.extract.transformer_ner import TransformerTagger, fit_notes

    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    rows = []
    for name, overrides in CASES:
        cfg = load_config(str(ROOT / config), overrides)
        ex = cfg.extraction.model_copy(update={"setting": "unknown"})
        k = ex.ner_training.folds
        outer = _fold_jobs(docs, k, ex, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid")[fold - 1][0]
        _, job, validation = _bar_jobs(outer.docs, ex, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid",
                                       (fold - 1, k))[0]  # fmt: skip
        cached = (job.out / META_FILE).is_file()
        t0 = time.perf_counter()
        print(f"[ner_stall] {name}: {'cached' if cached else 'training'} {job.out.name}", file=sys.stderr, flush=True)
        train_cached([job], 1)
        seconds = time.perf_counter() - t0
        meta = json.loads((job.out / META_FILE).read_text())
        tagger = TransformerTagger(job.out, device="cpu")
        rows.append({
            "name": name, "overrides": overrides, "model": job.out.name, "cached": cached,
            "train_seconds": None if cached else round(seconds, 1), "outer_notes": len(outer.docs),
            "train_notes": len(job.docs), "epochs": meta["epochs"], "updates": meta["trained_on"]["updates"],
            "seed": meta["seed"], "losses": [round(x, 1) for x in meta["losses"]],
            "fit": meta["trained_on"].get("fit"), "cpu": meta.get("cpu", ""),
            "training_notes": _found(tagger, fit_notes(job.docs, 64, 0)),
            "validation_notes": {**_found(tagger, validation), "notes": len(validation)},
        })  # fmt: skip
    return {**provenance("ner_stall.py", ["--bars"] if bars else []), "config": config, "fold": fold,
            "machine": cpu_name(isa=True), "cases": rows,
            **({"fold_bars": fold_bars(config, fold, docs)} if bars else {})}  # fmt: skip


def _pct(c: dict[str, int]) -> str:
    return f"{100 * c['found'] / c['gold']:.1f}% ({c['found']}/{c['gold']})" if c["gold"] else "-"


def report(r: dict[str, Any]) -> str:
    bars = [k.removeprefix("vetoed_") for k in r["cases"][0]["validation_notes"] if k.startswith("vetoed_")]
    rows = [
        "| training | epochs | updates | seed kept | losses by epoch | the check's attempts | training notes: gold "
        "spans found | spans predicted | validation notes: gold spans found | spans predicted | "
        + " | ".join(f"gold spans it would veto at {b}" for b in bars) + " |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(bars),
    ]
    for c in r["cases"]:
        fit, v = c["fit"], c["validation_notes"]
        attempts = "not run" if not fit else "; ".join(  # (found: the recall's count, from its 4 decimals)
            f"seed {a['seed']}: {_pct({'found': a.get('found', round(a['recall'] * fit['spans'])), 'gold': fit['spans']})}"
            for a in fit["attempts"]
        )  # fmt: skip
        rows.append(
            f"| {c['name']} | {c['epochs']} | {c['updates']} | {c['seed']} | {', '.join(f'{x:g}' for x in c['losses'])}"
            f" | {attempts} | {_pct(c['training_notes'])} | {c['training_notes']['predicted']} | {_pct(v)} | "
            f"{v['predicted']} | " + " | ".join(f"{v['vetoed_' + b]}/{v['gold']}" for b in bars) + " |"
        )
    first = r["cases"][0]
    trained = [c for c in r["cases"] if c["train_seconds"] is not None]
    return (
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/{JSON.name}). Machine: "
        f"{r['machine']}. The veto tagger (`{r['config']}`'s `ner_veto_training`) that chooses outer fold "
        f"{r['fold']}'s bars in `ctrlgen extract-report`'s CV (`extraction.bar_tuning`): trained on "
        f"{first['train_notes']} of the fold's {first['outer_notes']} training notes (2 of 3 inner patient folds), "
        f"scored on the other inner fold's {first['validation_notes']['notes']} notes (the validation notes that "
        "choose the bars) and on the stall check's 64 training notes (`fit_notes`, seed 0). Argmax decoding; a gold "
        "span is found when a predicted span overlaps it, and would be vetoed at a bar when the tagger gives P(O) >= "
        "the bar on every word piece of it (`span_p_outside`). Each training runs through `crossval.train_cached` "
        "under extract-report's cache keys"
        + (f" ({', '.join(str(round(c['train_seconds'])) + ' s' for c in trained)} for the uncached ones)"
           if trained else "")
        + ". The stall check (`ner_training.min_fit_recall`, 0.5 by default) reads the training notes' first "
        "column on every transformer training and trains again from the next seed when it is under the bar.\n\n"
        + "\n".join(rows) + "\n" + _bars_report(r)
    )


def _bars_report(r: dict[str, Any]) -> str:
    if "fold_bars" not in r:
        return ""
    rows = ["| engine | bars chosen by | ner_veto_p_outside | ner_union_p_outside | validation recall % | "
            "validation precision % | fold held-out recall % | precision % |", "|---|---|---|---|---|---|---|---|"]
    for b in r["fold_bars"]:
        v, h = b["validation"], b["held_out"]
        rows.append(
            f"| {'veto + second pass' if b['second_pass'] else 'veto'} | {b['bars_of']} | {b['veto']:g} | "
            + (f"{b['union']:g}" if b["union"] is not None else "-") + " | "
            + (f"{100 * v['recall']:.1f} | {100 * v['precision']:.1f}" if v else "- | -")
            + f" | {100 * h['detected'] / h['gold']:.1f} ({h['detected']}/{h['gold']}) | "
            f"{100 * h['correct'] / h['predicted']:.1f} |"
        )
    n = r["fold_bars"][0]["held_out"]["notes"]
    return (
        f"\n`--bars`: fold {r['fold']} of the CV as `cross_validate` runs it ({n} held-out notes; its rules chosen "
        "in-fold, its NER and fold tagger trained on the other folds), with the bars each inner tagger above chooses "
        "on the validation notes (`choose_bars`, objective as configured), and with the config's. The second pass "
        f"at ner_union_p_outside {SECOND_PASS} as docs/extraction_veto.md's. Fold {r['fold']} is where the config's "
        "bars were chosen: not a fresh test, but what the stalled tagger did to the choice.\n\n"
        + "\n".join(rows) + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bars", action="store_true", help="and fold 1's bars chosen by each inner tagger")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure(CONFIG, 1, args.bars))


if __name__ == "__main__":
    main()
