"""The fixed-shape forward passes of the fast engine, over the weights of a transformers decoder.

:class:`DecoderRunner` reuses the loaded model's own modules (embeddings, norms, projections, MLPs, rotary
tables, the architecture's ``apply_rotary_pos_emb``) and replaces only what the engine must own: where keys
and values live (:class:`~ctrlgen.generation.engines.fast.kv_cache.KVCache`, one region per slot) and the
attention over them. Two passes:

* :meth:`DecoderRunner.prefill` - one slot, a chunk of prompt tokens ``[a, b)`` attending to the slot's
  cache ``[0, b)`` (causal inside the chunk); writes the chunk's keys/values; returns nothing (the prompt's
  last token is fed to the first decode step, which samples from it);
* :meth:`DecoderRunner.decode` - every slot, one token each at its own position; attention over the first
  ``kv_len`` cache positions with a per-row length mask; static shapes for a given ``kv_len`` (CUDA graphs).

A row's position and its cache index are the same number: a prefix adapter's virtual tokens fill indexes
``[0, P)`` and the row's text starts at position ``P``, as PEFT's prefix tuning does.

Supported architectures: the Llama family as transformers implements it (``llama``, ``mistral``, ``qwen2``,
``qwen3``: grouped-query attention, RoPE incl. linear / llama3 / yarn scaling, q/k norms, attention biases,
sliding windows, tied or untied embeddings). :func:`unsupported_reason` says why another model is not;
the engine factory then falls back to the reference engine.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

from ctrlgen.generation.engines.fast.kv_cache import KVCache

__all__ = ["SUPPORTED_ARCHITECTURES", "DecoderRunner", "unsupported_reason"]

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
_STATIC_ROPE = (None, "default", "linear", "llama3", "yarn")


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model: Any) -> str | None:
    """None when :class:`DecoderRunner` runs ``model`` exactly; else why not (a short, data-free phrase)."""
    model = _base_model(model)
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_ARCHITECTURES:
        return f"architecture {kind!r} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} does not have the decoder layout (model.layers, lm_head)"
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if rope_type not in _STATIC_ROPE:
        return f"RoPE type {rope_type!r} changes with the sequence length"
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "final_logit_softcapping", None):
        return "logit soft-capping"
    if getattr(model, "is_quantized", False) or getattr(cfg, "quantization_config", None):
        return "quantised weights"
    return None


class DecoderRunner:
    """Forward passes of a Llama-family causal LM over a slot-indexed key/value cache (see module doc)."""

    def __init__(self, model: Any, max_positions: int) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast engine cannot run this model: {reason}")
        self.model = _base_model(model)
        cfg = self.model.config
        inner = self.model.model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.lm_head = self.model.lm_head
        attn0 = self.layers[0].self_attn
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn0, "head_dim", cfg.hidden_size // self.num_heads))
        self.scaling = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        self.apply_rope = sys.modules[type(attn0).__module__].apply_rotary_pos_emb
        self.windows = [self._window(layer.self_attn, cfg) for layer in self.layers]
        self.dtype = self.embed.weight.dtype
        self.device = self.embed.weight.device
        self.vocab = int(self.lm_head.weight.shape[0])
        self.max_positions = int(max_positions)
        with torch.inference_mode():
            pos = torch.arange(self.max_positions, device=self.device)[None]
            probe = torch.zeros(1, 1, self.head_dim, dtype=self.dtype, device=self.device)
            cos, sin = inner.rotary_emb(probe, pos)  # the model's own tables: its scaling, its dtype
        self.cos, self.sin = cos[0], sin[0]  # [positions, head_dim]

    @staticmethod
    def _window(attn: Any, cfg: Any) -> int | None:
        w = getattr(attn, "sliding_window", None)
        if w is None and getattr(cfg, "model_type", "") == "mistral":
            w = getattr(cfg, "sliding_window", None)
        return int(w) if w else None

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        return KVCache.allocate(len(self.layers), slots, self.num_kv_heads, max_len, self.head_dim,
                                dtype=self.dtype, device=self.device)  # fmt: skip

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: dict[int | None, torch.Tensor],
                window: int | None) -> torch.Tensor:  # fmt: skip
        # q [B, H, T, hd], k/v [B, KV, Tk, hd], mask [B, 1, T, Tk] bool (True: attend)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=masks[window], scale=self.scaling,
                                              enable_gqa=self.num_kv_heads != self.num_heads)  # fmt: skip

    def _layer(self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               write: Any, kv: tuple[torch.Tensor, torch.Tensor], masks: dict[int | None, torch.Tensor],
               window: int | None) -> torch.Tensor:  # fmt: skip
        attn = layer.self_attn
        b, t, _ = h.shape
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, t, -1, self.head_dim)
        k = attn.k_proj(x).view(b, t, -1, self.head_dim)
        v = attn.v_proj(x).view(b, t, -1, self.head_dim)
        if hasattr(attn, "q_norm"):  # qwen3: RMSNorm over each head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
        q, k = self.apply_rope(q, k, cos, sin)
        write(kv, k, v)
        o = self._attend(q, kv[0], kv[1], masks, window)  # [B, H, T, hd]
        h = h + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _masks(self, q_pos: torch.Tensor, kv_len: int, lengths: torch.Tensor) -> dict[int | None, torch.Tensor]:
        """``{window: [B, 1, T, kv_len] bool}``: key j is seen by the query at position p when j <= p, j is
        below the row's length, and (windowed layers) p - j < window."""
        j = torch.arange(kv_len, device=q_pos.device)
        base = (j[None, None, :] <= q_pos[:, :, None]) & (j[None, None, :] < lengths[:, None, None])
        out: dict[int | None, torch.Tensor] = {None: base[:, None]}
        for w in {w for w in self.windows if w is not None}:
            out[w] = (base & (q_pos[:, :, None] - j[None, None, :] < w))[:, None]
        return out

    @torch.inference_mode()
    def prefill(self, cache: KVCache, slot: int, ids: torch.Tensor, start: int) -> None:
        """Write the keys/values of ``ids`` (``[T]`` tokens at positions ``start..start+T-1``) into ``slot``,
        attending to the slot's cache before ``start`` (a prefix adapter and earlier chunks)."""
        t = int(ids.shape[0])
        end = start + t
        pos = torch.arange(start, end, device=self.device)
        cos, sin = self.cos[pos][None], self.sin[pos][None]  # [1, T, hd]
        masks = self._masks(pos[None], end, torch.tensor([end], device=self.device))
        h = self.embed(ids.to(self.device)[None])  # [1, T, hidden]

        def write(kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
            kv[0][:, :, start:end] = k
            kv[1][:, :, start:end] = v

        for i, layer in enumerate(self.layers):
            kv = cache.slot_view(i, slot, end)
            h = self._layer(layer, h, cos, sin, write, kv, masks, self.windows[i])

    @torch.inference_mode()
    def decode(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """``[slots, vocab]`` float32 logits of one token per slot (``ids``, ``positions``: ``[slots]``);
        each row's key/value goes to its position; attention over cache indexes ``< kv_len``."""
        slots = int(ids.shape[0])
        rows = torch.arange(slots, device=self.device)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [S, 1, hd]
        masks = self._masks(positions[:, None], kv_len, positions + 1)
        h = self.embed(ids[:, None])  # [S, 1, hidden]

        for i, layer in enumerate(self.layers):
            full = cache.data[i]  # [2, slots, kv_heads, max_len, hd]: an idle slot's position may pass kv_len

            def write(kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor,
                      full: torch.Tensor = full) -> None:  # fmt: skip
                full[0][rows, :, positions] = k[:, :, 0]
                full[1][rows, :, positions] = v[:, :, 0]

            h = self._layer(layer, h, cos, sin, write, cache.view(i, kv_len), masks, self.windows[i])
        return self.lm_head(self.norm(h[:, 0])).float()
