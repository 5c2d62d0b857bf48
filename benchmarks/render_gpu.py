"""Turn a GPU run's folder (``benchmarks/gpu_run.py``'s ``$OUT``) into the GPU sections of docs/benchmarks.md.

    .venv/bin/python benchmarks/render_gpu.py /work/.device/<...>/files      # the folder the device tool returned

Writes ``Generation engine: GPU`` from ``engine_cuda.json`` (benchmarks/render_engine.py) and ``GPU run``
from ``summary.json``: what ran, on what, how long, what failed or was skipped and why. The JSON files are
copied to docs/benchmarks/ so the page can be rendered again from the repository.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _report import write_section  # noqa: E402
from render_engine import render  # noqa: E402


def run_section(summary: dict) -> str:
    env = summary["env"]
    lines = [
        f"Command: `bash benchmarks/gpu_run.sh` on {env['device']}"
        + (f" ({env['gpu_memory_gib']:.0f} GiB)" if env.get("gpu_memory_gib") else "")
        + f", Python {env['python']}, torch {env['torch']}; {summary['seconds'] / 60:.1f} min in all. "
        f"Model weights: {summary['weights']}.",
        "",
        "| step | status | seconds | note |",
        "|---|---|---|---|",
    ]
    for s in summary["steps"]:
        note = s.get("why") or s.get("weights") or ("" if s["status"] == "ran" else f"exit code {s.get('rc')}")
        secs = f"{s['seconds']:.0f}" if "seconds" in s else "-"
        lines.append(f"| {s['step']} | {s['status']} | {secs} | {note} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: render_gpu.py FOLDER (with summary.json)")
    folder = Path(sys.argv[1])
    summary = json.loads((folder / "summary.json").read_text())
    dest = ROOT / "docs" / "benchmarks"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "summary.json", dest / "gpu_run.json")
    write_section("GPU run", run_section(summary))
    engine = folder / "engine_cuda.json"
    if engine.is_file():
        shutil.copy(engine, dest / "engine_cuda.json")
        render([dest / "engine_cuda.json"])
    print("rendered the GPU sections of docs/benchmarks.md")


if __name__ == "__main__":
    main()
