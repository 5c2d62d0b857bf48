"""Benchmark: what the Serve Scorer's reference index retains per note (issue 39: <= 3 KB a note).

A ``ScorerShard`` holds its documents as a :class:`~ctrlgen.metrics.rouge.RougeIndex` built with
``keep_texts=False``: int32 token ids, 6-byte postings, each distinct token's string once. This measures, on
the demo corpus (MIMIC-format notes, what the scale rehearsal uses) and on the PhysioNet notes (longer), the
memory the index retains after it is built (``tracemalloc``: NumPy's arrays and Python's objects alike) and
the bytes of its arrays alone (``RougeIndex.nbytes``), per note and per token; the build time per note.

    .venv/bin/python benchmarks/scorer_index.py        # ~1 min; docs/benchmarks/scorer_index.json + docs/benchmarks.md
"""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/scorer_index.py"


def measure(name: str, texts: list[str]) -> dict:
    from ctrlgen.metrics.rouge import RougeIndex, tokenize

    tokens = sum(len(tokenize(t)) for t in texts)
    tracemalloc.start()
    t0 = time.perf_counter()
    idx = RougeIndex(texts, keep_texts=False)
    secs = time.perf_counter() - t0
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(texts)
    row = {"corpus": name, "notes": n, "tokens_per_note": tokens / n, "vocab": len(idx._vocab),
           "retained_per_note": retained / n, "retained_per_token": retained / tokens,
           "arrays_per_note": idx.nbytes / n, "peak_per_note": peak / n, "build_ms_per_note": secs / n * 1e3}  # fmt: skip
    print(f"[scorer_index] {name}: {n:,} notes, {retained / n / 1e3:.2f} KB a note retained", flush=True)
    return row


def main() -> None:
    from engine import _commit

    from ctrlgen.config import PhysionetCorpusConfig
    from ctrlgen.corpora import load_corpus
    from ctrlgen.demo import generate_batch

    batch = generate_batch(0, 0, 20_000)
    rows = [measure("demo corpus (MIMIC format)", list(batch["TEXT"]))]
    physionet = os.environ.get("CTRLGEN_PHYSIONET") or str(ROOT / "../shared/data/physionet-deid")
    if Path(physionet).is_dir():
        docs, _, _ = load_corpus(PhysionetCorpusConfig(path=physionet))
        rows.append(measure("PhysioNet deid notes", [d.text for d in docs]))
    result = {"command": COMMAND, "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "rows": rows}
    out = ROOT / "docs" / "benchmarks" / "scorer_index.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"Command: `{COMMAND}` at {result['commit']}. One `RougeIndex(texts, keep_texts=False)` (what a "
        "`ScorerShard` holds) over each corpus; retained = memory still allocated after the build "
        "(`tracemalloc`, arrays and Python objects), arrays = `RougeIndex.nbytes`. Target (issue 39): <= 3 KB a "
        "reference note.",
        "",
        "| corpus | notes | tokens a note | distinct tokens | retained a note | retained a token | arrays a note | "
        "peak during the build a note | build ms a note | <= 3 KB a note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['corpus']} | {r['notes']:,} | {r['tokens_per_note']:.0f} | {r['vocab']:,} | "
            f"{r['retained_per_note'] / 1e3:.2f} KB | {r['retained_per_token']:.1f} B | {r['arrays_per_note'] / 1e3:.2f} KB "
            f"| {r['peak_per_note'] / 1e3:.2f} KB | {r['build_ms_per_note']:.2f} | "
            f"{'met' if r['retained_per_note'] <= 3000 else '**not met**'} |"
        )
    lines += ["", "The index grows with a note's length (bytes a token), so notes longer than these retain more."]
    write_section("Serve Scorer: reference index memory", "\n".join(lines))
    print(f"[scorer_index] wrote {out} and docs/benchmarks.md", flush=True)


if __name__ == "__main__":
    main()
