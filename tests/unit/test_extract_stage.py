"""The extraction stage without Ray: the unknown setting with a real Presidio engine, and the batch function."""

import itertools

import pytest

from ctrlgen.codes import parse_control_code
from ctrlgen.config import ExtractionConfig, MimicCorpusConfig, PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.demo import generate_batch
from ctrlgen.extract import KnownExtractor
from ctrlgen.extract.presidio import PresidioExtractor, results_to_entities
from ctrlgen.extract.stage import EXTRACTED_SCHEMA, extract_rows


@pytest.fixture(scope="module")
def presidio():
    return PresidioExtractor(ExtractionConfig(setting="unknown"), identifiers="direct+quasi")


def test_presidio_finds_the_categories_the_domains_need(presidio):
    text = (
        "The case originated in an application (no. 36244/06) lodged by Mr John Smith on 15 October 2004. "
        "He is a 58 year old patient of Calvert Hospital, phone 201-561-8910, MRN: 00123456."
    )
    ents = presidio.extract_texts([text])[0]
    found = {(e.text, e.category) for e in ents}
    for expected in [
        ("36244/06", "CODE"),
        ("John Smith", "PERSON"),
        ("15 October 2004", "DATETIME"),
        ("58", "DEM"),
        ("201-561-8910", "CODE"),
        ("00123456", "CODE"),
    ]:
        assert expected in found, (expected, found)
    assert all(text[e.start : e.end] == e.text for e in ents)
    spans = sorted((e.start, e.end) for e in ents)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no overlaps


def test_mimic_placeholders_are_recognized_in_the_unknown_setting(presidio):
    ents = presidio.extract_texts(["Seen at [**Hospital1 18**] by [**Doctor Last Name 12**]."])[0]
    assert [(e.text, e.category) for e in ents] == [
        ("[**Hospital1 18**]", "ORG"),
        ("[**Doctor Last Name 12**]", "PERSON"),
    ]


def test_identifier_choice_filters_recognized_kinds():
    ext = PresidioExtractor(ExtractionConfig(setting="unknown"), identifiers="direct")
    ents = ext.extract_texts(["Mr John Smith was seen on 15 October 2004 in Boston."])[0]
    assert {e.kind for e in ents} == {"DIRECT"}


def test_overlaps_keep_the_higher_score_then_the_longer_span():
    class R:
        def __init__(self, t, s, e, score):
            self.entity_type, self.start, self.end, self.score, self.recognition_metadata = t, s, e, score, {}

    text = "John Smith Jr"
    ents = results_to_entities(
        text, [R("PERSON", 0, 4, 0.6), R("PERSON", 0, 10, 0.6), R("LOCATION", 5, 13, 0.9)], 0.5, ("DIRECT", "QUASI")
    )
    assert [(e.text, e.category) for e in ents] == [("John", "PERSON"), ("Smith Jr", "LOC")]


def test_score_threshold_and_unknown_recognizer():
    with pytest.raises(Exception, match="unknown recognizer"):
        PresidioExtractor(ExtractionConfig(setting="unknown", recognizers=["NoSuchRecognizer"]))


def test_extract_rows_balances_counts_and_writes_control_codes():
    rows = [
        dict(zip(("ROW_ID", "SUBJECT_ID", "CATEGORY", "TEXT"), r, strict=True))
        for r in [
            (1, 1, "Nursing", "Pt [**Known lastname 5**] seen [**2101-1-2**]."),
            (2, 1, "Nursing", "   "),
            (3, 1, "Nursing", None),
            (4, 2, "Nursing", "No PHI in this note."),
        ]
    ]
    table = extract_rows(rows, KnownExtractor(), MimicCorpusConfig(path="x", identifiers="direct+quasi"), "noteevents")
    assert table.schema.equals(EXTRACTED_SCHEMA) and table.num_rows == 4
    out = table.to_pylist()
    assert [r["status"] for r in out].count("ok") == 2
    ok = {r["doc_id"]: r for r in out if r["status"] == "ok"}
    assert parse_control_code(ok["1"]["control_code"]) == {"PERSON": ["Known lastname 5"], "DATETIME": ["2101-1-2"]}
    assert ok["4"]["control_code"] == ""
    bad = [r for r in out if r["status"] == "quarantined"]
    assert {r["reason"] for r in bad} == {"empty document", "TEXT is null"} and all(r["text"] == "" for r in bad)


