"""Generic corpora: JSONL, Parquet or CSV files with a named text column.

No entities are known (the *unknown* setting: a recognizer finds them later),
except for Parquet files already in the ctrlgen document schema, whose
``entities`` are read back (so stage outputs can be read as corpora).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctrlgen.config import GenericCorpusConfig
from ctrlgen.corpora._common import (
    BadRow,
    Record,
    csv_error_summary,
    decode_utf8,
    finish,
    limited,
    open_csv_as_bytes,
    reject,
)
from ctrlgen.errors import CorpusError
from ctrlgen.schema import DOCUMENT_SCHEMA, Document, Entity

__all__ = ["read_generic"]

_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}


def _files(cfg: GenericCorpusConfig) -> list[tuple[Path, str]]:
    root = Path(cfg.path)
    if not root.exists():
        raise CorpusError(f"corpus path {root} does not exist")
    paths = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else [root]
    out = []
    for p in paths:
        fmt = cfg.file_format if cfg.file_format != "auto" else _SUFFIXES.get(p.suffix.lower())
        if fmt is not None:
            out.append((p, fmt))
        elif not root.is_dir():
            raise CorpusError(f"cannot tell the format of {p} from its extension; set file_format")
    if not out:
        raise CorpusError(f"{root} holds no .jsonl, .parquet or .csv files")
    return out


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any] | BadRow]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"line {lineno}"
            try:
                obj = json.loads(decode_utf8(raw, "line"))
                if not isinstance(obj, dict):
                    raise BadRow("line is not a JSON object")
                yield where, obj
            except json.JSONDecodeError as exc:
                yield where, BadRow(f"invalid JSON at column {exc.colno}: {exc.msg}")
            except BadRow as exc:
                yield where, exc


def _table_rows(path: Path, fmt: str, cfg: GenericCorpusConfig) -> Iterator[tuple[str, dict[str, Any] | BadRow]]:
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
            batches: Iterator[pa.RecordBatch] = pf.iter_batches(batch_size=4096)
        else:
            names, reader = open_csv_as_bytes(path)
            batches = iter(reader)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"{path} is not a readable {fmt} file: {exc}") from None  # Parquet footers: no row text
    for col in [cfg.text_column] + ([cfg.id_column] if cfg.id_column else []):
        if col not in names:
            raise CorpusError(f"{path} has no column {col!r} (has {names[:20]})")
    row = 0
    try:
        for batch in batches:
            for obj in batch.to_pylist():
                row += 1
                try:
                    yield f"row {row}", {k: _decode(v, k) for k, v in obj.items()}
                except BadRow as exc:
                    yield f"row {row}", exc
    except pa.ArrowInvalid as exc:
        why = csv_error_summary(exc) if fmt == "csv" else str(exc)
        raise CorpusError(f"{path} is not well-formed {fmt} after data row {row} ({why})") from None


def _decode(value: Any, column: str) -> Any:
    return decode_utf8(value, f"column {column}") if isinstance(value, bytes) else value


def read_generic(cfg: GenericCorpusConfig) -> Iterator[Record]:
    """Yield one document per row of every file, or quarantine records.

    Raises:
        CorpusError: a file is missing, unreadable, or lacks the text / id column.
    """

    def records() -> Iterator[Record]:
        for path, fmt in _files(cfg):
            rows = _jsonl_rows(path) if fmt == "jsonl" else _table_rows(path, fmt, cfg)
            for where, obj in rows:
                yield _to_record(obj, path, where, cfg)

    yield from limited(records(), cfg.limit)


def _to_record(obj: dict[str, Any] | BadRow, path: Path, where: str, cfg: GenericCorpusConfig) -> Record:
    source = str(path)
    try:
        if isinstance(obj, BadRow):
            raise obj
        text = obj.get(cfg.text_column)
        if not isinstance(text, str):
            raise BadRow(f"field {cfg.text_column!r} is missing or not a string")
        if cfg.id_column:
            raw_id = obj.get(cfg.id_column)
            if raw_id is None or raw_id == "":
                raise BadRow(f"field {cfg.id_column!r} is missing")
            doc_id = str(raw_id)
        else:
            doc_id = f"{path.stem}-{where.split()[-1]}"
        ours = set(DOCUMENT_SCHEMA.names) <= set(obj) and cfg.text_column == "text"
        if ours:
            meta = json.loads(obj["metadata"]) if obj.get("metadata") else {}
            entities = [Entity.from_row(e) for e in obj.get("entities") or []]
        else:
            skip = {cfg.text_column, cfg.id_column}
            meta = {k: v for k, v in obj.items() if k not in skip and isinstance(v, (str, int, float, bool))}
            entities = []
        meta.setdefault("corpus", path.stem)
        for e in entities:
            if not isinstance(e.text, str):
                raise BadRow("entity text is not a string")
        doc = Document(doc_id, text, meta, entities)
    except BadRow as exc:
        return reject(cfg, source, where, str(exc))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return reject(
            cfg, source, where, f"row in ctrlgen schema has malformed metadata/entities ({type(exc).__name__})"
        )
    return finish(doc, cfg, source, where)
