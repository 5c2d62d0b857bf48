"""Benchmark: the experiment's ICL generation (icl + icl_blocking for the same targets), engine options compared
in one run as ratios to today's way (one engine call per mode, fp32, transformers' dynamic cache).

The workload is the real ICL stage (``ctrlgen.generation.icl.generate_rows``) on PhysioNet notes with SmolLM2-135M:
``--targets`` target notes, 3 contexts cut to 256 tokens each, 128 new tokens, batch 16, per-row seeds, gate off
(as ``configs/experiment_physionet.yaml``). Variants:

* **per-mode calls** (before): icl, then icl_blocking, each its own engine call;
* **modes in one call + shared prefill**: both modes' requests in one call; a target's two rows share one
  prompt, whose keys/values are computed once;
* the same with a **static** key/value cache (``cache_implementation="static"``) instead of the shared prefill;
* **bf16** weights (the CPU here has AVX512-BF16) with the shared prefill;
* the **top-k sampler**: top-p drawn among the 256 most likely tokens when they hold the nucleus (before: a sort
  of the whole 49k vocabulary per row and step);
* **eager attention for the decoding steps** (``HFEngine.decode_attention``; the prefill keeps SDPA): torch's
  SDPA on CPU decodes one query over a long cache slower than the plain matmuls.

Rows before the sampler row run with the full sort (``RowSampler.TOP_K`` above the vocabulary).

Tokens/s counts generated tokens over wall time including prefill. Writes the "Generation speed" section
of docs/benchmarks.md.

    .venv/bin/python benchmarks/generate_speed.py            # about 10 minutes here
    .venv/bin/python benchmarks/generate_speed.py --quick    # smaller, to check it runs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _report import write_section  # noqa: E402
from generate import physionet_code_rows  # noqa: E402

from ctrlgen.config import GenerationConfig, ModelConfig, SamplingConfig  # noqa: E402
from ctrlgen.fictional import FictionalCodes  # noqa: E402
from ctrlgen.generation import HFEngine  # noqa: E402
from ctrlgen.generation.engine import RowSampler  # noqa: E402
from ctrlgen.generation.icl import build_pool, generate_rows  # noqa: E402
from ctrlgen.models import load_causal_lm  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/generate_speed.py"


def _rows(n_pool: int, n_targets: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows = physionet_code_rows()
    return rows[:n_pool], rows[n_pool : n_pool + n_targets]


def _run(engine: HFEngine, tok: Any, pool: Any, targets: list[dict[str, Any]], cfg: GenerationConfig,
         fict: FictionalCodes, per_mode: bool) -> tuple[float, int, list[str]]:  # fmt: skip
    t0 = time.perf_counter()
    if per_mode:
        tables = [generate_rows(targets, pool, engine, tok, cfg.model_copy(update={"modes": [m]}), fict)
                  for m in cfg.modes]  # fmt: skip
    else:
        tables = [generate_rows(targets, pool, engine, tok, cfg, fict)]
    secs = time.perf_counter() - t0
    rows = [r for t in tables for r in t.to_pylist()]
    rows.sort(key=lambda r: (r["mode"], r["doc_id"]))
    return secs, sum(r["new_tokens"] or 0 for r in rows), [r["text"] or "" for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; does not write docs/benchmarks.md")
    ap.add_argument("--targets", type=int, default=16)
    args = ap.parse_args()
    n_targets = 4 if args.quick else args.targets
    new_tokens = 16 if args.quick else 128
    torch.set_num_threads(2)
    cfg = GenerationConfig(modes=["icl", "icl_blocking"], max_context_tokens=256, batch_size=16,
                           sampling=SamplingConfig(max_new_tokens=new_tokens), gate={"enabled": False})  # fmt: skip
    model, tok = load_causal_lm(ModelConfig(name="smollm2-135m"))
    pool_rows, targets = _rows(64, n_targets)
    pool = build_pool(pool_rows, tok, cfg.max_context_tokens)
    fict = FictionalCodes(0, [v for c in pool for v in c.values])

    def engine(m: Any, **kw: Any) -> HFEngine:
        return HFEngine(m, tok, cfg.sampling, cfg.batch_size, **kw)

    full = 10**9  # RowSampler.TOP_K above the vocabulary: topk over all of it, the full sort of before
    off = {"decode_attention": None}
    variants: list[tuple[str, Any, bool, int]] = [
        ("per-mode calls, fp32, dynamic cache (before)", lambda: engine(model, share_prefill=False, **off), True, full),
        ("modes in one call + shared prefill, fp32", lambda: engine(model, **off), False, full),
        (
            "modes in one call, static cache, fp32",
            lambda: engine(model, share_prefill=False, cache_implementation="static", **off),
            False,
            full,
        ),
    ]
    bf16 = load_causal_lm(ModelConfig(name="smollm2-135m", dtype="bfloat16"))[0]
    variants += [
        ("modes in one call + shared prefill, bf16", lambda: engine(bf16, **off), False, full),
        ("the same + top-k sampler (now)", lambda: engine(bf16, **off), False, RowSampler.TOP_K),
        ("the same + eager attention for decoding (not adopted)", lambda: engine(bf16, decode_attention="eager"), False,
         RowSampler.TOP_K),
    ]  # fmt: skip
    top_k = RowSampler.TOP_K
    _run(engine(model), tok, pool, targets[:2], cfg, fict, False)  # warm-up (allocator, kernels)
    results = []
    texts: dict[str, list[str]] = {}
    for name, make, per_mode, k in variants:
        RowSampler.TOP_K = k
        secs, toks, outs = _run(make(), tok, pool, targets, cfg, fict, per_mode)
        texts[name] = outs
        results.append((name, secs, toks))
        print(f"[generate_speed] {name}: {toks} tokens in {secs:.1f} s = {toks / secs:.1f} tokens/s", flush=True)
    RowSampler.TOP_K = top_k
    base = results[0][2] / results[0][1]
    names = [v[0] for v in variants]

    def same(a: int, b: int) -> int:
        return sum(x == y for x, y in zip(texts[names[a]], texts[names[b]], strict=True))

    n_out = len(texts[names[0]])
    lines = [
        f"{n_targets} PhysioNet targets x (icl, icl_blocking) = {2 * n_targets} outputs, 3 contexts of at most "
        f"256 tokens each, {new_tokens} new tokens at most (ICL stop strings on), batch {cfg.batch_size}, "
        "temperature 0.7, top-p 0.9, per-row seeds, 2 torch threads; the real ICL stage (`generate_rows`).",
        "",
        "| engine | seconds | generated tokens | tokens/s | vs before |",
        "|---|---|---|---|---|",
        *(f"| {n} | {s:.1f} | {t} | {t / s:.1f} | {t / s / base:.2f}x |" for n, s, t in results),
        "",
        f"Outputs identical to before with the shared prefill (fp32): {same(0, 1)}/{n_out} (same seeds; a shared "
        "prefill computes the prompt in a smaller batch, which can change the last bits of a logit). bf16 changes "
        "the numbers, so its texts differ; tokens/s normalises for length. The top-k sampler draws from the same "
        f"nucleus (it sorts the whole vocabulary for a row whose top {top_k} tokens hold less than top-p of the "
        f"mass): identical to the full sort in {same(3, 4)}/{n_out} outputs (tied logits, common in bf16, may be "
        "ordered differently by topk and sort, which moves a draw). Eager attention for the decoding steps (the "
        f"prompt's prefill stays SDPA) computes the same attention in another order: {same(4, 5)}/{n_out} "
        "outputs identical.",
    ]
    body = "\n".join(lines)
    print(body, flush=True)
    if args.quick:
        return
    write_section("Generation speed: shared prefill, static cache, bf16",
                  f"Command: `{COMMAND}` (SmolLM2-135M, CPU).\n\n{body}")  # fmt: skip
    print("written to docs/benchmarks.md")


if __name__ == "__main__":
    main()
