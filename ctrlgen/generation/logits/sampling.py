"""Sampling on the device with counter-keyed randomness: a row's draw depends on its seed and position only.

Every row's uniform number at generation step ``n`` is a hash of ``(seed, n)`` computed with integer tensor
ops (:func:`counter_uniform`): no generator state, no host round trip, and nothing that depends on which
other rows share the batch or on the order they were admitted in. The draw itself is inverse-CDF sampling
over the row's kept tokens **in token-id order** (:func:`sample_tokens`): the kept set is defined by values
(every token whose probability reaches the nucleus' cut-off, ties included), never by a sort order, so a
full sort (CUDA) and a top-k shortcut (CPU) keep the same set and draw the same token.

Semantics:

* temperature 0: argmax (greedy);
* ``top_k`` > 0: only tokens at least as likely as the k-th most likely one;
* ``top_p`` < 1: the smallest set of most likely tokens whose mass reaches ``top_p`` (with every token tied
  with the last one);
* both: the intersection (the stricter cut-off).

``temperature`` and ``top_p`` are one value for every row, or a ``[rows]`` tensor (each row its own; a
request's own sampling settings); a row's draw is the same either way.

Example:
    >>> import torch
    >>> u1 = counter_uniform(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0]))
    >>> u2 = counter_uniform(torch.tensor([8, 7]), torch.tensor([0, 0]))
    >>> bool(u1[2] == u2[0]) and bool(u1[0] == u2[1]) and bool(u1[0] != u1[1])
    True
"""

from __future__ import annotations

import torch

__all__ = ["counter_uniform", "nucleus_cutoff", "sample_tokens"]

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in [0, 2**32) with int64 products below 2**49 (no overflow)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32: xor-shift-multiply), on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One float32 in [0, 1) per row from ``(seed, counter)`` (int64 tensors of one shape; seeds >= 0).

    The same pair gives the same number on any device, in any batch.
    """
    seeds = seeds.to(torch.int64)
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    h = _mix32((counters.to(torch.int64) & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ lo)
    h = _mix32(h ^ hi ^ 0x85EBCA6B)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 bits: exact in float32, < 1


def nucleus_cutoff(
    probs: torch.Tensor, top_p: float | torch.Tensor, top_k: int, *, candidates: int = 0
) -> torch.Tensor:
    """``[rows]`` the smallest probability a row keeps (see module doc); ``probs`` ``[rows, vocab]``.

    ``candidates`` > 0 looks for the cut-off among that many most likely tokens first (``topk``, cheap on the
    CPU) and sorts the whole vocabulary only when some row's nucleus is not among them; that check reads one
    flag on the host, so CUDA callers pass 0 (always the full sort, no host sync). Both give the same values.
    """
    vocab = probs.shape[-1]
    k_needed = min(top_k, vocab) if top_k > 0 else 0
    srt: torch.Tensor | None = None
    per_row = isinstance(top_p, torch.Tensor)
    if 0 < candidates < vocab and k_needed <= candidates:
        top = torch.topk(probs, candidates, dim=-1).values  # descending
        if (not per_row and top_p >= 1.0) or bool((top.sum(-1) >= top_p).all()):
            srt = top
    if srt is None:
        srt = torch.sort(probs, dim=-1, descending=True).values
    cut = torch.zeros(probs.shape[0], dtype=probs.dtype, device=probs.device)
    if per_row or top_p < 1.0:
        cum = torch.cumsum(srt, dim=-1)
        # the first position whose running mass reaches top_p (the last one when rounding keeps it below)
        want = top_p.to(cum.dtype)[:, None] if isinstance(top_p, torch.Tensor) else torch.full_like(cum[:, :1], top_p)
        idx = torch.searchsorted(cum, want).clamp(max=srt.shape[-1] - 1)
        cut = srt.gather(1, idx)[:, 0]
        if per_row:  # rows with top_p >= 1 keep every token
            cut = torch.where(top_p < 1.0, cut, torch.zeros_like(cut))
    if k_needed:
        cut = torch.maximum(cut, srt[:, k_needed - 1])
    return cut


def sample_tokens(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    *,
    temperature: float | torch.Tensor,
    top_p: float | torch.Tensor = 1.0,
    top_k: int = 0,
    candidates: int = 0,
) -> torch.Tensor:
    """``[rows]`` next tokens from ``logits`` ``[rows, vocab]`` (banned tokens already at -inf).

    ``seeds`` and ``counters`` (``[rows]`` int64) key each row's uniform draw. A row whose every token is
    banned gets token 0's argmax semantics of ``torch.argmax`` (its first entry); callers see it in the text.
    """
    greedy: torch.Tensor | None = None
    if isinstance(temperature, torch.Tensor):
        greedy = temperature <= 0
        x = logits.float() / torch.where(greedy, torch.ones_like(temperature), temperature).to(torch.float32)[:, None]
    elif temperature == 0:
        return torch.argmax(logits, dim=-1)
    else:
        x = logits.float() / temperature
    probs = torch.softmax(x, dim=-1)  # [rows, vocab]
    probs = torch.nan_to_num(probs, nan=0.0)  # a row with every token banned: all zero
    if isinstance(top_p, torch.Tensor) or top_p < 1.0 or top_k > 0:
        cut = nucleus_cutoff(probs, top_p, top_k, candidates=candidates)
        probs = probs.masked_fill(probs < cut[:, None], 0.0)
    cdf = torch.cumsum(probs, dim=-1)  # token-id order: independent of how the kept set was found
    total = cdf[:, -1:]
    u = counter_uniform(seeds, counters)[:, None] * total
    idx = torch.searchsorted(cdf, u, right=True).clamp(max=logits.shape[-1] - 1)[:, 0]
    # u < total, so idx has mass; rounding at the very end can land on a zero-mass tail token: step back to
    # the last kept token (the largest index with mass <= idx).
    kept = probs.gather(1, idx[:, None])[:, 0] > 0
    last_kept = (probs > 0).long().cumsum(-1).argmax(-1)  # first position of the final count = last kept token
    out = torch.where(kept, idx, last_kept)
    return out if greedy is None else torch.where(greedy, torch.argmax(logits, dim=-1), out)
