"""On-demand synthesis (what the Serve generator runs per request), on the batch job's building blocks.

A request asks for ``n`` outputs of one mode, with an optional (fictional) control code
and a seed. :class:`SynthesisPlanner` turns it into ``n`` :class:`PlannedOutput`,
each carrying the engine request and the values the release gate checks, built with
the batch job's :func:`~ctrlgen.generation.icl.mode_request`. For output ``i``:

* its seed is ``row_seed(seed, "output", i)``: the output depends on the request
  alone, never on other requests batched with it;
* without a given code, a *template* document is drawn from the context pool and
  its code is fictionalised (the batch job fictionalises each target's code the same
  way, :class:`~ctrlgen.fictional.FictionalCodes`); a given code is used as sent;
* ICL modes draw ``n_context`` contexts from the pool (never the template), as
  :func:`~ctrlgen.generation.icl.draw_contexts` does for a batch target.

Pool and exclusion set come from an extraction output, streamed:
:func:`load_pool_rows` keeps the batch job's seeded pool, :func:`corpus_values`
every private value (fictional codes never use one).

Example:
    >>> from ctrlgen.models import tiny_llama
    >>> from ctrlgen.config import GenerationConfig
    >>> from ctrlgen.fictional import FictionalCodes
    >>> _, tok = tiny_llama()
    >>> rows = [{"doc_id": str(i), "text": f"Note {i}.", "control_code": f"PERSON: Name{i}"} for i in range(5)]
    >>> planner = SynthesisPlanner(rows, tok, GenerationConfig(), FictionalCodes(0, ["Name1"]))
    >>> [len(p.context_ids) for p in planner.plan("icl_blocking", n=2, seed=7)]
    [3, 3]
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrlgen.codes import format_control_code, parse_control_code
from ctrlgen.config import GenerationConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.fictional import FictionalCodes, code_values
from ctrlgen.generation.blocking import banned_sequences
from ctrlgen.generation.icl import (
    ContextDoc,
    ModeRequest,
    build_pool,
    draw_contexts,
    mode_request,
    row_seed,
    select_pool,
)
from ctrlgen.metrics.leakage import ValueIndex

__all__ = ["PlannedOutput", "SynthesisPlanner", "corpus_values", "iter_extracted", "load_pool_rows"]

_COLUMNS = ["doc_id", "text", "control_code"]


def iter_extracted(path: str | Path, batch_rows: int = 4096) -> Iterator[list[dict[str, Any]]]:
    """Batches of (doc_id, text, control_code) rows of an extraction output (its status=ok part)."""
    from ctrlgen import storage

    files = storage.parquet_files(str(path), within="status=ok")
    if not files:
        raise CtrlgenError(f"{path} holds no Parquet files (an extraction output is expected: run `ctrlgen extract`)")
    for batch in storage.dataset(files).to_batches(columns=_COLUMNS, batch_size=batch_rows):
        yield batch.to_pylist()


def load_pool_rows(path: str | Path, cfg: GenerationConfig) -> list[dict[str, Any]]:
    """The batch job's seeded context pool (``context_pool_size`` rows, with a code when ``require_code``)."""

    def eligible() -> Iterator[list[dict[str, Any]]]:
        for rows in iter_extracted(path):
            yield [r for r in rows if (r["control_code"] or "") or not cfg.require_code]

    pool = select_pool(eligible(), cfg.context_pool_size, cfg.seed)
    if len(pool) < cfg.n_context + 1:
        raise CtrlgenError(
            f"only {len(pool)} eligible documents in {path}; ICL needs at least {cfg.n_context + 1} "
            "(documents without a control code are skipped when generation.require_code is true)"
        )
    return pool


def corpus_values(path: str | Path) -> set[str]:
    """Every distinct private value of an extraction output's control codes."""
    return {
        v
        for rows in iter_extracted(path)
        for r in rows
        for v in code_values(parse_control_code(r["control_code"] or ""))
    }


@dataclass(frozen=True)
class PlannedOutput:
    """One output of a request: what to generate and what the answer reports about it."""

    mode: str
    work: ModeRequest
    fictional_code: str
    context_ids: tuple[str, ...]
    template_id: str  # the pool document whose code was fictionalised ("" when the request gave a code)


class SynthesisPlanner:
    """Holds the context pool (cut to the token budget once) and the banned sequences of each context."""

    def __init__(
        self,
        pool_rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        cfg: GenerationConfig,
        fictional: FictionalCodes,
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.fictional = fictional
        self.pool: list[ContextDoc] = build_pool(pool_rows, tokenizer, cfg.max_context_tokens)
        self._banned: dict[str, tuple[tuple[int, ...], ...]] = {}

    def banned_of(self, ctx: ContextDoc) -> tuple[tuple[int, ...], ...]:
        if ctx.doc_id not in self._banned:
            seqs = banned_sequences(self.tokenizer, ctx.values, leading_space=self.cfg.leading_space_variants)
            self._banned[ctx.doc_id] = tuple(tuple(s) for s in seqs)
        return self._banned[ctx.doc_id]

    def plan(
        self,
        mode: str,
        n: int = 1,
        seed: int = 0,
        control_code: str | None = None,
        max_new_tokens: int | None = None,
        finetune_values: Sequence[str] | ValueIndex = (),
    ) -> list[PlannedOutput]:
        """The ``n`` outputs of one request; raises :class:`CtrlgenError` for a code that cannot be used."""
        given = None
        if control_code is not None:
            given = format_control_code(parse_control_code(control_code))
            if not given:
                raise CtrlgenError("control_code holds no category line (expected lines like 'PERSON: A Name')")
        out = []
        for i in range(n):
            out_seed = row_seed(seed, "output", str(i))
            template = ""
            if given is not None:
                fake = given
                key = f"request/{seed}/{i}"
            else:
                doc = self.pool[random.Random(out_seed).randrange(len(self.pool))]
                template, key = doc.doc_id, doc.doc_id
                fake = format_control_code(
                    self.fictional.fictionalize(parse_control_code(doc.code_text), f"{doc.doc_id}/{seed}/{i}")
                )
            contexts = draw_contexts(self.pool, self.cfg.n_context, out_seed, key) if mode != "prefix" else []
            work = mode_request(mode, contexts, fake, out_seed, self.banned_of, finetune_values, max_new_tokens)
            out.append(PlannedOutput(mode, work, fake, tuple(c.doc_id for c in contexts), template))
        return out
