"""Ray Train job: prefix tuning with the privacy-masked loss, on DeepSpeed (METHOD.md section 5).

Reads the extraction output (runs the extraction job first when
``training.input`` is not set), then:

1. tokenises (control code -> document) pairs with their per-token privacy mask
   in a Ray Data actor pool and writes them, quarantined rows included, to
   ``<output_dir>/train_data/status=.../*.parquet`` (counts in = ok + quarantined);
2. trains a PEFT prefix (``training.num_virtual_tokens``) on
   ``training.num_workers`` Ray Train workers (``TorchTrainer``) with DeepSpeed
   (``training.deepspeed``, ZeRO-2 by default; gloo on CPU, NCCL on GPUs), each
   worker reading only its own contiguous share of the examples (the row groups that
   overlap it, straight from storage: no worker reads what it does not train on);
3. prints every ``log_every`` steps the loss terms, tokens/s and step time, and
   checkpoints every ``checkpoint_every`` steps to
   ``<storage_path>/<run_name>`` (DeepSpeed state of the trainable prefix +
   optimizer, the PEFT adapter, the metric history). Re-running the same run
   resumes from its latest checkpoint (``training.resume``);
4. copies the final adapter (standard PEFT format) to ``<output_dir>/adapter``
   and the metric history to ``<output_dir>/training/``.

    python -m ray_jobs.train --config configs/train_physionet.yaml
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import ConfigError, CtrlgenError

if TYPE_CHECKING:
    from ctrlgen.training.data import ExampleLayout

__all__ = [
    "TokenizeActor",
    "TrainSummary",
    "deepspeed_config",
    "dp_train_loop_per_worker",
    "main",
    "run",
    "train_loop_per_worker",
]

_COLUMNS = ["doc_id", "text", "metadata", "entities", "control_code"]  # metadata: the patient id
_TRAIN_COLUMNS = ("input_ids", "labels", "private")
_TOKENIZE_BATCH = 256  # documents per tokeniser call
# Documents per block of the tokenising pass: the driver keeps state per block (Ray Data's executor), so small
# blocks grow it with the corpus (blocks of 256: +50 MB from 200k to 2M documents; of 4,096: flat).
_TOKENIZE_BLOCK = 4096
_ROWS_PER_FILE = 20_000  # examples a write task gathers (one file per tokeniser block: 14,000 files at 2M notes)
_STATE = "train_state.json"
_HISTORY = "metrics.jsonl"
_MANIFEST = "manifest.json"
_COUNTS = "counts.json"


class TokenizeActor:
    """Callable class for ``map_batches``: the tokenizer is loaded once per actor."""

    def __init__(self, cfg_json: str) -> None:
        from ctrlgen.models import load_tokenizer

        self.cfg = CtrlgenConfig.model_validate_json(cfg_json)
        self.tokenizer = load_tokenizer(self.cfg.model)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.training.data import encode_rows

        t = self.cfg.training
        return encode_rows(batch.to_pylist(), self.tokenizer, t.max_doc_tokens, t.max_code_tokens)


def deepspeed_config(path: str, batch_size: int, world_size: int) -> dict[str, Any]:
    """Read the DeepSpeed JSON config and fill its ``"auto"`` batch sizes from ``training``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"training.deepspeed: DeepSpeed config {p} does not exist")
    try:
        ds = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"training.deepspeed: {p} is not valid JSON ({exc})") from None
    if not isinstance(ds, dict):
        raise ConfigError(f"training.deepspeed: {p} must hold a JSON object")
    if "optimizer" in ds:
        raise ConfigError(
            f"training.deepspeed: {p} declares an optimizer; ctrlgen passes a torch AdamW over the prefix "
            "(a DeepSpeed optimizer would compile fused_adam first, ~60 s on CPU)"
        )
    accum = ds.get("gradient_accumulation_steps", 1)
    if accum == "auto":
        accum = ds["gradient_accumulation_steps"] = 1
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = batch_size
    if ds.get("train_batch_size", "auto") == "auto":
        ds["train_batch_size"] = ds["train_micro_batch_size_per_gpu"] * int(accum) * world_size
    return ds


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def _report(metrics: dict[str, Any], write: Any) -> None:
    """``ray.train.report`` with a checkpoint staged in a temporary directory that is gone afterwards.

    ``write(dir)`` fills the directory and says whether this rank has a checkpoint part. The report
    persists it to the run's storage before returning (Ray Train's default, synchronous upload), so
    nothing stays behind in the worker's temp space (thousands of directories over a long run otherwise).
    """
    import ray.train
    from ray.train import Checkpoint

    with tempfile.TemporaryDirectory(prefix="ctrlgen-ckpt-") as d:
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d) if write(d) else None)


