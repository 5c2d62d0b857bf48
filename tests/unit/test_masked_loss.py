"""The masked prefix-tuning losses (the paper's Eq. 3 and the masking objective), term by term, against hand
computations (METHOD.md section 5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ctrlgen.training import LossWeights, masked_prefix_loss, private_token_mask


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    base = torch.randn(2, 5, 7, generator=g)
    labels = torch.tensor([[-100, -100, 3, 4, 1], [-100, 2, 6, 0, -100]])  # prompt and padding are -100
    private = torch.tensor([[False, False, True, False, True], [False, False, True, False, False]])
    return logits, base, labels, private


def _by_hand(logits, base, labels, private, objective="paper"):
    lm = con = kl = 0.0
    n = 0
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            y = int(labels[b, t])
            if y == -100:
                continue
            n += 1
            p = torch.softmax(logits[b, t - 1], -1)
            q = torch.softmax(base[b, t - 1], -1)
            if objective == "paper" or not private[b, t]:
                lm += -math.log(p[y])
            if private[b, t]:
                # paper: -log(p / (p + q)); masked: the ratio reversed, -log(q / (p + q))
                con += -math.log((p[y] if objective == "paper" else q[y]) / (p[y] + q[y]))
            else:
                kl += sum(float(q[v]) * math.log(q[v] / p[v]) for v in range(p.shape[0]))
    return lm, con, kl, n


def test_each_term_matches_a_hand_computation() -> None:
    logits, base, labels, private = _case()
    lm, con, kl, n = _by_hand(logits, base, labels, private)
    t = masked_prefix_loss(logits, base, labels, private, reduction="sum")
    assert t.tokens == n == 6 and t.private_tokens == 3
    assert float(t.lm) == pytest.approx(lm, rel=1e-5)
    assert float(t.contrastive) == pytest.approx(con, rel=1e-5)
    assert float(t.kl) == pytest.approx(kl, rel=1e-5)
    assert float(t.total) == pytest.approx(lm + con + kl, rel=1e-5)
    mean = masked_prefix_loss(logits, base, labels, private)
    assert float(mean.total) == pytest.approx((lm + con + kl) / n, rel=1e-5)


def test_the_masking_objective_matches_a_hand_computation() -> None:
    logits, base, labels, private = _case()
    lm, con, kl, n = _by_hand(logits, base, labels, private, "masked")
    w = LossWeights(0.5, 2.0, 3.0, "masked")
    t = masked_prefix_loss(logits, base, labels, private, w, reduction="sum")
    assert t.tokens == n == 6 and t.private_tokens == 3
    assert float(t.lm) == pytest.approx(lm, rel=1e-5)
    assert float(t.contrastive) == pytest.approx(con, rel=1e-5)
    assert float(t.kl) == pytest.approx(kl, rel=1e-5)
    assert float(t.total) == pytest.approx(0.5 * lm + 2 * con + 3 * kl, rel=1e-5)
    assert float(masked_prefix_loss(logits, base, labels, private, w).total) == pytest.approx(
        (0.5 * lm + 2 * con + 3 * kl) / n, rel=1e-5
    )
    # Its LM term is the paper's minus the private tokens', its KL term the paper's.
    paper = masked_prefix_loss(logits, base, labels, private, reduction="sum")
    assert float(t.lm) < float(paper.lm) and float(t.kl) == pytest.approx(float(paper.kl))


def test_on_private_tokens_the_paper_raises_and_masking_lowers_the_likelihood() -> None:
    """The sign argument of the module docstring on one private token: d loss / d z_y < 0 (a descent step raises
    z_y and so p_y) for the paper's objective, > 0 for the masking objective; for any p_y and q_y."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        logits, base = torch.randn(1, 2, 9, generator=g) * 3, torch.randn(1, 2, 9, generator=g) * 3
        labels = torch.tensor([[-100, int(torch.randint(0, 9, (1,), generator=g))]])
        private = torch.tensor([[False, True]])
        y = int(labels[0, 1])
        for objective, sign in (("paper", -1), ("masked", 1)):
            z = logits.clone().requires_grad_()
            masked_prefix_loss(z, base, labels, private, LossWeights(objective=objective)).total.backward()
            assert sign * float(z.grad[0, 0, y]) > 0, objective


