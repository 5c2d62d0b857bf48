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


# Where the user's converted models are (read before any test points CTRLGEN_CACHE elsewhere): the Ray workers of
# the module clusters, started with this environment, convert SmolLM2 there.
_USER_MODELS = Path(os.environ.get("CTRLGEN_CACHE") or Path.home() / ".cache" / "ctrlgen") / "models"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never write into the user's cache, except the converted SmolLM2, which is shared (read-only after the
    # first conversion, made under a file lock) to keep the suite fast: the test cache's models/ is a link to the
    # user's, so the tests' processes and the Ray workers convert it once per machine, not once each.
    if "CTRLGEN_TEST_CACHE" not in os.environ:
        cache = tmp_path_factory.getbasetemp() / "cache"
        monkeypatch.setenv("CTRLGEN_CACHE", str(cache))
        models = cache / "models"
        if not models.is_symlink() and not models.exists():
            cache.mkdir(parents=True, exist_ok=True)
            _USER_MODELS.mkdir(parents=True, exist_ok=True)
            models.symlink_to(_USER_MODELS, target_is_directory=True)
