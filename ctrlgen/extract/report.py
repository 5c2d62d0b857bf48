"""``ctrlgen extract-report``: quality of the unknown setting against gold spans, as Markdown.

Runs ctrlgen's configured Presidio engine and Presidio's stock ``AnalyzerEngine``
(same spaCy pipeline, all predefined recognizers, its default threshold) over the
PhysioNet deid notes, the TAB case and the ACI-Bench notes (their metadata names and ages), and
scores them against the gold spans (all identifier kinds: every gold span is something a leak
would be measured on).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrlgen.config import AciCorpusConfig, CtrlgenConfig, ExtractionConfig, PhysionetCorpusConfig, TabCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.extract.presidio import PresidioExtractor, build_stock_analyzer, results_to_entities
from ctrlgen.extract.quality import Scores, found_by_label, scores_table, span_scores
from ctrlgen.schema import Document

if TYPE_CHECKING:
    from ctrlgen.extract.rules import BarSelection, RuleSelection

__all__ = ["extraction_report"]

NER_CACHE = Path(".cache/ner")  # fold models, keyed by what they were trained on (ctrlgen.extract.crossval)


def _stock(docs: list[Document], spacy_model: str) -> list[Document]:
    analyzer = build_stock_analyzer(spacy_model)
    out = []
    for d in docs:
        results = analyzer.analyze(text=d.text, language="en")
        out.append(
            Document(d.doc_id, d.text, d.metadata, results_to_entities(d.text, results, 0.0, ("DIRECT", "QUASI")))
        )
    return out


def _mean_sd(values: list[float]) -> str:
    from ctrlgen.experiment import mean_sd  # here: ctrlgen.experiment imports torch through the generation code

    m, sd, n = mean_sd(values)
    return f"{m:.2f} ± {sd:.2f}" if n else "-"


def _seed_spread(
    gold: list[Document],
    ner_cfg: ExtractionConfig,
    first: list[Document],
    seeds: Sequence[int],
    spacy_model: str,
    cache: Path = NER_CACHE,
) -> str:
    """Markdown: pooled CV figures of the configured training seed and of ``seeds``, with mean and sd."""
    from ctrlgen.extract.crossval import cross_validate

    how = ner_cfg.ner_training
    runs = {how.seed: span_scores(gold, first)["ALL"]}
    for seed in dict.fromkeys(s for s in seeds if s != how.seed):
        run_cfg = ner_cfg.model_copy(update={"ner_training": how.model_copy(update={"seed": seed})})
        if ner_cfg.ner_veto_training is not None:  # the fold veto taggers are trained again under that seed too
            veto = ner_cfg.ner_veto_training.model_copy(update={"seed": seed})
            run_cfg = run_cfg.model_copy(update={"ner_veto_training": veto})
        runs[seed] = span_scores(gold, cross_validate(gold, run_cfg, cache, spacy_model).predicted)["ALL"]
        print(f"[extract-report] training seed {seed}: recall {100 * runs[seed].recall:.1f}", file=sys.stderr)
    rows = ["| training seed | recall % | precision % | typed recall % | found / gold | predicted |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for seed, a in runs.items():
        rows.append(f"| {seed} | {100 * a.recall:.1f} | {100 * a.precision:.1f} | {100 * a.typed_recall:.1f} | "
                    f"{a.detected} / {a.gold} | {a.predicted} |")  # fmt: skip
    cols = [[100 * a.recall for a in runs.values()], [100 * a.precision for a in runs.values()],
            [100 * a.typed_recall for a in runs.values()]]  # fmt: skip
    rows.append("| mean ± sd | " + " | ".join(_mean_sd(c) for c in cols) + " | | |")
    return (
        "\nThe same cross-validation with other training seeds (each seed draws its own patient folds, surrogates "
        "and NER weights; everything else as configured): how much the pooled figures move when the NER is "
        "trained again.\n\n" + "\n".join(rows) + "\n"
    )


def _cpu_spread(ner_cfg: ExtractionConfig, fold_models: list[str]) -> str:
    """Markdown: the configured engine's CV figures over set-ups on the CPUs benchmarks/ner_kernels.py recorded, for
    the training of this config's all-notes NER ("" without it or without a record of its training)."""
    import json

    from ctrlgen.extract.ner import META_FILE
    from ctrlgen.extract.ner_setup import set_up_spread

    meta = Path(ner_cfg.ner_model or "") / META_FILE
    if not meta.is_file():
        return ""
    key = json.loads(meta.read_text()).get("trained_on", {}).get("key", "")
    hashes = [json.loads((Path(m) / META_FILE).read_text()).get("weights_sha256", "") for m in fold_models]
    return set_up_spread(key, hashes)


