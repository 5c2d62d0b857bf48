"""Control codes: a document's distinct private values grouped by category (METHOD.md section 2).

::

    PERSON: Alice Jones, John Smith
    LOC: New York City
    DATETIME: 31 August 2006

Categories appear in :data:`~ctrlgen.schema.CATEGORIES` order, values in order of
first mention, each value once (case-insensitively; the first spelling wins).
A value containing a comma or starting with a double quote is written in double
quotes (inner quotes doubled), so :func:`parse_control_code` inverts
:func:`format_control_code` exactly.

Example:
    >>> code = {"PERSON": ["Alice Jones"], "QUANTITY": ["$87,500"]}
    >>> format_control_code(code)
    'PERSON: Alice Jones\\nQUANTITY: "$87,500"'
    >>> parse_control_code(format_control_code(code)) == code
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ctrlgen.placeholders import placeholder_value
from ctrlgen.schema import CATEGORIES, Entity

__all__ = ["ControlCode", "build_control_code", "code_value", "format_control_code", "parse_control_code"]

ControlCode = dict[str, list[str]]
_WS = re.compile(r"\s+")
_LINE = re.compile(r"^([A-Z]+):[ \t]?(.*)$")


def code_value(entity: Entity) -> str:
    """The value a control code shows: whitespace folded; placeholders without ``[** **]``."""
    text = placeholder_value(entity.text) if entity.source == "placeholder" else entity.text
    return _WS.sub(" ", text).strip()


def build_control_code(entities: Iterable[Entity]) -> ControlCode:
    """Group distinct entity values by category, in canonical category order."""
    by_cat: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for e in sorted(entities, key=lambda e: (e.start, e.end)):
        value = code_value(e)
        key = (e.category, value.casefold())
        if not value or key in seen:
            continue
        seen.add(key)
        by_cat.setdefault(e.category, []).append(value)
    return {c: by_cat[c] for c in CATEGORIES if c in by_cat}


def _quote(value: str) -> str:
    if "," in value or value.startswith('"'):
        return '"' + value.replace('"', '""') + '"'
    return value


def format_control_code(code: ControlCode) -> str:
    """Control code -> text, one ``CATEGORY: v1, v2`` line per category."""
    lines = []
    for cat in CATEGORIES:
        if code.get(cat):
            lines.append(f"{cat}: " + ", ".join(_quote(_WS.sub(" ", v).strip()) for v in code[cat]))
    extra = [c for c in code if c not in CATEGORIES]
    if extra:
        raise ValueError(f"unknown control-code categories {extra}")
    return "\n".join(lines)


def _split_values(body: str) -> list[str]:
    values, i, n = [], 0, len(body)
    while i < n:
        if body[i] == '"':
            j, buf = i + 1, []
            while j < n:
                if body[j] == '"':
                    if j + 1 < n and body[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(body[j])
                j += 1
            values.append("".join(buf))
            i = j + 1
            if body.startswith(", ", i):
                i += 2
        else:
            j = body.find(", ", i)
            j = n if j < 0 else j
            values.append(body[i:j])
            i = j + 2
    return [v for v in values if v]


def parse_control_code(text: str) -> ControlCode:
    """Text -> control code; lines that are not ``KNOWN_CATEGORY: ...`` are ignored.

    Ignoring other lines lets this read a code back out of generated text; the
    caller decides whether that is an error.
    """
    code: ControlCode = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m and m.group(1) in CATEGORIES:
            code.setdefault(m.group(1), []).extend(_split_values(m.group(2).strip()))
    return code
