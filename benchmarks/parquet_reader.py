"""Ray Data's two Parquet readers on the jobs' small reads, compared in one run (ratios).

Ray 2.60 routes ``ray.data.read_parquet`` through its V2 datasource by default, which reads the files'
footers on a fresh pool of ``FooterReader`` actors (new worker processes) for every read; the V1 reader
plans the read in the driver. The experiment matrix and the jobs make many small reads (a split, a
fine-tuning set, a generation output), so the fixed cost per read is what counts. The script times
``read_parquet(...).select_columns(...).take_all()`` of one small file and of a hive-partitioned table,
alternating V2 and V1 rounds on one local cluster, and writes the medians and their ratio to
``docs/benchmarks/parquet_reader.json`` (section "Parquet reader" of docs/benchmarks.md).

    .venv/bin/python benchmarks/parquet_reader.py [--rounds 3] [--reads 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _report import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reads", type=int, default=5, help="reads per round and reader")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "parquet_reader.json"))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    tmp = Path(tempfile.mkdtemp(prefix="parquet_reader_"))
    one = tmp / "one"
    one.mkdir()
    table = pa.table({"doc_id": [f"d{i}" for i in range(200)], "text": ["x" * 500] * 200})
    pq.write_table(table, one / "part-0.parquet")
    parts = tmp / "parts"
    pq.write_to_dataset(table.append_column("split", pa.array(["train", "test"] * 100)), parts,
                        partition_cols=["split"])  # fmt: skip
    cases = {"one file": (str(one), None), "hive partition (split=train)": (str(parts / "split=train"), None)}
    times: dict[str, dict[str, list[float]]] = {c: {"v2": [], "v1": []} for c in cases}
    ray.data.read_parquet(str(one)).take_all()  # the cluster's first workers, outside the timing
    for _ in range(args.rounds):
        for reader in ("v2", "v1"):
            ctx.use_datasource_v2 = reader == "v2"
            for case, (path, _) in cases.items():
                for _ in range(args.reads):
                    t = time.perf_counter()
                    rows = ray.data.read_parquet(path).select_columns(["doc_id"]).take_all()
                    times[case][reader].append(time.perf_counter() - t)
                    assert len(rows) in (100, 200), len(rows)
    ray.shutdown()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {
        "commit": commit.strip(),
        "command": ".venv/bin/python benchmarks/parquet_reader.py" + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
        + (f" --reads {args.reads}" if args.reads != 5 else ""),
        "machine": f"{os.cpu_count()} CPU cores",
        "ray": ray.__version__,
        "cases": {
            c: {"v2_median_s": statistics.median(t["v2"]), "v1_median_s": statistics.median(t["v1"]),
                "v2_over_v1": statistics.median(t["v2"]) / statistics.median(t["v1"]), "reads": len(t["v1"])}
            for c, t in times.items()
        },
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    rows = [f"| {c} | {r['v2_median_s']:.2f} | {r['v1_median_s']:.2f} | **{r['v2_over_v1']:.1f}x** | {r['reads']} |"
            for c, r in result["cases"].items()]  # fmt: skip
    write_section("Parquet reader: Ray Data V2 vs V1 on small reads", "\n".join([
        f"Command: `{result['command']}` at {result['commit']} (Ray {result['ray']}, a local cluster of 4 logical "
        "CPUs on the 2 cores). One `read_parquet(...).select_columns(...).take_all()` of a 200-row table, V2 and V1 "
        "rounds alternating; medians over the reads. V2 reads the footers on a new pool of `FooterReader` actors "
        "per read; V1 plans the read in the driver. The jobs use V1 (`ray_jobs.runtime.parquet_reader`): the "
        "experiment matrix and the jobs make many small reads, where this fixed cost dominates.",
        "",
        "| read | V2 s/read | V1 s/read | V2 / V1 | reads each |",
        "|---|---|---|---|---|",
        *rows,
    ]))  # fmt: skip
    for c, r in result["cases"].items():
        print(f"{c}: V2 {r['v2_median_s']:.2f} s, V1 {r['v1_median_s']:.2f} s per read: V2/V1 {r['v2_over_v1']:.1f}x")


if __name__ == "__main__":
    main()
