"""DP-SGD prefix tuning with Opacus (METHOD.md section 8.1): the Ray-free pieces.

The ``dp`` training variant tunes the prefix with differentially private SGD:

* **The privacy unit** (:func:`privacy_units`): a patient (all of that patient's notes) when
  every note carries a patient id (:func:`ctrlgen.schema.patient_id`), else one note. Units
  are numbered in order of first appearance; worker ``w`` of ``W`` holds a fixed contiguous
  share of the *units* (all notes of its patients).
* **Poisson sampling** (:func:`poisson_sample`): at every step each unit joins the logical
  batch independently with probability ``q = logical_batch / units``. Every worker samples
  its own share with the same ``q``, so the union over workers is exactly one Poisson sample
  of all units at rate ``q``.
* **One clipped gradient per unit**: Opacus's ``GradSampleModule`` (hooks) gives the gradient
  of each note's own loss (:func:`per_example_lm_loss`); :class:`UnitGradients` sums them per
  unit over the step's micro-batches, and ``DPOptimizer`` clips each unit's sum to L2 norm C.
* **Noise once per logical batch**: rank 0 alone adds N(0, (sigma C)^2) to the clipped sum and
  the workers all-reduce (Opacus's ``DistributedDPOptimizer``), so the logical batch gets one
  draw of noise whatever the number of workers (:func:`observed_noise_std` checks it). Every
  worker divides by the *global* expected batch: the update is (sum of clipped unit gradients
  + noise) / (q U).
* **Secret randomness** (:class:`SecureRandomness`): the Poisson draws and the noise come from
  the operating system's CSPRNG (``os.urandom``), never from the config seed, and are written
  nowhere. Gaussian noise by Box-Muller from 53-bit uniforms, each coordinate the mean-scaled
  sum of 4 draws (Opacus's ``secure_mode`` construction against floating-point attacks).
  :class:`SeededRandomness` (``training.dp.reproducible_noise``) replays a run from its seed,
  for tests: such a run is not private and is stamped so (:data:`NOT_PRIVATE`).
* **Accounting** (:func:`noise_multiplier_for`, :func:`epsilon_spent`): sigma is set
  from the target (epsilon, delta) for the run's (q, steps) with Opacus's own
  ``get_noise_multiplier``; the epsilon actually spent is recomputed from the steps
  taken with Opacus's accountant (RDP by default, PRV on request).

Why not Opacus's own ``secure_mode``: it needs ``torchcsprng``, whose last release (0.2.1, 2021) is
built for torch 1.8; there is none for torch 2.13. Why not DeepSpeed: DeepSpeed's engine owns the
backward and reduces the *summed* gradient across ranks; DP-SGD needs every unit's gradient clipped
before any sum, and noise added once after it.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

__all__ = [
    "NOT_PRIVATE",
    "DPPlan",
    "DPRandomness",
    "PrivacyUnits",
    "SecureRandomness",
    "SeededRandomness",
    "UnitGradients",
    "choose_notes",
    "clip_factor_norms",
    "dp_plan",
    "dp_randomness",
    "empty_grad_samples",
    "epsilon_spent",
    "make_private",
    "noise_multiplier_for",
    "observed_noise_std",
    "per_example_lm_loss",
    "poisson_sample",
    "privacy_units",
    "secure_normal",
    "secure_uniform",
    "unit_members",
    "worker_share",
]

#: The stamp of a run whose DP randomness came from the config seed (privacy.json, results rows).
NOT_PRIVATE = (
    "training.dp.reproducible_noise: the Poisson sampling and the noise follow from training.seed, which anyone "
    "with the config can replay and subtract; no differential-privacy guarantee holds"
)


@dataclass(frozen=True)
class DPPlan:
    """What one DP-SGD run does, fixed before it starts (written to its results)."""

    examples: int  # training notes
    unit: str  # the privacy unit: "patient" or "note"
    units: int  # U: patients (or notes, unit "note")
    workers: int
    logical_batch: float  # expected units per step, all workers together (q * U)
    sample_rate: float  # q, the same for every unit and every worker
    steps: int
    noise_multiplier: float  # sigma
    max_grad_norm: float  # C
    delta: float
    target_epsilon: float | None
    accountant: Literal["rdp", "prv"]
    per_worker_units: tuple[int, ...]  # U_w, the contiguous share of units of each worker
    reproducible_noise: bool = False  # randomness from the config seed: NOT private

    @property
    def per_worker_batch(self) -> tuple[float, ...]:
        """Expected units per step on each worker (q * U_w)."""
        return tuple(self.sample_rate * n for n in self.per_worker_units)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on the summed clipped gradients of one logical batch."""
        return self.noise_multiplier * self.max_grad_norm

    @staticmethod
    def from_json(d: dict[str, Any]) -> DPPlan:
        """The plan from :meth:`to_json` (its derived keys are ignored)."""
        fields = {k: v for k, v in d.items() if k in DPPlan.__dataclass_fields__}
        return DPPlan(**fields | {"per_worker_units": tuple(d["per_worker_units"])})

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_worker_units"] = list(self.per_worker_units)
        d["per_worker_batch"] = list(self.per_worker_batch)
        d["noise_std"] = self.noise_std
        return d


