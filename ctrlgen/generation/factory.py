"""The one place that names a generation engine.

``build_engine(model, tokenizer, sampling, model_cfg=cfg.model, batch_size=...)`` returns the engine
``model.engine`` asks for:

* ``fast`` / ``auto`` (default): :class:`~ctrlgen.generation.engines.fast.engine.FastEngine` when it runs the
  model exactly (the Llama family: ``engines.fast.step.SUPPORTED_ARCHITECTURES``); for any other model it
  logs one line saying why and returns the reference engine instead, never a wrong output;
* ``hf``: :class:`~ctrlgen.generation.engines.hf.HFEngine`, transformers' ``generate`` (the reference).

``adapters`` (name -> PEFT prefix-tuning model) are registered on the engine; requests pick one with
``GenerationRequest.adapter``.

Example:
    >>> from ctrlgen.models import tiny_llama
    >>> from ctrlgen.config import SamplingConfig
    >>> type(build_engine(*tiny_llama(), SamplingConfig(max_new_tokens=4))).__name__
    'FastEngine'
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ctrlgen.config import EngineConfig, ModelConfig, SamplingConfig
from ctrlgen.generation.types import GenerationEngine

__all__ = ["build_engine"]


def _log(msg: str) -> None:
    print(f"[ctrlgen.engine] {msg}", file=sys.stderr, flush=True)


def build_engine(
    model: Any,
    tokenizer: Any,
    sampling: SamplingConfig,
    *,
    model_cfg: ModelConfig | None = None,
    kind: str | None = None,
    batch_size: int = 8,
    adapters: Mapping[str, Any] | None = None,
) -> GenerationEngine:
    """An engine over a loaded ``model`` (see module doc). ``kind`` overrides ``model_cfg.engine``;
    ``batch_size`` is the reference engine's batch and the fast engine's slots unless
    ``model.engine_options.slots`` is set."""
    kind = kind or (model_cfg.engine if model_cfg is not None else "auto")
    opts = model_cfg.engine_options if model_cfg is not None else EngineConfig()
    if kind not in ("auto", "fast", "hf"):
        raise ValueError(f"unknown engine {kind!r} (auto | fast | hf)")
    if kind in ("auto", "fast"):
        from ctrlgen.generation.engines.fast.step import unsupported_reason

        reason = unsupported_reason(model)
        if reason is None:
            from ctrlgen.generation.engines.fast.engine import FastEngine

            fast = FastEngine(
                model, tokenizer, sampling, slots=opts.slots or batch_size, max_len=opts.max_len,
                prefill_chunk=opts.prefill_chunk, prefix_cache_tokens=opts.prefix_cache_tokens,
                kv_bucket=opts.kv_bucket, poll_every=opts.poll_every, cuda_graphs=opts.cuda_graphs,
                compile_processes=opts.compile_processes,
            )  # fmt: skip
            for name, adapter in (adapters or {}).items():
                fast.add_adapter(name, adapter)
            return fast
        _log(f"the fast engine does not support this model ({reason}): generating with the reference engine (hf)")
    from ctrlgen.generation.engines.hf import HFEngine

    return HFEngine(model, tokenizer, sampling, batch_size, adapters=dict(adapters or {}))
