"""The fast engine against the reference: greedy outputs, blocking, batch independence, adapters, slots.

Tiny random decoders of four architectures (Llama, Qwen2, Mistral with a sliding window, Qwen3) in float32
on the CPU; their weights are drawn at a larger scale than usual so that greedy text does not collapse into
one repeated token (a weak check of positions and caches).
"""

from __future__ import annotations

import concurrent.futures
import doctest
import importlib
import pickle
import random
from typing import Any

import pytest
import torch

from ctrlgen.config import ModelConfig, SamplingConfig
from ctrlgen.generation.engines.fast import FastEngine
from ctrlgen.generation.engines.fast.scheduler import Scheduler
from ctrlgen.generation.engines.hf import HFEngine
from ctrlgen.generation.factory import build_engine
from ctrlgen.generation.logits import automaton
from ctrlgen.generation.logits.automaton import BanTables, CompiledBans, compile_banned, compile_banned_reference
from ctrlgen.generation.logits.sampling import counter_uniform, nucleus_cutoff, sample_tokens
from ctrlgen.generation.types import GenerationRequest
from ctrlgen.models import tiny_tokenizer

WORDS = ("The patient is a 58 year old female admitted in transfer for mental status changes. Vital signs stable "
         "overnight; blood pressure 120/80, heart rate 72. Plan: continue heparin, repeat labs, Dr. Smith.").split()  # fmt: skip


def _prompts(n: int, seed: int = 0, longest: int = 90) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, longest))) for _ in range(n)]