def worker_share(units: int, workers: int, rank: int) -> tuple[int, int]:
    """The contiguous units ``[lo, hi)`` of worker ``rank`` (sizes differ by at most one)."""
    return rank * units // workers, (rank + 1) * units // workers


@dataclass(frozen=True)
class PrivacyUnits:
    """The privacy unit of a run and which unit each training example belongs to."""

    unit: str  # "patient" or "note"
    of_example: tuple[int, ...]  # unit index of every example, units numbered by first appearance
    count: int
    why: str  # how the unit was chosen (for the log; no ids in it)


def privacy_units(patients: Sequence[str | None], unit: Literal["auto", "patient", "note"]) -> PrivacyUnits:
    """Group the examples (in training order; ``patients``: each one's patient id or None) into privacy units.

    ``patient`` needs an id on every example (else ValueError); ``auto`` is ``patient`` when every example
    has one, else ``note``; ``note`` makes each example its own unit.

    Example:
        >>> u = privacy_units(["a", "b", "a"], "auto")
        >>> u.unit, u.of_example, u.count
        ('patient', (0, 1, 0), 2)
    """
    n = len(patients)
    missing = sum(1 for p in patients if p in (None, ""))
    if unit == "patient" and missing:
        raise ValueError(
            f"training.dp.unit=patient: {missing} of the {n} training examples carry no patient id (metadata "
            "'patient' or 'SUBJECT_ID'); give every note its patient, or set training.dp.unit=note to protect "
            "single notes only"
        )
    if unit == "note" or missing:
        why = "set by training.dp.unit" if unit == "note" else f"{missing} of {n} examples have no patient id"
        return PrivacyUnits("note", tuple(range(n)), n, why)
    index: dict[str, int] = {}
    of = tuple(index.setdefault(str(p), len(index)) for p in patients)
    why = "set by training.dp.unit" if unit == "patient" else "every example has a patient id"
    return PrivacyUnits("patient", of, len(index), why)


def unit_members(of_example: Sequence[int], lo: int, hi: int) -> list[list[int]]:
    """For the units ``[lo, hi)``: the example rows of each (ascending), in unit order."""
    members: list[list[int]] = [[] for _ in range(hi - lo)]
    for row, u in enumerate(of_example):
        if lo <= u < hi:
            members[u - lo].append(row)
    return members


