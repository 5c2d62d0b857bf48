"""Ray Data job: ICL synthetic-text generation with batched hard token blocking.

Reads the extraction output (documents with control codes; runs the extraction
job first when ``generation.input`` is not set), then:

1. collects the corpus' distinct private values (fictional codes never use them);
2. draws a seeded context pool and, with ``generation.num_documents``, a seeded
   sample of target documents (per-block top-k of a per-document hash: no shuffle);
3. streams the targets through an actor pool of generators (the model is loaded
   once per actor) running :func:`ctrlgen.generation.icl.generate_rows` for every
   mode (baseline, icl, icl_blocking) with the release gate;
4. writes Parquet partitioned by mode and prints PIPP / ELP per mode.

    <output_dir>/generated/mode=<mode>/*.parquet   one row per (document, mode)
    <output_dir>/generated/leakage.md, leakage.json

    python -m ray_jobs.generate --config configs/generate_physionet.yaml
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError

__all__ = ["GenerateActor", "GenerateSummary", "main", "run"]

_COLUMNS = ["doc_id", "text", "control_code"]


class GenerateActor:
    """Callable class for ``map_batches``: loads the model once, then generates per batch."""

    def __init__(
        self,
        cfg_json: str,
        pool_rows: list[dict[str, Any]],
        exclude: list[str],
        adapter: str | None = None,
        finetune: list[str] | None = None,
    ) -> None:
        import torch

        from ctrlgen.fictional import FictionalCodes
        from ctrlgen.generation.engine import HFEngine
        from ctrlgen.generation.icl import build_pool
        from ctrlgen.models import load_causal_lm

        self.cfg = CtrlgenConfig.model_validate_json(cfg_json)
        g = self.cfg.generation
        if g.torch_threads:
            torch.set_num_threads(g.torch_threads)
        model, self.tokenizer = load_causal_lm(self.cfg.model)
        self.engine = HFEngine(model, self.tokenizer, g.sampling, g.batch_size)
        self.prefix_engine = None
        if adapter is not None:
            from ctrlgen.training.prefix import load_prefix_model

            # The PEFT model generates with the learned prefix (the bare base model would skip it);
            # prompt learning leaves the base model itself untouched for the other modes.
            tuned = load_prefix_model(model, adapter)
            self.prefix_engine = HFEngine(tuned, self.tokenizer, g.sampling, g.batch_size)
        self.finetune = finetune or []
        self.pool = build_pool(pool_rows, self.tokenizer, g.max_context_tokens)
        self.fictional = FictionalCodes(g.seed, exclude, same_counts=g.same_counts)
        self.done = 0

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.generation.icl import generate_rows

        rows = batch.to_pylist()
        self.done += len(rows)

        def progress(line: str) -> None:
            print(f"[generate actor {os.getpid()}] {line} (documents so far: {self.done})", flush=True)

        cfg = self.cfg.generation
        return generate_rows(
            rows, self.pool, self.engine, self.tokenizer, cfg, self.fictional, progress,
            prefix_engine=self.prefix_engine, finetune_values=self.finetune,
        )  # fmt: skip


@dataclass
class GenerateSummary:
    targets: int
    rows_out: int
    quarantined: int
    table: str
    seconds: float = 0.0
    output: str = ""
    by_mode: list[Any] = field(default_factory=list)

    def text(self) -> str:
        return (
            f"targets {self.targets:,} x modes -> rows {self.rows_out:,} (quarantined {self.quarantined:,})\n"
            f"{self.table}\nwritten to {self.output} in {self.seconds:.1f} s"
        )


def run(cfg: CtrlgenConfig) -> GenerateSummary:
    """Extraction output -> pool, exclusion set, targets -> actor pool -> Parquet -> PIPP/ELP."""
    import ray

    from ctrlgen.generation.report import finetune_values, leakage_by_mode, leakage_table, read_generated
    from ray_jobs.common import extraction_input, has_code, reset_dir, seeded_sample, values_of
    from ray_jobs.extract import init_ray

    g = cfg.generation
    t0 = time.perf_counter()
    adapter, finetune = None, None
    if "prefix" in g.modes:  # checked before anything runs
        adapter = Path(g.adapter or Path(cfg.output_dir) / "adapter").resolve()
        if not (adapter / "adapter_config.json").is_file():
            raise CtrlgenError(f"the prefix mode needs a PEFT adapter; {adapter} has none (run `ctrlgen train` first)")
        finetune = finetune_values(g.finetune_data or Path(cfg.output_dir) / "train_data")
    src = extraction_input(cfg, g.input, "generation")
    ctx_src = extraction_input(cfg, g.context_input, "generation contexts") if g.context_input else src
    init_ray(cfg)
    ds = ray.data.read_parquet(str(src)).select_columns(_COLUMNS)
    ctx_ds = ray.data.read_parquet(str(ctx_src)).select_columns(_COLUMNS) if ctx_src != src else ds
    exclude = ds.map_batches(values_of, batch_format="pyarrow").unique("value")
    if ctx_src != src:
        exclude = sorted(set(exclude) | set(ctx_ds.map_batches(values_of, batch_format="pyarrow").unique("value")))
    eligible = ds.map_batches(has_code, batch_format="pyarrow") if g.require_code else ds
    ctx_eligible = ctx_ds.map_batches(has_code, batch_format="pyarrow") if g.require_code else ctx_ds
    icl = any(m != "prefix" for m in g.modes)
    pool = seeded_sample(ctx_eligible, g.context_pool_size, g.seed, "pool", _COLUMNS) if icl else []
    if icl and len(pool) < g.n_context + 1:
        raise CtrlgenError(
            f"only {len(pool)} eligible documents in {ctx_src}; ICL needs at least {g.n_context + 1} "
            "(documents without a control code are skipped when generation.require_code is true)"
        )
    if g.num_documents is not None:
        targets = ray.data.from_items(seeded_sample(eligible, g.num_documents, g.seed, "targets", _COLUMNS))
    else:
        targets = eligible
    n_targets = targets.count()
    print(
        f"generate: {n_targets:,} target documents, pool {len(pool)}, {len(exclude):,} real private values "
        f"excluded from fictional codes, modes {', '.join(g.modes)}"
        + (f", adapter {adapter} ({len(finetune or []):,} fine-tuning values)" if adapter else ""),
        file=sys.stderr,
        flush=True,
    )
    per_block = g.batch_size  # one generate call per block: blocks spread evenly over the actors
    out_ds = targets.repartition(target_num_rows_per_block=per_block).map_batches(
        GenerateActor,
        fn_constructor_kwargs={
            "cfg_json": cfg.model_dump_json(),
            "pool_rows": pool,
            "exclude": list(exclude),
            "adapter": str(adapter) if adapter else None,
            "finetune": finetune,
        },
        batch_size=per_block,
        batch_format="pyarrow",
        num_cpus=g.actor_num_cpus,
        compute=ray.data.ActorPoolStrategy(size=g.num_actors),
    )
    out = reset_dir(Path(cfg.output_dir).resolve() / "generated")
    out_ds.write_parquet(str(out), partition_cols=["mode"])
    rows = read_generated(out)
    stats = leakage_by_mode(rows, finetune)
    table = leakage_table(stats)
    (out / "leakage.md").write_text(table + "\n", encoding="utf-8")
    (out / "leakage.json").write_text(leakage_table(stats, "json") + "\n", encoding="utf-8")
    quarantined = sum(s.quarantined for s in stats)
    if len(rows) != n_targets * len(g.modes):
        raise CtrlgenError(f"{n_targets} targets x {len(g.modes)} modes but {len(rows)} rows written to {out}")
    return GenerateSummary(n_targets, len(rows), quarantined, table, time.perf_counter() - t0, str(out), stats)


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("generate", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
