"""A linkage attack on a synthetic set: known facts of a real record -> its best BM25 match.

The attacker knows some private values of a real record (the first half of its
distinct values in a seeded order, at least one), retrieves the synthetic record
that best matches them with Okapi BM25 (k1 = 1.5, b = 0.75, word tokens case
folded), and learns whatever else that record says. Per attacked record:

* ``values``: share of the record's *other* private values found in the retrieved
  synthetic record (matching as in :mod:`ctrlgen.metrics.leakage`);
* ``sentences``: share of the record's sentences of at least ``min_words`` words
  that reappear verbatim (word tokens) in the retrieved record.

Records with fewer than two distinct values cannot be attacked this way and are
counted apart. Lower is more private; 0 for every record means the synthetic set
links nothing.

Example:
    >>> bm = BM25([["alice", "fever"], ["bob", "cough"]])
    >>> int(bm.scores(["bob"]).argmax())
    1
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ctrlgen.metrics.context import words
from ctrlgen.metrics.leakage import leaked_values, normalize_value
from ctrlgen.variants import ValueLike, split_value

__all__ = ["BM25", "LinkageResult", "RealRecord", "linkage_attack"]

_SENT = re.compile(r"(?<=[.!?\n])\s+")


class BM25:
    """Okapi BM25 over tokenised documents (numpy; one score vector per query)."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.n = len(docs)
        self.len = np.array([len(d) for d in docs], dtype=np.float64)
        self.avg = float(self.len.mean()) if self.n else 0.0
        self.tf: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        post: dict[str, list[tuple[int, int]]] = {}
        for i, d in enumerate(docs):
            for t, c in Counter(d).items():
                post.setdefault(t, []).append((i, c))
        for t, ps in post.items():
            self.tf[t] = (np.array([i for i, _ in ps]), np.array([c for _, c in ps], dtype=np.float64))

    def idf(self, term: str) -> float:
        df = len(self.tf[term][0]) if term in self.tf else 0
        return math.log((self.n - df + 0.5) / (df + 0.5) + 1.0)

    def scores(self, query: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float64)
        if not self.n:
            return out
        norm = self.k1 * (1.0 - self.b + self.b * self.len / max(self.avg, 1e-9))
        for t in query:
            if t not in self.tf:
                continue
            ids, tf = self.tf[t]
            out[ids] += self.idf(t) * tf * (self.k1 + 1.0) / (tf + norm[ids])
        return out


@dataclass(frozen=True)
class RealRecord:
    doc_id: str
    text: str
    values: tuple[ValueLike, ...]  # a :class:`~ctrlgen.variants.Value` or pair carries its category


@dataclass(frozen=True)
class LinkageResult:
    attacked: int  # records with >= 2 distinct values
    skipped: int  # records with fewer
    values: float  # mean share of the other values found in the retrieved record
    any_value: float  # share of attacked records with at least one other value found
    sentences: float  # mean share of the record's sentences reappearing verbatim


def _sentences(text: str, min_words: int) -> list[tuple[str, ...]]:
    out = []
    for s in _SENT.split(text):
        toks = tuple(t for t, _, _ in words(s))
        if len(toks) >= min_words:
            out.append(toks)
    return out


def _contains(hay: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return any(tuple(hay[i : i + n]) == tuple(needle) for i in range(len(hay) - n + 1))


def linkage_attack(
    records: Sequence[RealRecord], synthetic: Sequence[str], seed: int = 0, min_words: int = 5
) -> LinkageResult:
    """Attack every record against the synthetic texts; means over the attacked records."""
    syn_toks = [[t for t, _, _ in words(s)] for s in synthetic]
    bm = BM25(syn_toks)
    shares, anys, sents = [], [], []
    skipped = 0
    for r in records:
        # Distinct normalised values, each with its category (its variants count as the value).
        typed: dict[str, list[tuple[str, str | None]]] = {}
        for item in r.values:
            value, category = split_value(item)
            if value and value.strip():
                typed.setdefault(normalize_value(value), []).append((value, category))
        vals = sorted(typed)
        if len(vals) < 2 or not synthetic:
            skipped += 1
            continue
        random.Random(f"{seed}\x1f{r.doc_id}").shuffle(vals)
        known, other = vals[: len(vals) // 2], vals[len(vals) // 2 :]
        query = [t for v in known for t, _, _ in words(v)]
        best = int(bm.scores(query).argmax())
        found = leaked_values(synthetic[best], [item for v in other for item in typed[v]])
        shares.append(len(found) / len(other))
        anys.append(1.0 if found else 0.0)
        ss = _sentences(r.text, min_words)
        sents.append(sum(_contains(syn_toks[best], s) for s in ss) / len(ss) if ss else 0.0)
    n = len(shares)
    return LinkageResult(
        attacked=n,
        skipped=skipped,
        values=sum(shares) / n if n else 0.0,
        any_value=sum(anys) / n if n else 0.0,
        sentences=sum(sents) / n if n else 0.0,
    )
