"""Ray Data job: the semantic re-identification attack (METHOD.md 8.2) over whole released sets.

The Ray-free pieces are :mod:`ctrlgen.metrics.semantic`; this module runs them on a cluster:

1. each released set (a *group*: one experiment cell, or one generation output) becomes a
   :class:`~ctrlgen.metrics.semantic.SemanticIndex` built **once, in a task** that streams the set's
   rows (BM25 postings, or MiniLM embeddings for dense retrieval); the task's result lives in the
   object store and every actor shares it (the driver holds only its ``ObjectRef``);
2. the original records (``group``, ``doc_id``, ``text``) stream through an actor pool that loads the
   sentence encoder once per actor, fetches each group's index once, atomises its batch of records,
   links all their queries in one batch and judges the unused claims
   (:func:`~ctrlgen.metrics.semantic.attack_records`);
3. per-batch partial sums come back to the driver (a few numbers per group), never the records.

Several groups go through one pass, each with its own seed, which is how the experiment scores all
its cells (every setting and seed) with one Ray Data job.

    python -m ray_jobs.semantic --config configs/generate_physionet.yaml
        (released set: <output_dir>/generated; records: evaluation.references or the extraction output)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.metrics.semantic import SemanticResult

__all__ = ["AttackActor", "SemanticSummary", "attack_groups", "build_index", "main", "run"]

_ROWS = pa.schema(
    [
        ("group", pa.string()),
        ("doc_id", pa.string()),
        ("skipped", pa.bool_()),
        ("linkable", pa.bool_()),
        ("correct", pa.bool_()),
        ("lexical_privacy", pa.float64()),
        ("semantic_privacy", pa.float64()),
    ]
)


@dataclass(frozen=True)
class AttackSettings:
    k: int = 3
    seed: int = 0
    retriever: str = "bm25"
    same: float = 0.8  # the judge's thresholds (ctrlgen.metrics.semantic.calibrate)
    partly: float = 0.6
    embedding_model: str = ""
    atomizer: str = "rules"  # rules | llm
    judge: str = "similarity"  # similarity | llm
    llm_json: str = ""  # the CtrlgenConfig JSON whose experiment.semantic_llm (and model) the LLM steps use
    batch_size: int = 64
    num_actors: int = 1
    actor_num_cpus: float = 1.0


def _encoder(name: str) -> Any:
    from ctrlgen.assets import load_sentence_encoder

    return load_sentence_encoder(name)


def build_index(released: Any, retriever: str, embedding_model: str) -> Any:
    """A :class:`SemanticIndex` of a released dataset (``doc_id``, ``text``, ``sources``), read batch by batch.
    Runs inside a Ray task (:func:`attack_groups`)."""
    from ctrlgen.metrics.semantic import Released, SemanticIndex

    rows = []
    for batch in released.iter_batches(batch_format="pyarrow", batch_size=4096):
        for r in batch.select(["doc_id", "text", "sources"]).to_pylist():
            rows.append(Released(str(r["doc_id"]), r["text"] or "", tuple(r["sources"] or ())))
    if not rows:
        raise CtrlgenError("semantic attack: a released set is empty")
    return SemanticIndex(rows, retriever, _encoder(embedding_model) if retriever == "dense" else None)  # type: ignore[arg-type]


class AttackActor:
    """map_batches: the attack on a batch of records (``group``, ``doc_id``, ``text``) against its group's index."""

    def __init__(self, indexes: Mapping[str, Any], s: AttackSettings, seeds: Mapping[str, int] | None = None) -> None:
        from ctrlgen.metrics.semantic import SimilarityJudge

        self.refs, self.s, self.seeds = dict(indexes), s, dict(seeds or {})
        self.cache: dict[str, Any] = {}
        self.encoder = _encoder(s.embedding_model)
        self.similarity: Any = SimilarityJudge(self.encoder, s.same, s.partly)
        self.engine: Any = None
        self.llm: Any = None
        self.steps: dict[int, tuple[Any, Any]] = {}  # seed -> (judge, atomizer): the LLM steps are seeded
        if "llm" in (s.atomizer, s.judge):
            from ctrlgen.generation.llm import build_engine

            cfg = CtrlgenConfig.model_validate_json(s.llm_json)
            self.llm = cfg.experiment.semantic_llm
            self.engine, _, _ = build_engine(self.llm, cfg.model)

    def _steps(self, seed: int) -> tuple[Any, Any]:
        """The judge and the atomiser of a group's seed (one model, built once; the LLM steps seeded per group)."""
        if seed not in self.steps:
            import functools

            from ctrlgen.metrics.semantic import LLMJudge, llm_atomize

            judge, atomizer = self.similarity, None
            if self.s.judge == "llm":
                judge = LLMJudge(self.engine, queries=3, seed=seed)
            if self.s.atomizer == "llm":
                atomizer = functools.partial(llm_atomize, self.engine, seed=seed,
                                             max_new_tokens=self.llm.sampling.max_new_tokens)  # fmt: skip
            self.steps[seed] = (judge, atomizer)
        return self.steps[seed]

    def _index(self, group: str) -> Any:
        import ray

        if group not in self.cache:  # fetched from the object store once per actor
            self.cache[group] = ray.get(self.refs[group])
        return self.cache[group]

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.metrics.semantic import Record, attack_records

        by: dict[str, list[Record]] = {}
        for r in batch.select(["group", "doc_id", "text"]).to_pylist():
            by.setdefault(str(r["group"]), []).append(Record(str(r["doc_id"]), r["text"] or ""))
        out = []
        for group, records in by.items():
            seed = self.seeds.get(group, self.s.seed)
            judge, atomizer = self._steps(seed)
            rows = attack_records(records, self._index(group), judge, self.s.k, seed, self.encoder, atomizer)
            out += [{"group": group, **{k: r[k] for k in _ROWS.names if k != "group"}} for r in rows]
        j = self.similarity
        print(f"[semantic actor] {len(out)} records of {len(by)} group(s); judge texts embedded {j.embedded}, "
              f"reused {j.reused} (this actor so far)", flush=True)  # fmt: skip
        return pa.Table.from_pylist(out, schema=_ROWS)


