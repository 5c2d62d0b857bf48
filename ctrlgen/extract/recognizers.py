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
    """A pattern: its name, regex and score. ``needs``, when given, is a cheap regex that every text the
    pattern matches in also matches somewhere (a literal part the pattern cannot match without, e.g. the
    words of its look-behind): a text without it skips the pattern, with the same results (a speed-up only:
    the pattern's own regex decides every match; tests/unit/test_recognizer_gates.py checks each is implied).
    """

    name: str
    regex: str
    score: float
    needs: str | None = None


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
            needs=r"\b(?:mrn|mr ?#|unit (?:no|#)|record (?:#|no)|acct|id)[:.# ]",
        ),
        _P(
            "medical record number",
            r"(?<=\bmedical record number[: ])\s*\d{4,12}\b",
            0.9,
            needs=r"\bmedical record number[: ]",
        ),
        _P("ssn", r"\b\d{3}-\d{2}-\d{4}\b", 0.7),
        _P(
            "serial / license / policy number",
            r"(?<=\b(?:serial|license|licence|insurance policy|policy (?:no\.?|number)|member|subscriber|certificate|plate)(?: no\.?| number| #|#)?[:.# ]{1,2})"
            r"(?=[A-Z-]*\d)[A-Z0-9][A-Z0-9-]{3,19}\b",
            0.8,
            needs=r"\b(?:serial|licen[cs]e|insurance policy|policy (?:no|number)|member|subscriber|certificate|plate)",
        ),
    ),
)
PHONE = RecognizerSpec(
    "ClinicalPhoneRecognizer",
    "CODE",
    (
        _P("phone 10 digits", r"\(?\b\d{3}\)?[-./ ] ?\d{3}[-./ ] ?\d{4,5}\b", 0.8),
        _P("phone 3+7 / 6+4 digits", r"\(?\b(?:\d{3} \d{7}|\d{6}-\d{4})\b", 0.7),
        _P(
            "phone 7 digits",
            # not a range of measurements ("TV 900-1000", "SVR 954-1183", "pass 800-1000 ccs")
            r"(?<!\b(?:svr|tv|vt|stv|hr|rr|bp|volumes?|vols?|to|the|of|is|between|pass|passed|range|from|co|ci)\s{0,3})"
            r"\b\d{3}-\d{4}\b(?!\s*(?:cc|ccs|ml|mls|mg|units?)\b)",
            0.5,
        ),
        _P(
            "pager / beeper / extension",
            r"(?<=\b(?:pager|beeper|page|pgr|ext|x|#)(?: number| no\.?| #)?[ .:#]{0,4})\d{4,6}\b",
            0.75,
        ),
    ),
)
CONTACT = RecognizerSpec(
    "ContactRecognizer",
    "CODE",
    (
        _P("email", r"\b[\w.+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b", 0.9),
        # a scheme or "www." only: Presidio's UrlRecognizer also takes "WHEELCHAIR...CA" and "DNR.SE" (740
        # such hits on the PhysioNet notes, none a URL)
        _P("url", r"\b(?:https?://|www\.)[^\s<>\"'()]*[^\s<>\"'().,;:!?]", 0.8),
    ),
)
AGE = RecognizerSpec(
    "AgeRecognizer",
    "DEM",
    (
        _P("N year old", r"\b\d{1,3}(?=\s*-?\s*(?:years?|yrs?|yo|y/o|y\.o\.)(?:[\s-]*old)?\b)", 0.95),
        _P("age N", r"(?<=\bage[d:]? )\d{1,3}\b", 0.95),
        _P("N-year-old", r"\b\d{1,3}(?=-year-old\b)", 0.95),
        _P(
            "NM / NF",
            # "67M with DM2", "HPI: 92 F", not a catheter's French size ("a 16F foley", "14 F sheath")
            r"(?<=(?:^|\b(?:an?|is|pt|patient|hpi:?|cc:?|id:?)\s{1,2}))\d{1,3}(?=\s?(?-i:[MF])\b(?!\s*(?:fr\b|french|foley|"
            r"cath\w*|tube|ngt?|ogt?|ett?\b|sheath|picc|introducer|coude|trach)))",
            0.8,
        ),
    ),
)
DATE = RecognizerSpec(
    "ClinicalDateRecognizer",
    "DATETIME",
    (
        _P(
            "m/d(/y)",
            # not ventilator / pressure settings ("PS 10/5", "PEEP 5/5") or fractions ("D5 1/2 NS")
            r"(?<!\b(?:ps|psv|peep|cpap|bipap|ac|imv|simv|bp|vent|settings|d5|d5w|at rate of|ps of|flowby|ventilation)"
            r"\s{0,3})(?<![\d.%/'])(?<![\d%/'] )"
            r"\b(?:1[0-2]|0?[1-9])/(?:3[01]|[12]\d|0?[1-9])(?:/(?:\d{4}|\d{2}))?\b"
            r"(?!\s*(?:ns|strength|mg|ml|peep|ps|cmh2o|%|amps?|tabs?|units?)\b)(?![/.]\d)",
            0.7,
        ),
        _P("y-m-d", r"\b\d{4}-\d{1,2}-\d{1,2}\b", 0.85),
        # glued to the word before it: "labs on10/14/82", "to Quartermain.8/31"
        _P(
            "glued m/d(/y)",
            r"(?:(?<=[a-z])|(?<=[a-z]\.))(?:1[0-2]|0?[1-9])/(?:3[01]|[12]\d|0?[1-9])(?:/(?:\d{4}|\d{2}))?\b(?![/.]\d)",
            0.6,
        ),
        # nursing notes' "3-24-17" (not a lab string "2245-105-4.7" nor a range "12-14-16 breaths")
        _P(
            "m-d-y",
            r"(?<![\d.-])\b(?:1[0-2]|0?[1-9])-(?:3[01]|[12]\d|0?[1-9])-(?:\d{4}|\d{2})\b(?![-.]\d)"
            r"(?!\s*(?:breaths|bpm|mg|ml|cc|mmhg|%))",
            0.7,
        ),
        _P("d month y", rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTHS}\.?,? \d{{4}}\b", 0.9),
        _P("month d, y", rf"\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b", 0.75),
        _P("month y", rf"\b{_MONTHS}\.?,? (?:of )?(?:19|20)\d{{2}}\b", 0.75),
        _P(
            "m/yy",
            # "s/p AVR 8/88", "ovarian CA (12/93)": a second number above 31 can only be a year
            r"(?<!\b(?:ps|psv|peep|cpap|bipap|bp|vent|pap|pa)\s{0,3})(?<![\d.%/'])\b(?:1[0-2]|0?[1-9])/(?:3[2-9]|[4-9]\d)\b(?![/.]\d|\s*%)",
            0.6,
        ),
        _P("on the Nth", r"(?<=\bon the )(?:3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)\b", 0.6, needs=r"\bon the "),
        # past history: "CABG 81", "MI '92", "s/p AVR 8/88" (the year of a procedure or event)
        _P(
            "procedure 'yy",
            r"(?<=\b(?:cabg|mi|ptca|pci|avr|mvr|stent|ppm|aicd|icd|nqwmi|imi|ami|cath|bka|aka|thr|tkr|cva|tia|dx|dx'd|diagnosed) )'?\d{2}\b(?![\d/%:']|\.\d|\s*(?:mg|mcg|ml|cc|units?|mm|cm|hrs?|min|x|%|yo|y/o|years?|pk|pack)\b)",
            0.55,
        ),
        _P(
            "year",
            # not a 24-hour time ("at 2000", "around 1930", "LABS=2000-BUN") nor an amount
            r"(?<!\b(?:at|around|about|by|until|till|before|after|from|to|labs?)\s{0,2})(?<![=@:])"
            r"\b(?:19\d\d|20\d\d)\b(?![-:])(?!\s*(?:hrs?|h|pm|am|cc|ccs|ml|mls|mg|kcal|cal|calories|units?)\b)",
            0.55,
        ),
        _P(
            "'yy procedure",
            r"(?:(?<=[.;:,] )|(?<=^)|(?<=\n))'?\d{2}(?= (?:ptca|pci|stent|cabg|avr|mvr|mi|cath|cva|tia)\b)",
            0.55,
        ),
        _P("yy' / 'yy", r"(?<=\D')\d{2}\b(?!')|\b\d{2}(?='(?![s\w]))", 0.55),
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
# A word of a name in a header field: capitalised or upper case, not a word that starts a sentence there.
_FIELD_WORD = (
    r"(?!(?:pt|patient|the|is|was|he|she|his|her|no|none|yes|unknown|same|see|as|per|not|na|n/a|self|dr|md)\b)"
    r"(?-i:[A-Z][A-Za-z'\-]+)"
)
NAME_FIELD = RecognizerSpec(
    "NameFieldRecognizer",
    "PERSON",
    (
        _P(
            "name field",
            # header fields of notes and letters: "Name: SMITH, JOHN A.", "Attending: Baker, Thomas", "PCP: Alan Ng"
            r"(?<=\b(?:name|patient|pt name|patient name|attending|resident|referring (?:md|physician|provider)|pcp|"
            r"primary care(?: physician| provider)?|provider|physician|surgeon|dictated by|signed by|cc|author|"
            r"nok|next of kin|emergency contact|guardian|health care proxy|hcp)[ \t]?:[ \t]{0,3}(?:dr\.?[ \t])?)"
            rf"{_FIELD_WORD}(?:,?[ \t]{_FIELD_WORD}){{0,2}}(?:[ \t](?-i:[A-Z])\b\.?)?",
            0.7,
            needs=r"\b(?:name|patient|pt name|patient name|attending|resident|referring (?:md|physician|provider)|pcp|primary care(?: physician| provider)?|provider|physician|surgeon|dictated by|signed by|cc|author|nok|next of kin|emergency contact|guardian|health care proxy|hcp)[ \t]?:",
        ),
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
# Hospitals and campuses named the way clinical notes name them (the gold of deid corpora
# calls them locations): "Sacred Heart Memorial", "St Mary's", "Laurel Regional", "North Campus",
# "U of MD", "VAMC". The name words must be capitalised where the pattern says (?-i:...).
_CAP = r"(?-i:[A-Z][A-Za-z'\-]+)"
CLINICAL_FACILITY = RecognizerSpec(
    "ClinicalFacilityRecognizer",
    "LOC",
    (
        _P(
            "saint / sacred / holy + name",
            rf"\b(?-i:St\.?|Saint) (?-i:[A-Z][a-z'\-]+)(?:'s)?|\b(?-i:ST\.?|SAINT|St\.?|Saint) {_CAP}(?:'s\b|(?= (?:hospital|medical center|memorial|campus|hosp)\b))"
            r"|\b(?:sacred heart|holy (?:cross|family|name|spirit|redeemer))\b",
            0.7,
        ),
        _P(
            "name + regional / memorial / campus / hosp",
            rf"\b{_NOT_NAME}{_CAP}(?: {_NOT_NAME}{_CAP})? (?:regional(?! (?:wall|anesth\w*|lymph\w*|block|motion|perfusion))|memorial|campus|medical center|med(?:ical)? ctr|med center)\b"
            # "Calvert Hospital" in mixed case only: in upper-case notes "LEAVE HOSPITAL" reads the same
            r"|\b(?-i:[A-Z][a-z'\-]+)(?: (?-i:[A-Z][a-z'\-]+))? (?:hospital|hosp)\b",
            0.7,
            needs=r" (?:regional|memorial|campus|med(?:ical)? c(?:enter|tr)|hosp)",
        ),
        _P("university of", r"\b(?:university|univ\.?|u\.?) ?of ?(?-i:[A-Z][A-Za-z]+)\b", 0.7),
        _P(
            "name + practice / associates / group / company",
            # "Brookside Family Practice", "Harbor Medical Associates", "Boston Builders Inc" (employers count too)
            rf"\b{_NOT_NAME}{_CAP}(?: {_NOT_NAME}{_CAP}){{0,2}} (?:(?:family |internal medicine )?practice|associates"
            r"|medical group|nursing home|rehab(?:ilitation)? center|health center|(?-i:Inc|LLC|Corp|Co)\b\.?"
            r"|(?-i:Company|Corporation))\b",
            0.7,
            needs=r" (?:(?:family |internal medicine )?practice|associates|medical group|nursing home|rehab|health center|(?-i:Inc|LLC|Corp|Co)\b|(?-i:Company|Corporation))",
        ),
        _P(
            "street address",
            r"\b\d{1,5} (?-i:[A-Z][A-Za-z]+ ){1,3}(?:st|street|ave|avenue|rd|road|blvd|boulevard|dr|drive|lane|ln|way|court|ct|place|pl)\b\.?",
            0.7,
        ),
        _P(
            "lives in / moved from",
            r"(?<=\b(?:lives|living|resides|resident|moved|moving|relocated|home) (?:in|at|to|from|near) )(?:(?-i:[A-Z][A-Za-z'\-]+|[A-Z]{2})(?: (?-i:[A-Z][A-Za-z'\-]+))?)\b",
            0.6,
            needs=r"\b(?:lives|living|resides|resident|moved|moving|relocated|home) (?:in|at|to|from|near) ",
        ),
        _P("veterans hospital", r"\b(?:vamc|va medical center|va hospital|vah)\b", 0.8),
        _P(
            "zip code after a state",
            # "Quincy MA 02169", "Boston, MA. 02115-1234": upper-case state codes only ("in 10000 units" is no zip)
            r"(?<=\b(?-i:A[LKZR]|C[AOT]|D[EC]|FL|GA|HI|I[DLNA]|K[SY]|LA|M[EDAINSOT]|N[EVHJMYCD]|O[HKR]|PA|RI|S[CD]|T[NX]|UT"
            r"|V[TA]|W[AVIY])\.?,?\s{1,2})\d{5}(?:-\d{4})?\b",
            0.7,
        ),
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
    r.name: r
    for r in (
        ECHR_APPLICATION,
        MEDICAL_ID,
        PHONE,
        CONTACT,
        AGE,
        DATE,
        TITLED_NAME,
        NAME_FIELD,
        ORGANISATION,
        CLINICAL_FACILITY,
        QUANTITY,
    )
}


class _GatedRegex:
    """A compiled pattern that first looks for its ``needs`` regex: a text without it has no match, so
    ``finditer`` returns no match without running the pattern (most notes: the pattern's look-behinds and
    leading word classes are tried at every position, its gate's literal words are not)."""

    __slots__ = ("full", "gate")

    def __init__(self, full: Any, gate: Any) -> None:
        self.full, self.gate = full, gate

    def finditer(self, text: str, *args: Any, **kwargs: Any) -> Any:
        if self.gate.search(text, timeout=kwargs.get("timeout")) is None:
            return iter(())
        return self.full.finditer(text, *args, **kwargs)


def build_pattern_recognizer(spec: RecognizerSpec, gates: bool = True) -> Any:
    """A Presidio ``PatternRecognizer`` from a spec (case-insensitive patterns).

    With ``gates``, a pattern that has ``needs`` is compiled once here as a :class:`_GatedRegex` with the
    recognizer's flags (Presidio keeps a pattern's compiled regex and recompiles it, without the gate, only
    when called with other flags). The same results either way; ``gates=False`` is for checking that.
    """
    import regex
    from presidio_analyzer import Pattern, PatternRecognizer

    patterns = [Pattern(p.name, p.regex, p.score) for p in spec.patterns]
    rec = PatternRecognizer(supported_entity=spec.entity, name=spec.name, patterns=patterns)
    if gates:
        flags = rec.global_regex_flags
        for pat, p in zip(patterns, spec.patterns, strict=True):
            if p.needs:
                pat.compiled_regex = _GatedRegex(
                    regex.compile(p.regex, flags=flags), regex.compile(p.needs, flags=flags)
                )
                pat.compiled_with_flags = flags
    return rec


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


#: Words that make a following (or preceding) dictionary-ambiguous name a name: titles,
#: relations, roles (deid's context rules, general English and clinical usage).
NAME_CONTEXT = frozenset(
    """dr doctor drs mr mrs ms miss mister wife husband son sons daughter daughters dtr mother mom father dad
    brother sister aunt uncle niece nephew cousin grandson granddaughter grandmother grandfather friend girlfriend
    boyfriend fiance fiancee spouse hcp proxy named""".split()
)
_TITLES = frozenset("dr doctor drs mr mrs ms miss mister rabbi reverend rev chaplain".split())
#: Credentials written after a clinician's name ("Q. Lander RRT", "Kavaliunas NP", "Foley, CRT").
#: Not "PT", "OT", "PA", "DO": in notes they are the patient, therapy, an artery, a verb.
CREDENTIALS = frozenset("md rn np rrt crt licsw lcsw msw cns slp dds phd".split())
_WORD = r"(?<![\w])[A-Za-z][A-Za-z'\-]*(?![\w])"  # a word standing alone ("sao2" is no word)


@dataclass(frozen=True)
class NameLists:
    """deid-format general lists (one entry per line): names, places, and common words that are not names."""

    names: frozenset[str]  # unambiguous first and last names (upper case)
    ambiguous: frozenset[str]  # names that are also words: found only in name context
    places: frozenset[str]  # places and hospitals, upper case, up to 4 words
    common: frozenset[str]  # lower-case English and clinical words (never a name on their own)
    commonest: frozenset[str] = frozenset()  # the most frequent words: a name only right after a relation word
    first: frozenset[str] = frozenset()  # first names (unambiguous or not): the next unknown word is a surname

    @staticmethod
    def from_dirs(lists_dir: str, dict_dir: str | None = None) -> NameLists:
        from pathlib import Path

        from ctrlgen.errors import AssetError

        def read(d: str | None, *files: str) -> set[str]:
            out: set[str] = set()
            for f in files:
                p = Path(d or "") / f
                if d and p.is_file():
                    out.update(x.strip() for x in p.read_text(encoding="utf-8", errors="replace").splitlines())
            return {x for x in out if x}

        names = read(lists_dir, "female_names_unambig.txt", "male_names_unambig.txt", "last_names_unambig.txt")
        if not names:
            raise AssetError(f"{lists_dir} holds no deid-format name lists (female_names_unambig.txt, ...)")
        ambiguous = read(lists_dir, "female_names_ambig.txt", "male_names_ambig.txt", "last_names_ambig.txt",
                         "female_names_popular.txt", "male_names_popular.txt", "last_names_popular.txt")  # fmt: skip
        places = read(lists_dir, "locations_unambig.txt", "local_places_unambig.txt", "stripped_hospitals.txt",
                      "company_names_unambig.txt")  # fmt: skip
        common = read(dict_dir, "common_words.txt", "commonest_words.txt", "notes_common.txt", "sno_edited.txt")
        commonest = {c.upper() for c in read(dict_dir, "commonest_words.txt", "notes_common.txt")}
        low = {c.lower() for c in common}
        up = lambda xs: frozenset(x.upper() for x in xs)  # noqa: E731
        first = read(lists_dir, "female_names_unambig.txt", "male_names_unambig.txt", "female_names_ambig.txt",
                     "male_names_ambig.txt", "female_names_popular.txt", "male_names_popular.txt")  # fmt: skip
        return NameLists(up(n for n in names if n.lower() not in low), up(ambiguous | {n for n in names if n.lower() in low}),
                         up(p for p in places if p.lower() not in low), frozenset(low), frozenset(commonest),
                         up(first))  # fmt: skip


#: Words that follow "Dr." without being a name ("Dr. aware", "Dr. to see").
_NOT_AFTER_TITLE = frozenset(
    """a an the to in at on of for by with and or is was are were be been aware notified called paged informed
    here there made said states stated came saw see seen updated spoke ordered order orders note notes office team
    on-call oncall covering visit visited """.split()
)


def _is_initial(text: str, tok: tuple[str, int, int], next_start: int) -> bool:
    """A one-letter word standing alone before ". " and the next word ("Q. Lander", not "500'S. SATS")."""
    t, s, e = tok
    return len(t) == 1 and t.isalpha() and (s == 0 or text[s - 1] in " \t\n(") and text[e:next_start] in (". ", ".  ")


def _wordlike(bare: str) -> bool:
    """Two or more letters, apostrophes and hyphens aside ("O'Brien", "Forman-Lyons")."""
    return len(bare) > 1 and bare.replace("'", "").replace("-", "").isalpha()


def _mixed_case(w: str) -> bool:
    return len(w) > 1 and w[:1].isupper() and w[1:].islower()


def _split_relations(toks: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Split a hyphenated token that starts with a relation word ("DAUGHTER-KRISSY") in two."""
    out = []
    for t, s, e in toks:
        if t.endswith("-") and t.rstrip("-"):  # "KRISSY---301": the name without its dashes
            t = t.rstrip("-")
            e = s + len(t)
        head, sep, tail = t.partition("-")
        if sep and head.lower() in NAME_CONTEXT and tail.strip("-")[:1].isalpha():
            out.append((head, s, s + len(head)))
            out.append((tail, s + len(head) + 1, e))
        else:
            out.append((t, s, e))
    return out


def _dictionary_recognizer_class() -> Any:
    import re

    from presidio_analyzer import EntityRecognizer, RecognizerResult

    word = re.compile(_WORD)

    class _DictionaryRecognizer(EntityRecognizer):
        """deid-style names and places from general lists (never from any corpus' own values).

        A word in the unambiguous name lists and not a common English or clinical word is a
        PERSON; an ambiguous one (also a word) only right after a title / relation word or next
        to another name. Runs of up to four words in the place lists are a LOC.
        """

        def __init__(self, lists: NameLists, score: float = 0.6) -> None:
            self.lists, self.score = lists, score
            self._place_heads = frozenset(p.split(" ")[0] for p in lists.places)  # a place's first word
            super().__init__(supported_entities=["PERSON", "LOC"], name="DictionaryRecognizer")

        def load(self) -> None:
            pass

        def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[Any]:
            L = self.lists
            toks = _split_relations([(m.group(0), m.start(), m.end()) for m in word.finditer(text)])
            ups = [t.upper().strip("'-") for t, _, _ in toks]
            is_name = [u in L.names for u in ups]
            out = []
            if "PERSON" in entities:
                hits = [False] * len(toks)
                titled_hit = [False] * len(toks)
                # before a credential ("Lander RRT"): the one clue a word takes from the word after it
                cred_next = [t.lower().rstrip(".") in CREDENTIALS for t, _, _ in toks[1:]] + [False]
                for i, (t, s, e) in enumerate(toks):
                    hit = is_name[i]
                    u = ups[i]
                    prev = toks[i - 1][0].lower().rstrip(".:,-") if i else ""
                    prev = prev[:-2] if prev.endswith("'s") else prev
                    if not (
                        hit
                        or u in L.ambiguous
                        or cred_next[i]
                        or prev in _TITLES
                        or prev in NAME_CONTEXT
                        or (i and (len(toks[i - 1][0]) == 1 or ups[i - 1] in L.first or titled_hit[i - 1]))
                    ):
                        continue  # no clue below can make it a name (most words): skip the work
                    bare = t.strip("'-")
                    gap = text[toks[i - 1][2] : s] if i else ""
                    adjacent = i > 0 and toks[i - 1][2] + 2 >= s
                    close = i > 0 and gap in (" ", "  ", ". ", ".", ".  ", "- ", "-", " - ", ", ")
                    wordlike = _wordlike(bare)
                    capitalised = bare[:1].isupper()
                    titled = (
                        prev in _TITLES and gap in (" ", "  ", ". ", ".", ".  ") and toks[i - 1][0][-1] not in "-:"
                    )  # not "MS- pt", "ms: alert"
                    if not hit and u in L.ambiguous and len(u) > 1:
                        near = (adjacent and is_name[i - 1]) or (
                            i + 1 < len(toks) and is_name[i + 1] and e + 2 >= toks[i + 1][1]
                        )
                        related = prev in NAME_CONTEXT and not titled and u in L.first  # "son bill", not "wedding"
                        hit = (titled and u not in L.commonest) or related or (near and u not in L.commonest)
                    if not hit and wordlike and close:
                        # "Dr. Gateman", "husband milovan", "daughter- Krissy": a word that is no common
                        # word, right after a title or a relation word, is a name. After a title, a
                        # capitalised word is a name unless it is a function word ("Dr. Price", not "Dr. aware").
                        if titled:
                            hit = u not in L.commonest or (capitalised and bare.lower() not in _NOT_AFTER_TITLE)
                            titled_hit[i] = hit
                        elif prev in NAME_CONTEXT:
                            hit = bare.lower() not in L.common
                    if not hit and wordlike and i + 1 < len(toks) and (u not in L.commonest or _mixed_case(bare)):
                        # a name right before a credential: "Lander RRT", "Kavaliunas NP", "Foley, CRT"
                        nxt, gap2 = toks[i + 1][0], text[e : toks[i + 1][1]]
                        cred = nxt.lower().rstrip(".")
                        if cred in CREDENTIALS and gap2 in (" ", ", ", ",", "  "):
                            hit = True
                    if not hit and i > 0 and wordlike and capitalised:
                        # a capitalised word after a first name or a titled name ("Leona Labowich", "Dr Will
                        # Cole"): not a common word; after an initial, a mixed-case word not one of the
                        # commonest ("Q. Baker"; an uncommon word after an initial is the next branch's)
                        p = toks[i - 1][0]
                        initial = _is_initial(text, toks[i - 1], s)
                        first = ups[i - 1] in L.first and p.lower() not in L.common
                        uncommon = bare.lower() not in L.common
                        after_title = titled_hit[i - 1] and u not in L.commonest and text[toks[i - 1][2] : s] == " "
                        hit = (
                            (uncommon and first and adjacent)
                            or (after_title and adjacent)
                            or (initial and _mixed_case(bare) and u not in L.commonest)
                        )
                    if not hit and i > 0 and wordlike and len(toks[i - 1][0]) == 1:
                        # "Q. Lander", "d. renna": an initial (either case) and an uncommon word
                        hit = _is_initial(text, toks[i - 1], s) and bare.lower() not in L.common
                    hits[i] = hit
                # back from a name: an initial ("G. Levine") and an uncommon capitalised word before
                # it ("Radu Crosson", "Francis G. Levine", "Warren Kavaliunas")
                for i in range(len(toks) - 1, 0, -1):
                    if not hits[i]:
                        continue
                    j = i - 1
                    p, _, pe = toks[j]
                    if _is_initial(text, toks[j], toks[i][1]):
                        hits[j] = True
                        continue
                    bare = p.strip("'-")
                    if (
                        not hits[j]
                        and text[pe : toks[i][1]] == " "
                        and bare[:1].isupper()
                        and _wordlike(bare)
                        and (bare.lower() not in L.common or ups[j] in L.first)
                        and bare.lower() not in NAME_CONTEXT
                        and bare.lower() not in _NOT_AFTER_TITLE
                    ):
                        hits[j] = True
                for i, (t, s, e) in enumerate(toks):
                    if hits[i]:
                        end = e + 1 if len(t) == 1 and text[e : e + 1] == "." else e
                        out.append(RecognizerResult("PERSON", s, end, self.score))
            if "LOC" in entities:
                heads = self._place_heads
                for i in range(len(toks)):
                    if ups[i] not in heads:
                        continue
                    for n in (4, 3, 2, 1):
                        if i + n <= len(toks) and " ".join(ups[i : i + n]) in L.places:
                            out.append(RecognizerResult("LOC", toks[i][1], toks[i + n - 1][2], self.score))
                            break
            return out

    return _DictionaryRecognizer


def DictionaryRecognizer(lists: NameLists, score: float = 0.6) -> Any:
    """A Presidio recognizer for names and places of general lists (built lazily)."""
    return _dictionary_recognizer_class()(lists, score)
