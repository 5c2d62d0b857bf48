import pytest

from ctrlgen.placeholders import placeholder_entities, placeholder_type, placeholder_value


@pytest.mark.parametrize(
    "inner, category, kind",
    [
        ("Hospital1 18", "ORG", "QUASI"),
        ("Hospital 18", "ORG", "QUASI"),
        ("First Name (NamePattern1) 1234", "PERSON", "DIRECT"),
        ("Known lastname 2213", "PERSON", "DIRECT"),
        ("Doctor Last Name 123", "PERSON", "DIRECT"),
        ("Initials (NamePattern4) 5", "PERSON", "DIRECT"),
        ("2101-10-20", "DATETIME", "QUASI"),
        ("10-20", "DATETIME", "QUASI"),
        ("2101", "DATETIME", "QUASI"),
        ("Month (only) 51", "DATETIME", "QUASI"),
        ("Year (4 digits) 9", "DATETIME", "QUASI"),
        ("Holiday 3", "DATETIME", "QUASI"),
        ("Telephone/Fax (1) 5551", "CODE", "DIRECT"),
        ("Medical Record Number 2", "CODE", "DIRECT"),
        ("Numeric Identifier 7", "CODE", "DIRECT"),
        ("Social Security Number 1", "CODE", "DIRECT"),
        ("E-mail address 1", "CODE", "DIRECT"),
        ("Unit Number 4", "CODE", "DIRECT"),
        ("Location (un) 620", "LOC", "QUASI"),
        ("Street Address(1) 3", "LOC", "QUASI"),
        ("State 9", "LOC", "QUASI"),
        ("Hospital Ward Name 4", "LOC", "QUASI"),
        ("Hospital Unit Name 12", "LOC", "QUASI"),
        ("Company 4", "ORG", "QUASI"),
        ("University/College 1", "ORG", "QUASI"),
        ("Age over 90 ", "DEM", "QUASI"),
        ("Something New 3", "MISC", "QUASI"),
        ("", "MISC", "QUASI"),
    ],
)
def test_placeholder_types_map_onto_the_eight_categories(inner, category, kind):
    assert placeholder_type(inner)[:2] == (category, kind)


def test_placeholder_label_drops_the_number():
    assert placeholder_type("First Name (NamePattern1) 1234")[2] == "First Name (NamePattern1)"


def test_placeholder_entities_have_exact_spans():
    text = "Pt [**Known lastname 12**] seen [**2101-10-20**] at [**Hospital1 18**]."
    ents = placeholder_entities(text)
    assert [text[e.start : e.end] for e in ents] == [e.text for e in ents]
    assert [e.category for e in ents] == ["PERSON", "DATETIME", "ORG"]
    assert all(e.source == "placeholder" for e in ents)
    assert placeholder_value(ents[2].text) == "Hospital1 18"


def test_unclosed_placeholder_is_not_an_entity():
    assert placeholder_entities("[**Hospital1 18 and the rest of the note") == []