def deployed_bars(cv: Any, ner_cfg: ExtractionConfig, rules: RuleSelection | None) -> BarSelection:
    """The bars the in-fold selection chooses over all notes, each scored by the outer fold's NER and tagger that did
    not see it, with the rules chosen over all notes (``rules``; None: the config's): the bars of
    the engine whose NER and tagger are trained on every note, the one the unknown setting runs."""
    from ctrlgen.extract.crossval import choose_bars

    run = ner_cfg if rules is None else rules.cfg.model_copy(
        update={"ner_veto": ner_cfg.ner_veto, "ner_union_p_outside": ner_cfg.ner_union_p_outside})  # fmt: skip
    scored = list(zip(cv.models, cv.vetoes, cv.per_fold, strict=True))
    sel = choose_bars(scored, run, "direct+quasi", "all notes")
    print(f"[cross-validate] all notes bars: {sel.text()}", file=sys.stderr, flush=True)
    return sel


def _bars_section(engine: str, cv: Any, ner_cfg: ExtractionConfig, deployed: BarSelection | None = None) -> str:
    """Markdown: the veto tagger's bars each fold of ``engine`` ran, chosen on that fold's training notes only, and
    (``deployed``) the same choice over all notes."""
    t = ner_cfg.bar_tuning
    union = ner_cfg.ner_union_p_outside is not None
    objective = (f"F{t.beta:g}" if t.objective == "f_beta" else
                 f"min(recall / {t.recall_target:g}, precision / {t.precision_target:g})")  # fmt: skip
    rows = ["| fold | validation notes | ner_veto_p_outside" + (" | ner_union_p_outside" if union else "")
            + " | validation precision % | validation recall % | at the config's bars: precision % | recall % |",
            "|---|---|---" + ("|---" if union else "") + "|---|---|---|---|"]  # fmt: skip
    for i, sel in enumerate(cv.bars):
        rows.append(f"| {i + 1} | {sel.notes} | {sel.veto:g}" + (f" | {sel.union:g}" if union else "")
                    + f" | {100 * sel.chosen[1]:.1f} | {100 * sel.chosen[2]:.1f} | {100 * sel.configured[1]:.1f} | "
                    f"{100 * sel.configured[2]:.1f} |")  # fmt: skip
    bars = ", ".join(f"{b:g}" for b in t.veto_bars)
    tie = ("a tie to the bars with the higher other ratio, then to more spans"
           if t.tie_break == "leximin" and t.objective == "targets" else "a tie to the bars that keep more spans")
    unions = f" and ner_union_p_outside from {', '.join(f'{b:g}' for b in t.union_bars)} (every pair)" if union else ""
    return (
        f"\n{engine}: the veto tagger's bars chosen inside each training fold (`extraction.bar_tuning`, "
        f"ctrlgen/extract/rules.py `select_bars`): ner_veto_p_outside from {bars}{unions}, the best {objective} "
        f"({tie}) on the held-out notes of {t.validation_folds} of {t.inner_folds} "
        f"patient folds of the training fold, each scored by that fold's rules with an NER and a tagger trained on "
        f"the other inner folds ("
        + ("the tagger for about the updates of the fold's own: its epochs times the training fold's notes over "
           "its own" if t.match_updates else "the tagger for the fold tagger's epochs, on fewer notes")
        + f"); the held-out fold was used neither to train them nor to choose the bars. The "
        f"config's own bars ({ner_cfg.ner_veto_p_outside:g}"
        + (f" / {ner_cfg.ner_union_p_outside:g}" if union else "")
        + ") are what `ctrlgen extract` runs, and the in-sample, TAB and ACI-Bench rows.\n\n"
        + "\n".join(rows) + "\n"
        + ("" if deployed is None else
           "\nThe same choice over all notes, each scored by the outer fold's NER and tagger that did not see it, "
           "with the rules chosen over all notes (the bars for the engine whose NER and tagger are trained on every "
           f"note, the one the unknown setting runs): {deployed.text()}. The deployed engine's config is where this "
           "all-notes choice belongs.\n")
    )


