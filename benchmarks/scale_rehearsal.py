"""Benchmark: the MIMIC-scale rehearsal on one machine (issue 39 item 1), two corpus sizes, ratios.

The whole system on generated MIMIC-format notes (the embedded demo corpus generator) with a tiny random
Llama and a few new tokens per output, so that the data path, not the model, is what is measured. Each
stage runs as its own driver process with a private Ray cluster; per stage: wall time, the driver's peak
RSS (``ru_maxrss``), the largest Ray worker's peak RSS (every process of the stage's process tree sampled
every 0.5 s), and the stage's output file count and mean file size.

Stages, at each size N:

1. ``extract``: the known-setting extraction job over all N notes (the demo corpus is written first, not
   timed);
2. ``train``: the prefix-training data path over every note (selection, tokenisation, Parquet examples,
   the per-rank layout) + 2 steps on one worker;
3. ``generate``: every mode (baseline, icl, icl_blocking, prefix with the adapter of stage 2) for a seeded
   sample of ``--targets`` targets, with the release gate; the value pool, the banned-value automaton and
   the fine-tuning value index stay corpus-sized;
4. ``evaluate``: ``ctrlgen evaluate`` of that output against the whole extraction output;
5. ``score``: leakage scoring of one generated row per note (N rows);
6. ``experiment``: the experiment's data path: a matrix whose corpus is the N notes and whose cells are
   small (known setting, icl_blocking and prefix_masked, one seed, 8 outputs a cell);
7. ``scorer``: building the Serve Scorer's reference index over the N notes (one shard of 2 in the driver),
   and its size per reference note (RSS growth / notes in the shard).

Targets (issue 39): driver peak RSS at the large / small size <= 1.2 per stage; no worker above 4 GB at the
large size; stage time large / small <= 12 (for 10x the notes); output files <= 2,000 per stage; the
Scorer's index <= 3 KB per reference note.

    .venv/bin/python benchmarks/scale_rehearsal.py --sizes 2000 4000 --no-write   # a quick look (~15 min)
    .venv/bin/python benchmarks/scale_rehearsal.py                                # 200k and 2M notes (hours)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

COMMAND = ".venv/bin/python benchmarks/scale_rehearsal.py"
_MARK = "SCALE-REHEARSAL-RESULT "
STAGES = ["extract", "train", "generate", "evaluate", "score", "experiment", "scorer"]
_OUTPUTS = {"extract": "extracted", "train": "train_data", "generate": "generated", "evaluate": "evaluation",
            "score": "scored", "experiment": "experiment"}  # fmt: skip


def _cfg(n: int, work: Path, targets: int, extra: list[str]) -> Any:
    """benchmarks/driver_memory.py's configuration (demo corpus, tiny Llama, 4 new tokens), with every mode."""
    from driver_memory import _cfg as driver_memory_cfg

    run = work / f"run-{n}"
    return driver_memory_cfg(n, work, [
        "generation.modes=[baseline,icl,icl_blocking,prefix]", f"generation.num_documents={targets}",
        f"generation.adapter={run / 'adapter'}", f"generation.finetune_data={run / 'train_data'}",
        f"evaluation.references={run / 'extracted'}", "evaluation.num_shards=8", *extra,
    ])  # fmt: skip


def _experiment_cfg(cfg: Any, run: Path) -> Any:
    """A matrix over the whole corpus with small cells."""
    over = {
        "output_dir": str(run / "experiment"),
        "experiment": cfg.experiment.model_copy(
            update={
                "settings": ["known"],
                "methods": ["icl_blocking", "prefix_masked"],
                "seeds": [0],
                "num_documents": 8,
                "finetune_documents": 64,
                "canaries": 0,
                "test_documents": 16,
                "semantic_chance_documents": 0,
                "distributed_eval": True,
                "eval_actors": 2,
                "eval_shards": 8,
                "ppl_epochs": 1,
                "ppl_max_tokens": 32,
            }
        ),
        "training": cfg.training.model_copy(update={"input": None, "max_steps": 2, "resume": False}),
    }
    return cfg.model_copy(update=over)


