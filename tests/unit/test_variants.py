"""Value variants (ctrlgen.variants): what a reader takes for the same value is blocked, caught by the gate and
counted by the metrics alike; everyday text is not."""

from __future__ import annotations

import pickle
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlgen.config import SamplingConfig
from ctrlgen.generation import GenerationRequest, HFEngine, banned_sequences, gated_generate
from ctrlgen.generation.icl import build_pool
from ctrlgen.metrics.leakage import ValueIndex, elp_icl, leaked_values, normalize_value
from ctrlgen.models import tiny_llama, tiny_tokenizer
from ctrlgen.variants import (
    COMMON_WORDS,
    Value,
    code_items,
    date_forms,
    match_keys,
    name_forms,
    number_forms,
    value_variants,
)

FIRST = ["John", "Maria", "Wei", "Olusegun", "Anne-Marie", "Li", "Jose", "Priya", "Will", "Grace"]
LAST = ["Smith", "Nakamura", "O'Neil", "Przybylo", "Brown", "Lee", "Castillo", "Young", "Vasquez", "Ng"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]  # fmt: skip


def _date_value(y: int, m: int, d: int, style: int) -> str:
    return [
        f"{y}-{m:02d}-{d:02d}",
        f"{m}/{d}/{y}",
        f"{d:02d}/{m:02d}/{y}",
        f"{MONTHS[m - 1][:3]} {d}, {y}",
        f"{d} {MONTHS[m - 1]} {y}",
        f"{m}/{d}",
    ][style]


names = st.builds(
    lambda first, last, comma: f"{last}, {first}" if comma else f"{first} {last}",
    st.sampled_from(FIRST), st.sampled_from(LAST), st.booleans(),
)  # fmt: skip
dates = st.builds(_date_value, st.integers(1990, 2199), st.integers(1, 12), st.integers(1, 28), st.integers(0, 5))
phones = st.builds(
    lambda a, b, c, style: [f"{a}-{b}-{c}", f"({a}) {b}-{c}", f"{a}.{b}.{c}", f"{a}{b}{c}"][style],
    st.integers(201, 989).map(str), st.integers(200, 999).map(str), st.integers(0, 9999).map(lambda n: f"{n:04d}"),
    st.integers(0, 3),
)  # fmt: skip
typed = st.one_of(
    names.map(lambda v: (v, "PERSON")), dates.map(lambda v: (v, "DATETIME")), phones.map(lambda v: (v, "CODE"))
)


@pytest.fixture(scope="module")
def tok() -> object:
    return tiny_tokenizer()


# --- the expander itself ----------------------------------------------------------------------


def test_the_issue_rewritings_are_variants() -> None:
    assert {"smith, john", "smith", "j. smith", "j smith"} <= match_keys("John Smith", "PERSON")
    assert {"john smith", "smith", "john"} <= match_keys("Smith, John", "PERSON")
    assert {"2101/10/20", "oct 20, 2101", "20 october 2101", "10/20/2101", "20/10/2101", "oct 20", "10/20"} <= (
        match_keys("2101-10-20", "DATETIME")
    )
    assert {"6175551234", "(617) 555-1234", "617.555.1234", "617 555 1234"} <= match_keys("617-555-1234", "CODE")
    # Without a category: the value as written only (casing folds), as before.
    assert match_keys("John Smith") == {"john smith"} and match_keys("2101-10-20") == {"2101-10-20"}


def test_ambiguous_numeric_dates_are_read_both_ways() -> None:
    keys = match_keys("10/06/2101", "DATETIME")
    assert {"oct 6, 2101", "june 10, 2101", "2101-10-06", "2101-06-10"} <= keys
    assert "oct 20, 2101" in match_keys("20/10/2101", "DATETIME")  # day first: one reading
    assert not any("20, 2101" in k and "sep" in k for k in match_keys("20/10/2101", "DATETIME"))


