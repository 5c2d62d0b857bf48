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
    <output_dir>/generated/_commits/<file id>      one per written block, after its files
    <output_dir>/generated/leakage.md, leakage.json

Every block the actors return holds all modes of its documents; :class:`GeneratedSink` gathers
blocks into files of at least ``generation.rows_per_file`` rows per mode (few, large files at MIMIC
scale), writes one file per mode, then commits them by a marker. With
``resume=True`` (the ``synthesize`` pipeline) a run that was killed continues: files
without a marker (a block cut mid-write) are deleted, and the documents of the committed
blocks are taken out of the targets by a filter actor that reads their ids from the
committed files itself (no id list on the driver), so no document is generated twice and
none is lost.

    python -m ray_jobs.generate --config configs/generate_physionet.yaml
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data import Datasink

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, fingerprint
from ctrlgen.errors import CtrlgenError

__all__ = [
    "GenerateActor",
    "GenerateSummary",
    "GeneratedSink",
    "LeakageTermsActor",
    "SkipDone",
    "main",
    "run",
    "score_output",
]

_COLUMNS = ["doc_id", "text", "control_code"]


def load_generation_engine(cfg: CtrlgenConfig, adapters: Mapping[str, str]) -> tuple[Any, Any]:
    """A generation actor's model and engine: ``generation.torch_threads``, the model (``generation.dtype`` over
    ``model.dtype``), each PEFT prefix adapter (name -> directory, ``s3://`` downloaded) loaded on it and held
    by the one engine under its name. Returns ``(engine, tokenizer)``.

    The PEFT model generates with the learned prefix (the bare base model would skip it); prompt learning leaves
    the base model itself untouched, so rows of the base model and of every adapter share the engine's batches.
    """
    import torch

    from ctrlgen.generation.factory import build_engine
    from ctrlgen.models import load_causal_lm

    g = cfg.generation
    if g.torch_threads:
        torch.set_num_threads(g.torch_threads)
    model_cfg = cfg.model if g.dtype is None else cfg.model.model_copy(update={"dtype": g.dtype})
    model, tokenizer = load_causal_lm(model_cfg)
    loaded = {}
    if adapters:
        from ctrlgen.training.prefix import load_prefix_model

        for name, path in adapters.items():
            with storage.local_copy(path) as local:  # PEFT reads local files only
                loaded[name] = load_prefix_model(model, local)
    engine = build_engine(model, tokenizer, g.sampling, model_cfg=model_cfg, batch_size=g.batch_size, adapters=loaded)
    return engine, tokenizer


class GenerateActor:
    """Callable class for ``map_batches``: loads the model once, then generates per batch."""

    def __init__(
        self,
        cfg_json: str,
        pool_rows: list[dict[str, Any]],
        exclude: Any,
        adapter: str | None = None,
        finetune: Any = None,
    ) -> None:
        from ctrlgen.fictional import FictionalCodes
        from ctrlgen.generation.icl import PREFIX_ADAPTER, build_pool

        self.cfg = CtrlgenConfig.model_validate_json(cfg_json)
        g = self.cfg.generation
        # The engine holds the adapter under PREFIX_ADAPTER: prefix rows and base-model rows share its batches.
        self.engine, self.tokenizer = load_generation_engine(self.cfg, {PREFIX_ADAPTER: adapter} if adapter else {})
        self.finetune = _resolve_index(finetune)  # one automaton, built by the driver, for every batch
        self.pool = build_pool(pool_rows, self.tokenizer, g.max_context_tokens)
        if isinstance(exclude, ray.ObjectRef):  # the corpus' values, merged by a task, fetched once
            exclude = ray.get(exclude)
        self.fictional = FictionalCodes(g.seed, exclude, same_counts=g.same_counts)
        self.done = 0
        self.banned: dict[str, Any] = {}  # a context's banned sequences, tokenised once per actor (the pool is fixed)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.generation.icl import generate_rows

        rows = batch.to_pylist()
        self.done += len(rows)

        def progress(line: str) -> None:
            print(f"[generate actor {os.getpid()}] {line} (documents so far: {self.done})", flush=True)

        from ray_jobs.metrics import record_generate

        cfg = self.cfg.generation
        out = generate_rows(
            rows, self.pool, self.engine, self.tokenizer, cfg, self.fictional, progress,
            finetune_values=self.finetune, banned_cache=self.banned,
        )  # fmt: skip
        record_generate(out)
        return out


