"""The privacy-masked prefix-tuning loss (METHOD.md section 5) as a plain function.

Over output positions t (labels != -100), with P_theta the tuned model, P_base the
same model with the prefix disabled (no gradient) and M_t = 0 on private tokens:

    L_LM          = - sum_t log P_theta(y_t)
    L_contrastive = - sum_t (1 - M_t) log( P_theta(y_t) / (P_theta(y_t) + P_base(y_t)) )
    L_KL          =   sum_t M_t KL( P_base(.) || P_theta(.) )
    L_total       = l_LM L_LM + l_c L_contrastive + l_KL L_KL

The contrastive term only sees private tokens, the KL term only non-private ones;
padding and prompt tokens (label -100) are in none of them. ``reduction="mean"``
divides every term by the number of output tokens (one normaliser for all terms,
so the weights keep their meaning); ``"sum"`` is the formula as written.

Example:
    >>> import torch
    >>> logits = torch.zeros(1, 3, 5); labels = torch.tensor([[-100, 1, 2]])
    >>> t = masked_prefix_loss(logits, logits, labels, torch.tensor([[False, True, False]]))
    >>> round(float(t.lm), 4), round(float(t.kl), 4)
    (1.6094, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["LossTerms", "LossWeights", "masked_prefix_loss"]


@dataclass(frozen=True)
class LossWeights:
    """l_LM, l_c, l_KL (paper: all 1). Plain prefix tuning is ``LossWeights(1, 0, 0)``."""

    lm: float = 1.0
    contrastive: float = 1.0
    kl: float = 1.0


@dataclass(frozen=True)
class LossTerms:
    total: torch.Tensor
    lm: torch.Tensor
    contrastive: torch.Tensor
    kl: torch.Tensor
    tokens: int
    private_tokens: int


def masked_prefix_loss(
    logits: torch.Tensor,
    base_logits: torch.Tensor | None,
    labels: torch.Tensor,
    private: torch.Tensor,
    weights: LossWeights = LossWeights(),
    reduction: Literal["mean", "sum"] = "mean",
) -> LossTerms:
    """Masked loss of a causal LM batch (labels aligned with the inputs, shifted here).

    Args:
        logits: ``[batch, seq, vocab]`` of the tuned model.
        base_logits: ``[batch, seq, vocab]`` of the base model (prefix disabled, no grad), or
            only its rows at the output positions, ``[N, vocab]`` in the order of
            ``labels[:, 1:] != -100`` (cheaper: see ``ctrlgen.training.prefix``); may be None
            when the contrastive and KL weights are 0.
        labels: ``[batch, seq]`` token ids, -100 where no loss is taken.
        private: ``[batch, seq]`` bool, True on tokens overlapping a private span (M_t = 0),
            aligned with ``labels``.
    """
    target = labels[:, 1:]
    valid = target != -100  # [B, T-1]
    # Only output positions enter any term: select them before the vocabulary-wide softmaxes
    # (the code prompt and padding are often a third of the positions).
    y = target[valid]  # [N]
    priv = private[:, 1:].bool()[valid]  # [N]
    n = int(y.numel())
    logp = F.log_softmax(logits[:, :-1][valid].float(), dim=-1)  # [N, V]; row i predicts y[i]
    logp_y = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # [N]
    zero = logits.new_zeros((), dtype=torch.float32)
    lm = -logp_y.sum()
    contrastive, kl = zero, zero
    if weights.contrastive or weights.kl:
        if base_logits is None:
            raise ValueError("base_logits are needed when the contrastive or KL weight is non-zero")
        rows = base_logits if base_logits.dim() == 2 else base_logits[:, :-1][valid]
        if rows.shape[0] != n:
            raise ValueError(f"base_logits has {rows.shape[0]} output rows; the labels have {n}")
        logq = F.log_softmax(rows.float().detach(), dim=-1)  # [N, V]
        if weights.contrastive and bool(priv.any()):
            lp, lq = logp_y[priv], logq[priv].gather(-1, y[priv].unsqueeze(-1)).squeeze(-1)
            contrastive = -(lp - torch.logaddexp(lp, lq)).sum()
        if weights.kl and bool((~priv).any()):
            # KL(P_base || P_theta) per row = sum_v q log q - sum_v q log p, as two row-wise dot products
            # (no [N, V] temporaries beyond q; the first term carries no gradient).
            q = logq.exp()
            kl_rows = torch.einsum("nv,nv->n", q, logq) - torch.einsum("nv,nv->n", q, logp)
            kl = (kl_rows * (~priv)).sum()
    if reduction == "mean":
        denom = max(n, 1)
        lm, contrastive, kl = lm / denom, contrastive / denom, kl / denom
    total = weights.lm * lm + weights.contrastive * contrastive + weights.kl * kl
    return LossTerms(total, lm, contrastive, kl, n, int(priv.sum()))
