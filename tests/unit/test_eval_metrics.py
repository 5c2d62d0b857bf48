"""Evaluation metrics on hand-made cases: ROUGE pruning, entity-in-context, linkage, canaries, utility."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ctrlgen.metrics.canary import Canary, candidate_texts, exposure, insert_canaries, make_canaries
from ctrlgen.metrics.context import context_windows, leaks_by_k
from ctrlgen.metrics.evaluate import Evaluator, RealDoc, aggregate
from ctrlgen.metrics.linkage import BM25, RealRecord, linkage_attack
from ctrlgen.metrics.rouge import RougeIndex, lcs_length, rouge_pair, tokenize
from ctrlgen.metrics.utility import mauve_score, perplexity_from
from ctrlgen.variants import Value

WORDS = "the patient was seen by doctor smith on monday with fever and cough at home ward".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# --- ROUGE -----------------------------------------------------------------------------------


def test_rouge_pair_by_hand() -> None:
    # candidate bigrams: the cat, cat sat, sat on, on a, a mat (5); reference: 5; shared 3 -> F1 0.6
    r2, rl = rouge_pair("the cat sat on the mat", "the cat sat on a mat")
    assert r2 == pytest.approx(0.6)
    assert rl == pytest.approx(5 / 6)  # LCS "the cat sat on mat" = 5 of 6 and 6


@pytest.mark.parametrize("seed", range(6))
def test_pruned_maximum_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    refs = [_text(rng, rng.randint(0, 40)) for _ in range(30)]
    idx = RougeIndex(refs)
    for _ in range(8):
        cand = _text(rng, rng.randint(0, 40))
        best = idx.best(cand)
        r2, rl = idx.brute_force(cand)
        assert best.rouge2 == pytest.approx(r2, abs=1e-12)
        assert best.rougeL == pytest.approx(rl, abs=1e-12)
        assert best.exact_calls <= 2 * len(refs)
        # the reported value is rouge_score's own for the chosen reference, to the bit
        # (computed from exact counts, without running rouge_score's table)
        if best.rouge2_ref >= 0:
            assert best.rouge2 == rouge_pair(refs[best.rouge2_ref], cand)[0]
        if best.rougeL_ref >= 0:
            assert best.rougeL == rouge_pair(refs[best.rougeL_ref], cand)[1]


def test_pruning_scores_few_references_when_one_is_copied() -> None:
    rng = random.Random(7)
    refs = [_text(rng, 60) for _ in range(200)]
    best = RougeIndex(refs).best(refs[17])
    assert best.rouge2 == pytest.approx(1.0) and best.rougeL == pytest.approx(1.0)
    assert best.rouge2_ref == 17 and best.rougeL_ref == 17
    assert best.exact_calls == 1  # one exact LCS: the copy's score reaches every other bound


@pytest.mark.parametrize("seed", range(3))
def test_bit_parallel_lcs_gives_rouge_scores_f1(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        a, b = _text(rng, rng.randint(1, 60)), _text(rng, rng.randint(1, 60))
        ta, tb = tokenize(a), tokenize(b)
        f1 = 2 * lcs_length(ta, tb) / (len(ta) + len(tb))
        assert f1 == pytest.approx(rouge_pair(a, b)[1], abs=1e-12)
    assert lcs_length([], ["a"]) == 0 and lcs_length(list("abcbdab"), list("bdcaba")) == 4


def test_rouge_empty_inputs() -> None:
    assert RougeIndex([]).best("anything").rouge2 == 0.0
    assert RougeIndex(["a b c"]).best("").rougeL == 0.0


# --- entity in context -------------------------------------------------------------------------


def test_context_windows_both_sides_and_edges() -> None:
    text = "Seen by Dr John Smith today."
    w = context_windows(text, [(11, 21)], ks=(1, 2, 4))
    assert w[1] == {("dr", "john", "smith"), ("john", "smith", "today")}
    assert w[2] == {("by", "dr", "john", "smith")}  # only one word after the mention
    assert w[4] == set()  # neither side has 4 words


def test_leaks_by_k() -> None:
    w = context_windows("pt seen by Dr Smith on ward 5", [(14, 19)])
    assert leaks_by_k("We asked DR SMITH ON WARD 5 today", w) == {1: True, 2: True, 3: True, 4: False}
    assert leaks_by_k("Smith alone", w) == {1: False, 2: False, 3: False, 4: False}


# --- linkage -----------------------------------------------------------------------------------


def test_bm25_prefers_rare_terms_and_short_docs() -> None:
    bm = BM25([["fever", "cough"], ["fever", "smith"], ["fever", "smith", "x", "y", "z", "w"]])
    s = bm.scores(["smith"])
    assert s[0] == 0.0 and s[1] > s[2] > 0.0
    assert bm.idf("smith") > bm.idf("fever")


def test_linkage_attack_finds_copied_record_and_nothing_in_clean_set() -> None:
    rec = RealRecord(
        "r1",
        "Alice Moss was admitted on May 3. She lives in Boston with her son.",
        ("Alice Moss", "May 3", "Boston", "Kim"),
    )
    other = RealRecord("r2", "Short.", ("Bob",))  # one value: not attackable
    copied = ["Unrelated note about fever.", "Alice Moss was admitted on May 3. She lives in Boston with her son."]
    res = linkage_attack([rec, other], copied, seed=0)
    assert (res.attacked, res.skipped) == (1, 1)
    # the known half retrieves the copy; of the other half, "kim" is absent from it
    assert 0.0 < res.values <= 1.0 and res.any_value == 1.0
    assert res.sentences == pytest.approx(1.0)
    clean = linkage_attack([rec], ["A patient was admitted with fever.", "Another note."], seed=0)
    assert clean.values == 0.0 and clean.any_value == 0.0 and clean.sentences == 0.0


def test_linkage_attack_counts_a_rewritten_value_as_found() -> None:
    # The other half's values appear only rewritten ("Moss, Alice", "05/03/2101"): a reader links them all the same.
    rec = RealRecord(
        "r1",
        "x",
        (
            Value("Alice Moss", "PERSON"),
            Value("2101-05-03", "DATETIME"),
            Value("Boston", "LOC"),
            Value("Kim Lee", "PERSON"),
        ),
    )
    syn = ["Moss, Alice seen 05/03/2101 in Boston; Lee, Kim visited.", "Unrelated note about fever."]
    res = linkage_attack([rec], syn, seed=0)
    assert res.attacked == 1 and res.values == 1.0
    plain = linkage_attack([RealRecord("r1", "x", tuple(str(v) for v in rec.values))], syn, seed=0)
    assert plain.values < 1.0  # as written only, the rewritings are missed


# --- canaries ----------------------------------------------------------------------------------


def test_insert_canaries_shifts_entities_and_marks_secret() -> None:
    rows = [
        {"doc_id": f"d{i}", "text": "Seen by Smith.", "control_code": "PERSON: Smith",
         "entities": [{"start": 8, "end": 13, "text": "Smith", "category": "PERSON", "kind": "DIRECT", "source": "gold", "label": ""}]}
        for i in range(4)
    ]  # fmt: skip
    can = make_canaries(2, seed=1, repeats=(1, 2))
    out = insert_canaries(rows, can, seed=0)
    planted = [r for r in out if r["text"] != rows[0]["text"]]
    assert len(planted) == 3 and len({r["doc_id"] for r in planted}) == 3
    for r in planted:
        secret = r["entities"][0]
        assert r["text"][secret["start"] : secret["end"]] == secret["text"] and secret["source"] == "canary"
        smith = r["entities"][1]
        assert r["text"][smith["start"] : smith["end"]] == "Smith"
        assert r["control_code"].startswith("PERSON: Smith\nCODE: ")
    assert rows[0]["text"] == "Seen by Smith."  # inputs untouched
    with pytest.raises(ValueError, match="plantings"):
        insert_canaries(rows[:2], can, seed=0)
    # Out of the code: the same plantings and private spans, the hosts' codes as before.
    hidden = insert_canaries(rows, can, seed=0, in_code=False)
    assert [r["text"] for r in hidden] == [r["text"] for r in out]
    assert [r["entities"] for r in hidden] == [r["entities"] for r in out]
    assert all(r["control_code"] == "PERSON: Smith" for r in hidden)


def test_exposure_rank_extremes() -> None:
    c = Canary("123456", 1)
    texts = candidate_texts(c, 99, seed=0)
    assert texts[0] == c.text and len(set(texts)) == 100
    best, rank = exposure(c, lambda ts: [0.0 if t == c.text else 1.0 for t in ts], n_candidates=99)
    assert rank == 1 and best == pytest.approx(math.log2(100))
    worst, rank = exposure(c, lambda ts: [2.0 if t == c.text else 1.0 for t in ts], n_candidates=99)
    assert rank == 100 and worst == pytest.approx(0.0)
    flat, _ = exposure(c, lambda ts: [1.0] * len(ts), n_candidates=99)
    assert flat == pytest.approx(0.0)  # ties count against the canary


# --- utility -----------------------------------------------------------------------------------


def test_perplexity_from() -> None:
    assert perplexity_from(3 * math.log(5.0), 3) == pytest.approx(5.0)
    assert math.isnan(perplexity_from(0.0, 0))


def test_mauve_same_vs_different_distributions() -> None:
    rng = np.random.default_rng(0)
    p = rng.normal(0, 1, (60, 8)).astype(np.float32)
    q = rng.normal(0, 1, (60, 8)).astype(np.float32)
    far = rng.normal(6, 1, (60, 8)).astype(np.float32)
    assert mauve_score(p, q) > 0.9
    assert mauve_score(far, q) < 0.2
    with pytest.raises(ValueError, match="at least 2"):
        mauve_score(p[:1], q)


# --- evaluator + aggregation -------------------------------------------------------------------


def _real() -> dict[str, RealDoc]:
    a = RealDoc("a", "Seen by Dr Smith on ward 5 today.", ("Smith", "5"), ((11, 16), (25, 26)))
    b = RealDoc("b", "Mrs Jones called from Boston.", ("Jones", "Boston"), ((4, 9), (22, 28)))
    c = RealDoc("c", "No names here at all.", (), ())
    return {d.doc_id: d for d in (a, b, c)}


def _row(doc: str, mode: str, text: str, ctx: list[str], status: str = "ok") -> dict[str, object]:
    return {"doc_id": doc, "mode": mode, "text": text, "context_ids": ctx, "status": status}


def test_evaluator_icl_and_finetune_definitions() -> None:
    ev = Evaluator(_real(), finetune_ids=["a", "b"])
    rows = [
        _row("t1", "icl", "Dr Smith saw her.", ["a", "c"]),  # leaks 1 of its 2 context values
        _row("t2", "icl", "Nothing private.", ["b", "c"]),
        _row("t3", "icl", "", [], status="quarantined"),
        _row("t4", "prefix", "Mrs Jones called from Boston.", []),  # copies b
        _row("t5", "prefix", "A quiet day.", []),
    ]
    recs = ev.table(rows).to_pylist()
    assert recs[0]["leaked"] == ["smith"] and recs[0]["n_values"] == 2 and recs[0]["ctx_1"] is True
    assert recs[1]["leaked"] == [] and recs[1]["ctx_1"] is False
    assert recs[3]["rouge2"] == pytest.approx(1.0) and recs[3]["n_values"] == 4
    agg = aggregate(recs, n_finetune_values=len(ev.ft_values))
    assert agg["icl"]["outputs"] == 2 and agg["icl"]["quarantined"] == 1
    assert agg["icl"]["pipp"] == pytest.approx(0.5) and agg["icl"]["elp"] == pytest.approx(0.25)
    assert agg["icl"]["pipp_long"] == pytest.approx(0.5)
    assert agg["prefix"]["pipp"] == pytest.approx(0.5)
    assert agg["prefix"]["elp"] == pytest.approx(2 / 4)  # jones, boston of smith, 5, jones, boston
    assert agg["prefix"]["ctx_1"] == pytest.approx(0.5)


def test_evaluator_unknown_references_are_errors() -> None:
    with pytest.raises(Exception, match="no reference"):
        Evaluator(_real(), finetune_ids=["zz"])
    with pytest.raises(Exception, match="no reference"):
        Evaluator(_real()).document(_row("t", "icl", "x", ["zz"]))


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_sharded_references_give_the_records_of_one_evaluator(num_shards: int) -> None:
    """Each row scored against every shard holding its references, partials merged: the same records."""
    from ctrlgen.metrics.evaluate import ShardEvaluator, merge_partials, shard_of

    real = _real()
    rows = [
        _row("t1", "icl", "Dr Smith saw her on ward 5 and Mrs Jones called.", ["a", "b", "c"]),
        _row("t2", "icl", "Nothing private.", ["b", "c"]),
        _row("t3", "icl", "", ["a"], status="quarantined"),
        _row("t4", "prefix", "Mrs Jones called from Boston. Seen by Dr Smith.", []),
        _row("t5", "prefix", "A quiet day.", []),
        _row("t6", "icl", "no contexts", []),
    ]
    ev = Evaluator(real, finetune_ids=["a", "b"])
    shards = [
        ShardEvaluator(
            {d: r for d, r in real.items() if shard_of(d, num_shards) == k},
            {d: r for d, r in real.items() if d in ("a", "b") and shard_of(d, num_shards) == k},
        )
        for k in range(num_shards)
    ]
    for row in rows:
        merged = merge_partials([s.partial(row) for s in shards], len(ev.ft_values))
        want = ev.document(row)
        assert {k: v for k, v in merged.items() if k != "exact_calls"} == {
            k: v for k, v in want.items() if k != "exact_calls"
        }
    with pytest.raises(Exception, match="1 context document"):
        merge_partials([s.partial(_row("t", "icl", "x", ["a", "zz"])) for s in shards], 0)


def test_category_f1_learns_from_released_notes_and_scores_real_ones() -> None:
    from ctrlgen.metrics.utility import category_f1

    def note(person: bool, date: bool, i: int) -> str:
        return " ".join(["Patient seen on ward", f"bed {i}."] + (["Dr. Wexler called the wife."] if person else [])
                        + (["Admitted on 3 March."] if date else []))  # fmt: skip

    combos = [(p, d) for p in (True, False) for d in (True, False)] * 5
    train = [note(p, d, i) for i, (p, d) in enumerate(combos)]
    labels = [{c for c, on in (("PERSON", p), ("DATETIME", d)) if on} for p, d in combos]
    test = [note(p, d, 100 + i) for i, (p, d) in enumerate(combos[:8])]
    assert category_f1(train, labels, test, labels[:8]) == 1.0
    # Labels that do not follow the texts teach nothing: worse than the informative set.
    shuffled = labels[5:] + labels[:5]
    assert category_f1(train, shuffled, test, labels[:8]) < 0.8
    assert category_f1([], [], test, labels[:8]) is None


def test_canary_prompt_is_its_hosts_code_without_the_secret_and_scores_only_the_continuation():
    from ctrlgen.metrics.canary import canary_prompt, insert_canaries, make_canaries
    from ctrlgen.metrics.utility import sequence_nll
    from ctrlgen.models import tiny_llama
    from ctrlgen.schema import Entity

    rows = [{"doc_id": f"d{i}", "text": f"Pt Ann Lee{i} seen.", "entities": [Entity(3, 10 + len(str(i)), f"Ann Lee{i}",
             "PERSON", "DIRECT", "gold", "").to_row()], "control_code": f"PERSON: Ann Lee{i}"} for i in range(4)]  # fmt: skip
    [c] = make_canaries(1, seed=0)
    planted = insert_canaries(rows, [c], seed=0)
    prompt = canary_prompt(planted, c)
    host = next(r for r in planted if r["text"].startswith(c.text))
    assert c.secret not in prompt and host["control_code"].count(c.secret) == 1
    assert prompt.startswith("Control code:") and "PERSON: Ann Lee" in prompt and prompt.endswith("Document:\n")
    model, tok = tiny_llama()
    alone = sequence_nll(model, tok, [c.text])[0]
    after = sequence_nll(model, tok, [c.text], prompts=[prompt])[0]
    assert after[1] == len(tok(c.text, add_special_tokens=False)["input_ids"])  # only the canary's tokens count
    assert after[0] != alone[0]


def test_shared_prompt_scoring_equals_the_full_sequence_pass_for_base_prefix_and_lora_models():
    """Exposure scores candidates behind one prompt pass; the sums must be those of the plain full pass."""
    import torch

    from ctrlgen.metrics.utility import sequence_nll
    from ctrlgen.models import tiny_llama
    from ctrlgen.training.prefix import lora_model, prefix_model

    texts = ["My secret is 123 456 789.", "x", "Seen by Dr Ann Lee on Monday and again later.", "ok then"]
    code = "Control code: PERSON: Bob\nDocument:\n"
    prompts = [code, code, "Other prompt here", code]
    base_scores: list[tuple[float, int]] = []
    for kind in ("base", "prefix", "lora"):
        torch.manual_seed(0)
        model, tok = tiny_llama()
        if kind != "base":
            model = prefix_model(model, 5) if kind == "prefix" else lora_model(model)
            with torch.no_grad():  # trained-looking adapters: they must change the scores
                for name, p in model.named_parameters():
                    if p.requires_grad and (kind == "prefix" or "lora_B" in name):
                        p.normal_(0, 0.5)
        full = sequence_nll(model, tok, texts, batch_size=2, prompts=prompts, share_prompt=False)
        shared = sequence_nll(model, tok, texts, batch_size=2, prompts=prompts)
        assert [n for _, n in shared] == [n for _, n in full]
        assert all(abs(a - b) < 1e-3 for (a, _), (b, _) in zip(shared, full, strict=True)), kind
        if kind != "base":
            assert full != base_scores
        else:
            base_scores = full


def test_utility_autocast_fine_tunes_in_bf16_on_the_current_weights_and_keeps_fp32_weights():
    """experiment.utility_autocast: each step's forward in bf16 on the weights as they are after the previous
    step (autocast's cast cache must not freeze them: the losses fall as the float32 run's do), weights
    float32, the perplexity after close to the float32 run's."""
    import torch

    from ctrlgen.metrics.utility import finetune_lm, perplexity
    from ctrlgen.models import tiny_llama

    texts = ["Pt seen by Dr Ann Lee on Monday, BP stable.", "Follow up in two weeks with cardiology."] * 2
    test = ["Pt seen by Dr Ann Lee on Monday, BP stable.", "Seen again, no new complaints today."]
    losses, ppl = {}, {}
    for mode in (None, "bfloat16"):
        torch.manual_seed(0)
        model, tok = tiny_llama()
        losses[mode] = finetune_lm(model, tok, texts, epochs=6, learning_rate=3e-3, max_tokens=32, seed=0,
                                   batch_size=2, autocast=mode)  # fmt: skip
        ppl[mode] = perplexity(model, tok, test, 32)
        assert all(p.dtype == torch.float32 for p in model.parameters())
    f32, b16 = losses[None], losses["bfloat16"]
    assert f32[-1] < f32[0] - 1.0  # the fine-tuning learns
    assert b16 != f32 and all(abs(a - b) < 0.1 * a for a, b in zip(f32, b16, strict=True))
    assert abs(ppl["bfloat16"] / ppl[None] - 1) < 0.1


