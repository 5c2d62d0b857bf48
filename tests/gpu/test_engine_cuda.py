"""The fast engine on CUDA (skipped without a GPU): the same checks as on the CPU, plus what only a GPU has -
the captured decode step (CUDA graph) and a decode loop with no host syncs.

Run by ``benchmarks/gpu_run.sh`` on a lent GPU machine: ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

WORDS = "The patient is a 58 year old female admitted in transfer for mental status changes Vital signs".split()


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 80))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from ctrlgen.models import tiny_llama

    model, tok = tiny_llama(seed=1, initializer_range=0.3)
    return model.to("cuda"), tok


def _engine(tiny: tuple[Any, Any], **kw: Any) -> Any:
    from ctrlgen.config import SamplingConfig
    from ctrlgen.generation.engines.fast import FastEngine

    sampling = kw.pop("sampling", SamplingConfig(max_new_tokens=24, temperature=0.8, top_p=0.9))
    return FastEngine(*tiny, sampling, **{"slots": 4, "prefill_chunk": 16, "kv_bucket": 16, **kw})


def test_greedy_on_cuda_equals_the_reference_engine(tiny: tuple[Any, Any]) -> None:
    from ctrlgen.config import SamplingConfig
    from ctrlgen.generation.engines.hf import HFEngine
    from ctrlgen.generation.types import GenerationRequest

    greedy = SamplingConfig(max_new_tokens=24, temperature=0)
    reqs = [GenerationRequest(p) for p in _prompts(6, 1)]
    fast = _engine(tiny, sampling=greedy).generate(reqs)
    ref = [HFEngine(*tiny, greedy, batch_size=1).generate([r])[0] for r in reqs]
    assert [f.text for f in fast] == [r.text for r in ref]


def test_captured_step_equals_the_eager_step_and_is_batch_independent(tiny: tuple[Any, Any]) -> None:
    from ctrlgen.generation.types import GenerationRequest

    reqs = [GenerationRequest(p, seed=i, max_new_tokens=random.Random(i).randint(4, 24)) for i, p in
            enumerate(_prompts(10, 2))]  # fmt: skip
    graphed = _engine(tiny)
    eager = _engine(tiny, cuda_graphs=False)
    a = [r.text for r in graphed.generate(reqs)]
    assert graphed.stats["graph_captures"] > 0
    assert a == [r.text for r in eager.generate(reqs)]
    assert a == [_engine(tiny).generate([r])[0].text for r in reqs]


def test_the_decode_loop_makes_no_host_sync(tiny: tuple[Any, Any]) -> None:
    """Captured steps replayed under torch's sync debug mode 'error': any host sync inside raises."""
    from ctrlgen.generation.engines.fast.engine import _Seq
    from ctrlgen.generation.types import GenerationRequest

    eng = _engine(tiny, poll_every=64)
    banned = ((5,), (7, 9), (11, 12, 13))
    reqs = [GenerationRequest(p, banned=banned, seed=i, max_new_tokens=40) for i, p in enumerate(_prompts(4, 3))]
    enc = eng.tokenizer([r.prompt for r in reqs], add_special_tokens=False)["input_ids"]
    seqs = [
        _Seq(i, r, list(ids), 40, 0, eng.compiled_now(r.banned))
        for i, (r, ids) in enumerate(zip(reqs, enc, strict=True))
    ]
    eng._ensure_capacity(max(len(s.prompt) for s in seqs) + 48, 40)
    with torch.inference_mode():
        eng.active.zero_()
        for slot, s in enumerate(seqs):
            eng._admit(slot, s)
        kv = eng._kv_len({i: s for i, s in enumerate(seqs)}) + 32
        eng._step(min(kv, eng.max_len))  # capture outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(16):
                eng._step(min(kv, eng.max_len))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
