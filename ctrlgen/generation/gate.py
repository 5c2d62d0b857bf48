"""Release gate (METHOD.md section 4): no released output contains a known private value.

After a batch is generated, every output is checked against the private values
of its own context (the matching of section 6: case-insensitive, word
boundaries, the value or any of its variants, :mod:`ctrlgen.variants`: the same
variants hard blocking bans). Leaking outputs are regenerated with a new seed, up to
``max_retries`` times; what still leaks is withheld (``released`` False) and
counted. Released text therefore leaks no known value, by construction: the
check that decides release is the metric's own matcher.

Example:
    >>> class Echo:  # an engine that copies a fixed text
    ...     def generate(self, reqs):
    ...         from ctrlgen.generation.engine import GenerationResult
    ...         return [GenerationResult("Seen by Dr. Smith") for _ in reqs]
    >>> from ctrlgen.generation.engine import GenerationRequest
    >>> out = gated_generate(Echo(), [GenerationRequest("p")], [["Smith"]], max_retries=1)
    >>> out[0].released, out[0].attempts, sorted(out[0].leaked_first)
    (False, 2, ['smith'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ctrlgen.generation.engine import GenerationEngine, GenerationRequest, GenerationResult
from ctrlgen.metrics.leakage import ValueIndex, leaked_values
from ctrlgen.variants import ValueLike

__all__ = ["GatedResult", "gated_generate"]

_RETRY_SEED_STEP = 1_000_003


@dataclass
class GatedResult:
    """The final result of one request plus what the gate saw."""

    result: GenerationResult
    attempts: int
    leaked_first: set[str]  # known values in the first attempt's text
    leaked: set[str]  # known values in the final text (empty when released)
    released: bool


def gated_generate(
    engine: GenerationEngine,
    requests: Sequence[GenerationRequest],
    known_values: Sequence[Iterable[ValueLike] | ValueIndex],
    *,
    max_retries: int = 3,
    enabled: bool | Sequence[bool] = True,
) -> list[GatedResult]:
    """Generate, then regenerate leaking outputs (bounded); withhold what still leaks.

    ``enabled`` is one flag for all rows or one per row (a batch may mix gated and
    ungated modes in one engine call). A row with the gate off is released as
    generated (its leaks are still reported). Failed generations (``result.error``)
    are never released. Retries of all gated rows go to the engine together.
    ``known_values`` per row: strings, :class:`~ctrlgen.variants.Value` strings or
    ``(value, category)`` pairs (their variants count too), or a :class:`ValueIndex`.
    """
    if len(requests) != len(known_values):
        raise ValueError(f"{len(requests)} requests but {len(known_values)} value lists")
    gate = [enabled] * len(requests) if isinstance(enabled, bool) else list(enabled)
    if len(gate) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(gate)} gate flags")
    known = [vs if isinstance(vs, ValueIndex) else list(vs) for vs in known_values]
    first = engine.generate(requests)
    out = []
    for res, values, on in zip(first, known, gate, strict=True):
        leaks = leaked_values(res.text, values) if res.error is None else set()
        out.append(GatedResult(res, 1, leaks, leaks, res.error is None and (not leaks or not on)))
    for attempt in range(1, max_retries + 1):
        todo = [i for i, g in enumerate(out) if gate[i] and g.result.error is None and g.leaked]
        if not todo:
            break
        retry = [dataclasses.replace(requests[i], seed=requests[i].seed + attempt * _RETRY_SEED_STEP) for i in todo]
        for i, res in zip(todo, engine.generate(retry), strict=True):
            g = out[i]
            g.attempts += 1
            if res.error is not None:
                continue
            g.result = res
            g.leaked = leaked_values(res.text, known[i])
            g.released = not g.leaked
    return out