def test_leaks_by_k_probes_the_text_and_agrees_with_walking_every_window():
    """leaks_by_k looks the text's n-grams up in the window sets, held as sorted 64-bit hashes (cost of the text,
    not of a fine-tuning set's millions of windows; 8 bytes a window); on random texts and windows it says what
    the definition says: some window of level k is a contiguous word sequence of the text."""
    import random

    from ctrlgen.metrics.context import WindowSets, leaks_by_k, merge_windows, words

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(12)]
    for _ in range(200):
        parts = [{k: {tuple(rng.choices(vocab, k=k + rng.randint(1, 3))) for _ in range(rng.randint(0, 4))}
                  for k in (1, 2, 3, 4)} for _ in range(3)]  # fmt: skip
        windows = merge_windows(parts)
        union = {k: set().union(*(p[k] for p in parts)) for k in (1, 2, 3, 4)}
        assert isinstance(windows, WindowSets) and len(windows) == sum(map(len, union.values()))
        assert windows.nbytes == 8 * len(windows)  # hashes only
        text = " ".join(rng.choices(vocab, k=rng.randint(0, 30)))
        toks = [t for t, _, _ in words(text)]
        grams = {tuple(toks[i : i + n]) for n in range(1, 8) for i in range(len(toks) - n + 1)}
        want = {k: any(w in grams for w in ws) for k, ws in union.items()}
        assert leaks_by_k(text, windows) == want == leaks_by_k(text, union)