def test_failing_extractor_quarantines_only_the_failing_document():
    def flaky(docs):
        if any("boom" in d.text for d in docs):
            raise RuntimeError("secret text must not leak")
        return list(docs)

    rows = [
        {"doc_id": "a", "text": "fine", "metadata": "{}", "entities": []},
        {"doc_id": "b", "text": "boom", "metadata": "{}", "entities": []},
    ]
    out = extract_rows(rows, flaky, MimicCorpusConfig(path="x"), "documents").to_pylist()
    assert [(r["doc_id"], r["status"]) for r in out] == [("b", "quarantined"), ("a", "ok")]
    assert out[0]["reason"] == "extraction failed (RuntimeError)"


def test_known_and_presidio_paths_agree_on_demo_placeholders(presidio):
    batch = generate_batch(seed=3, start_row=0, n=30)
    rows = [dict(zip(batch, vals, strict=True)) for vals in zip(*batch.values(), strict=True)]
    corpus = MimicCorpusConfig(path="x", identifiers="direct+quasi")
    known = {r["doc_id"]: r for r in extract_rows(rows, KnownExtractor(), corpus, "noteevents").to_pylist()}
    found = {r["doc_id"]: r for r in extract_rows(rows, presidio, corpus, "noteevents").to_pylist()}
    for doc_id, r in known.items():
        if r["status"] != "ok":
            continue
        placeholders = {(e["start"], e["end"]) for e in r["entities"]}
        recognized = {(e["start"], e["end"]) for e in found[doc_id]["entities"]}
        assert placeholders <= recognized, doc_id


def test_physionet_unknown_setting_reaches_useful_recall(presidio, shared):
    docs, _, _ = load_corpus(
        PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=150)
    )
    out = presidio(docs)
    gold = [(d.doc_id, e.start, e.end) for d in docs for e in d.entities]
    pred = {d.doc_id: [(e.start, e.end) for e in d.entities] for d in out}
    hit = sum(any(s < ge and gs < e for s, e in pred[doc]) for doc, gs, ge in gold)
    assert hit / len(gold) > 0.6


def test_ner_only_path_skips_presidio_context_step_without_changing_entities(presidio, shared):
    """The no-op context enhancer (no lemmas, no context words) gives Presidio's lemma enhancer's entities."""
    from presidio_analyzer.context_aware_enhancers import LemmaContextAwareEnhancer

    docs, _, _ = load_corpus(
        PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=120)
    )
    assert not isinstance(presidio._analyzer.context_aware_enhancer, LemmaContextAwareEnhancer)
    with_lemma_step = PresidioExtractor(ExtractionConfig(setting="unknown"), identifiers="direct+quasi")
    with_lemma_step._analyzer.context_aware_enhancer = LemmaContextAwareEnhancer()
    texts = [d.text for d in docs]
    assert presidio.extract_texts(texts) == with_lemma_step.extract_texts(texts)


def test_presidio_is_imported_without_transformers_which_still_imports_afterwards():
    """Presidio's eager ``from transformers import pipeline`` is skipped, nothing else is blocked."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ctrlgen.extract.presidio import _import_presidio\n"
        "_import_presidio()\n"
        "assert 'presidio_analyzer' in sys.modules and 'transformers' not in sys.modules\n"
        "from presidio_analyzer.nlp_engine import SpacyNlpEngine\n"
        "import transformers\n"
        "from transformers import LlamaConfig\n"
        "print(LlamaConfig.model_type)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "llama"
