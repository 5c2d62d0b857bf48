"""Ray Data job: the LLM anonymiser (METHOD.md section 8.3) over an extraction output.

Reads the extraction output (``anonymizer.input``, else the extraction job runs first),
optionally keeps a seeded sample of ``anonymizer.num_documents`` notes, and streams the notes
through an actor pool that loads the anonymiser model once per actor (or talks to an
OpenAI-compatible ``anonymizer.endpoint``) and runs :func:`ctrlgen.anonymize_llm.llm_anonymize`
on each batch. Writes::

    <output>/status=<private|redacted|released_with_hits|withheld|error>/*.parquet
        doc_id, text (null when withheld or failed), rounds, hits (per round), best_round,
        fallback_redacted, error
    <output>/_summary.json   counts by status, rounds and hits (never text)

Every input note is one output row: counts in = counts out, a failed note is a row with its status.

    python -m ray_jobs.anonymize --config configs/anonymize_physionet.yaml
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError

__all__ = ["AnonymizeActor", "AnonymizeSummary", "anonymize_dataset", "main", "run"]

_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("text", pa.string()),
        ("status", pa.string()),
        ("rounds", pa.int32()),
        ("hits", pa.list_(pa.int32())),
        ("best_round", pa.int32()),
        ("fallback_redacted", pa.int32()),
        ("error", pa.string()),
    ]
)


class AnonymizeActor:
    """Callable class for ``map_batches``: builds the engine once, then anonymises each batch of notes."""

    def __init__(self, cfg_json: str, seed: int) -> None:
        import dataclasses

        import torch

        from ctrlgen.anonymize_llm import build_engine, settings_of

        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        a = cfg.anonymizer
        if a.torch_threads:
            torch.set_num_threads(a.torch_threads)
        self.engine, self.tokenizer, self.count = build_engine(a, cfg.model)
        self.settings = dataclasses.replace(settings_of(a), seed=seed)
        self.done = 0

    def __call__(self, batch: pa.Table) -> pa.Table:
        """A batch of notes; with ``group`` and ``seed`` columns (many cells in one job: the experiment), each
        group's notes are anonymised with its seed and come back with their ``group``."""
        import dataclasses

        import pyarrow.compute as pc

        if "group" not in batch.column_names:
            return self._anonymise(batch, self.settings)
        parts = []
        for group in sorted(set(batch.column("group").to_pylist())):
            sub = batch.filter(pc.equal(batch.column("group"), group))
            seed = int(sub.column("seed")[0].as_py())
            out = self._anonymise(sub, dataclasses.replace(self.settings, seed=seed))
            parts.append(out.append_column("group", pa.array([group] * out.num_rows, pa.string())))
        return pa.concat_tables(parts)

    def _anonymise(self, batch: pa.Table, settings: Any) -> pa.Table:
        from ctrlgen.anonymize_llm import llm_anonymize
        from ctrlgen.schema import Entity

        docs = [
            (str(r["doc_id"]), r["text"] or "", [Entity.from_row(e) for e in (r["entities"] or [])])
            for r in batch.select(["doc_id", "text", "entities"]).to_pylist()
        ]
        t0 = time.perf_counter()
        try:
            out = llm_anonymize(self.engine, docs, settings, tokenizer=self.tokenizer, count_tokens=self.count)
        except ValueError as exc:  # a bad span: the batch's rows are kept with the reason (no text)
            out = None
            reason = str(exc)
        self.done += len(docs)
        print(
            f"[anonymize actor {os.getpid()}] {len(docs)} notes in {time.perf_counter() - t0:.1f} s "
            f"(notes so far: {self.done})",
            flush=True,
        )
        if out is None:
            rows = [{"doc_id": d, "text": None, "status": "error", "rounds": 0, "hits": [], "best_round": 0,
                     "fallback_redacted": 0, "error": reason} for d, _, _ in docs]  # fmt: skip
        else:
            rows = [
                {"doc_id": r.doc_id, "text": r.text, "status": r.status, "rounds": r.rounds, "hits": r.hits,
                 "best_round": r.best_round, "fallback_redacted": r.fallback_redacted, "error": r.error}
                for r in out
            ]  # fmt: skip
        return pa.Table.from_pylist(rows, schema=_SCHEMA)


