"""Semantic re-identification attack (METHOD.md section 8.2): leaks that share no surface string.

1. Every original record is split into atomic claims (:func:`atomize`: sentences, then
   clauses at ``;`` and at ``, `` before a new subject-like clause, each of at least
   ``min_words`` words).
2. The attacker knows ``k`` = 3 seeded claims of a record, concatenates them and links the
   query to the single best released document: BM25 (:class:`ctrlgen.metrics.linkage.BM25`)
   or dense retrieval (cosine of sentence embeddings, MiniLM by default). A link is correct
   when the released document was made from that record (``Released.sources``: the note an
   anonymised text edits, the contexts an ICL output was prompted with); the correct-linkage
   rate is over the records that some released document was made from.
3. The record's other claims are scored against the linked document:
   * lexical privacy = 1 - ROUGE-L F1(original, linked document);
   * semantic privacy = mean over the claims of the judge's verdict, 0 (same information),
     0.5 (partly), 1 (not supported); higher is more private.

The judge offline is :class:`SimilarityJudge`: the claim's best cosine similarity with the
linked document's claims, cut at two thresholds calibrated on pairs built from the records
(:func:`calibrate`): a claim against itself with words dropped (same), against a claim
whose second half comes from another record (partly) and against another record's claim
(not supported). It is the weaker judge: it scores topical similarity, not entailment. An
LLM judge (3 queries, majority) plugs in through the same ``Judge`` call.

Example:
    >>> atomize("Pt is a 65 yo man with CHF. He was seen in clinic; BP was stable.")
    ['Pt is a 65 yo man with CHF.', 'He was seen in clinic', 'BP was stable.']
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ctrlgen.metrics.context import words
from ctrlgen.metrics.linkage import BM25
from ctrlgen.metrics.rouge import rouge_pair

__all__ = [
    "Record",
    "Released",
    "SemanticResult",
    "SimilarityJudge",
    "atomize",
    "calibrate",
    "query_claims",
    "semantic_attack",
]

_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])|\n+")
_CLAUSE = re.compile(r";\s*|,\s+(?=(?:and|but|which|who|he|she|they|pt|patient)\b)", re.I)

#: Judge verdicts and their privacy score.
SAME, PARTLY, UNSUPPORTED = 0, 1, 2
_PRIVACY = {SAME: 0.0, PARTLY: 0.5, UNSUPPORTED: 1.0}

Judge = Callable[[Sequence[str], str], list[int]]  # (claims, linked document) -> one verdict per claim


def _tokens(text: str) -> list[str]:
    return [w for w, _, _ in words(text)]


def atomize(text: str, min_words: int = 3) -> list[str]:
    """Atomic claims of ``text`` (rule-based; duplicates and fragments under ``min_words`` words dropped)."""
    out: list[str] = []
    seen: set[str] = set()
    for sentence in _SENT.split(text):
        for clause in _CLAUSE.split(sentence):
            c = " ".join(clause.split()).strip(" ,;:-")
            key = c.casefold()
            if len(_tokens(c)) >= min_words and key not in seen:
                seen.add(key)
                out.append(c)
    return out


@dataclass(frozen=True)
class Record:
    """An original (real) record."""

    doc_id: str
    text: str


@dataclass(frozen=True)
class Released:
    """A released document and the originals it was made from (empty: unknown, e.g. a prefix model's)."""

    doc_id: str
    text: str
    sources: tuple[str, ...] = ()


@dataclass
class SemanticResult:
    attacked: int  # records with more than k claims
    linkable: int  # of those, records some released document was made from
    correct_links: int
    lexical_privacy: float  # mean over attacked records
    semantic_privacy: float  # mean over attacked records of the mean claim score
    skipped: int  # records with k claims or fewer
    per_record: list[dict[str, Any]] = field(default_factory=list)

    @property
    def linkage_rate(self) -> float:
        return self.correct_links / self.linkable if self.linkable else 0.0


def query_claims(claims: Sequence[str], k: int, seed: int, doc_id: str) -> tuple[list[int], list[int]]:
    """Indices of the ``k`` claims the attacker knows (seeded per record) and of the rest."""
    idx = list(range(len(claims)))
    random.Random(f"semantic\x1f{seed}\x1f{doc_id}").shuffle(idx)
    return sorted(idx[:k]), sorted(idx[k:])


def _unit(encoder: Any, texts: Sequence[str]) -> np.ndarray:
    """Sentence embeddings (:func:`ctrlgen.metrics.utility.text_features`) scaled to unit length."""
    from ctrlgen.metrics.utility import text_features

    e = text_features(encoder, texts, batch_size=64)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-9)  # type: ignore[no-any-return]


