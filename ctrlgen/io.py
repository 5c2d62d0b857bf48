"""Parquet input/output of documents and quarantined rows, streamed in shards."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from ctrlgen.corpora import ReadReport, Record
from ctrlgen.errors import CorpusError
from ctrlgen.schema import (
    DOCUMENT_SCHEMA,
    QUARANTINE_SCHEMA,
    Document,
    Quarantined,
    documents_to_table,
    quarantine_to_table,
    table_to_documents,
)

__all__ = ["iter_documents", "read_documents", "read_quarantine", "write_records"]


def write_records(
    records: Iterable[Record],
    out_dir: str | Path,
    shard_size: int = 50_000,
    progress: str | None = None,
) -> ReadReport:
    """Write documents to ``documents-NNNNN.parquet`` shards and quarantined rows to
    ``quarantine.parquet`` (always written, possibly empty), streaming; return the counts.

    Args:
        records: documents and quarantine records, e.g. from a corpus reader.
        out_dir: output directory; earlier shards in it are replaced.
        shard_size: documents per shard (also the in-memory buffer size).
        progress: a label to print progress under on stderr every few seconds; None: quiet.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("documents-*.parquet"):
        old.unlink()
    report = ReadReport()
    buf: list[Document] = []
    bad: list[Quarantined] = []
    shard = 0
    t0 = time.perf_counter()
    next_report = 5.0

    def flush() -> None:
        nonlocal shard
        if buf:
            pq.write_table(documents_to_table(buf), out / f"documents-{shard:05d}.parquet", compression="zstd")
            shard += 1
            buf.clear()

    for rec in records:
        report.add(rec)
        if isinstance(rec, Document):
            buf.append(rec)
            if len(buf) >= shard_size:
                flush()
        else:
            bad.append(rec)
        if progress and time.perf_counter() - t0 >= next_report:
            print(
                f"[{progress}] {report.rows_in:,} rows read, {report.quarantined:,} quarantined",
                file=sys.stderr,
                flush=True,
            )
            next_report += 5.0
    flush()
    if shard == 0:  # keep the schema visible even for an empty corpus
        pq.write_table(DOCUMENT_SCHEMA.empty_table(), out / "documents-00000.parquet")
    pq.write_table(quarantine_to_table(bad), out / "quarantine.parquet")
    return report


def _document_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("documents-*.parquet"))
        if not files:
            raise CorpusError(f"{p} holds no documents-*.parquet shards")
        return files
    if not p.is_file():
        raise CorpusError(f"{p} does not exist")
    return [p]


def iter_documents(path: str | Path, batch_size: int = 4096) -> Iterator[Document]:
    """Stream documents back from shards written by :func:`write_records`."""
    for f in _document_files(path):
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=batch_size):
            yield from table_to_documents(batch)


def read_documents(path: str | Path) -> list[Document]:
    return list(iter_documents(path))


def read_quarantine(out_dir: str | Path) -> list[Quarantined]:
    table = pq.read_table(Path(out_dir) / "quarantine.parquet", schema=QUARANTINE_SCHEMA)
    return [Quarantined(**r) for r in table.to_pylist()]