def test_dates_in_other_formats_give_the_same_full_dates() -> None:
    want = match_keys("2101-10-20", "DATETIME")
    for form in ("10/20/2101", "Oct 20, 2101", "20 October 2101", "Tuesday, Oct. 20th, 2101", "20-Oct-2101",
                 "October 20 2101", "10/20/2101 14:30"):  # fmt: skip
        assert match_keys(form, "DATETIME") >= want - {"2101-10-20"}, form


def test_over_blocking_rules() -> None:
    # Everyday words and short parts are not name parts alone; the full name and its other forms still are.
    assert "will" not in match_keys("Will Brown", "PERSON") and "brown" not in match_keys("Will Brown", "PERSON")
    assert {"brown, will", "w. brown", "dr. brown"} <= match_keys("Will Brown", "PERSON")
    assert "li" not in match_keys("Li Nakamura", "PERSON") and "nakamura" in match_keys("Li Nakamura", "PERSON")
    assert "dr." not in match_keys("Dr. Jane Castillo", "PERSON")
    assert "castillo" in match_keys("Dr. Jane Castillo", "PERSON")
    # A bare day without year only where it cannot be a fraction or a score.
    assert "3/4" not in match_keys("2101-03-04", "DATETIME") and "mar 4" in match_keys("2101-03-04", "DATETIME")
    assert "10/01" not in match_keys("October 2101", "DATETIME") and "8/87" in match_keys("August 1987", "DATETIME")
    # A number that is neither a phone nor a grouped identifier has no rewritings.
    assert number_forms("54321") == [] and number_forms("12-3") == []
    assert "123-4501" not in match_keys("12345/01", "CODE") and "1234501" in match_keys("12345/01", "CODE")
    assert all(w == w.lower() and " " not in w for w in COMMON_WORDS)


def test_unparsed_values_keep_their_own_form() -> None:
    assert date_forms("the day before yesterday") == [] and date_forms("13/13/2101") == []
    assert name_forms("Smith") == []  # one part: only itself
    assert value_variants("Smith", "PERSON") == ["Smith", "smith", "SMITH"]


def test_value_carries_its_category_through_pickle_sets_and_codes() -> None:
    v = Value("John Smith", "PERSON")
    assert pickle.loads(pickle.dumps(v)).category == "PERSON" and v == "John Smith" and {v} == {"John Smith"}
    items = code_items({"PERSON": ["John Smith"], "DATETIME": ["2101-10-20"]})
    assert [(str(i), i.category) for i in items] == [("John Smith", "PERSON"), ("2101-10-20", "DATETIME")]
    with pytest.raises(TypeError, match="value pair"):
        leaked_values("x", [("a", "PERSON", "extra")])  # type: ignore[list-item]


# --- every variant is blocked and caught: properties over random values -----------------------


@settings(max_examples=150, deadline=None)
@given(
    item=typed, before=st.sampled_from(["", "Seen by ", "(", "on "]), after=st.sampled_from(["", ".", ", then", ")"])
)
def test_every_variant_is_caught_by_the_gate_and_the_metrics(item: tuple[str, str], before: str, after: str) -> None:
    value, cat = item
    want = {normalize_value(value)}
    index = ValueIndex([item])
    for variant in value_variants(value, cat):
        text = f"{before}{variant}{after}"
        assert leaked_values(text, [item]) == want, variant
        assert index.find(text) == want, variant
        assert leaked_values(text, [Value(value, cat)]) == want


@settings(max_examples=60, deadline=None)
@given(items=st.lists(typed, min_size=1, max_size=4))
def test_every_variant_is_banned_with_and_without_leading_space(tok, items: list[tuple[str, str]]) -> None:
    seqs = {tuple(s) for s in banned_sequences(tok, items)}
    assert seqs == {tuple(s) for s in banned_sequences(tok, [Value(v, c) for v, c in items])}
    for value, cat in items:
        for variant in value_variants(value, cat):
            assert tuple(tok.encode(variant, add_special_tokens=False)) in seqs
            assert tuple(tok.encode(" " + variant, add_special_tokens=False)) in seqs


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet="ab 1/-.,Oct", max_size=30), items=st.lists(typed, max_size=3))
def test_index_and_per_value_matching_agree(text: str, items: list[tuple[str, str]]) -> None:
    assert ValueIndex(items).find(text) == leaked_values(text, items)