def _save(engine: Any, state: dict[str, Any], history: list[dict[str, Any]], rank: int, d: str) -> bool:
    """Every rank writes its DeepSpeed shard (trainable params only) into ``d``; rank 0 adds adapter and history."""
    engine.save_checkpoint(d, tag="deepspeed", client_state=state, exclude_frozen_parameters=True)
    # Every rank calls save_pretrained (under ZeRO-3 a rank-0-only call hangs); only rank 0 writes.
    engine.module.save_pretrained(os.path.join(d, "adapter"), is_main_process=rank == 0)
    if rank == 0:
        Path(d, _STATE).write_text(json.dumps(state), encoding="utf-8")
        _write_jsonl(Path(d, _HISTORY), history)
    return True


@dataclass
class _Worker:
    """What both training loops set up the same way on each Ray Train worker."""

    cfg: CtrlgenConfig
    rank: int
    world: int
    device: Any
    model: Any  # the PEFT prefix model
    tok: Any
    params: list[Any]  # the trainable (prefix) parameters
    optimizer: Any  # torch AdamW over ``params``

    def say(self, line: str) -> None:
        if self.rank == 0:
            # Not print(): Ray Train patches it to tee into its logger, and each line shows twice.
            sys.stderr.write(f"[train] {line}\n")
            sys.stderr.flush()


def _worker(config: dict[str, Any]) -> _Worker:
    """Config, rank, threads and seed; the prefix model on Ray Train's device; AdamW over the prefix."""
    import ray.train
    import ray.train.torch
    import torch

    from ctrlgen.models import load_causal_lm
    from ctrlgen.training.prefix import adapter_model

    cfg = CtrlgenConfig.model_validate_json(config["cfg_json"])
    t = cfg.training
    ctx = ray.train.get_context()
    if t.torch_threads:
        torch.set_num_threads(t.torch_threads)
    torch.manual_seed(t.seed)
    # Ray Train's device for this worker: its GPU with use_gpu (NCCL), else the CPU (gloo).
    device = ray.train.torch.get_device()
    base, tok = load_causal_lm(cfg.model, device=device)
    model = adapter_model(base, t, tok)  # a prefix (text-initialised) or LoRA
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)
    return _Worker(cfg, ctx.get_world_rank(), ctx.get_world_size(), device, model, tok, params, optimizer)