def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: Literal["rdp", "prv"] = "rdp"
) -> float:
    """Opacus's ``get_noise_multiplier``: the smallest sigma whose spend after ``steps`` is <= the target."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():  # "optimal order is the largest alpha": a valid, slightly loose bound
        warnings.filterwarnings("ignore", message="Optimal order")
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
            )
        )


def epsilon_spent(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: Literal["rdp", "prv"] = "rdp"
) -> float:
    """Epsilon spent by ``steps`` DP-SGD steps at (sigma, q), from Opacus's accountant; inf without noise."""
    if steps == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from opacus.accountants import create_accountant

    acc = create_accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order")
        return float(acc.get_epsilon(delta=delta))


def dp_plan(
    examples: int,
    workers: int,
    logical_batch: int,
    epochs: float,
    max_steps: int | None,
    max_grad_norm: float,
    delta: float,
    target_epsilon: float | None,
    noise_multiplier: float | None,
    accountant: Literal["rdp", "prv"] = "rdp",
    unit: str = "note",
    units: int | None = None,
    reproducible_noise: bool = False,
) -> DPPlan:
    """Sample rate, steps and sigma of a run over ``units`` privacy units (default: each of the ``examples``).

    Raises ValueError on impossible settings.
    """
    units = examples if units is None else units
    if units < workers:
        raise ValueError(f"{units} training {unit}s cannot be shared by {workers} workers")
    if logical_batch > units:
        raise ValueError(f"training.dp.logical_batch {logical_batch} exceeds the {units} training {unit}s")
    q = logical_batch / units
    steps = max(1, math.ceil(epochs / q))  # an epoch is 1/q steps in expectation
    if max_steps is not None:
        steps = min(steps, max_steps)
    if noise_multiplier is None:
        if target_epsilon is None:
            raise ValueError("training.dp needs target_epsilon or noise_multiplier")
        sigma = noise_multiplier_for(target_epsilon, delta, q, steps, accountant)
    else:
        sigma = float(noise_multiplier)
    shares = tuple(hi - lo for lo, hi in (worker_share(units, workers, r) for r in range(workers)))
    return DPPlan(examples=examples, unit=unit, units=units, workers=workers, logical_batch=float(logical_batch),
                  sample_rate=q, steps=steps, noise_multiplier=sigma, max_grad_norm=max_grad_norm, delta=delta,
                  target_epsilon=target_epsilon, accountant=accountant, per_worker_units=shares,
                  reproducible_noise=reproducible_noise)  # fmt: skip


# --- where the random bits come from -----------------------------------------------------------


def secure_uniform(n: int) -> torch.Tensor:
    """``[n]`` float64 uniform on [0, 1) with 53 random bits each, from the OS's CSPRNG (``os.urandom``)."""
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return torch.from_numpy(raw.astype(np.float64) * 2.0**-53)


def secure_normal(n: int) -> torch.Tensor:
    """``[n]`` float64 standard normal from :func:`secure_uniform` by Box-Muller (both outputs of each pair)."""
    m = (n + 1) // 2
    u = secure_uniform(2 * m)
    radius = torch.sqrt(-2.0 * torch.log1p(-u[:m]))  # 1 - u in (0, 1]: log finite
    angle = (2.0 * math.pi) * u[m:]
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]


class DPRandomness(Protocol):
    """The source of DP-SGD's random bits: the Poisson draws, the note choice, the Gaussian noise."""

    secret: bool

    def start_step(self, step: int) -> None: ...

    def uniform(self, n: int, salt: str) -> torch.Tensor: ...  # [n] float64 in [0, 1)

    def normal(self, like: torch.Tensor, std: float) -> torch.Tensor: ...  # N(0, std^2), like's shape / device


