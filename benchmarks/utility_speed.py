"""The experiment's downstream-perplexity utility (fine-tune a fresh model on a cell's outputs, perplexity on
real test notes) in float32 vs under bf16 autocast (``experiment.utility_autocast``), in one run.

    .venv/bin/python benchmarks/utility_speed.py [--texts 16] [--test 16] [--repeats 2] [--threads 2]

SmolLM2-135M, PhysioNet notes standing in for a cell's outputs (``--texts``) and for the real test notes
(``--test``), the compare config's settings (2 epochs, 192 tokens, batch 4, lr 5e-5). Each repeat runs
both precisions, alternating, on a freshly loaded model; reported: median seconds of the fine-tuning and
of the perplexity pass, the perplexities, and the base model's perplexity both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from _report import write_section  # noqa: E402
from generate import physionet_code_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--test", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 texts, 1 repeat, no doc written")
    args = ap.parse_args()
    if args.quick:
        args.texts, args.test, args.repeats = 4, 4, 1
    import torch

    from ctrlgen.config import ModelConfig
    from ctrlgen.metrics.utility import finetune_lm, perplexity
    from ctrlgen.models import load_causal_lm

    def _precision(autocast: str | None) -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

    torch.set_num_threads(args.threads)
    texts = [r["text"] for r in physionet_code_rows()]
    random.Random(0).shuffle(texts)
    train, test = texts[: args.texts], texts[args.texts : args.texts + args.test]
    modes = {"float32": None, "bf16 autocast": "bfloat16"}
    times: dict[str, dict[str, list[float]]] = {m: {"ft": [], "ppl": []} for m in modes}
    ppl: dict[str, float] = {}
    base: dict[str, float] = {}
    after_same: dict[str, float] = {}  # after the fine-tuning, the pass in the fine-tuning's precision
    for rep in range(args.repeats):
        for label, autocast in modes.items():
            model, tok = load_causal_lm(ModelConfig(name="smollm2-135m"))
            if rep == 0:  # the perplexity pass itself, both ways (the experiment keeps it float32)
                with _precision(autocast):
                    base[label] = perplexity(model, tok, test, 192)
            t0 = time.perf_counter()
            finetune_lm(model, tok, train, epochs=2, learning_rate=5e-5, max_tokens=192, seed=0, autocast=autocast)
            t1 = time.perf_counter()
            ppl[label] = perplexity(model, tok, test, 192)
            t2 = time.perf_counter()
            if rep == 0:
                with _precision(autocast):
                    after_same[label] = perplexity(model, tok, test, 192)
            times[label]["ft"].append(t1 - t0)
            times[label]["ppl"].append(t2 - t1)
            print(f"[bench utility] {label} repeat {rep}: fine-tune {t1 - t0:.1f} s, perplexity {t2 - t1:.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    med = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()}
    f32, b16 = med["float32"], med["bf16 autocast"]
    rows = "\n".join(
        f"| {m} | {med[m]['ft']:.1f} | {med[m]['ppl']:.1f} | {ppl[m]:.2f} | {after_same[m]:.2f} | {base[m]:.2f} |"
        for m in modes
    )
    moved = {m: base["float32"] - ppl[m] for m in modes}
    body = f"""Command: `.venv/bin/python benchmarks/utility_speed.py` (SmolLM2-135M, {args.threads} torch threads, {len(train)}
PhysioNet notes fine-tuned on for 2 epochs at 192 tokens, batch 4, lr 5e-5; perplexity on {len(test)} others;
medians of {args.repeats} alternating repeats, a fresh model each time). This is what every cell of
`ctrlgen experiment` pays for its downstream perplexity; `experiment.utility_autocast: bfloat16` runs the
fine-tuning (not the perplexity pass) under bf16 autocast.

| fine-tuning precision | fine-tune s | perplexity pass s (float32) | perplexity after (float32 pass) | perplexity after, pass in the same precision | base model, pass in that precision |
|---|---|---|---|---|---|
{rows}

Fine-tuning under bf16 autocast is **{f32["ft"] / b16["ft"]:.2f}x** faster. Measured with the float32 pass the
experiment uses, the fine-tuning moves perplexity by {moved["bf16 autocast"]:.1f} (autocast) vs
{moved["float32"]:.1f} (float32) from the base model's {base["float32"]:.2f}: the float32 master weights and AdamW
state take the same updates. A bf16 pass would round the fine-tuned weights (at lr 5e-5 a few steps move
them by about bf16's resolution) and report {after_same["bf16 autocast"]:.2f} instead of {ppl["bf16 autocast"]:.2f} (column 5), so
the pass stays float32. The speed-up needs a CPU with AVX512-BF16 or AMX (this one has AVX512-BF16);
elsewhere leave the option unset.
"""
    if args.quick:
        print(body)
    else:
        write_section("Downstream perplexity: float32 vs bf16 autocast", body)
        print(body)


if __name__ == "__main__":
    main()
