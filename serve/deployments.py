"""The service's model-side deployments: thin adapters that load resources once per replica and call the core.

* :class:`Generator` - ``SynthesisPlanner`` (ICL contexts, fictional codes) + the engine ``model.engine`` names
  (the fast engine by default, every prefix adapter registered on it) + ``gated_generate``: every output of
  every request goes through one ``@serve.batch`` queue, so concurrent requests share engine calls (base-model
  and adapter rows in the same call); each output keeps its own seed, banned list and adapter.
* :class:`Extractor` - ``extract_rows`` with the known spans a request sends, or the
  configured unknown-setting (Presidio) engine; documents batched across requests.
* :class:`ScorerShard` / :class:`Scorer` - one ``ReferenceShard`` per shard deployment; the
  scorer fans a request out to every shard through ``DeploymentHandle`` s and merges exactly.

Deployment options (replicas, autoscaling, queues) come from the Serve config file
(configs/serve/*.yaml); these decorators hold only defaults. Nothing here logs text:
log lines carry ids, counts and timings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ray import serve

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.metrics.leakage import ValueIndex
from serve.metrics import metrics

__all__ = ["Extractor", "Generator", "ScoreLimiter", "Scorer", "ScorerShard", "contexts_path", "references_path"]

logger = logging.getLogger("ray.serve")


def contexts_path(cfg: CtrlgenConfig) -> str:
    """The extraction output the generator reads its contexts from (checked at build time)."""
    path = cfg.serve.contexts or cfg.generation.context_input or cfg.generation.input
    if not path:
        raise CtrlgenError(
            "the service needs an extraction output for its ICL contexts: set serve.contexts "
            "(`ctrlgen serve` runs the extraction job first when none is set)"
        )
    return path


def references_path(cfg: CtrlgenConfig) -> str:
    """The extraction output /v1/score compares with."""
    return cfg.serve.references or contexts_path(cfg)



class ReplicaError(RuntimeError):
    """A replica method failed; the message names the exception's type and the method, never its message."""


_R = TypeVar("_R")


