"""ROUGE-2 / ROUGE-L F1 of a generated text against the real texts it could copy from.

Scores come from Google's ``rouge_score`` (the reference implementation; its
default tokenizer: lower case, non-alphanumerics dropped, no stemming). ICL
compares an output with its own context documents, fine-tuning with the whole
fine-tuning set; both take the **maximum** over the references (METHOD.md section 6).

Candidate pruning (:class:`RougeIndex`) makes the maximum over a large reference
set cheap without changing it. With ``c`` the output's tokens and ``r`` a
reference's, rouge_score's F1 is ``2 * overlap / (|c| + |r|)`` (bigram counts for
ROUGE-2, LCS length for ROUGE-L). Two bounds follow, both computed for every
reference at once from inverted indexes (token / bigram -> references with counts):

* ROUGE-2: the bigram multiset overlap gives the F1 itself (it is the upper bound,
  and references sharing no bigram score 0);
* ROUGE-L: ``LCS(c, r) <= sum_w min(count_c(w), count_r(w))`` (an LCS is a common
  sub-multiset of tokens), so the unigram overlap bounds the F1 from above.

For ROUGE-L, references are then scored exactly in decreasing order of their bound,
stopping when the best exact score reached is >= the next bound. The exact LCS
length there comes from a bit-parallel algorithm (Allison-Dix / Hyyrö: one
big-integer add per token, ~200x faster than rouge_score's pure-Python table,
equal to it on every pair the tests draw). The reported F1 of the best reference
is computed from the exact counts with rouge_score's own arithmetic
(:func:`_fmeasure`: the same precision, recall and F-measure expressions), so it is
bit-identical to what rouge_score returns without running its pure-Python LCS table
(which cost more than the search itself, and was paid once per shard by the sharded
scorer). The result is the brute-force maximum (tests check it on random sets
against rouge_score on every pair, with ``==``).

Example:
    >>> idx = RougeIndex(["the cat sat on the mat", "a dog ran"])
    >>> round(idx.best("the cat sat on a mat").rouge2, 4)
    0.6
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RougeBest", "RougeIndex", "lcs_length", "rouge_pair", "tokenize"]


@functools.cache
def _scorer(kind: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], use_stemmer=False)


def _score(kind: str, reference: str, candidate: str) -> float:
    return float(_scorer(kind).score(reference, candidate)[kind].fmeasure)


@functools.cache
def _tokenizer() -> Any:
    from rouge_score import tokenizers

    return tokenizers.DefaultTokenizer(use_stemmer=False)


def tokenize(text: str) -> list[str]:
    """rouge_score's default tokens (what the F1 counts)."""
    return list(_tokenizer().tokenize(text))


def _fmeasure(overlap: int, n_candidate: int, n_reference: int, floor: int = 0) -> float:
    """rouge_score's F1 from an overlap count, with its exact float operations.

    ``floor=1`` is its n-gram variant (denominators ``max(count, 1)``); ``floor=0`` its
    LCS variant (0 when either side has no tokens).
    """
    if floor == 0 and (n_candidate == 0 or n_reference == 0):
        return 0.0
    precision = overlap / max(n_candidate, floor)
    recall = overlap / max(n_reference, floor)
    if precision + recall > 0:
        return float(2 * precision * recall / (precision + recall))
    return 0.0


def rouge_pair(reference: str, candidate: str) -> tuple[float, float]:
    """(ROUGE-2 F1, ROUGE-L F1) of one candidate against one reference, straight from rouge_score."""
    return _score("rouge2", reference, candidate), _score("rougeL", reference, candidate)