def _rules_section(cv: Any, ner_cfg: ExtractionConfig, deployed: Any) -> str:
    """Markdown: the rules each fold's engine ran, chosen on that fold's training notes only."""
    t = ner_cfg.rule_tuning
    rows = ["| fold | tuning notes | changes from the configured engine | F-beta as configured -> chosen | "
            "tuning precision % | tuning recall % |", "|---|---|---|---|---|---|"]  # fmt: skip
    for i, sel in enumerate(cv.rules):
        rows.append(f"| {i + 1} | {sel.tuning_notes} | {', '.join(sel.steps) or 'none'} | "
                    f"{sel.start[0]:.3f} -> {sel.end[0]:.3f} | {100 * sel.end[1]:.1f} | {100 * sel.end[2]:.1f} |")  # fmt: skip
    return (
        f"\nRules chosen inside each training fold (`extraction.rule_tuning`, ctrlgen/extract/rules.py): "
        f"starting from the configured engine, a greedy backward elimination over the recognizers beside the "
        f"NER, the vetoes, mention propagation, initials and the score threshold ({', '.join(f'{x:g}' for x in t.thresholds)}) "
        f"maximised F{t.beta:g} on the fold's training notes, each scored by an NER of a "
        f"{t.inner_folds}-fold inner cross-validation (trained without that note's patient); the held-out fold "
        f"was used neither to train the NER nor to choose the rules.\n\n" + "\n".join(rows) + "\n"
        f"\nThe same selection over all notes, each scored by the outer fold model that did not see it (the "
        f"rules for the engine whose NER is trained on every note, the one the unknown setting runs): "
        f"{deployed.text()}. The selection always starts from this config's full set of rules (choosing inside "
        f"a fold from a set already cut on all notes would let the held-out notes choose); the deployed engine's "
        f"config (configs/extract_physionet.yaml) is where this all-notes choice belongs.\n"
    )


def _without_ner(cfg: ExtractionConfig) -> ExtractionConfig:
    """The engine's rules alone: every recognizer but the NER's, spaCy reduced to its tokenizer."""
    return cfg.model_copy(
        update={
            "ner_model": None,
            "ner_veto": None,  # the hand-written rules alone: no tagger judges them
            "ner_union_p_outside": None,
            "recognizers": [r for r in cfg.recognizers if r != "SpacyRecognizer"],
            "spacy_disable": sorted({*cfg.spacy_disable, "ner", "lemmatizer"}),
            "rule_tuning": cfg.rule_tuning.model_copy(update={"enabled": False}),
        }
    )


def _ner_alone(cfg: ExtractionConfig) -> ExtractionConfig:
    """The engine's NER alone: no hand-written recognizer, veto (of numbers, or a tagger's: ``ner_veto``), mention
    propagation or initials."""
    return cfg.model_copy(
        update={
            "recognizers": ["SpacyRecognizer"],
            "ner_veto": None,
            "ner_union_p_outside": None,
            "clinical_number_veto": False,
            "propagate_mentions": False,
            "expand_initials": False,
            "rule_tuning": cfg.rule_tuning.model_copy(update={"enabled": False}),
        }
    )