def _merge_values_fn(*tables: pa.Table) -> list[str]:
    return sorted({v for t in tables for v in t.column("value").to_pylist()})


def _count_values_fn(values: list[str]) -> int:
    return len(values)


_merge_values = ray.remote(num_cpus=0.5)(_merge_values_fn)
_count_values = ray.remote(num_cpus=0.5)(_count_values_fn)


def _finetune_index_fn(path: str) -> tuple[Any, int]:
    from ctrlgen.generation.report import finetune_values
    from ctrlgen.metrics.leakage import ValueIndex

    index = ValueIndex(finetune_values(path))
    return index, len(index)


_finetune_index = ray.remote(num_cpus=0.5, num_returns=2)(_finetune_index_fn)


def finetune_index(path: str) -> tuple[Any, int]:
    """The fine-tuning set's value index (its control codes' values and their variants, one automaton), built
    by one task into the object store: the driver holds a reference and the number of values, never the values
    (a MIMIC-scale fine-tuning set has about a million). Generation and scoring share the one reference."""
    if not storage.parquet_files(path, within="status=ok"):
        raise CtrlgenError(f"{path} holds no training examples (the prefix mode needs `ctrlgen train`'s train_data)")
    ref, n = _finetune_index.remote(path)
    return ref, int(ray.get(n))


def _resolve_index(finetune: Any) -> Any:
    """An actor's fine-tuning value index: given, fetched from the object store, or empty."""
    import ray

    from ctrlgen.metrics.leakage import ValueIndex

    if isinstance(finetune, ray.ObjectRef):
        finetune = ray.get(finetune)
    return finetune if isinstance(finetune, ValueIndex) else ValueIndex(finetune or ())


class GeneratedSink(Datasink[None]):
    """One Parquet file per mode for each write task's rows, then a commit marker.

    A document's rows of every mode are in one actor block, so a committed file id holds
    whole documents; a task retried by Ray rewrites its own file id.
    """

    COMMITS = "_commits"  # a leading underscore: Arrow's dataset readers skip it

    def __init__(self, path: str, rows_per_file: int | None = None) -> None:
        import uuid

        self.path = str(path)
        self.write_id = uuid.uuid4().hex[:12]
        self.rows_per_file = rows_per_file

    @property
    def min_rows_per_write(self) -> int | None:
        """Ray Data gathers this many rows (whole actor blocks) before a write: few, large files."""
        return self.rows_per_file

    def write(self, blocks: Iterable[Any], ctx: Any) -> None:
        tables = [b for b in blocks if b.num_rows]
        if tables:
            self.write_table(self.path, pa.concat_tables(tables), f"{self.write_id}_{ctx.task_idx:06d}")

    @classmethod
    def write_table(cls, path: str, table: pa.Table, name: str) -> None:
        """Generated rows under ``path`` as file ``name``: one Parquet file per mode (``mode=<m>/<name>.parquet``),
        then the commit marker ``_commits/<name>`` (rows, documents)."""
        modes = table.column("mode")
        for mode in sorted(set(modes.to_pylist())):
            part = table.filter(pc.equal(modes, mode)).drop_columns(["mode"])
            storage.write_parquet(part, storage.join(path, f"mode={mode}", f"{name}.parquet"))
        docs = len(set(table.column("doc_id").to_pylist()))
        storage.write_text(
            storage.join(path, cls.COMMITS, name), json.dumps({"rows": table.num_rows, "documents": docs})
        )


class SkipDone:
    """map_batches: drop the targets whose rows are in the given committed files (read here, once)."""

    def __init__(self, files: list[str]) -> None:
        ids = [storage.parquet_file(f).read(columns=["doc_id"]).column("doc_id") for f in files]
        self.done = pa.chunked_array(ids, pa.string()).combine_chunks().unique() if ids else pa.array([], pa.string())

    def __call__(self, batch: pa.Table) -> pa.Table:
        return batch.filter(pc.invert(pc.is_in(batch.column("doc_id"), value_set=self.done)))


