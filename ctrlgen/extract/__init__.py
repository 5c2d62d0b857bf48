"""Entity extraction: the *known* setting (entities from the readers) and the *unknown*
setting (Presidio), behind one callable interface that Ray actors load once.

Columns read: ``doc_id``, ``text``, ``metadata``, ``entities`` (known setting).
Columns written: the same, ``entities`` replaced in the unknown setting, plus
``control_code`` (the formatted control code of the private entities).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ctrlgen.config import ExtractionConfig
from ctrlgen.schema import Document

__all__ = ["Extractor", "KnownExtractor", "make_extractor"]


class Extractor(Protocol):
    def __call__(self, docs: Sequence[Document]) -> list[Document]: ...


class KnownExtractor:
    """The known setting: the reader already attached gold / placeholder / metadata entities."""

    def __call__(self, docs: Sequence[Document]) -> list[Document]:
        return list(docs)


def make_extractor(cfg: ExtractionConfig, spacy_model: str, identifiers: str) -> Extractor:
    """The extractor of ``cfg.setting``; ``identifiers`` is the corpus' private-kind choice."""
    if cfg.setting == "known":
        return KnownExtractor()
    from ctrlgen.extract.presidio import PresidioExtractor

    return PresidioExtractor(cfg, spacy_model, identifiers)
