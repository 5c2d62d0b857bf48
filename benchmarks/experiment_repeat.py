"""Does the experiment repeat itself? The same cells run twice from scratch, every figure and text compared.

    .venv/bin/python benchmarks/experiment_repeat.py [--out /tmp/ctrlgen-repeat] [--compare A B] [key=value ...]

Runs ``ctrlgen experiment -c configs/experiment_compare.yaml`` twice into ``OUT/run1`` and ``OUT/run2``
(extraction included), by default on the cells that sample rows and that moved between two earlier runs
(docs/results.md): seed 0, the unknown setting, baseline / ICL / ICL + blocking / the LLM anonymiser
(about 8 min a run on the 2-core machine). Extra ``key=value`` arguments are passed to both runs, after
the defaults (``experiment.seeds=[0,1,2]`` widens it). ``--compare A B`` only compares two existing runs.

Compared: every value of ``results/results.json`` but the wall time, the resolved config and how the run was
launched (its command line, which names its output directory, its date, commit and machine; NaN equals NaN), and
every generated text (by note and mode) under ``runs/*/gen-*/generated``. Prints what differs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = [
    "experiment.seeds=[0]",
    "experiment.methods=[baseline,icl,icl_blocking,anon_llm]",
    "experiment.settings=[unknown]",
]


def _flat(x: Any, path: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _flat(val, f"{path}.{key}").items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in _flat(val, f"{path}[{i}]").items()}
    return {path: x}


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _texts(run: Path) -> dict[tuple[str, str, str], str]:
    from ctrlgen.generation.report import read_generated

    return {
        (gen.parent.name, str(r["doc_id"]), str(r["mode"])): r["text"]
        for gen in sorted(run.glob("runs/*/gen-*/generated"))
        for r in read_generated(gen)
    }


#: What results.json says of how a run was launched, not of what it measured: not compared.
_LAUNCH = ("config", "minutes", "command", "date", "commit", "dirty", "machine")


def compare(a: Path, b: Path) -> bool:
    ra, rb = (json.loads((r / "results" / "results.json").read_text()) for r in (a, b))
    fa, fb = (
        _flat({k: v for k, v in r.items() if k not in _LAUNCH}) for r in (ra, rb)
    )
    keys = sorted(set(fa) | set(fb))
    diff = [k for k in keys if not _same(fa.get(k), fb.get(k))]
    print(f"results.json: {len(keys)} values, {len(keys) - len(diff)} equal, {len(diff)} differ")
    nums = [(fa[k], fb[k]) for k in diff if isinstance(fa.get(k), float) and isinstance(fb.get(k), float)]
    if nums:  # floating-point rounding (sums in another order) or a real difference
        rel = max(abs(x - y) / max(abs(x), abs(y), 1e-300) for x, y in nums)
        print(f"  {len(nums)} of them numbers, largest relative difference {rel:.1e}")
    for k in diff[:20]:
        print(f"  {k}: {fa.get(k)!r} vs {fb.get(k)!r}")
    ta, tb = _texts(a), _texts(b)
    both = sorted(set(ta) & set(tb))
    equal = sum(ta[k] == tb[k] for k in both)
    print(f"generated texts: {len(ta)} and {len(tb)}, {len(both)} in both, {equal} equal")
    return not diff and equal == len(both) == len(ta) == len(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/ctrlgen-repeat"))
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="compare two existing runs only")
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs (after the defaults)")
    args = ap.parse_args()
    if args.compare:
        a, b = args.compare
    else:
        a, b = args.out / "run1", args.out / "run2"
        for run in (a, b):
            t0 = time.perf_counter()
            cmd = [str(ROOT / ".venv" / "bin" / "ctrlgen"), "experiment", "-c", "configs/experiment_compare.yaml",
                   *DEFAULT, *args.overrides, f"output_dir={run}"]  # fmt: skip
            log = args.out / f"{run.name}.log"
            print(f"[repeat] {' '.join(cmd[1:])} (output in {log})", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            with log.open("w") as f:
                subprocess.run(cmd, cwd=ROOT, check=True, stdout=f, stderr=subprocess.STDOUT)
            print(f"[repeat] {run.name}: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    ok = compare(a, b)
    print("the two runs are identical" if ok else "the two runs DIFFER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
