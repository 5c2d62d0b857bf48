"""The language model behind the evaluation-side LLM steps (the LLM anonymiser, the LLM atomiser and judge).

:func:`build_engine` turns an :class:`~ctrlgen.config.LLMConfig` into a
:class:`~ctrlgen.generation.engine.GenerationEngine`: the OpenAI-compatible ``endpoint`` when set
(:class:`~ctrlgen.generation.remote.OpenAICompletionsEngine`), else an HF causal LM loaded here
(``cfg.model``, default the config's own model) behind the engine its ``engine`` field names
(:func:`ctrlgen.generation.factory.build_engine`: the fast engine by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctrlgen.config import LLMConfig, ModelConfig
from ctrlgen.generation.engine import GenerationEngine

__all__ = ["build_engine"]


def build_engine(cfg: LLMConfig, model_cfg: ModelConfig) -> tuple[GenerationEngine, Any, Callable[[str], int] | None]:
    """(engine, tokenizer or None, token counter or None) for ``cfg`` (an :class:`LLMConfig`):
    the OpenAI-compatible ``endpoint`` when set, else ``cfg.model`` (or ``model_cfg``) loaded here."""
    if cfg.endpoint:
        from ctrlgen.generation.remote import OpenAICompletionsEngine

        remote = OpenAICompletionsEngine(cfg.endpoint, cfg.endpoint_model, cfg.sampling, cfg.api_key_env,
                                         concurrency=cfg.concurrency)  # fmt: skip
        return remote, None, None
    from ctrlgen.generation.factory import build_engine as build_local
    from ctrlgen.models import load_causal_lm

    mcfg = cfg.model or model_cfg
    model, tokenizer = load_causal_lm(mcfg)
    engine = build_local(model, tokenizer, cfg.sampling, model_cfg=mcfg, batch_size=cfg.batch_size)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return engine, tokenizer, count