def stage(name: str, n: int, work: Path, targets: int, extra: list[str]) -> dict[str, Any]:
    """One stage in this process (the driver being measured)."""
    import logging

    logging.getLogger("ray").setLevel(logging.WARNING)
    cfg = _cfg(n, work, targets, extra)
    run = work / f"run-{n}"
    out: dict[str, Any] = {}
    if name == "extract":
        from ctrlgen.demo import write_demo_corpus

        write_demo_corpus(cfg.demo_corpus)  # the notes themselves first (not timed)
    t0 = time.perf_counter()
    if name == "extract":
        from ray_jobs import extract

        out["summary"] = extract.run(cfg).text().splitlines()[0]
    elif name == "train":
        from ray_jobs import train

        out["examples"] = train.run(cfg).examples
    elif name == "generate":
        from ray_jobs import generate

        out["rows"] = generate.run(cfg).rows_out
    elif name == "evaluate":
        from ray_jobs import evaluate

        out["summary"] = evaluate.run(cfg).text().splitlines()[0]
    elif name == "score":
        import ray
        from driver_memory import _to_generated

        from ctrlgen import storage
        from ray_jobs import generate
        from ray_jobs.generate import GeneratedSink
        from ray_jobs.runtime import init_ray

        init_ray(cfg)
        gen = str(run / "scored")
        storage.remove(gen)
        ray.data.read_parquet(str(run / "extracted" / "status=ok")).select_columns(
            ["doc_id", "text", "control_code"]
        ).map_batches(_to_generated, batch_format="pyarrow").write_datasink(
            GeneratedSink(gen, cfg.generation.rows_per_file)
        )  # as the generation job writes (files of rows_per_file rows)
        t0 = time.perf_counter()  # the scoring itself
        s = generate.score_output(
            cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"modes": ["icl"]})}), gen
        )
        out["rows"] = s.rows_out
    elif name == "experiment":
        from ray_jobs import experiment

        out["cells"] = experiment.run(_experiment_cfg(cfg, run)).cells
    elif name == "scorer":
        import psutil

        from ctrlgen.metrics.shard import ReferenceShard, iter_references

        _warm_up_scorer()
        before = psutil.Process().memory_info().rss
        index = ReferenceShard(iter_references(str(run / "extracted")), 0, 2)
        grown = psutil.Process().memory_info().rss - before
        saved = run / "scorer-shard-0-of-2.npz"
        index.save(saved)  # what a replica loads (serve.scorer_index_dir): built once, then only loaded
        out["seconds_build_save"] = time.perf_counter() - t0
        out["documents"] = len(index.doc_ids)
        out["build_bytes_per_note"] = grown / max(len(index.doc_ids), 1)
        out["rouge_bytes_per_note"] = index.rouge_nbytes / max(len(index.doc_ids), 1)
        out["values"] = index.n_values  # the shard's private values (sharded by value), in its value index
        out["file_mb"] = saved.stat().st_size / 1e6
        del index
        # What a replica holds: a fresh process loads the saved shard (RSS growth of the load, over its notes).
        load = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--load-shard", str(saved)],
                              capture_output=True, text=True)  # fmt: skip
        if load.returncode:
            raise RuntimeError(f"loading the saved shard failed: {load.stderr[-1000:]}")
        held = json.loads(load.stdout.strip().splitlines()[-1])
        out["bytes_per_note"] = held["grown"] / max(out["documents"], 1)
        out["load_seconds"] = held["seconds"]
        saved.unlink()
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _warm_up_scorer() -> None:
    """Imports and the tokenizer's set-up (~80 MB, once per process), outside what a shard is measured to hold."""
    from ctrlgen.metrics.leakage import ValueIndex
    from ctrlgen.metrics.rouge import tokenize

    tokenize("warm up")
    ValueIndex(["warm up"])


def _load_shard(path: str) -> None:
    """In a fresh process (``--load-shard``): what a Scorer replica holds once it loads a saved shard."""
    import psutil

    from ctrlgen.metrics.shard import ReferenceShard

    _warm_up_scorer()
    before = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    shard = ReferenceShard.load(path)
    grown = psutil.Process().memory_info().rss - before
    print(json.dumps({"grown": grown, "seconds": time.perf_counter() - t0, "documents": len(shard.doc_ids)}))


class _TreeSampler:
    """Peak RSS of the largest process under ``pid`` other than ``pid`` itself (Ray's workers), sampled."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.peak_mb, self.peak_name = pid, every, 0.0, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                kids = psutil.Process(self.pid).children(recursive=True)
            except psutil.Error:
                return
            for p in kids:
                try:
                    rss = p.memory_info().rss / 2**20
                    if rss > self.peak_mb:
                        self.peak_mb, self.peak_name = rss, " ".join(p.cmdline()[:1])[:60]
                except psutil.Error:
                    continue
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _files(path: Path) -> tuple[int, float]:
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return len(files), (sum(p.stat().st_size for p in files) / len(files) if files else 0.0)


def _env(work: Path) -> dict[str, str]:
    """The stages' environment: no outside Ray cluster, and DeepSpeed's C++ ops (its CPU shared-memory
    collective, compiled at a first use) kept under the work directory, built once before any stage is timed:
    another virtual environment sharing ~/.cache/torch_extensions would otherwise have them rebuilt (~40 s of
    compiling, inside the train stage)."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_AUTH_MODE": "disabled", "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions")}  # fmt: skip


