"""Canary insertion and exposure rank (Carlini et al., "The Secret Sharer").

A canary is a sentence with a random secret (``Medical record number 482913.``)
planted into ``repeats`` training documents before fine-tuning. It is marked as a
private entity (CODE, DIRECT, source ``canary``) in those documents, so the masked
loss treats it like any other private value. By default the host's control code lists
it like any other private value; ``in_code=False`` leaves it out of the code (a secret the
model is never told, Carlini et al.'s setting: with the secret in the prompt a model can
lower its loss on it by copying it from the prompt rather than by memorising it). After training, the model's
negative log-likelihood of the canary sentence is ranked among the same sentence
with ``n_candidates`` other random secrets of the same shape:

    exposure = log2(n_candidates + 1) - log2(rank)

rank 1 (the planted secret is the most likely) gives the maximum, a rank in the
middle (the model knows nothing) about 1. Ties count against the canary (rank =
1 + candidates with NLL <= the canary's), so a constant model gets exposure 0.

Example:
    >>> c = make_canaries(2, seed=0)
    >>> [len(x.secret) for x in c], c[0].text.startswith("Medical record number ")
    ([6, 6], True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctrlgen.codes import build_control_code, format_control_code
from ctrlgen.schema import Entity

__all__ = ["Canary", "canary_prompt", "candidate_texts", "exposure", "insert_canaries", "make_canaries"]

TEMPLATE = "Medical record number {}."
DIGITS = 6


@dataclass(frozen=True)
class Canary:
    secret: str
    repeats: int

    @property
    def text(self) -> str:
        return TEMPLATE.format(self.secret)


def _secret(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(DIGITS))


def make_canaries(n: int, seed: int, repeats: Sequence[int] = (1,)) -> list[Canary]:
    """``n`` canaries with distinct random secrets; the i-th is planted ``repeats[i % len]`` times."""
    rng = random.Random(f"canaries\x1f{seed}")
    secrets: list[str] = []
    while len(secrets) < n:
        s = _secret(rng)
        if s not in secrets:
            secrets.append(s)
    return [Canary(s, int(repeats[i % len(repeats)])) for i, s in enumerate(secrets)]


def insert_canaries(
    rows: Sequence[dict[str, Any]], canaries: Sequence[Canary], seed: int, in_code: bool = True
) -> list[dict[str, Any]]:
    """Extraction rows with the canaries planted at the start of seeded host documents.

    Each planting uses a different host; the host's entity offsets shift, the secret
    becomes a CODE entity and the control code is rebuilt (listing the secret, or with
    ``in_code=False`` the host's other entities only). Raises when there are fewer rows
    than plantings.
    """
    plantings = [c for c in canaries for _ in range(c.repeats)]
    if len(plantings) > len(rows):
        raise ValueError(f"{len(plantings)} canary plantings need as many documents; got {len(rows)}")
    order = sorted(range(len(rows)), key=lambda i: str(rows[i]["doc_id"]))
    random.Random(f"hosts\x1f{seed}").shuffle(order)
    out = [dict(r) for r in rows]
    start = len(TEMPLATE.split("{}")[0])  # where the secret sits in the planted sentence
    for canary, i in zip(plantings, order, strict=False):
        r = out[i]
        head = canary.text + " "
        shift = len(head)
        ents = [Entity(**e) if isinstance(e, dict) else e for e in (r.get("entities") or [])]
        moved = [Entity(e.start + shift, e.end + shift, e.text, e.category, e.kind, e.source, e.label) for e in ents]
        planted = Entity(start, start + len(canary.secret), canary.secret, "CODE", "DIRECT", "canary", "Canary")
        ents = [planted, *moved]
        r["text"] = head + r["text"]
        r["entities"] = [e.to_row() for e in ents]
        r["control_code"] = format_control_code(build_control_code(ents if in_code else moved))
    return out


def canary_prompt(rows: Sequence[dict[str, Any]], canary: Canary) -> str:
    """The prompt a canary was trained behind, without the secret: the control-code prompt of its first host
    (by doc_id) built from the host's other entities. Exposure is measured on the canary as its continuation,
    as the tuned model meets it (the host's code itself lists the secret, which would give it away)."""
    from ctrlgen.prompts import prefix_prompt

    for r in sorted(rows, key=lambda r: str(r["doc_id"])):
        ents = [Entity(**e) if isinstance(e, dict) else e for e in (r.get("entities") or [])]
        if any(e.source == "canary" and e.text == canary.secret for e in ents):
            return prefix_prompt(format_control_code(build_control_code([e for e in ents if e.source != "canary"])))
    raise ValueError("the canary was not planted in these rows")


def candidate_texts(canary: Canary, n_candidates: int, seed: int) -> list[str]:
    """The canary's sentence first, then ``n_candidates`` with other distinct random secrets."""
    rng = random.Random(f"candidates\x1f{seed}\x1f{canary.secret}")
    seen = {canary.secret}
    texts = [canary.text]
    while len(texts) < n_candidates + 1:
        s = _secret(rng)
        if s not in seen:
            seen.add(s)
            texts.append(TEMPLATE.format(s))
    return texts


def exposure(
    canary: Canary, nll: Callable[[list[str]], list[float]], n_candidates: int = 999, seed: int = 0
) -> tuple[float, int]:
    """(exposure, rank) of ``canary`` under a scorer returning one NLL per text (all candidates scored the same
    way: alone, or after the same prompt, see :func:`canary_prompt`)."""
    texts = candidate_texts(canary, n_candidates, seed)
    scores = nll(texts)
    own = scores[0]
    rank = 1 + sum(1 for s in scores[1:] if s <= own)
    return math.log2(n_candidates + 1) - math.log2(rank), rank