def _report_ingest(w: _Worker, ingest: Any, path: str) -> None:
    """What each rank read (rows, compressed bytes): rank 0 writes the list for the job's summary."""
    import torch
    import torch.distributed as dist

    read = torch.tensor([w.rank, ingest.rows, ingest.bytes], dtype=torch.float64, device=w.device)
    everyone = [torch.zeros_like(read) for _ in range(w.world)]
    dist.all_gather(everyone, read)
    per_rank = [{"rank": int(x[0]), "rows": int(x[1]), "bytes": int(x[2])} for x in (e.cpu() for e in everyone)]
    if w.rank == 0:
        storage.write_text(path, json.dumps(per_rank) + "\n")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs (config: the CtrlgenConfig JSON and the job's plan)."""
    import deepspeed
    import ray.train
    import torch
    import torch.distributed as dist

    from ctrlgen.training.data import IngestCount, collate, epoch_batches
    from ctrlgen.training.prefix import batch_loss, loss_weights
    from ray_jobs.metrics import record_train

    w = _worker(config)
    t, rank, world, device, say = w.cfg.training, w.rank, w.world, w.device, w.say
    model, tok, optimizer = w.model, w.tok, w.optimizer
    say(f"DeepSpeed initialise on {world} worker(s) (a first run compiles its CPU comm op, about a minute)")
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config["deepspeed"])
    weights = loss_weights(t)

    step, history = 0, []
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            _, client = engine.load_checkpoint(d, tag="deepspeed", load_module_strict=False)
            step = int(client["step"])
            history = _read_jsonl(Path(d, _HISTORY))
        say(f"resumed from the checkpoint at step {step}")
    steps_per_epoch, total = config["steps_per_epoch"], config["total_steps"]
    say(
        f"{total} steps ({steps_per_epoch} per epoch, {world} x {t.batch_size} documents per step), variant {t.variant}"
    )
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    layout = [(f, list(groups)) for f, groups in config["layout"]]
    ingest = IngestCount()

    start = step
    while step < total:
        epoch, skip = divmod(step, steps_per_epoch)
        # One contiguous slice of the examples, another each epoch, reshuffled (seeded by training.seed and
        # the epoch): the rank reads only those row groups, and a resumed epoch starts at the batch not trained.
        local = skip - 1
        for arrays in epoch_batches(layout, rank, world, steps_per_epoch, t.batch_size, epoch, t.seed,
                                    _TRAIN_COLUMNS, skip, ingest):  # fmt: skip
            if step >= total:
                break
            local += 1
            batch = {k: v.to(device, non_blocking=True) for k, v in collate(
                arrays["input_ids"], arrays["labels"], arrays["private"], pad).items()}  # fmt: skip
            t0 = time.perf_counter()
            terms = batch_loss(engine.module, batch, weights, t.reduction, forward=engine)
            engine.backward(terms.total)
            engine.step()
            # One tensor on the worker's device (NCCL reduces only CUDA tensors), one host read after.
            counts = torch.tensor([terms.tokens, terms.private_tokens], dtype=torch.float64, device=device)
            n_in = batch["attention_mask"].sum().to(torch.float64).reshape(1)
            losses = torch.stack([torch.as_tensor(x, device=device).detach().to(torch.float64).reshape(())
                                  for x in (terms.total, terms.lm, terms.contrastive, terms.kl)])  # fmt: skip
            sums = torch.cat([counts, n_in, losses * max(terms.tokens, 1)])
            dist.all_reduce(sums)  # across workers: token counts, token-weighted loss terms
            sums = sums.cpu()
            seconds = time.perf_counter() - t0
            step += 1
            n_out = max(float(sums[0]), 1.0)
            rec = {
                "step": step, "epoch": epoch + 1, "loss": float(sums[3]) / n_out + 0.0, "lm": float(sums[4]) / n_out,
                "contrastive": float(sums[5]) / n_out + 0.0, "kl": float(sums[6]) / n_out + 0.0,
                "output_tokens": int(sums[0]), "private_tokens": int(sums[1]), "input_tokens": int(sums[2]),
                "step_seconds": seconds, "tokens_per_s": float(sums[2]) / seconds,
            }  # fmt: skip
            history.append(rec)
            if rank == 0:
                record_train(t.run_name, step, rec["loss"], rec["tokens_per_s"])
            if step % t.log_every == 0 or step == total:
                say(
                    f"step {step}/{total} epoch {epoch + 1}: loss {rec['loss']:.4f} (lm {rec['lm']:.4f}, "
                    f"contrastive {rec['contrastive']:.4f}, kl {rec['kl']:.4f}), {rec['tokens_per_s']:.0f} tokens/s, "
                    f"{seconds:.2f} s/step"
                )
            if step % t.checkpoint_every == 0 or step == total:
                state = {"step": step, "epoch": epoch + 1, "resumed_from": start}
                _report({k: rec[k] for k in ("step", "loss", "lm", "contrastive", "kl")},
                        functools.partial(_save, engine, state, history, rank))  # fmt: skip
        if step < total and local + 1 < steps_per_epoch:
            raise CtrlgenError(f"worker {rank}: the examples ran out after {local + 1} of {steps_per_epoch} batches")
    _report_ingest(w, ingest, config["ingest_path"])


_DP_STATE = "dp_state.pt"


def _save_dp(params: list[Any], optimizer: Any, state: dict[str, Any], history: list[dict[str, Any]],
             model: Any, rank: int, d: str) -> bool:  # fmt: skip
    """Rank 0 writes the prefix, AdamW state, accountant state and history into ``d`` (every rank holds the same)."""
    import torch

    if rank != 0:
        return False
    torch.save({"params": [p.detach().cpu() for p in params], "optimizer": optimizer.state_dict()},
               os.path.join(d, _DP_STATE))  # fmt: skip
    with torch.no_grad():  # PEFT runs the prefix encoder to save it: no activation for Opacus's hooks
        model.save_pretrained(os.path.join(d, "adapter"))
    Path(d, _STATE).write_text(json.dumps(state), encoding="utf-8")
    _write_jsonl(Path(d, _HISTORY), history)
    return True


