"""Shared fixtures. Unit tests need no Ray and no network; the real corpora are read
from ../shared/data in place (never copied into the repository)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = (ROOT / ".." / "shared" / "data").resolve()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        # A clone on its own: the tests of the real corpora skip, each naming what to put where (pytest -ra).
        pytest.skip(f"needs the shared corpora at {SHARED}: physionet-deid/, tab/ and aci-bench/ beside the repository")
    return SHARED


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never write into the user's cache, except the converted SmolLM2, which
    # is shared (read-only after the first conversion) to keep the suite fast.
    if "CTRLGEN_TEST_CACHE" not in os.environ:
        monkeypatch.setenv("CTRLGEN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
