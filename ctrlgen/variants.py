"""Value variants: the surface forms a reader takes for the same private value.

One expander, :func:`value_variants`, used by hard blocking (which token sequences to ban),
the release gate and the leakage metrics (which strings count as the value), so that what
generation blocks the gate and the metrics catch, and the reverse.

For every value: the value as written and its casing variants (as written, lower, upper,
title, capitalised). Blocking adds the leading-space form of each (a tokenisation matter);
matching folds case, so for matching the casing variants are one form. Per category:

* ``PERSON``: each name part of at least 3 letters alone, unless it is an everyday English
  word (:data:`COMMON_WORDS`: "Rose", "Will", "Brown") or a title, suffix or particle;
  "Last, First", "Last First" and "First Last" (from either order); the first initial with the surname
  ("J. Smith", "J Smith", "Smith, J."); and, when the surname is not a part on its own,
  "Dr./Mr./Mrs./Ms. Surname".
* ``DATETIME``: a date written in any common clinical format is parsed (ISO ``2101-10-20``,
  ``10/20/2101``, ``20/10/2101``, ``Oct 20, 2101``, ``20 October 2101``, ``20-Oct-2101``,
  with or without year; a numeric date that reads both ways, ``10/06/2101``, is taken both
  ways) and rewritten: numeric in year-month-day, month-day-year and day-month-year order with
  ``-``, ``/`` and ``.``, padded and unpadded (year first: padded), four- and two-digit years; month names in full
  and abbreviated; and the same day without its year ("Oct 20", "20 October", "10/20"; numeric
  only with ``/`` and only when the day is above 12, so "3/4" or "1/2" are not dates).
  Month and year alone: "October 2101", "Oct 2101", "10/2101", "2101-10" ("8/87" only where
  the two-digit year cannot be a day). A numeric date with a two-digit year is read with the
  century pivot at 30 (``97`` is 1997, ``05`` is 2005). A time after the date is dropped.
* ``CODE`` and ``MISC``: phone numbers (7, 10 or 11 digits) with other separators (digits only,
  dashes, spaces, dots, parentheses, ``+1``); other identifiers of at least 6 letters and digits
  in two or more groups, with their groups joined by nothing, ``-``, a space, ``.`` or ``/``.
* other categories, and values without a category: casing only.

A value is a ``str``; its category travels either as a ``(value, category)`` pair or on a
:class:`Value` (a ``str`` that carries ``.category``, so lists of values keep working
everywhere a list of strings did).

Example:
    >>> sorted(match_keys("John Smith", "PERSON"))
    ['j smith', 'j. smith', 'john', 'john smith', 'smith', 'smith john', 'smith, j.', 'smith, john']
    >>> "oct 20, 2101" in match_keys("2101-10-20", "DATETIME")
    True
    >>> sorted(match_keys("Will Brown", "PERSON"))[:5]  # everyday words are not name parts alone
    ['brown will', 'brown, w.', 'brown, will', 'dr. brown', 'mr. brown']
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "COMMON_WORDS",
    "Value",
    "ValueLike",
    "casing_variants",
    "code_items",
    "date_forms",
    "match_keys",
    "name_forms",
    "normalize",
    "number_forms",
    "parse_dates",
    "split_value",
    "value_variants",
]


class Value(str):
    """A private value that carries its category (a ``str`` in every other respect).

    Equality, hashing and sorting are those of the string, so a set of values keeps one
    category per distinct string. String operations return plain ``str``.

    Example:
        >>> v = Value("Smith", "PERSON")
        >>> v == "Smith", v.category, split_value(v)
        (True, 'PERSON', ('Smith', 'PERSON'))
    """

    category: str | None

    def __new__(cls, value: str, category: str | None = None) -> Value:
        obj = super().__new__(cls, value)
        obj.category = category
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (Value, (str(self), self.category))

    def __repr__(self) -> str:
        return f"Value({str(self)!r}, {self.category!r})"


#: A value as the matchers and blocking take it: a string (a :class:`Value` carries its
#: category), or a ``(value, category)`` pair.
ValueLike = str | tuple[str, str | None]


def split_value(item: ValueLike) -> tuple[str, str | None]:
    """``(value, category)`` of a plain string (category None), a :class:`Value` or a pair."""
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[0], str):
            raise TypeError(f"a value pair must be (value, category), got a tuple of {len(item)} items")
        return item[0], item[1]
    if not isinstance(item, str):
        raise TypeError(f"a value must be a str or a (value, category) pair, not {type(item).__name__}")
    return str(item), getattr(item, "category", None)


def code_items(code: dict[str, list[str]]) -> list[Value]:
    """All values of a control code with their categories, in order (as :func:`~ctrlgen.fictional.code_values`)."""
    return [Value(v, cat) for cat in code for v in code[cat]]


def casing_variants(value: str) -> list[str]:
    """As written, lower, upper, title and capitalised (METHOD.md section 4), distinct, in that order."""
    out: list[str] = []
    for v in (value, value.lower(), value.upper(), value.title(), value[:1].upper() + value[1:]):
        if v and v not in out:
            out.append(v)
    return out


def value_variants(value: str, category: str | None = None) -> list[str]:
    """Every surface form of ``value`` (see module doc): each rewriting in its casing variants.

    The value as written comes first; forms are distinct. Whitespace is folded.
    """
    return list(_variants(" ".join(value.split()), category))


def match_keys(value: str, category: str | None = None) -> frozenset[str]:
    """What the gate and the metrics look for: the variants, normalised by :func:`normalize`."""
    return _keys(" ".join(value.split()), category)


def normalize(text: str) -> str:
    """How values are compared: whitespace folded, case folded."""
    return " ".join(text.split()).casefold()


@functools.lru_cache(maxsize=65536)
def _variants(value: str, category: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    out: dict[str, None] = {}
    for form in [value, *_rewritings(value, category)]:
        out.update(dict.fromkeys(casing_variants(form)))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _keys(value: str, category: str | None) -> frozenset[str]:
    return frozenset(normalize(v) for v in _variants(value, category))


def _rewritings(value: str, category: str | None) -> list[str]:
    if category == "PERSON":
        return name_forms(value)
    if category == "DATETIME":
        return date_forms(value)
    if category in ("CODE", "MISC"):
        return number_forms(value)
    return []


# --- PERSON -----------------------------------------------------------------------------------

#: Everyday English words that are also given names or surnames: not blocked or matched alone as
#: a part of a longer name (the full name and its other forms still are). Lower case.
COMMON_WORDS: frozenset[str] = frozenset(
    """
    able age aid ale alley amber angel april arch archer art ash august autumn baker ball bank banks barber bark
    barn baron bass bay beach bean bear bell belle berry best bill bird bishop black blank bliss bloom blue bond
    bone boot booth bow bowl bowman box brand bread brick bridge bright brook brooks brown buck bud buddy bull burn
    burns bush butcher butler cable call camp candy cannon cap card care carol carter case cash castle chance
    charity chase cherry child church clay cliff close cloud coal coat combs cook cooper coral corn cotton court
    crane crisp cross crow crystal cure daisy dale dart dash dawn day dean dear deer dell destiny diamond doe dole
    don dot dove down drake draper drew duke dusty dyer early east easter english eve fair faith fall farmer field
    fields finch fish fisher fletcher ford forest fort foster fox frank free freeman french frost fry fuller gale
    game gay gem gene gift ginger glass glen gold golden good grace grant gray green grey grove guy hale hall ham
    hand handy hardy harmony hart harvest hatch hawk hay hazel heath heather helm hill hills holly home honey hood
    hope horn house hunt hunter iris ivy jack jade jan jay jewel joy judge june keen key kind king knight lake lamb
    land lane lark law lawn lay lea leach legend lemon light lily lime link little lock long lord love low lucky
    mace major march mark marsh mason may mayor meadow mercy merry mill miller mills mint misty moon moss nail new
    north nurse oak olive orange page palmer park parks pastor patience peace pearl penny pepper pike pine piper
    plum pond porter post potter power powers price prince prudence quick rain rains ram ray read reader reed rich
    ridge ring rivers rob robin rock rocky rod root rose rowan ruby rule rush rust rusty sage sale salt sand sanders
    sandy savage sea sergeant sexton shade sharp shepherd ship shore short silver sky slater small snow south spark
    sparks speed spring squire stack stamp star steel stern steward stock stone storm story stout strange street
    strong summer summers sunny swan sweet swift tanner teal temple thorn tiller trace tree trinity true turner vale
    vine violet wade walker wall walls ward ware wash waters watt way weaver webb well wells welsh west wheeler white
    whitehead wild will wing winter wise wolf wood woods worth wren wright young sue pat bob max nick ada
    """.split()
)

_TITLES = frozenset(
    "dr dr. mr mr. mrs mrs. ms ms. miss mx mx. prof prof. sir dame rev rev. fr fr. sr. sister nurse".split()
)
_SUFFIXES = frozenset("jr jr. sr sr. ii iii iv md m.d. rn r.n. phd ph.d. do np pa esq esq.".split())
_PARTICLES = frozenset("van von der de del della di da la le du dos st st. mac bin ibn al el ten ter".split())
_LETTERS = re.compile(r"[^\W\d_]")
_NOT_ALONE = COMMON_WORDS | _TITLES | _SUFFIXES | _PARTICLES | {w.rstrip(".") for w in _TITLES | _SUFFIXES}


def _alone_ok(part: str) -> bool:
    """A name part that stands for the person alone: 3+ letters, not an everyday word or title."""
    bare = part.strip(".,'\"()").casefold()
    return len(_LETTERS.findall(bare)) >= 3 and not {bare, bare.rstrip(".")} & _NOT_ALONE


def _initial(word: str) -> str | None:
    ch = word.strip(".,'\"()")[:1]
    return ch.upper() if ch.isalpha() else None


def name_forms(value: str) -> list[str]:
    """Rewritings of a person's name (see module doc); the value itself is not included."""
    value = " ".join(value.split())
    if "," in value:  # "Last, First Middle" (a suffix after a second comma is dropped)
        last_s, _, given_s = value.partition(",")
        last, given = last_s.split(), given_s.replace(",", " ").split()
    else:
        words = value.split()
        given, last = words[:-1], words[-1:]
        while given and given[-1].casefold() in _PARTICLES:  # "Maria de la Cruz": the surname is "de la Cruz"
            last.insert(0, given.pop())
    given = [w for w in given if w.casefold() not in _TITLES and w.casefold() not in _SUFFIXES]
    while last and last[-1].casefold() in _SUFFIXES and len(last) > 1:
        last.pop()
    while len(last) > 1 and last[0].casefold() in _TITLES:
        last.pop(0)
    forms: list[str] = []
    parts = [p for w in given + last for p in [w, *(w.split("-") if "-" in w else [])]]
    forms.extend(p.strip(".,") for p in parts if _alone_ok(p))
    if not given or not last:
        return _distinct(forms, value)
    surname = " ".join(last)
    first = given[0]
    forms.append(" ".join(given + last))  # without titles / as "First Last"
    forms.append(f"{first} {surname}")
    forms.append(f"{surname}, {' '.join(given)}")
    forms.append(f"{surname}, {first}")
    forms.append(f"{surname} {first}")
    ini = _initial(first)
    if ini:
        forms.extend([f"{ini}. {surname}", f"{ini} {surname}", f"{surname}, {ini}."])
    if not any(_alone_ok(w) for w in last):  # "Brown" is not blocked alone: its titled forms are
        forms.extend(f"{t} {surname}" for t in ("Dr.", "Mr.", "Mrs.", "Ms."))
    return _distinct(forms, value)