def _tiny(arch: str = "llama", seed: int = 0) -> tuple[Any, Any]:
    import transformers as tf

    tok = tiny_tokenizer()
    common: dict[str, Any] = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, initializer_range=0.3,
    )  # fmt: skip
    configs = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {"tie_word_embeddings": True}),
        "llama3-rope": (
            tf.LlamaConfig,
            tf.LlamaForCausalLM,
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
        ),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {"tie_word_embeddings": False}),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {"sliding_window": 8}),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 16}),
    }
    cfg_cls, model_cls, extra = configs[arch]
    torch.manual_seed(seed)
    return model_cls(cfg_cls(**common, **extra)).eval(), tok


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """Tiny matrices: one thread is faster, and spares the machine's other work (idle OpenMP threads spin)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any]:
    return _tiny("llama")


def _fast(model: Any, tok: Any, **kw: Any) -> FastEngine:
    sampling = kw.pop("sampling", SamplingConfig(max_new_tokens=24, temperature=0.8, top_p=0.9))
    return FastEngine(model, tok, sampling, **{"slots": 4, "prefill_chunk": 16, "kv_bucket": 16, **kw})


@pytest.mark.parametrize("arch", ["llama", "llama3-rope", "qwen2", "mistral", "qwen3"])
def test_greedy_outputs_equal_the_reference_engine_and_transformers_generate(arch: str) -> None:
    model, tok = _tiny(arch)
    greedy = SamplingConfig(max_new_tokens=24, temperature=0)
    reqs = [GenerationRequest(p) for p in _prompts(5, seed=1)]
    fast = _fast(model, tok, sampling=greedy, slots=3).generate(reqs)
    ref = [HFEngine(model, tok, greedy, batch_size=1).generate([r])[0] for r in reqs]
    assert [f.text for f in fast] == [r.text for r in ref]
    assert [f.new_tokens for f in fast] == [r.new_tokens for r in ref]
    assert [f.finish for f in fast] == [r.finish for r in ref]
    # transformers' own generate, token for token
    for r, f in zip(reqs, fast, strict=True):
        if f.new_tokens == 0:
            continue
        ids = tok(r.prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=f.new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=None)  # fmt: skip
        assert tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip() == f.text


def test_a_sampled_request_gives_the_same_text_alone_and_in_any_batch(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    rng = random.Random(2)
    reqs = [GenerationRequest(p, seed=rng.randrange(1 << 40), max_new_tokens=rng.randint(4, 24))
            for p in _prompts(10, seed=2)]  # fmt: skip
    eng = _fast(model, tok)
    together = [r.text for r in eng.generate(reqs)]
    alone = [_fast(model, tok).generate([r])[0].text for r in reqs]
    shuffled = list(range(len(reqs)))
    rng.shuffle(shuffled)
    other = eng.generate([reqs[i] for i in shuffled])
    assert together == alone
    assert [other[shuffled.index(i)].text for i in range(len(reqs))] == together
    assert len(set(together)) > 5  # seeds and prompts matter


def test_seeds_change_sampled_text_and_the_same_seed_repeats_it(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    p = _prompts(1, seed=3)[0]
    eng = _fast(model, tok)
    a, b, c = (r.text for r in eng.generate([GenerationRequest(p, seed=1), GenerationRequest(p, seed=1),
                                             GenerationRequest(p, seed=2)]))  # fmt: skip
    assert a == b != c


def test_shared_prefill_equals_separate_prefill(llama: tuple[Any, Any]) -> None:
    """Rows with one prompt (ICL with and without blocking) and prompts that begin alike reuse the cached
    chunks; their outputs equal those of engines that computed everything."""
    model, tok = llama
    base = _prompts(1, seed=4, longest=60)[0] + " "
    prompts = [base + "Plan:", base + "Vital signs", base + "Plan:"]
    banned = tuple(tuple(s) for s in [tok.encode(" the", add_special_tokens=False)])
    reqs = [GenerationRequest(prompts[0], seed=5), GenerationRequest(prompts[1], seed=6),
            GenerationRequest(prompts[2], seed=7, banned=banned)]  # fmt: skip
    shared = _fast(model, tok)
    out = [r.text for r in shared.generate(reqs)]
    assert shared.stats["prefill_reused"] >= 2 * 16  # the common chunks were computed once
    separate = [_fast(model, tok, prefix_cache_tokens=0).generate([r])[0].text for r in reqs]
    assert out == separate


def test_a_finished_slot_is_refilled_at_once(llama: tuple[Any, Any]) -> None:
    """One slot, three requests: each is admitted as soon as the previous one ends; the steps taken are the
    tokens generated (no waiting for a batch's longest row)."""
    model, tok = llama
    reqs = [GenerationRequest(p, seed=i, max_new_tokens=n) for i, (p, n) in enumerate(zip(_prompts(3, 5), (3, 9, 5),
                                                                                              strict=True))]  # fmt: skip
    eng = _fast(model, tok, slots=2)
    out = eng.generate(reqs)
    assert [r.new_tokens for r in out] == [3, 9, 5]
    assert eng.stats["steps"] == 9 + 0  # rows 0 and 2 share slot 0 while row 1 runs 9 steps in slot 1
    assert [r.text for r in out] == [_fast(model, tok).generate([r])[0].text for r in reqs]


def test_scheduler_hands_a_released_slot_to_the_next_waiting_request() -> None:
    s: Scheduler[str] = Scheduler(slots=2)
    for name in "abcd":
        s.add(name)
    assert s.admit() == [(0, "a"), (1, "b")]
    assert s.admit() == []
    assert s.release(0) == "a"
    assert s.admit() == [(0, "c")]
    s.release(1)
    s.release(0)
    assert s.admit() == [(0, "d")] and s.busy
    s.release(0)
    assert not s.busy


def test_mixed_adapter_batch_equals_each_adapter_alone_and_the_peft_model(llama: tuple[Any, Any]) -> None:
    from peft import PrefixTuningConfig, TaskType, get_peft_model

    model, tok = llama
    peft_models = []
    for seed, virtual in ((1, 5), (2, 7)):
        torch.manual_seed(seed)
        base, _ = _tiny("llama")
        pm = get_peft_model(base, PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=virtual))
        with torch.no_grad():
            for p in pm.prompt_encoder.parameters():
                p.normal_(0, 1)
        peft_models.append(pm.eval())
    greedy = SamplingConfig(max_new_tokens=16, temperature=0)
    eng = _fast(model, tok, sampling=greedy)
    eng.add_adapter("a", peft_models[0])
    eng.add_adapter("b", peft_models[1])
    prompts = _prompts(3, seed=6)
    reqs = [GenerationRequest(p, adapter=a) for p in prompts for a in ("a", "b", None)]
    mixed = [r.text for r in eng.generate(reqs)]
    for name in ("a", "b", None):
        alone = _fast(model, tok, sampling=greedy)
        if name is not None:
            alone.add_adapter(name, peft_models[0 if name == "a" else 1])
        mine = [r for r in reqs if r.adapter == name]
        assert [x.text for x in alone.generate(mine)] == [
            m for m, r in zip(mixed, reqs, strict=True) if r.adapter == name
        ]
    # the reference: transformers' generate through each PEFT model (HFEngine over the adapters)
    ref = HFEngine(model, tok, greedy, batch_size=1, adapters={"a": peft_models[0], "b": peft_models[1]})
    assert [r.text for r in ref.generate(reqs)] == mixed
    assert len({mixed[0], mixed[1], mixed[2]}) == 3  # the adapters change the text
    # sampled: each row's draws are its own whatever the adapters around it
    sampled = _fast(model, tok)
    sampled.add_adapter("a", peft_models[0])
    sampled.add_adapter("b", peft_models[1])
    seeded = [GenerationRequest(r.prompt, seed=i, adapter=r.adapter) for i, r in enumerate(reqs)]
    assert [r.text for r in sampled.generate(seeded)] == [sampled.generate([r])[0].text for r in seeded]


