"""Fictional control codes (METHOD.md section 3): every real value -> a made-up one of its kind.

Values come from Faker (pinned in ``pyproject.toml``, so a seed gives the same
values on every machine) and small built-in lists, following the paper's
patterns:

* PERSON: title + first + last name (a one-word real value, e.g. a surname after
  "Dr.", gets a surname; a two-word one first + last);
* CODE: the real value's shape with random characters (digit -> digit, letter ->
  letter, punctuation kept), so ``36244/06`` -> ``81520/13`` and ``ABCDE/XY``-style
  codes stay alphanumeric;
* DATETIME: a random date 1990-2024 as ``DD Month YYYY``;
* LOC: a city, country, street address or landmark; ORG: a company, hospital or
  university; DEM: a heritage, a job or ``N-year-old``; QUANTITY: ``45%`` or
  ``$87,500``; MISC: a made-up event / product / condition name.

MIMIC placeholder values (``Hospital1 18``, ``First Name (NamePattern1) 1234``,
``2101-10-20``, ...) get a value of their own placeholder type (a hospital name,
a first name, a date, a phone number, ...).

A fictional value is never one of the corpus' real private values (compared
case-insensitively); the code keeps its categories and, by default, the number
of values per category. Each document's code is drawn from a generator seeded by
``(seed, doc_id)``, so it does not depend on batching or on the other documents.

Example:
    >>> gen = FictionalCodes(seed=0, exclude={"alice jones"})
    >>> fake = gen.fictionalize({"PERSON": ["Alice Jones"], "CODE": ["36244/06"]}, doc_id="d1")
    >>> sorted(fake), len(fake["PERSON"]), fake["CODE"][0][5]
    (['CODE', 'PERSON'], 1, '/')
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable

from faker import Faker

from ctrlgen.codes import ControlCode
from ctrlgen.errors import CtrlgenError
from ctrlgen.placeholders import placeholder_type
from ctrlgen.schema import CATEGORIES

__all__ = ["FictionalCodes", "code_values", "fictional_value", "placeholder_kind"]

_MONTHS = ("January February March April May June July August September October November December").split()
_TITLES = ("Mr.", "Mrs.", "Ms.", "Dr.", "Prof.")
_LANDMARKS = (
    "Riverside Park",
    "the Old Harbour Bridge",
    "Millbrook Library",
    "Cedar Lake",
    "the Northgate Mall",
    "Elm Street Station",
    "Granite Hill",
    "the Westfield Market",
    "Lakeview Pier",
    "the Copper Tower",
)
_HERITAGE = (
    "Armenian",
    "Basque",
    "Cuban",
    "Estonian",
    "Filipino",
    "Ghanaian",
    "Icelandic",
    "Kenyan",
    "Laotian",
    "Maltese",
    "Nepali",
    "Peruvian",
    "Samoan",
    "Sicilian",
    "Tongan",
    "Uruguayan",
    "Welsh",
    "Yemeni",
)
_ORG_SUFFIX = ("General Hospital", "Medical Center", "Community Clinic", "University", "Rehabilitation Center")
_MISC_PARTS = (
    ("Operation", "Project", "Festival of", "Treaty of", "Order of", "Syndrome of"),
    ("Silver", "Northern", "Amber", "Quiet", "Crimson", "Granite", "Willow", "Cobalt"),
    ("Lantern", "Harbor", "Meadow", "Falcon", "Compass", "Orchard", "Summit", "Beacon"),
)
_UNITS = ("MICU", "SICU", "CCU", "Ward 4B", "Step-down Unit", "Telemetry 7", "Neuro ICU", "Ward 12")
_DIGIT_RE = re.compile(r"\d")

Sampler = Callable[[Faker, random.Random, str], str]


def code_values(code: ControlCode) -> list[str]:
    """All values of a control code, in order."""
    return [v for cat in code for v in code[cat]]


def _shape_like(real: str, rng: random.Random) -> str:
    out = []
    for ch in real:
        if ch.isdigit():
            out.append(str(rng.randrange(10)))
        elif ch.isalpha():
            letter = chr(rng.randrange(26) + 65)
            out.append(letter.lower() if ch.islower() else letter)
        else:
            out.append(ch)
    return "".join(out)


def _random_date(rng: random.Random) -> tuple[int, int, int]:
    year = rng.randint(1990, 2024)
    month = rng.randint(1, 12)
    day = rng.randint(1, 28)
    return day, month, year


def _person(f: Faker, rng: random.Random, real: str) -> str:
    words = real.replace(".", ". ").split()
    if len(words) <= 1:
        return str(f.last_name())
    if len(words) == 2:
        return f"{f.first_name()} {f.last_name()}"
    return f"{rng.choice(_TITLES)} {f.first_name()} {f.last_name()}"


def _code(f: Faker, rng: random.Random, real: str) -> str:
    if any(c.isalnum() for c in real):
        return _shape_like(real, rng)
    letters = "".join(chr(rng.randrange(26) + 65) for _ in range(5))
    return f"{letters}/{chr(rng.randrange(26) + 65)}{chr(rng.randrange(26) + 65)}"


def _datetime(f: Faker, rng: random.Random, real: str) -> str:
    day, month, year = _random_date(rng)
    return f"{day:02d} {_MONTHS[month - 1]} {year}"


def _loc(f: Faker, rng: random.Random, real: str) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return str(f.city())
    if kind == 1:
        return str(f.country())
    if kind == 2:
        return str(f.street_address())
    return rng.choice(_LANDMARKS)


def _org(f: Faker, rng: random.Random, real: str) -> str:
    if rng.random() < 0.5:
        return str(f.company())
    return f"{f.last_name()} {rng.choice(_ORG_SUFFIX)}"


def _dem(f: Faker, rng: random.Random, real: str) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(_HERITAGE)
    if kind == 1:
        return str(f.job())
    return f"{rng.randint(18, 89)}-year-old"


def _quantity(f: Faker, rng: random.Random, real: str) -> str:
    if rng.random() < 0.5:
        return f"{rng.randint(1, 99)}%"
    return f"${rng.randint(1, 200) * 500:,}"


def _misc(f: Faker, rng: random.Random, real: str) -> str:
    return " ".join(rng.choice(part) for part in _MISC_PARTS)


_BY_CATEGORY: dict[str, Sampler] = {
    "PERSON": _person,
    "CODE": _code,
    "LOC": _loc,
    "ORG": _org,
    "DEM": _dem,
    "DATETIME": _datetime,
    "QUANTITY": _quantity,
    "MISC": _misc,
}
assert set(_BY_CATEGORY) == set(CATEGORIES), "every category needs a generator"


# --- MIMIC placeholder types ------------------------------------------------------------------
def _ph_date(f: Faker, rng: random.Random, real: str) -> str:
    day, month, year = _random_date(rng)
    if re.fullmatch(r"\d{4}-\d{1,2}-\d{1,2}", real):
        return f"{year}-{month:02d}-{day:02d}"
    if re.fullmatch(r"\d{1,2}[-/]\d{1,2}", real):
        return f"{month}/{day}"
    if re.fullmatch(r"\d{1,2}[-/]\d{1,2}[-/]\d{2,4}", real):
        return f"{month}/{day}/{year}"
    return f"{day:02d} {_MONTHS[month - 1]} {year}"


def _digits(n: int) -> Sampler:
    return lambda f, rng, real: "".join(str(rng.randrange(10)) for _ in range(n))


# (keyword in the lower-cased placeholder label, sampler); the first match wins.
_PLACEHOLDER_SAMPLERS: tuple[tuple[str, Sampler], ...] = (
    ("age over", lambda f, rng, real: str(rng.randint(90, 104))),
    ("initials", lambda f, rng, real: f"{chr(rng.randrange(26) + 65)}.{chr(rng.randrange(26) + 65)}."),
    ("prefix", lambda f, rng, real: rng.choice(_TITLES)),
    ("first name", lambda f, rng, real: str(f.first_name())),
    ("last name", lambda f, rng, real: str(f.last_name())),
    ("lastname", lambda f, rng, real: str(f.last_name())),
    ("name", lambda f, rng, real: f"{f.first_name()} {f.last_name()}"),
    ("unit name", lambda f, rng, real: rng.choice(_UNITS)),
    ("ward", lambda f, rng, real: rng.choice(_UNITS)),
    ("telephone", lambda f, rng, real: f"({rng.randint(200, 989)}) {rng.randint(200, 989)}-{rng.randint(0, 9999):04d}"),
    ("fax", lambda f, rng, real: f"({rng.randint(200, 989)}) {rng.randint(200, 989)}-{rng.randint(0, 9999):04d}"),
    ("pager", _digits(5)),
    ("e-mail", lambda f, rng, real: str(f.email())),
    ("url", lambda f, rng, real: str(f.url())),
    (
        "social security",
        lambda f, rng, real: f"{rng.randint(100, 899)}-{rng.randint(10, 99)}-{rng.randint(1000, 9999)}",
    ),
    ("medical record", _digits(7)),
    ("number", _digits(6)),
    ("identifier", _digits(6)),
    ("info", lambda f, rng, real: f"{f.first_name()} {f.last_name()}, {f.phone_number()}"),
    ("hospital", lambda f, rng, real: f"{f.last_name()} {rng.choice(_ORG_SUFFIX[:3])}"),
    ("company", lambda f, rng, real: str(f.company())),
    ("university", lambda f, rng, real: f"{f.last_name()} University"),
    ("college", lambda f, rng, real: f"{f.last_name()} College"),
    ("street address", lambda f, rng, real: str(f.street_address())),
    ("address", lambda f, rng, real: str(f.street_address())),
    ("po box", lambda f, rng, real: f"PO Box {rng.randint(100, 9999)}"),
    ("state", lambda f, rng, real: str(f.state())),
    ("country", lambda f, rng, real: str(f.country())),
    ("location", lambda f, rng, real: str(f.city())),
    ("holiday", lambda f, rng, real: rng.choice(("Thanksgiving", "Christmas", "Labor Day", "New Year's Day"))),
    ("month", lambda f, rng, real: rng.choice(_MONTHS)),
    ("year", lambda f, rng, real: str(rng.randint(1990, 2024))),
    ("day", lambda f, rng, real: rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"))),
    ("date", _ph_date),
)
_PH_NUMBERED = re.compile(r"^(?P<label>.*\D)\s*\d+\s*$")


def placeholder_kind(value: str) -> str | None:
    """The placeholder label of a MIMIC placeholder value (``Hospital1 18`` -> ``Hospital1``),
    ``"Date"`` for a bare placeholder date, or None for an ordinary value."""
    value = value.strip()
    if re.fullmatch(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}-\d{1,2}(-\d{2,4})?", value):
        return "Date"
    m = _PH_NUMBERED.match(value)
    if not m or not any(c.isalpha() for c in m.group("label")):
        return None
    category, _, label = placeholder_type(value)
    if category == "MISC" and "(" not in label:
        return None
    return label


def _placeholder_sampler(label: str) -> Sampler | None:
    low = label.lower()
    for key, sampler in _PLACEHOLDER_SAMPLERS:
        if key in low:
            return sampler
    return None


def fictional_value(category: str, real: str, faker: Faker, rng: random.Random) -> str:
    """One fictional value for a real value of ``category`` (not yet checked against the corpus)."""
    kind = placeholder_kind(real)
    if kind is not None:
        sampler = _ph_date if kind == "Date" else _placeholder_sampler(kind)
        if sampler is not None:
            return sampler(faker, rng, real)
    try:
        return _BY_CATEGORY[category](faker, rng, real)
    except KeyError:
        raise CtrlgenError(f"no fictional-value generator for category {category!r}") from None


class FictionalCodes:
    """Seeded fictional control codes that avoid the corpus' real private values.

    Args:
        seed: global seed; each document's code is seeded by ``(seed, doc_id)``.
        exclude: the corpus' real private values (any case); never emitted.
        same_counts: keep the number of values per category (else one value each).
        max_tries: draws per value before giving up (an error, never a real value).
    """

    def __init__(self, seed: int = 0, exclude: Iterable[str] = (), *, same_counts: bool = True, max_tries: int = 50):
        self.seed = seed
        self.exclude = {v.casefold().strip() for v in exclude}
        self.same_counts = same_counts
        self.max_tries = max_tries
        self._faker = Faker("en_US")

    def _rng(self, doc_id: str) -> random.Random:
        digest = hashlib.sha256(f"{self.seed}\x1f{doc_id}".encode()).digest()
        n = int.from_bytes(digest[:8], "big")
        self._faker.seed_instance(n)
        return random.Random(n)

    def fictionalize(self, code: ControlCode, doc_id: str = "") -> ControlCode:
        """Same categories (and value counts), fictional values, reproducible per ``doc_id``."""
        rng = self._rng(doc_id)
        out: ControlCode = {}
        for cat in code:
            if cat not in _BY_CATEGORY:
                raise CtrlgenError(f"control code of document {doc_id!r} has unknown category {cat!r}")
            used: set[str] = set()
            values = code[cat] if self.same_counts else code[cat][:1]
            for real in values:
                for _ in range(self.max_tries):
                    fake = fictional_value(cat, real, self._faker, rng).strip()
                    key = fake.casefold()
                    if fake and key not in self.exclude and key not in used:
                        break
                else:
                    raise CtrlgenError(
                        f"document {doc_id!r}: no fictional {cat} value outside the corpus' real values "
                        f"after {self.max_tries} tries"
                    )
                used.add(key)
                out.setdefault(cat, []).append(fake)
        return out