def anonymize_dataset(ds: Any, cfg: CtrlgenConfig, seed: int | None = None) -> Any:
    """``ds`` (doc_id, text, entities) -> the anonymised rows of :data:`_SCHEMA`, through the actor pool.

    With ``group`` and ``seed`` columns in ``ds`` (several cells in one job), each group is anonymised with its
    own seed and the rows keep their ``group``."""
    from ray_jobs.common import even_pool

    a = cfg.anonymizer
    # exact batches: a note's rewrite does not depend on how the input's blocks were cut
    grouped = {"group", "seed"} <= set(ds.schema().names)
    rows = ds.select_columns(["doc_id", "text", "entities", *(["group", "seed"] if grouped else [])])
    return rows.repartition(target_num_rows_per_block=a.batch_size, strict=True).map_batches(
        AnonymizeActor,
        fn_constructor_args=(cfg.model_dump_json(), a.seed if seed is None else seed),
        batch_size=a.batch_size,
        batch_format="pyarrow",
        compute=even_pool(a.num_actors),
        num_cpus=a.actor_num_cpus,
        num_gpus=a.actor_num_gpus or None,
    )


@dataclass
class AnonymizeSummary:
    output: str
    notes: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    mean_rounds: float = 0.0
    hits_first: int = 0  # attacker hits after round 1, summed over notes
    hits_final: int = 0  # after each note's last round
    seconds: float = 0.0

    def text(self) -> str:
        status = ", ".join(f"{k} {v}" for k, v in sorted(self.by_status.items()))
        return (
            f"anonymize: {self.notes} notes -> {self.output} ({status}); mean rounds {self.mean_rounds:.2f}; "
            f"attacker hits {self.hits_first} after round 1, {self.hits_final} at the end; {self.seconds:.1f} s"
        )


def _counts_fn(batch: pa.Table) -> pa.Table:
    """map_batches: one row of counts per batch (status, rounds, hits): the summary without text."""
    by: dict[str, int] = {}
    rounds = ran = first = last = 0
    for r in batch.select(["status", "rounds", "hits"]).to_pylist():
        by[r["status"]] = by.get(r["status"], 0) + 1
        if r["rounds"]:
            ran, rounds = ran + 1, rounds + r["rounds"]
            first, last = first + (r["hits"] or [0])[0], last + (r["hits"] or [0])[-1]
    return pa.table({"counts": [json.dumps([by, ran, rounds, first, last])]})


def summarize(out: str, seconds: float) -> AnonymizeSummary:
    """Counts of the written output, gathered per batch by Ray Data (nothing per note on the driver)."""
    import ray
    from ray.data.datasource import Partitioning

    files = storage.parquet_files(out)
    ds = ray.data.read_parquet(files, partitioning=Partitioning("hive", base_dir=out))
    by: dict[str, int] = {}
    ran = rounds = first = last = 0
    for row in ds.map_batches(_counts_fn, batch_format="pyarrow", batch_size=4096).take_all():
        b, n, r, f, la = json.loads(row["counts"])
        for k, v in b.items():
            by[k] = by.get(k, 0) + v
        ran, rounds, first, last = ran + n, rounds + r, first + f, last + la
    return AnonymizeSummary(out, sum(by.values()), by, rounds / ran if ran else 0.0, first, last, seconds)


def run(cfg: CtrlgenConfig) -> AnonymizeSummary:
    """The extraction output (or its seeded sample) -> the LLM anonymiser's actor pool -> Parquet."""
    from ray_jobs.common import ordered_execution

    with ordered_execution(cfg.anonymizer.num_documents is not None):  # see ray_jobs.generate.run
        return _run(cfg)


def _run(cfg: CtrlgenConfig) -> AnonymizeSummary:
    import ray

    from ray_jobs.common import extraction_input, reset_dir, sample_in_key_order
    from ray_jobs.runtime import init_ray

    t0 = time.perf_counter()
    init_ray(cfg)
    a = cfg.anonymizer
    src = extraction_input(cfg, a.input, "anonymize")
    out = reset_dir(storage.absolute(a.output or storage.join(cfg.output_dir, "anonymized")))
    ds = ray.data.read_parquet(src).select_columns(["doc_id", "text", "entities"])
    if a.num_documents:
        ds = sample_in_key_order(ds, a.num_documents, a.seed, "anonymize", ["doc_id", "text", "entities"])
    print(f"anonymize: {src} -> {out} ({'endpoint ' + a.endpoint if a.endpoint else 'local model'}, "
          f"{a.rounds} rounds at most, {a.num_actors} actor(s))", flush=True)  # fmt: skip
    n_in = ds.count()
    anonymize_dataset(ds, cfg).write_parquet(out, partition_cols=["status"])
    summary = summarize(out, time.perf_counter() - t0)
    if summary.notes != n_in:
        raise CtrlgenError(f"anonymize: {n_in} notes in but {summary.notes} rows written to {out}")
    storage.write_text(storage.join(out, "_summary.json"), json.dumps(summary.__dict__, indent=2, sort_keys=True))
    return summary


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("anonymize", __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
