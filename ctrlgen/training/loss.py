"""The masked prefix-tuning losses (METHOD.md section 5) as plain functions.

Over output positions t (labels != -100), with p = P_theta(y_t) of the tuned model,
q = P_base(y_t) of the same model with the prefix disabled (no gradient) and M_t = 0 on
private tokens, two objectives (``LossWeights.objective``):

``"paper"`` (``training.variant: masked_paper``), Eq. 3 as written::

    L_LM          = - sum_t log p
    L_contrastive = - sum_t (1 - M_t) log( p / (p + q) )
    L_KL          =   sum_t M_t KL( P_base(.) || P_theta(.) )

  This *raises* private-token likelihood relative to the base: with s = p / (p + q),
  d L_contrastive / dz = (1 - s)(p_vec - e_y) is the LM gradient scaled by 1 - s in (0, 1), so a
  descent step increases log p on private tokens (as L_LM, which also covers them, does) and
  the term is minimised at p -> 1.

``"masked"`` (``training.variant: masked``), a loss that masks::

    L_LM          = - sum_t M_t log p
    L_contrastive = - sum_t (1 - M_t) log( q / (p + q) )      (the paper's ratio reversed)
    L_KL          =   sum_t M_t KL( P_base(.) || P_theta(.) )

  Private tokens get no LM signal; the reversed ratio pushes p below q: its gradient
  d / dz = -s (p_vec - e_y) is the LM gradient reversed and scaled by s, strongest where the
  tuned model has learnt a private token beyond the base and fading once p << q. Chosen over
  unlikelihood -log(1 - p) because it measures the tuned model against the base (as exposure
  and PIPP do: what fine-tuning added), its gradient is bounded (unlikelihood's p / (1 - p)
  grows without bound as p -> 1), and it leaves tokens the base already finds unlikely alone.

``L_total = l_LM L_LM + l_c L_contrastive + l_KL L_KL`` (paper: all weights 1). Padding and
prompt tokens (label -100) are in no term. ``reduction="mean"`` divides every term by the number
of output tokens (one normaliser for all terms, so the weights keep their meaning); ``"sum"`` is
the formula as written. Plain prefix tuning is ``LossWeights(1, 0, 0)`` (objective ``"paper"``:
L_LM over every output token).

Example:
    >>> import torch
    >>> logits = torch.zeros(1, 3, 5); labels = torch.tensor([[-100, 1, 2]])
    >>> t = masked_prefix_loss(logits, logits, labels, torch.tensor([[False, True, False]]))
    >>> round(float(t.lm), 4), round(float(t.kl), 4)
    (1.6094, 0.0)
    >>> t = masked_prefix_loss(logits, logits, labels, torch.tensor([[False, True, False]]),
    ...                        LossWeights(objective="masked"))
    >>> round(float(t.lm), 4), round(float(t.contrastive), 4)  # LM on the public token only; log 2 / 2
    (0.8047, 0.3466)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

__all__ = ["LossTerms", "LossWeights", "Objective", "masked_prefix_loss"]


Objective = Literal["paper", "masked"]


@dataclass(frozen=True)
class LossWeights:
    """l_LM, l_c, l_KL (paper: all 1) and the objective (module docstring): ``"paper"`` is Eq. 3 as written,
    ``"masked"`` drops private tokens from L_LM and reverses the contrastive ratio. Plain prefix tuning is
    ``LossWeights(1, 0, 0)``."""

    lm: float = 1.0
    contrastive: float = 1.0
    kl: float = 1.0
    objective: Objective = "paper"


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
    """Masked loss of a causal LM batch (labels aligned with the inputs, shifted here); the objective is
    ``weights.objective`` (module docstring).

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
    z = logits[:, :-1][valid]  # [N, V]; row i predicts y[i]
    logq = None
    if weights.contrastive or weights.kl:
        if base_logits is None:
            raise ValueError("base_logits are needed when the contrastive or KL weight is non-zero")
        rows = base_logits if base_logits.dim() == 2 else base_logits[:, :-1][valid]
        if rows.shape[0] != n:
            raise ValueError(f"base_logits has {rows.shape[0]} output rows; the labels have {n}")
        logq = F.log_softmax(rows.detach().float(), dim=-1)  # [N, V]
    if weights.objective not in ("paper", "masked"):
        raise ValueError(f"LossWeights.objective must be 'paper' or 'masked', not {weights.objective!r}")
    w = (weights.lm, weights.contrastive if logq is not None else 0.0, weights.kl if logq is not None else 0.0)
    total, lm, contrastive, kl = _Terms.apply(z, logq, y, priv, w, weights.objective == "masked")
    if reduction == "mean":
        denom = max(n, 1)
        total, lm, contrastive, kl = total / denom, lm / denom, contrastive / denom, kl / denom
    return LossTerms(total, lm, contrastive, kl, n, int(priv.sum()))