def test_elp_counts_a_value_once_whatever_the_variant() -> None:
    ctx = [("John Smith", "PERSON"), ("2101-10-20", "DATETIME")]
    assert elp_icl(["Smith, J. on 10/20/2101 and Oct 20"], [ctx]) == 1.0
    assert elp_icl(["Smith, J."], [ctx]) == 0.5


def test_context_pool_values_carry_categories_to_blocking_and_gate(tok: object) -> None:
    rows = [{"doc_id": "a", "text": "x", "control_code": "PERSON: John Smith\nDATETIME: 2101-10-20"}]
    (ctx,) = build_pool(rows, tok, 16)
    assert [getattr(v, "category", None) for v in ctx.values] == ["PERSON", "DATETIME"]
    assert leaked_values("Smith, J. on Oct 20, 2101", ctx.values) == {"john smith", "2101-10-20"}
    assert len(banned_sequences(tok, ctx.values)) > len(banned_sequences(tok, [str(v) for v in ctx.values]))


# --- end to end: a model made to write each variant cannot under blocking ------------------------

FORCED_VALUES = [("John Smith", "PERSON"), ("2101-10-20", "DATETIME"), ("617-555-1234", "CODE")]


@pytest.fixture(scope="module")
def forced() -> tuple[object, object, list[tuple[str, tuple[str, str], str]]]:
    """A tiny Llama trained (seeded, a few seconds) to answer prompt i with variant i of one of the values."""
    items = [((v, c), x) for v, c in FORCED_VALUES for x in value_variants(v, c)]
    random.Random(0).shuffle(items)
    items = items[:30]
    cases = [(f"Record {i}:", item, x) for i, (item, x) in enumerate(items)]
    model, tok = tiny_llama(seed=0, hidden_size=64, intermediate_size=128)
    enc = tok([f"{p} {x}\n" for p, _, x in cases], return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster and the result does not depend on the machine
    try:
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(250):
            loss = model(**enc, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model, tok, cases


def test_forced_variants_are_never_generated_under_blocking_and_the_gate_catches_them(forced) -> None:
    model, tok, cases = forced
    eng = HFEngine(model, tok, SamplingConfig(max_new_tokens=24, temperature=0.0), batch_size=16)
    free = eng.generate([GenerationRequest(p) for p, _, _ in cases])
    made = [i for i, ((_, _, x), r) in enumerate(zip(cases, free, strict=True)) if x in r.text]
    assert len(made) >= len(cases) // 2, "the model must be made to write most variants, or the test proves nothing"
    # The gate catches every forced variant as its value.
    for i in made:
        _, item, x = cases[i]
        assert leaked_values(free[i].text, [item]) == {normalize_value(item[0])}, x
    # Blocking with the value's banned sequences: neither that variant nor any other variant of the value.
    banned = [GenerationRequest(p, banned=tuple(tuple(s) for s in banned_sequences(tok, [item]))) for p, item, _ in cases]
    blocked = eng.generate(banned)
    for (_, item, x), r in zip(cases, blocked, strict=True):
        # Blocking bans every variant in its listed casings (METHOD.md section 4)...
        assert x not in r.text and not any(f in r.text for f in value_variants(*item)), (x, r.text)
    # ...a variant in another casing ("20Th of october" after "20Th October 2101" was banned) can pass it; the
    # gate folds case and withholds it: nothing released under blocking + gate holds any variant of its value.
    both = gated_generate(eng, banned, [[item] for _, item, _ in cases], max_retries=1)
    for g, (_, item, _) in zip(both, cases, strict=True):
        assert not g.released or not leaked_values(g.result.text, [item]), g.result.text
    # The release gate with the same values withholds or regenerates what leaks.
    reqs = [GenerationRequest(cases[i][0]) for i in made]
    gated = gated_generate(eng, reqs, [[cases[i][1]] for i in made], max_retries=1)
    assert all(not g.released and g.leaked_first for g in gated)  # greedy: the retry writes the variant again
