"""Canary exposure scoring: one prompt pass shared by every candidate vs the full sequence per candidate.

    .venv/bin/python benchmarks/exposure_speed.py [--candidates 127] [--threads 2]

The experiment scores each canary against ``canary_candidates`` other secrets, every one behind the
control-code prompt of the canary's host (``ctrlgen.metrics.canary.canary_prompt``). Here: SmolLM2-135M,
a canary planted into a PhysioNet note, its host's prompt, the candidates scored both ways in one run
(``sequence_nll(share_prompt=False)`` then ``True``, batch 32); the ratio of wall times, the largest NLL
difference and whether the canary's rank is the same.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from _report import write_section  # noqa: E402
from generate import physionet_code_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=127)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="31 candidates, no doc written")
    args = ap.parse_args()
    if args.quick:
        args.candidates = 31
    import torch

    from ctrlgen.config import ModelConfig
    from ctrlgen.metrics.canary import canary_prompt, candidate_texts, insert_canaries, make_canaries
    from ctrlgen.metrics.utility import sequence_nll
    from ctrlgen.models import load_causal_lm

    torch.set_num_threads(args.threads)
    model, tok = load_causal_lm(ModelConfig(name="smollm2-135m"))
    [canary] = make_canaries(1, seed=0)
    planted = insert_canaries(physionet_code_rows()[:8], [canary], seed=0)
    prompt = canary_prompt(planted, canary)
    texts = candidate_texts(canary, args.candidates, seed=0)
    prompt_tokens = len(tok(prompt)["input_ids"])
    res = {}
    for share in (False, True):
        t0 = time.perf_counter()
        scores = sequence_nll(model, tok, texts, max_tokens=512, batch_size=32, prompts=[prompt] * len(texts),
                              share_prompt=share)  # fmt: skip
        res[share] = (time.perf_counter() - t0, [s for s, _ in scores])
        print(f"[bench exposure] share_prompt={share}: {res[share][0]:.1f} s", file=sys.stderr, flush=True)
    diff = max(abs(a - b) for a, b in zip(res[False][1], res[True][1], strict=True))

    def rank(s: list[float]) -> int:
        return 1 + sum(1 for x in s[1:] if x <= s[0])

    body = f"""Command: `.venv/bin/python benchmarks/exposure_speed.py` (SmolLM2-135M, fp32, {args.threads} torch threads,
one canary planted into PhysioNet notes, its host's control-code prompt of {prompt_tokens} tokens, {len(texts)}
candidate sentences of about {len(tok(texts[0], add_special_tokens=False)["input_ids"])} tokens, batch 32).

| scoring | seconds | candidates/s |
|---|---|---|
| full sequence per candidate (before) | {res[False][0]:.1f} | {len(texts) / res[False][0]:.1f} |
| one prompt pass, cache copied to the candidates (now) | {res[True][0]:.1f} | {len(texts) / res[True][0]:.1f} |

Speed-up **{res[False][0] / res[True][0]:.1f}x**; largest NLL difference {diff:.2e} nats; canary rank
{rank(res[False][1])} both ways: {rank(res[False][1]) == rank(res[True][1])}. The experiment scores
`canaries x (canary_candidates + 1)` candidates per adapter, so this is its exposure cost.
"""
    if args.quick:
        print(body)
    else:
        write_section("Canary exposure scoring: shared prompt pass", body)
        print(body)


if __name__ == "__main__":
    main()
