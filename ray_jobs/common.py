"""Pieces the jobs downstream of extraction share: their input, seeded samples, value sets."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, load_config
from ctrlgen.errors import CtrlgenError

__all__ = ["extraction_input", "has_code", "job_main", "reset_dir", "seeded_sample", "values_of"]


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


def _top_k(k: int, seed: int, salt: str) -> Any:
    """A map_batches function keeping the k rows of a batch with the smallest per-document hash."""

    from ctrlgen.generation.icl import row_seed

    def fn(batch: pa.Table) -> pa.Table:
        keys = pa.array([row_seed(seed, salt, d) for d in batch.column("doc_id").to_pylist()], pa.int64())
        batch = batch.append_column("_key", keys)
        return batch.sort_by("_key").slice(0, k)

    return fn


def seeded_sample(ds: Any, k: int, seed: int, salt: str, columns: list[str]) -> list[dict[str, Any]]:
    """The k rows with the smallest hash of (seed, salt, doc_id): a seeded sample, order-independent."""
    rows = ds.map_batches(_top_k(k, seed, salt), batch_format="pyarrow", batch_size=4096).take_all()
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
