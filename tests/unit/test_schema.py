import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from ctrlgen.schema import (
    DOCUMENT_SCHEMA,
    Document,
    Entity,
    documents_to_table,
    identifier_kinds,
    select_private,
    table_to_documents,
)


def _doc():
    text = "Alice Jones saw Dr. Smith in Boston on 3 May 2004."
    ents = [
        Entity(0, 11, "Alice Jones", "PERSON", "DIRECT", "gold", "PTName"),
        Entity(20, 25, "Smith", "PERSON", "DIRECT", "gold", "HCPName"),
        Entity(29, 35, "Boston", "LOC", "QUASI", "gold"),
        Entity(39, 49, "3 May 2004", "DATETIME", "QUASI", "gold"),
    ]
    return Document("d1", text, {"corpus": "t", "n": 1, "nested": {"a": [1, 2]}}, ents)


def test_documents_round_trip_through_parquet(tmp_path):
    docs = [_doc(), Document("d2", "No entities here.", {}, [])]
    pq.write_table(documents_to_table(docs), tmp_path / "d.parquet")
    table = pq.read_table(tmp_path / "d.parquet")
    assert table.schema.equals(DOCUMENT_SCHEMA)
    assert table_to_documents(table) == docs


def test_table_without_document_columns_is_refused():
    import pyarrow as pa

    with pytest.raises(ValueError, match="missing column"):
        table_to_documents(pa.table({"text": ["x"]}))


@pytest.mark.parametrize(
    "choice, kinds", [("direct", {"DIRECT"}), ("direct+quasi", {"DIRECT", "QUASI"}), ("quasi", {"QUASI"})]
)
def test_select_private_keeps_the_chosen_identifier_kinds(choice, kinds):
    kept = select_private(_doc().entities, choice)
    assert {e.kind for e in kept} == kinds


def test_unknown_identifier_choice_is_an_error():
    with pytest.raises(ValueError, match="unknown identifier choice"):
        identifier_kinds("all")


def test_importing_ctrlgen_does_not_import_ray():
    code = "import sys, ctrlgen, ctrlgen.corpora, ctrlgen.io, ctrlgen.demo, ctrlgen.cli; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