class SecureRandomness:
    """OS entropy, fresh at every draw: nothing to seed, nothing to save, nothing to replay."""

    secret = True

    def start_step(self, step: int) -> None:
        pass

    def uniform(self, n: int, salt: str) -> torch.Tensor:
        return secure_uniform(n)

    def normal(self, like: torch.Tensor, std: float) -> torch.Tensor:
        # The mean-scaled sum of 4 draws (Opacus's secure_mode, after Holohan & Braghin 2021): the low bits of
        # one floating-point Gaussian can betray it (Mironov 2012); the sum is N(0, std^2) again.
        z = secure_normal(4 * like.numel()).view(4, -1).sum(0) / 2.0
        return (z * std).view(like.shape).to(device=like.device, dtype=like.dtype)


class SeededRandomness:
    """``training.dp.reproducible_noise``: every draw a function of (seed, step): a run can be replayed exactly,
    by anyone with its config. NOT private."""

    secret = False

    def __init__(self, seed: int) -> None:
        self.seed, self.step = seed, 0
        self._noise = torch.Generator()

    def start_step(self, step: int) -> None:
        self.step = step
        self._noise.manual_seed(zlib.crc32(f"dp-noise\x1f{self.seed}\x1f{step}".encode()))

    def uniform(self, n: int, salt: str) -> torch.Tensor:
        key = zlib.crc32(f"dp-sample\x1f{self.seed}\x1f{self.step}\x1f{salt}".encode())
        return torch.rand(n, generator=torch.Generator().manual_seed(key), dtype=torch.float64)

    def normal(self, like: torch.Tensor, std: float) -> torch.Tensor:
        z = torch.normal(0.0, std, size=tuple(like.shape), generator=self._noise, dtype=torch.float64)
        return z.to(device=like.device, dtype=like.dtype)


def dp_randomness(reproducible: bool, seed: int) -> DPRandomness:
    """:class:`SecureRandomness`, or :class:`SeededRandomness` when ``training.dp.reproducible_noise`` is set."""
    return SeededRandomness(seed) if reproducible else SecureRandomness()


def poisson_sample(n: int, sample_rate: float, randomness: DPRandomness, rank: int) -> list[int]:
    """Indices in ``range(n)`` (this worker's units) each kept independently with probability ``sample_rate``."""
    return torch.nonzero(randomness.uniform(n, f"rank{rank}") < sample_rate).flatten().tolist()


def choose_notes(rows: Sequence[int], cap: int | None, randomness: DPRandomness, salt: str) -> list[int]:
    """A drawn unit's notes in this step: all of them, or ``cap`` of them chosen uniformly at random."""
    if cap is None or len(rows) <= cap:
        return list(rows)
    order = torch.argsort(randomness.uniform(len(rows), salt))[:cap]
    return sorted(rows[int(i)] for i in order)


