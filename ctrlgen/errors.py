"""Exceptions with messages meant for the person running ctrlgen.

Messages name files, rows, columns and offsets, never private text.
"""

from __future__ import annotations

__all__ = ["AssetError", "ConfigError", "CorpusError", "CtrlgenError", "ModelError"]


class CtrlgenError(Exception):
    """Base class: the CLI prints these without a traceback and exits with 2."""


class ConfigError(CtrlgenError):
    """A config file or override is invalid."""


class CorpusError(CtrlgenError):
    """A corpus file cannot be read at all (missing, wrong format, wrong schema)."""


class ModelError(CtrlgenError):
    """A model cannot be resolved or loaded offline."""


class AssetError(CtrlgenError):
    """An offline NLP asset (spaCy pipeline, sentence encoder) is missing."""
