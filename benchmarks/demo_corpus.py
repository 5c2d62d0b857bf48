"""Benchmark: the demo corpus generator and the MIMIC reader stream (memory does not grow with size).

Runs, each in a fresh subprocess so peak RSS is its own: generate N notes to Parquet
shards, then ingest them (read + placeholder entities + write document shards), for
two corpus sizes 10x apart. Reports notes/s and peak RSS, and the ratio of peak RSS
between the sizes (streaming: close to 1). Writes the table into docs/benchmarks.md.

    .venv/bin/python benchmarks/demo_corpus.py            # 20k vs 200k notes
    .venv/bin/python benchmarks/demo_corpus.py --small 2000 --large 20000
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import write_section  # noqa: E402

_CHILD = r"""
import json, resource, sys, time
from ctrlgen.config import DemoCorpusConfig, MimicCorpusConfig
from ctrlgen.corpora import read_corpus
from ctrlgen.demo import write_demo_corpus
from ctrlgen.io import write_records
step, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.perf_counter()
if step == "generate":
    write_demo_corpus(DemoCorpusConfig(n_notes=n, output_dir=out + "/notes", shard_size=20000), progress=False)
    rows = n
else:
    rows = write_records(read_corpus(MimicCorpusConfig(path=out + "/notes", identifiers="direct+quasi")),
                         out + "/docs", shard_size=20000).rows_in
dt = time.perf_counter() - t0
print(json.dumps({"rows": rows, "seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(step: str, n: int, out: str) -> dict[str, float]:
    res = subprocess.run([sys.executable, "-c", _CHILD, step, str(n), out], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=20_000)
    ap.add_argument("--large", type=int, default=200_000)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    results: dict[tuple[str, int], dict[str, float]] = {}
    for n in (args.small, args.large):
        with tempfile.TemporaryDirectory() as tmp:
            for step in ("generate", "ingest"):
                r = _run(step, n, tmp)
                results[(step, n)] = r
                print(
                    f"{step:8s} {n:>9,} notes: {r['rows'] / r['seconds']:>8,.0f} notes/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    lines = [
        f"Command: `.venv/bin/python benchmarks/demo_corpus.py --small {args.small} --large {args.large}` "
        f"({platform.processor() or platform.machine()}, one process per step, one core).",
        "",
        "| step | notes | notes/s | peak RSS (MB) |",
        "|---|---|---|---|",
    ]
    for (step, n), r in results.items():
        lines.append(f"| {step} | {n:,} | {r['rows'] / r['seconds']:,.0f} | {r['peak_rss_mb']:.0f} |")
    lines.append("")
    for step in ("generate", "ingest"):
        ratio = results[(step, args.large)]["peak_rss_mb"] / results[(step, args.small)]["peak_rss_mb"]
        lines.append(
            f"- {step}: peak RSS at {args.large:,} / at {args.small:,} notes = **{ratio:.2f}** "
            f"({args.large // args.small}x the notes; streaming means close to 1)."
        )
        print(f"{step}: peak RSS ratio {ratio:.2f}")
    if not args.no_write:
        write_section("Demo corpus generation and ingest (streaming)", "\n".join(lines))


if __name__ == "__main__":
    main()
