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
4. **Chance level**: the same attack on held-out real records the released set was not made from
   scores what any released set of this kind "reveals" about any note (shared vocabulary, a judge
   that scores topical closeness). :func:`excess_over_chance` is the held-out records' semantic
   privacy minus the attacked records', with its interval; :func:`random_link_rate` the linkage rate
   of an attacker who links at random.

The judge offline is :class:`SimilarityJudge`: the claim's best cosine similarity with the
linked document's claims, cut at two thresholds calibrated on pairs built from the records
(:func:`calibrate`): a claim against itself with words dropped (same), against a claim
whose second half comes from another record (partly) and against another record's claim
(not supported). It is the weaker judge: it scores topical similarity, not entailment. With a
capable model configured, :class:`LLMJudge` asks the 3-point question (3 queries per claim, majority)
and :func:`llm_atomize` writes the claims; both take any generation engine (HF or an OpenAI endpoint).

Example:
    >>> atomize("Pt is a 65 yo man with CHF. He was seen in clinic; BP was stable.")
    ['Pt is a 65 yo man with CHF.', 'He was seen in clinic', 'BP was stable.']
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ctrlgen.metrics.context import words
from ctrlgen.metrics.linkage import BM25
from ctrlgen.metrics.rouge import rouge_pair

__all__ = [
    "LLMJudge",
    "Record",
    "Released",
    "SemanticIndex",
    "SemanticResult",
    "SimilarityJudge",
    "atomize",
    "attack_records",
    "calibrate",
    "excess_over_chance",
    "judge_prompt",
    "llm_atomize",
    "parse_verdict",
    "query_claims",
    "random_link_rate",
    "semantic_attack",
    "summarize_attack",
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
    """Offline judge: best cosine similarity of a claim with the document's claims, two thresholds.

    Embeddings are kept by text (up to ``cache_size`` texts, least recently used out first): an attack judges the
    same record's claims against many released sets (one per experiment cell) and a released document's claims once
    per record it is linked to, and each text is embedded once. A text embedded in another batch can differ in the
    last bits of its embedding (padding); a verdict moves only for a similarity within those bits of a threshold."""

    def __init__(self, encoder: Any, same: float, partly: float, cache_size: int = 20_000) -> None:
        if not partly < same:
            raise ValueError(f"thresholds must satisfy partly < same; got {partly} and {same}")
        self.encoder, self.same, self.partly = encoder, same, partly
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.embedded = 0  # texts embedded (cache misses)
        self.reused = 0  # texts whose embedding was kept

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            self._cache.update(zip(todo, _unit(self.encoder, todo), strict=True))
        self.embedded += len(todo)
        self.reused += len(texts) - len(todo)
        out = np.stack([self._cache[t] for t in texts])
        for t in texts:
            self._cache.move_to_end(t)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def similarity(self, claims: Sequence[str], document: str) -> np.ndarray:
        parts = atomize(document, 1) or [document]
        return (self._embed(claims) @ self._embed(parts).T).max(axis=1)  # type: ignore[no-any-return]

    def __call__(self, claims: Sequence[str], document: str) -> list[int]:
        if not claims:
            return []
        sims = self.similarity(claims, document)
        return [SAME if s >= self.same else PARTLY if s >= self.partly else UNSUPPORTED for s in sims]


_VERDICT = re.compile(r"\b(same|yes|partly|partial|partially|no|not)\b", re.I)


def judge_prompt(claim: str, document: str, max_chars: int = 4000) -> str:
    """The LLM judge's 3-point question about one claim and one (possibly cut) released document."""
    doc = document if len(document) <= max_chars else document[:max_chars] + " ..."
    return (
        "Read the document and the claim. Does the document state the information of the claim?\n"
        "Answer with one word: same (the document states it), partly (some of it), or no (not at all).\n\n"
        f"Document:\n{doc.strip()}\n\nClaim: {claim.strip()}\nAnswer:"
    )


def parse_verdict(answer: str) -> int | None:
    """The first verdict word of an answer (same/yes -> SAME, partly -> PARTLY, no/not -> UNSUPPORTED), else None."""
    m = _VERDICT.search(answer)
    if not m:
        return None
    w = m.group(1).lower()
    return SAME if w in ("same", "yes") else PARTLY if w.startswith("part") else UNSUPPORTED


class LLMJudge:
    """The 3-point judge of METHOD.md 8.2 with a language model: each claim asked ``queries`` times (own seeds),
    the majority verdict wins; a tie or unreadable answers count as PARTLY / UNSUPPORTED (see ``__call__``).
    ``engine``: any :class:`~ctrlgen.generation.engine.GenerationEngine` (HF model or OpenAI endpoint)."""

    def __init__(self, engine: Any, queries: int = 3, seed: int = 0, max_new_tokens: int = 4) -> None:
        self.engine, self.queries, self.seed, self.max_new_tokens = engine, queries, seed, max_new_tokens
        self.unreadable = 0  # answers with no verdict word (counted as UNSUPPORTED)

    def __call__(self, claims: Sequence[str], document: str) -> list[int]:
        from ctrlgen.generation.engine import GenerationRequest
        from ctrlgen.generation.icl import row_seed

        if not claims:
            return []
        reqs = [GenerationRequest(judge_prompt(c, document), seed=row_seed(self.seed, "judge", c, str(q)),
                                  max_new_tokens=self.max_new_tokens, stop=("\n",))
                for c in claims for q in range(self.queries)]  # fmt: skip
        answers = self.engine.generate(reqs)
        out = []
        for i in range(len(claims)):
            votes = []
            for a in answers[i * self.queries : (i + 1) * self.queries]:
                v = parse_verdict(a.text) if a.error is None else None
                if v is None:
                    self.unreadable += 1
                    v = UNSUPPORTED
                votes.append(v)
            counts = {v: votes.count(v) for v in set(votes)}
            best = max(counts.values())
            winners = [v for v, n in counts.items() if n == best]
            out.append(winners[0] if len(winners) == 1 else PARTLY)  # a three-way tie is "partly"
        return out


def llm_atomize(engine: Any, texts: Sequence[str], seed: int = 0, min_words: int = 3,
                max_new_tokens: int = 256) -> list[list[str]]:  # fmt: skip
    """Claims of each text from a language model (one prompt per text, all in one engine call): one short
    factual statement per line; a text whose answer yields no claim falls back to :func:`atomize`."""
    from ctrlgen.generation.engine import GenerationRequest
    from ctrlgen.generation.icl import row_seed

    reqs = [GenerationRequest("Split the clinical note into short, self-contained facts, one per line.\n\n"
                              f"Note:\n{t.strip()}\n\nFacts:\n-", seed=row_seed(seed, "atomize", str(i)),
                              max_new_tokens=max_new_tokens, stop=("\n\n",))
            for i, t in enumerate(texts)]  # fmt: skip
    out = []
    for text, ans in zip(texts, engine.generate(reqs), strict=True):
        claims: list[str] = []
        seen: set[str] = set()
        for line in ("-" + ans.text if ans.error is None else "").splitlines():
            c = " ".join(line.strip().lstrip("-*0123456789.) ").split())
            if len(_tokens(c)) >= min_words and c.casefold() not in seen:
                seen.add(c.casefold())
                claims.append(c)
        out.append(claims or atomize(text, min_words))
    return out


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


class SemanticIndex:
    """The released set as the attacker searches it: BM25 over its tokens, or its unit embeddings (dense).

    Built once (the Ray job builds it in a task and shares it with ``ray.put``); holds the released
    texts because the judge and ROUGE read the linked document.
    """

    def __init__(
        self, released: Sequence[Released], retriever: Literal["bm25", "dense"] = "bm25", encoder: Any = None
    ) -> None:
        if not released:
            raise ValueError("the released set is empty")
        if retriever not in ("bm25", "dense"):
            raise ValueError(f"retriever must be bm25 or dense, not {retriever!r}")
        if retriever == "dense" and encoder is None:
            raise ValueError("dense retrieval needs a sentence encoder")
        self.retriever = retriever
        self.ids = [r.doc_id for r in released]
        self.texts = [r.text for r in released]
        self.sources = [tuple(r.sources) for r in released]
        self.made_from: set[str] = {s for r in released for s in r.sources}
        self.bm25 = BM25([_tokens(t) for t in self.texts]) if retriever == "bm25" else None
        self.vectors = _unit(encoder, self.texts).astype(np.float32) if retriever == "dense" else None

    def __len__(self) -> int:
        return len(self.ids)

    def link(self, queries: Sequence[str], encoder: Any = None) -> list[int]:
        """The best released document of each query (dense: embedded in one batch with ``encoder``)."""
        if not queries:
            return []
        if self.vectors is not None:
            if encoder is None:
                raise ValueError("dense linking needs the sentence encoder")
            return (_unit(encoder, queries) @ self.vectors.T).argmax(1).tolist()  # type: ignore[no-any-return]
        assert self.bm25 is not None
        return [int(np.argmax(self.bm25.scores(_tokens(q)))) for q in queries]


def attack_records(
    records: Sequence[Record],
    index: SemanticIndex,
    judge: Judge,
    k: int = 3,
    seed: int = 0,
    encoder: Any = None,
    atomizer: Callable[[Sequence[str]], list[list[str]]] | None = None,
) -> list[dict[str, Any]]:
    """One row per record: linked document, whether the link is correct and linkable, privacy scores
    (``skipped`` True, scores None, for records with ``k`` claims or fewer). Queries are linked in one batch.
    ``atomizer`` maps the records' texts to their claims in one call (default: :func:`atomize` each)."""
    rows: list[dict[str, Any]] = []
    attacked: list[tuple[dict[str, Any], Record, list[str], list[int], str]] = []
    all_claims = atomizer([r.text for r in records]) if atomizer else [atomize(r.text) for r in records]
    for rec, claims in zip(records, all_claims, strict=True):
        row: dict[str, Any] = {"doc_id": rec.doc_id, "claims": len(claims), "skipped": len(claims) <= k,
                               "linked": None, "correct": False, "linkable": False,
                               "lexical_privacy": None, "semantic_privacy": None}  # fmt: skip
        rows.append(row)
        if not row["skipped"]:
            known, rest = query_claims(claims, k, seed, rec.doc_id)
            attacked.append((row, rec, claims, rest, " ".join(claims[i] for i in known)))
    best = index.link([q for *_, q in attacked], encoder)
    for (row, rec, claims, rest, _), b in zip(attacked, best, strict=True):
        linked = index.texts[b]
        verdicts = judge([claims[i] for i in rest], linked)
        row.update(
            linked=index.ids[b],
            correct=rec.doc_id in index.sources[b],
            linkable=rec.doc_id in index.made_from,
            lexical_privacy=1.0 - rouge_pair(rec.text, linked)[1],
            semantic_privacy=float(np.mean([_PRIVACY[v] for v in verdicts])) if verdicts else 1.0,
        )
    return rows


def summarize_attack(rows: Sequence[dict[str, Any]]) -> SemanticResult:
    """:class:`SemanticResult` from :func:`attack_records` rows (any order, any partition of the records)."""
    done = [r for r in rows if not r["skipped"]]
    res = SemanticResult(
        attacked=len(done),
        linkable=sum(bool(r["linkable"]) for r in done),
        correct_links=sum(bool(r["linkable"] and r["correct"]) for r in done),
        lexical_privacy=float(np.mean([r["lexical_privacy"] for r in done])) if done else 1.0,
        semantic_privacy=float(np.mean([r["semantic_privacy"] for r in done])) if done else 1.0,
        skipped=len(rows) - len(done),
    )
    res.per_record = [{k: r[k] for k in ("doc_id", "linked", "correct", "lexical_privacy", "semantic_privacy",
                                         "claims")} for r in done]  # fmt: skip
    return res


def semantic_attack(
    records: Sequence[Record],
    released: Sequence[Released],
    judge: Judge,
    k: int = 3,
    seed: int = 0,
    retriever: Literal["bm25", "dense"] = "bm25",
    encoder: Any = None,
    atomizer: Callable[[Sequence[str]], list[list[str]]] | None = None,
) -> SemanticResult:
    """Link every record's k known claims to a released document and score what else it reveals (in memory;
    ``ray_jobs.semantic`` runs the same functions over Ray Data)."""
    index = SemanticIndex(released, retriever, encoder)
    return summarize_attack(attack_records(records, index, judge, k, seed, encoder, atomizer))


def random_link_rate(record_ids: Sequence[str], released: Sequence[Released]) -> float | None:
    """The expected correct-linkage rate of an attacker who links each record to a released document drawn
    at random: the mean, over the records some document was made from, of the share of the released set
    made from it; None when no record is a source."""
    if not released:
        raise ValueError("the released set is empty")
    made = [sum(rid in r.sources for r in released) / len(released) for rid in record_ids]
    linkable = [m for m in made if m > 0]
    return sum(linkable) / len(linkable) if linkable else None


def excess_over_chance(
    attacked: SemanticResult,
    chance: SemanticResult,
    cluster_of: Callable[[str], str] | None = None,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(excess, lower, upper): semantic privacy of the held-out records (``chance``, the same attack on real
    records the released set was not made from) minus that of the attacked records, and its 95% interval by a
    cluster bootstrap (clusters: ``cluster_of(doc_id)``, e.g. the patient; default the record itself). Near 0:
    the attack learns no more about the records than about any note; large: the released set reveals them."""
    from ctrlgen.intervals import cluster_bootstrap_diff

    key = cluster_of or (lambda d: d)
    a, c = attacked.per_record, chance.per_record
    if not a or not c:
        raise ValueError("excess over chance needs per-record scores of both attacks (summarize_attack's)")
    return cluster_bootstrap_diff([r["semantic_privacy"] for r in c], [key(r["doc_id"]) for r in c],
                                  [r["semantic_privacy"] for r in a], [key(r["doc_id"]) for r in a], seed=seed)  # fmt: skip