def test_unknown_adapter_empty_and_overlong_prompts_are_error_results(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    eng = _fast(model, tok)
    out = eng.generate([GenerationRequest("x", adapter="nope"), GenerationRequest(""),
                        GenerationRequest("word " * 600), GenerationRequest("Plan:")])  # fmt: skip
    assert "unknown adapter" in (out[0].error or "") and out[1].error == "empty prompt"
    assert "positions" in (out[2].error or "") and out[3].error is None
    # a banned token outside the vocabulary: that request alone is an error (its automaton compiles on the pool)
    bad = eng.generate([GenerationRequest("Plan:", banned=((10**9,),)), GenerationRequest("Vital", banned=((5,),))])
    assert "outside the vocabulary" in (bad[0].error or "") and bad[1].error is None and bad[1].new_tokens > 0


def test_stop_strings_cut_the_text_as_the_reference_does(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    greedy = SamplingConfig(max_new_tokens=24, temperature=0)
    prompts = _prompts(4, seed=7)
    free = HFEngine(model, tok, greedy, batch_size=1).generate([GenerationRequest(p) for p in prompts])

    def stop_of(text: str) -> str:  # 3 printable ASCII characters past the start (a partial UTF-8 byte decodes
        # to U+FFFD, which transformers' token-level stop strings cannot match)
        return next(text[i : i + 3] for i in range(3, len(text)) if text[i : i + 3].isascii()
                    and text[i : i + 3].isprintable() and text[i : i + 3].strip())  # fmt: skip

    reqs = [GenerationRequest(p, stop=(stop_of(f.text),)) for p, f in zip(prompts, free, strict=True)]
    ref = [HFEngine(model, tok, greedy, batch_size=1).generate([r])[0] for r in reqs]
    for poll in (1, 5):
        fast = _fast(model, tok, sampling=greedy, poll_every=poll).generate(reqs)
        assert [(f.text, f.finish, f.new_tokens) for f in fast] == [(r.text, r.finish, r.new_tokens) for r in ref]
    assert all(r.finish == "stop" for r in ref)


def test_blocked_sequences_never_appear_in_fast_outputs(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    greedy = SamplingConfig(max_new_tokens=24, temperature=0)
    prompts = _prompts(4, seed=8)
    free = _fast(model, tok, sampling=greedy).generate([GenerationRequest(p) for p in prompts])
    ids = [list(r.token_ids) for r in free]
    banned = [(*(tuple(row[i : i + 2]) for i in range(len(row) - 1)), (row[3],)) for row in ids]
    blocked = _fast(model, tok, sampling=greedy).generate(
        [GenerationRequest(p, banned=b) for p, b in zip(prompts, banned, strict=True)]
    )
    ref = HFEngine(model, tok, greedy, batch_size=4).generate(
        [GenerationRequest(p, banned=b) for p, b in zip(prompts, banned, strict=True)]
    )
    for r, b, p in zip(blocked, banned, prompts, strict=True):
        out = tok.encode(p, add_special_tokens=False)[-1:] + list(r.token_ids)  # a ban may span the prompt's end
        assert r.token_ids and not {tuple(out[i : i + 2]) for i in range(len(out) - 1)} & set(b)
        assert b[-1][0] not in r.token_ids
    assert [r.token_ids for r in blocked] == [r.token_ids for r in ref]


def test_automata_compiled_in_worker_processes_give_the_same_outputs_and_survive_a_killed_worker(
    llama: tuple[Any, Any], capsys: Any
) -> None:
    model, tok = llama
    prompts = _prompts(6, seed=9)
    rng = random.Random(9)
    vocab = len(tok)

    def reqs(salt: int) -> list[GenerationRequest]:
        return [GenerationRequest(p, seed=i + salt, banned=tuple(
            tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 3))) for _ in range(300)))
            for i, p in enumerate(prompts)] + [GenerationRequest("Plan:", banned=((10**9,),))]  # fmt: skip

    first, second = reqs(0), reqs(100)
    threads = _fast(model, tok)
    want = [(r.text, r.finish, r.error) for r in threads.generate(first) + threads.generate(second)]
    procs = _fast(model, tok, compile_processes=2)
    try:
        got = [(r.text, r.finish, r.error) for r in procs.generate(first)]
        assert isinstance(procs._compile_pool, concurrent.futures.ProcessPoolExecutor)
        for proc in list(procs._compile_pool._processes.values()):  # a worker killed (OOM killer, operator)
            proc.kill()
            proc.join()
        got += [(r.text, r.finish, r.error) for r in procs.generate(second)]
    finally:
        procs.close()
    assert got == want
    assert "outside the vocabulary" in (got[len(first) - 1][2] or "")  # the worker's ValueError, as an error result
    assert procs.compile_processes == 0 and "compile processes stopped" in capsys.readouterr().err