def test_finetune_rouge_over_a_seeded_sample_of_the_finetune_set() -> None:
    """Past ``rouge_finetune_sample`` documents, a fine-tuning output's ROUGE is the maximum over the documents
    a fixed hash of doc_id keeps (about the sample's size, the same in every shard, nested across rates), while
    its leaked values and entity windows are still tested against the whole set; sharded = local."""
    import random

    from ctrlgen.metrics.evaluate import (
        ShardEvaluator,
        in_rouge_sample,
        merge_partials,
        rouge_sample_rate,
        shard_of,
    )
    from ctrlgen.metrics.rouge import RougeIndex

    ids = [f"note-{i}" for i in range(20_000)]
    for rate in (0.01, 0.1, 0.5):
        n = sum(in_rouge_sample(d, rate) for d in ids)
        assert abs(n - rate * len(ids)) < 5 * (rate * len(ids)) ** 0.5 + 1
    small, large = ({d for d in ids if in_rouge_sample(d, r)} for r in (0.05, 0.2))
    assert small < large
    assert rouge_sample_rate(None, 10**6) == 1.0 and rouge_sample_rate(100, 100) == 1.0
    assert rouge_sample_rate(100, 400) == 0.25

    rng = random.Random(3)
    words = ["ward", "seen", "today", "pain", "stable", "home", "called", "nurse", "bed", "rest"]
    real = {}
    for i in range(60):
        text = " ".join(rng.choice(words) for _ in range(12)) + f" Dr Name{i} visited."
        start = text.index(f"Name{i}")
        real[f"d{i}"] = RealDoc(f"d{i}", text, (f"Name{i}",), ((start, start + len(f"Name{i}")),))
    rate = rouge_sample_rate(20, len(real))
    kept = [d for d in sorted(real) if in_rouge_sample(d, rate)]
    assert 0 < len(kept) < len(real)
    dropped = next(d for d in sorted(real) if d not in kept)
    ev = Evaluator(real, sorted(real), rate)
    copy = _row("t", "prefix", real[dropped].text, [])
    rec = ev.document(copy)
    # the copied note is outside the ROUGE sample: ROUGE is the best over the sample, below 1
    want = RougeIndex([real[d].text for d in kept]).brute_force(real[dropped].text)
    assert (rec["rouge2"], rec["rougeL"]) == pytest.approx(want) and rec["rougeL"] < 1.0
    # its value and its entity windows are found in the whole set all the same
    assert rec["leaked"] == [f"name{dropped[1:]}"] and rec["ctx_1"] is True
    assert Evaluator(real, sorted(real)).document(copy)["rougeL"] == pytest.approx(1.0)
    shards = [ShardEvaluator({}, {d: r for d, r in real.items() if shard_of(d, 3) == k}, rate) for k in range(3)]
    for row in (copy, _row("u", "prefix", real[kept[0]].text[:40], [])):
        merged = merge_partials([s.partial(row) for s in shards], len(ev.ft_values))
        local = ev.document(row)
        assert {k: v for k, v in merged.items() if k != "exact_calls"} == {
            k: v for k, v in local.items() if k != "exact_calls"
        }
    # a shard lets its notes go once it has scored a fine-tuning output (index, windows and values built)
    assert all(s.ft.real == {} and s.ft.ft_docs == [] and s.ft.n_finetune > 0 for s in shards)
    assert ev.real and len(ev.ft_docs) == len(real)  # the local evaluator keeps them


