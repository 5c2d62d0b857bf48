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
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RougeBest", "RougeIndex", "distinct_pairs", "lcs_length", "rouge_pair", "tokenize"]


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


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common subsequence of two token lists (strings or ids; bit-parallel, Hyyrö 2004)."""
    masks: dict[Hashable, int] = {}
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


def distinct_pairs(keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (key, value) pairs of two equal-length arrays, sorted by key then value, and how many times
    each occurs.

    Example:
        >>> k, v, n = distinct_pairs(np.array([2, 1, 2, 2]), np.array([5, 7, 5, 3]))
        >>> k.tolist(), v.tolist(), n.tolist()
        ([1, 2, 2], [7, 3, 5], [1, 1, 2])
    """
    order = np.lexsort((vals, keys))
    k, v = keys[order], vals[order]
    first = np.ones(len(k), dtype=bool)
    first[1:] = (k[1:] != k[:-1]) | (v[1:] != v[:-1])
    at = np.flatnonzero(first)
    return k[at], v[at], np.diff(np.append(at, len(k)))


class _Inverted:
    """Integer key -> postings (reference ids, counts) in flat arrays sorted by key, plus per-reference totals.

    Keys are token ids (unigrams) or ``id1 * vocab + id2`` (bigrams). A candidate's overlap with every
    reference takes a fixed handful of vectorised calls whatever its length: its distinct keys are found
    with one ``searchsorted``, their postings cut out of the flat arrays with one index computation and
    summed with ``bincount``. The cost thus follows the postings read (what a shard of the references
    divides), not one Python step per distinct key. A posting is 6 bytes (int32 reference, uint16 count; uint32
    where a count exceeds 65,535).
    """

    #: Tokens per block of references whose postings are counted together (bounds the build's transient memory).
    block_tokens = 1 << 22

    def __init__(self, flat: np.ndarray, off: np.ndarray, vocab: int | None = None) -> None:
        """Postings of the references ``flat[off[i]:off[i + 1]]`` (token ids): of their tokens, or with ``vocab``
        of their bigrams (key ``id1 * vocab + id2``). Counted a block of references at a time on flat arrays (no
        array per reference: a corpus shard's build leaves no per-reference objects behind)."""
        n = len(off) - 1
        lens = np.diff(off)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        a = 0
        while a < n:
            b = int(np.searchsorted(off, off[a] + self.block_tokens, side="right")) - 1
            b = min(max(b, a + 1), n)
            seg = flat[off[a] : off[b]].astype(np.int64)
            refs = np.repeat(np.arange(a, b, dtype=np.int32), lens[a:b])
            if vocab is not None:  # bigrams within one reference
                same = refs[:-1] == refs[1:]
                seg, refs = (seg[:-1] * vocab + seg[1:])[same], refs[:-1][same]
            k, r, c = distinct_pairs(seg, refs)
            parts.append((k if vocab is not None else k.astype(flat.dtype), r, c))
            a = b
        totals = lens if vocab is None else np.maximum(lens - 1, 0)
        keys = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64 if vocab else flat.dtype)
        refs = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.int32)
        counts = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
        del parts
        order = np.argsort(keys, kind="stable")  # blocks are in reference order: a key's postings stay so
        small = not len(counts) or int(counts.max()) <= np.iinfo(np.uint16).max
        keys, self.ids, self.counts = keys[order], refs[order], counts[order].astype(np.uint16 if small else np.uint32)
        self.keys, starts = np.unique(keys, return_index=True)
        self.starts = np.append(starts, len(keys)).astype(np.int64)  # key j's postings: starts[j] .. starts[j + 1]
        self.totals = np.asarray(totals, dtype=np.float64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.ids, self.counts, self.starts, self.totals))

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}{k}": getattr(self, k) for k in ("keys", "ids", "counts", "starts", "totals")}

    @classmethod
    def from_arrays(cls, arrays: Any, prefix: str) -> _Inverted:
        inv = cls.__new__(cls)
        for k in ("keys", "ids", "counts", "starts", "totals"):
            setattr(inv, k, np.asarray(arrays[f"{prefix}{k}"]))
        return inv

    def overlap(self, keys: np.ndarray) -> np.ndarray:
        """Per reference: sum over the candidate's keys of min(its count, the reference's count)."""
        out_len = len(self.totals)
        if len(keys) == 0 or len(self.keys) == 0:
            return np.zeros(out_len, dtype=np.float64)
        uniq, wants = np.unique(keys, return_counts=True)
        at = np.searchsorted(self.keys, uniq)
        at[at == len(self.keys)] = 0
        hit = self.keys[at] == uniq
        if not hit.any():
            return np.zeros(out_len, dtype=np.float64)
        at, wants = at[hit], wants[hit]
        lengths = self.starts[at + 1] - self.starts[at]
        ends = np.cumsum(lengths)
        # Positions of every posting of those keys: key j's run starts at starts[at[j]].
        pos = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(self.starts[at] - (ends - lengths), lengths)
        weights = np.minimum(self.counts[pos], np.repeat(wants, lengths)).astype(np.float64)
        return np.bincount(self.ids[pos], weights=weights, minlength=out_len)

    def f1_bound(self, keys: np.ndarray, n_candidate: int) -> np.ndarray:
        denom = self.totals + n_candidate
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denom > 0, 2.0 * self.overlap(keys) / denom, 0.0)