def test_a_compiled_automaton_survives_its_trip_as_arrays() -> None:
    rng = random.Random(3)
    seqs = [[rng.randrange(40) for _ in range(rng.randint(1, 5))] for _ in range(200)]
    a = compile_banned(seqs, 40)
    b = CompiledBans.from_arrays(pickle.loads(pickle.dumps(a.to_arrays())))
    assert _as_strings(a) == _as_strings(b) and a.depth == b.depth and a.vocab == b.vocab
    hist = [rng.randrange(40) for _ in range(12)]
    assert a.state_after(hist) == b.state_after(hist)


def test_ban_tables_equal_transformers_bad_words_processor_on_thousands_of_sequences() -> None:
    from transformers.generation.logits_process import NoBadWordsLogitsProcessor

    rng = random.Random(9)
    vocab, rows, steps = 300, 3, 16
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 4))] for _ in range(3000)]
    # histories that walk into banned prefixes often: half the tokens continue a random banned sequence
    hist = torch.tensor([[rng.randrange(vocab) for _ in range(5)] for _ in range(rows)])
    ref = NoBadWordsLogitsProcessor(seqs, eos_token_id=vocab + 1)
    tabs = BanTables(rows, vocab, "cpu")
    comp = compile_banned(seqs, vocab)
    for r in range(rows):
        tabs.load(r, comp, hist[r].tolist())
    for _ in range(steps):
        want = ref(hist, torch.zeros(rows, vocab)) == float("-inf")
        assert torch.equal(tabs.mask(), want)
        nxt = []
        for _ in range(rows):
            s = seqs[rng.randrange(len(seqs))]
            nxt.append(s[0] if rng.random() < 0.5 else rng.randrange(vocab))
        tok = torch.tensor(nxt)
        hist = torch.cat([hist, tok[:, None]], 1)
        tabs.advance(tok)


