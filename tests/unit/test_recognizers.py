"""Table tests, one block per recognizer: what each must find and what it must leave alone."""

import pytest
import regex  # what Presidio's PatternRecognizer matches with (variable-width look-behind)

from ctrlgen.extract.recognizers import PATTERN_RECOGNIZERS


def _finds(name: str, text: str) -> list[str]:
    """Matches of the recognizer's patterns, without those inside a longer match (as overlap resolution does)."""
    spec = PATTERN_RECOGNIZERS[name]
    flags = regex.DOTALL | regex.MULTILINE | regex.IGNORECASE  # Presidio's defaults for PatternRecognizer
    spans = {m.span() for p in spec.patterns for m in regex.finditer(p.regex, text, flags)}
    outer = [s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    return sorted(text[a:b] for a, b in outer)


CASES = [
    ("EchrApplicationRecognizer", "in an application (no. 36244/06) against", ["36244/06"]),
    ("EchrApplicationRecognizer", "applications nos. 40593/04 and 1234/05", ["1234/05", "40593/04"]),
    ("EchrApplicationRecognizer", "a dose of 5/10 mg", []),
    ("MedicalIdRecognizer", "MRN: 00123456 admitted", ["00123456"]),
    ("MedicalIdRecognizer", "SSN 123-45-6789 on file", ["123-45-6789"]),
    ("MedicalIdRecognizer", "given 40 mg IV", []),
    ("ClinicalPhoneRecognizer", "call 201-561-8910 or (201) 223-4567", ["(201) 223-4567", "201-561-8910"]),
    ("ClinicalPhoneRecognizer", "pager 54321 if needed", ["54321"]),
    ("ClinicalPhoneRecognizer", "Pager: # 54321 Time: 10:00am", ["54321"]),
    ("ClinicalPhoneRecognizer", "BP 120/80 HR 72", []),
    (
        "ContactRecognizer",
        "write to j.doe+pt@mail.example.org or see https://portal.example.org/p?id=7.",
        ["https://portal.example.org/p?id=7", "j.doe+pt@mail.example.org"],
    ),
    ("ContactRecognizer", "site www.example-clinic.com, done", ["www.example-clinic.com"]),
    ("ContactRecognizer", "WHEELCHAIR...CA, DNR.SE, FIRST.ST, 7.45.34.7", []),
    ("AgeRecognizer", "58 YEAR OLD FEMALE", ["58"]),
    ("AgeRecognizer", "a 50-year-old man, aged 61, 72 yo", ["50", "61", "72"]),
    ("AgeRecognizer", "for 3 days", []),
    ("AgeRecognizer", "67M with DM2; pt is a 92 F, HPI: 45F", ["45", "67", "92"]),
    ("AgeRecognizer", "placed a 16F foley, a 14 F sheath; DM 2", []),
    ("MedicalIdRecognizer", "Device serial no. SN-44821-B, license # D1234567", ["D1234567", "SN-44821-B"]),
    ("MedicalIdRecognizer", "policy of the unit; serial CXRs; per hospital policy #rg17", []),
    ("MedicalIdRecognizer", "insurance policy # XQ88412; policy number 5512", ["5512", "XQ88412"]),
    ("ClinicalDateRecognizer", "7/22 FOUND BY HUSBAND; S/P MI 1992", ["1992", "7/22"]),
    ("ClinicalDateRecognizer", "on 15 October 2004 and March 3, 2005", ["15 October 2004", "March 3, 2005"]),
    ("ClinicalDateRecognizer", "K 3.9; CR 2.1", []),
    ("ClinicalDateRecognizer", "PS 10/5 overnight, D5 1/2 NS at 100, strength 5/5 strength", []),
    ("ClinicalDateRecognizer", "cath on 10/4, extubated 9/2/92", ["10/4", "9/2/92"]),
    ("ClinicalPhoneRecognizer", "dtr Frances- 212- 476- 8356.", ["212- 476- 8356"]),
    ("TitledNameRecognizer", "seen by dr healey and Mrs. Souza", ["Souza", "healey"]),
    (
        "NameFieldRecognizer",
        "Name: SMITH, JOHN A.   Attending: Baker, Thomas\nPCP: Dr. Alan Ng",
        ["Alan Ng", "Baker, Thomas", "SMITH, JOHN A."],
    ),
    ("NameFieldRecognizer", "Patient: Pt is comfortable. Name: unknown; Attending: aware", []),
    ("FacilityRecognizer", "TRANSFER FROM CALVERT HOSPITAL FOR", ["CALVERT HOSPITAL"]),
    ("MoneyPercentRecognizer", "awarded EUR 5,000 and $87,500", ["$87,500"]),
    ("ClinicalDateRecognizer", "CSRU note 4-12-19. Neuro: intact", ["4-12-19"]),
    ("ClinicalDateRecognizer", "labs 2245-105-4.7 and RR 12-14-16 breaths", []),
    ("ClinicalDateRecognizer", "s/p AVR 8/88, ovarian CA (12/93)", ["12/93", "8/88"]),
    ("ClinicalDateRecognizer", "PMH: CABG 81, MI '92. 07 PTCA to LAD", ["'92", "07", "81"]),
    ("ClinicalDateRecognizer", "CABG x3, MI 2 mg, stent 18mm", []),
    ("ClinicalDateRecognizer", "moved here. 8/31. back on 9/3", ["8/31", "9/3"]),
    ("ClinicalDateRecognizer", "in March of 1993 and on the 11th", ["11th", "March of 1993"]),
    (
        "ClinicalFacilityRecognizer",
        "went to Sacred Heart Memorial; back to St Luke's",
        ["Sacred Heart Memorial", "St Luke's"],
    ),
    (
        "ClinicalFacilityRecognizer",
        "from Laurel Regional to the North Campus, then VAMC",
        ["Laurel Regional", "North Campus", "VAMC"],
    ),
    ("ClinicalFacilityRecognizer", "ST ELEVATION in V2; regional wall motion; wants to leave hospital", []),
    ("ClinicalFacilityRecognizer", "TRANSFERRED FROM UNIVERSITY OF MD", ["UNIVERSITY OF MD"]),
    (
        "ClinicalFacilityRecognizer",
        "12 Elm Street, Quincy MA 02169; Boston, MA. 02115-1234",
        ["02115-1234", "02169", "12 Elm Street"],
    ),
    ("ClinicalFacilityRecognizer", "gave 10000 units in 12345 ml; ok 20000", []),
    (
        "ClinicalFacilityRecognizer",
        "PCP at Brookside Family Practice; works for Boston Builders Inc.",
        ["Boston Builders Inc", "Brookside Family Practice"],
    ),
    ("ClinicalFacilityRecognizer", "from the nursing home; family practice follow-up", []),
    ("ClinicalDateRecognizer", "Admission Date: 03/14/2187, seen 2019-03-14", ["03/14/2187", "2019-03-14"]),
    (
        "ClinicalFacilityRecognizer",
        "she lives in Hampton with her son; lives at 12 Oak Tree Rd.",
        ["12 Oak Tree Rd.", "Hampton"],
    ),
]


@pytest.mark.parametrize("name, text, expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_recognizer_table(name, text, expected):
    assert _finds(name, text) == expected
