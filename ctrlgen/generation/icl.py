"""The ICL generation stage on plain rows: what a Ray actor (or a plain loop) runs per batch.

Reads rows with ``doc_id`` and ``control_code`` (the extraction output) and a
*context pool* of real documents; writes one row per (document, mode) with the
columns of :data:`GENERATED_SCHEMA`. For every target document:

* its fictional code is drawn from ``FictionalCodes`` seeded by ``(seed, doc_id)``;
* its ``n_context`` context documents are drawn from the pool (never itself),
  seeded by ``(seed, doc_id)``, the same for every mode so that modes are paired;
* ``baseline`` prompts with the real context documents only, ``icl`` with the
  real (code, document) pairs and the fictional code, ``icl_blocking`` as ``icl``
  with every private value of the contexts hard-blocked (with its variants,
  :mod:`ctrlgen.variants`; context values carry their control-code category);
* ``prefix`` prompts with the fictional code alone (:func:`~ctrlgen.prompts.prefix_prompt`)
  through the prefix adapter :data:`PREFIX_ADAPTER` of the engine (or a separate
  ``prefix_engine``, the prefix-tuned model); it has no contexts, and its
  outputs are checked against the private values of the whole fine-tuning set
  (``finetune_values``), the fine-tuning definition of leakage;
* the release gate runs on the modes configured for it.

A target whose code cannot be fictionalised, or whose generation fails, comes
back with ``status`` ``quarantined`` and the reason (no text): rows are never
dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ctrlgen.codes import format_control_code, parse_control_code
from ctrlgen.config import GenerationConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.fictional import FictionalCodes
from ctrlgen.generation.blocking import banned_sequences
from ctrlgen.generation.engine import GenerationEngine, GenerationRequest
from ctrlgen.generation.gate import gated_generate
from ctrlgen.metrics.leakage import ValueIndex, as_index
from ctrlgen.prompts import baseline_prompt, icl_prompt, prefix_prompt, stop_strings, truncate_to_tokens
from ctrlgen.variants import code_items

__all__ = [
    "GENERATED_SCHEMA",
    "PREFIX_ADAPTER",
    "ContextDoc",
    "ModeRequest",
    "build_pool",
    "draw_contexts",
    "generate_rows",
    "mode_request",
    "row_seed",
    "select_pool",
]

#: The adapter name the prefix mode's requests carry (the engine holds the prefix-tuned model under it).
PREFIX_ADAPTER = "prefix"

GENERATED_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("mode", pa.string()),
        pa.field("context_ids", pa.list_(pa.string())),
        pa.field("fictional_code", pa.string()),
        pa.field("text", pa.string()),
        pa.field("context_values", pa.list_(pa.string())),
        pa.field("leaked_first", pa.list_(pa.string())),  # known values in the first attempt
        pa.field("leaked", pa.list_(pa.string())),  # known values in the final text
        pa.field("attempts", pa.int32()),
        pa.field("released", pa.bool_()),
        pa.field("new_tokens", pa.int32()),
        pa.field("finish", pa.string()),
        pa.field("status", pa.string()),  # "ok" | "quarantined"
        pa.field("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class ContextDoc:
    """A real document that may serve as an ICL context (text already cut to the token budget).

    ``values`` are :class:`~ctrlgen.variants.Value` strings (they carry their category) when built by
    :func:`build_pool`, so blocking and the gate expand them per category.
    """

    doc_id: str
    code_text: str
    text: str
    values: tuple[str, ...]


def row_seed(seed: int, *parts: str) -> int:
    """A 63-bit seed from the global seed and a row's identity (stable across runs and machines)."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def build_pool(rows: Sequence[dict[str, Any]], tokenizer: Any, max_context_tokens: int) -> list[ContextDoc]:
    """Context documents from extraction rows (``doc_id``, ``text``, ``control_code``)."""
    pool = []
    for r in rows:
        code = parse_control_code(r["control_code"] or "")
        text = truncate_to_tokens(r["text"], tokenizer, max_context_tokens)
        pool.append(ContextDoc(r["doc_id"], format_control_code(code), text, tuple(code_items(code))))
    return pool


def select_pool(batches: Any, k: int, seed: int, salt: str = "pool") -> list[dict[str, Any]]:
    """The ``k`` rows with the smallest ``row_seed(seed, salt, doc_id)`` from an iterable of row lists.

    The same choice as the batch job's seeded sample (``ray_jobs.common.seeded_sample``), streamed:
    at most ``2k`` rows are held at once, whatever the corpus size.
    """
    kept: list[tuple[int, dict[str, Any]]] = []
    for rows in batches:
        kept.extend((row_seed(seed, salt, str(r["doc_id"])), r) for r in rows)
        if len(kept) > 2 * k:
            kept.sort(key=lambda t: t[0])
            del kept[k:]
    kept.sort(key=lambda t: t[0])
    return [r for _, r in kept[:k]]