def _as_strings(c: Any) -> tuple[list[tuple[int, ...]], dict, dict]:
    """An automaton by token strings (its node numbering is an implementation detail): nodes, failure links,
    banned tokens per node."""
    parent = {nxt: divmod(k, c.vocab) for k, nxt in zip(c.edge_keys.tolist(), c.edge_next.tolist(), strict=True)}
    memo: dict[int, tuple[int, ...]] = {0: ()}

    def name(q: int) -> tuple[int, ...]:
        if q not in memo:
            p, t = parent[q]
            memo[q] = (*name(p), t)
        return memo[q]

    names = [name(q) for q in range(c.nodes)]
    off, tok = c.ban_off.tolist(), c.ban_tok.tolist()
    return names, {names[q]: names[int(c.fail[q])] for q in range(c.nodes)}, \
        {names[q]: tok[off[q] : off[q + 1]] for q in range(c.nodes)}  # fmt: skip


@pytest.mark.parametrize("mul", [None, 1], ids=["hash", "colliding-hash"])
def test_array_compile_equals_the_loop_compile(mul: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    if mul is not None:  # a multiplier of 1 hashes permutations alike: collisions must fall back, still exact
        monkeypatch.setattr(automaton, "_MUL", np.uint64(mul))
    rng = random.Random(11)
    fell_back = 0
    for trial in range(60):
        vocab = rng.choice([4, 30, 300])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, rng.choice([2, 4, 7])))]
                for _ in range(rng.choice([1, 5, 80, 600]))]  # fmt: skip
        fast, ref = compile_banned(seqs, vocab), compile_banned_reference(seqs, vocab)
        fell_back += fast.goto_host is not None
        names_f, fail_f, bans_f = _as_strings(fast)
        names_r, fail_r, bans_r = _as_strings(ref)
        assert sorted(names_f) == sorted(names_r) and fail_f == fail_r and bans_f == bans_r, trial
        assert fast.root_bans.tolist() == ref.root_bans.tolist() and fast.depth == ref.depth
        assert fast.edge_keys.tolist() == sorted(fast.edge_keys.tolist())
        for _ in range(10):  # the host-side initial state: the longest suffix of a history that is a node
            hist = [rng.randrange(vocab) for _ in range(rng.randint(0, 9))]
            if rng.random() < 0.5:
                s = rng.choice(seqs)
                hist += s[: rng.randint(0, len(s))]
            assert names_f[fast.state_after(hist)] == names_r[ref.state_after(hist)], (trial, hist)
    assert (fell_back > 0) == (mul is not None)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        compile_banned([[1, 2], [3, 99]], 50)