def content_free_errors(fn: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
    """Let a replica's entry point fail without its exception's message.

    Serve logs every failed request's exception with its traceback in the replica's log (``Request failed.``),
    and a message from a tokenizer, a model or a parser may quote the request's text. The exception becomes a
    :class:`ReplicaError` naming only its type (the traceback's frames show code, not data). Ray's and Serve's
    own exceptions (back-pressure, a lost replica, a cancelled request) pass unchanged: the ingress maps them
    onto 503 / 504.
    """
    from ray.exceptions import RayError
    from ray.serve.exceptions import RayServeException

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> _R:
        try:
            return await fn(*args, **kwargs)
        except (RayError, RayServeException):
            raise
        except Exception as exc:
            raise ReplicaError(f"{type(exc).__name__} in {fn.__qualname__}") from None

    return wrapper


@dataclass
class _Item:
    """One output waiting for a batch."""

    work: Any  # ctrlgen.generation.icl.ModeRequest
    adapter: str | None
    gate: bool
    mode: str
    arrived: float = field(default_factory=time.monotonic)


@serve.deployment(name="Generator", max_ongoing_requests=32)
class Generator:
    """Synthetic notes from (fictional) control codes: baseline, icl, icl_blocking, prefix."""

    def __init__(self, cfg_json: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from ctrlgen.fictional import FictionalCodes
        from ctrlgen.generation.synthesis import SynthesisPlanner, corpus_values, load_pool_rows

        t0 = time.perf_counter()
        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        g = cfg.generation
        # Every torch call of the replica (load, every batch) runs on this one thread. The replica's code runs
        # off the process's main thread, and torch's OpenMP team is per calling thread: work spread over the
        # default executor's threads ran ~18% slower (1.75 of 2 cores busy instead of 1.95; measured in a Ray
        # actor, docs/benchmarks.md, Serve) than work kept on one thread.
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="ctrlgen-engine")
        tokenizer = self._engine_thread.submit(self._load_models, cfg).result()
        src = contexts_path(cfg)
        self.planner = SynthesisPlanner(
            load_pool_rows(src, g),
            tokenizer,
            g,
            FictionalCodes(g.seed, corpus_values(src), same_counts=g.same_counts),
        )
        self.gate = g.gate
        self.model_name = cfg.model.name
        self._batch.set_max_batch_size(cfg.serve.generator_batch_size)
        self._batch.set_batch_wait_timeout_s(cfg.serve.generator_batch_wait_s)
        logger.info(
            "Generator ready: model %s, pool %d, adapters %d, batch %d (%.1f s)",
            cfg.model.name, len(self.planner.pool), len(self.finetune), cfg.serve.generator_batch_size,
            time.perf_counter() - t0,
        )  # fmt: skip

    def _load_models(self, cfg: CtrlgenConfig) -> Any:
        """On the engine thread: the base model and its engine, every prefix adapter on it; returns the tokenizer."""
        import torch

        from ctrlgen.generation.factory import build_engine
        from ctrlgen.generation.report import finetune_values
        from ctrlgen.models import load_causal_lm

        sv, g = cfg.serve, cfg.generation
        if sv.torch_threads:
            torch.set_num_threads(sv.torch_threads)
        model, tokenizer = load_causal_lm(cfg.model)
        adapters: dict[str, Any] = {}
        self.finetune: dict[str, ValueIndex] = {}
        if sv.adapters:
            from ctrlgen.training.prefix import load_prefix_model

            for name, path in sv.adapters.items():
                # Prefix tuning leaves the base model untouched: each adapter wraps the same weights.
                # A local path or a URI (an s3:// adapter is downloaded once, here).
                with storage.local_copy(path) as local:
                    adapters[name] = load_prefix_model(model, local)
                self.finetune[name] = ValueIndex(finetune_values(storage.join(storage.parent(path), "train_data")))
        self.engine = build_engine(model, tokenizer, g.sampling, model_cfg=cfg.model,
                                   batch_size=sv.generator_batch_size, adapters=adapters)  # fmt: skip
        self.tokenizer = tokenizer
        return tokenizer

    def adapters(self) -> list[str]:
        return sorted(self.finetune)

    @content_free_errors
    async def synthesize(self, req: dict[str, Any]) -> dict[str, Any]:
        """``req``: mode, n, seed, control_code, max_new_tokens, adapter (checked by the ingress)."""
        mode, adapter = req["mode"], req.get("adapter")
        planned = self.planner.plan(
            mode,
            n=req["n"],
            seed=req["seed"],
            control_code=req.get("control_code"),
            max_new_tokens=req["max_new_tokens"],
            finetune_values=self.finetune[adapter] if mode == "prefix" and adapter else (),
        )
        gate = self.gate.enabled and mode in self.gate.modes
        items = [_Item(p.work, adapter if mode == "prefix" else None, gate, mode) for p in planned]
        done = await asyncio.gather(*(self._batch(it) for it in items))
        outputs = []
        m = metrics()
        for i, (p, (g, batch_size)) in enumerate(zip(planned, done, strict=True)):
            res = g.result
            out: dict[str, Any] = {
                "index": i,
                "released": g.released,
                "text": res.text if g.released else None,
                "fictional_code": p.fictional_code,
                "context_ids": list(p.context_ids),
                "template_id": p.template_id or None,
                "attempts": g.attempts,
                "new_tokens": res.new_tokens,
                "finish": res.finish,
                "batch_size": batch_size,
            }
            if not g.released:
                out["withheld_reason"] = (
                    f"generation failed: {res.error}"
                    if res.error
                    else f"still contained {len(g.leaked)} known private value(s) after {g.attempts} attempt(s)"
                )
            outputs.append(out)
            m.inc(m.tokens, res.new_tokens, mode=mode)
            m.inc(m.regenerations, g.attempts - 1, mode=mode)
            m.inc(m.withheld, 0 if g.released else 1, mode=mode)
            m.inc(m.leaks, 1 if g.leaked_first else 0, metric="gate_first")
        return {
            "mode": mode,
            "adapter": adapter if mode == "prefix" else None,
            "outputs": outputs,
            "released": sum(o["released"] for o in outputs),
            "withheld": sum(not o["released"] for o in outputs),
            "regenerated": sum(o["attempts"] > 1 for o in outputs),
            "gate": gate,
        }

    @content_free_errors
    async def complete(self, req: dict[str, Any]) -> dict[str, Any]:
        """``req``: prompts, seed, max_new_tokens, stop, n, temperature, top_p (checked by the ingress). Raw
        continuations of the base model through the same batch queue; no known values, so no gate."""
        from ctrlgen.generation.engine import GenerationRequest
        from ctrlgen.generation.icl import ModeRequest, row_seed

        seed, n = req["seed"], int(req.get("n", 1))
        # Choice j of prompt i (OpenAI's index i * n + j): the request's seed for the very first, a derived one else.
        seeds = [seed if i == j == 0 else row_seed(seed, "completion", str(i) if j == 0 else f"{i}#{j}")
                 for i in range(len(req["prompts"])) for j in range(n)]  # fmt: skip
        prompts = [p for p in req["prompts"] for _ in range(n)]
        items = [
            _Item(ModeRequest(GenerationRequest(p, seed=s, stop=tuple(req["stop"]), max_new_tokens=req["max_new_tokens"],
                                                temperature=req.get("temperature"), top_p=req.get("top_p")), ()),
                  None, False, "completion")
            for p, s in zip(prompts, seeds, strict=True)
        ]  # fmt: skip
        done = await asyncio.gather(*(self._batch(it) for it in items))
        tok = self.tokenizer
        prompt_tokens = sum(len(ids) for ids in tok(req["prompts"], add_special_tokens=False)["input_ids"])
        m = metrics()
        choices = []
        for g, _ in done:
            res = g.result
            m.inc(m.tokens, res.new_tokens, mode="completion")
            choices.append({"text": res.text if res.error is None else "",
                            "finish_reason": "length" if res.finish == "length" else "stop", "error": res.error})  # fmt: skip
        return {"model": self.model_name, "choices": choices, "prompt_tokens": prompt_tokens,
                "completion_tokens": sum(g.result.new_tokens for g, _ in done)}  # fmt: skip

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.05)
    async def _batch(self, items: list[_Item]) -> list[tuple[Any, int]]:
        start = time.monotonic()
        m = metrics()
        m.batch_size.observe(len(items), tags={"deployment": "Generator"})
        for it in items:
            m.queue_wait.observe(start - it.arrived, tags={"deployment": "Generator"})
        # The engine runs on its thread: the replica keeps accepting requests, which fill the next batch.
        gated = await asyncio.get_running_loop().run_in_executor(self._engine_thread, self._run, items)
        logger.info("Generator batch: %d outputs in %.2f s", len(items), time.monotonic() - start)
        return [(g, len(items)) for g in gated]

    def _run(self, items: list[_Item]) -> list[Any]:
        from ctrlgen.generation.gate import gated_generate

        # One engine call for the whole batch: each request names its adapter (None: the base model).
        return gated_generate(
            self.engine,
            [dataclasses.replace(it.work.request, adapter=it.adapter) for it in items],
            [it.work.known for it in items],
            max_retries=self.gate.max_retries,
            enabled=[it.gate for it in items],
        )


