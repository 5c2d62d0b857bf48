"""Write one benchmark's section into docs/benchmarks.md, replacing its earlier version."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
_HEAD = (
    "# Benchmarks\n\n"
    "Every figure here is written by a script under `benchmarks/` (the command is in each\n"
    "section); comparisons are made within one run, as ratios. Machine: 2 CPU cores, 24 GiB, no GPU.\n"
)


def write_section(title: str, body: str) -> None:
    text = DOC.read_text() if DOC.exists() else _HEAD
    section = f"## {title}\n\n_Run on {date.today().isoformat()}._\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    DOC.write_text(text.rstrip() + "\n")