def draw_contexts(pool: Sequence[ContextDoc], n: int, seed: int, target_id: str) -> list[ContextDoc]:
    """``n`` contexts for one target (never the target itself), seeded by ``(seed, target_id)``."""
    rng = random.Random(row_seed(seed, target_id, "contexts"))
    return rng.sample([c for c in pool if c.doc_id != target_id], n)


@dataclass(frozen=True)
class ModeRequest:
    """One output to generate: the engine request and what the release gate checks it against."""

    request: GenerationRequest
    # Values whose appearance is a leak: context values, or the fine-tuning set's index (prefix mode).
    known: tuple[str, ...] | ValueIndex


def mode_request(
    mode: str,
    contexts: Sequence[ContextDoc],
    fictional_code: str,
    seed: int,
    banned_of: Callable[[ContextDoc], tuple[tuple[int, ...], ...]],
    finetune_values: Sequence[str] | ValueIndex = (),
    max_new_tokens: int | None = None,
    adapter: str = PREFIX_ADAPTER,
) -> ModeRequest:
    """The prompt, banned sequences, stop strings and known values of one output of ``mode``.

    ``banned_of`` gives a context's banned token sequences (cached by the caller);
    only ``icl_blocking`` uses it. ``adapter``: the engine's name for the prefix mode's adapter. The batch
    job and the Serve generator both build their requests here.
    """
    if mode == "baseline":
        prompt = baseline_prompt([c.text for c in contexts])
    elif mode == "prefix":
        prompt = prefix_prompt(fictional_code)
    elif mode in ("icl", "icl_blocking"):
        prompt = icl_prompt([(c.code_text, c.text) for c in contexts], fictional_code)
    else:
        raise CtrlgenError(f"unknown generation mode {mode!r}")
    banned: tuple[tuple[int, ...], ...] = ()
    if mode == "icl_blocking":
        merged: dict[tuple[int, ...], None] = {}
        for c in contexts:
            merged.update(dict.fromkeys(banned_of(c)))
        banned = tuple(merged)
    known: tuple[str, ...] | ValueIndex
    if mode == "prefix":  # one shared index: a million fine-tuning values are not copied per output
        known = as_index(finetune_values)
    else:
        known = tuple(sorted({v for c in contexts for v in c.values}))
    req = GenerationRequest(prompt, banned, seed, tuple(stop_strings(mode)), max_new_tokens,
                            adapter if mode == "prefix" else None)  # fmt: skip
    return ModeRequest(req, known)


def _quarantined(doc_id: str, mode: str, reason: str) -> dict[str, Any]:
    return {
        "doc_id": doc_id, "mode": mode, "context_ids": [], "fictional_code": "", "text": "",
        "context_values": [], "leaked_first": [], "leaked": [], "attempts": 0, "released": False,
        "new_tokens": 0, "finish": "error", "status": "quarantined", "reason": reason,
    }  # fmt: skip


