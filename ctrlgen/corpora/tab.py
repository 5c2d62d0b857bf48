"""Text Anonymization Benchmark (TAB) JSON: a list of ECHR cases with annotators' mentions.

Each case has ``doc_id``, ``text`` and ``annotations[annotator].entity_mentions``
with ``entity_type`` (already one of the eight categories), ``start_offset`` /
``end_offset`` (end exclusive), ``span_text`` and ``identifier_type``
(DIRECT / QUASI / NO_MASK; NO_MASK mentions are not private and are left out).
Cases are cut into paragraph windows as in the paper (paragraphs 1-6 and 6-12).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctrlgen.config import TabCorpusConfig
from ctrlgen.corpora._common import BadRow, Record, finish, limited, reject, require_file
from ctrlgen.errors import CorpusError
from ctrlgen.schema import CATEGORIES, Document, Entity

__all__ = ["paragraph_spans", "read_tab", "segment_document"]

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the paragraphs of ``text`` (separated by blank lines).

    Example:
        >>> paragraph_spans("A b.\\n\\nC.\\n")
        [(0, 4), (6, 8)]
    """
    spans = []
    pos = 0
    for m in _PARAGRAPH_BREAK.finditer(text):
        if text[pos : m.start()].strip():
            spans.append(_strip_span(text, pos, m.start()))
        pos = m.end()
    if text[pos:].strip():
        spans.append(_strip_span(text, pos, len(text)))
    return spans


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def segment_document(doc: Document, segments: list[tuple[int, int]]) -> Iterator[Document | tuple[str, str]]:
    """Cut ``doc`` into paragraph windows (1-based, inclusive); shift entity offsets.

    Yields documents, or ``(doc_id, reason)`` for a window that an entity crosses.
    Windows past the document's last paragraph are not produced; a window that
    reaches past it is cut short.
    """
    paras = paragraph_spans(doc.text)
    for first, last in segments:
        if first < 1 or last < first:
            raise CorpusError(f"TAB segment ({first}, {last}) must satisfy 1 <= first <= last")
        if first > len(paras):
            continue
        last = min(last, len(paras))
        start, end = paras[first - 1][0], paras[last - 1][1]
        seg_id = f"{doc.doc_id}#p{first}-{last}"
        inside, crossing = [], 0
        for e in doc.entities:
            if start <= e.start and e.end <= end:
                inside.append(Entity(e.start - start, e.end - start, e.text, e.category, e.kind, e.source, e.label))
            elif e.start < end and e.end > start:
                crossing += 1
        if crossing:
            yield seg_id, f"{crossing} entity span(s) cross the boundary of paragraphs {first}-{last}"
            continue
        meta = dict(doc.metadata, segment=f"{first}-{last}", parent_doc_id=doc.doc_id)
        yield Document(seg_id, doc.text[start:end], meta, inside)


def _mentions(case: dict[str, Any], annotator: str | None) -> tuple[str, list[Entity]]:
    annotations = case.get("annotations")
    if not isinstance(annotations, dict) or not annotations:
        raise BadRow("no 'annotations' object")
    name = annotator or next(iter(annotations))
    if name not in annotations:
        raise BadRow(f"annotator {name!r} not in this case (has {sorted(annotations)})")
    mentions = annotations[name].get("entity_mentions")
    if not isinstance(mentions, list):
        raise BadRow(f"annotator {name!r} has no 'entity_mentions' list")
    out = []
    for i, m in enumerate(mentions):
        try:
            kind = m["identifier_type"]
            if kind == "NO_MASK":
                continue
            category = m["entity_type"]
            start, end = int(m["start_offset"]), int(m["end_offset"])
            text = m["span_text"]
        except (KeyError, TypeError, ValueError):
            raise BadRow(
                f"entity mention {i} lacks entity_type/start_offset/end_offset/span_text/identifier_type"
            ) from None
        if category not in CATEGORIES:
            raise BadRow(f"entity mention {i} has an unknown entity_type (not one of {', '.join(CATEGORIES)})")
        out.append(Entity(start, end, text, category, kind, "gold", category))
    return name, out


def _tab_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise CorpusError(f"TAB directory {path} holds no .json files")
        return files
    return [require_file(path, "TAB file")]


def _load_cases(path: Path) -> list[Any]:
    try:
        cases = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"TAB file {path} is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CorpusError(
            f"TAB file {path} is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if isinstance(cases, dict):
        cases = [cases]
    if not isinstance(cases, list):
        raise CorpusError(f"TAB file {path} must hold a list of cases")
    return cases


def read_tab(cfg: TabCorpusConfig) -> Iterator[Record]:
    """Yield TAB documents (one per paragraph window) or quarantine records.

    ``cfg.path`` is a TAB JSON file or a directory of them (e.g. the train/dev/test splits).

    Raises:
        CorpusError: a file is missing, not JSON, or not a list of cases.
    """

    def records() -> Iterator[Record]:
        for f in _tab_files(Path(cfg.path)):
            yield from _cases(_load_cases(f), cfg, str(f))

    yield from limited(records(), cfg.limit)


def _cases(cases: list[Any], cfg: TabCorpusConfig, source: str) -> Iterator[Record]:
    for i, case in enumerate(cases):
        where = f"case {i}"
        try:
            if not isinstance(case, dict):
                raise BadRow("case is not a JSON object")
            doc_id, text = case.get("doc_id"), case.get("text")
            if not isinstance(doc_id, str) or not isinstance(text, str):
                raise BadRow("case lacks a string 'doc_id' or 'text'")
            where = f"case {i} ({doc_id})"
            annotator, entities = _mentions(case, cfg.annotator)
        except BadRow as exc:
            yield reject(cfg, source, where, str(exc), case.get("doc_id") if isinstance(case, dict) else None)
            continue
        meta = {
            "corpus": "tab",
            "annotator": annotator,
            "dataset_type": case.get("dataset_type"),
            # Not "task" nor meta.applicant: they name the person to protect.
            "meta": {k: v for k, v in (case.get("meta") or {}).items() if k != "applicant"},
        }
        whole = finish(Document(doc_id, text, meta, entities), cfg, source, where)
        if not isinstance(whole, Document) or cfg.segments is None:
            yield whole
            continue
        for piece in segment_document(whole, [(int(a), int(b)) for a, b in cfg.segments]):
            if isinstance(piece, Document):
                yield piece
            else:
                yield reject(cfg, source, f"{where} window {piece[0]}", piece[1], piece[0])
