"""PEFT prefix tuning of a causal LM and the per-batch loss of its variants.

* :func:`prefix_model` wraps any ``LlamaForCausalLM``-style model with
  ``PrefixTuningConfig`` (20 virtual tokens by default); only the prefix trains.
* :func:`batch_loss` runs the tuned forward and, for the masked variants, the base
  forward with the prefix disabled under ``no_grad`` (``disable_adapter`` gives
  exactly the bare model's logits), then :func:`masked_prefix_loss`.
* :func:`loss_weights` maps the config onto :class:`LossWeights`: ``plain`` is
  L_LM only (no base forward at all), ``masked`` (the masking objective) and
  ``masked_paper`` (Eq. 3 as written) use the configured weights.

Generation must go through the *PEFT* model (``PeftModel.generate``): the bare base
model silently skips the prefix (METHOD.md section 5, pitfalls).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from ctrlgen.config import TrainingConfig
from ctrlgen.training.loss import LossTerms, LossWeights, masked_prefix_loss

__all__ = [
    "PREFIX_INIT_TEXT",
    "adapter_model",
    "base_output_logits",
    "batch_loss",
    "init_prefix_from_text",
    "load_prefix_model",
    "lora_model",
    "loss_weights",
    "prefix_model",
]

#: Real words whose keys and values start the prefix (Li & Liang 2021: a random prefix
#: starts far from the model - SmolLM2's loss on notes goes from ~2 to ~8 with one).
PREFIX_INIT_TEXT = (
    "Control code and document: a clinical note written by a physician about a patient, with names, "
    "dates, places, ages, numbers and the history, findings, assessment and plan of the visit."
)


def prefix_model(model: Any, num_virtual_tokens: int = 20) -> Any:
    """``get_peft_model`` with prefix tuning for causal LM; the base weights are frozen."""
    from peft import PrefixTuningConfig, TaskType, get_peft_model

    cfg = PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=num_virtual_tokens)
    return get_peft_model(model, cfg)


def lora_model(model: Any, r: int = 8, alpha: int = 16, dropout: float = 0.0,
               target_modules: list[str] | None = None) -> Any:  # fmt: skip
    """``get_peft_model`` with LoRA on ``target_modules`` (default q_proj, v_proj); the base weights are frozen."""
    from peft import LoraConfig, TaskType, get_peft_model

    cfg = LoraConfig(task_type=TaskType.CAUSAL_LM, r=r, lora_alpha=alpha, lora_dropout=dropout,
                     target_modules=target_modules or ["q_proj", "v_proj"])  # fmt: skip
    return get_peft_model(model, cfg)


def adapter_model(model: Any, cfg: TrainingConfig, tokenizer: Any = None) -> Any:
    """The PEFT model ``training.adapter`` asks for: a prefix (initialised from text with ``prefix_init:
    text`` and a tokenizer) or LoRA (``training.lora``)."""
    if cfg.adapter == "lora":
        lc = cfg.lora
        return lora_model(model, lc.r, lc.alpha, lc.dropout, list(lc.target_modules))
    peft = prefix_model(model, cfg.num_virtual_tokens)
    if cfg.prefix_init == "text" and tokenizer is not None:
        init_prefix_from_text(peft, tokenizer)
    return peft


@torch.no_grad()
def init_prefix_from_text(peft_model: Any, tokenizer: Any, text: str = PREFIX_INIT_TEXT) -> None:
    """Set the prefix to the base model's own keys and values of ``text``'s first tokens.

    The prefix then acts exactly like that text placed before the input (a test checks
    this), so training starts from the base model's behaviour on a plausible context.
    """
    cfg = peft_model.active_peft_config
    n = cfg.num_virtual_tokens
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = (ids * (n // max(len(ids), 1) + 1))[:n]
    base = peft_model.get_base_model()
    with peft_model.disable_adapter():
        cache = base(input_ids=torch.tensor([ids], device=base.device), use_cache=True).past_key_values
    kv = []
    for layer in range(cfg.num_layers):
        keys, values = cache.layers[layer].keys, cache.layers[layer].values  # [1, heads, n, head_dim]
        kv += [keys[0], values[0]]
    weight = torch.stack(kv)  # [layers * 2, heads, n, head_dim]
    emb = peft_model.prompt_encoder[peft_model.active_adapter].embedding.weight
    emb.copy_(weight.permute(2, 0, 1, 3).reshape(n, -1).to(emb.dtype))


def load_prefix_model(model: Any, adapter_dir: str) -> Any:
    """A saved adapter (standard PEFT format: a prefix, or LoRA) on top of ``model``, ready for ``generate``."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(model, adapter_dir)
    pm.eval()
    _bridge_cache_name(pm)
    return pm


