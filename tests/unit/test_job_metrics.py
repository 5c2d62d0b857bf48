"""The jobs' metric counts, from their output tables (no Ray needed)."""

import pyarrow as pa

from ctrlgen.config import GenericCorpusConfig
from ctrlgen.extract import KnownExtractor
from ctrlgen.extract.stage import extract_rows
from ray_jobs.metrics import extract_counts, generate_counts, record_extract


def test_extract_counts_rows_by_status_and_entities_by_category():
    corpus = GenericCorpusConfig(path="x")

    def ent(start, end, text, category):
        return {"start": start, "end": end, "text": text, "category": category, "kind": "DIRECT",
                "source": "gold", "label": ""}  # fmt: skip

    text = "Seen by Dr Ann Lee on 2020-01-02."
    rows = [
        {"doc_id": "a", "text": text, "metadata": "{}",
         "entities": [ent(11, 18, "Ann Lee", "PERSON"), ent(22, 32, "2020-01-02", "DATETIME")]},
        {"doc_id": "b", "text": "short", "metadata": "{}", "entities": [ent(3, 99, "x", "PERSON")]},
    ]  # fmt: skip
    table = extract_rows(rows, KnownExtractor(), corpus, "documents")
    statuses, cats = extract_counts(table)
    assert statuses == {"ok": 1, "quarantined": 1}
    assert cats == {"PERSON": 1, "DATETIME": 1}
    record_extract(table)  # outside Ray: a no-op, never an error


def test_generate_counts_tokens_and_withheld_by_mode():
    table = pa.table({
        "mode": ["icl", "icl", "icl_blocking", "baseline"],
        "new_tokens": [5, 7, 3, 0],
        "status": ["ok", "ok", "ok", "quarantined"],
        "released": [True, False, True, False],
    })  # fmt: skip
    statuses, tokens, withheld = generate_counts(table)
    assert statuses == {"ok": 3, "quarantined": 1}
    assert tokens == {"icl": 12, "icl_blocking": 3, "baseline": 0}
    assert withheld == {"icl": 1}