def _distinct(forms: Iterable[str], value: str) -> list[str]:
    out: dict[str, None] = {}
    for f in forms:
        f = " ".join(f.split())
        if f and f != value:
            out[f] = None
    return list(out)


# --- DATETIME ---------------------------------------------------------------------------------

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]  # fmt: skip
_MONTH_OF = {m: i + 1 for i, m in enumerate(_MONTHS)} | {m[:3]: i + 1 for i, m in enumerate(_MONTHS)} | {"sept": 9}
_MON = r"(?P<mon>" + "|".join(sorted(_MONTH_OF, key=len, reverse=True)) + r")\.?"
_WEEKDAY = r"(?:(?:mon|tues?|wed(?:nes)?|thu(?:rs)?|fri|sat(?:ur)?|sun)(?:day)?\.?,?\s+)?"
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"(?P<y>\d{4}|'?\d{2})"
_DATE_PATTERNS = [
    re.compile(r"^(?P<y>\d{4})[-/.](?P<m>\d{1,2})[-/.](?P<d>\d{1,2})$"),
    re.compile(r"^(?P<a>\d{1,2})(?P<s>[-/.])(?P<b>\d{1,2})(?P=s)(?P<y>\d{4}|\d{2})$"),
    re.compile(r"^(?P<a>\d{1,2})[-/.](?P<b>\d{1,2})$"),
    re.compile(r"^(?P<m>\d{1,2})[-/.](?P<y>\d{4})$"),
    re.compile(r"^(?P<y>\d{4})-(?P<m>\d{1,2})$"),
    re.compile(rf"^{_MON},?\s*(?P<y>\d{{4}})$", re.I),
    re.compile(rf"^{_WEEKDAY}{_MON}\s*(?P<d>\d{{1,2}}){_ORD}(?!\d)(?:(?:,\s*|\s+){_YEAR})?$", re.I),
    re.compile(rf"^{_WEEKDAY}(?P<d>\d{{1,2}}){_ORD}(?:\s+of)?[\s-]*{_MON}(?:(?:,\s*|[\s-]+){_YEAR})?$", re.I),
]
_TIME = re.compile(r"(?:,?\s*(?:at\s+)?\d{1,2}:\d{2}(?::\d{2})?\s*(?:[ap]\.?m\.?)?|\s+\d{1,2}\s*[ap]\.?m\.?)$", re.I)


