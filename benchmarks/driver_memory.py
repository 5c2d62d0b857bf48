"""Benchmark: nothing corpus-sized on the driver. One run, 20k vs 200k notes, ratios.

For each corpus size N (the embedded demo corpus, known setting, tiny random Llama) every
phase runs as its own driver process with a private Ray cluster, and reports that driver's
peak RSS (``ru_maxrss``) and wall time:

1. ``generate``: the generation job with scoring over the whole extraction output: the
   corpus' private values collected for the fictional codes (merged by a task, never on the
   driver), the seeded context pool and the exact seeded top-k of 1,000 targets (hashes only
   on the driver), the actor pool (tiny model, 4 new tokens, ICL with blocking), the writer,
   the distributed leakage scoring. The number of generated notes is the same at both sizes
   (generating 200k notes with a model on 2 cores is hours): what grows is what the driver
   could have been made to hold.
2. ``score``: leakage scoring of a generation output with one row per note (N rows: the
   extraction output turned into generated rows by a Ray Data job), i.e. scoring at scale:
   per-row terms in actors, sums and counts by Ray Data groupby.
3. ``train-data``: the training job's data path over all N notes (seeded selection,
   tokenisation actor, Parquet examples in small row groups, the per-rank layout), then 2
   training steps on one worker.

Targets (issue 16): driver peak RSS 200k / 20k <= 1.2; time about linear in N where the work
is. Then the training ingest: the same 2,048 examples, one epoch, 1 vs 2 Ray Train workers:
rows and bytes each worker read (target: a worker reads its share only, so the total stays
constant and each of 2 workers reads about half).

    .venv/bin/python benchmarks/driver_memory.py                 # ~20 min on 2 cores
    .venv/bin/python benchmarks/driver_memory.py --sizes 2000 20000 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

COMMAND = ".venv/bin/python benchmarks/driver_memory.py"
_MARK = "DRIVER-MEMORY-RESULT "


def _cfg(n: int, work: Path, extra: list[str]) -> Any:
    from ctrlgen.config import load_config

    return load_config(
        str(ROOT / "configs" / "demo.yaml"),
        [
            f"demo_corpus.n_notes={n}", "demo_corpus.shard_size=20000", f"demo_corpus.output_dir={work / f'notes-{n}'}",
            f"output_dir={work / f'run-{n}'}", "model.name=tiny-llama", "ray.num_cpus=4",
            "extraction.rows_per_block=10000", "extraction.num_actors=2",
            "generation.modes=[icl_blocking]", "generation.num_documents=1000", "generation.sampling.max_new_tokens=4",
            "generation.max_context_tokens=32", "generation.batch_size=64", "generation.num_actors=2",
            "generation.actor_num_cpus=1", f"generation.input={work / f'run-{n}' / 'extracted'}",
            f"training.input={work / f'run-{n}' / 'extracted'}", "training.num_documents=null", "training.max_steps=2",
            "training.num_workers=1", "training.batch_size=8", "training.max_doc_tokens=64",
            "training.cpus_per_worker=1", "training.torch_threads=1", "training.resume=false",
            *extra,
        ],
    )  # fmt: skip


def _to_generated(batch: Any) -> Any:
    """map_batches: extraction rows -> generated rows of mode icl (the note's own text, its values
    as the context values: every row leaks, so the terms are not all zero)."""
    import pyarrow as pa

    from ctrlgen.codes import parse_control_code
    from ctrlgen.fictional import code_values
    from ctrlgen.generation.icl import GENERATED_SCHEMA

    rows = []
    for r in batch.to_pylist():
        vals = sorted(code_values(parse_control_code(r["control_code"] or "")))
        rows.append({
            "doc_id": r["doc_id"], "mode": "icl", "context_ids": [], "fictional_code": "", "text": r["text"],
            "context_values": vals, "leaked_first": vals[:1], "leaked": [], "attempts": 1, "released": True,
            "new_tokens": 4, "finish": "length", "status": "ok", "reason": "",
        })  # fmt: skip
    return pa.Table.from_pylist(rows, schema=GENERATED_SCHEMA)


def phase(name: str, n: int, work: Path, extra: list[str]) -> dict[str, Any]:
    """One phase in this process (the driver being measured)."""
    import logging

    logging.getLogger("ray").setLevel(logging.WARNING)
    cfg = _cfg(n, work, extra)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if name == "prepare":
        from ray_jobs import extract

        out["text"] = extract.run(cfg).text().splitlines()[0]
    elif name == "generate":
        from ray_jobs import generate

        s = generate.run(cfg)
        out["rows"] = s.rows_out
    elif name == "score":
        import ray

        from ctrlgen import storage
        from ray_jobs import generate
        from ray_jobs.generate import GeneratedSink
        from ray_jobs.runtime import init_ray

        init_ray(cfg)
        gen = str(work / f"run-{n}" / "scored")
        storage.remove(gen)
        src = str(work / f"run-{n}" / "extracted" / "status=ok")
        ray.data.read_parquet(src).select_columns(["doc_id", "text", "control_code"]).map_batches(
            _to_generated, batch_format="pyarrow"
        ).write_datasink(GeneratedSink(gen))
        t0 = time.perf_counter()  # the scoring itself
        s = generate.score_output(cfg.model_copy(update={"generation": cfg.generation.model_copy(
            update={"modes": ["icl"]})}), gen)  # fmt: skip
        out["rows"] = s.rows_out
        out["pipp"] = s.by_mode[0].pipp_first
    elif name == "train":
        from ray_jobs import train

        s = train.run(cfg)
        out["examples"] = s.examples
        out["ingest"] = s.ingest
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _child(name: str, n: int, work: Path, extra: list[str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", name, "--n", str(n), "--work", str(work)]
    for e in extra or []:
        cmd += ["--set", e]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "disabled"}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"phase {name} at {n} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    got: dict[str, Any] = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith(_MARK)][-1][len(_MARK) :])
    print(f"  {name:>10} n={n:>7,}: {got['seconds']:7.1f} s, driver peak RSS {got['peak_rss_mb']:6.0f} MB "
          f"(process {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[20_000, 200_000])
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(_MARK + json.dumps(phase(args.phase, args.n, Path(args.work), args.set)), flush=True)
        return
    small, large = args.sizes
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ctrlgen-drivermem-") as tmp:
        work = Path(tmp)
        for n in (small, large):
            print(f"corpus of {n:,} notes", flush=True)
            _child("prepare", n, work)
            for name in ("generate", "score", "train"):
                results[(name, n)] = _child(name, n, work)
        ingest = {}
        for workers in (1, 2):
            ingest[workers] = _child("train", small, work, [
                "training.num_documents=2048", "training.max_steps=null", "training.epochs=1",
                f"training.num_workers={workers}", "training.cpus_per_worker=0.5",
                f"training.run_name=ingest-{workers}"])["ingest"]  # fmt: skip
    body = _report(results, ingest, small, large)
    print(body)
    if not args.no_write:
        from _report import write_section

        write_section("Driver memory and training ingest vs corpus size", body)


def _report(results: dict[tuple[str, int], dict[str, Any]], ingest: dict[int, Any], small: int, large: int) -> str:
    labels = {
        "generate": "generate + score (1,000 generated notes, exclusion set / pool / top-k over the corpus)",
        "score": "leakage scoring of one generated row per note",
        "train": "training data path over every note + 2 steps (1 worker)",
    }
    lines = [
        f"Command: `{COMMAND}`. Demo corpus (known setting), tiny random Llama, a private 4-CPU Ray cluster "
        f"per phase; each phase is its own driver process. Ratios are {large:,} notes / {small:,} notes "
        f"({large // small}x the notes).",
        "",
        f"| phase | driver peak RSS at {small:,} | at {large:,} | RSS ratio (target <= 1.2) | "
        f"time at {small:,} | at {large:,} | time ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in labels.items():
        a, b = results[(name, small)], results[(name, large)]
        rss, tim = b["peak_rss_mb"] / a["peak_rss_mb"], b["seconds"] / a["seconds"]
        lines.append(
            f"| {label} | {a['peak_rss_mb']:.0f} MB | {b['peak_rss_mb']:.0f} MB | {rss:.2f}"
            f"{' (met)' if rss <= 1.2 else ' (NOT met)'} | {a['seconds']:.1f} s | {b['seconds']:.1f} s | {tim:.2f} |"
        )
    lines += [
        "",
        f"Scored rows: {results[('score', small)]['rows']:,} and {results[('score', large)]['rows']:,}; "
        f"training examples: {results[('train', small)]['examples']:,} and {results[('train', large)]['examples']:,}.",
        "",
        "Training ingest, 2,048 examples of the small corpus, one epoch, batch 8 "
        "(each worker reads only the Parquet row groups overlapping its share):",
        "",
        "| workers | rows read per worker | bytes read per worker | total bytes |",
        "|---|---|---|---|",
    ]
    for w, per in ingest.items():
        rows = ", ".join(f"{r['rows']:,}" for r in per)
        nbytes = ", ".join(f"{r['bytes']:,}" for r in per)
        lines.append(f"| {w} | {rows} | {nbytes} | {sum(r['bytes'] for r in per):,} |")
    one, two = sum(r["bytes"] for r in ingest[1]), sum(r["bytes"] for r in ingest[2])
    lines += ["", f"Total bytes read, 2 workers / 1 worker: {two / one:.2f} (1.00 = no worker reads another's share)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
