"""The CPU's matrix products as the transformer NER runs them: float32 against bf16, one thread (issue 41, item 3).

The transformer engine's float32 speed differs ~3x between the machines this project runs on (22 notes/s on an Intel
Xeon in docs/extraction_transformer.md, 6.9 on an AMD Zen 5 in the ner_dtype section). Nearly all of its time is
the encoder's linear layers: products of a batch's word pieces (up to 8 windows x 256 pieces) with MiniLM's weight
matrices (384 x 384, 384 x 1536, 1536 x 384). This script times exactly those products with torch on one thread,
float32 (torch's BLAS, named below) and bf16 (oneDNN), best of 5 rounds, and prints the GFLOP/s, so that a run on
each CPU says which part of the difference is the BLAS library's speed on that CPU.

Writes docs/benchmarks/cpu_matmul.json and the section "Entity extraction: the CPU's matrix products (float32 vs
bf16)" of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/cpu_matmul.py            # ~1 min
    .venv/bin/python benchmarks/cpu_matmul.py --render
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402
from ner_threshold import provenance  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "cpu_matmul.json"
TITLE = "Entity extraction: the CPU's matrix products (float32 vs bf16)"
ROWS = 8 * 256  # a batch of 8 windows of 256 word pieces
SHAPES = ((384, 384), (1536, 384), (384, 1536))  # MiniLM's attention, feed-forward in and out (out x in)


def measure(rounds: int = 5) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blas = next((line.strip() for line in torch.__config__.show().splitlines() if "BLAS_INFO" in line), "")
    blas = blas.split("BLAS_INFO=")[1].split(",")[0] if "BLAS_INFO=" in blas else "?"
    out: list[dict[str, Any]] = []
    for n_out, n_in in SHAPES:
        x32, w32 = torch.randn(ROWS, n_in), torch.randn(n_out, n_in)
        row: dict[str, Any] = {"shape": f"{ROWS} x {n_in} . {n_in} x {n_out}"}
        for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            x, w = x32.to(dt), w32.to(dt)
            torch.nn.functional.linear(x, w)  # warm
            best = float("inf")
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(5):
                    torch.nn.functional.linear(x, w)
                best = min(best, (time.perf_counter() - t0) / 5)
            row[name] = round(2 * ROWS * n_in * n_out / best / 1e9, 1)
        out.append(row)
        print(f"[cpu_matmul] {row}", file=sys.stderr, flush=True)
    return {**provenance("cpu_matmul.py", []), "cpu": cpu_name(isa=True), "torch": torch.__version__, "blas": blas,
            "capability": torch.backends.cpu.get_cpu_capability(), "rows": out}  # fmt: skip


def report(r: dict[str, Any]) -> str:
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/cpu_matmul.json). "
        f"{r['cpu']}; torch {r['torch']} (float32 products on its BLAS, {r['blas']}; CPU capability "
        f"{r['capability']}); one thread, best of 5 rounds of 5 products. GFLOP/s of the transformer NER's linear "
        "layers on a batch of 8 windows of 256 word pieces:",
        "",
        "| product | float32 GFLOP/s | bfloat16 GFLOP/s | bf16 / float32 |",
        "|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['shape']} | {row['float32']} | {row['bfloat16']} | {row['bfloat16'] / row['float32']:.1f}x |")
    lines += [
        "",
        "A run on another CPU replaces this one (git keeps the earlier ones): compare it with the ner_dtype section's "
        "notes/s on the same CPU.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure())


if __name__ == "__main__":
    main()
