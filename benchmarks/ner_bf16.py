"""The transformer NER trained under bf16 autocast (``ner_training.bf16``): step time and spans (issue 41).

Every question about the transformer NER's training (its length, its features, a filter after it) costs a
cross-validation: five taggers of ~17 min each on 2 cores at 4 epochs. Under bf16 autocast the encoder's products
run in bf16 on CPUs with AVX-512 BF16 or AMX (the weights, gradients and AdamW's state stay float32). This script
measures, in one run:

1. the training step's time, float32 against bf16 autocast: the configured classifier (MiniLM + a BIO head) on the
   same real batches (windows of fold ``--fold``'s training notes, the config's batch size and window length), one
   thread, the two interleaved over 3 rounds of ``--steps`` steps each (forward, backward, clipping, AdamW), best
   round of each;
2. what the taggers find: the configured tagger of fold ``--fold`` trained in float32 and under bf16 autocast (or
   taken from ``.cache/ner``), each scored on the fold's held-out notes, alone and with the frozen rules
   (benchmarks/ner_casing.py's ``measure``).

Rule, fixed before the first measurement: bf16 training is fit if, on the fold's notes, its engine (NER + rules)
finds at least float32's gold spans less one at a precision no more than one point lower, and its NER alone's
recall is no more than one point lower. Fit or not, the config's own tagger stays float32 (the figures of
docs/extraction_transformer.md are float32's) until a whole cross-validation under bf16 is reported; a fit result
says the cheaper training may stand in for float32's in the benchmarks' one-fold trials.

Writes docs/benchmarks/ner_bf16.json and the section "Entity extraction: the transformer NER trained under bf16
autocast" of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_bf16.py            # fold 1: ~15 min on 2 cores (its float32 tagger cached)
    .venv/bin/python benchmarks/ner_bf16.py --render
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
from ner_casing import measure as measure_variants  # noqa: E402
from ner_threshold import CONFIG, PHYSIONET, _pct, _pr, _sum  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "ner_bf16.json"
TITLE = "Entity extraction: the transformer NER trained under bf16 autocast"
VARIANTS = {"float32 (the config)": [], "bf16 autocast": ["extraction.ner_training.bf16=true"]}


def step_times(fold: int, steps: int, overrides: list[str]) -> dict[str, Any]:
    """Seconds per training step (best round of 3), float32 and bf16 autocast, on the same batches."""
    import copy

    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from ctrlgen.assets import offline_env, sentence_encoder_dir
    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs
    from ctrlgen.extract.report import NER_CACHE
    from ctrlgen.extract.transformer_ner import BIO, _gold_spans, optimizer, token_labels, train_step, windows

    offline_env()
    cfg = load_config(str(ROOT / CONFIG), overrides)
    h = cfg.extraction.ner_training
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    job = _fold_jobs(docs, h.folds, cfg.extraction, ROOT / NER_CACHE, cfg.nlp.spacy_model, "physionet-deid")[fold - 1][0]
    base = sentence_encoder_dir(h.encoder)
    tok = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    train = [d for d in job.docs if _gold_spans(d)]
    wins = windows(tok, [d.text for d in train], h.max_length, h.stride)
    # (ids, BIO labels, word shapes): the configured tagger has no word-shape embedding, so no shapes
    rows = [(w.ids, token_labels(w.offsets, _gold_spans(train[w.doc])), []) for w in wins][: steps * h.batch_size]
    batches = [rows[i : i + h.batch_size] for i in range(0, len(rows), h.batch_size)]
    pad = tok.pad_token_id or 0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model0 = AutoModelForTokenClassification.from_pretrained(str(base), local_files_only=True, num_labels=len(BIO))
    times: dict[str, list[float]] = {"float32": [], "bf16 autocast": []}
    for _ in range(3):
        for name in times:
            model = copy.deepcopy(model0).train()
            params = list(model.parameters())
            # train-ner's own optimizer, schedule and step (ctrlgen/extract/transformer_ner.py), padding included
            opt, sched = optimizer(params, h.learning_rate, len(batches))
            t0 = time.perf_counter()
            for batch in batches:
                train_step(model, None, params, opt, sched, batch, pad, bf16=name != "float32")
            times[name].append((time.perf_counter() - t0) / len(batches))
            print(f"[ner_bf16] {name}: {times[name][-1]:.3f} s/step", file=sys.stderr, flush=True)
    return {"steps": len(batches), "batch_size": h.batch_size, "max_length": h.max_length,
            "seconds_per_step": {k: [round(x, 4) for x in v] for k, v in times.items()}}  # fmt: skip


def measure(fold: int, steps: int, overrides: list[str]) -> dict[str, Any]:
    import torch

    from ctrlgen.extract.ner import META_FILE
    from ctrlgen.extract.report import NER_CACHE

    timing = step_times(fold, steps, overrides)
    r = measure_variants([fold], [None], overrides, VARIANTS, "ner_bf16.py")
    for per_fold in r["variants"].values():
        for f in per_fold:
            meta = json.loads((ROOT / NER_CACHE / f["model"] / META_FILE).read_text())
            f["train_seconds"], f["train_threads"] = meta.get("seconds"), meta["trained_on"].get("torch_threads")
            f["train_cpu"] = meta.get("cpu")  # (recorded since 2026-12-03; a tagger trained before says none)
    r["command"] = " ".join(
        [".venv/bin/python benchmarks/ner_bf16.py", *(["--fold", str(fold)] if fold != 1 else []),
         *(["--steps", str(steps)] if steps != 20 else []), *overrides]
    )  # fmt: skip
    return {**r, "cpu": cpu_name(isa=True), "torch": torch.__version__, "timing": timing}


def _scores(r: dict[str, Any], variant: str, engine: str) -> Any:
    return _sum([f["by"][f"{engine}|argmax"] for f in r["variants"][variant]]).get("ALL")


def fit(r: dict[str, Any]) -> bool:
    """The rule fixed before measuring (module docstring)."""
    a32, a16 = _scores(r, "float32 (the config)", "NER alone"), _scores(r, "bf16 autocast", "NER alone")
    e32, e16 = _scores(r, "float32 (the config)", "NER + rules"), _scores(r, "bf16 autocast", "NER + rules")
    return e16.detected >= e32.detected - 1 and e16.precision >= e32.precision - 0.01 and a16.recall >= a32.recall - 0.01


def report(r: dict[str, Any]) -> str:
    t = r["timing"]
    best = {k: min(v) for k, v in t["seconds_per_step"].items()}
    fold = r["folds"][0]
    notes = r["variants"]["float32 (the config)"][0]["notes"]
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_bf16.json). "
        f"{r['cpu']}, torch {r['torch']}; the tagger of `{r['config']}`; rules frozen (digest `{r['rules_digest']}`).",
        "",
        f"Training step, one thread, {t['steps']} steps of {t['batch_size']} windows of up to {t['max_length']} word "
        f"pieces (fold {fold}'s training notes), train-ner's own step (`transformer_ner.train_step`: padding, forward, "
        "backward, clipping, AdamW with its schedule), best of 3 interleaved rounds:",
        "",
        "| training | s / step | rounds (s / step) | vs float32 |",
        "|---|---|---|---|",
    ]
    for k, v in t["seconds_per_step"].items():
        lines.append(f"| {k} | {best[k]:.3f} | {' / '.join(f'{x:.3f}' for x in v)} | {best['float32'] / best[k]:.2f}x |")
    lines += [
        "",
        f"The taggers of fold {fold} (trained on the other folds' patients), scored on its {notes} held-out notes, "
        "decoded at argmax:",
        "",
        "| tagger | engine | recall % | precision % | found / gold | predicted | training (min, threads, CPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, per_fold in r["variants"].items():
        f = per_fold[0]
        when = "-" if f.get("train_seconds") is None else f"{f['train_seconds'] / 60:.1f}, {f['train_threads']}"
        when += f", {f['train_cpu']}" if f.get("train_cpu") else ", CPU not recorded" if when != "-" else ""
        for engine in ("NER alone", "NER + rules"):
            s = _scores(r, name, engine)
            rec, prec = _pr(s)
            lines.append(f"| {name} | {engine} | {_pct(rec)} | {_pct(prec)} | {s.detected} / {s.gold} "
                         f"| {s.predicted} | {when} |")  # fmt: skip
    models = "; ".join(f"{name}: `{per_fold[0]['model']}`" for name, per_fold in r["variants"].items())
    lines += [
        "",
        f"Fit by the rule fixed before measuring (the engine finds at least float32's gold spans less one, precision "
        f"at most one point lower, the NER alone's recall at most one point lower): **{'yes' if fit(r) else 'no'}**. "
        "The config's tagger stays float32 either way (a whole cross-validation under bf16 is not reported). "
        f"Models (`.cache/ner`): {models}; their training times come from their own runs (other conditions: "
        "compare the step times above, not them). bf16 training is fast only on CPUs with AVX-512 BF16 or AMX (it runs on the CPU); "
        "a run on another CPU replaces this one (git keeps the earlier ones).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fold", type=int, default=1, help="the patient fold (1-based)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per timing round")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("overrides", nargs="*", help="config overrides for both taggers, key=value")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure(args.fold, args.steps, args.overrides))


if __name__ == "__main__":
    main()
