"""LLM anonymisation of real notes (METHOD.md section 8.3): rewrite, attack, feed the hits back, repeat.

The baseline that releases each real note rewritten by a language model, as adversarial
anonymisation does it (Staab et al. 2024, "Large Language Models are Advanced Anonymizers";
the rounds and memory of METHOD.md section 8.3):

1. **rewrite**: the anonymiser model is asked to rewrite the current text so that the
   protected categories cannot be recognised, told the clues the attacker used last round and
   the scores of earlier rounds (the memory); with ``block_values`` (on by default, our addition)
   the note's own private values are also banned as token sequences while it writes, exactly as
   ICL + blocking bans them (:mod:`ctrlgen.generation.blocking`);
2. **attack**: an attacker prompt asks the model for its top-``guesses`` guesses of the
   protected values behind the rewrite; a guess *hits* when it matches one of the note's private
   values (the entity spans of the setting: gold when known, the extractor's when unknown), and
   every private value still present in the rewrite, as written or rewritten (``Smith, John``, the
   surname alone, a reformatted date: :mod:`ctrlgen.variants`), is a hit whatever the model guessed
   (so a weak attacker model cannot declare a copying rewrite private);
3. the hits become the clues of the next rewrite, until a round has no hit or ``rounds`` rounds
   have run.

Notes are cut into pieces of at most ``chunk_chars`` characters (line breaks first, never inside an
entity) so that a small model's context holds a piece and its rewrite; pieces with private values go
through the loop (all pieces of a batch of notes together), pieces without are kept.

The candidate released is the round with the fewest hits (the earliest among equals, the least
drifted): privacy first. METHOD.md's second phase (raising a task model's confidence without
losing privacy) is not implemented. A note whose best candidate still has hits is handled by
``on_failure``: ``redact`` (default) replaces the private values still in it (and their variants) by
their category tags (:func:`ctrlgen.anonymize.anonymize` semantics), ``withhold`` releases nothing, ``release``
releases it as is. Counts of rounds, hits and fallbacks are reported, never values.

The model is any :class:`~ctrlgen.generation.engine.GenerationEngine`: the built-in SmolLM2
(or any HF causal LM) through the engine ``model.engine`` names (``ctrlgen.generation.factory``), or an
OpenAI-compatible completions endpoint (a vLLM server, or ctrlgen's own Serve ``/v1/completions``)
through :class:`~ctrlgen.generation.remote.OpenAICompletionsEngine`. All notes of a batch go to
the engine together, one call per phase and round.

Example:
    >>> parse_guesses("1. Alice Jones\\n2) Boston\\n- none\\nBoston", 5)
    ['Alice Jones', 'Boston']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctrlgen.generation.engine import GenerationEngine, GenerationRequest
from ctrlgen.generation.icl import row_seed
from ctrlgen.generation.llm import build_engine
from ctrlgen.metrics.leakage import leaked_values, normalize_value, value_keys
from ctrlgen.schema import Entity
from ctrlgen.variants import Value, ValueLike, match_keys, split_value

__all__ = [
    "AnonymizerSettings",
    "LLMAnonymized",
    "attack_prompt",
    "attacker_hits",
    "build_engine",
    "chunk_spans",
    "llm_anonymize",
    "parse_guesses",
    "rewrite_prompt",
    "settings_of",
]

#: Category -> how the prompts name it.
_NAMES = {
    "PERSON": "names of people",
    "CODE": "record numbers, IDs and phone numbers",
    "LOC": "places and addresses",
    "ORG": "hospitals and organisations",
    "DEM": "ages, nationalities and other demographics",
    "DATETIME": "dates and times",
    "QUANTITY": "identifying quantities",
    "MISC": "other identifying details",
}
_NONE = {"none", "n/a", "unknown", "nothing", "no", "-", ""}


@dataclass(frozen=True)
class AnonymizerSettings:
    """The loop's knobs (``anonymizer`` in the YAML config; see :class:`ctrlgen.config.LLMAnonymizerConfig`)."""

    rounds: int = 3
    guesses: int = 5
    block_values: bool = True
    on_failure: str = "redact"  # redact | withhold | release
    max_new_tokens: int = 512
    length_factor: float = 1.3
    attack_max_new_tokens: int = 48
    chunk_chars: int = 1200
    seed: int = 0


@dataclass
class LLMAnonymized:
    """One note's result: the released text (None when withheld) and counts only."""

    doc_id: str
    text: str | None
    rounds: int  # rewrite rounds run
    hits: list[int] = field(default_factory=list)  # the attacker's hits after each round
    best_round: int = 0  # the round released (1-based; 0: none ran)
    status: str = "private"  # private | redacted | withheld | released_with_hits | error
    fallback_redacted: int = 0  # private values the redaction fallback replaced
    error: str | None = None


