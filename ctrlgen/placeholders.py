"""MIMIC-III de-identification placeholders ``[**...**]`` as typed entities.

The inner text names the PHI type, usually followed by a number:
``[**Hospital1 18**]`` -> ORG, ``[**First Name (NamePattern1) 1234**]`` -> PERSON,
``[**2101-10-20**]`` -> DATETIME, ``[**Telephone/Fax (1) 5551**]`` -> CODE.

Example:
    >>> [(e.text, e.category, e.label) for e in placeholder_entities("Seen at [**Hospital1 18**].")]
    [('[**Hospital1 18**]', 'ORG', 'Hospital1')]
"""

from __future__ import annotations

import functools
import re

from ctrlgen.schema import Entity

__all__ = ["PLACEHOLDER", "placeholder_entities", "placeholder_type", "placeholder_value"]

PLACEHOLDER = re.compile(r"\[\*\*(.{0,80}?)\*\*\]", re.S)

_DATE_ONLY = re.compile(r"^[\d\s/\-.]+$")
_TRAILING_NUMBER = re.compile(r"\s*\d+\s*$")

# (keywords, category, kind); first rule whose keyword occurs in the lower-cased type wins.
_RULES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("age over",), "DEM", "QUASI"),
    (("ward", "unit name"), "LOC", "QUASI"),
    (("telephone", "fax", "phone", "pager"), "CODE", "DIRECT"),
    (
        (
            "medical record",
            "numeric identifier",
            "md number",
            "serial number",
            "social security",
            "job number",
            "unit number",
            "provider number",
            "clip number",
            "e-mail",
            "url",
            "contact info",
            "attending info",
            "dictator info",
        ),
        "CODE",
        "DIRECT",
    ),
    (("name", "initials"), "PERSON", "DIRECT"),
    (("hospital", "company", "university", "college"), "ORG", "QUASI"),
    (("location", "address", "state", "country", "po box"), "LOC", "QUASI"),
    (("month", "year", "day", "holiday", "date"), "DATETIME", "QUASI"),
)


def placeholder_type(inner: str) -> tuple[str, str, str]:
    """Inner text of a placeholder -> ``(category, kind, label)``.

    The label is the type without its trailing number (``"Hospital1"``), or
    ``"Date"`` for a bare date like ``2101-10-20``. Unknown types are MISC / QUASI.
    """
    inner = inner.strip()
    if not inner:
        return "MISC", "QUASI", "Unknown"
    if _DATE_ONLY.match(inner):
        return "DATETIME", "QUASI", "Date"
    label = _TRAILING_NUMBER.sub("", inner).strip() or inner
    return (*_category_of(label.lower()), label)


@functools.lru_cache(maxsize=4096)
def _category_of(low: str) -> tuple[str, str]:
    """The first rule with a keyword in ``low``; labels repeat (``hospital1``, ``known lastname``)."""
    for keywords, category, kind in _RULES:
        if any(k in low for k in keywords):
            return category, kind
    return "MISC", "QUASI"


def placeholder_value(text: str) -> str:
    """``[**Hospital1 18**]`` -> ``Hospital1 18`` (the value a control code shows)."""
    m = PLACEHOLDER.fullmatch(text)
    return m.group(1).strip() if m else text


def placeholder_entities(text: str) -> list[Entity]:
    """All ``[**...**]`` placeholders of ``text`` as entities (source ``placeholder``)."""
    out = []
    for m in PLACEHOLDER.finditer(text):
        category, kind, label = placeholder_type(m.group(1))
        out.append(Entity(m.start(), m.end(), m.group(0), category, kind, "placeholder", label))
    return out
