"""Benchmark: prefix tuning of SmolLM2, one run, comparisons as ratios. Writes docs/benchmarks.md.

1. Step time of masked vs plain prefix tuning, in one process (no Ray), same batch of
   real PhysioNet (code -> note) examples, same threads: the masked loss adds one
   no-grad forward of the base model and two vocabulary-wide terms (target <= 1.6x).
2. The Ray Train + DeepSpeed ZeRO-2 job (`ctrlgen train`) with 1 and 2 CPU workers
   (1 torch thread each), masked, and plain with 2 workers: tokens/s and step time
   (first step excluded), cluster start-up and DeepSpeed set-up excluded.

    .venv/bin/python benchmarks/train.py            # ~8 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import write_section

from ctrlgen.codes import build_control_code, format_control_code
from ctrlgen.config import PhysionetCorpusConfig, TrainingConfig, load_config
from ctrlgen.corpora import load_corpus
from ctrlgen.models import load_causal_lm
from ctrlgen.schema import select_private
from ctrlgen.training import LossWeights
from ctrlgen.training.data import collate, encode_example
from ctrlgen.training.prefix import batch_loss, init_prefix_from_text, prefix_model

COMMAND = ".venv/bin/python benchmarks/train.py"
PHYSIONET = Path(__file__).resolve().parents[2] / "shared" / "data" / "physionet-deid"


def _batch(tok: object, n: int, max_tokens: int) -> dict[str, torch.Tensor]:
    docs, _, _ = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))
    exs = []
    for d in docs:
        private = select_private(d.entities, "direct+quasi")
        if not private:
            continue
        code = format_control_code(build_control_code(private))
        exs.append(encode_example(code, d.text, [(e.start, e.end) for e in private], tok, max_tokens))
        if len(exs) == n:
            break
    return collate([e.input_ids for e in exs], [e.labels for e in exs], [e.private for e in exs], tok.pad_token_id)  # type: ignore[attr-defined]


def step_times(steps: int, batch_size: int, max_tokens: int) -> tuple[str, float]:
    base, tok = load_causal_lm("smollm2-135m")
    batch = _batch(tok, batch_size, max_tokens)
    model = prefix_model(base, 20)
    init_prefix_from_text(model, tok)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    times: dict[str, list[float]] = {"plain": [], "masked": []}
    weights = {"plain": LossWeights(1, 0, 0), "masked": LossWeights()}
    for i in range(steps + 1):
        for variant in ("plain", "masked"):  # interleaved: drift hits both alike
            t0 = time.perf_counter()
            terms = batch_loss(model, batch, weights[variant])
            opt.zero_grad()
            terms.total.backward()
            opt.step()
            if i > 0:  # the first round warms up
                times[variant].append(time.perf_counter() - t0)
    tokens = int(batch["attention_mask"].sum())
    p, m = statistics.median(times["plain"]), statistics.median(times["masked"])
    rows = [
        f"Batch of {batch_size} PhysioNet notes, {tokens} tokens (code prompt + note, cut at {max_tokens} note "
        f"tokens), 20 virtual tokens, {torch.get_num_threads()} torch threads, median of {steps} steps each "
        "(interleaved), with the train workers' allocator settings (`training.worker_env`).",
        "",
        "| variant | s / step | tokens / s | vs plain |",
        "|---|---|---|---|",
        f"| plain prefix tuning (L_LM) | {p:.2f} | {tokens / p:.0f} | 1.00x |",
        f"| masked (L_LM + L_contrastive + L_KL, base forward) | {m:.2f} | {tokens / m:.0f} | {m / p:.2f}x |",
    ]
    return "\n".join(rows), m / p


def workers(steps: int) -> str:
    from ray_jobs.extract import run as run_extract
    from ray_jobs.train import run as run_train

    tmp = Path(tempfile.mkdtemp(prefix="ctrlgen-bench-train-"))
    base = [f"output_dir={tmp / 'extract'}", f"corpus.path={PHYSIONET}"]
    cfg = load_config("configs/train_physionet.yaml", base)
    extracted = run_extract(cfg).output
    runs = [("masked", 1), ("masked", 2), ("plain", 2)]
    res = {}
    for variant, n in runs:
        over = [
            *base, f"output_dir={tmp / f'{variant}-{n}'}", f"training.input={extracted}", f"training.variant={variant}",
            f"training.num_workers={n}", f"training.max_steps={steps}", "training.resume=false", "training.num_documents=64",
            f"training.checkpoint_every={steps}",
        ]  # fmt: skip
        s = run_train(load_config("configs/train_physionet.yaml", over))
        res[(variant, n)] = s
        print(f"{variant} x {n}: {s.mean_step_seconds:.2f} s/step, {s.mean_tokens_per_s:.0f} tokens/s", flush=True)
    one, two, plain = res[("masked", 1)], res[("masked", 2)], res[("plain", 2)]
    rows = [
        f"`ctrlgen train -c configs/train_physionet.yaml` with {steps} steps per run, 2 notes per worker per step "
        "(256 note tokens at most), 0.5 logical CPU and 1 torch thread per worker, DeepSpeed ZeRO-2 on gloo. "
        "Mean over the steps after the first.",
        "",
        "| variant | workers | s / step | tokens / s | tokens/s vs 1 worker |",
        "|---|---|---|---|---|",
        f"| masked | 1 | {one.mean_step_seconds:.2f} | {one.mean_tokens_per_s:.0f} | 1.00x |",
        f"| masked | 2 | {two.mean_step_seconds:.2f} | {two.mean_tokens_per_s:.0f} | "
        f"{two.mean_tokens_per_s / one.mean_tokens_per_s:.2f}x |",
        f"| plain | 2 | {plain.mean_step_seconds:.2f} | {plain.mean_tokens_per_s:.0f} | "
        f"{plain.mean_tokens_per_s / one.mean_tokens_per_s:.2f}x |",
        "",
        f"Masked vs plain in the 2-worker job: {two.mean_step_seconds / plain.mean_step_seconds:.2f}x step time "
        "(same examples in the same order in both runs).",
    ]
    return "\n".join(rows)


def with_worker_env() -> None:
    """Re-run this process with the train workers' allocator settings (glibc reads them at start)."""
    env = TrainingConfig().worker_env
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; does not write docs/benchmarks.md")
    args = ap.parse_args()
    with_worker_env()
    torch.manual_seed(0)
    if args.quick:
        print(step_times(2, 2, 64)[0])
        return
    steps_table, _ = step_times(6, 4, 256)
    print(steps_table, flush=True)
    jobs = workers(8)
    write_section(
        "Prefix tuning: masked vs plain, 1 vs 2 Ray Train workers",
        f"Command: `{COMMAND}` (SmolLM2-135M, CPU).\n\n### Step time, masked vs plain (one process)\n\n"
        f"{steps_table}\n\n### The Ray Train job, 1 vs 2 workers\n\n{jobs}",
    )
    print("written to docs/benchmarks.md")


if __name__ == "__main__":
    main()