@dataclass(frozen=True)
class RougeBest:
    rouge2: float
    rouge2_ref: int  # index of the best reference (-1: none)
    rougeL: float
    rougeL_ref: int
    exact_calls: int  # exact LCS computations this search needed (of one per reference)


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists (bit-parallel, Hyyrö 2004)."""
    masks: dict[str, int] = {}
    for j, t in enumerate(b):
        masks[t] = masks.get(t, 0) | (1 << j)
    full = (1 << len(b)) - 1
    v = full
    for t in a:
        m = masks.get(t)
        if m is not None:
            u = v & m
            v = ((v + u) | (v - u)) & full
    return len(b) - bin(v).count("1")


class _Inverted:
    """key -> (reference ids, counts) arrays, plus per-reference totals."""

    def __init__(self, bags: Sequence[Counter[object]]) -> None:
        postings: dict[object, list[tuple[int, int]]] = defaultdict(list)
        for i, bag in enumerate(bags):
            for key, n in bag.items():
                postings[key].append((i, n))
        self.index = {k: (np.array([i for i, _ in v]), np.array([n for _, n in v])) for k, v in postings.items()}
        self.totals = np.array([sum(b.values()) for b in bags], dtype=np.float64)

    def overlap(self, bag: Counter[object]) -> np.ndarray:
        out = np.zeros(len(self.totals), dtype=np.float64)
        for key, n in bag.items():
            hit = self.index.get(key)
            if hit is not None:
                ids, counts = hit
                out[ids] += np.minimum(counts, n)
        return out

    def f1_bound(self, bag: Counter[object]) -> np.ndarray:
        denom = self.totals + sum(bag.values())
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denom > 0, 2.0 * self.overlap(bag) / denom, 0.0)


def _bigrams(tokens: Sequence[str]) -> Counter[object]:
    return Counter(itertools.pairwise(tokens))


class RougeIndex:
    """The references of one maximum (a context set, or a whole fine-tuning set), indexed once."""

    def __init__(self, references: Sequence[str]) -> None:
        self.references = list(references)
        self._toks = [tokenize(t) for t in self.references]
        self._uni = _Inverted([Counter(t) for t in self._toks])
        self._bi = _Inverted([_bigrams(t) for t in self._toks])

    def __len__(self) -> int:
        return len(self.references)

    def _lcs_search(self, toks: list[str], bound: np.ndarray, floor: float = 0.0) -> tuple[int, int, int]:
        """(best reference by LCS F1, its LCS length, exact LCS computations) in decreasing bound order.

        References whose bound is <= ``floor`` are not searched (-1 when none is above it).
        """
        best, best_i, best_lcs, calls = 0.0, -1, 0, 0
        for i in np.argsort(-bound, kind="stable"):
            if bound[i] <= floor or (best_i >= 0 and best >= bound[i] + 1e-12):
                break
            calls += 1
            ref = self._toks[i]
            lcs = lcs_length(ref, toks)
            f = 2.0 * lcs / (len(ref) + len(toks))
            if f > best or best_i < 0:
                best, best_i, best_lcs = f, int(i), lcs
        return best_i, best_lcs, calls

    def probe(self, candidate: str) -> tuple[float, float, int]:
        """A cheap exact ROUGE-L lower bound: (F1, search F1 ``2*lcs/(|c|+|r|)``, reference) of the
        reference with the highest bound (one exact LCS). A sharded scorer takes the best probe over
        its shards as every shard's ``floor`` (see :meth:`best`)."""
        toks = tokenize(candidate)
        if not self.references or not toks:
            return 0.0, 0.0, -1
        bound = self._uni.f1_bound(Counter(toks))
        i = int(bound.argmax())
        if bound[i] <= 0.0:
            return 0.0, 0.0, -1
        lcs = lcs_length(self._toks[i], toks)
        return _fmeasure(lcs, len(toks), len(self._toks[i])), 2.0 * lcs / (len(self._toks[i]) + len(toks)), i

    def best(self, candidate: str, floor: float = 0.0) -> RougeBest:
        """The maximum ROUGE-2 and ROUGE-L F1 of ``candidate`` over the references (pruned, exact).

        ``floor``: a ROUGE-L F1 (search form, from :meth:`probe`) already reached elsewhere;
        references that cannot beat it are skipped, and ``rougeL_ref`` is -1 when none can.
        """
        if not self.references:
            return RougeBest(0.0, -1, 0.0, -1, 0)
        toks = tokenize(candidate)
        bag = _bigrams(toks)
        overlap = self._bi.overlap(bag)
        denom = self._bi.totals + sum(bag.values())
        with np.errstate(divide="ignore", invalid="ignore"):
            f2 = np.where(denom > 0, 2.0 * overlap / denom, 0.0)  # the ROUGE-2 F1 itself
        i2 = int(f2.argmax()) if f2.max() > 0 else -1
        il, lcs, calls = self._lcs_search(toks, self._uni.f1_bound(Counter(toks)), floor)
        n_bigrams = sum(bag.values())
        r2 = _fmeasure(int(overlap[i2]), n_bigrams, int(self._bi.totals[i2]), floor=1) if i2 >= 0 else 0.0
        rl = _fmeasure(lcs, len(toks), len(self._toks[il])) if il >= 0 else 0.0
        return RougeBest(r2, i2, rl, il, calls)

    def brute_force(self, candidate: str) -> tuple[float, float]:
        """The same maxima by scoring every reference with rouge_score (for tests and small sets)."""
        pairs = [rouge_pair(r, candidate) for r in self.references]
        return max((p[0] for p in pairs), default=0.0), max((p[1] for p in pairs), default=0.0)