def settings_of(cfg: Any) -> AnonymizerSettings:
    """The loop's settings from a :class:`ctrlgen.config.LLMAnonymizerConfig`."""
    return AnonymizerSettings(
        rounds=cfg.rounds, guesses=cfg.guesses, block_values=cfg.block_values, on_failure=cfg.on_failure,
        max_new_tokens=cfg.sampling.max_new_tokens, length_factor=cfg.length_factor,
        attack_max_new_tokens=cfg.attack_max_new_tokens, chunk_chars=cfg.chunk_chars, seed=cfg.seed,
    )  # fmt: skip


def _categories(entities: Sequence[Entity]) -> list[str]:
    return sorted({e.category for e in entities})


def rewrite_prompt(text: str, categories: Sequence[str], clues: Sequence[str], memory: Sequence[int]) -> str:
    """The anonymiser's prompt: instructions, the attacker's clues and the earlier rounds' scores, the note."""
    what = ", ".join(_NAMES.get(c, c.lower()) for c in categories) or "names, dates, places and identifiers"
    lines = [
        "You are a clinical de-identification assistant. Rewrite the note below so that nobody can tell "
        f"who the patient is. Change or remove all {what}. Keep every medical fact, finding and treatment.",
    ]
    if memory:
        lines.append(
            "Earlier rewrites and how many private details an attacker still found in them: "
            + "; ".join(f"rewrite {i + 1}: {h}" for i, h in enumerate(memory))
            + "."
        )
    if clues:
        lines.append(
            "The attacker recognised these details in the last rewrite; remove them: " + "; ".join(clues) + "."
        )
    lines += ["", "Note:", text.strip(), "", "Rewritten note:", ""]
    return "\n".join(lines)


def attack_prompt(text: str, categories: Sequence[str], guesses: int) -> str:
    """The attacker's prompt: list up to ``guesses`` private details the text reveals, one per line."""
    what = ", ".join(_NAMES.get(c, c.lower()) for c in categories) or "names, dates, places and identifiers"
    return "\n".join([
        "You are an investigator re-identifying patients. Read the clinical note and list the real "
        f"{what} you can find or infer, at most {guesses}, one per line. Write 'none' if there are none.",
        "",
        "Note:",
        text.strip(),
        "",
        "Details:",
        "1.",
    ])  # fmt: skip


_BULLET = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s*")


def parse_guesses(output: str, k: int) -> list[str]:
    """The attacker's answer -> at most ``k`` distinct guesses (list markers and 'none' lines dropped)."""
    out: list[str] = []
    seen: set[str] = set()
    for line in output.splitlines():
        g = _BULLET.sub("", line).strip().strip(".,;:\"'")
        if ":" in g and len(g.split(":", 1)[0]) < 20:  # "Name: Alice Jones" -> "Alice Jones"
            g = g.split(":", 1)[1].strip()
        key = normalize_value(g)
        if key in _NONE or key in seen or len(key) > 80:
            continue
        seen.add(key)
        out.append(g)
        if len(out) == k:
            break
    return out


def attacker_hits(guesses: Sequence[str], text: str, values: Sequence[ValueLike]) -> set[str]:
    """The private values (normalised) the attacker got: a guess equal to one or to one of its variants, or
    containing or contained in one (both at least 3 characters), plus every value still in ``text`` as
    itself or a variant (METHOD.md section 6's matcher, :mod:`ctrlgen.variants`)."""
    keys = value_keys(values)  # variant -> the values it stands for
    norm = {v for vs in keys.values() for v in vs}
    hits = set(leaked_values(text, values)) if text else set()
    for g in guesses:
        gk = normalize_value(g)
        if len(gk) < 2:
            continue
        hits |= keys.get(gk, set())
        for v in norm:
            if gk == v or (len(gk) >= 3 and len(v) >= 3 and (gk in v or v in gk)):
                hits.add(v)
    return hits


def _redact_values(text: str, values: Sequence[ValueLike], leaked: set[str]) -> tuple[str, int]:
    """``text`` with every occurrence of the ``leaked`` values (normalised), as written or as a variant,
    replaced by the value's category tag (``<MISC>`` when it has none)."""
    forms: dict[str, str] = {}  # a variant (normalised) -> the category tag replacing it
    for item in values:
        value, category = split_value(item)
        if normalize_value(value) in leaked:
            for key in match_keys(value, category):
                forms.setdefault(key, category or "MISC")
    n = 0
    for key in sorted(forms, key=len, reverse=True):  # longest first: "John Smith" before "Smith"
        pattern = re.compile(r"(?<!\w)" + r"\s+".join(re.escape(p) for p in key.split()) + r"(?!\w)", re.IGNORECASE)
        text, k = pattern.subn(f"<{forms[key]}>", text)
        n += k
    return text, n


