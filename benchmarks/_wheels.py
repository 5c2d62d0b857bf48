"""The locked dependency closure of some packages, as ``name==version`` lines (for carrying wheels to a lent machine).

    .venv/bin/python benchmarks/_wheels.py spacy numpy ...

Walks the installed distributions' requirements (no extras; markers evaluated for CPython 3.12 on Linux, the lent
machines' Python) and checks every version against requirements.lock, so the wheels downloaded for another Python
are the versions `make setup` installs here.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
#: the lent machines' interpreter (docs/benchmarks/gpu_run_*/env.json)
TARGET = {"extra": "", "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix"}  # fmt: skip


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def closure(roots: list[str]) -> dict[str, str]:
    """Every distribution ``roots`` need (themselves included), with its installed version."""
    seen: dict[str, str] = {}
    todo = [_norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(TARGET):
                todo.append(_norm(req.name))
    return dict(sorted(seen.items()))


def main() -> None:
    pins = locked()
    found = closure(sys.argv[1:])
    off = {n: (v, pins.get(n)) for n, v in found.items() if pins.get(n) not in (None, v)}
    if off:
        raise SystemExit(f"installed versions differ from requirements.lock: {off}")
    print("\n".join(f"{n}=={v}" for n, v in found.items()))


if __name__ == "__main__":
    main()
