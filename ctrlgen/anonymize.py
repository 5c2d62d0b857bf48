"""Rule-based anonymisation of real notes (METHOD.md section 8.3): the baseline synthesis is compared with.

Instead of generating new notes, the real note is released with its detected
identifiers edited, through Presidio's anonymizer operators over ctrlgen's entity spans
(gold spans in the known setting, the extractor's in the unknown one):

* ``redact``: every span becomes its category tag, ``<PERSON>`` (Presidio's ``replace``
  operator with its default value);
* ``surrogate``: every span becomes a fictional value of its kind, drawn exactly as
  ctrlgen draws fictional control codes (:class:`ctrlgen.fictional.FictionalCodes`,
  seeded per document, never one of the corpus' real values); a value that appears twice
  in the note gets the same surrogate both times (Presidio's ``custom`` operator).

Overlapping spans are merged by Presidio (the longer one wins). The output says how many
spans were replaced, never which values.

Example:
    >>> from ctrlgen.schema import Entity
    >>> e = [Entity(0, 5, "Alice", "PERSON", "DIRECT", "gold", "Name")]
    >>> anonymize("Alice was seen today.", e, "redact").text
    '<PERSON> was seen today.'
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctrlgen.codes import build_control_code, code_value
from ctrlgen.fictional import FictionalCodes
from ctrlgen.schema import Entity

__all__ = ["ANONYMIZERS", "Anonymized", "anonymize"]

ANONYMIZERS = ("redact", "surrogate")


@functools.cache
def _engine() -> Any:
    from presidio_anonymizer import AnonymizerEngine

    return AnonymizerEngine()


@dataclass(frozen=True)
class Anonymized:
    text: str
    replaced: int  # spans replaced (after Presidio merged overlaps)


def _key(category: str, value: str) -> tuple[str, str]:
    return category, " ".join(value.split()).casefold()


def anonymize(
    text: str,
    entities: Sequence[Entity],
    method: Literal["redact", "surrogate"],
    fictional: FictionalCodes | None = None,
    doc_id: str = "",
) -> Anonymized:
    """``text`` with every entity span redacted or replaced by a surrogate (see the module doc).

    Raises ValueError for an unknown method or a span outside the text (naming the span's
    offsets, never its value).
    """
    from presidio_anonymizer.entities import OperatorConfig, RecognizerResult

    if method not in ANONYMIZERS:
        raise ValueError(f"unknown anonymisation method {method!r}; known: {', '.join(ANONYMIZERS)}")
    spans = []
    for e in entities:
        if not (0 <= e.start < e.end <= len(text)):
            raise ValueError(f"document {doc_id!r}: span [{e.start}, {e.end}) outside a text of {len(text)} characters")
        spans.append(RecognizerResult(entity_type=e.category, start=e.start, end=e.end, score=1.0))
    if not spans:
        return Anonymized(text, 0)
    categories = sorted({e.category for e in entities})
    if method == "redact":
        operators = {c: OperatorConfig("replace") for c in categories}
    else:
        gen = fictional or FictionalCodes(seed=0)
        real = build_control_code(entities)
        fake = gen.fictionalize(real, doc_id)
        table = {_key(c, v): f for c, values in real.items() for v, f in zip(values, fake.get(c, []), strict=False)}
        by_text = {e.text: table.get(_key(e.category, code_value(e))) for e in entities}

        def surrogate(value: str, _c: str = "") -> str:
            # Presidio passes the span's text; a span whose value has no surrogate (a placeholder
            # without a fictional kind) falls back to its tag rather than staying real.
            return by_text.get(value) or f"<{_c}>"

        operators = {c: OperatorConfig("custom", {"lambda": lambda v, _c=c: surrogate(v, _c)}) for c in categories}
    result = _engine().anonymize(text=text, analyzer_results=spans, operators=operators)
    return Anonymized(result.text, len(result.items))