def dp_train_loop_per_worker(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs in the ``dp`` variant (ctrlgen.training.dp): DP-SGD with Opacus.

    Worker ``w`` holds the notes of its contiguous share of the privacy units (patients, or single
    notes) in memory and draws, every step, a Poisson sample of its units at the run's rate ``q``
    from the OS's secure random source; the drawn units' notes go through micro-batches of
    ``training.batch_size``, their per-note gradients are summed per unit, each unit's sum is clipped
    to C, and rank 0 adds the noise before the all-reduce. Torch DDP's process group from Ray Train,
    no DeepSpeed.
    """
    import warnings

    import ray.train
    import torch
    import torch.distributed as dist

    from ctrlgen.training.data import IngestCount, collate, read_rows
    from ctrlgen.training.dp import (
        DPPlan,
        UnitGradients,
        choose_notes,
        clip_factor_norms,
        dp_randomness,
        epsilon_spent,
        make_private,
        observed_noise_std,
        per_example_lm_loss,
        poisson_sample,
        unit_members,
        worker_share,
    )
    from ray_jobs.metrics import record_train

    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # frozen inputs: expected
    plan_json = dict(config["dp_plan"])
    plan = DPPlan.from_json(plan_json)
    w = _worker(config)
    t, rank, world, device, say = w.cfg.training, w.rank, w.world, w.device, w.say
    model, tok, params, optimizer = w.model, w.tok, w.params, w.optimizer
    # OS entropy; the config seed only with training.dp.reproducible_noise (a run stamped not private).
    randomness = dp_randomness(plan.reproducible_noise, t.seed)
    gsm, dp_opt = make_private(model, optimizer, plan, distributed=world > 1, randomness=randomness)
    clipped_sums: list[torch.Tensor] = []
    if t.dp.audit_noise:  # keep this worker's clipped sums before the noise goes on (see observed_noise_std)
        add_noise = dp_opt.add_noise

        def add_noise_audited() -> None:
            clipped_sums[:] = [p.summed_grad.detach().clone() for p in dp_opt.params]
            add_noise()

        dp_opt.add_noise = add_noise_audited

    step, history = 0, []
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            saved = torch.load(os.path.join(d, _DP_STATE), map_location=device)
            with torch.no_grad():
                for p, v in zip(params, saved["params"], strict=True):
                    p.copy_(v)
            optimizer.load_state_dict(saved["optimizer"])
            saved_state = json.loads(Path(d, _STATE).read_text())
            step = int(saved_state["step"])
            history = _read_jsonl(Path(d, _HISTORY))
        if saved_state.get("plan") != plan_json:
            raise CtrlgenError(
                f"run {t.run_name} was started with another DP-SGD plan (units, workers, sampling rate, sigma, "
                "steps or randomness): resuming it would break its accounting; set training.resume=false or another "
                "run_name"
            )
        say(f"resumed from the checkpoint at step {step}")
    lo, hi = worker_share(plan.units, world, rank)
    members = unit_members(config["dp_units"], lo, hi)  # this worker's units: the example rows of each
    mine = sorted(r for m in members for r in m)
    ingest = IngestCount()
    layout = [(f, list(groups)) for f, groups in config["layout"]]
    rows = read_rows(layout, mine, _TRAIN_COLUMNS, ingest, as_arrays=True)  # NumPy views, not Python ints
    local = {r: i for i, r in enumerate(mine)}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    say(
        f"DP-SGD per {plan.unit}: {plan.units} {plan.unit}s ({plan.examples} notes), {plan.steps} steps, q "
        f"{plan.sample_rate:.4g} (expected {plan.logical_batch:g} {plan.unit}s per step, "
        f"{', '.join(f'{b:.1f}' for b in plan.per_worker_batch)} per worker), sigma {plan.noise_multiplier:.4g}, "
        f"C {plan.max_grad_norm:g}, micro-batches of {t.batch_size} notes"
        + ("; NOT PRIVATE: reproducible noise from training.seed" if plan.reproducible_noise else "")
    )
    cap = t.dp.max_notes_per_patient if plan.unit == "patient" else None
    start = step
    while step < plan.steps:
        t0 = time.perf_counter()
        randomness.start_step(step)
        drawn = poisson_sample(hi - lo, plan.sample_rate, randomness, rank)  # this worker's unit indices
        # (unit slot, local row) of every note of the drawn units
        picked = [(slot, local[r]) for slot, u in enumerate(drawn)
                  for r in choose_notes(members[u], cap, randomness, f"notes{rank}/{u}")]  # fmt: skip
        units = UnitGradients(dp_opt, len(drawn))
        loss_sum = tokens = n_in = 0.0
        for j in range(0, len(picked), t.batch_size):
            chunk = picked[j : j + t.batch_size]
            batch = {k: v.to(device, non_blocking=True) for k, v in collate(
                [rows["input_ids"][i] for _, i in chunk], [rows["labels"][i] for _, i in chunk],
                [rows["private"][i] for _, i in chunk], pad).items()}  # fmt: skip
            logits = gsm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            per_example = per_example_lm_loss(logits, batch["labels"])
            per_example.mean().backward()
            units.add([slot for slot, _ in chunk])  # every note's gradient into its unit's sum
            loss_sum += float(per_example.detach().sum())
            tokens += float((batch["labels"][:, 1:] != -100).sum())
            n_in += float(batch["attention_mask"].sum())
        units.load()
        clipped = float((clip_factor_norms(dp_opt) > plan.max_grad_norm).sum())
        dp_opt.step()  # clip each unit's sum to C, add the noise (rank 0), all-reduce, AdamW
        sums = torch.tensor([len(picked), loss_sum, tokens, n_in, clipped, len(drawn)], dtype=torch.float64,
                            device=device)  # fmt: skip
        dist.all_reduce(sums)
        noise_std = None
        if t.dp.audit_noise:
            flat = torch.cat([s.flatten() for s in clipped_sums]).to(torch.float64)
            dist.all_reduce(flat)  # the clipped sum of the whole logical batch
            parts, k = [], 0
            for s in clipped_sums:
                parts.append(flat[k : k + s.numel()])
                k += s.numel()
            noise_std = observed_noise_std([p.grad for p in dp_opt.params], parts, plan.logical_batch)
        dp_opt.zero_grad()
        sums = sums.cpu()
        seconds = time.perf_counter() - t0
        step += 1
        drawn_total, units_total = int(sums[0]), int(sums[5])
        loss = float(sums[1]) / max(drawn_total, 1)
        rec = {
            "step": step, "epoch": step * plan.sample_rate, "loss": loss, "lm": loss, "contrastive": 0.0, "kl": 0.0,
            "examples": drawn_total, "units": units_total, "clipped_share": float(sums[4]) / max(units_total, 1),
            "output_tokens": int(sums[2]), "private_tokens": 0, "input_tokens": int(sums[3]),
            "noise_std": noise_std, "expected_noise_std": plan.noise_std,
            "step_seconds": seconds, "tokens_per_s": float(sums[3]) / seconds,
        }  # fmt: skip
        history.append(rec)
        if rank == 0:
            record_train(t.run_name, step, rec["loss"], rec["tokens_per_s"])
        if step % t.log_every == 0 or step == plan.steps:
            eps = epsilon_spent(plan.noise_multiplier, plan.sample_rate, step, plan.delta, plan.accountant)
            audit = f", noise std {noise_std:.4g} (sigma C {plan.noise_std:.4g})" if noise_std is not None else ""
            say(
                f"step {step}/{plan.steps}: loss {loss:.4f}, {units_total} {plan.unit}s ({drawn_total} notes), "
                f"{rec['clipped_share']:.0%} clipped{audit}, epsilon {eps:.3g}, "
                f"{rec['tokens_per_s']:.0f} tokens/s, {seconds:.2f} s/step"
            )
        if step % t.checkpoint_every == 0 or step == plan.steps:
            eps = epsilon_spent(plan.noise_multiplier, plan.sample_rate, step, plan.delta, plan.accountant)
            state = {"step": step, "epoch": rec["epoch"], "resumed_from": start, "epsilon": eps, "plan": plan_json}
            _report({k: rec[k] for k in ("step", "loss", "lm", "contrastive", "kl")},
                    functools.partial(_save_dp, params, optimizer, state, history, model, rank))  # fmt: skip
    _report_ingest(w, ingest, config["ingest_path"])


@dataclass
class TrainSummary:
    documents: int
    examples: int
    quarantined: int
    steps: int
    resumed_from: int
    adapter: str
    seconds: float
    final: dict[str, Any] = field(default_factory=dict)
    mean_step_seconds: float = 0.0
    mean_tokens_per_s: float = 0.0
    ingest: list[dict[str, int]] = field(default_factory=list)  # per rank: rows and bytes of examples read
    privacy: dict[str, Any] = field(default_factory=dict)  # dp variant: the plan and the epsilon spent

    def text(self) -> str:
        f = self.final
        loss = (
            f"final loss {f['loss']:.4f} (lm {f['lm']:.4f}, contrastive {f['contrastive']:.4f}, kl {f['kl']:.4f})"
            if f
            else "no step run in this invocation"
        )
        return (
            f"documents {self.documents:,} -> examples {self.examples:,} (quarantined {self.quarantined:,})\n"
            f"steps {self.steps} (resumed from {self.resumed_from}); {loss}\n"
            f"mean {self.mean_step_seconds:.2f} s/step, {self.mean_tokens_per_s:.0f} tokens/s\n"
            + (
                "examples read per worker: "
                + ", ".join(f"rank {r['rank']} {r['rows']:,} rows / {r['bytes']:,} B" for r in self.ingest)
                + "\n"
                if self.ingest
                else ""
            )
            + (
                f"DP-SGD: epsilon {self.privacy['epsilon']:.3g} spent at delta {self.privacy['delta']:g} "
                f"per {self.privacy['unit']} (target {self.privacy['target_epsilon']}), sigma "
                f"{self.privacy['noise_multiplier']:.4g}, C {self.privacy['max_grad_norm']:g}, q "
                f"{self.privacy['sample_rate']:.4g} of {self.privacy['units']} {self.privacy['unit']}s, "
                f"{self.privacy['steps_taken']} steps\n"
                + ("NOT PRIVATE: " + self.privacy["not_private"] + "\n" if "not_private" in self.privacy else "")
                if self.privacy
                else ""
            )
            + f"adapter written to {self.adapter} in {self.seconds:.1f} s"
        )


def _layout(data_dir: str) -> ExampleLayout:
    """The examples in training order (file names sort in write order) and their row groups, from the
    footers: each rank reads its own share straight from storage (see the loops)."""
    from ctrlgen.training.data import example_layout

    return example_layout(storage.list_files(storage.join(data_dir, "status=ok"), ".parquet"))


def _rows(layout: ExampleLayout) -> int:
    return sum(sum(groups) for _, groups in layout)


def _check_layout(layout: ExampleLayout, ok: int, data_dir: str) -> None:
    """The example files hold the rows counted when they were written (a resumed run's files can have
    changed on storage since)."""
    found = _rows(layout)
    if found != ok:
        raise CtrlgenError(
            f"{data_dir} holds {found} examples but {ok} were written: set training.resume=false to tokenise again"
        )


def _resolve(path: str) -> str:
    """Paths in configs are relative to the working directory, else to the project root."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p.resolve())
    root = Path(__file__).resolve().parent.parent / path
    return str(root) if root.exists() else str(p)


def _manifest(cfg: CtrlgenConfig) -> dict[str, Any]:
    """What the training examples depend on (paths and settings, no text)."""
    from ctrlgen.training.data import TRAIN_SCHEMA

    t = cfg.training
    return {
        "columns": TRAIN_SCHEMA.names,
        "corpus": cfg.corpus.model_dump(mode="json"),
        "extraction": cfg.extraction.setting,
        "input": storage.absolute(t.input) if t.input else None,
        "model": cfg.model.name,
        "data": t.model_dump(
            mode="json", include={"max_doc_tokens", "max_code_tokens", "num_documents", "require_code", "seed"}
        ),
    }


def _read_manifest(data_dir: str) -> dict[str, Any] | None:
    try:
        return json.loads(storage.read_text(storage.join(data_dir, _MANIFEST)))  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


def _tokenize(cfg: CtrlgenConfig, src: str, data_dir: str) -> tuple[int, ExampleLayout, int]:
    """Extraction rows -> training examples (Parquet by status); returns documents, the examples' layout
    (their count is its rows) and the quarantined count."""
    import ray
    from ray.data.datasource import FilenameProvider

    from ray_jobs.common import count_eligible, has_code, ordered_execution, sample_in_key_order

    class _Ordered(FilenameProvider):  # file names sort in write-task order
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"examples-{task_index:06}-{write_uuid}.parquet"

    t = cfg.training
    with ordered_execution():  # same input, same examples in the same order
        ds = ray.data.read_parquet(src).select_columns(_COLUMNS)
        eligible = ds.map_batches(has_code, batch_format="pyarrow") if t.require_code else ds
        if t.num_documents is not None:
            # key order: the same examples in the same order whatever the input's file layout
            docs = sample_in_key_order(eligible, t.num_documents, t.seed, "train", _COLUMNS)
        else:
            docs = eligible
        docs.repartition(target_num_rows_per_block=_TOKENIZE_BLOCK).map_batches(
            TokenizeActor,
            fn_constructor_kwargs={"cfg_json": cfg.model_dump_json()},
            batch_size=min(_TOKENIZE_BATCH, _TOKENIZE_BLOCK),
            batch_format="pyarrow",
            num_cpus=0.5,
            compute=ray.data.ActorPoolStrategy(size=t.tokenize_actors),  # preserve_order keeps the order
        ).write_parquet(
            data_dir,
            partition_cols=["status"],
            filename_provider=_Ordered(),
            min_rows_per_file=_ROWS_PER_FILE,
            # Small row groups: a rank reads only those overlapping its share (waste < 16 batches).
            row_group_size=16 * t.batch_size,
        )
    # sampled documents are materialized (a cheap count); the whole input is counted from one small column
    n_docs = docs.count() if t.num_documents is not None else count_eligible(src, t.require_code)
    layout = _layout(data_dir)
    ok = _rows(layout)
    bad = storage.parquet_rows(storage.list_files(storage.join(data_dir, "status=quarantined"), ".parquet"))
    if ok + bad != n_docs:
        raise CtrlgenError(f"{n_docs} documents in but {ok} examples + {bad} quarantined written to {data_dir}")
    return n_docs, layout, bad


def _dp_plan(cfg: CtrlgenConfig, layout: ExampleLayout, examples: int) -> tuple[Any, list[int]]:
    """The DP-SGD plan over the run's privacy units, and the unit of every example (in training order)."""
    from ctrlgen.training.data import rank_batches
    from ctrlgen.training.dp import dp_plan, privacy_units

    t, d = cfg.training, cfg.training.dp
    patients = next(rank_batches(layout, 0, examples, examples, ("patient",)))["patient"] if examples else []
    try:
        units = privacy_units(patients, d.unit)
        plan = dp_plan(examples, t.num_workers, d.logical_batch, t.epochs, t.max_steps, d.max_grad_norm, d.delta,
                       d.target_epsilon, d.noise_multiplier, d.accountant, unit=units.unit, units=units.count,
                       reproducible_noise=d.reproducible_noise)  # fmt: skip
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"train: DP privacy unit: {units.unit} ({units.why}; training.dp.unit={d.unit}): {units.count} "
          f"{units.unit}s, {examples} notes", file=sys.stderr, flush=True)  # fmt: skip
    return plan, list(units.of_example)


