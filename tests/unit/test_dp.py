"""DP-SGD pieces (ctrlgen.training.dp): accounting, privacy units, secret Poisson sampling and noise,
per-example and per-patient clipping.

The tiny random Llama with a PEFT prefix stands in for SmolLM2 (the per-example gradient
machinery does not depend on the model's size); the accountant is compared with Opacus's own.
"""

import math

import pytest
import torch

from ctrlgen.models import tiny_llama
from ctrlgen.training.dp import (
    SecureRandomness,
    SeededRandomness,
    UnitGradients,
    choose_notes,
    dp_plan,
    dp_randomness,
    empty_grad_samples,
    epsilon_spent,
    make_private,
    noise_multiplier_for,
    observed_noise_std,
    per_example_lm_loss,
    poisson_sample,
    privacy_units,
    secure_normal,
    unit_members,
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
    assert plan.per_worker_units == (50, 51) and plan.steps == 3 and plan.unit == "note" and plan.units == 101
    assert sum(plan.per_worker_batch) == pytest.approx(10.0)  # the global expected batch, split by share
    assert plan.noise_std == pytest.approx(0.75)
    assert [worker_share(101, 2, r) for r in (0, 1)] == [(0, 50), (50, 101)]
    assert epsilon_spent(0.0, 0.1, 10, 1e-5) == math.inf and epsilon_spent(1.0, 0.1, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="exceeds"):
        dp_plan(5, 1, 10, 1, None, 1.0, 1e-5, 8.0, None)
    with pytest.raises(ValueError, match="target_epsilon or noise_multiplier"):
        dp_plan(50, 1, 10, 1, None, 1.0, 1e-5, None, None)
    # Per patient: 500 notes of 40 patients; q and the shares are over patients.
    plan = dp_plan(500, 2, 10, 1, None, 1.0, 1e-5, None, 1.0, unit="patient", units=40)
    assert plan.sample_rate == 0.25 and plan.per_worker_units == (20, 20) and plan.examples == 500
    assert plan.to_json()["unit"] == "patient" and plan.to_json()["units"] == 40
    with pytest.raises(ValueError, match="logical_batch 16 exceeds the 5 training patients"):
        dp_plan(500, 1, 16, 1, None, 1.0, 1e-5, 8.0, None, unit="patient", units=5)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_patient_level_epsilon_is_opacus_at_the_patient_sample_rate(accountant) -> None:
    """2,000 notes of 100 patients, 16 patients per step: sigma is set for q = 16/100 (not 16/2000), and the
    epsilon of the run is Opacus's accountant stepped at that rate."""
    plan = dp_plan(2000, 2, 16, epochs=2, max_steps=None, max_grad_norm=1.0, delta=1e-5, target_epsilon=8.0,
                   noise_multiplier=None, accountant=accountant, unit="patient", units=100)  # fmt: skip
    assert plan.sample_rate == 0.16 and plan.steps == math.ceil(2 / 0.16)
    ours = epsilon_spent(plan.noise_multiplier, plan.sample_rate, plan.steps, plan.delta, accountant)
    assert ours == pytest.approx(_opacus_epsilon(plan.noise_multiplier, 0.16, plan.steps, 1e-5, accountant), rel=1e-6)
    assert 8.0 - 0.05 < ours <= 8.0
    # The note-level rate would have called for far less noise: the patient is the larger unit.
    notes = dp_plan(2000, 2, 16, 2, None, 1.0, 1e-5, 8.0, None, accountant)
    assert notes.sample_rate == 0.008 and notes.noise_multiplier < plan.noise_multiplier


def test_privacy_units_group_notes_by_patient_or_refuse() -> None:
    u = privacy_units(["p1", "p2", "p1", "p3", "p2"], "auto")
    assert (u.unit, u.of_example, u.count) == ("patient", (0, 1, 0, 2, 1), 3)
    assert unit_members(u.of_example, 0, 2) == [[0, 2], [1, 4]] and unit_members(u.of_example, 2, 3) == [[3]]
    assert privacy_units(["p1", "p2", "p1"], "note").of_example == (0, 1, 2)
    fallback = privacy_units(["p1", None, ""], "auto")  # auto without an id on every note: per note, said why
    assert fallback.unit == "note" and fallback.count == 3 and "2 of 3" in fallback.why
    with pytest.raises(ValueError, match="2 of the 3 training examples carry no patient id"):
        privacy_units(["p1", None, ""], "patient")


def test_poisson_draws_are_secret_and_have_the_rate() -> None:
    """The same (n, q, rank, step) draws other units each time (OS entropy, whatever torch's seed); the sizes are
    binomial(n, q). Only the reproducible source (not private) repeats itself."""
    secure = SecureRandomness()
    torch.manual_seed(0)
    a = poisson_sample(1000, 0.1, secure, rank=1)
    torch.manual_seed(0)
    assert a != poisson_sample(1000, 0.1, secure, rank=1)
    sizes = [len(poisson_sample(1000, 0.1, secure, 0)) for _ in range(200)]
    assert abs(sum(sizes) / len(sizes) - 100) < 3 and len(set(sizes)) > 10
    assert poisson_sample(10, 0.0, secure, 0) == [] and len(poisson_sample(10, 1.0, secure, 0)) == 10
    seeded = SeededRandomness(3)
    seeded.start_step(7)
    b = poisson_sample(1000, 0.1, seeded, rank=1)
    assert b == poisson_sample(1000, 0.1, seeded, rank=1) != poisson_sample(1000, 0.1, seeded, rank=0)
    seeded.start_step(8)
    assert b != poisson_sample(1000, 0.1, seeded, rank=1)
    assert isinstance(dp_randomness(False, 0), SecureRandomness) and dp_randomness(True, 0).secret is False


def test_secure_normal_is_standard_normal() -> None:
    z = secure_normal(200_001).double()
    assert z.shape == (200_001,) and torch.isfinite(z).all()
    assert abs(float(z.mean())) < 0.01 and float(z.std()) == pytest.approx(1.0, abs=0.01)
    assert float((z**4).mean()) == pytest.approx(3.0, abs=0.1)  # Gaussian kurtosis
    assert float((z.abs() < 1.0).double().mean()) == pytest.approx(0.6827, abs=0.005)
    noise = SecureRandomness().normal(torch.zeros(100_000, dtype=torch.float32), 0.5)
    assert noise.dtype == torch.float32 and float(noise.std()) == pytest.approx(0.5, rel=0.02)


def test_choose_notes_caps_a_patients_notes_at_random() -> None:
    rows = list(range(10, 30))
    assert choose_notes(rows, None, SecureRandomness(), "u") == rows
    assert choose_notes(rows[:3], 5, SecureRandomness(), "u") == [10, 11, 12]
    picks = [choose_notes(rows, 4, SecureRandomness(), "u") for _ in range(20)]
    assert all(len(p) == 4 and set(p) <= set(rows) and p == sorted(p) for p in picks)
    assert len({tuple(p) for p in picks}) > 10  # random subsets, not the first four


def _batch(n: int = 4, length: int = 12):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (n, length), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100  # the code prompt
    labels[1, 9:] = -100  # a shorter example (padding)
    return ids, torch.ones_like(ids), labels


def _private_model(max_grad_norm: float, sigma: float, expected: float = 4.0, randomness=None):
    model = prefix_model(tiny_llama()[0], 5)
    params = [p for p in model.parameters() if p.requires_grad]
    plan = dp_plan(100, 1, 4, 1, None, max_grad_norm, 1e-5, None, sigma)
    plan = type(plan)(**{**plan.__dict__, "logical_batch": expected})
    gsm, opt = make_private(model, torch.optim.SGD(params, lr=0.0), plan, distributed=False, randomness=randomness)
    return model, gsm, opt, params


def _own_gradients(model, params, ids, att, labels) -> list[torch.Tensor]:
    """Each example alone: the gradient of its own loss (the first trainable parameter, the prefix)."""
    grads = []
    for i in range(len(ids)):
        model.zero_grad()
        per_example_lm_loss(model(input_ids=ids[i : i + 1], attention_mask=att[i : i + 1]).logits,
                            labels[i : i + 1]).sum().backward()  # fmt: skip
        grads.append(params[0].grad.detach().clone())
    model.zero_grad()
    for p in params:  # Opacus's hooks saw these passes too
        p.grad_sample = None
    return grads


def _clip(g: torch.Tensor, c: float) -> torch.Tensor:
    return g * min(1.0, c / (float(g.norm()) + 1e-6))


def test_a_patient_with_many_notes_contributes_at_most_c_per_step() -> None:
    """Per patient, a step's clipped sum is clip(sum of each patient's note gradients), accumulated over
    micro-batches that split a patient's notes; a patient's whole contribution has norm <= C. Clipped per note,
    the same patient with 4 copies of one note would move the model by 4 C."""
    ids, att, labels = _batch(n=5)
    c = 1e-3  # below every note's gradient norm
    model, gsm, opt, params = _private_model(c, sigma=0.0)
    own = _own_gradients(model, params, ids, att, labels)
    assert all(float(g.norm()) > c for g in own)

    def step(notes: list[tuple[int, int]], units: int) -> torch.Tensor:
        """``notes``: (example row, unit slot); micro-batches of 3; the step's summed clipped gradient."""
        acc = UnitGradients(opt, units)
        for lo in range(0, len(notes), 3):
            rows = [r for r, _ in notes[lo : lo + 3]]
            logits = gsm(input_ids=ids[rows], attention_mask=att[rows]).logits
            per_example_lm_loss(logits, labels[rows]).mean().backward()
            acc.add([u for _, u in notes[lo : lo + 3]])
        acc.load()
        assert params[0].grad_sample.shape[0] == units
        opt.step()
        out = params[0].summed_grad.detach().clone()
        opt.zero_grad()
        return out

    # Patient A: notes 0-3 (split over two micro-batches); patient B: note 4.
    both = step([(0, 0), (1, 0), (2, 0), (3, 0), (4, 1)], 2)
    expected = _clip(own[0] + own[1] + own[2] + own[3], c) + _clip(own[4], c)
    assert torch.allclose(both, expected, rtol=1e-3, atol=1e-9)
    assert float(step([(0, 0), (1, 0), (2, 0), (3, 0)], 1).norm()) <= c * (1 + 1e-5)  # patient A alone: <= C
    # A patient whose 4 notes are the same note: C per patient, 4 C per note.
    same = [(0, 0)] * 4
    assert float(step(same, 1).norm()) == pytest.approx(c, rel=1e-4)
    assert float(step([(0, k) for k in range(4)], 4).norm()) == pytest.approx(4 * c, rel=1e-4)
    empty = step([], 0)  # no unit drawn on this worker: a zero sum, the step still runs
    assert float(empty.abs().sum()) == 0.0


def test_two_runs_of_one_config_draw_different_noise_unless_reproducible() -> None:
    """The same model, data, plan and torch seed: the secure source's noise differs run to run (and is sigma C);
    the reproducible source (training.dp.reproducible_noise, not private) gives the same noise twice."""
    ids, att, labels = _batch()

    def noisy_grad(randomness) -> torch.Tensor:
        torch.manual_seed(0)
        _, gsm, opt, params = _private_model(0.5, sigma=2.0, randomness=randomness)
        if randomness is not None:
            randomness.start_step(0)
        per_example_lm_loss(gsm(input_ids=ids, attention_mask=att).logits, labels).mean().backward()
        opt.step()
        return params[0].grad.detach().clone()

    a, b = noisy_grad(None), noisy_grad(SecureRandomness())  # None: make_private's default, the secure source
    assert not torch.allclose(a, b)
    assert float((a - b).std() * 4.0) == pytest.approx(2.0**0.5, rel=0.2)  # two independent draws of sigma C = 1 (320 each: 5 sd)
    assert torch.equal(noisy_grad(SeededRandomness(5)), noisy_grad(SeededRandomness(5)))


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
    # 320 secret draws: the sample std's sd is 1/sqrt(640) = 4%, so 20% is 5 sd (fails ~1e-6 of runs; 10% failed
    # in a run) and still tells sigma C = 1 from the factor-2 slips (sigma alone 2, C alone 0.5) it is here for.
    assert observed_noise_std([p.grad for p in params], kept, 4.0) == pytest.approx(1.0, rel=0.2)
    opt.zero_grad()
    empty_grad_samples(opt)  # a worker whose Poisson draw is empty: noise only
    opt.step()
    assert torch.all(kept[0] == 0) and float(params[0].grad.std() * 4.0) == pytest.approx(1.0, rel=0.2)