def _committed(out: str, cfg: CtrlgenConfig) -> tuple[list[str], int]:
    """Prepare ``out`` for a resumed run: (committed files of the first mode, documents done).

    Starts afresh (empty directory) when ``out`` was made with other settings.
    """
    from ray_jobs.common import reset_dir

    stamp = storage.join(out, "_settings.json")
    fp = fingerprint(cfg, ("generation", "model", "corpus"))  # a resumed output must come from the same settings
    if not storage.exists(stamp) or json.loads(storage.read_text(stamp)).get("fingerprint") != fp:
        reset_dir(out)
        storage.write_text(stamp, json.dumps({"fingerprint": fp}) + "\n")
        return [], 0
    commits = storage.join(out, GeneratedSink.COMMITS)
    done = {posixpath.basename(f): json.loads(storage.read_text(f)) for f in storage.list_files(commits)}
    written = storage.list_files(out, ".parquet")
    cut = [f for f in written if posixpath.basename(f).removesuffix(".parquet") not in done]
    for f in cut:  # a block cut mid-write: its documents are generated again
        storage.remove(f)
    first = f"/mode={cfg.generation.modes[0]}/"
    files = [f for f in written if first in f and f not in cut]
    if cut:
        print(f"generate: removed {len(cut)} uncommitted file(s) of an interrupted run", file=sys.stderr, flush=True)
    return files, sum(int(d["documents"]) for d in done.values())


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


def run(cfg: CtrlgenConfig, resume: bool = False, score: bool = True) -> GenerateSummary:
    """Extraction output -> pool, exclusion set, targets -> actor pool -> Parquet -> PIPP/ELP.

    ``resume``: continue an interrupted output of the same settings (see the module doc);
    ``score``: compute PIPP / ELP per mode (the pipeline runs it as its own stage).

    With ``generation.num_documents`` the sampled targets go to the actors in key order, in the same
    batches on every run: a row's sampled text depends slightly on its batch companions (padding in
    bf16), and an unknown-setting extraction's output files differ run to run. Over a whole corpus the
    batches follow the input's order, unsorted (a sort would shuffle the corpus once more).
    """
    from ray_jobs.common import ordered_execution

    with ordered_execution(cfg.generation.num_documents is not None):
        return _run(cfg, resume, score)


def _run(cfg: CtrlgenConfig, resume: bool, score: bool) -> GenerateSummary:
    import ray

    from ray_jobs.common import (
        count_eligible,
        even_pool,
        extraction_input,
        has_code,
        reset_dir,
        sample_in_key_order,
        seeded_sample,
        values_of,
    )
    from ray_jobs.runtime import init_ray

    g = cfg.generation
    t0 = time.perf_counter()
    adapter, finetune = None, None
    if "prefix" in g.modes:  # checked before anything runs
        adapter = storage.absolute(g.adapter or storage.join(cfg.output_dir, "adapter"))
        if not storage.exists(storage.join(adapter, "adapter_config.json")):
            raise CtrlgenError(f"the prefix mode needs a PEFT adapter; {adapter} has none (run `ctrlgen train` first)")
        ft_path = storage.absolute(g.finetune_data or storage.join(cfg.output_dir, "train_data"))
        if not storage.parquet_files(ft_path, within="status=ok"):
            raise CtrlgenError(
                f"{ft_path} holds no training examples (the prefix mode needs `ctrlgen train`'s train_data)"
            )
    src = extraction_input(cfg, g.input, "generation")
    ctx_src = extraction_input(cfg, g.context_input, "generation contexts") if g.context_input else src
    init_ray(cfg)
    n_finetune = 0
    if adapter is not None:
        finetune, n_finetune = finetune_index(ft_path)
    ds = ray.data.read_parquet(src).select_columns(_COLUMNS)
    ctx_ds = ray.data.read_parquet(ctx_src).select_columns(_COLUMNS) if ctx_src != src else ds
    # The corpus' distinct private values (fictional codes never use them): per-block sets merged
    # by one task into the object store; the driver holds only references, never the values.
    value_refs = ds.map_batches(values_of, batch_format="pyarrow").to_arrow_refs()
    if ctx_src != src:
        value_refs += ctx_ds.map_batches(values_of, batch_format="pyarrow").to_arrow_refs()
    exclude = _merge_values.remote(*value_refs)
    n_exclude = ray.get(_count_values.remote(exclude))
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
        # Exact seeded top-k, the rows staying in the cluster (only k hashes reach the driver).
        # In key order (see run): the same batches whatever the input's file layout.
        targets = sample_in_key_order(eligible, g.num_documents, g.seed, "targets", _COLUMNS)
    else:
        targets = eligible
    out = storage.join(storage.absolute(cfg.output_dir), "generated")
    done_files, n_done = _committed(out, cfg) if resume else ([], 0)
    if not resume:
        reset_dir(out)
    if done_files:
        targets = targets.map_batches(
            SkipDone, fn_constructor_kwargs={"files": done_files}, batch_format="pyarrow",
            num_cpus=0.25, compute=ray.data.ActorPoolStrategy(size=1),
        )  # fmt: skip
    if done_files or g.num_documents is not None:
        n_targets = targets.count()  # sampled targets are materialized; a resumed run counts what is left
    else:
        n_targets = count_eligible(src, g.require_code)  # one small column, not the pipeline again
    if resume and n_done:
        print(f"generate: resuming: {n_done:,} documents already generated, {n_targets:,} to go",
              file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"generate: {n_targets:,} target documents, pool {len(pool)}, {n_exclude:,} real private values "
        f"excluded from fictional codes, modes {', '.join(g.modes)}"
        + (f", adapter {adapter} ({n_finetune:,} fine-tuning values)" if adapter else ""),
        file=sys.stderr,
        flush=True,
    )
    per_block = g.batch_size  # one generate call per block: blocks spread evenly over the actors
    out_ds = targets.repartition(target_num_rows_per_block=per_block, strict=True).map_batches(
        GenerateActor,
        fn_constructor_kwargs={
            "cfg_json": cfg.model_dump_json(),
            "pool_rows": pool,
            "exclude": exclude,
            "adapter": adapter,
            "finetune": finetune,  # one automaton, built by a task, shared
        },
        batch_size=per_block,
        batch_format="pyarrow",
        num_cpus=g.actor_num_cpus,
        num_gpus=g.actor_num_gpus or None,
        compute=even_pool(g.num_actors),
    )
    if n_targets:
        out_ds.write_datasink(GeneratedSink(out, g.rows_per_file * len(g.modes)))
    total = n_targets + n_done
    if not score:
        rows = _check(_count_rows(out), total, g.modes, out)
        return GenerateSummary(total, rows, 0, "(scored by a later stage)", time.perf_counter() - t0, out)
    summary = score_output(cfg, out, (finetune, n_finetune) if finetune is not None else None, total)
    summary.seconds = time.perf_counter() - t0
    return summary