def test_ban_tables_hold_a_different_list_per_row_and_grow() -> None:
    rng = random.Random(10)
    vocab = 50
    tabs = BanTables(3, vocab, "cpu")
    lists = [[[rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(n)] for n in (2, 400, 0)]
    from ctrlgen.generation.blocking import RowBannedTokens

    ref = RowBannedTokens(lists, vocab)
    hist = torch.randint(0, vocab, (3, 4))
    for r, seqs in enumerate(lists):
        tabs.load(r, compile_banned(seqs, vocab) if seqs else None, hist[r].tolist())
    assert tabs.version > 1  # grew past the first capacities
    for _ in range(10):
        assert torch.equal(tabs.mask(), ref.banned_mask(hist))
        tok = torch.randint(0, vocab, (3,))
        hist = torch.cat([hist, tok[:, None]], 1)
        tabs.advance(tok)


def test_counter_draws_follow_the_distribution_and_topk_equals_sort() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(20000, 1)
    seeds = torch.arange(20000)
    zero = torch.zeros(20000, dtype=torch.long)
    freq = torch.bincount(sample_tokens(logits, seeds, zero, temperature=1.0), minlength=4) / 20000
    assert torch.allclose(freq, torch.softmax(logits[0], 0), atol=0.012)
    nucleus = torch.bincount(sample_tokens(logits, seeds, zero, temperature=1.0, top_p=0.8), minlength=4) / 20000
    assert nucleus[0] == 0 and nucleus[3] == 0 and abs(float(nucleus[2]) - 0.731) < 0.012
    top1 = sample_tokens(logits[:50], seeds[:50], zero[:50], temperature=1.0, top_k=1)
    assert set(top1.tolist()) == {2}
    torch.manual_seed(0)
    wide = torch.randn(64, 2000) * 3
    wide[:8] = torch.randn(8, 2000) * 0.01  # flat rows: their nucleus is not among the top candidates
    probs = torch.softmax(wide, -1)
    assert torch.equal(nucleus_cutoff(probs, 0.9, 0, candidates=64), nucleus_cutoff(probs, 0.9, 0))
    s = torch.arange(64)
    c = torch.full((64,), 3)
    assert torch.equal(sample_tokens(wide, s, c, temperature=0.7, top_p=0.9, candidates=64),
                       sample_tokens(wide, s, c, temperature=0.7, top_p=0.9))  # fmt: skip
    u = counter_uniform(torch.zeros(10000, dtype=torch.long), torch.arange(10000))
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.02


def test_per_row_temperature_and_top_p_draw_as_the_same_settings_for_the_whole_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(48, 500) * 3
    seeds, c = torch.arange(48), torch.full((48,), 5)
    temps = torch.tensor([0.0, 0.7, 1.3] * 16)
    tops = torch.tensor([0.9, 1.0, 0.5, 0.95] * 12)
    mixed = sample_tokens(logits, seeds, c, temperature=temps, top_p=tops, candidates=64)
    assert torch.equal(mixed, sample_tokens(logits, seeds, c, temperature=temps, top_p=tops))
    for i in range(48):  # each row as if the whole batch had its settings
        one = sample_tokens(logits[i : i + 1], seeds[i : i + 1], c[i : i + 1], temperature=float(temps[i]),
                            top_p=float(tops[i]))  # fmt: skip
        assert int(mixed[i]) == int(one[0])


def test_a_request_samples_with_its_own_temperature_and_top_p(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    p = _prompts(1, seed=4)[0]
    eng = _fast(model, tok)
    greedy = _fast(model, tok, sampling=SamplingConfig(max_new_tokens=24, temperature=0)).generate(
        [GenerationRequest(p)]
    )
    own = eng.generate([GenerationRequest(p, seed=s, temperature=0.0) for s in (1, 2)]
                       + [GenerationRequest(p, seed=1), GenerationRequest(p, seed=1, temperature=0.8, top_p=0.9)])  # fmt: skip
    assert own[0].text == own[1].text == greedy[0].text  # temperature 0: greedy, whatever the seed
    assert own[2].text == own[3].text  # the engine's own settings, given explicitly: the same draw
    hot = eng.generate([GenerationRequest(p, seed=1, temperature=5.0, top_p=1.0)])[0]
    assert hot.text != own[2].text
    # the reference engine honours them too (batches of one setting each)
    ref = HFEngine(model, tok, SamplingConfig(max_new_tokens=24, temperature=0.8, top_p=0.9), batch_size=4)
    rg = ref.generate([GenerationRequest(p, seed=s, temperature=0.0) for s in (1, 2)] + [GenerationRequest(p, seed=1)])
    assert rg[0].text == rg[1].text == greedy[0].text


def test_factory_builds_fast_by_default_and_falls_back_for_other_architectures(capsys: Any) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model, tok = _tiny("llama")
    sampling = SamplingConfig(max_new_tokens=4)
    assert isinstance(build_engine(model, tok, sampling), FastEngine)
    assert isinstance(build_engine(model, tok, sampling, model_cfg=ModelConfig(engine="hf")), HFEngine)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=128)).eval()
    eng = build_engine(gpt2, tok, sampling, model_cfg=ModelConfig(engine="fast"))
    assert isinstance(eng, HFEngine)
    assert "does not support this model" in capsys.readouterr().err
    assert eng.generate([GenerationRequest("Plan:", seed=1)])[0].error is None


@pytest.mark.parametrize(
    "module",
    ["ctrlgen.generation.factory", "ctrlgen.generation.engines.fast.engine", "ctrlgen.generation.engines.hf",
     "ctrlgen.generation.engines.fast.scheduler", "ctrlgen.generation.logits.automaton",
     "ctrlgen.generation.logits.sampling"],
)  # fmt: skip
def test_examples_in_the_engine_docstrings_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
