"""Benchmark: advancing every slot's blocking automaton by one token (the decode step's blocking work).

On the H200 blocking took 7.4-7.9% of a 256-slot decode step (target <= 5%), for automata of depth ~19
(1,000 private values a row): the step is a CUDA graph of small kernels, and advancing the automaton followed
failure links one lookup at a time, ~10 kernels per link, depth + 1 links. ``BanTables.advance`` now gathers
the failure chain (one small gather per link) and looks every link's edge up in one batched search. This
compares, in one run on the CPU, that against the link-by-link loop it replaced (kept here as the reference,
and checked to give the same states), on random automata of the same depth, per call; and the mask step
(``BanTables.mask``) beside them for scale. On a GPU the figure that counts is the blocking share of
``benchmarks/engine.py``; this is the CPU's view of the same op count.

    .venv/bin/python benchmarks/ban_advance.py      # ~1 min; docs/benchmarks/ban_advance.json + docs/benchmarks.md
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/ban_advance.py"


def loop_advance(tabs, tokens):  # type: ignore[no-untyped-def]
    """The link-by-link advance ``BanTables.advance`` used until 2026-11-26 (the reference)."""
    import torch

    q = tabs.state
    nxt = torch.zeros_like(q)
    found = torch.zeros_like(q, dtype=torch.bool)
    cap = tabs.edge_keys.shape[1] - 1
    tok = tokens.to(torch.int64)
    for _ in range(tabs.depth + 1):
        key = (q * tabs.vocab + tok)[:, None]
        pos = torch.searchsorted(tabs.edge_keys, key).clamp(max=cap)
        hit = (tabs.edge_keys.gather(1, pos) == key)[:, 0]
        child = tabs.edge_next.gather(1, pos)[:, 0]
        nxt = torch.where(hit & ~found, child, nxt)
        found = found | hit
        q = tabs.fail.gather(1, q[:, None])[:, 0]
    return nxt


def main() -> None:
    import torch
    from engine import _commit

    from ctrlgen.generation.logits.automaton import BanTables, compile_banned

    torch.set_num_threads(1)
    rng = random.Random(0)
    vocab, slots, calls = 49152, 64, 300
    tabs = BanTables(slots, vocab, "cpu")
    for r in range(slots):
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 19))] for _ in range(2000)]
        tabs.load(r, compile_banned(seqs, vocab), [])
    # same states, step after step, on a walk that follows the automata (tokens of the banned sequences)
    ref = BanTables(slots, vocab, "cpu")
    ref.__dict__.update({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in tabs.__dict__.items()})
    for _ in range(50):
        tok = torch.where(torch.rand(slots) < 0.8, tabs.edge_keys[:, 0] % vocab, torch.randint(0, vocab, (slots,)))
        want = loop_advance(ref, tok)
        ref.state.copy_(want)
        tabs.advance(tok)
        assert torch.equal(tabs.state, want)
    tokens = torch.randint(0, vocab, (slots,))

    def per_call(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    loop_s = per_call(lambda: loop_advance(tabs, tokens))
    batched_s = per_call(lambda: tabs.advance(tokens))
    mask_s = per_call(tabs.mask)
    r = {"command": COMMAND, "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "slots": slots,
         "depth": tabs.depth, "vocab": vocab, "loop_s": loop_s, "batched_s": batched_s, "mask_s": mask_s,
         "speedup": loop_s / batched_s}  # fmt: skip
    out = ROOT / "docs" / "benchmarks" / "ban_advance.json"
    out.write_text(json.dumps(r, indent=1) + "\n")
    write_section("Generation engine: blocking step", "\n".join([
        f"Command: `{COMMAND}` at {r['commit']} (CPU, one thread). {slots} slots, random automata of depth "
        f"{r['depth']} (2,000 sequences of 1-19 tokens a row), vocabulary {vocab:,}; the two advances give the "
        "same states over 50 steps (checked in the run).",
        "",
        "| per call | link-by-link advance (the reference) | batched chain lookup (`BanTables.advance`) | ratio | "
        "`BanTables.mask` |",
        "|---|---|---|---|---|",
        f"| ms | {loop_s * 1e3:.3f} | {batched_s * 1e3:.3f} | **{r['speedup']:.1f}x** | {mask_s * 1e3:.3f} |",
        "",
        "On a GPU the figure the target (<= 5%) is about is the blocking share of a decode step "
        "(`benchmarks/engine.py`): `Generation engine: GPU`.",
    ]))  # fmt: skip
    print(f"[ban_advance] loop {loop_s * 1e3:.3f} ms, batched {batched_s * 1e3:.3f} ms; wrote {out}", flush=True)


if __name__ == "__main__":
    main()
