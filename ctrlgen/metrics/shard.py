"""Leakage and ROUGE of submitted texts against a reference corpus split into shards, merged exactly.

A reference corpus (an extraction output: documents with control codes) is cut into
``n`` shards by two stable hashes: **documents** by ``doc_id`` (each shard holds a
:class:`~ctrlgen.metrics.rouge.RougeIndex` of its documents) and **private values**
by their normalised form (each shard matches only its own values). Values are
sharded on their own, not with their documents, because one value can occur in
documents of several shards: keyed by value, the shards' value sets are disjoint,
so the corpus' distinct value count is the sum of the shards' and a text's leaked
values are the disjoint union of what each shard finds.

Merging is therefore exact (tested against the unsharded metric functions):

* ROUGE-2 / ROUGE-L: the maximum over shards of each shard's maximum is the maximum
  over the whole corpus (each shard's maximum is exact, see ``RougeIndex``);
* leaked values: union over shards; PIPP = share of texts with at least one;
  ELP (fine-tuning definition, METHOD.md section 6) = distinct leaked values over
  all texts / distinct values of the corpus.

Example:
    >>> refs = [("a", "Seen by Dr. Smith today.", ("Smith",)), ("b", "Plan: heparin drip.", ())]
    >>> shards = [ReferenceShard(refs, i, 2) for i in range(2)]
    >>> merged = merge_shard_scores([s.score(["Dr. SMITH said heparin drip"]) for s in shards])
    >>> merged[0].n_leaked, round(merged[0].rouge2, 3) > 0
    (1, True)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrlgen.metrics.leakage import ValueIndex, normalize_value
from ctrlgen.metrics.rouge import RougeIndex
from ctrlgen.variants import ValueLike, split_value

__all__ = [
    "MergedScore",
    "ReferenceShard",
    "ShardProbe",
    "ShardScore",
    "corpus_leakage",
    "floors_of",
    "iter_references",
    "merge_shard_scores",
    "shard_of",
]

Reference = tuple[str, str, Sequence[ValueLike]]  # (doc_id, text, private values, with categories where known)


def shard_of(key: str, n: int) -> int:
    """A stable shard number in ``[0, n)`` for ``key`` (same on every machine and run)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % n


def iter_references(path: str | Path, batch_rows: int = 4096) -> Iterator[Reference]:
    """(doc_id, text, values) of every document of an extraction output, streamed in Parquet batches.

    Values are those of the document's control code (what the release gate and the
    fictional codes use), with their categories, so the scorer and the gate agree on what
    a private value is and on its variants ("Smith, John" for "John Smith").
    """
    from ctrlgen.codes import parse_control_code
    from ctrlgen.generation.synthesis import iter_extracted
    from ctrlgen.variants import code_items

    for rows in iter_extracted(path, batch_rows):
        for row in rows:
            yield str(row["doc_id"]), row["text"] or "", code_items(parse_control_code(row["control_code"] or ""))


@dataclass(frozen=True)
class ShardScore:
    """What one shard found for one text."""

    leaked: frozenset[str]  # normalised values of this shard found in the text
    rouge2: float
    rouge2_doc: str  # "" when no document of the shard shares a bigram
    rougeL: float
    rougeL_doc: str


@dataclass(frozen=True)
class ShardProbe:
    """A shard's exact ROUGE-L F1 of its highest-bound document (a lower bound of its best)."""

    rougeL: float
    search: float  # the same F1 as 2*lcs/(|c|+|r|), the form the pruned search compares
    doc: str


def floors_of(per_shard: Sequence[Sequence[ShardProbe]]) -> list[float]:
    """Per text, the best probe over the shards: every shard's ROUGE-L floor."""
    return [max(p.search for p in ps) for ps in zip(*per_shard, strict=True)]


@dataclass(frozen=True)
class MergedScore:
    """One text against the whole corpus."""

    n_leaked: int
    leaked: frozenset[str]
    rouge2: float
    rouge2_doc: str
    rougeL: float
    rougeL_doc: str


