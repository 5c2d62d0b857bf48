"""The LLM anonymiser's loop (ctrlgen.anonymize_llm): prompts, the attacker's hits, rounds, fallbacks, pieces."""

import itertools

import pytest

from ctrlgen.anonymize_llm import (
    AnonymizerSettings,
    attacker_hits,
    chunk_spans,
    llm_anonymize,
    parse_guesses,
    rewrite_prompt,
)
from ctrlgen.generation.engine import GenerationRequest, GenerationResult
from ctrlgen.metrics.leakage import leaked_values
from ctrlgen.schema import Entity

TEXT = "Pt John Smith seen at Mercy Hospital on 3/4/2020.\nHe is doing well, eating and walking."


def _ents(text, pairs):
    out = []
    for value, cat in pairs:
        i = text.index(value)
        out.append(Entity(i, i + len(value), value, cat, "DIRECT", "gold", ""))
    return out


ENTS = _ents(TEXT, [("John Smith", "PERSON"), ("Mercy Hospital", "ORG"), ("3/4/2020", "DATETIME")])


class Scripted:
    """A model double: answers rewrite and attack prompts from per-round scripts; records the prompts."""

    def __init__(self, rewrites, attacks, fail=False):
        self.rewrites, self.attacks, self.fail = list(rewrites), list(attacks), fail
        self.prompts: list[str] = []

    def generate(self, reqs):
        out = []
        for r in reqs:
            self.prompts.append(r.prompt)
            if self.fail:
                out.append(GenerationResult("", finish="error", error="prompt of 9 tokens exceeds the model"))
            elif r.prompt.startswith("You are a clinical"):
                out.append(GenerationResult(self.rewrites.pop(0)))
            else:
                out.append(GenerationResult(self.attacks.pop(0)))
        return out


def test_parse_guesses_drops_markers_labels_none_and_duplicates():
    assert parse_guesses("1. Name: Alice Jones\n2) Boston.\n- none\n* boston\n3. 2020", 5) == [
        "Alice Jones",
        "Boston",
        "2020",
    ]
    assert parse_guesses("a\nb\nc", 2) == ["a", "b"]


def test_attacker_hits_are_matching_guesses_plus_values_left_verbatim():
    values = ["John Smith", "Mercy Hospital", "3/4/2020"]
    assert attacker_hits([], "Seen at MERCY  hospital today.", values) == {"mercy hospital"}
    assert attacker_hits(["Smith", "Boston", "x"], "no values", values) == {"john smith"}  # containment, >= 3 chars
    assert attacker_hits(["none"], "A patient was seen.", values) == set()


def test_chunks_cover_the_text_break_at_lines_and_never_split_an_entity():
    text = "\n".join(f"Line {i}: seen by Dr. Kowalczyk-Brennan on 1/{i}/2019 for follow up." for i in range(40))
    ents = [e for i in range(40) for e in _ents(text[text.index(f"Line {i}:") :], [("Kowalczyk-Brennan", "PERSON")])]
    ents = [Entity(e.start + text.index(f"Line {i}:"), e.end + text.index(f"Line {i}:"), e.text, e.category, e.kind,
                   e.source, "") for i, e in enumerate(ents)]  # fmt: skip
    spans = chunk_spans(text, ents, 300)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert all(b - a <= 300 for a, b in spans) and all(text[b - 1] == "\n" for _, b in spans[:-1])
    assert not any(a < e.start < b < e.end for a, b in spans for e in ents)
    # one long line: cut at a sentence end, else hard, and still around entities
    long = "word " * 100 + "Kowalczyk-Brennan " + "word " * 100
    ent = _ents(long, [("Kowalczyk-Brennan", "PERSON")])
    for a, b in chunk_spans(long, ent, 120):
        assert not (a < ent[0].start < b < ent[0].end)


def test_hits_feed_the_next_round_until_the_attacker_fails():
    eng = Scripted(
        rewrites=["Pt John Smith seen at a hospital on a spring day.", "Pt seen at Mercy clinic in spring."],
        attacks=["none", "1. Mercy Hospital"],
    )
    [res] = llm_anonymize(eng, [("d0", TEXT, ENTS)], AnonymizerSettings(rounds=2, on_failure="release", chunk_chars=60))
    # round 1: the name is still there (a hit whatever the attacker says); round 2: the attacker's guess hits
    assert res.hits == [1, 1] and res.rounds == 2 and res.status == "released_with_hits"
    assert res.best_round == 1 and res.text.startswith("Pt John Smith seen at a hospital")
    round2 = [p for p in eng.prompts if p.startswith("You are a clinical")][1]
    assert "john smith" in round2 and "rewrite 1: 1" in round2  # the clue and the memory
    assert res.text.endswith("\nHe is doing well, eating and walking.")  # the piece without values is kept