class RougeIndex:
    """The references of one maximum (a context set, or a whole fine-tuning set), indexed once.

    References are kept as token ids (int32, one flat array with offsets) and two inverted indexes, not as
    Python strings: the Serve Scorer holds a corpus shard this way (:attr:`nbytes`; a token's string is kept
    once per distinct token, in the vocabulary). ``keep_texts=False`` drops the texts themselves (then
    :meth:`brute_force`, a test helper, is unavailable).
    """

    #: Candidates whose tokens are kept between :meth:`probe` and :meth:`best` (a sharded scorer calls both).
    token_cache_size = 1024

    def __init__(self, references: Iterable[str], keep_texts: bool = True) -> None:
        self.references: list[str] | None = [] if keep_texts else None
        self._vocab: dict[str, int] = {}
        flat, lens = array("i"), array("q")  # token ids and lengths, appended in place (no object per reference)
        for text in references:
            if self.references is not None:
                self.references.append(text)
            vocab = self._vocab
            toks = [vocab.setdefault(t, len(vocab)) for t in tokenize(text)]
            flat.extend(toks)
            lens.append(len(toks))
        self._n = len(lens)
        counts = np.frombuffer(lens, dtype=np.int64) if lens else np.zeros(0, dtype=np.int64)
        self._off: np.ndarray = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._flat: np.ndarray = np.frombuffer(flat, dtype=np.int32).copy() if flat else np.zeros(0, dtype=np.int32)
        del flat, lens
        self._v = max(len(self._vocab), 1)
        self._uni = _Inverted(self._flat, self._off)
        self._bi = _Inverted(self._flat, self._off, vocab=self._v)
        self._cache: OrderedDict[str, tuple[list[int], np.ndarray, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return self._n

    def to_arrays(self) -> tuple[dict[str, np.ndarray], list[str]]:
        """The index as NumPy arrays and its vocabulary (token strings in id order): what
        :meth:`from_arrays` rebuilds it from (the texts are not part of it)."""
        arrays = {"flat": self._flat, "off": self._off, **self._uni.arrays("uni_"), **self._bi.arrays("bi_")}
        return arrays, list(self._vocab)

    @classmethod
    def from_arrays(cls, arrays: Any, vocab: Sequence[str]) -> RougeIndex:
        """An index equal to the one :meth:`to_arrays` came from (without its texts)."""
        idx = cls.__new__(cls)
        idx.references = None
        idx._vocab = {t: i for i, t in enumerate(vocab)}
        idx._flat, idx._off = np.asarray(arrays["flat"]), np.asarray(arrays["off"])
        idx._n = len(idx._off) - 1
        idx._v = max(len(idx._vocab), 1)
        idx._uni, idx._bi = _Inverted.from_arrays(arrays, "uni_"), _Inverted.from_arrays(arrays, "bi_")
        idx._cache = OrderedDict()
        return idx

    @property
    def nbytes(self) -> int:
        """Bytes of the index's arrays (token ids, offsets, both inverted indexes); the vocabulary's strings
        are not counted (one per distinct token, shared by all references)."""
        return self._flat.nbytes + self._off.nbytes + self._uni.nbytes + self._bi.nbytes

    def _ref(self, i: int) -> list[int]:
        return self._flat[self._off[i] : self._off[i + 1]].tolist()

    def _ref_len(self, i: int) -> int:
        return int(self._off[i + 1] - self._off[i])

    def _tokens(self, candidate: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """The candidate's token ids (-1: a token no reference has, which matches nothing), its unigram keys
        and its bigram keys (unknown tokens cannot overlap: their keys are dropped, their count stays in the
        candidate's length)."""
        got = self._cache.get(candidate)
        if got is None:
            toks = tokenize(candidate)
            vocab = self._vocab
            x = np.fromiter((vocab.get(t, -1) for t in toks), dtype=np.int64, count=len(toks))
            known = x >= 0
            both = known[:-1] & known[1:]
            got = (x.tolist(), x[known], (x[:-1] * self._v + x[1:])[both])
            self._cache[candidate] = got
            if len(self._cache) > self.token_cache_size:
                self._cache.popitem(last=False)
        return got

    def _lcs_search(self, toks: list[int], bound: np.ndarray, floor: float = 0.0) -> tuple[int, int, int]:
        """(best reference by LCS F1, its LCS length, exact LCS computations) in decreasing bound order.

        References whose bound is <= ``floor`` are not searched (-1 when none is above it).
        """
        best, best_i, best_lcs, calls = 0.0, -1, 0, 0
        for i in np.argsort(-bound, kind="stable"):
            if bound[i] <= floor or (best_i >= 0 and best >= bound[i] + 1e-12):
                break
            calls += 1
            ref = self._ref(int(i))
            lcs = lcs_length(ref, toks)
            f = 2.0 * lcs / (len(ref) + len(toks))
            if f > best or best_i < 0:
                best, best_i, best_lcs = f, int(i), lcs
        return best_i, best_lcs, calls

    def probe(self, candidate: str) -> tuple[float, float, int]:
        """A cheap exact ROUGE-L lower bound: (F1, search F1 ``2*lcs/(|c|+|r|)``, reference) of the
        reference with the highest bound (one exact LCS). A sharded scorer takes the best probe over
        its shards as every shard's ``floor`` (see :meth:`best`)."""
        toks, uni, _ = self._tokens(candidate)
        if not self._n or not toks:
            return 0.0, 0.0, -1
        bound = self._uni.f1_bound(uni, len(toks))
        i = int(bound.argmax())
        if bound[i] <= 0.0:
            return 0.0, 0.0, -1
        n_ref = self._ref_len(i)
        lcs = lcs_length(self._ref(i), toks)
        return _fmeasure(lcs, len(toks), n_ref), 2.0 * lcs / (n_ref + len(toks)), i

    def best(self, candidate: str, floor: float = 0.0) -> RougeBest:
        """The maximum ROUGE-2 and ROUGE-L F1 of ``candidate`` over the references (pruned, exact).

        ``floor``: a ROUGE-L F1 (search form, from :meth:`probe`) already reached elsewhere;
        references that cannot beat it are skipped, and ``rougeL_ref`` is -1 when none can.
        """
        if not self._n:
            return RougeBest(0.0, -1, 0.0, -1, 0)
        toks, uni, bi = self._tokens(candidate)
        n_bigrams = max(len(toks) - 1, 0)
        overlap = self._bi.overlap(bi)
        denom = self._bi.totals + n_bigrams
        with np.errstate(divide="ignore", invalid="ignore"):
            f2 = np.where(denom > 0, 2.0 * overlap / denom, 0.0)  # the ROUGE-2 F1 itself
        i2 = int(f2.argmax()) if f2.max() > 0 else -1
        il, lcs, calls = self._lcs_search(toks, self._uni.f1_bound(uni, len(toks)), floor)
        r2 = _fmeasure(int(overlap[i2]), n_bigrams, int(self._bi.totals[i2]), floor=1) if i2 >= 0 else 0.0
        rl = _fmeasure(lcs, len(toks), self._ref_len(il)) if il >= 0 else 0.0
        return RougeBest(r2, i2, rl, il, calls)

    def brute_force(self, candidate: str) -> tuple[float, float]:
        """The same maxima by scoring every reference with rouge_score (for tests and small sets)."""
        if self.references is None:
            raise ValueError("this index was built with keep_texts=False: no texts to score")
        pairs = [rouge_pair(r, candidate) for r in self.references]
        return max((p[0] for p in pairs), default=0.0), max((p[1] for p in pairs), default=0.0)
