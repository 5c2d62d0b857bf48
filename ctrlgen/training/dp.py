"""DP-SGD prefix tuning with Opacus (METHOD.md section 8.1): the Ray-free pieces.

The ``dp`` training variant tunes the prefix with differentially private SGD:

* **Poisson sampling** (:func:`poisson_sample`): at every step each training example
  joins the logical batch independently with probability ``q = logical_batch / N``
  (the sampling the RDP/PRV analyses assume). Worker ``w`` of ``W`` holds a fixed
  contiguous share of the examples and samples *its share* with the same ``q``, so
  the union over workers is exactly one Poisson sample of the whole set at rate ``q``
  (global expected batch ``q * N``, per worker ``q * N_w``). The draw is seeded by
  (seed, step, rank): a resumed run samples exactly what an uninterrupted one does.
* **Per-example gradients and clipping**: Opacus's ``GradSampleModule`` (hooks) gives the
  gradient of each example's own loss (:func:`per_example_lm_loss`, the token mean of that
  example's L_LM); ``DPOptimizer`` clips each to L2 norm ``max_grad_norm`` = C and sums.
* **Noise once per logical batch**: with several workers Opacus's
  ``DistributedDPOptimizer`` adds N(0, (sigma C)^2) on rank 0 only and all-reduces the sum,
  so the logical batch gets one draw of noise whatever the number of workers (the job
  checks this every step: :func:`observed_noise_std`). Every worker divides by the
  *global* expected batch, so the update is (sum of clipped gradients + noise) / (q N).
* **Accounting** (:func:`noise_multiplier_for`, :func:`epsilon_spent`): sigma is set
  from the target (epsilon, delta) for the run's (q, steps) with Opacus's own
  ``get_noise_multiplier``; the epsilon actually spent is recomputed from the steps
  taken with Opacus's accountant (RDP by default, PRV on request).

Why not DeepSpeed: DeepSpeed's engine owns the backward and reduces (and under ZeRO
partitions) the *summed* gradient across ranks; DP-SGD needs every example's gradient
clipped before any sum, and noise added once after it. Opacus's optimizer does that on a
plain torch optimizer over the prefix (230k parameters for SmolLM2-135M: nothing for
ZeRO to shard), with Ray Train's process group for the one all-reduce per step.
"""

from __future__ import annotations

import math
import warnings
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

__all__ = [
    "DPPlan",
    "clip_factor_norms",
    "dp_plan",
    "empty_grad_samples",
    "epsilon_spent",
    "make_private",
    "noise_multiplier_for",
    "observed_noise_std",
    "per_example_lm_loss",
    "poisson_sample",
]


@dataclass(frozen=True)
class DPPlan:
    """What one DP-SGD run does, fixed before it starts (written to its results)."""

    examples: int  # N
    workers: int
    logical_batch: float  # expected examples per step, all workers together (q * N)
    sample_rate: float  # q, the same for every example and every worker
    steps: int
    noise_multiplier: float  # sigma
    max_grad_norm: float  # C
    delta: float
    target_epsilon: float | None
    accountant: str
    per_worker_examples: tuple[int, ...]  # N_w, the contiguous share of each worker

    @property
    def per_worker_batch(self) -> tuple[float, ...]:
        """Expected examples per step on each worker (q * N_w)."""
        return tuple(self.sample_rate * n for n in self.per_worker_examples)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on the summed clipped gradients of one logical batch."""
        return self.noise_multiplier * self.max_grad_norm

    @staticmethod
    def from_json(d: dict[str, Any]) -> DPPlan:
        """The plan from :meth:`to_json` (its derived keys are ignored)."""
        fields = {k: v for k, v in d.items() if k in DPPlan.__dataclass_fields__}
        return DPPlan(**fields | {"per_worker_examples": tuple(d["per_worker_examples"])})

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_worker_examples"] = list(self.per_worker_examples)
        d["per_worker_batch"] = list(self.per_worker_batch)
        d["noise_std"] = self.noise_std
        return d


def worker_share(examples: int, workers: int, rank: int) -> tuple[int, int]:
    """The contiguous example rows ``[lo, hi)`` of worker ``rank`` (sizes differ by at most one)."""
    return rank * examples // workers, (rank + 1) * examples // workers


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
) -> DPPlan:
    """Sample rate, steps and sigma of a run over ``examples`` (raises ValueError on impossible settings)."""
    if examples < workers:
        raise ValueError(f"{examples} training examples cannot be shared by {workers} workers")
    if logical_batch > examples:
        raise ValueError(f"training.dp.logical_batch {logical_batch} exceeds the {examples} training examples")
    q = logical_batch / examples
    steps = max(1, math.ceil(epochs / q))  # an epoch is 1/q steps in expectation
    if max_steps is not None:
        steps = min(steps, max_steps)
    if noise_multiplier is None:
        if target_epsilon is None:
            raise ValueError("training.dp needs target_epsilon or noise_multiplier")
        sigma = noise_multiplier_for(target_epsilon, delta, q, steps, accountant)
    else:
        sigma = float(noise_multiplier)
    shares = tuple(hi - lo for lo, hi in (worker_share(examples, workers, r) for r in range(workers)))
    return DPPlan(examples, workers, float(logical_batch), q, steps, sigma, max_grad_norm, delta,
                  target_epsilon, accountant, shares)  # fmt: skip


def poisson_sample(n: int, sample_rate: float, seed: int, step: int, rank: int) -> list[int]:
    """Indices in ``range(n)`` each kept with probability ``sample_rate``; seeded by (seed, step, rank)."""
    key = zlib.crc32(f"dp-sample\x1f{seed}\x1f{step}\x1f{rank}".encode())
    g = torch.Generator().manual_seed(key)
    return torch.nonzero(torch.rand(n, generator=g) < sample_rate).flatten().tolist()


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
    generator: torch.Generator | None = None,
) -> tuple[Any, Any]:
    """Wrap the model in ``GradSampleModule`` (hooks) and the optimizer in a (distributed) DPOptimizer.

    Every worker averages by the *global* expected batch (``q * N / W`` per worker, then the
    all-reduce's mean over ``W``): the update is (sum of clipped gradients + noise) / (q N).
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
        generator=generator,
    )
    return gsm, opt


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
