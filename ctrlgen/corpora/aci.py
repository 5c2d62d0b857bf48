"""ACI-Bench visit notes: a CSV (dataset, encounter_id, dialogue, note) + its metadata CSV.

ACI-Bench has no span annotations: the patient's first and family name, the
doctor's name (when given) and the patient's age from the metadata are the
*known* private values; their mentions in the text (case-insensitive, on word
boundaries; ages in forms like ``50-year-old`` or ``aged 50``) become entities.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

from ctrlgen.config import AciCorpusConfig
from ctrlgen.corpora._common import BadRow, Record, check_no_surrogates, finish, limited, reject, require_file
from ctrlgen.errors import CorpusError
from ctrlgen.schema import Document, Entity

__all__ = ["known_value_entities", "read_aci"]

_REQUIRED = ("encounter_id",)
_META_REQUIRED = ("encounter_id", "patient_firstname", "patient_familyname", "patient_age")


def _read_csv(path: Path, required: tuple[str, ...]) -> tuple[list[dict[str, str]], list[str]]:
    # surrogateescape keeps undecodable bytes visible per row instead of failing the file.
    with path.open(encoding="utf-8", errors="surrogateescape", newline="") as fh:
        reader = csv.DictReader(fh)
        names = list(reader.fieldnames or [])
        missing = [c for c in required if c not in names]
        if missing:
            raise CorpusError(f"{path} is missing column(s) {missing} (has {names})")
        try:
            return list(reader), names
        except csv.Error as exc:
            raise CorpusError(f"{path} is not well-formed CSV near line {reader.line_num}: {exc}") from None


def known_value_entities(text: str, names: list[tuple[str, str]], age: str | None) -> list[Entity]:
    """Mentions of known names (``(value, label)``) and of the age in ``text``.

    Example:
        >>> [e.text for e in known_value_entities("Martha, 50-year-old", [("Martha", "first")], "50")]
        ['Martha', '50']
    """
    out = []
    for value, label in names:
        value = value.strip()
        if not value:
            continue
        for m in re.finditer(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.I):
            out.append(Entity(m.start(), m.end(), m.group(0), "PERSON", "DIRECT", "metadata", label))
    if age and age.strip().isdigit():
        a = re.escape(age.strip())
        pattern = rf"(?<!\d)({a})(?=[\s-]*years?[\s-]*old)|\baged?\s+({a})(?!\d)"
        for m in re.finditer(pattern, text, re.I):
            g = 1 if m.group(1) is not None else 2
            out.append(Entity(m.start(g), m.end(g), m.group(g), "DEM", "QUASI", "metadata", "age"))
    return out


def read_aci(cfg: AciCorpusConfig) -> Iterator[Record]:
    """Yield ACI-Bench documents (id ``<dataset>-<encounter_id>``) or quarantine records.

    Raises:
        CorpusError: a file is missing or lacks required columns.
    """
    path = require_file(cfg.path, "ACI-Bench CSV")
    meta_path = require_file(cfg.metadata_path or path.with_name(f"{path.stem}_metadata.csv"), "ACI-Bench metadata CSV")
    rows, _ = _read_csv(path, (*_REQUIRED, cfg.text_column))
    meta_rows, _ = _read_csv(meta_path, _META_REQUIRED)
    meta = {(m.get("dataset"), m["encounter_id"]): m for m in meta_rows}
    yield from limited(_docs(rows, meta, cfg, str(path)), cfg.limit)


def _docs(
    rows: list[dict[str, str]], meta: dict[tuple[str | None, str], dict[str, str]], cfg: AciCorpusConfig, source: str
) -> Iterator[Record]:
    for i, row in enumerate(rows, start=1):
        enc = row.get("encounter_id") or ""
        where = f"data row {i} (encounter {enc})"
        doc_id = f"{row.get('dataset') or 'aci'}-{enc}"
        try:
            text = row.get(cfg.text_column)
            if text is None:
                raise BadRow(f"row has no {cfg.text_column} field")
            check_no_surrogates(text, f"column {cfg.text_column}")
            m = meta.get((row.get("dataset"), enc)) or meta.get((None, enc))
            if m is None:
                raise BadRow("no metadata row for this encounter: its private values are unknown")
            names = [
                (m.get("patient_firstname") or "", "patient_firstname"),
                (m.get("patient_familyname") or "", "patient_familyname"),
                (m.get("doctor_name") or "", "doctor_name"),
            ]
            for value, _ in names:
                check_no_surrogates(value, "metadata")
        except BadRow as exc:
            yield reject(cfg, source, where, str(exc), doc_id)
            continue
        ents = known_value_entities(text, names, m.get("patient_age"))
        metadata = {
            "corpus": "aci-bench",
            "dataset": row.get("dataset"),
            "encounter_id": enc,
            "gender": m.get("patient_gender"),
            "chief_complaint": m.get("cc"),
        }
        yield finish(Document(doc_id, text, metadata, ents), cfg, source, where)