def _year4(y: str) -> int:
    """Four-digit year: two digits pivot at 30 (``97`` is 1997, ``05`` is 2005)."""
    y = y.lstrip("'")
    n = int(y)
    if len(y) == 4:
        return n
    return 1900 + n if n >= 30 else 2000 + n


def _valid(m: int, d: int | None) -> bool:
    return 1 <= m <= 12 and (d is None or 1 <= d <= 31)


def parse_dates(value: str) -> list[tuple[int | None, int, int | None]]:
    """Every reading ``(year, month, day)`` of a date (year or day None when absent)."""
    text = _TIME.sub("", value.strip().strip("()[],")).strip()
    for pat in _DATE_PATTERNS:
        m = pat.match(text)
        if not m:
            continue
        g = m.groupdict()
        y = _year4(g["y"]) if g.get("y") else None
        if g.get("mon"):
            month, day = _MONTH_OF[g["mon"].casefold()], (int(g["d"]) if g.get("d") else None)
            return [(y, month, day)] if _valid(month, day) else []
        if g.get("a"):
            a, b = int(g["a"]), int(g["b"])
            if y is None and b > 31 and 1 <= a <= 12:  # "8/87": month and two-digit year
                return [(_year4(g["b"]), a, None)]
            readings = [(y, a, b), (y, b, a)] if a != b else [(y, a, b)]
            return [r for r in readings if _valid(r[1], r[2])]
        month, day = int(g["m"]), (int(g["d"]) if g.get("d") else None)
        return [(y, month, day)] if _valid(month, day) else []
    return []


