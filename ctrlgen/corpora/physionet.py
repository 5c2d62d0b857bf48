"""PhysioNet deid gold standard: ``id.text`` notes + ``id-phi.phrase`` gold PHI spans.

``id.text`` holds records: a header line ``<START marker>=<patient>||||<note>||||``, the
text, then ``||||`` and the END marker (see :data:`START`, :data:`END`). ``id-phi.phrase`` holds one span per line:
``<patient> <note> <start> <end> <type> <text>``, offsets into the note text
(which starts after the header line's newline), end exclusive.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora._common import BadRow, Record, decode_utf8, finish, limited, reject, require_file
from ctrlgen.errors import CorpusError
from ctrlgen.schema import Document, Entity

__all__ = ["END", "PHYSIONET_TYPES", "SEP", "START", "format_record", "read_physionet"]

#: PhysioNet PHI type -> (category, identifier kind). Names and phone numbers
#: single a person out (DIRECT, as TAB treats names and codes); dates, places,
#: ages and the rest are QUASI identifiers.
PHYSIONET_TYPES: dict[str, tuple[str, str]] = {
    "PTName": ("PERSON", "DIRECT"),
    "PTNameInitial": ("PERSON", "DIRECT"),
    "HCPName": ("PERSON", "DIRECT"),
    "RelativeProxyName": ("PERSON", "DIRECT"),
    "Phone": ("CODE", "DIRECT"),
    "Date": ("DATETIME", "QUASI"),
    "DateYear": ("DATETIME", "QUASI"),
    "Location": ("LOC", "QUASI"),
    "Age": ("DEM", "QUASI"),
    "Other": ("MISC", "QUASI"),
}

#: Record markers of ``id.text``.
START, END, SEP = b"START_OF_RECORD", b"END_OF_RECORD", b"||||"
_RECORD = re.compile(
    re.escape(START)
    + rb"=([^|\n]*)"
    + re.escape(SEP)
    + rb"([^|\n]*)"
    + re.escape(SEP)
    + rb"\n(.*?)"
    + re.escape(SEP)
    + re.escape(END),
    re.S,
)


def format_record(patient: str, note: str, text: bytes) -> bytes:
    """One ``id.text`` record (the inverse of the reader's record pattern; used by tests)."""
    return START + b"=" + patient.encode() + SEP + note.encode() + SEP + b"\n" + text + SEP + END + b"\n"


def _read_spans(path: Path, cfg: PhysionetCorpusConfig) -> tuple[dict[tuple[str, str], list[Entity]], list[Record]]:
    spans: dict[tuple[str, str], list[Entity]] = defaultdict(list)
    bad: list[Record] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"line {lineno}"
            try:
                line = decode_utf8(raw, "span line").rstrip("\r\n")
                if not line.strip():
                    continue
                parts = line.split(" ", 5)
                if len(parts) != 6:
                    raise BadRow("span line does not have 6 space-separated fields")
                patient, note, start, end, phi_type, text = parts
                if not (start.isdigit() and end.isdigit()):
                    raise BadRow("span start/end are not non-negative integers")
                if phi_type not in PHYSIONET_TYPES:
                    raise BadRow("unknown PHI type (the 5th field is not one of the deid tool's types)")
            except BadRow as exc:
                bad.append(reject(cfg, str(path), where, str(exc)))
                continue
            category, kind = PHYSIONET_TYPES[phi_type]
            spans[(patient, note)].append(Entity(int(start), int(end), text, category, kind, "gold", phi_type))
    return spans, bad


def read_physionet(cfg: PhysionetCorpusConfig) -> Iterator[Record]:
    """Yield one :class:`Document` per note (id ``<patient>-<note>``) or a quarantine record.

    Raises:
        CorpusError: a file is missing or holds no records.
    """
    root = Path(cfg.path)
    if not root.is_dir():
        raise CorpusError(f"PhysioNet deid directory {root} does not exist")
    text_path = require_file(root / cfg.text_file, "PhysioNet notes file")
    phi_path = require_file(root / cfg.phi_file, "PhysioNet gold span file")
    spans, bad_spans = _read_spans(phi_path, cfg)
    yield from bad_spans
    yield from limited(_notes(text_path, spans, cfg), cfg.limit)


def _notes(text_path: Path, spans: dict[tuple[str, str], list[Entity]], cfg: PhysionetCorpusConfig) -> Iterator[Record]:
    raw = text_path.read_bytes()
    n_records = 0
    seen: set[tuple[str, str]] = set()
    for n_records, m in enumerate(_RECORD.finditer(raw), start=1):
        where = f"record {n_records}"
        try:
            patient = decode_utf8(m.group(1), "record header")
            note = decode_utf8(m.group(2), "record header")
            key = (patient, note)
            doc_id = f"{patient}-{note}"
            if key in seen:
                raise BadRow(f"duplicate record {doc_id}")
            seen.add(key)
            text = decode_utf8(m.group(3), f"note {doc_id}")
        except BadRow as exc:
            yield reject(cfg, str(text_path), where, str(exc))
            continue
        doc = Document(
            doc_id=doc_id,
            text=text,
            metadata={"corpus": "physionet-deid", "patient": patient, "note": note},
            entities=spans.get(key, []),
        )
        yield finish(doc, cfg, str(text_path), f"{where} (note {doc_id})")
    if n_records == 0:
        raise CorpusError(f"{text_path} holds no START_OF_RECORD ... END_OF_RECORD records")
    orphans = sorted(set(spans) - seen)
    for patient, note in orphans:
        yield reject(
            cfg,
            str(cfg.path),
            f"note {patient}-{note}",
            f"{len(spans[(patient, note)])} gold span(s) refer to a note that is not in the notes file",
        )