def test_masking_objective_without_base_terms_is_lm_on_public_tokens() -> None:
    logits, _, labels, private = _case()
    keep = labels.clone()
    keep[private] = -100
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, 7), keep[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
    t = masked_prefix_loss(logits, None, labels, private, LossWeights(1, 0, 0, "masked"), reduction="sum")
    assert float(t.total) == pytest.approx(float(ce), rel=1e-6)


def test_an_unknown_objective_is_a_clear_error() -> None:
    logits, base, labels, private = _case()
    with pytest.raises(ValueError, match="objective"):
        masked_prefix_loss(logits, base, labels, private, LossWeights(objective="reverse"))  # type: ignore[arg-type]


def test_lm_term_equals_cross_entropy_on_shifted_labels() -> None:
    logits, base, labels, private = _case()
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert float(masked_prefix_loss(logits, None, labels, private, LossWeights(1, 0, 0)).total) == pytest.approx(
        float(ce), rel=1e-6
    )


def test_weights_switch_terms_off() -> None:
    logits, base, labels, private = _case()
    full = masked_prefix_loss(logits, base, labels, private)
    only_c = masked_prefix_loss(logits, base, labels, private, LossWeights(0, 1, 0))
    only_kl = masked_prefix_loss(logits, base, labels, private, LossWeights(0, 0, 1))
    assert float(only_c.total) == pytest.approx(float(full.contrastive))
    assert float(only_kl.total) == pytest.approx(float(full.kl))
    assert float(masked_prefix_loss(logits, base, labels, private, LossWeights(2, 0, 0)).total) == pytest.approx(
        2 * float(full.lm)
    )


def test_kl_ignores_private_tokens_and_contrastive_ignores_the_rest() -> None:
    logits, base, labels, private = _case()
    all_private = masked_prefix_loss(logits, base, labels, torch.ones_like(private))
    none_private = masked_prefix_loss(logits, base, labels, torch.zeros_like(private))
    assert float(all_private.kl) == 0.0 and float(all_private.contrastive) > 0
    assert float(none_private.contrastive) == 0.0 and float(none_private.kl) > 0


def test_padding_and_prompt_tokens_take_no_loss() -> None:
    logits, base, labels, private = _case()
    t = masked_prefix_loss(logits, base, labels, private, reduction="sum")
    # Changing logits that predict -100 positions changes nothing.
    changed = logits.clone()
    changed[0, 0] += 100.0  # predicts labels[0, 1] == -100
    changed[1, 3] -= 50.0  # predicts labels[1, 4] == -100
    t2 = masked_prefix_loss(changed, base, labels, private, reduction="sum")
    assert torch.allclose(t.total, t2.total)


def test_base_model_gets_no_gradient() -> None:
    logits, base, labels, private = _case()
    logits.requires_grad_(True)
    base.requires_grad_(True)
    masked_prefix_loss(logits, base, labels, private).total.backward()
    assert logits.grad is not None and base.grad is None


def test_missing_base_logits_is_a_clear_error() -> None:
    logits, _, labels, private = _case()
    with pytest.raises(ValueError, match="base_logits"):
        masked_prefix_loss(logits, None, labels, private)


@pytest.mark.parametrize(
    ("offsets", "spans", "want"),
    [
        ([(0, 5), (5, 11), (11, 12)], [(6, 11)], [False, True, False]),  # " Smith" overlaps "Smith"
        ([(0, 0), (0, 4)], [(0, 4)], [False, True]),  # special token (empty range) is never private
        ([(0, 3), (3, 6)], [(2, 4)], [True, True]),  # a span across a token boundary marks both
        ([(0, 3)], [], [False]),
        ([(0, 3), (3, 6)], [(3, 3)], [False, False]),  # empty span
    ],
)
def test_private_token_mask(offsets, spans, want) -> None:
    assert private_token_mask(offsets, spans) == want


def _reference(logits, base, labels, private, w):
    """The formulas with plain autograd ops (what the closed-form gradient must match)."""
    target, valid = labels[:, 1:], labels[:, 1:] != -100
    y, priv = target[valid], private[:, 1:][valid]
    logp = F.log_softmax(logits[:, :-1][valid], -1)
    logq = F.log_softmax(base[:, :-1][valid], -1)
    lp, lq = logp.gather(-1, y[:, None])[:, 0], logq.gather(-1, y[:, None])[:, 0]
    if w.objective == "masked":
        lm = -(lp * ~priv).sum()
        con = -((lq - torch.logaddexp(lp, lq)) * priv).sum()
    else:
        lm = -lp.sum()
        con = -((lp - torch.logaddexp(lp, lq)) * priv).sum()
    kl = ((logq.exp() * (logq - logp)).sum(-1) * ~priv).sum()
    return w.lm * lm + w.contrastive * con + w.kl * kl, lm, con, kl


@pytest.mark.parametrize(
    "weights",
    [
        LossWeights(),
        LossWeights(1, 0, 0),
        LossWeights(0.5, 2.0, 0.0),
        LossWeights(0, 0, 3),
        LossWeights(objective="masked"),
        LossWeights(1, 0, 0, "masked"),
        LossWeights(0.5, 2.0, 0.0, "masked"),
        LossWeights(0, 1.5, 3, "masked"),
    ],
)
@pytest.mark.parametrize("term", ["total", "lm", "contrastive", "kl"])
def test_closed_form_gradient_matches_autograd(weights, term):
    logits, base, labels, private = _case()
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    terms = masked_prefix_loss(a, base, labels, private, weights, reduction="sum")
    ref = dict(zip(["total", "lm", "contrastive", "kl"], _reference(b, base, labels, private, weights), strict=True))
    got = getattr(terms, term)
    if term in ("contrastive", "kl") and getattr(weights, term) == 0:
        assert float(got) == 0.0  # a switched-off term is not computed
        return
    assert float(got) == pytest.approx(float(ref[term]), rel=1e-5)
    got.backward()
    ref[term].backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)
