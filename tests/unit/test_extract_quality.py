import math

from ctrlgen.extract.quality import found_by_label, scores_table, span_scores
from ctrlgen.schema import Document, Entity


def _d(doc_id, *ents):
    return Document(doc_id, "x" * 100, entities=[Entity(s, e, "x" * (e - s), c, "DIRECT", "gold") for s, e, c in ents])


def test_overlap_typed_and_exact_matching_by_hand():
    gold = [_d("a", (0, 10, "PERSON"), (20, 30, "LOC"), (40, 45, "DATETIME")), _d("b", (0, 5, "PERSON"))]
    pred = [_d("a", (0, 10, "PERSON"), (25, 35, "ORG"), (60, 70, "PERSON"))]  # b: no prediction at all
    s = span_scores(gold, pred)
    assert (s["ALL"].gold, s["ALL"].detected, s["ALL"].typed, s["ALL"].exact) == (4, 2, 1, 1)
    assert (s["ALL"].predicted, s["ALL"].correct) == (3, 2)
    assert s["PERSON"].recall == 0.5 and s["PERSON"].precision == 0.5  # gold 2 (1 found), predicted 2 (1 correct)
    assert s["LOC"].recall == 1.0 and s["LOC"].typed_recall == 0.0
    assert s["ORG"].precision == 1.0 and math.isnan(s["ORG"].recall)
    assert s["DATETIME"].recall == 0.0
    assert abs(s["ALL"].f1 - 2 * (2 / 3) * 0.5 / (2 / 3 + 0.5)) < 1e-12


def test_table_lists_engines_and_skips_empty_categories():
    s = span_scores([_d("a", (0, 10, "PERSON"))], [_d("a", (0, 10, "PERSON"))])
    table = scores_table({"ours": s})
    assert "| ours | PERSON | 1 | 1 | 100.0 | 100.0 | 100.0 | 100.0 | 100.0 |" in table
    assert "QUANTITY" not in table


def test_found_by_label_counts_overlapped_gold_spans_per_corpus_label():
    def gold_doc(doc_id, *ents):
        return Document(doc_id, "x" * 100, entities=[Entity(s, e, "x" * (e - s), "PERSON", "DIRECT", "gold", label)
                                                     for s, e, label in ents])  # fmt: skip

    gold = [gold_doc("a", (0, 10, "PTName"), (20, 30, "HCPName"), (40, 45, "HCPName")), gold_doc("b", (0, 5, "PTName"))]
    pred = [_d("a", (5, 12, "LOC"), (44, 50, "PERSON"))]  # any category counts; b has no prediction
    assert found_by_label(gold, pred) == {"PTName": 1, "HCPName": 1}
    assert found_by_label(gold, gold) == {"PTName": 2, "HCPName": 2}
    assert found_by_label(gold, []) == {"PTName": 0, "HCPName": 0}
