"""The test suite's wall time and its slowest tests, from the logs of `make test` runs (issue 39, item 4).

Reads pytest's session output (the part of a `make test` log from "test session starts": per-file progress,
``--durations=25``, the summary line) of each log given, and writes docs/benchmarks/suite.json and the section
"Test suite: time and slowest tests" of docs/benchmarks.md. The logs are kept under docs/benchmarks/suite/ so
the section can be rendered again from the repository:

    bash .ci/run 2>&1 | tee ci.log                         # or `make test` in a clone without ../shared
    .venv/bin/python benchmarks/suite_time.py docs/benchmarks/suite/ci_2026-11-26.log:"CI, clone with ../shared" ...
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _report import write_section  # noqa: E402

_SUMMARY = re.compile(r"=+ (.+?) in ([\d.]+)s \(([\d:]+)\) =+")
_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$")
TARGET_S = 30 * 60


def parse(path: Path) -> dict:
    text = path.read_text(errors="replace")
    m = list(_SUMMARY.finditer(text))
    if not m:
        raise SystemExit(f"{path}: no pytest summary line (a finished `make test` log is needed)")
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", m[-1].group(1)))
    matches = (_DURATION.match(line.strip()) for line in text.splitlines())
    slow = [(float(d.group(1)), d.group(2), d.group(3)) for d in matches if d]
    by_file: dict[str, float] = {}
    for secs, _, test in slow:
        f = test.split("::")[0]
        by_file[f] = by_file.get(f, 0.0) + secs
    return {"log": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path), "seconds": float(m[-1].group(2)),
            "counts": counts, "slowest": slow, "slowest_by_file": by_file}  # fmt: skip


def main() -> None:
    runs = []
    for arg in sys.argv[1:]:
        path, _, label = arg.partition(":")
        runs.append({"label": label or path, **parse(ROOT / path if not Path(path).is_absolute() else Path(path))})
    if not runs:
        raise SystemExit("usage: suite_time.py LOG[:label] ...")
    (ROOT / "docs" / "benchmarks" / "suite.json").write_text(json.dumps(runs, indent=1) + "\n")
    lines = [
        "Command: `.venv/bin/python benchmarks/suite_time.py " + " ".join(f'"{a}"' for a in sys.argv[1:]) + "` "
        "(pytest's own timings from the logs kept beside it). Target (issue 39): `make test` from a clean clone "
        "within 30 minutes on a typical run of this kind of machine; it is about the whole suite (a run that skips "
        "tests counts only as that run).",
        "",
        "| run | tests | wall time of the tests | <= 30 min | slowest test |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        c = r["counts"]
        top = r["slowest"][0] if r["slowest"] else None
        lines.append(
            f"| {r['label']} (`{r['log']}`) | {c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped"
            + (f", {c['failed']} failed" if c.get("failed") else "")
            + f" | {r['seconds'] / 60:.1f} min | {'met' if r['seconds'] <= TARGET_S else '**not met**'} | "
            + (f"`{top[2].split('::')[-1]}` {top[0]:.0f} s" if top else "-")
            + " |"
        )
    first = runs[0]
    lines += ["", f"Slowest tests of the first run ({first['label']}), pytest's `--durations=25`:", "",
              "| seconds | share of the run | test |", "|---|---|---|"]  # fmt: skip
    for secs, kind, test in first["slowest"][:15]:
        lines.append(
            f"| {secs:.0f} | {secs / first['seconds'] * 100:.1f}% | `{test}`"
            + (f" ({kind})" if kind != "call" else "")
            + " |"
        )
    write_section("Test suite: time and slowest tests", "\n".join(lines))
    print("rendered Test suite: time and slowest tests", flush=True)


if __name__ == "__main__":
    main()