def _bridge_cache_name(pm: Any) -> None:
    """Let PEFT's prompt-learning generation see the cache under transformers versions that call it ``cache``.

    transformers 5.24 returns the generation cache as ``model_inputs["cache"]``; PEFT 0.21's
    ``prepare_inputs_for_generation`` reads and injects ``past_key_values``, so it never sees the cache and
    the prefix it injects is not the one the model uses (the tuned model then generates as the base model).
    The base model's preparation is wrapped to hand the cache back under the name PEFT reads; the model's
    forward takes it under that name too. A no-op where transformers already uses ``past_key_values``.
    """
    config = getattr(pm, "active_peft_config", None)
    base_prepare = getattr(pm, "base_model_prepare_inputs_for_generation", None)
    if base_prepare is None or not getattr(config, "is_prompt_learning", False):
        return  # LoRA and the like: PEFT does not touch the cache, nothing to bridge

    def prepare(*args: Any, **kwargs: Any) -> Any:
        out = base_prepare(*args, **kwargs)
        if "cache" in out and out.get("past_key_values") is None:
            out["past_key_values"] = out.pop("cache")
        return out

    pm.base_model_prepare_inputs_for_generation = prepare


@torch.no_grad()
def base_output_logits(model: Any, inputs: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    """P_base's logits at the output positions only, ``[N, vocab]`` (see ``masked_prefix_loss``).

    The base model's decoder without the prefix, then its output layer on the rows that
    predict an output token: the code prompt and padding never go through the
    vocabulary-sized projection. Equal to the bare model's logits there (tested).
    """
    base = model.get_base_model()
    with model.disable_adapter():
        hidden = base.get_decoder()(**inputs, use_cache=False).last_hidden_state  # [B, T, d]
    valid = labels[:, 1:] != -100
    return base.get_output_embeddings()(hidden[:, :-1][valid])  # [N, V]


def loss_weights(cfg: TrainingConfig) -> LossWeights:
    """``plain`` and ``dp`` -> (1, 0, 0); ``masked`` / ``masked_paper`` -> the configured (l_LM, l_c, l_KL) with
    the ``"masked"`` / ``"paper"`` objective (:mod:`ctrlgen.training.loss`)."""
    if cfg.variant in ("plain", "dp"):
        return LossWeights(1.0, 0.0, 0.0)
    w = cfg.weights
    return LossWeights(w.lm, w.contrastive, w.kl, "masked" if cfg.variant == "masked" else "paper")


def batch_loss(
    model: Any,
    batch: dict[str, torch.Tensor],
    weights: LossWeights,
    reduction: Literal["mean", "sum"] = "mean",
    forward: Callable[..., Any] | None = None,
) -> LossTerms:
    """The loss terms of one collated batch (see :func:`ctrlgen.training.data.collate`).

    Args:
        model: the PEFT prefix model (used for ``disable_adapter``).
        forward: what runs the tuned forward (e.g. a DeepSpeed engine); default ``model``.
    """
    fwd = forward or model
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    logits = fwd(**inputs).logits
    base = None
    if weights.contrastive or weights.kl:
        base = base_output_logits(model, inputs, batch["labels"])
    return masked_prefix_loss(logits, base, batch["labels"], batch["private"], weights, reduction)