@serve.deployment(name="Extractor", max_ongoing_requests=32)
class Extractor:
    """Entities and control codes of submitted documents (known spans, or the unknown-setting engine)."""

    def __init__(self, cfg_json: str, models: dict[str, str] | None = None) -> None:
        from ctrlgen.extract import KnownExtractor, make_extractor
        from ctrlgen.extract.shipping import check_models

        t0 = time.perf_counter()
        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        self.corpus = cfg.corpus
        unknown = cfg.extraction.model_copy(update={"setting": "unknown"})
        check_models(unknown, models or {})  # the models' digests where the app was built (serve.app.build_app)
        self.known = KnownExtractor()
        self.engine = make_extractor(unknown, cfg.nlp.spacy_model, cfg.corpus.identifiers)
        self._batch.set_max_batch_size(cfg.serve.extractor_batch_size)
        self._batch.set_batch_wait_timeout_s(cfg.serve.extractor_batch_wait_s)
        logger.info("Extractor ready (%.1f s)", time.perf_counter() - t0)

    @content_free_errors
    async def extract(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Document rows (``doc_id`` unique per request, ``text``, ``entities`` or None) -> result rows."""
        return list(await asyncio.gather(*(self._batch((time.monotonic(), r)) for r in rows)))

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.02)
    async def _batch(self, items: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
        start = time.monotonic()
        m = metrics()
        m.batch_size.observe(len(items), tags={"deployment": "Extractor"})
        for arrived, _ in items:
            m.queue_wait.observe(start - arrived, tags={"deployment": "Extractor"})
        return await asyncio.to_thread(self._run, [r for _, r in items])

    def _run(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from ctrlgen.extract.stage import extract_rows

        known = [{**r, "metadata": "{}"} for r in rows if r["entities"] is not None]
        unknown = [{**r, "metadata": "{}", "entities": []} for r in rows if r["entities"] is None]
        by_id: dict[str, dict[str, Any]] = {}
        for part, engine in ((known, self.known), (unknown, self.engine)):
            if part:
                for row in extract_rows(part, engine, self.corpus, "documents", "request").to_pylist():
                    by_id[row["doc_id"]] = row
        return [by_id[r["doc_id"]] for r in rows]


@serve.deployment(name="ScorerShard", max_ongoing_requests=16)
class ScorerShard:
    """Shard ``shard`` of the reference index (documents by id, values by value)."""

    def __init__(self, cfg_json: str, shard: int, n_shards: int) -> None:
        from ctrlgen.metrics.shard import ReferenceShard

        t0 = time.perf_counter()
        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        self.index = ReferenceShard.cached(references_path(cfg), shard, n_shards, cfg.serve.scorer_index_dir)
        logger.info(
            "ScorerShard %d/%d ready: %d documents, %d values (%.1f s)",
            shard, n_shards, len(self.index.doc_ids), self.index.n_values, time.perf_counter() - t0,
        )  # fmt: skip

    def info(self) -> dict[str, Any]:
        return {**self.index.summary(), "corpus_documents": self.index.corpus_documents}

    @content_free_errors
    async def probe(self, texts: list[str]) -> list[Any]:
        return await asyncio.to_thread(self.index.probe, texts)

    @content_free_errors
    async def score(self, texts: list[str], floors: list[float] | None = None) -> list[Any]:
        return await asyncio.to_thread(self.index.score, texts, floors)


@serve.deployment(name="ScoreLimiter", num_replicas=1, max_ongoing_requests=1000)
class ScoreLimiter:
    """The /v1/score rate limit of the whole service: one token bucket per token, in one replica, so that
    ingress replicas added by autoscaling do not multiply what a token may send."""

    def __init__(self, capacity: int, window_s: float) -> None:
        from serve.api import RateLimiter

        self.limiter = RateLimiter(capacity, window_s)

    def take(self, key: str, cost: int) -> float:
        """Seconds to wait before ``cost`` texts fit (0: taken now)."""
        return self.limiter.take(key, cost)


@serve.deployment(name="Scorer", max_ongoing_requests=32)
class Scorer:
    """Fans a scoring request out to every shard and merges the answers exactly."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        self._info: list[dict[str, Any]] | None = None

    @content_free_errors
    async def score(self, texts: list[str]) -> dict[str, Any]:
        from ctrlgen.metrics.shard import corpus_leakage, floors_of, merge_shard_scores

        if self._info is None:
            self._info = list(await asyncio.gather(*(h.info.remote() for h in self.shards)))
        # Two rounds: every shard probes (one exact LCS per text), then searches only for documents
        # that beat the best probe of all shards. Without the floor a shard lacking the closest
        # document searched far more than the whole index would have (docs/benchmarks.md, Serve).
        probes = await asyncio.gather(*(h.probe.remote(texts) for h in self.shards))
        floors = floors_of(probes)
        per_shard = await asyncio.gather(*(h.score.remote(texts, floors) for h in self.shards))
        merged = merge_shard_scores(per_shard, probes)
        n_values = sum(i["values"] for i in self._info)
        summary = corpus_leakage(merged, n_values)
        m = metrics()
        m.inc(m.leaks, sum(1 for s in merged if s.n_leaked), metric="score_texts")
        m.inc(m.leaks, len(frozenset().union(*(s.leaked for s in merged))), metric="score_values")
        return {
            "texts": [
                {
                    "leaked_values": s.n_leaked,
                    "rouge2": s.rouge2,
                    "rouge2_doc": s.rouge2_doc or None,
                    "rougeL": s.rougeL,
                    "rougeL_doc": s.rougeL_doc or None,
                }
                for s in merged
            ],
            **summary,
            "reference": {
                "documents": self._info[0]["corpus_documents"],
                "values": n_values,
                "shards": len(self.shards),
            },
        }
