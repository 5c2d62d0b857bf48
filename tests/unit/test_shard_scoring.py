"""Sharded reference scoring merges to exactly the whole-corpus metrics (no Ray)."""

import random

import pytest

from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.metrics.leakage import elp_finetune, leaked_values, pipp_finetune
from ctrlgen.metrics.rouge import RougeIndex
from ctrlgen.metrics.shard import ReferenceShard, corpus_leakage, floors_of, merge_shard_scores, shard_of
from ctrlgen.variants import Value


@pytest.fixture(scope="module")
def refs(shared):
    docs, _, _ = load_corpus(PhysionetCorpusConfig(path=str(shared / "physionet-deid"), limit=120))
    # values with their categories, as iter_references gives them: the shards match their variants
    return [(d.doc_id, d.text, tuple(sorted({Value(e.text, e.category) for e in d.entities}))) for d in docs]


def _texts(refs):
    rng = random.Random(0)
    texts = []
    for _ in range(12):
        doc = refs[rng.randrange(len(refs))][1]
        i = rng.randrange(max(1, len(doc) - 200))
        texts.append(doc[i : i + 200] + " Patient is stable.")
    return [*texts, "Nothing from the corpus here at all.", ""]


@pytest.mark.parametrize("n_shards", [1, 2, 3, 5])
def test_merged_shards_equal_the_whole_corpus(refs, n_shards):
    texts = _texts(refs)
    shards = [ReferenceShard(refs, i, n_shards) for i in range(n_shards)]
    assert sum(len(s.doc_ids) for s in shards) == len(refs)
    values = [v for r in refs for v in r[2]]
    assert sum(s.n_values for s in shards) == len({v.casefold() for v in values if v.strip()})
    merged = merge_shard_scores([s.score(texts) for s in shards])
    # the service's two rounds: probes, then searches above the best probe
    probes = [s.probe(texts) for s in shards]
    floored = merge_shard_scores([s.score(texts, floors_of(probes)) for s in shards], probes)
    whole = RougeIndex([r[1] for r in refs])
    for text, m, f in zip(texts, merged, floored, strict=True):
        best = whole.best(text)
        assert m.rouge2 == best.rouge2 and m.rougeL == best.rougeL
        assert f.rouge2 == best.rouge2 and f.rougeL == best.rougeL
        assert m.leaked == f.leaked == frozenset(leaked_values(text, values))
    summary = corpus_leakage(merged, sum(s.n_values for s in shards))
    assert summary["pipp"] == pytest.approx(pipp_finetune(texts, values))
    assert summary["elp"] == pytest.approx(elp_finetune(texts, values))
    assert summary["pipp"] > 0


def test_shards_find_a_rewritten_value():
    refs = [
        ("a", "Seen by John Smith on 2101-10-20.", (Value("John Smith", "PERSON"), Value("2101-10-20", "DATETIME")))
    ]
    for n in (1, 3):
        shards = [ReferenceShard(refs, i, n) for i in range(n)]
        merged = merge_shard_scores([s.score(["Smith, John came back Oct 20, 2101."]) for s in shards])
        assert merged[0].leaked == {"john smith", "2101-10-20"}


def test_shard_numbers_are_stable_and_in_range():
    assert [shard_of(f"k{i}", 4) for i in range(6)] == [shard_of(f"k{i}", 4) for i in range(6)]
    assert all(0 <= shard_of(str(i), 3) < 3 for i in range(100))
    with pytest.raises(ValueError):
        ReferenceShard([], 2, 2)


def test_a_shard_keeps_token_ids_in_arrays_not_strings_per_token(refs):
    """The Serve Scorer's memory (issue 39): what a shard's index retains, traced, is about 20 bytes a token
    (int32 ids, 6-byte postings, shared keys) plus the vocabulary's strings; texts and per-token Python
    strings (~70 bytes a token) would fail this."""
    import tracemalloc

    from ctrlgen.metrics.rouge import tokenize

    texts = [r[1] for r in refs]
    tokens = sum(len(tokenize(t)) for t in texts)
    tracemalloc.start()
    try:
        idx = RougeIndex(texts, keep_texts=False)
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert idx.references is None and len(idx) == len(texts)
    assert retained <= 28 * tokens + 120 * len(idx._vocab), (retained, tokens, len(idx._vocab))
    assert idx.nbytes <= retained
    with pytest.raises(ValueError, match="keep_texts"):
        idx.brute_force("anything")