def _privacy(plan: Any, steps: int) -> dict[str, Any]:
    """The guarantee of a finished DP run: its plan and the epsilon of the steps it took."""
    from ctrlgen.training.dp import NOT_PRIVATE, epsilon_spent

    eps = epsilon_spent(plan.noise_multiplier, plan.sample_rate, steps, plan.delta, plan.accountant)
    out = {**plan.to_json(), "steps_taken": steps, "epsilon": eps,
           "mechanism": f"DP-SGD (Opacus), Poisson sampling of {plan.unit}s, one clipped gradient per {plan.unit}",
           "randomness": "training.seed (reproducible_noise)" if plan.reproducible_noise else "os.urandom"}  # fmt: skip
    if plan.reproducible_noise:
        out["not_private"] = NOT_PRIVATE
    return out


def run(cfg: CtrlgenConfig) -> TrainSummary:
    """Extraction output -> tokenised pairs (Parquet) -> TorchTrainer + DeepSpeed -> adapter."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_jobs.common import extraction_input, reset_dir
    from ray_jobs.runtime import init_ray

    t = cfg.training
    t0 = time.perf_counter()
    dp = t.variant == "dp"
    ds_config = None if dp else deepspeed_config(_resolve(t.deepspeed), t.batch_size, t.num_workers)
    out = storage.absolute(cfg.output_dir)
    store = storage.absolute(t.storage_path) if t.storage_path else storage.join(out, "ray_train")
    if not t.resume:
        reset_dir(storage.join(store, t.run_name))
    data_dir = storage.join(out, "train_data")
    manifest = _manifest(cfg)
    reuse = storage.is_dir(storage.join(store, t.run_name))
    if reuse and _read_manifest(data_dir) != manifest:
        raise CtrlgenError(
            f"run {t.run_name} in {store} was trained on other examples than this config makes (or "
            f"{data_dir} is gone): set training.resume=false to start it afresh, or another training.run_name"
        )
    if reuse:  # a resumed run trains on exactly the examples (and order) it started with
        counts = json.loads(storage.read_text(storage.join(data_dir, _COUNTS)))
        n_docs, ok, bad = counts["documents"], counts["ok"], counts["quarantined"]
        print(f"train: resuming run {t.run_name}: reusing the examples in {data_dir}", file=sys.stderr, flush=True)
        layout = _layout(data_dir)
        _check_layout(layout, ok, data_dir)
    else:
        src = extraction_input(cfg, t.input, "train")
        init_ray(cfg)
        n_docs, layout, bad = _tokenize(cfg, src, reset_dir(data_dir))
        ok = _rows(layout)
        counts = {"documents": n_docs, "ok": ok, "quarantined": bad}
        storage.write_text(storage.join(data_dir, _COUNTS), json.dumps(counts) + "\n")
        storage.write_text(storage.join(data_dir, _MANIFEST), json.dumps(manifest, indent=2) + "\n")
    init_ray(cfg)
    storage.makedirs(store)
    plan, dp_units = _dp_plan(cfg, layout, ok) if dp else (None, None)
    steps_per_epoch = ok // t.batch_size // t.num_workers  # full rounds of one batch per worker
    if plan is not None:
        total = plan.steps
    elif steps_per_epoch == 0:
        raise CtrlgenError(
            f"{ok} training examples cannot fill one step of {t.num_workers} workers x {t.batch_size} documents"
        )
    else:
        total = min(t.epochs * steps_per_epoch, t.max_steps or t.epochs * steps_per_epoch)
    print(
        f"train: {n_docs:,} documents -> {ok:,} examples ({bad:,} quarantined); {total} steps on "
        f"{t.num_workers} worker(s), variant {t.variant}",
        file=sys.stderr,
        flush=True,
    )
    trainer = TorchTrainer(
        dp_train_loop_per_worker if dp else train_loop_per_worker,
        train_loop_config={
            "cfg_json": cfg.model_dump_json(),
            "deepspeed": ds_config,
            "dp_plan": plan.to_json() if plan is not None else None,
            "dp_units": dp_units,  # the privacy unit of every example (dp variant)
            "steps_per_epoch": steps_per_epoch,
            "total_steps": total,
            "layout": layout,
            "ingest_path": storage.join(out, "training", "ingest.json"),
        },
        scaling_config=ScalingConfig(
            num_workers=t.num_workers, use_gpu=t.use_gpu, resources_per_worker={"CPU": t.cpus_per_worker}
        ),
        run_config=RunConfig(
            name=t.run_name,
            storage_path=store,  # a local path or a URI: Ray Train writes checkpoints through pyarrow.fs
            checkpoint_config=CheckpointConfig(num_to_keep=t.keep_checkpoints),
            failure_config=FailureConfig(max_failures=t.max_failures),
            worker_runtime_env={"env_vars": dict(t.worker_env)},
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise CtrlgenError(f"training run {t.run_name} ended without a checkpoint in {store}")
    adapter = storage.join(out, "adapter")
    logs = storage.join(out, "training")
    with result.checkpoint.as_directory() as d:
        storage.upload(os.path.join(d, "adapter"), adapter)
        history = _read_jsonl(Path(d, _HISTORY))
        final_state = json.loads(Path(d, _STATE).read_text())
    storage.write_text(storage.join(logs, _HISTORY), "".join(json.dumps(r) + "\n" for r in history))
    ingest_file = storage.join(logs, "ingest.json")
    ingest = json.loads(storage.read_text(ingest_file)) if storage.exists(ingest_file) else []
    steps = int(final_state["step"])
    resumed_from = int(final_state.get("resumed_from", 0))
    this_run = [h for h in history if h["step"] > resumed_from]
    summary = TrainSummary(
        documents=n_docs,
        examples=ok,
        quarantined=bad,
        steps=steps,
        resumed_from=resumed_from,
        adapter=adapter,
        seconds=time.perf_counter() - t0,
        final=this_run[-1] if this_run else {},
        ingest=ingest,
    )
    if plan is not None:
        summary.privacy = _privacy(plan, steps)
        for where in (adapter, logs):  # beside the adapter: generation from it is post-processing
            storage.write_text(storage.join(where, "privacy.json"), json.dumps(summary.privacy, indent=2) + "\n")
    timed = this_run[1:] or this_run  # the first step includes one-off warm-up
    if timed:
        summary.mean_step_seconds = sum(h["step_seconds"] for h in timed) / len(timed)
        summary.mean_tokens_per_s = sum(h["tokens_per_s"] for h in timed) / len(timed)
    storage.write_text(storage.join(logs, "summary.json"), json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("train", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