class SimilarityJudge:
    """Offline judge: best cosine similarity of a claim with the document's claims, two thresholds."""

    def __init__(self, encoder: Any, same: float, partly: float) -> None:
        if not partly < same:
            raise ValueError(f"thresholds must satisfy partly < same; got {partly} and {same}")
        self.encoder, self.same, self.partly = encoder, same, partly

    def similarity(self, claims: Sequence[str], document: str) -> np.ndarray:
        parts = atomize(document, 1) or [document]
        return (_unit(self.encoder, claims) @ _unit(self.encoder, parts).T).max(axis=1)  # type: ignore[no-any-return]

    def __call__(self, claims: Sequence[str], document: str) -> list[int]:
        if not claims:
            return []
        sims = self.similarity(claims, document)
        return [SAME if s >= self.same else PARTLY if s >= self.partly else UNSUPPORTED for s in sims]


def calibrate(
    encoder: Any, texts: Sequence[str], seed: int = 0, pairs: int = 200
) -> tuple[float, float, dict[str, float]]:
    """(same, partly) thresholds from pairs built out of ``texts``' claims, and the pair medians.

    same: midway between the 10th percentile of "same" pairs (a claim vs itself with a fifth of its
    words dropped) and the 90th of "partly" pairs (first half of the claim + second half of another
    record's); partly: midway between the 10th percentile of "partly" and the 90th of unrelated pairs.
    """
    rng = random.Random(f"calibrate\x1f{seed}")
    claims = [(i, c) for i, t in enumerate(texts) for c in atomize(t, 5)]
    if len({i for i, _ in claims}) < 2:
        raise ValueError("calibration needs claims of at least 5 words from at least 2 texts")
    same, partly, none = [], [], []
    for _ in range(pairs):
        (i, a), (j, b) = rng.sample(claims, 2)
        while j == i:
            j, b = rng.choice(claims)
        wa, wb = a.split(), b.split()
        dropped = [w for w in wa if rng.random() > 0.2] or wa
        half = wa[: len(wa) // 2] + wb[len(wb) // 2 :]
        same.append((" ".join(dropped), a))
        partly.append((" ".join(half), a))
        none.append((b, a))

    def sims(ps: list[tuple[str, str]]) -> np.ndarray:
        x, y = _unit(encoder, [p for p, _ in ps]), _unit(encoder, [q for _, q in ps])
        return (x * y).sum(axis=1)  # type: ignore[no-any-return]

    s, p, n = sims(same), sims(partly), sims(none)
    t_same = float((np.percentile(s, 10) + np.percentile(p, 90)) / 2)
    t_partly = float((np.percentile(p, 10) + np.percentile(n, 90)) / 2)
    t_partly = min(t_partly, t_same - 1e-3)
    return t_same, t_partly, {"same": float(np.median(s)), "partly": float(np.median(p)), "none": float(np.median(n))}


def semantic_attack(
    records: Sequence[Record],
    released: Sequence[Released],
    judge: Judge,
    k: int = 3,
    seed: int = 0,
    retriever: Literal["bm25", "dense"] = "bm25",
    encoder: Any = None,
) -> SemanticResult:
    """Link every record's k known claims to a released document and score what else it reveals."""
    if not released:
        raise ValueError("the released set is empty")
    if retriever == "dense" and encoder is None:
        raise ValueError("dense retrieval needs a sentence encoder")
    made_from: set[str] = {s for r in released for s in r.sources}
    res = SemanticResult(0, 0, 0, 0.0, 0.0, 0)
    attacked: list[tuple[Record, list[str], list[int], str]] = []  # record, claims, unused claims, query
    for rec in records:
        claims = atomize(rec.text)
        if len(claims) <= k:
            res.skipped += 1
            continue
        known, rest = query_claims(claims, k, seed, rec.doc_id)
        attacked.append((rec, claims, rest, " ".join(claims[i] for i in known)))
    if not attacked:
        best = np.zeros(0, dtype=np.int64)
    elif retriever == "dense":  # every query embedded in one batch, one matrix product
        best = (_unit(encoder, [q for *_, q in attacked]) @ _unit(encoder, [r.text for r in released]).T).argmax(1)
    else:
        bm = BM25([_tokens(r.text) for r in released])
        best = np.array([int(np.argmax(bm.scores(_tokens(q)))) for *_, q in attacked], dtype=np.int64)
    lexical, semantic = [], []
    for (rec, claims, rest, _), b in zip(attacked, best.tolist(), strict=True):
        linked = released[b]
        res.attacked += 1
        correct = rec.doc_id in linked.sources
        if rec.doc_id in made_from:
            res.linkable += 1
            res.correct_links += int(correct)
        lex = 1.0 - rouge_pair(rec.text, linked.text)[1]
        verdicts = judge([claims[i] for i in rest], linked.text)
        sem = float(np.mean([_PRIVACY[v] for v in verdicts])) if verdicts else 1.0
        lexical.append(lex)
        semantic.append(sem)
        res.per_record.append({"doc_id": rec.doc_id, "linked": linked.doc_id, "correct": correct,
                               "lexical_privacy": lex, "semantic_privacy": sem, "claims": len(claims)})  # fmt: skip
    res.lexical_privacy = float(np.mean(lexical)) if lexical else 1.0
    res.semantic_privacy = float(np.mean(semantic)) if semantic else 1.0
    return res