def _prebuild(work: Path) -> None:
    code = "from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder; ShareMemCommBuilder().load()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(work), check=True, capture_output=True)


def _child(name: str, n: int, work: Path, targets: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--stage", name, "--n", str(n), "--work", str(work), "--targets", str(targets)]
    env = _env(work)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = _TreeSampler(proc.pid)
    stdout, stderr = proc.communicate(timeout=6 * 3600)
    sampler.stop()
    if proc.returncode != 0:
        print(f"stage {name} at {n} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}", flush=True)
        raise _StageFailed(stderr[-1500:] or stdout[-1500:])
    got: dict[str, Any] = json.loads([ln for ln in stdout.splitlines() if ln.startswith(_MARK)][-1][len(_MARK) :])
    got["worker_peak_rss_mb"], got["worker_peak_process"] = sampler.peak_mb, sampler.peak_name
    if name in _OUTPUTS:
        got["files"], got["mean_file_bytes"] = _files(work / f"run-{n}" / _OUTPUTS[name])
    print(f"  {name:>10} n={n:>9,}: {got['seconds']:8.1f} s, driver {got['peak_rss_mb']:6.0f} MB, largest worker "
          f"{got['worker_peak_rss_mb']:6.0f} MB, files {got.get('files', '-')} (process "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[200_000, 2_000_000])
    ap.add_argument("--targets", type=int, default=2_000, help="generated targets (a seeded sample), both sizes")
    ap.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES)
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one, removed)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "scale_rehearsal.json"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--resume", action="store_true",
                    help="keep the stages --out already holds (each with its commit) and run the rest; needs --work "
                         "with the earlier stages' outputs")  # fmt: skip
    ap.add_argument("--render", action="store_true", help="only re-render docs/benchmarks.md from --out")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--load-shard", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_shard:
        _load_shard(args.load_shard)
        return
    if args.stage:
        print(_MARK + json.dumps(stage(args.stage, args.n, Path(args.work), args.targets, [])), flush=True)
        return
    out = Path(args.out)
    if args.render:
        _write(json.loads(out.read_text()), out, final=True)
        return
    small, large = args.sizes
    data: dict[str, Any] = {"command": " ".join([COMMAND, *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d"),
                            "sizes": [small, large], "targets": args.targets, "minutes": 0.0, "results": {}}  # fmt: skip
    if args.resume:
        if not args.work:
            raise SystemExit("--resume needs --work (the earlier stages' outputs)")
        old = json.loads(out.read_text())
        if old["sizes"] != data["sizes"] or old["targets"] != data["targets"]:
            raise SystemExit(f"{out} holds sizes {old['sizes']} / {old['targets']} targets, not these")
        data["results"], data["minutes"] = old["results"], old.get("minutes", 0.0)
    results: dict[str, dict[str, Any]] = data["results"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctrlgen-rehearsal-") as tmp:
        work = Path(args.work or tmp)
        _prebuild(work)  # not timed: a one-time compile per machine
        for n in (small, large):
            print(f"corpus of {n:,} notes", flush=True)
            for name in [s for s in STAGES if s in args.stages or s == "extract"]:
                key = f"{name}@{n}"
                if key in results and "failed" not in results[key]:
                    print(f"  {name:>10} n={n:>9,}: kept from {out.name} ({results[key].get('commit', '?')})")
                    continue
                try:
                    results[key] = _child(name, n, work, args.targets) | {"commit": commit.strip()}
                except _StageFailed as e:
                    results[key] = {"failed": str(e)[-1500:], "commit": commit.strip()}
                    print(f"  {name:>10} n={n:>9,}: FAILED (kept in {out.name})", flush=True)
                results[f"total@{n}"] = {"seconds": sum(r.get("seconds", 0.0) for k, r in results.items()
                                                        if k.endswith(f"@{n}") and not k.startswith("total"))}  # fmt: skip
                data["minutes"] = data.get("minutes", 0.0) if args.resume else (time.perf_counter() - t_all) / 60
                if not args.no_write:  # after every stage: a stopped run keeps what it measured
                    _write(data, out, final=False)
    if args.resume:
        data["minutes"] = sum(results[f"total@{n}"]["seconds"] for n in (small, large)) / 60
    print(report(data))
    if not args.no_write:
        _write(data, out, final=True)


class _StageFailed(RuntimeError):
    pass


def _write(data: dict[str, Any], out: Path, final: bool) -> None:
    out.write_text(json.dumps(data, indent=1) + "\n")
    if final:
        from _report import write_section

        write_section("MIMIC-scale rehearsal", report(data), run_date=data["date"])
        text = sizing(data)
        if text:
            _write_block(CLUSTER_DOC, text)


CLUSTER_DOC = ROOT / "docs" / "cluster.md"
_BLOCK = ("<!-- scale-rehearsal sizing: written by benchmarks/scale_rehearsal.py -->", "<!-- end of sizing -->")


def _ok(r: dict[str, Any] | None) -> bool:
    return r is not None and "failed" not in r


def sizing(data: dict[str, Any]) -> str | None:
    """What a head, a CPU worker, a GPU worker and a Scorer replica need at the large size, from the measured
    stages (None when no stage of the large size was measured)."""
    large = data["sizes"][1]
    got = {n: r for n in STAGES if _ok(r := data["results"].get(f"{n}@{large}"))}
    if not got:
        return None
    missing = [n for n in STAGES if n not in got]
    commits = sorted({r.get("commit", "?") for r in got.values()})
    gb = 1024.0
    drv = max((n for n in got if n != "scorer"), key=lambda n: got[n]["peak_rss_mb"], default=None)  # job drivers
    wrk = max((n for n in got if n != "scorer"), key=lambda n: got[n]["worker_peak_rss_mb"], default=None)
    lines = [
        f"Measured by `benchmarks/scale_rehearsal.py` at {large:,} demo notes (commit {', '.join(commits)}; stages "
        f"measured: {', '.join(got)}" + (f"; not measured: {', '.join(missing)}" if missing else "") + "), each stage "
        "its own driver on a private 4-CPU Ray cluster, a tiny random model (docs/benchmarks.md, \"MIMIC-scale "
        "rehearsal\"):",
        "",
    ]
    if drv is not None:
        peak = got[drv]["peak_rss_mb"] / gb
        fits = "within" if peak <= 8 else "above half of"
        lines.append(
            f"- **Head node** (the jobs' drivers): the largest driver peak was {peak:.1f} GB ({drv}), {fits} "
            "KubeRay's default head (16 GiB, no CPUs for work); add Ray's own head processes (GCS, dashboard) and "
            "the object store's share if the head also holds objects."
        )
    if wrk is not None:
        w = got[wrk]
        lines.append(
            f"- **CPU worker**: the largest Ray worker process peaked at {w['worker_peak_rss_mb'] / gb:.1f} GB "
            f"({wrk}, `{w.get('worker_peak_process', '?')}`). Ray runs about one such process per CPU it schedules: "
            "budget that per CPU given to the jobs, plus Ray's object store (30% of the node's memory by default)."
        )
    if "generate" in got:
        g = got["generate"]
        lines.append(
            f"- **GPU worker** (generation actors): the generation stage's largest process peaked at "
            f"{g['worker_peak_rss_mb'] / gb:.1f} GB of host memory with the tiny model (the corpus-sized parts: the "
            "value pool, the banned-value automaton, the fine-tuning value index); add the real model's weights "
            "while it loads (SmolLM2-135M: about 0.5 GB in float32) and one such actor per GPU. GPU memory is the "
            "engine's (docs/generation.md), not measured here."
        )
    if "scorer" in got:
        sc = got["scorer"]
        lines.append(
            f"- **Serve Scorer replica**: a shard of {sc['documents']:,} reference notes grew the process that loaded "
            f"it (its saved index, `serve.scorer_index_dir`) by {sc['bytes_per_note'] * sc['documents'] / 1e9:.1f} GB "
            f"({sc['bytes_per_note'] / 1e3:.1f} KB per note; the ROUGE index's arrays "
            f"{sc['rouge_bytes_per_note'] / 1e3:.2f} KB of it, the rest the shard's {sc['values']:,} private values); "
            "a replica holds one shard: more shards (values and notes are both sharded) divide it."
        )  # fmt: skip
    return "\n".join(lines)


def _write_block(path: Path, text: str) -> None:
    """Replace the text between the two markers of ``path`` (they must be there)."""
    doc = path.read_text(encoding="utf-8")
    start, end = doc.index(_BLOCK[0]) + len(_BLOCK[0]), doc.index(_BLOCK[1])
    path.write_text(doc[:start] + "\n" + text + "\n" + doc[end:], encoding="utf-8")


def report(data: dict[str, Any]) -> str:
    small, large = data["sizes"]
    res = data["results"]
    lines = [
        f"Command: `{data['command']}` ({data['minutes']:.0f} min). Demo corpus (MIMIC format, known setting), "
        f"tiny random Llama, 4 new tokens, {data['targets']:,} generated targets at both sizes, a private 4-CPU "
        f"Ray cluster per stage, each stage its own driver process. Ratios: {large:,} notes / {small:,}.",
        "",
        f"| stage | time at {small:,} | at {large:,} | time ratio (<= 12) | driver RSS at {small:,} | at {large:,} | "
        f"RSS ratio (<= 1.2) | largest worker at {large:,} (<= 4 GB) | files at {large:,} (<= 2,000) | "
        "mean file | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ok(r: dict[str, Any] | None) -> bool:
        return r is not None and "failed" not in r

    def cell(r: dict[str, Any] | None, what: str) -> str:
        if r is None:
            return "not run"
        if "failed" in r:
            return "FAILED"
        return f"{r['seconds']:.0f} s" if what == "time" else f"{r['peak_rss_mb']:.0f} MB"

    for name in STAGES:
        a, b = res.get(f"{name}@{small}"), res.get(f"{name}@{large}")
        if a is None and b is None:
            continue
        time_ratio = rss_ratio = "-"
        if ok(a) and ok(b):
            assert a is not None and b is not None
            tr, rr = b["seconds"] / max(a["seconds"], 1e-9), b["peak_rss_mb"] / a["peak_rss_mb"]
            time_ratio = f"{tr:.1f} ({'met' if tr <= 12 else 'NOT met'})"
            # a build process holds the shard it builds: see the paragraph under the table
            rss_ratio = f"n/a (build: {rr:.2f})" if name == "scorer" else f"{rr:.2f} ({'met' if rr <= 1.2 else 'NOT met'})"
        row = [name, cell(a, "time"), cell(b, "time"), time_ratio, cell(a, "rss"), cell(b, "rss"), rss_ratio]
        last = b if ok(b) else a if ok(a) else None  # the large size's figures, else the small one's (marked)
        tag = "" if last is b else f" (at {small:,})"
        if last is None:
            row += ["-", "-", "-"]
        else:
            w = last["worker_peak_rss_mb"]
            row.append(f"{w:.0f} MB{tag} ({'met' if w <= 4096 else 'NOT met'})")
            files = last.get("files")
            row += ([f"{files:,}{tag} ({'met' if files <= 2000 else 'NOT met'})", f"{last['mean_file_bytes'] / 1e6:.2f} MB"]
                    if files is not None else ["-", "-"])  # fmt: skip
        row.append(", ".join(sorted({r["commit"] for r in (a, b) if r is not None and r.get("commit")})) or "-")
        lines.append("| " + " | ".join(row) + " |")
    failed = [(k, r["failed"]) for k, r in res.items() if "failed" in r]
    for k, msg in failed:
        tail = [ln for ln in msg.splitlines() if ln.strip()][-1:] or ["?"]
        lines += ["", f"{k} failed: `{tail[0][:300]}`"]
    sc = res.get(f"scorer@{large}")
    if ok(sc):
        assert sc is not None
        per = sc["bytes_per_note"]
        # measured as a replica holds it: the saved shard loaded by a fresh process
        lines += ["", f"Scorer index at {large:,} notes: {per / 1e3:.2f} KB per reference note (RSS growth of a "
                      f"fresh process loading the saved shard of {sc['documents']:,} notes, {sc['load_seconds']:.0f} s; "
                      f"target <= 3 KB: {'met' if per <= 3000 else 'NOT met'}); the ROUGE index's arrays "
                      f"{sc['rouge_bytes_per_note'] / 1e3:.2f} KB of it, the rest the document ids and the shard's "
                      f"{sc['values']:,} private values (hashed variant keys). The scorer row is the shard's build "
                      f"and save, done once (serve.scorer_index_dir): its driver is the building process, which "
                      f"grew by {sc['build_bytes_per_note'] / 1e3:.2f} KB per note and holds the shard it builds, "
                      f"so its RSS follows the shard's size by design (the 1.2 ratio does not apply to it: "
                      f"n/a in the table); the file is {sc['file_mb']:,.0f} MB."]  # fmt: skip
    lines += ["", "Whole rehearsal: " + ", ".join(f"{res[f'total@{n}']['seconds'] / 60:.0f} min at {n:,} notes"
                                                for n in (small, large) if f"total@{n}" in res) + "."]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