class LeakageTermsActor:
    """map_batches: the per-row leakage terms of generated rows (the fine-tuning index is built
    once per actor, from values put in the object store once by the driver)."""

    def __init__(self, finetune: Any) -> None:
        self.index = _resolve_index(finetune)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.generation.report import leakage_terms

        terms = leakage_terms(batch.to_pylist(), self.index)
        return pa.Table.from_pylist(terms, schema=_TERMS_SCHEMA)


def _terms_schema() -> pa.Schema:
    from ctrlgen.generation.report import TERM_COLUMNS, VALUE_COLUMNS

    return pa.schema(
        [("mode", pa.string())]
        + [(c, pa.float64()) for c in TERM_COLUMNS]
        + [(c, pa.list_(pa.string())) for c in VALUE_COLUMNS]
    )


_TERMS_SCHEMA = _terms_schema()


def _explode_values(batch: pa.Table) -> pa.Table:
    """(mode, column, value) for every leaked value of every row (fine-tuning modes only have any)."""
    from ctrlgen.generation.report import VALUE_COLUMNS

    parts = []
    for c in VALUE_COLUMNS:
        col = batch.column(c)
        idx = pc.list_parent_indices(col)
        parts.append(
            pa.table({
                "mode": batch.column("mode").take(idx),
                "kind": pa.array([c] * len(idx), pa.string()),
                "value": pc.list_flatten(col),
            })
        )  # fmt: skip
    return pa.concat_tables(parts)


def _generated_dataset(out: str) -> Any:
    import ray

    files = storage.list_files(out, ".parquet")
    if not files:
        raise CtrlgenError(f"{out} holds no generated Parquet files (run `ctrlgen generate` first)")
    from ray.data.datasource import Partitioning

    return ray.data.read_parquet(files, partitioning=Partitioning("hive", base_dir=out))


def _counts(ds: Any) -> dict[str, tuple[int, int]]:
    """mode -> (rows, distinct documents), aggregated by Ray Data (no row reaches the driver)."""
    from ray.data.aggregate import Count, CountDistinct

    got = ds.select_columns(["mode", "doc_id"]).groupby("mode").aggregate(Count(), CountDistinct("doc_id")).take_all()
    return {str(r["mode"]): (int(r["count()"]), int(r["count_distinct(doc_id)"])) for r in got}


