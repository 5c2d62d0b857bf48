"""Sharded reference scoring merges to exactly the whole-corpus metrics (no Ray)."""

import os
import random
import stat

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


def test_a_saved_shard_loads_with_equal_scores_and_no_texts(refs, tmp_path, monkeypatch):
    texts = _texts(refs)
    for n in (1, 3):
        for i in range(n):
            built = ReferenceShard(refs, i, n)
            built.save(tmp_path / f"s{i}-{n}.npz")
            loaded = ReferenceShard.load(tmp_path / f"s{i}-{n}.npz")
            assert loaded.summary() == built.summary() and loaded.corpus_documents == built.corpus_documents
            assert loaded.values == built.values and loaded.doc_ids == built.doc_ids
            assert loaded.probe(texts) == built.probe(texts)
            assert loaded.score(texts) == built.score(texts)
    # the value index comes back as its arrays, not built again from the values
    want = ReferenceShard(refs, 0, 1).score(texts)

    def rebuilt(*args: object) -> None:
        raise AssertionError("the value index was built again on load")

    monkeypatch.setattr(ReferenceShard, "_set_values", rebuilt)
    assert ReferenceShard.load(tmp_path / "s0-1.npz").score(texts) == want
    raw = (tmp_path / "s0-1.npz").read_bytes()
    assert refs[0][1][:40].encode() not in raw  # token ids, not the notes' text


def test_cached_shards_are_built_once_per_references_and_rebuilt_when_they_change(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(rows):
        d = tmp_path / "extracted" / "status=ok"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([{"doc_id": i, "text": t, "control_code": c, "entities": []}
                                             for i, t, c in rows]), d / "part-0.parquet")  # fmt: skip

    write([("a", "Seen by Dr. Smith on the ward.", "PERSON: Smith"), ("b", "Discharged home, stable.", "")])
    refs_dir, index_dir = str(tmp_path / "extracted"), tmp_path / "index"
    old_umask = os.umask(0o022)  # a permissive umask: the index stays its owner's alone
    try:
        first = ReferenceShard.cached(refs_dir, 0, 1, index_dir)
    finally:
        os.umask(old_umask)
    (saved,) = index_dir.glob("shard-0-of-1-*.npz")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(index_dir.stat().st_mode) == 0o700
    built = []
    real_init = ReferenceShard.__init__
    monkeypatch.setattr(ReferenceShard, "__init__", lambda self, *a: (built.append(1), real_init(self, *a))[1])
    again = ReferenceShard.cached(refs_dir, 0, 1, index_dir)  # another replica: loads the file
    assert not built and again.score(["Dr. Smith came"]) == first.score(["Dr. Smith came"])
    write([("c", "Seen by Dr. Jones.", "PERSON: Jones")])  # new references: a new index
    changed = ReferenceShard.cached(refs_dir, 0, 1, index_dir)
    assert built and changed.doc_ids == ["c"] and len(list(index_dir.glob("*.npz"))) == 2
