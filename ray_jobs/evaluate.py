"""Ray Data evaluation: per-document privacy metrics in an actor pool, aggregation on the driver.

Each actor builds the :class:`~ctrlgen.metrics.evaluate.Evaluator` once (the
fine-tuning set's ROUGE index and entity windows included) and scores its blocks
of generated rows with :meth:`Evaluator.document`; the driver collects the
per-document records, restores the input order and aggregates them with the same
:func:`~ctrlgen.metrics.evaluate.aggregate` as the local path, so both give the
same numbers (tested). Counts balance: records out = generated rows in, or the job
fails naming both counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ctrlgen.errors import CtrlgenError
from ctrlgen.metrics.evaluate import Evaluator, RealDoc

__all__ = ["EvalActor", "evaluate_rows"]

_IN = ["doc_id", "mode", "text", "context_ids", "status"]
_INDEX = "_i"  # the row's input position, carried through (blocks come back in any order)


class EvalActor:
    """Callable class for ``map_batches``: references indexed once, then one record per row."""

    def __init__(self, real: list[RealDoc], finetune_ids: list[str]) -> None:
        self.evaluator = Evaluator({d.doc_id: d for d in real}, finetune_ids)

    def __call__(self, batch: pa.Table) -> pa.Table:
        records = self.evaluator.table(batch.drop_columns([_INDEX]).to_pylist())
        return records.append_column(_INDEX, batch.column(_INDEX))


def evaluate_rows(
    rows: Sequence[dict[str, Any]],
    real: Sequence[RealDoc],
    finetune_ids: Sequence[str],
    num_actors: int = 2,
    block_rows: int = 4,
) -> list[dict[str, Any]]:
    """Per-document records of ``rows`` computed on the running Ray cluster (in input order)."""
    import ray

    if not rows:
        return []
    table = pa.Table.from_pylist([{c: r.get(c) for c in _IN} for r in rows])
    table = table.append_column(_INDEX, pa.array(range(len(rows)), pa.int64()))
    out = (
        ray.data.from_arrow(table)
        .repartition(target_num_rows_per_block=block_rows)
        .map_batches(
            EvalActor,
            fn_constructor_kwargs={"real": list(real), "finetune_ids": list(finetune_ids)},
            batch_size=block_rows,
            batch_format="pyarrow",
            num_cpus=0.5,
            compute=ray.data.ActorPoolStrategy(size=num_actors),
        )
        .take_all()
    )
    if len(out) != len(rows):
        raise CtrlgenError(f"evaluation returned {len(out)} records for {len(rows)} generated rows")
    out.sort(key=lambda r: r[_INDEX])
    return [{k: v for k, v in r.items() if k != _INDEX} for r in out]
