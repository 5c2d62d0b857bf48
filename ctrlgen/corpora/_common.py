"""Pieces every reader shares: row validation, quarantine, UTF-8 checks, counting."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from ctrlgen.config import CorpusCommon
from ctrlgen.errors import CorpusError
from ctrlgen.schema import CATEGORIES, IDENTIFIER_KINDS, Document, Entity, Quarantined, identifier_kinds

Record = Document | Quarantined


class BadRow(Exception):
    """Raised inside a reader for one row; becomes a :class:`Quarantined` record."""


def require_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CorpusError(f"{what} {p} does not exist")
    if not p.is_file():
        raise CorpusError(f"{what} {p} is not a file")
    return p


#: What an Arrow CSV error says about a row's shape; the rest of its message quotes the row itself.
_ARROW_SHAPE = re.compile(r"(?:Row #\d+: )?Expected \d+ columns?, got \d+")


def csv_error_summary(exc: BaseException) -> str:
    """An error reading a CSV as it may be shown: its type and what it says about the file, never its content.

    Arrow's CSV parse errors end with the offending row (``Expected 3 columns, got 2: <the row's text>``),
    which in a clinical corpus is note text: only the error's type and a recognised statement of the row's
    shape are kept. I/O errors (``OSError``: a missing file, a broken gzip stream) keep their message, which
    names a path or a condition.
    """
    if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowInvalid):
        return f"{type(exc).__name__}: {exc}"
    m = _ARROW_SHAPE.search(str(exc))
    return f"{type(exc).__name__}: {m.group(0)}" if m else f"{type(exc).__name__} (its message is not shown: it may quote the file's content)"


def _csv_stream(path: str | Path) -> pa.NativeFile:
    from ctrlgen import storage

    if storage.is_uri(str(path)):
        fs, inner = storage.filesystem(str(path))
        return fs.open_input_stream(inner, compression="detect")
    return pa.input_stream(str(path), compression="detect")


def csv_header(path: str | Path) -> list[str]:
    """The column names of a CSV (optionally compressed), from its first line only.

    Raises:
        CorpusError: the file cannot be opened or its header is not UTF-8.
    """
    try:
        with _csv_stream(path) as fh:
            header = fh.read(1 << 16).split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        raise CorpusError(f"{path}: the CSV header is not valid UTF-8") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"{path} is not a readable CSV file ({csv_error_summary(exc)})") from None
    return [c.strip().strip('"') for c in header.split(",")]


def open_csv_as_bytes(path: str | Path, block_size: int = 16 << 20) -> tuple[list[str], pacsv.CSVStreamingReader]:
    """Stream a CSV (optionally compressed) with every column as bytes.

    Bytes, so that a row with non-UTF-8 bytes can be quarantined on its own
    instead of failing its whole block; values are decoded per row. Opening reads
    the first block, so a malformed row in it fails here.

    Raises:
        CorpusError: the file cannot be opened, its header is not UTF-8, or its
            first block is not well-formed (named by row shape, never row text).
    """
    names = csv_header(path)
    try:
        reader = pacsv.open_csv(
            _csv_stream(path),
            read_options=pacsv.ReadOptions(block_size=block_size),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in names}),
        )
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"{path} is not a readable CSV file ({csv_error_summary(exc)})") from None
    return names, reader


def decode_utf8(raw: bytes, what: str) -> str:
    """Decode bytes as UTF-8 or raise :class:`BadRow` naming the byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRow(f"{what} is not valid UTF-8 (byte {exc.start})") from None


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def check_no_surrogates(text: str, what: str) -> None:
    """Text read with ``errors='surrogateescape'`` carries undecodable bytes as surrogates."""
    if text.isascii():
        return
    m = _ESCAPED_BYTE.search(text)
    if m is not None:
        raise BadRow(f"{what} is not valid UTF-8 (character {m.start()})")


def sort_entities(entities: Iterable[Entity]) -> list[Entity]:
    return sorted(entities, key=lambda e: (e.start, e.end, e.category))


def validate_document(doc: Document, max_chars: int) -> str | None:
    """Return the reason the document must be quarantined, or None if it is sound.

    Checks: non-empty text, length limit, every span inside the text with
    ``start < end``, span text equal to the document text at the span, known
    category and identifier kind. Reasons give offsets, never text.
    """
    n = len(doc.text)
    if not doc.text.strip():
        return "empty document"
    if n > max_chars:
        return f"document has {n} characters, over max_chars={max_chars}"
    for i, e in enumerate(doc.entities):
        if not (0 <= e.start < e.end <= n):
            return f"entity {i} span [{e.start}, {e.end}) is outside the text (length {n})"
        if doc.text[e.start : e.end] != e.text:
            return f"entity {i} span [{e.start}, {e.end}) does not match its stated text"
        if e.category not in CATEGORIES:
            return f"entity {i} has an unknown category (not one of {', '.join(CATEGORIES)})"
        if e.kind not in IDENTIFIER_KINDS:
            return f"entity {i} has an unknown identifier kind (not one of {', '.join(IDENTIFIER_KINDS)})"
    return None


def finish(doc: Document, cfg: CorpusCommon, source: str, location: str) -> Record:
    """Filter to the configured identifier kinds, sort, validate; quarantine or raise."""
    keep = identifier_kinds(cfg.identifiers)
    doc.entities = sort_entities(e for e in doc.entities if e.kind in keep)
    reason = validate_document(doc, cfg.max_chars)
    if reason is None:
        return doc
    return reject(cfg, source, location, reason, doc.doc_id)


def reject(cfg: CorpusCommon, source: str, location: str, reason: str, doc_id: str | None = None) -> Quarantined:
    """Quarantine a row, or raise if the config says bad rows are errors."""
    if cfg.errors == "raise":
        raise CorpusError(f"{source}, {location}: {reason}")
    return Quarantined(source=source, location=location, reason=reason, doc_id=doc_id)


def limited(records: Iterator[Record], limit: int | None) -> Iterator[Record]:
    """Stop after ``limit`` documents (quarantined rows seen on the way still count)."""
    if limit is None:
        yield from records
        return
    n = 0
    for r in records:
        yield r
        if isinstance(r, Document):
            n += 1
            if n >= limit:
                return


@dataclass
class ReadReport:
    """Counts of one read: rows in = documents out + quarantined."""

    documents: int = 0
    quarantined: int = 0
    entities_by_category: Counter[str] = field(default_factory=Counter)
    entities_by_kind: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def rows_in(self) -> int:
        return self.documents + self.quarantined

    @property
    def entities(self) -> int:
        return sum(self.entities_by_category.values())

    def add(self, record: Record) -> None:
        if isinstance(record, Document):
            self.documents += 1
            for e in record.entities:
                self.entities_by_category[e.category] += 1
                self.entities_by_kind[e.kind] += 1
        else:
            self.quarantined += 1
            # Group reasons by their shape (digits removed) so the summary stays short.
            self.reasons["".join("N" if c.isdigit() else c for c in record.reason)] += 1

    def summary(self) -> str:
        cats = ", ".join(f"{c} {self.entities_by_category[c]}" for c in CATEGORIES if self.entities_by_category[c])
        lines = [
            f"rows in {self.rows_in} = documents out {self.documents} + quarantined {self.quarantined}",
            f"entities {self.entities}" + (f" ({cats})" if cats else ""),
        ]
        for reason, count in self.reasons.most_common(10):
            lines.append(f"  quarantined {count}: {reason}")
        return "\n".join(lines)