@dataclass
class _Doc:
    """One chunk of a note: the unit the loop rewrites and attacks."""

    doc_id: str
    original: str
    entities: list[Entity]
    values: list[Value]
    categories: list[str]
    banned: tuple[tuple[int, ...], ...]
    key: str = ""
    current: str = ""
    clues: list[str] = field(default_factory=list)
    candidates: list[tuple[int, str]] = field(default_factory=list)  # (hits, text) per round
    result: LLMAnonymized | None = None


def chunk_spans(text: str, entities: Sequence[Entity], max_chars: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) pieces covering ``text``, each at most ``max_chars`` where possible: cut at the
    last line break, else the last sentence end, else hard; never inside an entity span."""
    spans = []
    start, n = 0, len(text)
    while start < n:
        if n - start <= max_chars:
            spans.append((start, n))
            break
        limit = start + max_chars
        cut = text.rfind("\n", start + 1, limit)
        if cut < 0:
            cut = text.rfind(". ", start + 1, limit)
            cut = cut + 1 if cut >= 0 else limit
        cut += 1 if text[cut - 1 : cut] != "\n" and text[cut : cut + 1] == "\n" else 0
        moved = True
        while moved:  # never split an entity
            moved = False
            for e in entities:
                if e.start < cut < e.end:
                    cut, moved = e.end, True
        spans.append((start, cut))
        start = cut
    return spans


def llm_anonymize(
    engine: GenerationEngine,
    docs: Sequence[tuple[str, str, Sequence[Entity]]],
    settings: AnonymizerSettings,
    *,
    tokenizer: Any = None,
    count_tokens: Callable[[str], int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[LLMAnonymized]:
    """Run the loop over ``docs`` = (doc_id, text, entities); results in input order.

    Each note is cut into pieces of at most ``settings.chunk_chars`` characters (line breaks first, never
    inside an entity); pieces holding private values go through the loop independently, all pieces of
    all notes batched together, and pieces without one are kept as they are (nothing to protect: in the
    unknown setting that includes whatever the extractor missed). A note's hits per round are the sum over
    its pieces, its status the worst of theirs.

    ``tokenizer`` (the engine's) turns the private values into banned sequences when
    ``settings.block_values``; without one nothing is banned (a remote endpoint). ``count_tokens``
    sizes each rewrite (``length_factor`` x the piece's tokens, at most ``max_new_tokens``); default:
    characters / 4.
    """
    from ctrlgen.generation.blocking import banned_sequences

    count = count_tokens or (lambda t: max(1, len(t) // 4))
    s = settings
    if s.on_failure not in ("redact", "withhold", "release"):
        raise ValueError(f"on_failure must be redact, withhold or release, not {s.on_failure!r}")
    pieces: list[list[tuple[int, int, _Doc | None]]] = []
    work: list[_Doc] = []
    for doc_id, text, entities in docs:
        for e in entities:
            if not (0 <= e.start < e.end <= len(text)):
                raise ValueError(
                    f"document {doc_id!r}: span [{e.start}, {e.end}) outside a text of {len(text)} characters"
                )
        parts: list[tuple[int, int, _Doc | None]] = []
        for i, (a, b) in enumerate(chunk_spans(text, entities, s.chunk_chars)):
            ents = [Entity(e.start - a, e.end - a, e.text, e.category, e.kind, e.source, e.label)
                    for e in entities if a <= e.start and e.end <= b]  # fmt: skip
            # Each value with its category: blocking, the attack's matcher and the redaction take its variants.
            values = sorted({e.text: Value(e.text, e.category) for e in ents if e.text.strip()}.values())
            if not values or not text[a:b].strip():
                parts.append((a, b, None))
                continue
            banned: tuple[tuple[int, ...], ...] = ()
            if s.block_values and tokenizer is not None:
                banned = tuple(tuple(q) for q in banned_sequences(tokenizer, values))
            d = _Doc(str(doc_id), text[a:b], ents, values, _categories(ents), banned, key=f"{doc_id}#{i}",
                     current=text[a:b])  # fmt: skip
            parts.append((a, b, d))
            work.append(d)
        pieces.append(parts)
    for rnd in range(1, s.rounds + 1):
        todo = [d for d in work if d.result is None]
        if not todo:
            break
        reqs = [
            GenerationRequest(
                rewrite_prompt(d.current, d.categories, d.clues, [h for h, _ in d.candidates]),
                banned=d.banned,
                seed=row_seed(s.seed, "anonymize-rewrite", d.key, str(rnd)),
                stop=("\nNote:", "\n\n\n"),
                max_new_tokens=max(16, min(s.max_new_tokens, int(count(d.original) * s.length_factor) + 16)),
            )
            for d in todo
        ]
        rewrites = engine.generate(reqs)
        attacked = []
        for d, res in zip(todo, rewrites, strict=True):
            if res.error is not None or not res.text.strip():
                # A failed or empty rewrite is a round whose text is the previous one, every value counted hit.
                d.candidates.append((len({normalize_value(v) for v in d.values}), d.current))
                d.clues = []
                if res.error is not None:
                    d.result = _final(d, s, error=res.error)
                continue
            d.current = res.text.strip()
            attacked.append(d)
        if attacked:
            answers = engine.generate([
                GenerationRequest(attack_prompt(d.current, d.categories, s.guesses),
                                  seed=row_seed(s.seed, "anonymize-attack", d.key, str(rnd)),
                                  stop=("\n\n",), max_new_tokens=s.attack_max_new_tokens)
                for d in attacked
            ])  # fmt: skip
            for d, ans in zip(attacked, answers, strict=True):
                guesses = parse_guesses(ans.text, s.guesses) if ans.error is None else []
                hits = attacker_hits(guesses, d.current, d.values)
                d.candidates.append((len(hits), d.current))
                d.clues = sorted(hits)
                if not hits:
                    d.result = _final(d, s)
        if progress:
            done = sum(d.result is not None for d in work)
            progress(f"anonymiser round {rnd}/{s.rounds}: {len(todo)} pieces rewritten, {done}/{len(work)} pieces done")
    for d in work:
        if d.result is None:
            d.result = _final(d, s)
    return [_assemble(str(doc_id), text, parts) for (doc_id, text, _), parts in zip(docs, pieces, strict=True)]


_RANK = {"private": 0, "redacted": 1, "released_with_hits": 2, "withheld": 3, "error": 4}


def _assemble(doc_id: str, text: str, parts: Sequence[tuple[int, int, _Doc | None]]) -> LLMAnonymized:
    """A note's result from its pieces' (original whitespace kept around each rewritten piece)."""
    out: list[str] = []
    results = [d.result for _, _, d in parts if d is not None and d.result is not None]
    rounds = max((r.rounds for r in results), default=0)
    hits = [sum(r.hits[min(i, len(r.hits) - 1)] for r in results if r.hits) for i in range(rounds)]
    status = max((r.status for r in results), key=_RANK.__getitem__, default="private")
    errors = [r.error for r in results if r.error]
    if status in ("withheld", "error"):
        return LLMAnonymized(doc_id, None, rounds, hits, rounds, status, 0, errors[0] if errors else None)
    for a, b, d in parts:
        piece = text[a:b]
        if d is None or d.result is None or d.result.text is None:
            out.append(piece)
            continue
        lead = piece[: len(piece) - len(piece.lstrip())]
        trail = piece[len(piece.rstrip()) :]
        out.append(lead + d.result.text.strip() + trail)
    best = max((r.best_round for r in results), default=0)
    return LLMAnonymized(doc_id, "".join(out), rounds, hits, best, status,
                         sum(r.fallback_redacted for r in results))  # fmt: skip


def _final(d: _Doc, s: AnonymizerSettings, error: str | None = None) -> LLMAnonymized:
    hits = [h for h, _ in d.candidates]
    if error is not None and all(t == d.original for _, t in d.candidates):
        return LLMAnonymized(d.doc_id, None, len(hits), hits, 0, "error", error=error)
    best = min(range(len(d.candidates)), key=lambda i: (d.candidates[i][0], i))
    n_hits, text = d.candidates[best]
    res = LLMAnonymized(d.doc_id, text, len(d.candidates), hits, best + 1, "private")
    if n_hits == 0:
        return res
    if s.on_failure == "withhold":
        res.text, res.status = None, "withheld"
    elif s.on_failure == "release":
        res.status = "released_with_hits"
    else:
        res.text, res.fallback_redacted = _redact_values(text, d.values, leaked_values(text, d.values))
        # Hits that are guesses only (nothing verbatim to redact) stay: the status says so.
        res.status = "redacted" if res.fallback_redacted else "released_with_hits"
    return res