def generate_rows(
    rows: Sequence[dict[str, Any]],
    pool: Sequence[ContextDoc],
    engine: GenerationEngine,
    tokenizer: Any,
    cfg: GenerationConfig,
    fictional: FictionalCodes,
    progress: Callable[[str], None] | None = None,
    prefix_engine: GenerationEngine | None = None,
    finetune_values: Sequence[str] | ValueIndex = (),
    banned_cache: dict[str, tuple[tuple[int, ...], ...]] | None = None,
    adapter: str = PREFIX_ADAPTER,
) -> pa.Table:
    """Generate every configured mode for every target row; one output row per (row, mode).

    ``progress`` (if given) receives one line per mode: outputs, new tokens, seconds
    (counts only, never text). ``prefix_engine`` and ``finetune_values`` serve the
    ``prefix`` mode (its ``context_values`` column stays empty: the reference set is
    the fine-tuning set's, stated once by the job); ``adapter`` names the prefix adapter among the engine's
    (an engine may hold several: :mod:`ray_jobs.generate_cells`).
    """
    icl_modes = [m for m in cfg.modes if m != "prefix"]
    if icl_modes and len(pool) < cfg.n_context + 1:
        raise CtrlgenError(f"context pool has {len(pool)} documents; need at least {cfg.n_context + 1}")
    if "prefix" in cfg.modes and prefix_engine is None and adapter not in getattr(engine, "adapters", {}):
        raise CtrlgenError("the prefix mode needs the prefix-tuned model (generation.adapter)")
    # Built once per call when given as values; callers with many batches pass a ValueIndex.
    finetune = as_index(finetune_values) if "prefix" in cfg.modes else ValueIndex(())
    out: list[dict[str, Any]] = []
    if banned_cache is None:  # a caller with many batches keeps one: the context pool is fixed
        banned_cache = {}

    def banned_of(ctx: ContextDoc) -> tuple[tuple[int, ...], ...]:
        if ctx.doc_id not in banned_cache:
            seqs = banned_sequences(tokenizer, ctx.values, leading_space=cfg.leading_space_variants)
            banned_cache[ctx.doc_id] = tuple(tuple(s) for s in seqs)
        return banned_cache[ctx.doc_id]

    # Per row, once for all modes: its contexts, their values, and its fictional code (or why not).
    prepared = []
    for r in rows:
        doc_id = str(r["doc_id"])
        contexts = draw_contexts(pool, cfg.n_context, cfg.seed, doc_id) if icl_modes else []
        values = sorted({v for c in contexts for v in c.values})
        fake, error = "", ""
        if any(m != "baseline" for m in cfg.modes):
            try:
                fake = format_control_code(
                    fictional.fictionalize(parse_control_code(r.get("control_code") or ""), doc_id)
                )
            except CtrlgenError as exc:
                error = f"fictional code: {exc}"
        prepared.append((doc_id, contexts, values, fake, error))

    # Per model: the requests of every mode it serves in one engine call (the ICL modes of a target share
    # their prompt, so the engine computes its prefill once), their known values and the row skeletons.
    # With one engine holding the prefix adapter, every mode goes into one call (rows of the base model and of the
    # adapter share the engine's batches); a separate prefix engine (the reference) gets its own call.
    groups: dict[str, list[str]] = {}
    for m in cfg.modes:
        groups.setdefault("prefix" if m == "prefix" and prefix_engine is not None else "base", []).append(m)
    for model_key, modes in groups.items():
        requests: list[GenerationRequest] = []
        known: list[tuple[str, ...] | ValueIndex] = []
        skeletons: list[dict[str, Any]] = []
        gate_on: list[bool] = []
        for mode in modes:
            for doc_id, contexts, values, fake, error in prepared:
                if mode != "baseline" and error:
                    out.append(_quarantined(doc_id, mode, error))
                    continue
                mr = mode_request(mode, contexts, fake, row_seed(cfg.seed, doc_id, mode), banned_of, finetune,
                                  adapter=adapter)  # fmt: skip
                requests.append(mr.request)
                prefix = mode == "prefix"
                known.append(mr.known)
                gate_on.append(cfg.gate.enabled and mode in cfg.gate.modes)
                skeletons.append(
                    {"doc_id": doc_id, "mode": mode, "context_ids": [] if prefix else [c.doc_id for c in contexts],
                     "fictional_code": fake if mode != "baseline" else "", "context_values": [] if prefix else values}
                )  # fmt: skip
        t0 = time.perf_counter()
        eng = engine
        if model_key == "prefix" and prefix_engine is not None:  # the prefix engine's own model is the tuned one
            eng = prefix_engine
            requests = [dataclasses.replace(r, adapter=None) for r in requests]
        # Into the engine target by target (a target's modes side by side): rows with the same prompt reach the
        # engine together, so its prefix cache still holds the prompt when the second mode comes; back in order.
        target_of = {doc_id: i for i, (doc_id, *_rest) in enumerate(prepared)}
        order = sorted(range(len(requests)), key=lambda i: (target_of[skeletons[i]["doc_id"]], i))
        done = gated_generate(eng, [requests[i] for i in order], [known[i] for i in order],
                              max_retries=cfg.gate.max_retries, enabled=[gate_on[i] for i in order])  # fmt: skip
        gated: list[Any] = [None] * len(order)
        for j, i in enumerate(order):
            gated[i] = done[j]
        secs = time.perf_counter() - t0
        if progress is not None:
            for md in modes:
                mine = [g for sk, g in zip(skeletons, gated, strict=True) if sk["mode"] == md]
                toks = sum(g.result.new_tokens for g in mine)
                retried = sum(g.attempts > 1 for g in mine)
                progress(
                    f"{md}: {len(mine)} outputs, {toks} new tokens ({'+'.join(modes)} in one engine call: "
                    f"{secs:.1f} s), {retried} regenerated by the gate"
                )
        for sk, g in zip(skeletons, gated, strict=True):
            if g.result.error is not None:
                out.append(_quarantined(sk["doc_id"], sk["mode"], f"generation: {g.result.error}"))
                continue
            out.append(
                {**sk, "text": g.result.text, "leaked_first": sorted(g.leaked_first), "leaked": sorted(g.leaked),
                 "attempts": g.attempts, "released": g.released, "new_tokens": g.result.new_tokens,
                 "finish": g.result.finish, "status": "ok", "reason": ""}
            )  # fmt: skip
    return pa.Table.from_pylist(out, schema=GENERATED_SCHEMA)
