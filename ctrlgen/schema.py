"""The one document / entity schema of ctrlgen, as dataclasses and as Arrow.

Every reader produces :class:`Document` rows; every stage reads and writes the
Arrow form (:data:`DOCUMENT_SCHEMA`) so that Parquet round-trips are exact.

Columns of a document row:

* ``doc_id`` (string): unique within a corpus.
* ``text`` (string): the document text; entity offsets index it.
* ``metadata`` (string): a JSON object (corpus name, source file, record ids...).
  JSON rather than an Arrow struct because every corpus has other fields.
* ``entities`` (list<struct>): mentions, see :data:`ENTITY_TYPE`.

Example:
    >>> e = Entity(0, 5, "Alice", "PERSON", "DIRECT", "gold")
    >>> doc = Document("d1", "Alice was seen.", entities=[e])
    >>> Document.from_row(doc.to_row()) == doc
    True
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = [
    "CATEGORIES",
    "DOCUMENT_SCHEMA",
    "ENTITY_TYPE",
    "IDENTIFIER_KINDS",
    "QUARANTINE_SCHEMA",
    "SOURCES",
    "Document",
    "Entity",
    "Quarantined",
    "documents_to_table",
    "identifier_kinds",
    "patient_id",
    "quarantine_to_table",
    "select_private",
    "table_to_documents",
]

#: The TAB scheme's eight categories, in the order control codes list them.
CATEGORIES: tuple[str, ...] = (
    "PERSON",
    "CODE",
    "LOC",
    "ORG",
    "DEM",
    "DATETIME",
    "QUANTITY",
    "MISC",
)
#: DIRECT identifiers single a person out on their own; QUASI ones in combination.
IDENTIFIER_KINDS: tuple[str, ...] = ("DIRECT", "QUASI")
#: Where a mention came from.
SOURCES: tuple[str, ...] = ("gold", "placeholder", "metadata", "presidio", "pattern", "canary")

ENTITY_TYPE = pa.struct(
    [
        pa.field("start", pa.int32(), nullable=False),
        pa.field("end", pa.int32(), nullable=False),  # exclusive
        pa.field("text", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        # The corpus' own fine-grained type (e.g. "HCPName", "Hospital1"); "" if none.
        pa.field("label", pa.string(), nullable=False),
    ]
)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("entities", pa.list_(ENTITY_TYPE), nullable=False),
    ]
)

#: Rows that could not be turned into documents. ``reason`` never holds private
#: text (offsets, column names and byte positions only); ``location`` names the
#: file and row or record.
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("location", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=True),
        pa.field("reason", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class Entity:
    """One private-entity mention; ``end`` is exclusive."""

    start: int
    end: int
    text: str
    category: str
    kind: str
    source: str
    label: str = ""

    def to_row(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "category": self.category,
            "kind": self.kind,
            "source": self.source,
            "label": self.label,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Entity:
        return cls(
            int(row["start"]),
            int(row["end"]),
            row["text"],
            row["category"],
            row["kind"],
            row["source"],
            row.get("label") or "",
        )


#: Metadata keys that name the patient a document belongs to: PhysioNet's ``patient`` (and any corpus
#: in the ctrlgen schema that sets it), MIMIC's ``SUBJECT_ID``.
PATIENT_KEYS: tuple[str, ...] = ("patient", "SUBJECT_ID")


def patient_id(metadata: Mapping[str, Any] | str | None) -> str | None:
    """The patient a document's ``metadata`` (a dict or its JSON) names, else None.

    Example:
        >>> patient_id('{"corpus": "mimic", "SUBJECT_ID": "109"}'), patient_id({"note": "1"})
        ('109', None)
    """
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata or "{}")
        except ValueError:
            return None
    if not isinstance(metadata, Mapping):
        return None
    for key in PATIENT_KEYS:
        value = metadata.get(key)
        if value not in (None, ""):
            return str(value)
    return None


@dataclass(slots=True)
class Document:
    """A document with its entity mentions (sorted by start, then end)."""

    doc_id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    entities: list[Entity] = field(default_factory=list)

    def to_row(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "text": self.text,
            "metadata": json.dumps(self.metadata, sort_keys=True, ensure_ascii=False),
            "entities": [e.to_row() for e in self.entities],
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Document:
        meta = row.get("metadata") or "{}"
        return cls(
            doc_id=row["doc_id"],
            text=row["text"],
            metadata=json.loads(meta) if isinstance(meta, str) else dict(meta),
            entities=[Entity.from_row(e) for e in (row.get("entities") or [])],
        )


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A row that was set aside, with the reason (never containing private text)."""

    source: str
    location: str
    reason: str
    doc_id: str | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "location": self.location,
            "doc_id": self.doc_id,
            "reason": self.reason,
        }


def documents_to_table(docs: Iterable[Document]) -> pa.Table:
    """Documents -> Arrow table with :data:`DOCUMENT_SCHEMA`."""
    return pa.Table.from_pylist([d.to_row() for d in docs], schema=DOCUMENT_SCHEMA)


def table_to_documents(table: pa.Table) -> list[Document]:
    """Arrow table (or record batch) with the document columns -> documents."""
    missing = [n for n in DOCUMENT_SCHEMA.names if n not in table.column_names]
    if missing:
        raise ValueError(
            f"table is not in the ctrlgen document schema: missing column(s) {missing}; "
            f"expected {DOCUMENT_SCHEMA.names}"
        )
    return [Document.from_row(r) for r in table.to_pylist()]


def quarantine_to_table(rows: Iterable[Quarantined]) -> pa.Table:
    return pa.Table.from_pylist([q.to_row() for q in rows], schema=QUARANTINE_SCHEMA)


_IDENTIFIER_CHOICES = {
    "direct": ("DIRECT",),
    "direct+quasi": ("DIRECT", "QUASI"),
    "quasi": ("QUASI",),
}


def identifier_kinds(choice: str) -> tuple[str, ...]:
    """``"direct" | "direct+quasi" | "quasi"`` -> the identifier kinds it keeps."""
    try:
        return _IDENTIFIER_CHOICES[choice.lower()]
    except KeyError:
        raise ValueError(f"unknown identifier choice {choice!r}; use one of {sorted(_IDENTIFIER_CHOICES)}") from None


def select_private(entities: Sequence[Entity], identifiers: str) -> list[Entity]:
    """Keep the mentions whose identifier kind is private under ``identifiers``.

    Example:
        >>> ents = [Entity(0, 1, "A", "PERSON", "DIRECT", "gold"),
        ...         Entity(2, 3, "B", "LOC", "QUASI", "gold")]
        >>> [e.text for e in select_private(ents, "direct")]
        ['A']
    """
    kinds = identifier_kinds(identifiers)
    return [e for e in entities if e.kind in kinds]