def _render_date(y: int | None, m: int, d: int | None) -> list[str]:
    full, abbr = _MONTHS[m - 1].capitalize(), _MONTHS[m - 1][:3].capitalize()
    names = [full] if full == abbr else [full, abbr]
    out: list[str] = []
    if d is None:
        if y is None:
            return out
        out += [f"{name} {y}" for name in names]
        out += [f"{m}/{y}", f"{m:02d}/{y}", f"{y}-{m:02d}"]
        if y % 100 > 31:  # "8/87" cannot be read as a day of August; "10/01" can
            out += [f"{m}/{y % 100:02d}", f"{m:02d}/{y % 100:02d}"]
        return out
    if y is not None:
        y2 = f"{y % 100:02d}"
        for sep in "-/.":
            out.append(f"{y}{sep}{m:02d}{sep}{d:02d}")
            for mm, dd in ((f"{m:02d}", f"{d:02d}"), (str(m), str(d))):
                for yy in (str(y), y2):
                    out += [f"{mm}{sep}{dd}{sep}{yy}", f"{dd}{sep}{mm}{sep}{yy}"]
        for name in names:
            out += [f"{name} {d}, {y}", f"{name} {d} {y}", f"{d} {name} {y}"]
        out += [f"{abbr}. {d}, {y}", f"{d}-{abbr}-{y}", f"{d}-{abbr}-{y2}", f"{full} {d}{_ordinal(d)}, {y}",
                f"{d}{_ordinal(d)} {full} {y}", f"{d}{_ordinal(d)} of {full} {y}"]  # fmt: skip
    for name in names:  # without the year
        out += [f"{name} {d}", f"{d} {name}"]
    out += [f"{abbr}. {d}", f"{full} {d}{_ordinal(d)}", f"{d}{_ordinal(d)} {full}", f"{d}{_ordinal(d)} of {full}"]
    if d > 12:  # numeric without year only where it cannot be a fraction or a score ("3/4", "1/10")
        out += [f"{m}/{d}", f"{m:02d}/{d}"]
    return out


