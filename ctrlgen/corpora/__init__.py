"""Corpus readers: each turns one corpus format into :class:`~ctrlgen.schema.Document` rows.

Every reader is a generator of ``Document | Quarantined`` records, so that bad rows
are counted next to good ones (rows in = documents out + quarantined) and
large corpora stream. Whole-file problems raise :class:`~ctrlgen.errors.CorpusError`.

Example:
    >>> from ctrlgen.config import PhysionetCorpusConfig
    >>> docs, bad, report = load_corpus(PhysionetCorpusConfig(path="../shared/data/physionet-deid"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ctrlgen.corpora._common import ReadReport, Record
from ctrlgen.corpora.aci import read_aci
from ctrlgen.corpora.generic import read_generic
from ctrlgen.corpora.mimic import read_mimic
from ctrlgen.corpora.physionet import read_physionet
from ctrlgen.corpora.tab import read_tab
from ctrlgen.schema import Document, Quarantined

__all__ = ["READERS", "ReadReport", "Record", "load_corpus", "read_corpus"]

READERS: dict[str, Callable[[Any], Iterator[Record]]] = {
    "mimic": read_mimic,
    "physionet": read_physionet,
    "tab": read_tab,
    "aci": read_aci,
    "generic": read_generic,
}


def read_corpus(cfg: Any) -> Iterator[Record]:
    """Stream the records of the corpus a corpus config describes."""
    return READERS[cfg.format](cfg)


def load_corpus(cfg: Any) -> tuple[list[Document], list[Quarantined], ReadReport]:
    """Read a whole (small) corpus into memory: documents, quarantined rows, counts."""
    docs: list[Document] = []
    bad: list[Quarantined] = []
    report = ReadReport()
    for rec in read_corpus(cfg):
        report.add(rec)
        (docs if isinstance(rec, Document) else bad).append(rec)  # type: ignore[arg-type]
    return docs, bad, report
