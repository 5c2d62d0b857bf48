import json

import pytest

from ctrlgen.config import TabCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.corpora.tab import paragraph_spans
from ctrlgen.errors import CorpusError

TAB = "tab"  # the directory: its one real case is the fixture


def _raw(shared):
    (path,) = sorted((shared / TAB).glob("*.json"))
    return json.loads(path.read_text())[0]


def _count(case, annotator, kinds):
    return sum(1 for m in case["annotations"][annotator]["entity_mentions"] if m["identifier_type"] in kinds)


@pytest.mark.parametrize("annotator", ["annotator1", "annotator10"])
@pytest.mark.parametrize(
    "identifiers, kinds", [("direct", {"DIRECT"}), ("direct+quasi", {"DIRECT", "QUASI"}), ("quasi", {"QUASI"})]
)
def test_whole_case_keeps_the_chosen_annotator_and_kinds(shared, annotator, identifiers, kinds):
    cfg = TabCorpusConfig(path=str(shared / TAB), annotator=annotator, identifiers=identifiers, segments=None)
    docs, bad, _ = load_corpus(cfg)
    assert len(docs) == 1 and not bad
    assert len(docs[0].entities) == _count(_raw(shared), annotator, kinds)
    assert {e.kind for e in docs[0].entities} <= kinds
    assert docs[0].metadata["annotator"] == annotator


def test_paper_segments_are_paragraphs_1_6_and_6_12(shared):
    case = _raw(shared)
    cfg = TabCorpusConfig(path=str(shared / TAB), identifiers="direct+quasi")
    docs, bad, _ = load_corpus(cfg)
    assert [d.doc_id for d in docs] == [f"{case['doc_id']}#p1-6", f"{case['doc_id']}#p6-12"] and not bad
    paras = paragraph_spans(case["text"])
    assert docs[0].text == case["text"][paras[0][0] : paras[5][1]]
    assert docs[1].text.startswith(case["text"][paras[5][0] : paras[5][1]])
    for d in docs:
        for e in d.entities:
            assert d.text[e.start : e.end] == e.text
    # Every private mention inside paragraphs 1-6 is in the first window.
    end6 = paras[5][1]
    inside = [
        m
        for m in case["annotations"]["annotator1"]["entity_mentions"]
        if m["identifier_type"] != "NO_MASK" and m["end_offset"] <= end6
    ]
    assert len(docs[0].entities) == len(inside)


def test_metadata_does_not_carry_the_protected_persons_name(shared):
    docs, _, _ = load_corpus(TabCorpusConfig(path=str(shared / TAB)))
    applicant = _raw(shared)["meta"]["applicant"]
    assert all(applicant not in json.dumps(d.metadata) for d in docs)


def test_missing_annotator_is_quarantined(shared):
    docs, bad, report = load_corpus(TabCorpusConfig(path=str(shared / TAB), annotator="annotator99"))
    assert not docs and len(bad) == 1 and "annotator99" in bad[0].reason
    assert report.rows_in == 1


def test_crossing_entity_quarantines_its_window(tmp_path):
    case = {
        "doc_id": "x",
        "text": "A one.\n\nB two.\n\nC three.",
        "annotations": {
            "a": {
                "entity_mentions": [
                    {
                        "entity_type": "PERSON",
                        "start_offset": 4,
                        "end_offset": 9,
                        "span_text": "e.\n\nB",
                        "identifier_type": "DIRECT",
                    }
                ]
            }
        },
    }
    f = tmp_path / "t.json"
    f.write_text(json.dumps([case]))
    docs, bad, _ = load_corpus(TabCorpusConfig(path=str(f), segments=[(1, 1), (3, 3)]))
    assert [d.doc_id for d in docs] == ["x#p3-3"]
    assert "cross the boundary" in bad[0].reason


def test_not_json_is_a_clear_error(tmp_path):
    f = tmp_path / "t.json"
    f.write_text("{not json")
    with pytest.raises(CorpusError, match="not valid JSON: line 1"):
        load_corpus(TabCorpusConfig(path=str(f)))
