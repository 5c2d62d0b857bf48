"""MIMIC-III ``NOTEEVENTS``: CSV as distributed (optionally .gz), or Parquet shards of the same columns.

Columns: ROW_ID, SUBJECT_ID, HADM_ID, CHARTDATE, CHARTTIME, STORETIME, CATEGORY,
DESCRIPTION, CGID, ISERROR, TEXT. The ``[**...**]`` placeholders of TEXT become
typed entities (the *known* setting). Files are streamed in record batches, so a
4 GB NOTEEVENTS.csv never sits in memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctrlgen.config import MimicCorpusConfig
from ctrlgen.corpora._common import (
    BadRow,
    Record,
    check_no_surrogates,
    csv_error_summary,
    decode_utf8,
    finish,
    limited,
    open_csv_as_bytes,
    reject,
)
from ctrlgen.errors import CorpusError
from ctrlgen.placeholders import placeholder_entities
from ctrlgen.schema import Document

__all__ = [
    "NOTEEVENTS_COLUMNS",
    "REQUIRED_COLUMNS",
    "iter_noteevent_batches",
    "noteevent_shards",
    "open_parquet",
    "parse_noteevent",
    "raw_phi_share",
    "read_mimic",
]

NOTEEVENTS_COLUMNS = (
    "ROW_ID",
    "SUBJECT_ID",
    "HADM_ID",
    "CHARTDATE",
    "CHARTTIME",
    "STORETIME",
    "CATEGORY",
    "DESCRIPTION",
    "CGID",
    "ISERROR",
    "TEXT",
)
REQUIRED_COLUMNS = ("ROW_ID", "SUBJECT_ID", "CATEGORY", "TEXT")
_PLACEHOLDER = re.compile(r"\[\*\*.*?\*\*\]", re.DOTALL)
# PHI written out, as de-identified MIMIC notes never have it: a titled surname, a full date, a labelled
# record number or a labelled full name.
_RAW_PHI = re.compile(
    r"\b(?:Dr|Mr|Mrs|Ms|Miss)\.?\s+[A-Z][a-z]{2,}"
    r"|\b\d{1,2}/\d{1,2}/(?:\d{4}|\d{2})\b|\b(?:1[89]|2[01])\d{2}-\d{1,2}-\d{1,2}\b"
    r"|\b(?:MRN|MR#|Medical Record(?: Number)?|Unit No)\s*[:#.]?\s*\d{5,}"
    r"|\b(?:Name|Patient)\s*:\s*[A-Z][a-z]+\s+[A-Z][a-z]+"
)


def raw_phi_share(texts: list[str]) -> float:
    """Share of ``texts`` holding PHI written out (outside ``[**...**]`` placeholders), which the known setting misses.

    A heuristic for a warning, not an extractor: titled surnames ("Dr. Smith"), full dates
    ("3/4/2101", "2101-03-04"), labelled record numbers ("MRN 1234567"), labelled names.

    Example:
        >>> raw_phi_share(["Seen by Dr. [**Last Name**] on [**2101-3-4**].", "Seen by Dr. Smith on 3/4/2101."])
        0.5
    """
    if not texts:
        return 0.0
    return sum(1 for t in texts if _RAW_PHI.search(_PLACEHOLDER.sub(" ", t))) / len(texts)


_BLOCK = 16 << 20  # CSV bytes per batch


def noteevent_shards(path: Path) -> list[Path]:
    """The NOTEEVENTS files at ``path`` (a file, or a directory of .parquet / .csv / .csv.gz shards), sorted."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".parquet", ".csv") or p.name.endswith(".csv.gz"))
        if not files:
            raise CorpusError(f"NOTEEVENTS directory {path} holds no .parquet or .csv files")
        return files
    if not path.exists():
        raise CorpusError(f"NOTEEVENTS file {path} does not exist")
    return [path]


def _check_columns(names: list[str], source: Path) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise CorpusError(
            f"{source} is not in the NOTEEVENTS schema: missing column(s) {missing} "
            f"(has {names[:12]}; expected {list(NOTEEVENTS_COLUMNS)})"
        )


def open_parquet(shard: str | Path) -> pq.ParquetFile:
    """Open a Parquet file (its footer only), or raise :class:`CorpusError` naming it."""
    from ctrlgen import storage

    try:
        return storage.parquet_file(str(shard)) if storage.is_uri(str(shard)) else pq.ParquetFile(shard)
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(f"{shard}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def iter_noteevent_batches(path: str | Path) -> Iterator[tuple[Path, int, list[dict[str, Any]]]]:
    """Yield ``(file, first_row_index, rows)`` batches from CSV or Parquet NOTEEVENTS files.

    CSV columns are read as bytes so that one row with non-UTF-8 bytes is
    quarantined instead of failing its whole block.
    """
    for shard in noteevent_shards(Path(path)):
        row = 0
        if shard.suffix == ".parquet":
            pf = open_parquet(shard)
            _check_columns(pf.schema_arrow.names, shard)
            for batch in pf.iter_batches(batch_size=4096):
                rows = batch.to_pylist()
                yield shard, row, rows
                row += len(rows)
            continue
        names, reader = open_csv_as_bytes(shard, _BLOCK)
        _check_columns(names, shard)
        try:
            for batch in reader:
                rows = batch.to_pylist()
                yield shard, row, rows
                row += len(rows)
        except pa.ArrowInvalid as exc:
            raise CorpusError(f"{shard} is not a well-formed CSV after data row {row} ({csv_error_summary(exc)})") from None


def _as_str(value: Any, column: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return decode_utf8(value, f"column {column}")
    if isinstance(value, str):
        check_no_surrogates(value, f"column {column}")
        return value
    return str(value)


def parse_noteevent(row: dict[str, Any], cfg: MimicCorpusConfig, source: str, location: str) -> Record:
    """One NOTEEVENTS row -> a :class:`Document` with placeholder entities, or quarantine."""
    try:
        row_id = _as_str(row.get("ROW_ID"), "ROW_ID")
        if not row_id:
            raise BadRow("empty ROW_ID")
        location = f"{location} (ROW_ID {row_id})"
        values = {c: _as_str(row.get(c), c) for c in NOTEEVENTS_COLUMNS}
        if cfg.skip_errors and (values.get("ISERROR") or "").strip() in ("1", "1.0"):
            raise BadRow("ISERROR=1: note marked as erroneous by MIMIC")
        if cfg.categories is not None and (values.get("CATEGORY") or "").strip() not in cfg.categories:
            raise BadRow("CATEGORY not among the selected categories")
        text = values["TEXT"]
        if text is None:
            raise BadRow("TEXT is null")
    except BadRow as exc:
        return reject(cfg, source, location, str(exc))
    meta = {c: values[c] for c in NOTEEVENTS_COLUMNS if c != "TEXT" and values[c] not in (None, "")}
    meta["corpus"] = "mimic"
    doc = Document(doc_id=str(row_id), text=text, metadata=meta, entities=placeholder_entities(text))
    return finish(doc, cfg, source, location)


def read_mimic(cfg: MimicCorpusConfig) -> Iterator[Record]:
    """Stream NOTEEVENTS rows as documents or quarantine records.

    Raises:
        CorpusError: a file is missing, unreadable, or lacks required columns.
    """

    def records() -> Iterator[Record]:
        for shard, first, rows in iter_noteevent_batches(cfg.path):
            for i, row in enumerate(rows):
                yield parse_noteevent(row, cfg, str(shard), f"row {first + i}")

    yield from limited(records(), cfg.limit)