RULE_SOURCES = ("ctrlgen/extract/recognizers.py", "ctrlgen/extract/presidio.py", "ctrlgen/extract/rules.py")


def rules_digest(root: Path | None = None) -> str:
    """SHA-256 (first 16 hex digits) of the files that hold the hand-written rules: a report names the rule set
    it measured, and two reports measured the same rules iff their digests agree."""
    import hashlib

    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in RULE_SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return h.hexdigest()[:16]


def _one_thread() -> None:
    """Torch on one thread in this process (a transformer NER's extraction; its trainings run in their own
    processes, or with the threads :class:`~ctrlgen.extract.crossval.TrainJob` gives them)."""
    import torch

    torch.set_num_threads(1)


def ner_label(cfg: ExtractionConfig) -> str:
    """The report's name of a config's trained NER (its engine's, with ``ner_veto``: "+ veto", and with
    ``ner_union_p_outside``: "+ second pass")."""
    label = "transformer NER" if cfg.ner_training.kind == "transformer" else "clinical NER"
    if cfg.ner_veto:
        label += " + veto" + (" + second pass" if cfg.ner_union_p_outside is not None else "")
    return label


def _ner_alone_label(cfg: ExtractionConfig) -> str:
    """The report's name of a config's NER alone (no veto: the NER is the engine's spaCy or transformer model)."""
    return ner_label(_ner_alone(cfg))


