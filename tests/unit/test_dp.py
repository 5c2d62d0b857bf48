"""DP-SGD pieces (ctrlgen.training.dp): accounting, Poisson sampling, per-example clipping, noise.

The tiny random Llama with a PEFT prefix stands in for SmolLM2 (the per-example gradient
machinery does not depend on the model's size); the accountant is compared with Opacus's own.
"""

import math

import pytest
import torch

from ctrlgen.models import tiny_llama
from ctrlgen.training.dp import (
    dp_plan,
    empty_grad_samples,
    epsilon_spent,
    make_private,
    noise_multiplier_for,
    observed_noise_std,
    per_example_lm_loss,
    poisson_sample,
    worker_share,
)
from ctrlgen.training.prefix import prefix_model

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook:UserWarning")


def _opacus_epsilon(sigma: float, q: float, steps: int, delta: float, name: str) -> float:
    """Opacus's accountant driven step by step, as PrivacyEngine does during training."""
    from opacus.accountants import create_accountant

    acc = create_accountant(name)
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    return float(acc.get_epsilon(delta=delta))


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_epsilon_of_the_run_equals_opacus_accountant(accountant) -> None:
    plan = dp_plan(1000, 2, 64, epochs=2, max_steps=None, max_grad_norm=1.0, delta=1e-5, target_epsilon=8.0,
                   noise_multiplier=None, accountant=accountant)  # fmt: skip
    assert plan.sample_rate == 0.064 and plan.steps == math.ceil(2 / 0.064)
    ours = epsilon_spent(plan.noise_multiplier, plan.sample_rate, plan.steps, plan.delta, accountant)
    theirs = _opacus_epsilon(plan.noise_multiplier, plan.sample_rate, plan.steps, plan.delta, accountant)
    assert ours == pytest.approx(theirs, rel=1e-6)
    # sigma is the smallest that meets the target (Opacus's search tolerance is 0.01 in epsilon).
    assert ours <= 8.0 and ours > 8.0 - 0.05
    # A lower target needs more noise; fewer steps spend less.
    assert noise_multiplier_for(4.0, 1e-5, plan.sample_rate, plan.steps, accountant) > plan.noise_multiplier
    assert epsilon_spent(plan.noise_multiplier, plan.sample_rate, plan.steps // 2, 1e-5, accountant) < ours


def test_plan_rates_shares_and_errors() -> None:
    plan = dp_plan(101, 2, 10, epochs=1, max_steps=3, max_grad_norm=0.5, delta=1e-5, target_epsilon=None,
                   noise_multiplier=1.5)  # fmt: skip
    assert plan.per_worker_examples == (50, 51) and plan.steps == 3
    assert sum(plan.per_worker_batch) == pytest.approx(10.0)  # the global expected batch, split by share
    assert plan.noise_std == pytest.approx(0.75)
    assert [worker_share(101, 2, r) for r in (0, 1)] == [(0, 50), (50, 101)]
    assert epsilon_spent(0.0, 0.1, 10, 1e-5) == math.inf and epsilon_spent(1.0, 0.1, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="exceeds"):
        dp_plan(5, 1, 10, 1, None, 1.0, 1e-5, 8.0, None)
    with pytest.raises(ValueError, match="target_epsilon or noise_multiplier"):
        dp_plan(50, 1, 10, 1, None, 1.0, 1e-5, None, None)


def test_poisson_sampling_is_seeded_and_has_the_rate() -> None:
    a = poisson_sample(1000, 0.1, seed=3, step=7, rank=1)
    assert a == poisson_sample(1000, 0.1, seed=3, step=7, rank=1)  # resume draws the same batch
    assert a != poisson_sample(1000, 0.1, seed=3, step=8, rank=1) != poisson_sample(1000, 0.1, seed=3, step=7, rank=0)
    sizes = [len(poisson_sample(1000, 0.1, 0, s, 0)) for s in range(200)]
    mean = sum(sizes) / len(sizes)
    assert abs(mean - 100) < 3 and len(set(sizes)) > 10  # binomial(1000, 0.1): the batch size varies
    assert poisson_sample(10, 0.0, 0, 0, 0) == []


def _batch(n: int = 4, length: int = 12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (n, length), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100  # the code prompt
    labels[1, 9:] = -100  # a shorter example (padding)
    return ids, torch.ones_like(ids), labels


def _private_model(max_grad_norm: float, sigma: float, expected: float = 4.0):
    model = prefix_model(tiny_llama()[0], 5)
    params = [p for p in model.parameters() if p.requires_grad]
    plan = dp_plan(100, 1, 4, 1, None, max_grad_norm, 1e-5, None, sigma)
    plan = type(plan)(**{**plan.__dict__, "logical_batch": expected})
    gsm, opt = make_private(model, torch.optim.SGD(params, lr=0.0), plan, distributed=False,
                            generator=torch.Generator().manual_seed(1))  # fmt: skip
    return model, gsm, opt, params


def test_per_example_gradients_are_clipped_to_c_and_summed() -> None:
    ids, att, labels = _batch()
    c = 1e-3  # below every example's gradient norm: all are clipped
    model, gsm, opt, params = _private_model(c, sigma=0.0)
    # Reference: each example alone, its own gradient, clipped by hand.
    clipped = []
    for i in range(len(ids)):
        model.zero_grad()
        per = per_example_lm_loss(model(input_ids=ids[i : i + 1], attention_mask=att[i : i + 1]).logits,
                                  labels[i : i + 1])  # fmt: skip
        per.sum().backward()
        g = params[0].grad.detach().clone()
        assert g.norm() > c
        clipped.append(g * min(1.0, c / float(g.norm())))
    for p in params:
        p.grad_sample = None
    model.zero_grad()
    per_example_lm_loss(gsm(input_ids=ids, attention_mask=att).logits, labels).mean().backward()
    samples = params[0].grad_sample
    assert samples.shape[0] == len(ids)
    opt.step()
    # Every per-example gradient after clipping has norm <= C, and their sum is what the step used.
    for i, ref in enumerate(clipped):
        factor = min(1.0, c / (float(samples[i].norm()) + 1e-6))
        assert float((samples[i] * factor).norm()) <= c * (1 + 1e-6)
        assert torch.allclose(samples[i] * factor, ref, rtol=1e-3, atol=1e-9)
    assert torch.allclose(params[0].summed_grad, torch.stack(clipped).sum(0), rtol=1e-3, atol=1e-9)
    # No noise: the gradient is the clipped sum over the expected batch.
    assert torch.allclose(params[0].grad, params[0].summed_grad / 4.0)


def test_lora_per_example_gradients_are_clipped_jointly_over_its_matrices() -> None:
    """training.adapter: lora under DP: Opacus' per-example gradients of every LoRA matrix, clipped by their
    joint norm, summed: the same as each example's own gradient clipped by hand."""
    from ctrlgen.config import TrainingConfig
    from ctrlgen.training.prefix import adapter_model

    torch.manual_seed(0)
    model = adapter_model(tiny_llama()[0], TrainingConfig(adapter="lora", lora={"r": 4}))
    with torch.no_grad():  # B starts at zero (A would get no gradient): give both a gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.05)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert named and all("lora_" in n for n, _ in named)
    params = [p for _, p in named]
    ids, att, labels = _batch()
    c = 1e-3
    clipped = []
    for i in range(len(ids)):
        model.zero_grad()
        per_example_lm_loss(model(input_ids=ids[i : i + 1], attention_mask=att[i : i + 1]).logits,
                            labels[i : i + 1]).sum().backward()  # fmt: skip
        gs = [p.grad.detach().clone() for p in params]
        norm = float(torch.cat([g.flatten() for g in gs]).norm())
        assert norm > c
        clipped.append([g * min(1.0, c / norm) for g in gs])
    model.zero_grad()
    plan = dp_plan(100, 1, 4, 1, None, c, 1e-5, None, 0.0)
    plan = type(plan)(**{**plan.__dict__, "logical_batch": 4.0})
    gsm, opt = make_private(model, torch.optim.SGD(params, lr=0.0), plan, distributed=False)
    per_example_lm_loss(gsm(input_ids=ids, attention_mask=att).logits, labels).mean().backward()
    assert all(p.grad_sample.shape[0] == len(ids) for p in params)
    opt.step()
    for j, p in enumerate(params):
        assert torch.allclose(p.summed_grad, sum(ex[j] for ex in clipped), rtol=1e-3, atol=1e-10), named[j][0]


def test_an_examples_loss_does_not_depend_on_its_batch_companions() -> None:
    model = prefix_model(tiny_llama()[0], 5)
    ids, att, labels = _batch()
    together = per_example_lm_loss(model(input_ids=ids, attention_mask=att).logits, labels)
    alone = per_example_lm_loss(model(input_ids=ids[2:3], attention_mask=att[2:3]).logits, labels[2:3])
    assert torch.allclose(together[2], alone[0], atol=1e-5)
    empty = labels.clone()
    empty[0] = -100
    assert float(per_example_lm_loss(model(input_ids=ids, attention_mask=att).logits, empty)[0]) == 0.0


def test_noise_has_std_sigma_c_and_an_empty_batch_still_steps() -> None:
    ids, att, labels = _batch()
    _, gsm, opt, params = _private_model(max_grad_norm=0.5, sigma=2.0, expected=4.0)
    kept = []
    add = opt.add_noise

    def audited() -> None:
        kept[:] = [p.summed_grad.detach().clone() for p in opt.params]
        add()

    opt.add_noise = audited
    per_example_lm_loss(gsm(input_ids=ids, attention_mask=att).logits, labels).mean().backward()
    opt.step()
    assert observed_noise_std([p.grad for p in params], kept, 4.0) == pytest.approx(1.0, rel=0.1)  # 320 draws
    opt.zero_grad()
    empty_grad_samples(opt)  # a worker whose Poisson draw is empty: noise only
    opt.step()
    assert torch.all(kept[0] == 0) and float(params[0].grad.std() * 4.0) == pytest.approx(1.0, rel=0.1)
