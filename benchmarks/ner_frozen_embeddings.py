"""The veto tagger of ``configs/extract_physionet_veto.yaml`` fine-tuned as configured against the same training with
the encoder's word-piece embeddings frozen as pretrained (``ner_veto_training.freeze_word_embeddings``), at the
config's bars on outer folds of the patient-level cross-validation on the PhysioNet notes (issue 41).

Why: the engine's misses by cross-validation are mostly names and places of patients the tagger never saw. Fine-tuning
moves the embeddings of the word pieces the training notes (and their surrogates) show and leaves those of every
other piece where pretraining put them, so a piece first met in a held-out note is read through an embedding the rest
of the network was not trained with. Frozen, every piece's embedding is the pretrained one in training and in use.

**The rule, fixed at 00:15 UTC on 2026-12-07, before any such tagger was trained** (as benchmarks/ner_veto_members.py's
rules): adopt the frozen embeddings (go on to the config, inner taggers and an in-fold page) only if, on folds 2-5
pooled, the veto with the second pass has the higher min(recall / 0.985, precision / 0.85) (``extraction.bar_tuning``'s
objective, read from the config) and no lower recall than the config's tagger. Fold 1 (where the config's bars were
chosen) decides nothing. The tagger alone (no rules, argmax) is shown for the NER-alone target (>= 95% recall).

Each fold's spaCy NER and taggers are ``ctrlgen extract-report``'s (the same cache keys; trained through
``crossval.train_cached`` when missing: ~14 min per tagger on 2 cores, pinned numerics). The rules are the config's,
frozen, and the bars the config's (veto 0.999, second pass 0.2). ``--folds`` runs some folds and keeps the other
folds' rows of an earlier run in the JSON (the models of one fold take about half an hour to train here), so the
rule can be read once folds 2-5 are all in.

Writes docs/benchmarks/ner_frozen_embeddings.json and the section ``TITLE`` of docs/benchmarks.md; ``--render``
rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/ner_frozen_embeddings.py --folds 2,3,4,5
    .venv/bin/python benchmarks/ner_frozen_embeddings.py --render
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from ner_threshold import provenance  # noqa: E402
from ner_veto_members import (  # noqa: E402
    SECOND_PASS,
    _cell,
    _objective,
    _objective_name,
    _pool,
    score_fold,
    veto_fold_models,
)

CONFIG = "configs/extract_physionet_veto.yaml"
JSON = ROOT / "docs" / "benchmarks" / "ner_frozen_embeddings.json"
TITLE = "Entity extraction: the transformer tagger with its word embeddings frozen"
BASE, FROZEN = "fine-tuned (the config)", "word embeddings frozen"
MEMBERS = [(BASE, []), (FROZEN, ["extraction.ner_veto_training.freeze_word_embeddings=true"])]
DECIDING = (2, 3, 4, 5)
RULE = "fixed at 00:15 UTC on 2026-12-07, before any such tagger was trained"


def measure(folds: list[int], earlier: dict[str, Any] | None) -> dict[str, Any]:
    from ctrlgen.extract.crossval import train_cached
    from ctrlgen.extract.ner import META_FILE
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.transformer_ner import TransformerTagger

    base, ex, ner_jobs, taggers = veto_fold_models(CONFIG, MEMBERS, train=False)
    k, spacy = ex.ner_training.folds, base.nlp.spacy_model
    rows = {f["fold"]: f for f in (earlier or {}).get("folds", [])}
    result: dict[str, Any] = {}
    for fold in folds:
        i = fold - 1
        job, _, held = ner_jobs[i]
        print(f"[ner_frozen_embeddings] fold {fold}/{k}: training what is missing, then {len(held)} notes",
              file=sys.stderr, flush=True)  # fmt: skip
        train_cached([job] + [jobs[i] for jobs in taggers.values()], ex.ner_training.workers)
        run = ex.model_copy(update={"ner_model": str(job.out), "ner_veto": str(taggers[BASE][i].out),
                                    "ner_union_p_outside": SECOND_PASS, "ner_veto_context": None})  # fmt: skip
        pe = PresidioExtractor(run, spacy, identifiers="direct+quasi")
        members = {name: TransformerTagger(jobs[i].out, dtype=ex.ner_dtype) for name, jobs in taggers.items()}
        weights = {name: json.loads((jobs[i].out / META_FILE).read_text())["weights_sha256"][:16]
                   for name, jobs in taggers.items()}  # fmt: skip
        rows[fold] = {"fold": fold, "notes": len(held), "ner": job.out.name, "machine": cpu_name(),
                      "taggers": {name: jobs[i].out.name for name, jobs in taggers.items()}, "weights": weights,
                      **score_fold(pe, held, members, ex.ner_veto_p_outside, ensembles=(), alone=True)}  # fmt: skip
        result = {**provenance("ner_frozen_embeddings.py", ["--folds", ",".join(map(str, sorted(rows)))]),
                  "config": CONFIG, "veto_bar": ex.ner_veto_p_outside, "union_bar": SECOND_PASS,
                  "deciding": list(DECIDING),
                  "bar_tuning": ex.bar_tuning.model_dump(include={"objective", "recall_target", "precision_target",
                                                                  "beta"}),
                  "folds": [rows[f] for f in sorted(rows)]}  # fmt: skip
        publish(TITLE, JSON, report, result)  # after every fold: a run cut short keeps the folds it finished
    return result


def report(r: dict[str, Any]) -> str:
    every = [f["fold"] for f in r["folds"]]
    deciding = [f for f in r["deciding"] if f in every]
    engines = [("ner_alone", "tagger alone (argmax, no rules)"), ("veto", "veto"),
               ("second_pass", "veto + second pass")]  # fmt: skip
    per_fold = ["| tagger | engine | " + " | ".join(f"fold {f['fold']} ({f['notes']} notes)" for f in r["folds"])
                + " |", "|---|---|" + "---|" * len(r["folds"])]  # fmt: skip
    for name, _ in MEMBERS:
        for key, label in engines:
            per_fold.append(f"| {name} | {label} | "
                            + " | ".join(_cell(_pool(r, name, key, [f])) for f in every) + " |")  # fmt: skip
    pooled = [f"| tagger | engine | folds {', '.join(map(str, deciding))} pooled: recall / precision % | objective |",
              "|---|---|---|---|"]  # fmt: skip
    for name, _ in MEMBERS:
        for key, label in engines:
            c = _pool(r, name, key, deciding)
            pooled.append(f"| {name} | {label} | {_cell(c)} | {_objective(r, c):.4f} |")
    missing = [f for f in r["deciding"] if f not in every]
    base, frozen = _pool(r, BASE, "second_pass", deciding), _pool(r, FROZEN, "second_pass", deciding)
    if missing:
        verdict = (f"**Not decided yet**: fold{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                   "not run (the rule reads folds 2-5 pooled; the table above is what is in).")  # fmt: skip
    else:
        ok = _objective(r, frozen) > _objective(r, base) and frozen["detected"] >= base["detected"]
        verdict = (f"Objective {_objective(r, frozen):.4f} against the config's tagger's {_objective(r, base):.4f}, "
                   f"found {frozen['detected']} against {base['detected']}: "
                   + ("**adopted**." if ok else "**not adopted**; the config's tagger stays as it is."))
    machines = sorted({f["machine"] for f in r["folds"]})
    models = "; ".join(f"fold {f['fold']}: " + ", ".join(f"{n} `{f['taggers'][n]}` (sha256 `{f['weights'][n]}`)"
                                                         for n, _ in MEMBERS) for f in r["folds"])  # fmt: skip
    return (
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/{JSON.name}). Machine: "
        f"{', '.join(machines)}. `{r['config']}`'s engine on outer folds' held-out notes of the patient-level CV (the "
        "fold's spaCy NER and veto taggers as `ctrlgen extract-report` trains them, on the other folds' patients), "
        f"the config's rules frozen and its bars: veto {r['veto_bar']:g}, second pass {r['union_bar']:g}. The "
        "taggers: `ner_veto_training` as configured, and the same training with the encoder's word-piece embeddings "
        "frozen as pretrained (`freeze_word_embeddings`; every other weight trains): a piece no training note "
        "showed keeps the embedding the rest of the network was trained beside. A gold span is found when a "
        "predicted span overlaps it. The tagger alone is its own spans (no Presidio, no rules), not the report's "
        "NER-alone row.\n\n"
        "Per fold, recall / precision %:\n\n" + "\n".join(per_fold)
        + f"\n\nPooled over the deciding folds run so far, with {_objective_name(r)} (the objective of "
        "`extraction.bar_tuning`):\n\n" + "\n".join(pooled)
        + f"\n\nThe rule ({RULE}): adopt the frozen embeddings only if, on folds "
        f"{', '.join(map(str, r['deciding']))} pooled, the veto with the second pass has the higher objective and no "
        f"lower recall than the config's tagger. {verdict}\n\nModels (`.cache/ner`): {models}.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("--folds", default="2,3,4,5", help="the outer folds to run (others keep their earlier rows)")
    args = ap.parse_args()
    earlier = json.loads(JSON.read_text()) if JSON.is_file() else None
    if args.render:
        if earlier is None:
            raise SystemExit(f"{JSON} does not exist: run the benchmark first")
        publish(TITLE, JSON, report, None)
        return
    measure([int(f) for f in args.folds.split(",")], earlier)


if __name__ == "__main__":
    main()