def per_example_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[B]``: each example's mean next-token NLL over its own output tokens (0 for none).

    Each example's gradient is then the gradient of its own loss, independent of its batch
    companions (what clipping bounds). The batch loss is their mean; Opacus's hooks scale
    the per-sample gradients back by the batch size (``loss_reduction="mean"``).
    """
    target = labels[:, 1:]
    valid = target != -100
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    return nll.sum(dim=1) / valid.sum(dim=1).clamp(min=1)


def make_private(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    plan: DPPlan,
    distributed: bool,
    randomness: DPRandomness | None = None,
) -> tuple[Any, Any]:
    """Wrap the model in ``GradSampleModule`` (hooks) and the optimizer in a (distributed) DPOptimizer whose noise
    comes from ``randomness`` (default :class:`SecureRandomness`), added by rank 0 alone when distributed.

    Every worker averages by the *global* expected batch (``q * U / W`` per worker, then the
    all-reduce's mean over ``W``): the update is (sum of clipped gradients + noise) / (q U).
    """
    from opacus import GradSampleModule
    from opacus.optimizers import DistributedDPOptimizer, DPOptimizer

    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    cls = DistributedDPOptimizer if distributed else DPOptimizer
    per_worker = plan.logical_batch / plan.workers
    opt = cls(
        optimizer,
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=plan.max_grad_norm,
        expected_batch_size=per_worker,  # type: ignore[arg-type]  # a divisor; need not be an int
        loss_reduction="mean",
    )
    source = randomness if randomness is not None else SecureRandomness()
    noise_here = not distributed or opt.rank == 0

    def add_noise() -> None:  # Opacus's add_noise, drawing from ``source`` instead of torch's generators
        from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

        std = opt.noise_multiplier * opt.max_grad_norm
        for p in opt.params:
            _check_processed_flag(p.summed_grad)
            noisy = p.summed_grad.clone()
            if noise_here and std > 0:
                noisy += source.normal(p.summed_grad, std)
            p.grad = noisy.view_as(p)
            _mark_as_processed(p.summed_grad)

    opt.add_noise = add_noise  # type: ignore[method-assign]
    return gsm, opt


class UnitGradients:
    """The per-unit sums of per-note gradients over the micro-batches of one step: what DP-SGD clips.

    After each micro-batch's backward, :meth:`add` folds every note's gradient (Opacus's ``grad_sample``) into
    its unit's slot; :meth:`load` hands the ``[units, ...]`` sums to the optimizer as its per-sample
    gradients, so ``DPOptimizer.step`` clips each unit's whole contribution to C.
    """

    def __init__(self, optimizer: Any, units: int) -> None:
        self.opt, self.units = optimizer, units
        self.sums: list[torch.Tensor | None] = [None] * len(optimizer.params)

    def add(self, slots: Sequence[int]) -> None:
        """``slots``: the unit slot of each note of the micro-batch just back-propagated."""
        for i, p in enumerate(self.opt.params):
            gs = p.grad_sample  # [notes, *p.shape]
            if gs is None:
                raise RuntimeError("UnitGradients.add: no per-sample gradient (call it after the backward)")
            if isinstance(gs, list):
                gs = torch.cat(gs)
            if gs.shape[0] != len(slots):
                raise ValueError(f"UnitGradients.add: {gs.shape[0]} per-sample gradients for {len(slots)} slots")
            acc = self.sums[i]
            if acc is None:
                acc = self.sums[i] = torch.zeros((self.units, *p.shape), dtype=gs.dtype, device=gs.device)
            acc.index_add_(0, torch.as_tensor(list(slots), dtype=torch.long, device=gs.device), gs)
            p.grad_sample = None
            p.grad = None

    def load(self) -> None:
        """Give the optimizer the per-unit sums (zeros for a unit without notes; ``[0, ...]`` for no unit)."""
        for i, p in enumerate(self.opt.params):
            acc = self.sums[i]
            p.grad_sample = acc if acc is not None else torch.zeros((self.units, *p.shape), dtype=p.dtype,
                                                                      device=p.device)  # fmt: skip


def empty_grad_samples(optimizer: Any) -> None:
    """A worker whose Poisson draw is empty still takes part in the step: zero per-sample gradients."""
    for p in optimizer.params:
        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)


def clip_factor_norms(optimizer: Any) -> torch.Tensor:
    """Per-example gradient norms (over all trainable parameters) of the pending micro-batch."""
    gs = optimizer.grad_samples
    if len(gs[0]) == 0:
        return torch.zeros(0)
    return torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in gs], dim=1).norm(2, dim=1)


def observed_noise_std(grads: list[torch.Tensor], clipped_sums: list[torch.Tensor], logical_batch: float) -> float:
    """Std of the noise in an update: ``grad * (q N) - sum of clipped gradients``, over all elements.

    ``grads`` are the parameters' final (all-reduced) gradients and ``clipped_sums`` the sum of
    all workers' clipped per-example gradients. One draw of N(0, (sigma C)^2) per logical
    batch gives sigma C; one draw per worker would give sigma C sqrt(W).
    """
    noise = torch.cat([g.double().flatten() * logical_batch - s.double().flatten()
                       for g, s in zip(grads, clipped_sums, strict=True)])  # fmt: skip
    return float(noise.std())
