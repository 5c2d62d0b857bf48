"""Recognizers for what Presidio's defaults miss in clinical and legal text.

Each is mostly data: a Presidio entity name (one of our eight categories), regex
patterns with scores. Context that matters is written into the pattern (look-behind
for ``no.``, ``MRN``, ``Dr``) rather than left to Presidio's lemma-based context
enhancer, because the fast path disables spaCy's lemmatizer.

Example:
    >>> [p.name for p in ECHR_APPLICATION.patterns][:1]
    ['application no.']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctrlgen.placeholders import PLACEHOLDER, placeholder_type

__all__ = [
    "ECHR_APPLICATION",
    "PATTERN_RECOGNIZERS",
    "MimicPlaceholderRecognizer",
    "RecognizerSpec",
    "build_pattern_recognizer",
]


@dataclass(frozen=True)
class _P:
    name: str
    regex: str
    score: float


@dataclass(frozen=True)
class RecognizerSpec:
    """A pattern recognizer as data: its name, the category it finds, its patterns."""

    name: str
    entity: str
    patterns: tuple[_P, ...]


_MONTHS = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"

ECHR_APPLICATION = RecognizerSpec(
    "EchrApplicationRecognizer",
    "CODE",
    (
        _P("application no.", r"(?<=\bno\. )\d{2,6}/\d{2}\b", 0.95),
        _P("application number", r"\b\d{3,6}/\d{2}\b", 0.6),
    ),
)
MEDICAL_ID = RecognizerSpec(
    "MedicalIdRecognizer",
    "CODE",
    (
        _P(
            "mrn",
            r"(?<=\b(?:mrn|mr#|mr #|unit no|unit #|record #|record no|acct|acct #|id)[:.# ]{1,2})[A-Z]{0,3}\d{4,12}\b",
            0.9,
        ),
        _P("medical record number", r"(?<=\bmedical record number[: ])\s*\d{4,12}\b", 0.9),
        _P("ssn", r"\b\d{3}-\d{2}-\d{4}\b", 0.7),
    ),
)
PHONE = RecognizerSpec(
    "ClinicalPhoneRecognizer",
    "CODE",
    (
        _P("phone 10 digits", r"\(?\b\d{3}\)?[-./ ]\d{3}[-./ ]\d{4}\b", 0.8),
        _P("phone 7 digits", r"\b\d{3}-\d{4}\b", 0.5),
        _P("pager / beeper / extension", r"(?<=\b(?:pager|beeper|page|pgr|ext|x|#)[ .:#]{0,2})\d{4,6}\b", 0.75),
    ),
)
AGE = RecognizerSpec(
    "AgeRecognizer",
    "DEM",
    (
        _P("N year old", r"\b\d{1,3}(?=\s*-?\s*(?:years?|yrs?|yo|y/o|y\.o\.)(?:[\s-]*old)?\b)", 0.95),
        _P("age N", r"(?<=\bage[d:]? )\d{1,3}\b", 0.95),
        _P("N-year-old", r"\b\d{1,3}(?=-year-old\b)", 0.95),
    ),
)
DATE = RecognizerSpec(
    "ClinicalDateRecognizer",
    "DATETIME",
    (
        _P("m/d(/y)", r"\b(?:1[0-2]|0?[1-9])/(?:3[01]|[12]\d|0?[1-9])(?:/(?:\d{4}|\d{2}))?\b", 0.7),
        _P("y-m-d", r"\b\d{4}-\d{1,2}-\d{1,2}\b", 0.85),
        _P("d month y", rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTHS}\.?,? \d{{4}}\b", 0.9),
        _P("month d, y", rf"\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b", 0.75),
        _P("month y", rf"\b{_MONTHS}\.? (?:19|20)\d{{2}}\b", 0.75),
        _P("year", r"\b(?:19[4-9]\d|20[0-3]\d)\b", 0.45),
        _P("'yy", r"(?<=\bin )'?\d{2}\b(?=[.,;])", 0.4),
    ),
)
TITLED_NAME = RecognizerSpec(
    "TitledNameRecognizer",
    "PERSON",
    (
        _P("title + name", r"(?<=\b(?:dr|mr|mrs|ms|miss|md|rn|np|pa)[. ] ?)[a-z][a-z'\-]{1,20}\b", 0.6),
        _P("name, md/rn", r"\b[a-z][a-z'\-]{1,20}(?=,? (?:md|m\.d\.|rn|np)\b)", 0.5),
    ),
)
# Words that start a phrase before a facility name but are not part of it.
_NOT_NAME = (
    r"(?!(?:from|to|at|the|in|of|and|for|with|by|transfer(?:red)?|admitted|sent|via|outside|local|this|that|an?)\b)"
)
ORGANISATION = RecognizerSpec(
    "FacilityRecognizer",
    "ORG",
    (
        _P(
            "X hospital / medical center",
            rf"\b(?:{_NOT_NAME}[a-z][a-z.'\-]+ ){{1,3}}(?:hospital|medical center|med ctr|clinic|rehab(?:ilitation)?(?: center)?|nursing home|health center|infirmary)\b",
            0.9,
        ),
        _P("hospital of X", r"\b(?:hospital|university|college) of (?:[a-z][a-z.'\-]+ ?){1,3}\b", 0.9),
    ),
)
QUANTITY = RecognizerSpec(
    "MoneyPercentRecognizer",
    "QUANTITY",
    (
        _P(
            "money",
            r"(?:[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d[\d,]*(?:\.\d+)? (?:euros?|dollars?|pounds?|lira|liras|TRY|EUR|USD))\b",
            0.7,
        ),
    ),
)

#: The pattern recognizers ctrlgen adds, by name (configs list them by these names).
PATTERN_RECOGNIZERS: dict[str, RecognizerSpec] = {
    r.name: r for r in (ECHR_APPLICATION, MEDICAL_ID, PHONE, AGE, DATE, TITLED_NAME, ORGANISATION, QUANTITY)
}


def build_pattern_recognizer(spec: RecognizerSpec) -> Any:
    """A Presidio ``PatternRecognizer`` from a spec (case-insensitive patterns)."""
    from presidio_analyzer import Pattern, PatternRecognizer

    return PatternRecognizer(
        supported_entity=spec.entity,
        name=spec.name,
        patterns=[Pattern(p.name, p.regex, p.score) for p in spec.patterns],
    )


def _placeholder_recognizer_class() -> Any:
    from presidio_analyzer import EntityRecognizer, RecognizerResult

    class _MimicPlaceholderRecognizer(EntityRecognizer):
        """MIMIC ``[**...**]`` placeholders, typed by their inner text (score 1.0)."""

        def __init__(self) -> None:
            super().__init__(
                supported_entities=["PERSON", "CODE", "LOC", "ORG", "DEM", "DATETIME", "QUANTITY", "MISC"],
                name="MimicPlaceholderRecognizer",
            )

        def load(self) -> None:
            pass

        def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[Any]:
            out = []
            for m in PLACEHOLDER.finditer(text):
                category = placeholder_type(m.group(1))[0]
                if category in entities:
                    out.append(RecognizerResult(category, m.start(), m.end(), 1.0))
            return out

    return _MimicPlaceholderRecognizer


def MimicPlaceholderRecognizer() -> Any:
    """A Presidio recognizer for MIMIC placeholders (built lazily: Presidio imports are slow)."""
    return _placeholder_recognizer_class()()
