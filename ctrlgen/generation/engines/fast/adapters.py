"""Prefix-tuning adapters as cached keys/values.

A PEFT prefix-tuning adapter is, at inference, ``num_virtual_tokens`` keys and values per layer that every
token attends to (PEFT puts them into the cache before the prompt; the prompt's positions start after
them). :func:`prefix_kv` reads them once from a loaded ``PeftModel``; the engine writes them into the first
cache positions of each row that names the adapter, so rows of different adapters share one batch.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["prefix_kv"]


@torch.inference_mode()
def prefix_kv(peft_model: Any, adapter_name: str | None = None) -> torch.Tensor:
    """``[layers, 2, kv_heads, num_virtual_tokens, head_dim]`` keys/values of a prefix-tuning adapter.

    Raises:
        ValueError: the model is not a PEFT prefix-tuning model.
    """
    cfg = getattr(peft_model, "active_peft_config", None)
    if cfg is None or str(getattr(cfg, "peft_type", "")).split(".")[-1] != "PREFIX_TUNING":
        raise ValueError("a prefix adapter must be a PEFT prefix-tuning model (PrefixTuningConfig)")
    if adapter_name is not None and adapter_name != peft_model.active_adapter:
        peft_model.set_adapter(adapter_name)
    cache = peft_model.get_prompt(batch_size=1)
    if hasattr(cache, "layers"):  # a transformers Cache
        pairs = [(layer.keys, layer.values) for layer in cache.layers]
    elif hasattr(cache, "key_cache"):
        pairs = list(zip(cache.key_cache, cache.value_cache, strict=True))
    else:  # the legacy tuple of (key, value) per layer
        pairs = [(kv[0], kv[1]) for kv in cache]
    # each [1, kv_heads, P, hd]
    return torch.stack([torch.stack([k[0], v[0]]) for k, v in pairs]).detach().clone()