class _Terms(torch.autograd.Function):
    """The three sums and their weighted total, with the gradient in closed form.

    Per output row (p = softmax(z), q = P_base, e_y the target's one-hot, s = p_y / (p_y + q_y)):
    d L_LM / dz = p - e_y (``masked``: on the non-private rows only); d L_contrastive / dz on private rows
    = (1 - s)(p - e_y) for the paper's -log(p_y / (p_y + q_y)), -s (p - e_y) for the reversed
    -log(q_y / (p_y + q_y)) = log(p_y + q_y) - log q_y; d L_KL / dz = p - q on the other rows
    (KL(q || p) = sum q log q - sum q log p, sum q = 1).
    One [N, V] gradient is built in place, instead of autograd's chain of vocabulary-sized
    temporaries (tests check it against autograd on the plain formulas).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        z: torch.Tensor,
        logq: torch.Tensor | None,
        y: torch.Tensor,
        priv: torch.Tensor,
        w: tuple[float, float, float],
        masked: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logp = F.log_softmax(z.float(), dim=-1)  # [N, V]
        logp_y = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # [N]
        zero = logp.new_zeros(())
        lm = -(logp_y * ~priv).sum() if masked else -logp_y.sum()
        contrastive, kl = zero, zero
        s = torch.zeros_like(logp_y)
        if logq is not None and w[1]:
            logq_y = logq.gather(-1, y.unsqueeze(-1)).squeeze(-1)
            log_pq = torch.logaddexp(logp_y, logq_y)  # log(p_y + q_y)
            log_s = logp_y - log_pq  # log(p_y / (p_y + q_y))
            # paper: -log(p_y / (p_y + q_y)); masked: -log(q_y / (p_y + q_y))
            contrastive = ((log_pq - logq_y) * priv).sum() if masked else -(log_s * priv).sum()
            s = log_s.exp()
        if logq is not None and w[2]:
            q = logq.exp()
            kl_rows = torch.einsum("nv,nv->n", q, logq) - torch.einsum("nv,nv->n", q, logp)
            kl = (kl_rows * (~priv)).sum()
        total = w[0] * lm + w[1] * contrastive + w[2] * kl
        ctx.save_for_backward(logp, logq if logq is not None else logp.new_empty(0), y, priv, s)
        ctx.w, ctx.z_dtype, ctx.masked = w, z.dtype, masked
        ctx.has_c, ctx.has_kl = logq is not None and bool(w[1]), logq is not None and bool(w[2])
        return total, lm, contrastive, kl

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_total: torch.Tensor, g_lm: torch.Tensor, g_c: torch.Tensor, g_kl: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None, None]:
        logp, logq, y, priv, s = ctx.saved_tensors
        w = ctx.w
        pv = priv.to(logp.dtype)
        # Coefficients per row of (p - e_y) and of (p - q).
        lm_rows = (1 - pv) if ctx.masked else torch.ones_like(pv)
        # A term that was not computed (weight 0) has no gradient.
        c_rows = pv * (-s if ctx.masked else (1 - s)) if ctx.has_c else torch.zeros_like(pv)
        alpha = (g_total * w[0] + g_lm) * lm_rows + (g_total * w[1] + g_c) * c_rows
        beta = (g_total * w[2] + g_kl) * (1 - pv) if ctx.has_kl else torch.zeros_like(alpha)
        grad = logp.exp()  # p, [N, V]; becomes the gradient in place
        grad.mul_((alpha + beta).unsqueeze(-1))
        if ctx.has_kl:
            grad.addcmul_(logq.exp(), beta.unsqueeze(-1), value=-1.0)
        grad[torch.arange(grad.shape[0]), y] -= alpha
        return grad.to(ctx.z_dtype), None, None, None, None, None
