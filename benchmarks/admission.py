"""Benchmark: admitting rows into the fast engine - compiling each row's banned-sequence automaton.

On the first lent GPU (an H200, docs/benchmarks/gpu_run_2026-11-26) the fast engine's decode step at 256
slots ran 33,684 tokens/s but the whole call 473 tokens/s: admission, not decoding, bounded it, and the host
profile put ~0.2 s a row on compiling the row's automaton with a Python loop over its ~18,000 sequences
(1,000 private values with their variants). This benchmark measures, in one run, on the engine benchmark's
workload (``benchmarks/engine.py``'s ``_workload``: PhysioNet ICL prompts, ``--values`` values a row):

* the automaton compile per row: the loop (``compile_banned_reference``, the engine's compile until
  2026-11-26) vs the array compile (``compile_banned``), and their ratio;
* rows compiled per second with the engine's thread pool (``FastEngine.compile_threads``) vs one thread;
* ``BanTables.load`` per row (the copy into the slot's tables) for scale.

    .venv/bin/python benchmarks/admission.py                # ~2 min here; writes docs/benchmarks/admission.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/admission.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--values", type=int, default=1000, help="private values banned per row")
    ap.add_argument("--threads", type=int, default=None, help="pool threads (default: the engine's default)")
    ap.add_argument("--processes", type=int, default=None, help="worker processes (default: the usable CPUs)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "admission.json"))
    args = ap.parse_args()
    import torch
    from engine import _commit, _workload
    from transformers import AutoTokenizer

    from ctrlgen.generation.engines.fast.engine import _usable_cpus
    from ctrlgen.generation.logits.automaton import (
        BanTables,
        CompiledBans,
        compile_banned,
        compile_banned_arrays,
        compile_banned_reference,
    )
    from ctrlgen.models import prepare_builtin

    tok = AutoTokenizer.from_pretrained(str(prepare_builtin()))
    vocab = len(tok)
    prompts, banned, _ = _workload(tok, args.rows, args.values, 256)
    seqs = sum(len(b) for b in banned) / len(banned)
    print(f"[admission] {args.rows} rows, {args.values} values = {seqs:,.0f} sequences a row", flush=True)

    def per_row(fn: object) -> float:
        t0 = time.perf_counter()
        for b in banned:
            fn(b, vocab)  # type: ignore[operator]
        return (time.perf_counter() - t0) / len(banned)

    loop_s, array_s = per_row(compile_banned_reference), per_row(compile_banned)
    print(f"[admission] compile per row: loop {loop_s * 1e3:.1f} ms, arrays {array_s * 1e3:.1f} ms", flush=True)
    threads = args.threads or min(8, _usable_cpus())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        compiled = list(pool.map(lambda b: compile_banned(b, vocab), banned))
    pool_rows_s = len(banned) / (time.perf_counter() - t0)
    procs = args.processes or max(1, _usable_cpus())
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=ctx) as ppool:
        t0 = time.perf_counter()
        list(ppool.map(compile_banned_arrays, [[[1]]] * procs, [vocab] * procs))  # start the workers
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = [CompiledBans.from_arrays(a) for a in ppool.map(compile_banned_arrays, banned, [vocab] * len(banned))]
        proc_rows_s = len(banned) / (time.perf_counter() - t0)
    assert all(torch.equal(a.edge_keys, b.edge_keys) and torch.equal(a.ban_tok, b.ban_tok)
               for a, b in zip(back, compiled, strict=True))  # fmt: skip
    tabs = BanTables(len(banned), vocab, "cpu")
    t0 = time.perf_counter()
    for i, c in enumerate(compiled):
        tabs.load(i, c, tok(prompts[i], add_special_tokens=False)["input_ids"])
    load_s = (time.perf_counter() - t0) / len(banned)
    result = {
        "command": " ".join([COMMAND, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
        "cpus": _usable_cpus(),
        "rows": args.rows,
        "values_per_row": args.values,
        "sequences_per_row": seqs,
        "loop_compile_s": loop_s,
        "array_compile_s": array_s,
        "speedup": loop_s / array_s,
        "threads": threads,
        "one_thread_rows_per_s": 1 / array_s,
        "pool_rows_per_s": pool_rows_s,
        "processes": procs,
        "processes_start_s": start_s,
        "processes_rows_per_s": proc_rows_s,
        "load_s": load_s,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    write_section("Generation engine: row admission", section(result))
    print(f"[admission] wrote {args.out} and docs/benchmarks.md", flush=True)


def section(r: dict) -> str:
    step = _gpu_step()
    lines = [
        f"Command: `{r['command']}` at {r['commit']} ({r['cpus']} CPUs). Workload: the engine benchmark's, "
        f"{r['rows']} rows, {r['values_per_row']:,} private values a row = {r['sequences_per_row']:,.0f} banned "
        "sequences a row with their variants (the 1,000-value stress case of issue 36).",
        "",
        "| per row | loop compile (`compile_banned_reference`) | array compile (`compile_banned`) | ratio | "
        "`BanTables.load` |",
        "|---|---|---|---|---|",
        f"| ms | {r['loop_compile_s'] * 1e3:.1f} | {r['array_compile_s'] * 1e3:.1f} | **{r['speedup']:.1f}x** | "
        f"{r['load_s'] * 1e3:.1f} |",
        "",
        "| rows compiled per second | one thread | the engine's thread pool "
        "(`compile_threads`) | worker processes (`model.engine_options.compile_processes`) |",
        "|---|---|---|---|",
        f"| {r['rows']} rows | {r['one_thread_rows_per_s']:.1f} | {r['pool_rows_per_s']:.1f} with {r['threads']} "
        f"threads ({r['pool_rows_per_s'] / r['one_thread_rows_per_s']:.2f}x) | {r['processes_rows_per_s']:.1f} with "
        f"{r['processes']} processes ({r['processes_rows_per_s'] / r['one_thread_rows_per_s']:.2f}x; "
        f"{r['processes_start_s']:.1f} s to start them, once per engine) |",
        "",
        "The engine compiles every request's automaton on its pool from the start of a call, in admission order, so "
        "a row waits only for its own when its slot comes and later rows compile while the device decodes. The "
        "engine's thread pool shares the process's GIL with the decode loop; worker processes do not, at the cost of "
        "sending each automaton back as arrays.",
    ]
    if step is not None:
        slots, step_s, new_tokens, device = step
        need = slots / (step_s * new_tokens)
        lines += ["", f"To keep {slots} slots busy on the {device} (decode step {step_s * 1e3:.1f} ms, "
                  f"{new_tokens} new tokens a row: a slot frees every {step_s * new_tokens / slots * 1e3:.1f} ms "
                  f"on average) admission must compile {need:.0f} rows a second at this workload: "
                  f"{need * r['array_compile_s']:.1f} CPUs' worth of compile, and several times fewer at 400 new "
                  "tokens or at a note's own tens of values."]  # fmt: skip
    return "\n".join(lines)


def _gpu_step() -> tuple[int, float, int, str] | None:
    """The largest slot count's decode step of the GPU engine run (docs/benchmarks/engine_cuda.json), if any."""
    path = ROOT / "docs" / "benchmarks" / "engine_cuda.json"
    if not path.is_file():
        return None
    g = json.loads(path.read_text())
    top = max(g["slots"], key=lambda row: row["slots"])
    return top["slots"], top["fast"]["step_s"], g["new_tokens"], g["device"]


if __name__ == "__main__":
    main()
