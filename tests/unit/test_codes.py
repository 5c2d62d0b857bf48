from hypothesis import given
from hypothesis import strategies as st

from ctrlgen.codes import build_control_code, format_control_code, parse_control_code
from ctrlgen.schema import CATEGORIES, Entity


def _e(start, text, cat, source="gold"):
    return Entity(start, start + len(text), text, cat, "DIRECT", source)


def test_control_code_groups_distinct_values_in_category_order():
    ents = [
        _e(50, "31 August 2006", "DATETIME"),
        _e(0, "Alice Jones", "PERSON"),
        _e(20, "New York City", "LOC"),
        _e(30, "John Smith", "PERSON"),
        _e(40, "alice jones", "PERSON"),  # same value, other casing: listed once
    ]
    text = format_control_code(build_control_code(ents))
    assert text == "PERSON: Alice Jones, John Smith\nLOC: New York City\nDATETIME: 31 August 2006"


def test_placeholders_show_their_inner_text_and_whitespace_is_folded():
    ents = [_e(0, "[**Hospital1 18**]", "ORG", "placeholder"), _e(30, "John\n  Smith", "PERSON")]
    assert format_control_code(build_control_code(ents)) == "PERSON: John Smith\nORG: Hospital1 18"


def test_values_with_commas_and_quotes_round_trip():
    code = {"QUANTITY": ["$87,500", "45%"], "LOC": ["Boston, MA", '"The" Place'], "MISC": ['a "b", c']}
    text = format_control_code(code)
    assert 'QUANTITY: "$87,500", 45%' in text
    assert parse_control_code(text) == {k: code[k] for k in ("LOC", "QUANTITY", "MISC")}


def test_parser_ignores_lines_that_are_not_codes():
    text = "Here is a note.\nPERSON: Ann Lee\nFOO: bar\nMISC: Thing\n\nThe patient..."
    assert parse_control_code(text) == {"PERSON": ["Ann Lee"], "MISC": ["Thing"]}


_value = (
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\n\r\x85"),
        min_size=1,
        max_size=15,
    )
    .map(lambda s: " ".join(s.split()))
    .filter(bool)
)


@given(st.dictionaries(st.sampled_from(CATEGORIES), st.lists(_value, min_size=1, max_size=4), max_size=8))
def test_format_then_parse_is_the_identity(code):
    text = format_control_code(code)
    assert parse_control_code(text) == {c: code[c] for c in CATEGORIES if c in code}