def test_rouge_index_postings_do_not_depend_on_the_build_blocks(monkeypatch) -> None:
    """The inverted indexes are counted a block of references at a time (flat arrays, no array per reference):
    any block size gives the same arrays as one block over everything, empty references included."""
    import random

    import numpy as np

    from ctrlgen.metrics.rouge import RougeIndex, _Inverted

    rng = random.Random(5)
    words = [f"w{i}" for i in range(30)]
    refs = [" ".join(rng.choices(words, k=rng.randint(0, 40))) for _ in range(60)] + ["", "w1", "w1 w1 w1"]
    whole = RougeIndex(refs, keep_texts=False).to_arrays()
    for block in (1, 7, 64):
        monkeypatch.setattr(_Inverted, "block_tokens", block)
        arrays, vocab = RougeIndex(refs, keep_texts=False).to_arrays()
        assert vocab == whole[1]
        for k, a in whole[0].items():
            assert arrays[k].dtype == a.dtype and np.array_equal(arrays[k], a), (block, k)
    # postings by hand: w1 occurs in "w1" once and in "w1 w1 w1" three times
    idx = RougeIndex(["w1", "w1 w1 w1", "w2 w1"], keep_texts=False)
    arrays, vocab = idx.to_arrays()
    j = int(np.searchsorted(arrays["uni_keys"], vocab.index("w1")))
    lo, hi = arrays["uni_starts"][j], arrays["uni_starts"][j + 1]
    assert arrays["uni_ids"][lo:hi].tolist() == [0, 1, 2] and arrays["uni_counts"][lo:hi].tolist() == [1, 3, 1]
    assert arrays["bi_totals"].tolist() == [0.0, 2.0, 1.0]