def test_private_round_stops_the_loop_and_failures_fall_back_as_configured():
    eng = Scripted(rewrites=["Pt seen at a hospital in spring."], attacks=["none"])
    [res] = llm_anonymize(eng, [("d0", TEXT, ENTS)], AnonymizerSettings(rounds=3))
    assert (res.status, res.rounds, res.hits, res.best_round) == ("private", 1, [0], 1)
    assert len(eng.prompts) == 2  # one rewrite, one attack
    leaky = ["Pt John Smith seen at Mercy Hospital in spring."] * 2
    [red] = llm_anonymize(Scripted(leaky, ["none"] * 2), [("d0", TEXT, ENTS)], AnonymizerSettings(rounds=2))
    assert red.status == "redacted" and red.fallback_redacted == 2 and "<PERSON>" in red.text and "<ORG>" in red.text
    assert not leaked_values(red.text, ["John Smith", "Mercy Hospital", "3/4/2020"])
    [held] = llm_anonymize(Scripted(leaky, ["none"] * 2), [("d0", TEXT, ENTS)],
                           AnonymizerSettings(rounds=2, on_failure="withhold"))  # fmt: skip
    assert held.status == "withheld" and held.text is None
    [err] = llm_anonymize(Scripted([], [], fail=True), [("d0", TEXT, ENTS)], AnonymizerSettings())
    assert err.status == "error" and err.text is None and "exceeds" in err.error
    [plain] = llm_anonymize(Scripted([], []), [("d1", "Nothing private.", [])], AnonymizerSettings())
    assert (plain.text, plain.rounds, plain.status) == ("Nothing private.", 0, "private")
    with pytest.raises(ValueError, match=r"span \[3, 99\)"):
        llm_anonymize(Scripted([], []), [("d2", "abc def", [Entity(3, 99, "x", "PERSON", "DIRECT", "gold", "")])],
                      AnonymizerSettings())  # fmt: skip


def test_a_rewriting_of_a_value_is_a_hit_and_is_redacted():
    """A rewrite that writes a value differently (\"Smith, John\", the surname alone, the date reformatted) has
    not removed it: the attacker's matcher counts it and the redaction fallback replaces it."""
    from ctrlgen.variants import Value

    values = [Value("John Smith", "PERSON"), Value("3/4/2020", "DATETIME")]
    assert attacker_hits([], "Seen by Smith, John on March 4, 2020.", values) == {"john smith", "3/4/2020"}
    assert attacker_hits(["Smith, John"], "nothing", values) == {"john smith"}
    leaky = ["Pt Smith, John seen at Mercy Hospital on March 4, 2020; Smith is well."] * 2
    [red] = llm_anonymize(Scripted(leaky, ["none"] * 2), [("d0", TEXT, ENTS)], AnonymizerSettings(rounds=2))
    assert red.status == "redacted" and red.fallback_redacted == 4, red.text
    assert "Smith" not in red.text and "2020" not in red.text and red.text.count("<PERSON>") == 2
    assert not leaked_values(red.text, [Value(e.text, e.category) for e in ENTS])


def test_rewrite_prompt_names_the_categories_not_the_values():
    p = rewrite_prompt("Pt seen.", ["DATETIME", "PERSON"], [], [])
    assert "dates and times" in p and "names of people" in p and p.endswith("Rewritten note:\n")


def test_tiny_model_loop_with_blocking_releases_no_known_value_and_is_seeded():
    """The real engine path (tiny random Llama): banned sequences keep the values out of every rewrite; the
    redaction fallback covers what the attacker still finds; the same seed gives the same release."""
    from ctrlgen.config import SamplingConfig
    from ctrlgen.generation.engine import HFEngine
    from ctrlgen.models import tiny_llama

    model, tok = tiny_llama()
    eng = HFEngine(model, tok, SamplingConfig(max_new_tokens=32, temperature=0.9), batch_size=4)
    docs = [("d0", TEXT, ENTS), ("d1", TEXT.replace("John", "Mary"), _ents(TEXT.replace("John", "Mary"),
            [("Mary Smith", "PERSON"), ("3/4/2020", "DATETIME")]))]  # fmt: skip
    s = AnonymizerSettings(rounds=2, max_new_tokens=32, attack_max_new_tokens=8, chunk_chars=60)

    def count(t):
        return len(tok(t, add_special_tokens=False)["input_ids"])

    first = llm_anonymize(eng, docs, s, tokenizer=tok, count_tokens=count)
    again = llm_anonymize(eng, docs, s, tokenizer=tok, count_tokens=count)
    assert [r.text for r in first] == [r.text for r in again]
    for r, (_, _, ents) in zip(first, docs, strict=True):
        assert r.status in ("private", "redacted") and 1 <= r.rounds <= 2 and len(r.hits) == r.rounds
        assert not leaked_values(r.text, [e.text for e in ents])


def test_remote_engine_reports_an_unreachable_endpoint_as_an_error_result():
    from ctrlgen.generation.remote import OpenAICompletionsEngine

    out = OpenAICompletionsEngine("http://127.0.0.1:9/v1", timeout_s=2, retries=0).generate(
        [GenerationRequest("secret text", seed=1)]
    )
    assert out[0].finish == "error" and "unreachable" in out[0].error and "secret" not in out[0].error