def _fold_table(engine: str, cv: Any) -> str:
    rows = ["| fold | patients | notes | gold | predicted | precision % | recall % | typed recall % |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, (fg, fp) in enumerate(zip(cv.per_fold, cv.per_fold_pred, strict=True)):
        a = span_scores(fg, fp)["ALL"]
        rows.append(f"| {i + 1} | {len(cv.folds[i])} | {len(fg)} | {a.gold} | {a.predicted} | "
                    f"{100 * a.precision:.1f} | {100 * a.recall:.1f} | {100 * a.typed_recall:.1f} |")  # fmt: skip
    return (f"\n{engine}, per fold (each fold's notes extracted by the NER trained on the other "
            f"folds' patients; pooled figures above):\n\n" + "\n".join(rows) + "\n")  # fmt: skip


def _by_type(gold: list[Document], preds: dict[str, list[Document]]) -> str:
    """Markdown: found / gold per gold type (the corpus' own labels), one column per engine."""
    n_by = found_by_label(gold, gold)
    found_by = {name: found_by_label(gold, pred) for name, pred in preds.items()}
    lines = ["| gold type | gold | " + " | ".join(preds) + " |", "|---|---|" + "---|" * len(preds)]
    for label in [*sorted(n_by), "ALL"]:
        n = sum(n_by.values()) if label == "ALL" else n_by[label]
        row = [label, str(n)]
        for by in found_by.values():
            found = sum(by.values()) if label == "ALL" else by[label]
            row.append(f"{found} ({100 * found / n:.1f}%)" if n else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def extraction_report(
    cfg: CtrlgenConfig,
    physionet: Path,
    tab: Path,
    limit: int | None = None,
    deid: str | None = None,
    aci: Path | None = None,
    seeds: Sequence[int] = (),
    also: Sequence[CtrlgenConfig] = (),
) -> str:
    """Score the engines on each corpus; return the Markdown body of docs/extraction.md.

    ``also``: configs of other trained NERs (e.g. the transformer's) whose engines are scored beside this
    config's the same way (cross-validated on PhysioNet, NER alone, all-notes model on the other corpora).

    Engines: ctrlgen with the general spaCy NER (the default recognizers); when
    ``extraction.ner_model`` is set, ctrlgen with the clinical NER, cross-validated by patient
    on PhysioNet (:func:`~ctrlgen.extract.crossval.cross_validate`) and the full model on TAB;
    Presidio's stock engine; PhysioNet's deid tool (``deid``: its directory) on PhysioNet.
    ``seeds``: more training seeds (each its own patient folds and NER weights) whose pooled
    cross-validated figures are listed beside the configured seed's, with their mean and sd.
    """
    from ctrlgen.extract.crossval import cross_validate, veto_training
    from ctrlgen.extract.deid_tool import run_deid

    for c in [cfg, *also]:  # before any engine runs: a veto is cross-validated with fold taggers, or not at all
        veto_training(c.extraction)

    _one_thread()  # the speeds are per core: a transformer NER would otherwise run on every core

    corpora = {
        "PhysioNet deid": load_corpus(
            PhysionetCorpusConfig(path=str(physionet), identifiers="direct+quasi", limit=limit)
        )[0],
        "TAB (annotator1)": load_corpus(
            TabCorpusConfig(path=str(tab), identifiers="direct+quasi", annotator="annotator1", segments=None)
        )[0],
    }
    if aci is not None:
        # the second check: the patient / doctor names and ages of ACI-Bench's metadata, found in its notes
        corpora["ACI-Bench (metadata names and ages)"] = load_corpus(
            AciCorpusConfig(path=str(aci), identifiers="direct+quasi", limit=limit)
        )[0]
    general = PresidioExtractor(ExtractionConfig(setting="unknown"), cfg.nlp.spacy_model, "direct+quasi")
    ner_cfgs = [c.extraction.model_copy(update={"setting": "unknown"}) for c in [cfg, *also] if c.extraction.ner_model]
    clinical: dict[tuple[int, int], PresidioExtractor] = {}  # an all-notes NER engine per (config, min_age), once

    def clinical_engine(i: int, min_age: int) -> PresidioExtractor:
        if (i, min_age) not in clinical:
            run_cfg = ner_cfgs[i].model_copy(update={"min_age": min_age})
            clinical[i, min_age] = PresidioExtractor(run_cfg, cfg.nlp.spacy_model, "direct+quasi")
        return clinical[i, min_age]

    def rules_only(gold: list[Document], min_age: int, record: Any) -> None:
        ext = PresidioExtractor(_without_ner(ner_cfgs[0].model_copy(update={"min_age": min_age})),
                                cfg.nlp.spacy_model, "direct+quasi")  # fmt: skip
        t0 = time.perf_counter()
        record("ctrlgen (rules alone, no NER)", ext(gold), time.perf_counter() - t0)

    sections = [f"Hand-written rules measured: digest `{rules_digest()}` of {', '.join(RULE_SOURCES)}.\n"]
    for name, gold in corpora.items():
        scores: dict[str, dict[str, Scores]] = {}
        preds: dict[str, list[Document]] = {}
        timing: list[str] = []
        extra = ""

        def record(engine: str, pred: list[Document], seconds: float, gold: list[Document] = gold,
                   scores: dict[str, dict[str, Scores]] = scores, preds: dict[str, list[Document]] = preds,
                   timing: list[str] = timing, name: str = name) -> None:  # fmt: skip
            scores[engine] = span_scores(gold, pred)
            preds[engine] = pred
            timing.append(f"{engine}: {len(gold) / seconds:.1f} documents/s")
            print(f"[extract-report] {name}: {engine} done in {seconds:.0f} s", file=sys.stderr, flush=True)

        t0 = time.perf_counter()
        record("ctrlgen (general NER)", general(gold), time.perf_counter() - t0)
        for i, ncfg in enumerate(ner_cfgs):
            label = ner_label(ncfg)
            if name.startswith("PhysioNet"):
                cv = cross_validate(gold, ncfg, NER_CACHE, cfg.nlp.spacy_model)
                tuned = (", rules chosen in-fold" if cv.rules else "") + (", bars chosen in-fold" if cv.bars else "")
                engine = f"ctrlgen ({label}, {len(cv.folds)}-fold CV{tuned})"
                record(engine, cv.predicted, cv.seconds_extract)
                # the same fold models (cached: same training settings) with none of the hand-written rules:
                # the part of the figures that is cross-validated through and through
                alone_engine = f"ctrlgen ({_ner_alone_label(ncfg)} alone, {len(cv.folds)}-fold CV)"
                if alone_engine not in scores:  # not already run for another config with this NER (a veto's)
                    cv_alone = cross_validate(gold, _ner_alone(ncfg), NER_CACHE, cfg.nlp.spacy_model)
                    record(alone_engine, cv_alone.predicted, cv_alone.seconds_extract)
                if i == 0:
                    rules_only(gold, ncfg.min_age, record)
                extra += _fold_table(engine, cv)
                deployed = None
                if cv.rules and (i == 0 or cv.bars):
                    from ctrlgen.extract.crossval import choose_rules

                    # the deployed engine (the NER trained on every note) gets the rules the same selection
                    # chooses on all notes, each scored by the outer fold model that did not see it
                    pairs = list(zip(cv.models, cv.per_fold, strict=True))
                    deployed = choose_rules(pairs, ncfg, "direct+quasi", "all notes")
                if cv.bars:
                    extra += _bars_section(engine, cv, ncfg, deployed_bars(cv, ncfg, deployed))
                if i == 0:  # the rule selection and the seed spread: the config's own NER only
                    if deployed is not None:
                        extra += _rules_section(cv, ncfg, deployed)
                    if seeds:
                        extra += _seed_spread(gold, ncfg, cv.predicted, seeds, cfg.nlp.spacy_model)
                    if not ncfg.ner_veto:  # the recorded set-ups ran the engine without a veto
                        extra += _cpu_spread(ncfg, cv.models)
                if Path(ncfg.ner_model or "").is_dir() and (not ncfg.ner_veto or Path(ncfg.ner_veto).is_dir()):
                    # the model trained on every note, on those same notes: what the unknown setting runs on
                    # this corpus (in-sample, not a quality figure)
                    ext = clinical_engine(i, ncfg.min_age)
                    t0 = time.perf_counter()
                    record(f"ctrlgen ({label}, all notes: in-sample)", ext(gold), time.perf_counter() - t0)
            else:
                # trained on all PhysioNet notes; ACI-Bench's metadata counts every age (extraction.min_age)
                min_age = 0 if name.startswith("ACI") else ncfg.min_age
                ext = clinical_engine(i, min_age)
                t0 = time.perf_counter()
                record(f"ctrlgen ({label})", ext(gold), time.perf_counter() - t0)
                alone_engine = f"ctrlgen ({_ner_alone_label(ncfg)} alone)"
                if Path(ncfg.ner_model or "").is_dir() and alone_engine not in scores:
                    alone = PresidioExtractor(_ner_alone(ncfg.model_copy(update={"min_age": min_age})),
                                              cfg.nlp.spacy_model, "direct+quasi")  # fmt: skip
                    t0 = time.perf_counter()
                    record(alone_engine, alone(gold), time.perf_counter() - t0)
                if i == 0:
                    rules_only(gold, min_age, record)
        t0 = time.perf_counter()
        stock = _stock(gold, cfg.nlp.spacy_model)
        record("stock", stock, time.perf_counter() - t0)
        if deid and name.startswith("PhysioNet"):
            pred, seconds = run_deid(gold, deid)
            record("deid tool", pred, seconds)
        n_spans = sum(len(d.entities) for d in gold)
        sections.append(
            f"### {name}\n\n{len(gold)} documents, {n_spans} gold spans. Speed in this run (one core, "
            f"including Presidio's own overhead): {'; '.join(timing)}.\n\n{scores_table(scores)}\n\n"
            f"Recall by gold type (found / gold):\n\n{_by_type(gold, preds)}\n{extra}"
        )
    return "\n".join(sections)