class ReferenceShard:
    """Shard ``shard`` of ``n_shards`` of a reference corpus, indexed once.

    Args:
        references: every (doc_id, text, values) of the corpus (each shard reads them all
            and keeps its part; :func:`iter_references` streams an extraction output).
        shard: this shard's number.
        n_shards: how many shards the corpus is cut into.
    """

    def __init__(self, references: Iterable[Reference], shard: int, n_shards: int) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} is not in [0, {n_shards})")
        self.shard, self.n_shards = shard, n_shards
        ids: list[str] = []
        values: dict[tuple[str, str | None], tuple[str, str | None]] = {}
        self.corpus_documents = 0

        def own_texts() -> Iterator[str]:
            """This shard's texts, one at a time (the index tokenises each as it comes: no list of texts)."""
            for doc_id, text, vals in references:
                self.corpus_documents += 1
                for v in vals:
                    value, category = split_value(v)
                    norm = normalize_value(value)
                    # Keyed by the normalised value (its variants go with it), so shards stay disjoint.
                    if norm and shard_of("value\x1f" + norm, n_shards) == shard:
                        values.setdefault((norm, category), (value, category))
                if shard_of("doc\x1f" + doc_id, n_shards) == shard:
                    ids.append(doc_id)
                    yield text

        self._index = RougeIndex(own_texts(), keep_texts=False)  # token ids only (docs/serving.md)
        self.doc_ids = ids
        self._set_values(list(values.values()))

    def _set_values(self, items: list[tuple[str, str | None]]) -> None:
        """The shard's private values (as written, with their categories), their normalised forms and index."""
        self._value_items = items
        self.values = sorted({normalize_value(v) for v, _ in items})
        self._values = ValueIndex(items)

    @property
    def n_values(self) -> int:
        return len(self.values)

    @property
    def rouge_nbytes(self) -> int:
        """Bytes of the shard's ROUGE index arrays (token ids, offsets, postings)."""
        return self._index.nbytes

    def save(self, path: str | Path) -> None:
        """Write the shard to ``path`` (NumPy ``.npz``, no pickle; written to a temporary name, then renamed, so
        a reader never sees half a file): its token-id arrays, document ids, vocabulary and private values, in a
        file of mode 0600 (it holds the references' texts in another form)."""
        arrays, vocab = self._index.to_arrays()
        arrays.update({f"values_{k}": v for k, v in self._values.to_arrays().items()})  # no rebuild on load
        meta = {"format": 2, "shard": self.shard, "n_shards": self.n_shards, "corpus_documents": self.corpus_documents,
                "doc_ids": self.doc_ids, "vocab": vocab, "values": [list(v) for v in self._value_items]}  # fmt: skip
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        savez: Any = np.savez  # (its stubs take no ** of arrays)
        # As private as the corpus (the ids and the vocabulary rebuild the texts; the values are plain text):
        # readable by its owner only, whatever the umask.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            savez(fh, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> ReferenceShard:
        """A shard written by :meth:`save` (scores equal to the shard it was saved from)."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") not in (1, 2):
                raise ValueError(f"{path}: not a reference shard of this version (format {meta.get('format')!r})")
            arrays = {k: z[k] for k in z.files if k != "meta"}
        self = cls.__new__(cls)
        self.shard, self.n_shards, self.corpus_documents = meta["shard"], meta["n_shards"], meta["corpus_documents"]
        self.doc_ids = list(meta["doc_ids"])
        values = {k[len("values_") :]: arrays.pop(k) for k in list(arrays) if k.startswith("values_")}
        self._index = RougeIndex.from_arrays(arrays, meta["vocab"])
        items = [(str(v), c) for v, c in meta["values"]]
        if meta["format"] == 1:  # written before the value index was saved: built again
            self._set_values(items)
        else:
            self._value_items = items
            self.values = sorted({normalize_value(v) for v, _ in items})
            self._values = ValueIndex.from_arrays(values, self.values)
        return self

    @classmethod
    def cached(cls, references: str, shard: int, n_shards: int, index_dir: str | Path | None) -> ReferenceShard:
        """The shard, loaded from ``index_dir`` when an index of these very references was saved there (by an
        earlier replica on a node that shares the directory), else built from the references and saved there.

        The file's name holds a fingerprint of the references (every file's path, size and modification time),
        so changed references are indexed anew; ``index_dir`` None, or references at a URI: always built."""
        from ctrlgen import storage

        if index_dir is None or storage.is_uri(str(references)):  # remote references: no fingerprint of their files
            return cls(iter_references(references), shard, n_shards)
        path = Path(index_dir) / f"shard-{shard}-of-{n_shards}-{_fingerprint(references)}.npz"
        if path.is_file():
            return cls.load(path)
        built = cls(iter_references(references), shard, n_shards)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        built.save(path)
        return built

    def probe(self, texts: Sequence[str]) -> list[ShardProbe]:
        """Per text, a cheap exact ROUGE-L lower bound from this shard (one LCS per text)."""
        out = []
        for text in texts:
            f1, search, ref = self._index.probe(text)
            out.append(ShardProbe(f1, search, self.doc_ids[ref] if ref >= 0 else ""))
        return out

    def score(self, texts: Sequence[str], floors: Sequence[float] | None = None) -> list[ShardScore]:
        """Leaked values and best ROUGE of every text against this shard.

        ``floors``: per text, the best probe of all shards (:func:`floors_of`): ROUGE-L references
        that cannot beat it are skipped, so a shard without a close document stops early.
        """
        if floors is not None and len(floors) != len(texts):
            raise ValueError(f"{len(floors)} floors for {len(texts)} texts")
        out = []
        for k, text in enumerate(texts):
            leaked = self._values.find(text)
            best = self._index.best(text, floors[k] if floors is not None else 0.0)
            out.append(
                ShardScore(
                    frozenset(leaked),
                    best.rouge2,
                    self.doc_ids[best.rouge2_ref] if best.rouge2_ref >= 0 else "",
                    best.rougeL,
                    self.doc_ids[best.rougeL_ref] if best.rougeL_ref >= 0 else "",
                )
            )
        return out

    def summary(self) -> dict[str, Any]:
        return {"shard": self.shard, "documents": len(self.doc_ids), "values": self.n_values}


def _fingerprint(references: str) -> str:
    """A digest of a local extraction output's files (relative path, size, modification time)."""
    root = Path(references)
    if not root.exists():
        raise FileNotFoundError(f"references {references} do not exist")
    files = sorted(p for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file())
    h = hashlib.sha256(str(root.resolve()).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(root) if f != root else f.name}\x1f{st.st_size}\x1f{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def merge_shard_scores(
    per_shard: Sequence[Sequence[ShardScore]], probes: Sequence[Sequence[ShardProbe]] | None = None
) -> list[MergedScore]:
    """Per-shard scores (one list per shard, texts in the same order) -> one score per text.

    With ``probes`` (scores made with :func:`floors_of` floors), a probe's document counts as a
    candidate too: a shard skips what cannot beat the floor, so the floor's own document may be
    the maximum.
    """
    if not per_shard:
        raise ValueError("no shard scores to merge")
    n = len(per_shard[0])
    if any(len(s) != n for s in per_shard):
        raise ValueError("shards scored different numbers of texts")
    out = []
    for i in range(n):
        scores = [s[i] for s in per_shard]
        leaked = frozenset().union(*(s.leaked for s in scores))
        r2 = max(scores, key=lambda s: s.rouge2)
        rl_pairs = [(s.rougeL, s.rougeL_doc) for s in scores]
        if probes is not None:
            rl_pairs += [(p[i].rougeL, p[i].doc) for p in probes]
        rl, rl_doc = max(rl_pairs, key=lambda x: x[0])
        out.append(MergedScore(len(leaked), leaked, r2.rouge2, r2.rouge2_doc, rl, rl_doc))
    return out


def corpus_leakage(merged: Sequence[MergedScore], n_values: int) -> dict[str, float]:
    """PIPP and ELP of a set of texts (fine-tuning definitions) from their merged scores."""
    n = len(merged)
    distinct = frozenset().union(*(m.leaked for m in merged)) if merged else frozenset()
    return {
        "pipp": sum(1 for m in merged if m.n_leaked) / n if n else 0.0,
        "elp": len(distinct) / n_values if n_values else 0.0,
        "rouge2": sum(m.rouge2 for m in merged) / n if n else 0.0,
        "rougeL": sum(m.rougeL for m in merged) / n if n else 0.0,
    }
