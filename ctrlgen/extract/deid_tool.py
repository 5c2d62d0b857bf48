"""Run PhysioNet's ``deid`` tool (Perl, 2008) on documents: the anchor the unknown setting is measured against.

The tool is not part of the product (GPL-2, ``../shared/tools/physionet-deid/``); the
extraction report runs it beside ctrlgen's engine on the same notes. It reads its lists
relative to its working directory and writes next to its input, so it runs in a
temporary copy. Its ``.phi`` output gives spans only (no types): they are reported as
category ``MISC``, so only its untyped recall and its precision are comparable.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ctrlgen.errors import CtrlgenError
from ctrlgen.schema import Document, Entity

__all__ = ["parse_phi", "run_deid"]

_HEADER = re.compile(r"^Patient\s+(\S+)\s+Note\s+(\S+)\s*$")
_SPAN = re.compile(r"^(\d+)\s+(\d+)\s+(\d+)\s*$")


def parse_phi(text: str) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """``notes.phi`` -> (patient, note) -> [(start, end)] (end exclusive)."""
    out: dict[tuple[str, str], list[tuple[int, int]]] = {}
    key: tuple[str, str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _HEADER.match(line)
        if m:
            key = (m.group(1), m.group(2))
            out.setdefault(key, [])
            continue
        s = _SPAN.match(line)
        if s is None or key is None:
            raise CtrlgenError(f"deid output line {n} is neither a note header nor a span")
        out[key].append((int(s.group(2)), int(s.group(3))))
    return out


def run_deid(docs: Sequence[Document], tool_dir: str | Path, timeout_s: float = 3600) -> tuple[list[Document], float]:
    """The tool's spans for each document (metadata ``patient`` and ``note``) and the seconds it ran."""
    from ctrlgen.corpora.physionet import format_record

    tool = Path(tool_dir)
    if not (tool / "deid.pl").is_file():
        raise CtrlgenError(f"{tool} does not hold PhysioNet's deid.pl")
    if shutil.which("perl") is None:
        raise CtrlgenError("perl is not installed: the deid tool cannot run")
    with tempfile.TemporaryDirectory(prefix="deid-") as tmp:
        work = Path(tmp) / "deid"
        shutil.copytree(tool, work)
        keys = []
        with open(work / "notes.text", "wb") as f:
            for d in docs:
                key = (str(d.metadata.get("patient", "")), str(d.metadata.get("note", "")))
                if not all(key):
                    raise CtrlgenError(f"document {d.doc_id} has no patient / note metadata for the deid tool")
                keys.append(key)
                f.write(format_record(key[0], key[1], d.text.encode("utf-8")))
        t0 = time.perf_counter()
        res = subprocess.run(
            ["perl", "deid.pl", "notes", "deid-unknown.config"],
            cwd=work, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        phi = work / "notes.phi"
        if res.returncode != 0 or not phi.is_file():
            raise CtrlgenError(f"deid.pl failed with exit status {res.returncode} (no notes.phi written)")
        spans = parse_phi(phi.read_text(encoding="utf-8", errors="replace"))
    out = []
    for d, key in zip(docs, keys, strict=True):
        ents = [(s, e) for s, e in sorted(set(spans.get(key, []))) if 0 <= s < e <= len(d.text)]
        found = [Entity(s, e, d.text[s:e], "MISC", "QUASI", "deid", "deid") for s, e in ents]
        out.append(Document(d.doc_id, d.text, d.metadata, found))
    return out, seconds
