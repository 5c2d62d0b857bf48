"""Ray metrics of the batch jobs (each node's Prometheus endpoint; the Ray dashboard's Metrics view).

=======================================  ===================  ==========================================
metric (Prometheus adds ``ray_``;        tags                 what
counters end in ``_total``)
=======================================  ===================  ==========================================
``ctrlgen_job_rows``                     job, status          rows processed (status ok | quarantined)
``ctrlgen_job_entities``                 category             private mentions found by extraction
``ctrlgen_job_tokens_generated``         mode                 new tokens generated (every attempt kept)
``ctrlgen_job_outputs_withheld``         mode                 outputs the release gate withheld
``ctrlgen_train_loss``                   run                  training loss of the last step (rank 0)
``ctrlgen_train_tokens_per_second``      run                  input tokens/s of the last step (all workers)
``ctrlgen_train_step``                   run                  last finished step
=======================================  ===================  ==========================================

Tags come from fixed vocabularies (job names, statuses, entity categories, modes, the run name of
the config): never document content. The per-table counting is plain Arrow
(:func:`extract_counts`, :func:`generate_counts`), so it is tested without Ray.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["extract_counts", "generate_counts", "job_metrics", "record_extract", "record_generate", "record_train"]


def extract_counts(table: pa.Table) -> tuple[Counter[str], Counter[str]]:
    """(rows by status, entities by category) of an extraction output table."""
    statuses = Counter(
        {str(v["values"]): int(v["counts"]) for v in pc.value_counts(table.column("status")).to_pylist()}
    )
    cats: Counter[str] = Counter()
    if "entities" in table.column_names and table.num_rows:
        flat = pc.list_flatten(table.column("entities"))
        if len(flat):
            for v in pc.value_counts(pc.struct_field(flat, "category")).to_pylist():
                cats[str(v["values"])] += int(v["counts"])
    return statuses, cats


def generate_counts(table: pa.Table) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(rows by status, new tokens by mode, withheld outputs by mode) of a generation output table."""
    statuses = Counter(
        {str(v["values"]): int(v["counts"]) for v in pc.value_counts(table.column("status")).to_pylist()}
    )
    tokens: Counter[str] = Counter()
    withheld: Counter[str] = Counter()
    for mode, n, status, released in zip(table.column("mode").to_pylist(), table.column("new_tokens").to_pylist(),
                                         table.column("status").to_pylist(), table.column("released").to_pylist(),
                                         strict=True):  # fmt: skip
        tokens[str(mode)] += int(n or 0)
        if status == "ok" and not released:
            withheld[str(mode)] += 1
    return statuses, tokens, withheld


class _JobMetrics:
    def __init__(self) -> None:
        from ray.util.metrics import Counter as RayCounter
        from ray.util.metrics import Gauge

        self.rows = RayCounter("ctrlgen_job_rows", description="Rows processed by a job.", tag_keys=("job", "status"))
        self.entities = RayCounter(
            "ctrlgen_job_entities", description="Private mentions found by extraction.", tag_keys=("category",)
        )
        self.tokens = RayCounter(
            "ctrlgen_job_tokens_generated", description="New tokens generated.", tag_keys=("mode",)
        )
        self.withheld = RayCounter(
            "ctrlgen_job_outputs_withheld", description="Outputs the release gate withheld.", tag_keys=("mode",)
        )
        self.loss = Gauge("ctrlgen_train_loss", description="Training loss of the last step.", tag_keys=("run",))
        self.tps = Gauge(
            "ctrlgen_train_tokens_per_second", description="Input tokens/s, all workers.", tag_keys=("run",)
        )
        self.step = Gauge("ctrlgen_train_step", description="Last finished training step.", tag_keys=("run",))


@functools.cache
def job_metrics() -> _JobMetrics:
    """The metrics of this process (made once, inside a Ray worker or driver)."""
    return _JobMetrics()


def _safe(fn: Any) -> Any:
    """Metrics never fail a job (for example outside Ray, or a metrics agent that is not up)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:  # observability must not break the data path
            pass

    return wrapper


@_safe
def record_extract(table: pa.Table) -> None:
    statuses, cats = extract_counts(table)
    m = job_metrics()
    for status, n in statuses.items():
        m.rows.inc(n, tags={"job": "extract", "status": status})
    for cat, n in cats.items():
        m.entities.inc(n, tags={"category": cat})


@_safe
def record_generate(table: pa.Table) -> None:
    statuses, tokens, withheld = generate_counts(table)
    m = job_metrics()
    for status, n in statuses.items():
        m.rows.inc(n, tags={"job": "generate", "status": status})
    for mode, n in tokens.items():
        if n:
            m.tokens.inc(n, tags={"mode": mode})
    for mode, n in withheld.items():
        m.withheld.inc(n, tags={"mode": mode})


@_safe
def record_train(run: str, step: int, loss: float, tokens_per_s: float) -> None:
    m = job_metrics()
    m.loss.set(loss, tags={"run": run})
    m.tps.set(tokens_per_s, tags={"run": run})
    m.step.set(step, tags={"run": run})
