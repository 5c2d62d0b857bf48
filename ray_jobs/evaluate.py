"""The evaluation job: per-document privacy metrics of a generation output, references sharded.

    ctrlgen evaluate -c configs/generate_tiny.yaml                  # here
    ctrlgen submit evaluate -c configs/generate_tiny.yaml           # on a Ray cluster

Reads a generation output (``evaluation.input``), the real documents with their private
values and spans (``evaluation.references``, an extraction output) and, when there are
prefix rows, the adapter's training examples (``evaluation.finetune_data``: their doc_ids
pick the fine-tuning references). Writes under ``evaluation.output``:

* ``records/*.parquet``: one record per generated row (:data:`~ctrlgen.metrics.evaluate.RECORD_SCHEMA`);
* ``metrics.json`` / ``metrics.md``: PIPP, PIPP over long values, ELP, ROUGE-2/L, entity-in-context
  leakage k=1..4 per mode (docs/evaluation.md defines them).

Nothing corpus-sized reaches the driver or any one actor:

1. the references are written once as ``num_shards`` hive partitions (``shard=k``, a hash of
   doc_id), ICL references and fine-tuning references apart; only the references some output
   needs are kept (a semi-join on the ids the ICL rows name as contexts and the fine-tuning ids,
   written per shard first): ICL outputs of a whole corpus reference only the context pool;
2. each generated row is sent to the shards that hold its context documents (a fine-tuning
   row to every shard);
3. the rows are sorted by shard and scored in batches by an actor pool (as many actors as the
   cluster has CPUs unless ``evaluation.num_actors`` says): an actor loads the shards its batches
   name (ROUGE index, entity windows, value index; one shard at a time) and scores each
   row against what the shard holds (:class:`~ctrlgen.metrics.evaluate.ShardEvaluator`);
4. ``groupby(doc_id, mode)`` merges a row's partials (:func:`~ctrlgen.metrics.evaluate.merge_partials`:
   union, maximum, any), checking every context document was found;
5. per-mode sums of :func:`~ctrlgen.metrics.evaluate.record_terms` and ``CountDistinct`` of the
   fine-tuning modes' leaked values give the metrics (the same as the local
   :func:`~ctrlgen.metrics.evaluate.aggregate`, tested).

Counts balance: records = generated rows, or the job fails naming both counts.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.metrics.context import KS
from ctrlgen.metrics.evaluate import (
    PARTIAL_SCHEMA,
    RECORD_SCHEMA,
    TERMS,
    RealDoc,
    ShardEvaluator,
    merge_partials,
    metrics_from_sums,
    record_terms,
    rouge_sample_rate,
    shard_of,
)

__all__ = [
    "EvaluateSummary",
    "ReferenceShards",
    "ShardScorer",
    "default_actors",
    "evaluate",
    "main",
    "metrics_table",
    "run",
    "shard_references",
]

_IN = ["doc_id", "mode", "text", "context_ids", "status"]
_REF_COLUMNS = ["doc_id", "text", "entities"]
_ROWS_PER_FILE = 100_000  # written files gather at least this many rows (few, large files at MIMIC scale)


def _say(msg: str) -> None:
    print(f"evaluate: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ReferenceShards:
    """References written as hive partitions ``shard=k`` (``icl/`` and ``finetune/``)."""

    path: str
    num_shards: int
    n_finetune_values: int  # distinct normalised values of the fine-tuning references
    rouge_rate: float = 1.0  # the share of fine-tuning references a fine-tuning output's ROUGE is taken over

    def shard_dir(self, kind: str, k: int) -> str:
        return storage.join(self.path, kind, f"shard={k}")


def _with_shard(n: int) -> Any:
    def fn(batch: pa.Table) -> pa.Table:
        ids = batch.column("doc_id").to_pylist()
        return batch.append_column("shard", pa.array([shard_of(d, n) for d in ids], pa.int32()))

    return fn


def _read_shard(d: str, columns: list[str]) -> pa.Table | None:
    files = storage.parquet_files(d) if storage.is_dir(d) else []
    return storage.dataset(files).to_table(columns=columns) if files else None


def _finetune_shards(path: str, from_ids: bool) -> Any:
    """map_batches over shard numbers: (with ``from_ids``) write each shard's fine-tuning
    references, its ICL references whose doc_id is a fine-tuning id; emit the shard's normalised
    fine-tuning values, how many ids found no reference and how many fine-tuning documents it holds."""
    from ctrlgen.metrics.leakage import normalize_value

    def fn(batch: pa.Table) -> pa.Table:
        values: set[str] = set()
        missing = docs = 0
        for k in batch.column("shard").to_pylist():
            ft_dir = storage.join(path, "finetune", f"shard={k}")
            if from_ids:
                ids_t = _read_shard(storage.join(path, "finetune_ids", f"shard={k}"), ["doc_id"])
                if ids_t is None:
                    continue
                ids = pc.unique(ids_t.column("doc_id"))
                refs = _read_shard(storage.join(path, "icl", f"shard={k}"), _REF_COLUMNS)
                refs = refs.filter(pc.is_in(refs.column("doc_id"), value_set=ids)) if refs is not None else None
                found = len(pc.unique(refs.column("doc_id"))) if refs is not None else 0
                missing += len(ids) - found
                if refs is not None and refs.num_rows:
                    storage.write_parquet(refs, storage.join(ft_dir, "part-0.parquet"))
            else:
                refs = _read_shard(ft_dir, _REF_COLUMNS)
            docs += len(pc.unique(refs.column("doc_id"))) if refs is not None else 0
            for row in refs.to_pylist() if refs is not None else []:
                values.update(normalize_value(v) for v in RealDoc.from_row(row).values if v.strip())
        vals = sorted(values)
        return pa.table({"value": pa.array([*vals, None], pa.string()),
                         "missing": pa.array([0] * len(vals) + [missing], pa.int64()),
                         "docs": pa.array([0] * len(vals) + [docs], pa.int64())})  # fmt: skip

    return fn


def _context_ids(n: int) -> Any:
    """map_batches: one row (doc_id, shard) per context document named by an ok ICL output."""
    from ctrlgen.generation.report import FINETUNE_MODES

    def fn(batch: pa.Table) -> pa.Table:
        ids = [c for m, st, ctx in zip(batch.column("mode").to_pylist(), batch.column("status").to_pylist(),
                                       batch.column("context_ids").to_pylist(), strict=True)
               if st == "ok" and m not in FINETUNE_MODES for c in ctx or []]  # fmt: skip
        ids = sorted(set(map(str, ids)))
        return pa.table({"doc_id": pa.array(ids, pa.string()),
                         "shard": pa.array([shard_of(d, n) for d in ids], pa.int32())})  # fmt: skip

    return fn


@functools.lru_cache(maxsize=8)
def _shard_ids(dirs: tuple[str, ...]) -> frozenset[str]:
    """The doc_ids written under these shard directories (cached in the worker: every block of the
    references asks for the same few shards)."""
    ids: set[str] = set()
    for d in dirs:
        t = _read_shard(d, ["doc_id"])
        if t is not None:
            ids.update(map(str, t.column("doc_id").to_pylist()))
    return frozenset(ids)


def _keep_referenced(path: str, n: int, kinds: tuple[str, ...]) -> Any:
    """map_batches over references: keep the rows whose doc_id was written under ``kinds`` (``icl_ids``,
    ``finetune_ids``) in its shard: a semi-join that reads, per block, only the id lists of its shards."""

    def fn(batch: pa.Table) -> pa.Table:
        ids = [str(d) for d in batch.column("doc_id").to_pylist()]
        keep = [d in _shard_ids(tuple(storage.join(path, kind, f"shard={shard_of(d, n)}") for kind in kinds))
                for d in ids]  # fmt: skip
        return batch.filter(pa.array(keep, pa.bool_()))

    return fn


def shard_references(
    icl: Any,
    path: str,
    num_shards: int,
    finetune: Any | None = None,
    finetune_ids: Any | None = None,
    referenced: Any | None = None,
    rouge_sample: int | None = None,
) -> ReferenceShards:
    """Write the references (extraction rows: doc_id, text, entities) as ``num_shards`` shards under ``path``.

    The fine-tuning references are either their own dataset (``finetune``: the experiment's
    fine-tuning notes carry planted canaries) or the ICL references whose doc_id is in
    ``finetune_ids`` (a dataset with a ``doc_id`` column: the adapter's training examples),
    selected shard by shard. With ``referenced`` (the generated rows to score), only the ICL
    references those rows name as contexts (and the ``finetune_ids``) are written: the rest of the
    corpus is read once and dropped. ``rouge_sample``: fine-tuning outputs' ROUGE over a seeded sample of
    about this many fine-tuning references when there are more (:func:`~ctrlgen.metrics.evaluate.rouge_sample_rate`).
    Raises when fine-tuning ids have no reference.
    """
    import ray
    from ray.data.aggregate import CountDistinct, Sum

    storage.remove(path)
    path = storage.absolute(path)

    def write(ds: Any, kind: str, columns: list[str]) -> None:
        ds.select_columns(columns).map_batches(_with_shard(num_shards), batch_format="pyarrow").write_parquet(
            storage.join(path, kind), partition_cols=["shard"], min_rows_per_file=_ROWS_PER_FILE
        )  # a write task gathers rows first: files per shard, not per read block x shard

    if finetune_ids is not None:
        write(finetune_ids, "finetune_ids", ["doc_id"])
    if referenced is not None:
        referenced.select_columns(["mode", "status", "context_ids"]).map_batches(
            _context_ids(num_shards), batch_format="pyarrow"
        ).write_parquet(storage.join(path, "icl_ids"), partition_cols=["shard"], min_rows_per_file=_ROWS_PER_FILE)
        kinds = ("icl_ids", "finetune_ids") if finetune_ids is not None else ("icl_ids",)
        icl = icl.select_columns(_REF_COLUMNS).map_batches(
            _keep_referenced(path, num_shards, kinds), batch_format="pyarrow"
        )
    write(icl, "icl", _REF_COLUMNS)
    if finetune is None and finetune_ids is None:
        return ReferenceShards(path, num_shards, 0)
    if finetune is not None:
        write(finetune, "finetune", _REF_COLUMNS)
    got = (
        ray.data.from_items([{"shard": k} for k in range(num_shards)])
        .map_batches(_finetune_shards(path, finetune is None), batch_format="pyarrow", batch_size=1)
        .aggregate(CountDistinct("value"), Sum("missing"), Sum("docs"))
    )
    if int(got["sum(missing)"] or 0):
        raise CtrlgenError(f"{got['sum(missing)']} fine-tuning document(s) have no reference in the references given")
    rate = rouge_sample_rate(rouge_sample, int(got["sum(docs)"] or 0))
    return ReferenceShards(path, num_shards, int(got["count_distinct(value)"] or 0), rate)


def _fan_out(n: int) -> Any:
    """map_batches: each generated row once per shard holding a reference it is scored against."""
    from ctrlgen.generation.report import FINETUNE_MODES

    def fn(batch: pa.Table) -> pa.Table:
        idx, shards = [], []
        modes, status = batch.column("mode").to_pylist(), batch.column("status").to_pylist()
        for i, ctx in enumerate(batch.column("context_ids").to_pylist()):
            if status[i] != "ok":
                ks: set[int] = {0}  # scored nowhere; one partial carries the row through
            elif modes[i] in FINETUNE_MODES:
                ks = set(range(n))
            else:
                ks = {shard_of(c, n) for c in ctx or []} or {0}
            for k in sorted(ks):
                idx.append(i)
                shards.append(k)
        out = batch.take(pa.array(idx, pa.int64()))
        return out.append_column("shard", pa.array(shards, pa.int32()))

    return fn


class ShardScorer:
    """map_batches over rows sorted by shard: score each row against the references of its shard, loading
    a shard's references (and indexing them) when a batch first names it. The rows come sorted by shard, so
    an actor meets each shard in one run of rows: it holds one shard and lets it go *before* it indexes the
    next (the actor's peak is one shard being indexed, never two)."""

    def __init__(self, shards: ReferenceShards) -> None:
        self.shards = shards
        self._held: tuple[int, ShardEvaluator] | None = None  # (shard, its evaluator)

    def _docs(self, kind: str, k: int) -> dict[str, RealDoc]:
        d = self.shards.shard_dir(kind, k)
        if not storage.is_dir(d):
            return {}
        files = storage.parquet_files(d)
        if not files:
            return {}
        out: dict[str, RealDoc] = {}
        # a batch of rows at a time: a shard's rows never exist as Python dicts all at once, beside its RealDocs
        for batch in storage.dataset(files).to_batches(columns=_REF_COLUMNS, batch_size=4096):
            out.update((str(r["doc_id"]), RealDoc.from_row(r)) for r in batch.to_pylist())
        return out

    def evaluator(self, k: int) -> ShardEvaluator:
        if self._held is None or self._held[0] != k:
            self._held = None  # let go first: never two shards' notes being indexed at once
            self._held = (k, ShardEvaluator(self._docs("icl", k), self._docs("finetune", k), self.shards.rouge_rate))
        return self._held[1]

    def __call__(self, batch: pa.Table) -> pa.Table:
        if not batch.num_rows:
            return PARTIAL_SCHEMA.empty_table()
        shards = batch.column("shard").to_pylist()
        rows = batch.select(_IN).to_pylist()
        parts = [self.evaluator(int(k)).partial(r) for k, r in zip(shards, rows, strict=True)]
        return pa.Table.from_pylist(parts, schema=PARTIAL_SCHEMA)


def _conform(batch: pa.Table) -> pa.Table:
    """map_batches: every block in the partial schema (an actor pool's map_groups may emit empty,
    schema-less blocks, which the next hash shuffle cannot sort)."""
    return batch if batch.num_columns else PARTIAL_SCHEMA.empty_table()


def _merge(n_ft: int) -> Any:
    def fn(group: pa.Table) -> pa.Table:
        return pa.Table.from_pylist([merge_partials(group.to_pylist(), n_ft)], schema=RECORD_SCHEMA)

    return fn


def _terms(batch: pa.Table) -> pa.Table:
    terms = [record_terms(r) for r in batch.to_pylist()]
    cols = {t: pa.array([x[t] for x in terms], pa.float64()) for t in TERMS}
    return pa.table({"mode": batch.column("mode"), **cols})


def _ft_leaked(batch: pa.Table) -> pa.Table:
    from ctrlgen.generation.report import FINETUNE_MODES

    keep = pc.and_(
        pc.is_in(batch.column("mode"), pa.array(sorted(FINETUNE_MODES))), pc.equal(batch.column("status"), "ok")
    )
    b = batch.filter(keep)
    lengths = pc.fill_null(pc.list_value_length(b.column("leaked")), 0)
    modes = b.column("mode").take(
        pa.array([i for i, n in enumerate(lengths.to_pylist()) for _ in range(n)], pa.int64())
    )
    return pa.table({"mode": modes, "value": pc.list_flatten(b.column("leaked"))})


def default_actors() -> int:
    """Scoring actors when the config does not say: one per CPU of the cluster (at least one)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def evaluate(
    generated: Any, shards: ReferenceShards, records_path: str, num_actors: int | None = None, batch_rows: int = 256
) -> dict[str, dict[str, float]]:
    """Score a generated-rows dataset against ``shards``; write the records to ``records_path``
    and return mode -> metrics (as :func:`~ctrlgen.metrics.evaluate.aggregate`). ``num_actors``:
    :func:`default_actors` when None."""
    import ray
    from ray.data.aggregate import CountDistinct, Sum

    from ray_jobs.common import even_pool

    n_in = generated.count()
    actors = num_actors or default_actors()
    storage.remove(records_path)
    (
        generated.select_columns(_IN)
        .map_batches(_fan_out(shards.num_shards), batch_format="pyarrow")
        .sort("shard")  # a batch then names one or two shards: an actor loads each shard once per run of rows
        .map_batches(
            ShardScorer,
            fn_constructor_kwargs={"shards": shards},
            batch_format="pyarrow",
            batch_size=batch_rows,
            compute=even_pool(actors),
            num_cpus=0.5,
        )
        .map_batches(_conform, batch_format="pyarrow", batch_size=None)
        # as many hash partitions as scoring actors (Ray's default, 200, wrote 200+ small files and ran 200
        # aggregation tasks however few the rows); files of at least _ROWS_PER_FILE records
        .groupby(["doc_id", "mode"], num_partitions=actors)
        .map_groups(_merge(shards.n_finetune_values), batch_format="pyarrow")
        .write_parquet(records_path, min_rows_per_file=_ROWS_PER_FILE)
    )
    records = ray.data.read_parquet(records_path)
    n_out = records.count()
    if n_out != n_in:
        raise CtrlgenError(f"evaluation wrote {n_out} records for {n_in} generated rows ({records_path})")
    sums = {
        str(r["mode"]): {t: float(r[f"sum({t})"] or 0.0) for t in TERMS}
        for r in records.map_batches(_terms, batch_format="pyarrow")
        .groupby("mode")
        .aggregate(*(Sum(t) for t in TERMS))
        .take_all()
    }
    distinct = {
        str(r["mode"]): int(r["count_distinct(value)"])
        for r in records.map_batches(_ft_leaked, batch_format="pyarrow")
        .groupby("mode")
        .aggregate(CountDistinct("value"))
        .take_all()
    }
    return metrics_from_sums(sums, distinct, shards.n_finetune_values)


def metrics_table(metrics: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per mode (percentages, except counts)."""
    head = ["mode", "outputs", "quarantined", "PIPP %", "PIPP long %", "ELP %", "ROUGE-2", "ROUGE-L",
            *(f"ctx k={k} %" for k in KS)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, m in sorted(metrics.items()):
        cells = [mode, f"{m['outputs']:.0f}", f"{m['quarantined']:.0f}", f"{100 * m['pipp']:.1f}",
                 f"{100 * m['pipp_long']:.1f}", f"{100 * m['elp']:.1f}", f"{m['rouge2']:.3f}", f"{m['rougeL']:.3f}",
                 *(f"{100 * m[f'ctx_{k}']:.1f}" for k in KS)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class EvaluateSummary:
    rows: int
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    output: str = ""

    def text(self) -> str:
        return (
            f"{self.rows} generated rows evaluated in {self.seconds:.1f} s -> {self.output}\n"
            f"{metrics_table(self.metrics)}"
        )


def run(cfg: CtrlgenConfig) -> EvaluateSummary:
    import ray

    from ctrlgen.generation.report import FINETUNE_MODES
    from ray_jobs.common import extraction_input
    from ray_jobs.generate import _generated_dataset
    from ray_jobs.runtime import init_ray

    t0 = time.perf_counter()
    e, g = cfg.evaluation, cfg.generation
    out = storage.absolute(e.output or storage.join(cfg.output_dir, "evaluation"))
    gen = storage.absolute(e.input or storage.join(cfg.output_dir, "generated"))
    ref_given = e.references or g.context_input or g.input or storage.join(cfg.output_dir, "extracted")
    refs = extraction_input(cfg, ref_given, "evaluate (references)")
    init_ray(cfg)
    generated = _generated_dataset(gen)
    modes = {str(r["mode"]) for r in generated.select_columns(["mode"]).groupby("mode").count().take_all()}
    references = ray.data.read_parquet(refs).select_columns(_REF_COLUMNS)
    ids = None
    if modes & set(FINETUNE_MODES):
        ft_path = storage.absolute(e.finetune_data or g.finetune_data or storage.join(cfg.output_dir, "train_data"))
        files = storage.parquet_files(ft_path, within="status=ok")
        if not files:
            raise CtrlgenError(f"{ft_path} holds no training examples (prefix rows are scored against them)")
        ids = ray.data.read_parquet(files).select_columns(["doc_id"])
    _say(f"sharding the references of {refs} that the outputs name into {e.num_shards} shards")
    shards = shard_references(references, storage.join(out, "references"), e.num_shards, finetune_ids=ids,
                              referenced=generated, rouge_sample=e.rouge_finetune_sample)  # fmt: skip
    if shards.rouge_rate < 1.0:
        _say(
            f"fine-tuning outputs' ROUGE over a seeded sample of the fine-tuning references (rate "
            f"{shards.rouge_rate:.4f}, about {e.rouge_finetune_sample} documents)"
        )
    actors = e.num_actors or default_actors()
    _say(f"scoring {gen} with {actors} actors")
    metrics = evaluate(generated, shards, storage.join(out, "records"), actors)
    storage.write_text(storage.join(out, "metrics.json"), json.dumps(metrics, indent=2) + "\n")
    storage.write_text(storage.join(out, "metrics.md"), metrics_table(metrics) + "\n")
    rows = int(sum(m["outputs"] + m["quarantined"] for m in metrics.values()))
    return EvaluateSummary(rows, metrics, time.perf_counter() - t0, out)


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("evaluate", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
