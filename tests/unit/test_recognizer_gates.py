"""A pattern's ``needs`` gate is a speed-up only: every text a pattern matches in has its gate, and a
recognizer built with its gates finds exactly what it finds without them."""

import pytest
import regex

from ctrlgen.extract.recognizers import PATTERN_RECOGNIZERS, _GatedRegex, build_pattern_recognizer

FLAGS = regex.DOTALL | regex.MULTILINE | regex.IGNORECASE  # Presidio's PatternRecognizer defaults

# Texts each gated pattern must match (one per gate at least).
POSITIVE = {
    "mrn": ["MRN: 00123456 admitted", "unit no: A12345 today", "Acct # 998877 billed", "mr# 123456"],
    "medical record number": ["medical record number: 12345678"],
    "serial / license / policy number": ["Device serial no. SN-44821-B", "member # 55X12345 on file", "plate: 7XK2231"],
    "on the Nth": ["seen on the 3rd by the team", "ON THE 21ST HE FELL"],
    "name field": ["Name: SMITH, JOHN A.", "Attending: Baker, Thomas", "next of kin: Mary Lee"],
    "name + regional / memorial / campus / hosp": [
        "transferred to Laurel Regional for cath",
        "from Sacred Heart Memorial today",
        "seen at Calvert Hospital in May",
        "at North Campus of Mercy Med Ctr",
    ],
    "name + practice / associates / group / company": [
        "followed at Brookside Family Practice",
        "works for Boston Builders Inc. as a driver",
        "PCP at Harbor Medical Associates",
        "retired from the Acme Company",
    ],
    "lives in / moved from": ["she lives in Quincy with her husband", "recently moved from NH"],
}
OTHER = [  # texts the gated patterns must leave alone, and notes of other layouts
    "Pt comfortable, no events overnight. Plan: continue current management.",
    "MRN: 00123456 admitted; SSN 123-45-6789 on file; given 40 mg IV",
    "policy of the unit; serial CXRs; per hospital policy #rg17; insurance policy # XQ88412; policy number 5512",
    "Name: SMITH, JOHN A.   Attending: Baker, Thomas\nPCP: Dr. Alan Ng",
    "Patient: Pt is comfortable. Name: unknown; Attending: aware",
    "TRANSFER FROM CALVERT HOSPITAL FOR CATH; LEAVE HOSPITAL TOMORROW",
    "Lives with wife in Quincy; home to rehab; moved in with daughter",
    "on the floor since the 3rd; cath on 10/4, extubated 9/2/92",
    "REGIONAL ANESTHESIA; regional wall motion abnormality; Memorial Day; the main campus",
    "MEMORIAL DAY; member of the team; plate 4; policy of the unit; id like",
    "",
]


def _gated() -> list[tuple[str, object]]:
    return [(spec.name, p) for spec in PATTERN_RECOGNIZERS.values() for p in spec.patterns if p.needs]


def test_the_gated_patterns_are_the_ones_listed_here() -> None:
    assert sorted(p.name for _, p in _gated()) == sorted(POSITIVE)  # a new gate needs its positive texts here


@pytest.mark.parametrize("spec_name, pattern", _gated(), ids=lambda x: getattr(x, "name", x))
def test_every_text_a_gated_pattern_matches_in_has_its_gate(spec_name, pattern) -> None:
    full, gate = regex.compile(pattern.regex, FLAGS), regex.compile(pattern.needs, FLAGS)
    for text in POSITIVE[pattern.name]:
        assert full.search(text), f"{spec_name} / {pattern.name} should match {text!r}"
    for text in OTHER + [t for texts in POSITIVE.values() for t in texts]:
        if full.search(text):
            assert gate.search(text), f"{pattern.name}: matches {text!r} but its gate does not"


def _found(rec, text: str) -> list[tuple[int, int, float, str]]:
    return sorted((r.start, r.end, r.score, r.entity_type) for r in rec.analyze(text, rec.supported_entities))


@pytest.mark.parametrize("name", sorted(PATTERN_RECOGNIZERS))
def test_a_recognizer_finds_the_same_with_and_without_its_gates(name) -> None:
    spec = PATTERN_RECOGNIZERS[name]
    gated, plain = build_pattern_recognizer(spec), build_pattern_recognizer(spec, gates=False)
    texts = OTHER + [t for texts in POSITIVE.values() for t in texts]
    texts.append("\n".join(texts))  # one long note with everything in it
    for text in texts:
        assert _found(gated, text) == _found(plain, text)
    assert not any(isinstance(p.compiled_regex, _GatedRegex) for p in plain.patterns)


def test_a_text_without_the_gate_never_runs_the_pattern() -> None:
    rec = build_pattern_recognizer(PATTERN_RECOGNIZERS["ClinicalFacilityRecognizer"])
    gated = [p.compiled_regex for p in rec.patterns if isinstance(p.compiled_regex, _GatedRegex)]
    assert gated

    class _Refuse:
        def finditer(self, *a, **k):  # the pattern itself: must not run on a text without its gate
            raise AssertionError("the pattern ran although its gate is absent")

    for g in gated:
        g.full = _Refuse()
    assert _found(rec, "Pt comfortable overnight, tolerating diet; plan: continue.") == []
    with pytest.raises(AssertionError, match="ran although"):
        _found(rec, "followed at Brookside Family Practice; seen at Calvert Hospital; lives in Quincy")
