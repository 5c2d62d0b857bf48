"""The veto of ``configs/extract_physionet_veto.yaml`` reading only its spans' neighbourhoods
(``extraction.ner_veto_context``) against reading whole notes: quality on every outer fold of the patient-level
cross-validation on the PhysioNet notes, and speed on one thread (issue 41, items 2 and 3).

The whole-note veto meets the precision target (docs/extraction_veto.md: 97.2 / 85.6 by patient-level CV, bars
chosen in-fold) but runs ~10 notes/s on one core: its tagger reads every word piece of every note (245 on average
here), while the veto needs the tagger's P(O) only on the pieces of the engine's spans (under one per note). With
``ner_veto_context`` C the tagger reads each span's pieces and C pieces each side (windows of nearby spans merged), so
its cost follows the spans; its P(O) is read with less context, so its decisions may differ.

The rule (fixed at 23:20 UTC on 2026-12-05, before any fold tagger of that run was trained and before any
local-window figure existed; C = 16 chosen from the encoder's time per window on one thread, 45.7 / 18.4 / 9.0 / 5.8
ms for 256 / 128 / 64 / 40 pieces, so that the tagger's share fits the job's 100 notes/s beside the spaCy engine):
adopt C = 16 as the veto engine's way to run only if, on folds 2-5 pooled at the config's bar (fold 1 is where the
bar was chosen), its recall is no lower than the whole-note veto's, its precision is at least 85.0%, and the spaCy
engine with it runs at least 100 notes/s on one thread (fold 1's held-out notes, best of 2 passes, models warmed).
C = 32 and 64 are shown for information; no rule reads them.

Each fold's spaCy NER and veto tagger are ``ctrlgen extract-report``'s (the same cache keys; trained through
``crossval.train_cached`` when missing: ~4 min per spaCy fold NER, two at a time, ~15 min per tagger on 2 cores). The
rules are the config's, frozen (no in-fold selection), the veto's bar the config's, no second pass; the engine runs
once per fold and each variant's pieces feed :func:`~ctrlgen.extract.transformer_ner.veto_spans`.

Writes docs/benchmarks/ner_veto_local.json and the section ``TITLE`` of docs/benchmarks.md; ``--render`` rewrites the
section from the JSON alone.

    .venv/bin/python benchmarks/ner_veto_local.py            # ~10 min with every model cached
    .venv/bin/python benchmarks/ner_veto_local.py --render
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from ner_threshold import provenance  # noqa: E402
from ner_veto_members import _cell, _counts, veto_fold_models  # noqa: E402

CONFIG = "configs/extract_physionet_veto.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_veto_local.json"
TITLE = "Entity extraction: the veto on its spans' neighbourhoods"
CONTEXTS = (16, 32, 64)  # ner_veto_context values; the rule reads RULE_CONTEXT only
RULE_CONTEXT = 16
RULE = "fixed at 23:20 UTC on 2026-12-05, before any fold tagger of the run was trained"
DECIDING = (2, 3, 4, 5)  # fold 1: where the config's bar was chosen
SPEED_FOLD = 1
TARGET_SPEED = 100.0  # the unknown-setting job's notes/s per core (issue 41, item 3)
PRECISION_TARGET = 85.0
ENGINE, WHOLE = "no veto", "whole notes"


def _local(c: int) -> str:
    return f"{c} pieces each side"


def _pool(r: dict[str, Any], name: str, folds: Sequence[int]) -> dict[str, int]:
    rows = [f[name] for f in r["folds"] if f["fold"] in folds]
    return {k: sum(x[k] for x in rows) for k in ("gold", "detected", "predicted", "correct")}


def _read(wins: Sequence[Any]) -> int:
    return sum(len(w.ids) for w in wins)


def score_fold(pe: Any, held: Sequence[Any], bar: float) -> dict[str, Any]:
    """Fold's held-out notes through the engine ``pe`` once, then its veto with each variant's word pieces."""
    from ctrlgen.extract.transformer_ner import veto_spans, windows

    texts = [d.text for d in held]
    engine = pe.engine_spans(texts)
    tagger = pe._veto
    spans = [[(e.start, e.end) for e in ents] for ents in engine]
    out = {ENGINE: {**_counts(held, engine), "pieces_read": 0, "windows": 0}}
    wins = windows(tagger.tokenizer, texts, tagger.max_length, tagger.stride)
    variants = {WHOLE: (tagger.window_logprobs(texts, wins), wins)}
    for c in CONTEXTS:  # what span_logprobs reads, built once for the encoder and the count
        wins = tagger.span_windows(texts, spans, c)
        variants[_local(c)] = (tagger.window_logprobs(texts, wins), wins)
    for name, (pieces, wins) in variants.items():
        kept = [veto_spans(e, p, bar) for e, p in zip(engine, pieces, strict=True)]
        out[name] = {**_counts(held, kept), "pieces_read": _read(wins), "windows": len(wins)}
    return out


def speed(ex: Any, spacy: str, ner: str, tagger: str, held: list[Any], passes: int = 2) -> dict[str, Any]:
    """The spaCy engine on ``held``, one thread (a Ray actor of 1 CPU), without the veto, with it on whole notes and
    with it on each context: notes/s and spans, through ``PresidioExtractor`` (the product's path)."""
    import torch
    from veto_gpu import best_pass

    from ctrlgen.extract.presidio import PresidioExtractor

    torch.set_num_threads(1)
    runs = {ENGINE: {"ner_model": ner, "ner_veto": None, "ner_veto_context": None},
            WHOLE: {"ner_model": ner, "ner_veto": tagger, "ner_veto_context": None}}  # fmt: skip
    runs.update({_local(c): {"ner_model": ner, "ner_veto": tagger, "ner_veto_context": c} for c in CONTEXTS})
    out: dict[str, Any] = {"notes": len(held), "passes": passes}
    for name, update in runs.items():
        best, got = best_pass(PresidioExtractor(ex.model_copy(update=update), spacy, "direct+quasi"), held, passes)
        out[name] = {"notes_per_s": round(len(held) / best, 1), "spans": sum(len(d.entities) for d in got)}
        print(f"[ner_veto_local] speed, {name}: {out[name]['notes_per_s']} notes/s", file=sys.stderr, flush=True)
    return out


def measure(config: str) -> dict[str, Any]:
    from ctrlgen.extract.presidio import PresidioExtractor

    base, ex, folds, by_member = veto_fold_models(config, [("as configured", [])])
    ex = ex.model_copy(update={"ner_union_p_outside": None})  # the veto alone: no second pass
    k, spacy, taggers = ex.ner_training.folds, base.nlp.spacy_model, by_member["as configured"]
    rows = []
    for i, (job, _, held) in enumerate(folds):
        print(f"[ner_veto_local] fold {i + 1}/{k}: {len(held)} notes", file=sys.stderr, flush=True)
        pe = PresidioExtractor(ex.model_copy(update={"ner_model": str(job.out), "ner_veto": str(taggers[i].out)}),
                               spacy, identifiers="direct+quasi")  # fmt: skip
        rows.append({"fold": i + 1, "notes": len(held), "ner": job.out.name, "tagger": taggers[i].out.name,
                     **score_fold(pe, held, ex.ner_veto_p_outside)})  # fmt: skip
    job, _, held = folds[SPEED_FOLD - 1]
    fast = speed(ex, spacy, str(job.out), str(taggers[SPEED_FOLD - 1].out), list(held))
    return {**provenance("ner_veto_local.py", []), "config": config, "machine": cpu_name(),
            "veto_bar": ex.ner_veto_p_outside, "contexts": list(CONTEXTS), "deciding": list(DECIDING),
            "speed_fold": SPEED_FOLD, "folds": rows, "speed": fast}  # fmt: skip


def _names(r: dict[str, Any]) -> list[str]:
    return [ENGINE, WHOLE, *(_local(c) for c in r["contexts"])]


def verdict(r: dict[str, Any]) -> tuple[bool, list[str]]:
    """The rule on the run's JSON: (adopted, one line per condition)."""
    whole, local = (_pool(r, n, r["deciding"]) for n in (WHOLE, _local(RULE_CONTEXT)))
    precision = 100 * local["correct"] / local["predicted"]
    fast = r["speed"][_local(RULE_CONTEXT)]["notes_per_s"]
    checks = [
        (local["detected"] >= whole["detected"], f"found {local['detected']} against the whole-note veto's "
                                                 f"{whole['detected']} (no fewer)"),
        (precision >= PRECISION_TARGET, f"precision {precision:.2f}% (at least {PRECISION_TARGET:g}%)"),
        (fast >= TARGET_SPEED, f"{fast} notes/s on one thread (at least {TARGET_SPEED:g})"),
    ]  # fmt: skip
    return all(ok for ok, _ in checks), [f"{'met' if ok else '**not met**'}: {line}" for ok, line in checks]


def report(r: dict[str, Any]) -> str:
    names = _names(r)
    head = "| veto reads | " + " | ".join(f"fold {f['fold']} ({f['notes']} notes)" for f in r["folds"]) + " |"
    rows = [head, "|---|" + "---|" * len(r["folds"])]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(_cell(_pool(r, n, [f["fold"]])) for f in r["folds"]) + " |")
    deciding, every = r["deciding"], [f["fold"] for f in r["folds"]]
    notes = sum(f["notes"] for f in r["folds"])
    pooled = [
        f"| veto reads | folds {', '.join(map(str, deciding))} pooled: recall / precision % | all "
        f"{len(every)} folds pooled | word pieces the tagger reads per note | windows |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        read = sum(f[n]["pieces_read"] for f in r["folds"])
        wins = sum(f[n]["windows"] for f in r["folds"])
        pooled.append(f"| {n} | {_cell(_pool(r, n, deciding))} | {_cell(_pool(r, n, every))} "
                      f"| {read / notes:.1f} | {wins} |")  # fmt: skip
    sp = r["speed"]
    fast = ["| engine | notes/s | vs no veto | spans |", "|---|---|---|---|"]
    for n in names:
        label = "spaCy engine" if n == ENGINE else f"spaCy engine + veto reading {n}"
        fast.append(f"| {label} | {sp[n]['notes_per_s']} | {sp[n]['notes_per_s'] / sp[ENGINE]['notes_per_s']:.2f}x "
                    f"| {sp[n]['spans']} |")  # fmt: skip
    fold = next(f for f in r["folds"] if f["fold"] == r["speed_fold"])
    same = all(sp[n]["spans"] == fold[n]["predicted"] for n in names)
    ok, lines = verdict(r)
    return (
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/{JSON.name}). Machine: "
        f"{r['machine']}. `{r['config']}`'s engine without its second pass on each outer fold's held-out notes of "
        "the patient-level CV (the fold's spaCy NER and veto tagger as `ctrlgen extract-report` trains them, on the "
        f"other folds' patients), the config's rules frozen and its veto bar {r['veto_bar']:g}. The veto's tagger "
        "reads whole notes (windows of its training's length) or, with `extraction.ner_veto_context` C, only the "
        "word pieces of the engine's spans and C pieces each side (windows of nearby spans merged; a note without "
        "spans is not read). A gold span is found when a predicted span overlaps it. Fold 1 is where the config's "
        "bar was chosen. These figures compare ways of reading at a fixed bar; the whole-note engine's quality with "
        "bars chosen in-fold is docs/extraction_veto.md's.\n\n"
        "Per fold, recall / precision %:\n\n"
        + "\n".join(rows)
        + "\n\nPooled:\n\n"
        + "\n".join(pooled)
        + f"\n\n**Speed**, fold {r['speed_fold']}'s {sp['notes']} held-out notes through `PresidioExtractor` (the "
        f"job's path), one thread, best of {sp['passes']} passes, models loaded and warmed:\n\n"
        + "\n".join(fast)
        + "\n\nThe spans of each speed run equal that fold's spans above: "
        + ("yes" if same else "**no**")
        + f".\n\nThe rule ({RULE}; C = {RULE_CONTEXT}, folds {', '.join(map(str, deciding))} pooled):\n\n"
        + "\n".join(f"- {line}" for line in lines)
        + ("\n\n**Adopted**" if ok else "\n\n**Not adopted**")
        + f": C = {RULE_CONTEXT}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure(CONFIG))


if __name__ == "__main__":
    main()