def _sums(batch: pa.Table, keep: bool = False) -> pa.Table:
    """map_batches: per group, the counts and sums a :class:`SemanticResult` is made of (``keep``: and each
    attacked record's scores, for per-record confidence intervals)."""
    acc: dict[str, list[float]] = {}
    kept: dict[str, list[dict[str, Any]]] = {}
    for r in batch.to_pylist():
        a = acc.setdefault(r["group"], [0, 0, 0, 0, 0.0, 0.0])  # records, attacked, linkable, correct, lex, sem
        kept.setdefault(r["group"], [])
        a[0] += 1
        if not r["skipped"]:
            a[1] += 1
            a[2] += int(r["linkable"])
            a[3] += int(r["linkable"] and r["correct"])
            a[4] += r["lexical_privacy"]
            a[5] += r["semantic_privacy"]
            if keep:
                kept[r["group"]].append({k: r[k] for k in ("doc_id", "linkable", "correct", "lexical_privacy",
                                                           "semantic_privacy")})  # fmt: skip
    return pa.table({"group": list(acc), "sums": [json.dumps(v) for v in acc.values()],
                     "kept": [json.dumps(kept[g]) for g in acc]})  # fmt: skip


def attack_groups(
    records: Any,
    released: Mapping[str, Any],
    s: AttackSettings,
    keep_scores: bool = False,
    seeds: Mapping[str, int] | None = None,
) -> dict[str, SemanticResult]:
    """Attack every group's records (``records``: a dataset of ``group``, ``doc_id``, ``text``) against
    that group's released dataset; one :class:`SemanticResult` per group, with per-record rows (doc_id,
    linkable, correct, lexical and semantic privacy of each attacked record) only when ``keep_scores``
    (they travel to the driver: for samples, not corpora). ``seeds``: a group's own seed (default
    ``s.seed``), so that groups of several seeds (the experiment's cells) go through one pass and score as
    they would alone."""
    import functools
    import math

    import ray

    from ray_jobs.common import even_pool

    task = ray.remote(num_cpus=s.actor_num_cpus)(build_index)
    built: dict[int, Any] = {}  # groups given the same released dataset share its index (one task)
    refs = {}
    for g, ds in released.items():
        if id(ds) not in built:
            built[id(ds)] = task.remote(ds, s.retriever, s.embedding_model)
        refs[g] = built[id(ds)]
    scored = records.select_columns(["group", "doc_id", "text"]).map_batches(
        AttackActor,
        fn_constructor_args=(refs, s, dict(seeds or {})),
        batch_size=s.batch_size,
        batch_format="pyarrow",
        compute=even_pool(s.num_actors),
        num_cpus=s.actor_num_cpus,
    )
    totals: dict[str, list[float]] = {}
    kept: dict[str, list[dict[str, Any]]] = {}
    sums = functools.partial(_sums, keep=keep_scores)
    for row in scored.map_batches(sums, batch_format="pyarrow", batch_size=None).take_all():
        t = totals.setdefault(row["group"], [0, 0, 0, 0, 0.0, 0.0])
        for i, v in enumerate(json.loads(row["sums"])):
            t[i] += v
        kept.setdefault(row["group"], []).extend(json.loads(row["kept"]))
    out = {}
    for g in released:
        n, att, linkable, correct, lex, sem = totals.get(g, [0, 0, 0, 0, 0.0, 0.0])
        if keep_scores and att:  # exactly rounded sums of the records' scores: the same whatever the blocks' order
            lex = math.fsum(r["lexical_privacy"] for r in kept.get(g, []))
            sem = math.fsum(r["semantic_privacy"] for r in kept.get(g, []))
        out[g] = SemanticResult(
            attacked=int(att),
            linkable=int(linkable),
            correct_links=int(correct),
            lexical_privacy=lex / att if att else 1.0,
            semantic_privacy=sem / att if att else 1.0,
            skipped=int(n - att),
        )
        out[g].per_record = sorted(kept.get(g, []), key=lambda r: r["doc_id"])
    return out