def _check(counts: dict[str, tuple[int, int]], targets: int, modes: Sequence[str], out: str) -> int:
    """Counts balance: one row per (target, mode), none twice. Returns the number of rows."""
    rows = sum(n for n, _ in counts.values())
    if set(counts) - set(modes) or rows != targets * len(modes) or any(n != targets for n, _ in counts.values()):
        per_mode = ", ".join(f"{m} {n}" for m, (n, _) in sorted(counts.items()))
        raise CtrlgenError(f"{targets} targets x {len(modes)} modes but rows per mode {per_mode or 'none'} in {out}")
    twice = sum(n - d for n, d in counts.values())
    if twice:
        raise CtrlgenError(f"{twice} (document, mode) rows written twice to {out}")
    return rows


def _count_rows(out: str) -> dict[str, tuple[int, int]]:
    return _counts(_generated_dataset(out)) if storage.list_files(out, ".parquet") else {}


def score_output(cfg: CtrlgenConfig, out: str, finetune: Any = None, targets: int | None = None) -> GenerateSummary:
    """PIPP / ELP per mode of a generation output; writes leakage.md / .json beside it.

    ``finetune``: the fine-tuning values (a list), or :func:`finetune_index`'s (reference, count); None
    builds the index from ``generation.finetune_data`` when the prefix mode is scored.

    Distributed: actors compute each row's leakage terms (:func:`ctrlgen.generation.report.leakage_terms`,
    the fine-tuning values matched by one automaton per actor), Ray Data sums them per mode and
    counts distinct leaked values; the driver only sees one row per mode.
    """
    import ray
    from ray.data.aggregate import CountDistinct, Sum

    from ctrlgen.generation.report import (
        FINETUNE_MODES,
        TERM_COLUMNS,
        leakage_from_terms,
        leakage_table,
    )
    from ctrlgen.metrics.leakage import ValueIndex
    from ray_jobs.runtime import init_ray

    t0 = time.perf_counter()
    g = cfg.generation
    init_ray(cfg)
    if finetune is None and "prefix" in g.modes:
        finetune = finetune_index(storage.absolute(g.finetune_data or storage.join(cfg.output_dir, "train_data")))
    if isinstance(finetune, tuple):  # (reference, count): built by a task
        index_ref, n_values = finetune
    else:
        index = ValueIndex(finetune or ())
        index_ref, n_values = (ray.put(index) if len(index) else None), len(index)
    ds = _generated_dataset(out)
    counts = _counts(ds)
    n = targets if targets is not None else max((d for _, d in counts.values()), default=0)
    rows = _check(counts, n, g.modes, out)
    terms = ds.map_batches(
        LeakageTermsActor,
        fn_constructor_kwargs={"finetune": index_ref},  # built once, shared
        batch_format="pyarrow",
        batch_size=256,
        num_cpus=0.5,
        compute=ray.data.ActorPoolStrategy(size=max(1, min(g.num_actors, 4))),
    ).materialize()
    sums = {
        str(r["mode"]): {c: float(r[f"sum({c})"] or 0) for c in TERM_COLUMNS}
        for r in terms.groupby("mode").aggregate(*(Sum(c) for c in TERM_COLUMNS)).take_all()
    }
    distinct: dict[str, dict[str, int]] = {}
    if any(m in FINETUNE_MODES for m in sums):
        exploded = terms.select_columns(["mode", "values_first", "values_released"]).map_batches(
            _explode_values, batch_format="pyarrow"
        )
        for r in exploded.groupby(["mode", "kind"]).aggregate(CountDistinct("value")).take_all():
            distinct.setdefault(str(r["mode"]), {})[str(r["kind"])] = int(r["count_distinct(value)"])
    stats = leakage_from_terms(sums, distinct, n_values)
    table = leakage_table(stats)
    storage.write_text(storage.join(out, "leakage.md"), table + "\n")
    storage.write_text(storage.join(out, "leakage.json"), leakage_table(stats, "json") + "\n")
    quarantined = sum(s.quarantined for s in stats)
    return GenerateSummary(n, rows, quarantined, table, time.perf_counter() - t0, out, stats)


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("generate", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
