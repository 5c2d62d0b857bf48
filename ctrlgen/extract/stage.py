"""The extraction stage on plain rows: what a Ray actor (or a plain loop) runs per batch.

Input rows are either NOTEEVENTS rows (``input_kind="noteevents"``) or rows in the
ctrlgen document schema (``input_kind="documents"``). Output rows have the
columns of :data:`EXTRACTED_SCHEMA`: the document columns, ``control_code``, and
``status`` / ``reason`` / ``location`` so that quarantined rows travel with the
good ones and are written in the same pass (their ``text`` is left empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ctrlgen.codes import build_control_code, format_control_code
from ctrlgen.config import CorpusCommon, MimicCorpusConfig
from ctrlgen.corpora._common import validate_document
from ctrlgen.corpora.mimic import parse_noteevent
from ctrlgen.extract import Extractor
from ctrlgen.schema import ENTITY_TYPE, Document, Quarantined, select_private

__all__ = ["EXTRACTED_SCHEMA", "extract_rows"]

EXTRACTED_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("text", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("entities", pa.list_(ENTITY_TYPE)),
        pa.field("control_code", pa.string()),
        pa.field("status", pa.string()),  # "ok" | "quarantined"
        pa.field("reason", pa.string()),
        pa.field("location", pa.string()),
    ]
)


def _quarantine_row(q: Quarantined) -> dict[str, Any]:
    return {
        "doc_id": q.doc_id,
        "text": "",
        "metadata": "{}",
        "entities": [],
        "control_code": "",
        "status": "quarantined",
        "reason": q.reason,
        "location": f"{q.source}, {q.location}",
    }


def extract_rows(
    rows: Sequence[dict[str, Any]],
    extractor: Extractor,
    corpus: CorpusCommon,
    input_kind: str,
    source: str = "input",
) -> pa.Table:
    """Parse, extract and encode one batch of rows; never drops a row.

    A row that cannot be parsed, or whose extraction fails, comes back as a
    ``quarantined`` row with the reason (no private text in it).
    """
    out: list[dict[str, Any]] = []
    docs: list[Document] = []
    for i, row in enumerate(rows):
        if input_kind == "noteevents":
            assert isinstance(corpus, MimicCorpusConfig)
            rec = parse_noteevent(row, corpus, source, f"row {row.get('ROW_ID')!s}")
        else:
            try:
                rec = Document.from_row(row)
            except (KeyError, TypeError, ValueError) as exc:
                rec = Quarantined(
                    source, f"batch row {i}", f"not a ctrlgen document row ({type(exc).__name__})", row.get("doc_id")
                )
        if isinstance(rec, Quarantined):
            out.append(_quarantine_row(rec))
        else:
            docs.append(rec)
    if docs:
        try:
            found = extractor(docs)
        except Exception:  # one bad document must not take the batch down: retry one by one
            found = []
            for d in docs:
                try:
                    found.extend(extractor([d]))
                except Exception as exc:
                    failed = f"extraction failed ({type(exc).__name__})"  # the message may quote text
                    out.append(_quarantine_row(Quarantined(source, f"doc {d.doc_id}", failed, d.doc_id)))
        for d in found:
            private = select_private(d.entities, corpus.identifiers)
            reason = validate_document(Document(d.doc_id, d.text, d.metadata, private), corpus.max_chars)
            if reason is not None:
                out.append(_quarantine_row(Quarantined(source, f"doc {d.doc_id}", reason, d.doc_id)))
                continue
            row = Document(d.doc_id, d.text, d.metadata, private).to_row()
            row.update(
                control_code=format_control_code(build_control_code(private)), status="ok", reason=None, location=None
            )
            out.append(row)
    return pa.Table.from_pylist(out, schema=EXTRACTED_SCHEMA)