@dataclass
class SemanticSummary:
    released: str
    records: str
    result: SemanticResult
    thresholds: tuple[float, float]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        r = self.result
        return (
            f"semantic attack: {r.attacked} records attacked ({r.skipped} with too few claims) against {self.released}; "
            f"correct linkage {r.correct_links}/{r.linkable} linkable; lexical privacy {r.lexical_privacy:.3f}, "
            f"semantic privacy {r.semantic_privacy:.3f} (judge thresholds {self.thresholds[0]:.3f} / "
            f"{self.thresholds[1]:.3f}); {self.seconds:.1f} s"
        )


def _released_rows(batch: pa.Table) -> pa.Table:
    """map_batches: generation output rows -> (doc_id, text, sources): released rows only, sources = contexts."""
    rows = [r for r in batch.to_pylist() if r.get("status") == "ok" and r.get("released", True) and r.get("text")]
    return pa.table(
        {
            "doc_id": pa.array([f"{r['doc_id']}/{r.get('mode', '')}" for r in rows], pa.string()),
            "text": pa.array([r["text"] for r in rows], pa.string()),
            "sources": pa.array([list(r.get("context_ids") or []) for r in rows], pa.list_(pa.string())),
        }
    )


def run(cfg: CtrlgenConfig) -> SemanticSummary:
    """The attack on one generation output (``evaluation.input`` or <output_dir>/generated) by the records of
    ``evaluation.references`` (else the extraction output); the judge is calibrated on a seeded sample of them."""
    import ray

    from ctrlgen.metrics.semantic import calibrate
    from ray_jobs.common import seeded_sample
    from ray_jobs.runtime import init_ray

    t0 = time.perf_counter()
    init_ray(cfg)
    x, ev = cfg.experiment, cfg.evaluation
    released_dir = storage.absolute(ev.input or storage.join(cfg.output_dir, "generated"))
    ref = ev.references or cfg.generation.context_input or cfg.generation.input
    ref = storage.absolute(ref or storage.join(cfg.output_dir, "extracted"))
    if storage.is_dir(storage.join(ref, "status=ok")):
        ref = storage.join(ref, "status=ok")
    if not storage.parquet_files(ref):
        raise CtrlgenError(f"semantic attack: the records {ref} hold no Parquet files")
    from ray_jobs.generate import _generated_dataset

    released = _generated_dataset(released_dir).map_batches(_released_rows, batch_format="pyarrow", batch_size=1024)
    records = ray.data.read_parquet(ref).select_columns(["doc_id", "text"])
    sample = [r["text"] for r in seeded_sample(records, x.test_documents, x.split_seed, "judge", ["doc_id", "text"])]
    same, partly, _ = calibrate(_encoder(cfg.nlp.embedding_model), sample, seed=x.split_seed)
    s = AttackSettings(k=x.semantic_k, seed=x.split_seed, retriever=x.semantic_retriever, same=same, partly=partly,
                       embedding_model=cfg.nlp.embedding_model, atomizer=x.semantic_atomizer, judge=x.semantic_judge,
                       llm_json=cfg.model_dump_json(), num_actors=x.eval_actors)  # fmt: skip
    grouped = records.map_batches(lambda b: b.append_column("group", pa.array(["all"] * len(b), pa.string())),
                                  batch_format="pyarrow")  # fmt: skip
    result = attack_groups(grouped, {"all": released}, s)["all"]
    return SemanticSummary(released_dir, ref, result, (same, partly), time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("semantic", __doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
