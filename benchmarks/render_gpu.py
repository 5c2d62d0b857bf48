"""Turn a GPU run's folder (``benchmarks/gpu_run.py``'s ``$OUT``) into the GPU sections of docs/benchmarks.md.

    .venv/bin/python benchmarks/render_gpu.py FOLDER

FOLDER is what the device tool returned, or a copy kept under docs/benchmarks/ (the first lent run is kept as
``docs/benchmarks/gpu_run_2026-11-26``, so the page can be rendered again from the repository). Writes
``Generation engine: GPU`` from ``engine_cuda.json`` (benchmarks/render_engine.py) when the run got that far,
with the phase timings its logs hold, else from the ``[engine bench]`` lines of the folder's ``engine*.log``
files (a run cut at its time limit writes its JSON only at the end of a slot count), ``GPU run`` from ``summary.json``: what ran, on what, how
long, what failed or was skipped and why, and each synthesize stage's summary; and, when its ``ner_tagger`` step
ran on the GPU, "Entity extraction: the transformer tagger on a GPU" (benchmarks/ner_gpu.py).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _report import write_section  # noqa: E402
from ner_gpu import publish_result as publish_ner  # noqa: E402
from render_engine import TITLES, _f, section  # noqa: E402

_HEAD = re.compile(r"\[engine bench\] (.+?), (\w+): prompts of (\d+) tokens, (\d+) banned sequences per row, "
                   r"(\d+) new tokens")  # fmt: skip
_SLOT = re.compile(r"\[engine bench\] slots (\d+): fast ([\d.]+) tok/s, step ([\d.]+) ms \(no blocking ([\d.]+) ms\), "
                   r"roofline ([\d.]+) ms")  # fmt: skip
_TF = re.compile(r"\[engine bench\] slots (\d+): transformers generate ([\d.]+) tok/s")
_AD = re.compile(r"\[engine bench\] adapters at (\d+) slots: 1 adapter ([\d.]+) ms/step, 8 adapters ([\d.]+) ms/step")
_WORK = re.compile(r"\[engine bench\] workload of (\d+) rows built in ([\d.]+) s")
_START = re.compile(r"\[engine bench\] slots (\d+): engine started and warmed up in ([\d.]+) s")
_CALL = re.compile(r"\[engine bench\] slots (\d+): whole call of (\d+) rows in ([\d.]+) s")


def run_section(summary: dict[str, Any], folder: Path) -> str:
    env = summary["env"]
    lines = [
        f"Command: `bash benchmarks/gpu_run.sh` on {env['device']}"
        + (f" ({env['gpu_memory_gib']:.0f} GiB)" if env.get("gpu_memory_gib") else "")
        + f", Python {env['python']}, torch {env['torch']}; {summary['seconds'] / 60:.1f} min in all. "
        f"Model weights: {summary['weights']}. Logs: `{_rel(folder)}`." + _earlier_runs(folder),
        "",
        "| step | status | seconds | note |",
        "|---|---|---|---|",
    ]
    for s in summary["steps"]:
        note = s.get("why") or s.get("weights") or ("" if s["status"] == "ran" else f"exit code {s.get('rc')}")
        if s.get("rc") == 124:
            note = "stopped at its time limit (exit code 124)"
        if s.get("rc") == 124 and s.get("stages"):
            note += f"; stages done: {', '.join(s['stages'])}"
        secs = f"{s['seconds']:.0f}" if "seconds" in s else "-"
        lines.append(f"| {s['step']} | {s['status']} | {secs} | {note} |")
    for s in summary["steps"]:
        for stage, text in (s.get("stages") or {}).items():
            lines += ["", f"`{s['step']}` stage `{stage}` (its own summary):", "", "```", str(text).strip(), "```"]
    return "\n".join(lines)


def engine_from_logs(folder: Path, summary: dict[str, Any]) -> str | None:
    """The engine section from the ``[engine bench]`` lines of the folder's engine logs (None: there are none)."""
    runs, tf, adapters = [], {}, None
    for log in sorted(folder.glob("engine*.log")):
        head, rows = None, []
        for line in log.read_text(errors="replace").splitlines():
            if m := _HEAD.search(line):
                head = m.groups()
            elif m := _SLOT.search(line):
                rows.append(tuple(float(x) for x in m.groups()))
            elif m := _TF.search(line):
                tf[(log.name, int(m.group(1)))] = float(m.group(2))
            elif m := _AD.search(line):
                adapters = (int(m.group(1)), float(m.group(2)), float(m.group(3)))
        if head and rows:
            runs.append((log.name, head, rows))
    if not runs:
        return None
    lines = [
        "Command: `python benchmarks/engine.py --device cuda` (the workload of the CPU section) on the lent "
        f"machine, model weights: {summary['weights']}; its runs ended before writing their JSON (cut at their time limit), so the figures below are "
        f"parsed from the runs' logs in `{_rel(folder)}` by this script.",
        "",
        "| log | device, dtype | prompt tokens | banned sequences per row | new tokens | slots | whole call tokens/s "
        "(prefill and admission included) | decode step ms | decode-only tokens/s | blocking share of a step | "
        "step ms at the roofline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    top = None
    for name, (dev, dtype, prompt, banned, new), rows in runs:
        for slots, fast, step, free, roof in rows:
            decode = slots / (step / 1e3)
            share = max(0.0, (step - free) / step)
            lines.append(f"| `{name}` | {dev}, {dtype} | {prompt} | {int(banned):,} | {new} | {int(slots)} | "
                         f"{fast:,.1f} | {step:.1f} | {decode:,.0f} | {share * 100:.1f}% | {roof:.2f} |")  # fmt: skip
            if slots == 256:
                top = (name, fast, decode, share)
    met = lambda ok: "met" if ok else "**not met**"  # noqa: E731
    lines += ["", f"Targets (issue 36, on one H100; measured on {runs[0][1][0]}):"]
    if top is None:
        lines.append("- the 256-slot targets: not measured (no 256-slot run in the logs).")
    else:
        name, fast, decode, share = top
        lines.append(f"- >= 30,000 tokens/s at 256 slots with blocking on: {fast:,.0f} tokens/s for the whole call, "
                     f"{met(fast >= 30_000)} (the decode step alone: {decode:,.0f} tokens/s).")  # fmt: skip
        if fast < decode / 2:
            lines[-1] += (" Most of the call went outside the decode step, to admitting rows (each row's "
                          "banned-sequence automaton, prefill): see `Generation engine: row admission`.")  # fmt: skip
        lines.append(f"- blocking <= 5% of a step: {share * 100:.1f}%, {met(share <= 0.05)}.")
        ref = tf.get((name, 256))
        lines.append(f"- >= 10x transformers' `generate`: {fast / ref:.1f}x, {met(fast / ref >= 10)}." if ref else
                     "- >= 10x transformers' `generate`: not measured (the run ended before it).")  # fmt: skip
    if adapters:
        s_, one, eight = adapters
        lines.append(
            f"- 8 adapters in one batch <= 1.1x one (at {s_} slots): {eight / one:.2f}x, {met(eight / one <= 1.1)}."
        )
    else:
        lines.append("- 8 adapters in one batch <= 1.1x one: not measured (the run ended before it).")
    tests = next((st for st in summary["steps"] if st["step"] == "gpu_tests"), None)
    lines.append(
        '- no host sync in the decode loop (`tests/gpu`, `torch.cuda.set_sync_debug_mode("error")` over the '
        f"captured decode loop): the gpu test tier {tests['status'] if tests else 'not run'}; see `GPU run`."
    )
    return "\n".join(lines)


def phases_from_logs(folder: Path, new_tokens: int) -> str | None:
    """A table of the phase timings the engine benchmark logs (since 2026-12-04): building the workload,
    starting the engine, the whole call; they survive a run cut before its decode-step timing (None: none)."""
    rows, at_256 = [], None
    for log in sorted(folder.glob("engine*.log")):
        work, start = None, {}
        for line in log.read_text(errors="replace").splitlines():
            if m := _WORK.search(line):
                work = float(m.group(2))
            elif m := _START.search(line):
                start[int(m.group(1))] = float(m.group(2))
            elif m := _CALL.search(line):
                slots, n, secs = int(m.group(1)), int(m.group(2)), float(m.group(3))
                tps = n * new_tokens / secs
                rows.append(
                    f"| `{log.name}` | {slots} | {_f(work)} | {_f(start.get(slots))} | {secs:.1f} | {tps:,.0f} |"
                )
                at_256 = tps if slots == 256 else at_256
    if not rows:
        return None
    lines = [
        f"Phase timings from the logs in `{_rel(folder)}` (the benchmark's own lines; a run cut before its "
        f"decode-step timing keeps them). Whole-call tokens/s = rows x {new_tokens} new tokens / the call's seconds.",
        "",
        "| log | slots | workload built (s) | engine started and warmed up (s) | whole call (s) | whole-call tokens/s |",
        "|---|---|---|---|---|---|",
        *rows,
    ]  # fmt: skip
    if at_256 is not None:
        lines += ["", f"Target (issue 36), >= 30,000 tokens/s at 256 slots, by the whole call in the logs: "
                      f"{at_256:,.0f}, {'met' if at_256 >= 30_000 else 'not met'}."]  # fmt: skip
    return "\n".join(lines)


def _earlier_runs(folder: Path) -> str:
    """The other GPU runs kept under docs/benchmarks/ (each folder renders its own sections again)."""
    kept = sorted(p for p in (ROOT / "docs" / "benchmarks").glob("gpu_run_*") if p.resolve() != folder.resolve())
    if not kept:
        return ""
    names = ", ".join(f"`{_rel(p)}`" for p in kept)
    return f" Other runs kept, each with its logs and a README (`render_gpu.py FOLDER` renders it again): {names}."


def _rel(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(ROOT))
    except ValueError:
        return str(folder)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: render_gpu.py FOLDER (with summary.json)")
    folder = Path(sys.argv[1])
    summary = json.loads((folder / "summary.json").read_text())
    write_section("GPU run", run_section(summary, folder))
    engine = folder / "engine_cuda.json"
    if engine.is_file():
        dest = ROOT / "docs" / "benchmarks"
        shutil.copy(engine, dest / "engine_cuda.json")
        r = json.loads(engine.read_text())
        text = section(r)
        if (phases := phases_from_logs(folder, int(r["new_tokens"]))) is not None:
            text += "\n\n" + phases
        write_section(TITLES["cuda"], text)
    elif (text := engine_from_logs(folder, summary)) is not None:
        write_section("Generation engine: GPU", text)
    for step in summary["steps"]:  # the transformer NER's tagger on the GPU (not a CPU dry run's)
        if step["step"] == "ner_tagger" and step.get("result") and not step["result"].get("quick"):
            publish_ner(step["result"])
    print("rendered the GPU sections of docs/benchmarks.md")


if __name__ == "__main__":
    main()
