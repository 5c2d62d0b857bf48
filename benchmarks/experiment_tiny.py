"""The CI experiment (``configs/experiment_tiny.yaml``) at an earlier commit and at this checkout, in one run:
wall time, Ray worker processes started, and whether ``results.json`` is the same.

    .venv/bin/python benchmarks/experiment_tiny.py [--before d58b002] [--out /tmp/ctrlgen-tiny] [key=value ...]

The earlier commit is checked out as a git worktree beside the output and run with this venv (its own code on
``PYTHONPATH``, so the Ray workers import it too); both runs use the same config, the same corpus
(``../shared/data/physionet-deid``) and ``training.dp.reproducible_noise=true`` (the DP rows' noise drawn
from the seed, so that the two runs can be compared; the default draws secret noise). Compared as in
``benchmarks/experiment_repeat.py``: every value of ``results.json`` but the wall time, the config and how the
run was launched, and every generated text. Writes ``docs/benchmarks/experiment_tiny.json`` and the section
"Experiment: the CI matrix, before vs after" of docs/benchmarks.md. Issue 39 item 3's target: after <= 1/3
of before, identical values.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402
from experiment_repeat import compare  # noqa: E402

CONFIG = "configs/experiment_tiny.yaml"
JSON = ROOT / "docs" / "benchmarks" / "experiment_tiny.json"
RAY_TMP = Path("/tmp/ray")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _sessions() -> set[Path]:
    return set(RAY_TMP.glob("session_2*")) if RAY_TMP.exists() else set()


def run_once(code: Path, out: Path, overrides: list[str]) -> dict[str, float | int]:
    """``ctrlgen experiment`` with ``code``'s package, in a fresh process (its own private Ray cluster)."""
    shared = (ROOT.parent / "shared" / "data" / "physionet-deid").resolve()
    cmd = [sys.executable, "-m", "ctrlgen.cli", "experiment", "-c", CONFIG, f"output_dir={out}",
           f"corpus.path={shared}", "training.dp.reproducible_noise=true", *overrides]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    before = _sessions()
    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"[experiment_tiny] {code.name}: {' '.join(cmd[3:])} (log {log})", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        subprocess.run(cmd, cwd=code, env=env, check=True, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    new = sorted(_sessions() - before)
    workers = sum(1 for s in new for _ in (s / "logs").glob("worker-*.out")) if new else -1
    print(f"[experiment_tiny] {code.name}: {seconds / 60:.1f} min, {workers} worker processes", flush=True)
    return {"seconds": seconds, "workers": workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="d58b002", help="the earlier commit (default: before issue 39's changes)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/ctrlgen-tiny"))
    ap.add_argument("--after-first", action="store_true",
                    help="run this checkout first (when something else may still be running at the start, the "
                         "ratio is then an upper bound: the first run bears the contention)")  # fmt: skip
    ap.add_argument("--render", action="store_true",
                    help="run neither side again: compare the two runs already in --out and rewrite the JSON and "
                         "the section (their times from the JSON); with --repeat-before, the earlier commit's second "
                         "run is made when --out/before2 has none")  # fmt: skip
    ap.add_argument("--repeat-before", action="store_true",
                    help="run the earlier commit a second time (into --out/before2, with --render too) and compare "
                         "it with its first run: how far the earlier code's own results.json moves between runs")  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs")
    args = ap.parse_args()
    if args.render:
        r = json.loads(JSON.read_text())
        r["identical"], r["comparison"] = _compare(args.out)
        if args.repeat_before:
            _repeat_before(r, args.out, args.before, r["overrides"])
        JSON.write_text(json.dumps(r, indent=1) + "\n")
        _write(r)
        return
    after_commit = _git("rev-parse", "--short", "HEAD")
    before_commit = _git("rev-parse", "--short", args.before)
    tree = args.out / f"worktree-{before_commit}"
    if not tree.exists():
        _git("worktree", "add", "--detach", str(tree), before_commit)
    if (ROOT / ".cache").exists() and not (tree / ".cache").exists():
        (tree / ".cache").symlink_to(ROOT / ".cache")  # what make setup trained (the clinical NER), shared
    try:
        order = [("after", ROOT), ("before", tree)] if args.after_first else [("before", tree), ("after", ROOT)]
        runs = {name: run_once(code, args.out / name, args.overrides) for name, code in order}
    finally:
        _git("worktree", "remove", "--force", str(tree))
    same, comparison = _compare(args.out)
    ratio = runs["after"]["seconds"] / runs["before"]["seconds"]
    r = {"command": ".venv/bin/python benchmarks/experiment_tiny.py" + (f" --before {args.before}"
                                                                         if args.before != "d58b002" else "")
         + (" --after-first" if args.after_first else "") + "".join(f" {o}" for o in args.overrides),
         "order": [name for name, _ in order],
         "overrides": args.overrides, "before": {"commit": before_commit, **runs["before"]},
         "after": {"commit": after_commit, **runs["after"]}, "after_over_before": ratio,
         "identical": same, "comparison": comparison,
         "machine": f"{os.cpu_count()} CPU cores", "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    if args.repeat_before:
        _repeat_before(r, args.out, args.before, args.overrides)
    JSON.write_text(json.dumps(r, indent=1) + "\n")
    _write(r)


def _repeat_before(r: dict[str, Any], out: Path, before: str, overrides: list[str]) -> None:
    """The earlier commit's second run (``out/before2``, made here when missing) compared with its first."""
    if not (out / "before2" / "results" / "results.json").is_file():
        tree = out / f"worktree-{r['before']['commit']}-2"
        _git("worktree", "add", "--detach", str(tree), before)
        try:
            r["before_repeat_run"] = run_once(tree, out / "before2", overrides)
        finally:
            _git("worktree", "remove", "--force", str(tree))
    r["before_repeat"] = _compare(out, "before2", "before")[1]


def _compare(out: Path, a: str = "before", b: str = "after") -> tuple[bool, list[str]]:
    """Whether the runs in ``out/a`` and ``out/b`` are the same, and the comparison's lines."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        same = compare(out / a, out / b)
    print(printed.getvalue(), end="")
    return same, printed.getvalue().strip().splitlines()


def _write(r: dict[str, Any]) -> None:
    """The section of docs/benchmarks.md, from the JSON's figures alone."""
    ratio = r["after_over_before"]
    same = r["identical"]
    rows = [f"| {k} ({r[k]['commit']}) | {r[k]['seconds'] / 60:.1f} | {r[k]['workers']} |" for k in ("before", "after")]
    write_section("Experiment: the CI matrix, before vs after", "\n".join([
        f"Command: `{r['command']}`; both runs in one invocation, one after the other ({' then '.join(r['order'])}), "
        f"each a fresh process with its own Ray cluster (`{CONFIG}`, `training.dp.reproducible_noise=true`).",
        "",
        "| code | wall time, min | Ray worker processes started |",
        "|---|---|---|",
        *rows,
        "",
        f"After / before: **{ratio:.2f}** (target <= 0.33: {'met' if ratio <= 1 / 3 else 'not met'}). "
        f"results.json and generated texts: {'identical' if same else 'NOT identical'} "
        f"({'; '.join(x.strip() for x in r['comparison'][:2])}){_rounding_only(r['comparison'])}.",
        *(["", f"The earlier commit run a second time (`--repeat-before`), against its first run: "
                   f"{'; '.join(x.strip() for x in r['before_repeat'][:2])}{_rounding_only(r['before_repeat'])}: "
                   f"the earlier code's own results.json moves in the last place of a float from one run to the next."]
          if r.get("before_repeat") else []),
    ]), run_date=r["date"])  # fmt: skip


def _rounding_only(lines: list[str]) -> str:
    """A note when every value that differs is a number within a few units of the last place of the other's."""
    m = re.match(r"results.json: \d+ values, \d+ equal, (\d+) differ", lines[0]) if lines else None
    n = re.match(r"\s*(\d+) of them numbers, largest relative difference (\S+)", lines[1]) if len(lines) > 1 else None
    texts = next((x for x in lines if x.startswith("generated texts:")), "")
    t = re.match(r"generated texts: (\d+) and (\d+), (\d+) in both, (\d+) equal", texts)
    if m and n and t and m.group(1) == n.group(1) and float(n.group(2)) <= 1e-15 and len(set(t.groups())) == 1:
        return (": every value that differs is a number, the two runs' within a relative 1e-15 of each other "
                "(the last place of a float), and every generated text is the same")
    return ""


if __name__ == "__main__":
    main()
