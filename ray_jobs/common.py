"""Pieces the jobs downstream of extraction share: their input, seeded samples, value sets."""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, load_config
from ctrlgen.errors import CtrlgenError

__all__ = [
    "even_pool",
    "extraction_input",
    "has_code",
    "job_main",
    "ordered_execution",
    "reset_dir",
    "sample_in_key_order",
    "sample_threshold",
    "seeded_sample",
    "seeded_sample_ds",
    "values_of",
]


def extraction_input(cfg: CtrlgenConfig, given: str | None, job: str) -> str:
    """The status=ok extraction Parquet directory (a path or URI): ``given``, or the extraction
    job's fresh output."""
    from ray_jobs.extract import run as run_extract

    if given is None:
        print(f"{job}: no input given; running the extraction job first", file=sys.stderr, flush=True)
        ext = run_extract(cfg)
        print(ext.text(), file=sys.stderr, flush=True)
        src = ext.output
    else:
        src = storage.absolute(given)
    if storage.is_dir(storage.join(src, "status=ok")):
        src = storage.join(src, "status=ok")
    if not storage.parquet_files(src):
        raise CtrlgenError(f"{job} input {src} holds no Parquet files (run `ctrlgen extract` first)")
    return src


def even_pool(size: int) -> Any:
    """An actor pool of ``size`` that spreads batches over all its actors: one batch in flight per actor.

    Ray Data's default queues up to 4 batches on an actor; the first actor of a pool to finish starting
    then takes every batch of a small dataset (2 ICL batches of 16 notes: ~165 s on one actor while the
    other idled, ``ctrlgen experiment`` log of 2026-11-24). For pools whose batches take seconds or more
    (generation, anonymisation, the semantic attack, shard scoring) one in flight costs nothing.
    """
    from ray.data import ActorPoolStrategy

    return ActorPoolStrategy(size=size, max_tasks_in_flight_per_actor=1)


@contextmanager
def ordered_execution(on: bool = True) -> Iterator[None]:
    """Ray Data keeps block order in the datasets created inside the block (``preserve_order``).

    The context is bound when a dataset is read, so wrap everything from the read to the write.
    With :func:`sample_in_key_order` and ``repartition(..., strict=True)`` the same sampled rows then
    make the same batches whatever the input's file layout (Ray Data's default
    yields blocks in completion order, and an extraction's output files differ run to run).
    """
    import ray.data

    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = on or before
    try:
        yield
    finally:
        ctx.execution_options.preserve_order = before


def reset_dir(path: str) -> str:
    """Remove a previous output of a job (the jobs rewrite their outputs whole); any path or URI."""
    storage.remove(path)
    return path


def values_of(batch: pa.Table) -> pa.Table:
    """map_batches: the distinct private values of the batch's control codes (column ``value``)."""
    from ctrlgen.codes import parse_control_code
    from ctrlgen.fictional import code_values

    vals = {v for code in batch.column("control_code").to_pylist() for v in code_values(parse_control_code(code or ""))}
    return pa.table({"value": pa.array(sorted(vals), pa.string())})


def has_code(batch: pa.Table) -> pa.Table:
    """map_batches: keep rows with a non-empty control code."""
    codes = pc.fill_null(batch.column("control_code"), "")
    return batch.filter(pc.not_equal(codes, ""))


def count_eligible(src: Any, require_code: bool) -> int:
    """How many extraction rows at ``src`` a job takes (those with a control code when ``require_code``), reading
    only the ``control_code`` column: counting the job's own dataset would run its whole read again, texts and
    all (a corpus-sized second pass)."""
    import ray

    ds = ray.data.read_parquet(src).select_columns(["control_code"])
    return int((ds.map_batches(has_code, batch_format="pyarrow") if require_code else ds).count())


def _keyed(seed: int, salt: str, keep_below: int | None = None, top: int | None = None) -> Any:
    """A map_batches function adding the per-document hash ``_key``; optionally keeping the rows
    with ``_key <= keep_below``, or only the ``top`` smallest keys (and no other column)."""
    from ctrlgen.generation.icl import row_seed

    def fn(batch: pa.Table) -> pa.Table:
        keys = pa.array([row_seed(seed, salt, d) for d in batch.column("doc_id").to_pylist()], pa.int64())
        if top is not None:
            return pa.table({"_key": pc.take(keys, pc.sort_indices(keys)[:top])})
        batch = batch.append_column("_key", keys)
        return batch if keep_below is None else batch.filter(pc.less_equal(keys, keep_below))

    return fn


def sample_threshold(ds: Any, k: int, seed: int, salt: str) -> int | None:
    """The k-th smallest per-document hash of ``ds`` (None when it has at most k rows).

    Only hashes travel: every block sends its k smallest (8 bytes each), and the driver keeps
    a heap of k while streaming them, so its memory is O(k) whatever the corpus size.
    """
    heap: list[int] = []  # max-heap of the k smallest so far (negated)
    for batch in (
        ds.select_columns(["doc_id"])
        .map_batches(_keyed(seed, salt, top=k), batch_format="pyarrow", batch_size=4096)
        .iter_batches(batch_format="pyarrow", batch_size=None)
    ):
        for key in batch.column("_key").to_pylist():
            if len(heap) < k:
                heapq.heappush(heap, -key)
            elif key < -heap[0]:
                heapq.heapreplace(heap, -key)
    return -heap[0] if len(heap) == k and k > 0 else None


def seeded_sample_ds(ds: Any, k: int, seed: int, salt: str) -> Any:
    """The rows with the k smallest hashes of (seed, salt, doc_id), as a dataset (order-independent,
    exact, and nothing but k hashes on the driver). A ``_key`` column is added."""
    threshold = sample_threshold(ds, k, seed, salt)
    return ds.map_batches(_keyed(seed, salt, keep_below=threshold), batch_format="pyarrow", batch_size=4096)


def sample_in_key_order(ds: Any, k: int, seed: int, salt: str, columns: list[str]) -> Any:
    """:func:`seeded_sample_ds` sorted by key and materialized in the object store (not on the driver).

    Under :func:`ordered_execution`, ``repartition(n, strict=True)`` then cuts the same blocks of n rows
    on every run. Materialized because a streaming repartition straight after a sort does not cut
    exact blocks (Ray 2.60: blocks of 1-16 rows for n = 16; tests/integration/test_generate_job.py).
    """
    return seeded_sample_ds(ds, k, seed, salt).sort("_key").select_columns(columns).materialize()


def seeded_sample(ds: Any, k: int, seed: int, salt: str, columns: list[str]) -> list[dict[str, Any]]:
    """:func:`seeded_sample_ds` brought to the driver in key order (for small k: context pools)."""
    rows = seeded_sample_ds(ds, k, seed, salt).take_all()
    rows.sort(key=lambda r: r["_key"])
    return [{c: r[c] for c in columns} for r in rows[:k]]


def job_main(name: str, doc: str | None, run: Callable[[CtrlgenConfig], Any], argv: list[str] | None) -> int:
    """``python -m ray_jobs.<name> --config FILE key.sub=value ...``: run the job, print its summary."""
    ap = argparse.ArgumentParser(
        prog=f"python -m ray_jobs.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", "-c", default=None)
    ap.add_argument("overrides", nargs="*", metavar="key.sub=value")
    args = ap.parse_args(argv)
    try:
        summary = run(load_config(args.config, args.overrides))
    except CtrlgenError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    print(summary.text())
    return 0
