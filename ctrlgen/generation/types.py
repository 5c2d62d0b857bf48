"""What every generation engine takes and returns, and the seam callers program against.

:class:`GenerationEngine` is the seam: anything that turns a list of :class:`GenerationRequest` into
:class:`GenerationResult` (same order) serves the jobs, the Serve deployments and the evaluation-side LLM
steps. :func:`ctrlgen.generation.factory.build_engine` is the one place that names an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["GenerationEngine", "GenerationRequest", "GenerationResult"]


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue.

    Attributes:
        prompt: the text to continue.
        banned: token sequences that must not be generated (see ``banned_sequences``).
        seed: seeds this row's sampling.
        stop: strings at which generation stops; the output is cut before them.
        max_new_tokens: this row's limit (None: the engine's ``sampling.max_new_tokens``).
        adapter: the prefix adapter the row generates through (a name the engine was given; None: the
            engine's default, the base model unless the engine was built on a prefix model).
        temperature, top_p: this row's sampling (None: the engine's ``sampling``); temperature 0 is greedy.
    """

    prompt: str
    banned: tuple[tuple[int, ...], ...] = ()
    seed: int = 0
    stop: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    adapter: str | None = None
    temperature: float | None = None
    top_p: float | None = None


@dataclass
class GenerationResult:
    """``text`` is the continuation (cut before a stop string); ``error`` is set instead on failure."""

    text: str
    new_tokens: int = 0
    finish: str = "length"  # "stop" | "eos" | "length" | "error"
    error: str | None = None
    seconds: float = 0.0
    token_ids: tuple[int, ...] = ()  # the generated tokens (before the text was cut at a stop string)


class GenerationEngine(Protocol):
    """What the generation jobs need from an engine."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request; results in request order, one per request."""
        ...
