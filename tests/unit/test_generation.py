"""Batched engine, release gate and the ICL stage on a tiny random Llama (no Ray)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ctrlgen.config import GenerationConfig, SamplingConfig
from ctrlgen.fictional import FictionalCodes
from ctrlgen.generation import GenerationRequest, HFEngine, banned_sequences, gated_generate
from ctrlgen.generation.icl import GENERATED_SCHEMA, build_pool, generate_rows
from ctrlgen.metrics.leakage import leaked_values
from ctrlgen.models import tiny_llama
from ctrlgen.prompts import CODE_HEADER, baseline_prompt, icl_prompt, truncate_to_tokens

PROMPTS = ["The patient is a 58 year old", "Plan: continue heparin,", "PERSON: Alice Jones\nDocument:\n"]


@pytest.fixture(scope="module")
def tiny() -> tuple[object, object]:
    return tiny_llama(seed=1)


def engine(tiny: tuple[object, object], **sampling: object) -> HFEngine:
    model, tok = tiny
    return HFEngine(model, tok, SamplingConfig(**{"max_new_tokens": 16, **sampling}), batch_size=4)


def test_same_seed_same_output_and_seeds_matter(tiny: tuple[object, object]) -> None:
    eng = engine(tiny)
    reqs = [GenerationRequest(p, seed=i) for i, p in enumerate(PROMPTS)]
    a = [r.text for r in eng.generate(reqs)]
    b = [r.text for r in eng.generate(reqs)]
    c = [r.text for r in eng.generate([GenerationRequest(p, seed=100 + i) for i, p in enumerate(PROMPTS)])]
    assert a == b
    assert a != c


def test_output_does_not_depend_on_batch_companions(tiny: tuple[object, object]) -> None:
    eng = engine(tiny)
    together = eng.generate([GenerationRequest(p, seed=7) for p in PROMPTS])
    alone = [eng.generate([GenerationRequest(p, seed=7)])[0] for p in PROMPTS]
    assert [r.text for r in together] == [r.text for r in alone]


def test_rows_with_one_prompt_share_its_prefill_and_get_their_own_outputs(tiny: tuple[object, object]) -> None:
    """Same prompt, different seeds and banned lists (ICL with and without blocking for one target): the engine
    computes the prompt's keys/values once; each row's output equals the row generated alone."""
    model, tok = tiny
    banned = tuple(tuple(s) for s in banned_sequences(tok, ["the", "patient"]))
    reqs = [GenerationRequest(PROMPTS[0], seed=3), GenerationRequest(PROMPTS[1], seed=4),
            GenerationRequest(PROMPTS[0], banned=banned, seed=5), GenerationRequest(PROMPTS[0], seed=3)]  # fmt: skip
    calls = []
    shared = engine(tiny)
    orig = shared._prefill
    shared._prefill = lambda ids, mask, rows: calls.append((ids.shape[0], rows.tolist())) or orig(ids, mask, rows)
    together = shared.generate(reqs)
    assert len(calls) == 1 and calls[0][0] == 2  # 2 distinct prompts prefilled for 4 rows
    assert sorted(calls[0][1].count(i) for i in set(calls[0][1])) == [1, 3]
    alone = [engine(tiny).generate([r])[0] for r in reqs]
    unshared = HFEngine(model, tok, SamplingConfig(max_new_tokens=16), batch_size=4, share_prefill=False).generate(reqs)
    assert [r.text for r in together] == [r.text for r in alone] == [r.text for r in unshared]
    assert together[0].text == together[3].text and together[0].text != together[2].text
    assert not leaked_values(together[2].text, ["the", "patient"])


def test_results_come_back_in_request_order(tiny: tuple[object, object]) -> None:
    eng = engine(tiny, temperature=0.0)
    reqs = [GenerationRequest(p) for p in reversed(PROMPTS)]
    assert [r.text for r in eng.generate(reqs)] == [eng.generate([r])[0].text for r in reqs]


def test_blocked_sequences_never_appear(tiny: tuple[object, object]) -> None:
    model, tok = tiny
    eng = engine(tiny, temperature=0.0, max_new_tokens=24)
    free = eng.generate([GenerationRequest(p) for p in PROMPTS])
    ids = [tok.encode(r.text, add_special_tokens=False) for r in free]
    banned = [tuple(tuple(row[i : i + 2]) for i in range(0, len(row) - 1)) for row in ids]
    blocked = eng.generate([GenerationRequest(p, banned=b) for p, b in zip(PROMPTS, banned, strict=True)])
    for r, b in zip(blocked, banned, strict=True):
        out = tok.encode(r.text, add_special_tokens=False)
        grams = {tuple(out[i : i + 2]) for i in range(len(out) - 1)}
        assert not grams & set(b)


def test_stop_string_cuts_the_output(tiny: tuple[object, object]) -> None:
    eng = engine(tiny, temperature=1.0, top_p=1.0, max_new_tokens=24)
    prompt = "Plan: continue heparin.\n"
    free = eng.generate([GenerationRequest(prompt, seed=3)])[0].text
    stop = free[6:10]
    assert stop.strip()
    cut = eng.generate([GenerationRequest(prompt, seed=3, stop=(stop,))])[0]
    assert cut.finish == "stop" and stop not in cut.text and free.startswith(cut.text)


def test_overlong_prompt_is_an_error_result_not_a_crash(tiny: tuple[object, object]) -> None:
    eng = engine(tiny)
    res = eng.generate([GenerationRequest("word " * 5000), GenerationRequest(PROMPTS[0])])
    assert res[0].error and "positions" in res[0].error and res[1].error is None


def test_gate_releases_no_known_value(tiny: tuple[object, object]) -> None:
    """Known values are words the model does produce; released text must hold none of them."""
    eng = engine(tiny, max_new_tokens=24, temperature=1.0, top_p=1.0)
    reqs = [GenerationRequest(p, seed=s) for s in range(6) for p in PROMPTS]
    words = sorted({w for r in eng.generate(reqs) for w in r.text.split() if w.isalnum() and len(w) >= 2})
    assert words
    known = [words] * len(reqs)
    ungated = gated_generate(eng, reqs, known, enabled=False)
    assert any(g.leaked for g in ungated), "test needs outputs that leak without the gate"
    gated = gated_generate(eng, reqs, known, max_retries=2)
    for g in gated:
        if g.released:
            assert leaked_values(g.result.text, words) == set()
        else:
            assert g.leaked and g.attempts == 3
    assert any(g.attempts > 1 for g in gated)


def test_prompts_and_truncation(tiny: tuple[object, object]) -> None:
    _, tok = tiny
    p = icl_prompt([("PERSON: A", "doc a"), ("", "doc b")], "PERSON: Z")
    assert p.count(CODE_HEADER) == 3 and "(none)" in p and p.endswith("PERSON: Z\nDocument:\n")
    assert baseline_prompt(["x", "y"]).count("Document:") == 3
    text = "The patient is a 58 year old female admitted in transfer."
    cut = truncate_to_tokens(text, tok, 5)
    assert text.startswith(cut) and len(tok.encode(cut, add_special_tokens=False)) == 5
    assert truncate_to_tokens("short", tok, 50) == "short"


def _rows(n: int) -> list[dict[str, str]]:
    names = ["Alice Jones", "Bob Stone", "Carol Diaz", "Dan Wu", "Eve Park", "Fay Lin", "Gus Roy", "Hal Moe"]
    return [
        {"doc_id": f"d{i}", "text": f"{names[i % 8]} was seen on day {i}. Plan: rest.",
         "control_code": f"PERSON: {names[i % 8]}\nDATETIME: day {i}"}
        for i in range(n)
    ]  # fmt: skip


def test_icl_stage_writes_every_mode_for_every_row(tiny: tuple[object, object]) -> None:
    model, tok = tiny
    cfg = GenerationConfig(sampling=SamplingConfig(max_new_tokens=8))
    rows = _rows(6)
    pool = build_pool(rows, tok, 32)
    fictional = FictionalCodes(0, exclude=[v for c in pool for v in c.values])
    table = generate_rows(rows[:3], pool, engine(tiny, max_new_tokens=8), tok, cfg, fictional)
    assert table.schema == GENERATED_SCHEMA and isinstance(table, pa.Table)
    out = table.to_pylist()
    assert len(out) == 3 * 3
    by = {(r["doc_id"], r["mode"]): r for r in out}
    for d in ("d0", "d1", "d2"):
        # Modes are paired: same contexts; ICL modes share the fictional code; a document is never its own context.
        assert (
            by[(d, "baseline")]["context_ids"]
            == by[(d, "icl")]["context_ids"]
            == by[(d, "icl_blocking")]["context_ids"]
        )
        assert d not in by[(d, "icl")]["context_ids"]
        assert by[(d, "icl")]["fictional_code"] == by[(d, "icl_blocking")]["fictional_code"] != ""
        assert by[(d, "baseline")]["fictional_code"] == ""
        assert all(r["status"] == "ok" for r in out)


def test_icl_stage_quarantines_instead_of_dropping(tiny: tuple[object, object]) -> None:
    model, tok = tiny
    cfg = GenerationConfig(modes=["icl"], sampling=SamplingConfig(max_new_tokens=4))
    rows = _rows(5)
    pool = build_pool(rows, tok, 32)
    # Exclude every value fictional QUANTITY could take: that row cannot get a code.
    exclude = {f"{n}%" for n in range(100)} | {f"${n * 500:,}" for n in range(201)}
    bad = {"doc_id": "q", "text": "x", "control_code": "QUANTITY: 45%"}
    table = generate_rows([rows[0], bad], pool, engine(tiny, max_new_tokens=4), tok, cfg, FictionalCodes(0, exclude))
    out = {r["doc_id"]: r for r in table.to_pylist()}
    assert out["d0"]["status"] == "ok"
    assert out["q"]["status"] == "quarantined" and "QUANTITY" in out["q"]["reason"] and out["q"]["text"] == ""


def test_banned_values_block_in_icl_blocking_mode(tiny: tuple[object, object]) -> None:
    _, tok = tiny
    seqs = banned_sequences(tok, ["Alice Jones"])
    assert len(seqs) >= 5