def _ordinal(d: int) -> str:
    return "th" if 10 <= d % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")


def date_forms(value: str) -> list[str]:
    """Rewritings of a date (see module doc); empty when ``value`` is not a date this parses."""
    value = " ".join(value.split())
    forms: list[str] = []
    for y, m, d in parse_dates(value):
        forms += _render_date(y, m, d)
    return _distinct(forms, value)


# --- CODE / MISC: phone numbers and identifiers -----------------------------------------------

_PHONE_CHARS = re.compile(r"^[\d\s\-.()+/]+$")
_GROUPS = re.compile(r"[^\W_]+")


def _phone_like(groups: list[str]) -> bool:
    """Digit groups of a phone number: 7, 10 or 11 digits split only where phone numbers split."""
    n = sum(len(g) for g in groups)
    cuts = {sum(len(g) for g in groups[: i + 1]) for i in range(len(groups) - 1)}
    allowed = {7: {3}, 10: {3, 6}, 11: {1, 4, 7}}.get(n)
    return allowed is not None and cuts <= allowed


def _phone(d: str) -> Iterator[str]:
    if len(d) == 11 and d[0] == "1":
        d = d[1:]
    if len(d) == 10:
        a, b, c = d[:3], d[3:6], d[6:]
        yield from (d, f"{a}-{b}-{c}", f"{a} {b} {c}", f"{a}.{b}.{c}", f"({a}) {b}-{c}", f"({a}){b}-{c}",
                    f"({a}) {b} {c}", f"{a}/{b}-{c}", f"1-{a}-{b}-{c}", f"+1 {a} {b} {c}", f"+1-{a}-{b}-{c}",
                    f"+1 ({a}) {b}-{c}")  # fmt: skip
    elif len(d) == 7:
        yield from (d, f"{d[:3]}-{d[3:]}", f"{d[:3]} {d[3:]}", f"{d[:3]}.{d[3:]}")


def number_forms(value: str) -> list[str]:
    """Rewritings of a phone number or an identifier (see module doc)."""
    value = " ".join(value.split())
    forms: list[str] = []
    if _PHONE_CHARS.match(value) and _phone_like(re.findall(r"\d+", value)):
        forms += _phone("".join(re.findall(r"\d+", value)))
    groups = _GROUPS.findall(value)
    if not forms and len(groups) >= 2 and sum(len(g) for g in groups) >= 6:
        forms += [sep.join(groups) for sep in ("", "-", " ", ".", "/")]
    return _distinct(forms, value)
