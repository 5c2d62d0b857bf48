"""Benchmark: the fast engine vs the reference engine vs transformers' ``generate(bad_words_ids=...)``.

One run, ratios within the run, every figure written to a JSON file (``--out``); the section of
docs/benchmarks.md for the device is rendered from that JSON by ``benchmarks/render_engine.py`` (called at
the end unless ``--no-write``).

Workload (issue 36): ICL prompts of 3 PhysioNet contexts cut to 256 tokens each + a fictional code, every
row banning ``--values`` private values (1,000: about 10,000 banned sequences with casing, leading-space and
reader variants; rows get different values), ``--new-tokens`` new tokens (EOS and stop strings off: every
row generates all of them), temperature 0.7, top-p 0.9, per-row seeds, at each slot count of ``--slots``:

* **tokens/s** of the whole call (prefill included) for the fast engine (``slots`` = S), the reference
  engine (``batch_size`` = S) and transformers' ``generate`` with ``bad_words_ids`` (one shared list: it
  cannot take one per row; row 0's sequences for every row, the same count);
* **per-step time** of the fast engine's decode step with S rows in their slots (decode only, measured over
  ``--steps`` steps after prefill) and the share of it spent on blocking (the same step with no banned
  sequences);
* **8 prefix adapters in one batch vs one**: S rows split over 8 random PEFT prefix adapters (20 virtual
  tokens) vs all on one, decode time per step;
* **roofline**: bytes a decode step must read (weights + every row's keys/values up to its length) over the
  device's memory bandwidth (measured here with a large copy; a GPU's datasheet figure beside it);
* the **ICL stage** of the experiment (``generate_rows``, icl + icl_blocking, 128 new tokens with stop
  strings, bf16) with the reference engine (today's) and the fast engine: the CPU target is >= 1.5x.

    .venv/bin/python benchmarks/engine.py                 # CPU here: slots 1,16,64, 64 new tokens (~25 min)
    .venv/bin/python benchmarks/engine.py --quick         # a few minutes: checks it runs
    python benchmarks/engine.py --device cuda --slots 1,16,64,256 --new-tokens 400 --out OUT/engine_cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from ctrlgen.config import GenerationConfig, ModelConfig, SamplingConfig  # noqa: E402
from ctrlgen.generation.blocking import banned_sequences  # noqa: E402
from ctrlgen.generation.engines.fast import FastEngine  # noqa: E402
from ctrlgen.generation.engines.hf import HFEngine  # noqa: E402
from ctrlgen.generation.types import GenerationRequest  # noqa: E402
from ctrlgen.models import load_causal_lm  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/engine.py"
#: Datasheet memory bandwidths (bytes/s) of devices the GPU run may meet, for the roofline's second column.
DATASHEET_BW = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def _log(msg: str) -> None:
    print(f"[engine bench] {msg}", file=sys.stderr, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _workload(tok: Any, n: int, values_per_row: int, ctx_tokens: int) -> tuple[list[str], list[tuple], list[str]]:
    """``n`` ICL prompts, ``n`` banned lists (``values_per_row`` values each), the value pool."""
    from generate import physionet_code_rows

    from ctrlgen.codes import format_control_code, parse_control_code
    from ctrlgen.fictional import FictionalCodes
    from ctrlgen.generation.icl import build_pool
    from ctrlgen.prompts import icl_prompt

    rows = physionet_code_rows()
    pool = build_pool(rows, tok, ctx_tokens)
    corpus_values = sorted({v for c in pool for v in c.values})
    fict = FictionalCodes(0, corpus_values)
    # Private values: the corpus' own, then fictional ones (names, dates, places, codes) up to the count.
    values = list(corpus_values)
    i = 0
    while len(values) < values_per_row * 2:
        code = fict.fictionalize(parse_control_code(pool[i % len(pool)].code_text), f"bench{i}")
        values += [v for vs in code.values() for v in vs] if isinstance(code, dict) else []
        i += 1
        if i > 100_000:
            break
    values = list(dict.fromkeys(values))
    prompts, banned = [], []
    per_value: dict[str, list[tuple[int, ...]]] = {}  # rows share values: each one's sequences tokenised once
    for k in range(n):
        ctx = [pool[(3 * k + j) % len(pool)] for j in range(3)]
        target = pool[(3 * k + 3) % len(pool)]
        fake = format_control_code(fict.fictionalize(parse_control_code(target.code_text), target.doc_id))
        prompts.append(icl_prompt([(c.code_text, c.text) for c in ctx], fake))
        start = (k * 97) % max(1, len(values) - values_per_row)
        row: dict[tuple[int, ...], None] = {}  # banned_sequences over the row's values: the same distinct sequences
        for v in values[start : start + values_per_row]:
            if v not in per_value:
                per_value[v] = [tuple(x) for x in banned_sequences(tok, [v])]
            row.update(dict.fromkeys(per_value[v]))
        banned.append(tuple(row))
    return prompts, banned, values


def _requests(prompts: list[str], banned: list[tuple], n: int, new_tokens: int, bans: bool = True,
              adapters: list[str | None] | None = None) -> list[GenerationRequest]:  # fmt: skip
    return [
        GenerationRequest(prompts[i], banned[i] if bans else (), seed=1000 + i, max_new_tokens=new_tokens,
                          adapter=(adapters[i % len(adapters)] if adapters else None))
        for i in range(n)
    ]  # fmt: skip


def _timed(fn: Any, device: torch.device) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _decode_step_seconds(engine: FastEngine, reqs: list[GenerationRequest], steps: int) -> tuple[float, dict]:
    """Seconds per decode step with ``reqs`` (at most ``engine.slots``) in their slots, after prefill; and the
    step's roofline inputs (key/value positions read)."""
    from ctrlgen.generation.engines.fast.engine import _Seq

    tok = engine.tokenizer
    enc = tok([r.prompt for r in reqs], add_special_tokens=False)["input_ids"]
    seqs = []
    for i, (r, ids) in enumerate(zip(reqs, enc, strict=True)):
        p_len = int(engine.adapters[r.adapter].shape[3]) if r.adapter else 0
        seqs.append(_Seq(i, r, list(ids), steps + 8, p_len, engine.compiled_now(r.banned)))
    engine._ensure_capacity(max(s.adapter_len + len(s.prompt) + steps + 8 for s in seqs), steps + 8)
    with torch.inference_mode():
        engine.active.zero_()
        for slot, s in enumerate(seqs):
            engine._admit(slot, s)
        kv_lens = []
        for s in seqs:
            s.steps = 0
        engine._step(engine._kv_len({i: s for i, s in enumerate(seqs)}))  # warm (and capture on CUDA)
        _sync(engine.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            for s in seqs:
                s.steps += 1
            kv = engine._kv_len({i: s for i, s in enumerate(seqs)})
            kv_lens.append(kv)
            engine._step(kv)
        _sync(engine.device)
        secs = (time.perf_counter() - t0) / steps
    mean_len = sum(s.adapter_len + len(s.prompt) for s in seqs) / len(seqs) + steps / 2
    return secs, {"rows": len(seqs), "mean_kv_positions": mean_len, "mean_kv_len_read": sum(kv_lens) / len(kv_lens)}


def _bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    n = (1 << 28) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        secs, _ = _timed(lambda: b.copy_(a), device)
        best = min(best, secs)
    return 2 * a.numel() * a.element_size() / best


def _transformers_generate(model: Any, tok: Any, prompts: list[str], banned: tuple, new_tokens: int,
                           sampling: SamplingConfig) -> Any:  # fmt: skip
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    torch.manual_seed(0)
    with torch.inference_mode():
        return model.generate(**enc, do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id,
                              bad_words_ids=[list(s) for s in banned] or None)  # fmt: skip


def _random_adapters(model: Any, n: int, virtual: int = 20) -> dict[str, Any]:
    from peft import PrefixTuningConfig, TaskType, get_peft_model

    from ctrlgen.generation.engines.fast.adapters import prefix_kv

    out = {}
    for i in range(n):
        torch.manual_seed(100 + i)
        pm = get_peft_model(model, PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=virtual),
                            adapter_name=f"a{i}")  # fmt: skip
        with torch.no_grad():
            for p in pm.prompt_encoder.parameters():
                p.normal_(0, 0.5)
        out[f"a{i}"] = prefix_kv(pm)
        model = pm.unload() if hasattr(pm, "unload") else pm.get_base_model()
    return out


def _icl_stage(model: Any, tok: Any, targets: int, device: torch.device) -> dict[str, Any]:
    """The experiment's ICL stage (icl + icl_blocking, generate_rows) with today's engine and the fast one."""
    from generate import physionet_code_rows

    from ctrlgen.fictional import FictionalCodes
    from ctrlgen.generation.icl import build_pool, generate_rows

    cfg = GenerationConfig(modes=["icl", "icl_blocking"], max_context_tokens=256, batch_size=16,
                           sampling=SamplingConfig(max_new_tokens=128), gate={"enabled": False})  # fmt: skip
    rows = physionet_code_rows()
    pool = build_pool(rows[:64], tok, 256)
    fict = FictionalCodes(0, [v for c in pool for v in c.values])
    tg = rows[64 : 64 + targets]
    out: dict[str, Any] = {"targets": targets, "outputs": 2 * targets, "new_tokens_max": 128, "batch": 16}

    def run(engine: Any, rows_: list[dict[str, Any]]) -> tuple[float, int]:
        secs, table = _timed(lambda: generate_rows(rows_, pool, engine, tok, cfg, fict), device)
        return secs, sum(r["new_tokens"] or 0 for r in table.to_pylist())

    for name, make in (("reference (today)", lambda: HFEngine(model, tok, cfg.sampling, cfg.batch_size)),
                       ("fast", lambda: FastEngine(model, tok, cfg.sampling, slots=cfg.batch_size))):  # fmt: skip
        eng = make()
        run(eng, rows[64 + targets : 64 + targets + 2])  # warm-up: allocator, kernels (and the cache size)
        secs, toks = run(eng, tg)
        out[name] = {"seconds": secs, "tokens": toks, "tokens_per_s": toks / secs}
        _log(f"ICL stage, {name}: {toks} tokens in {secs:.1f} s = {toks / secs:.1f} tokens/s")
    out["speedup"] = out["fast"]["tokens_per_s"] / out["reference (today)"]["tokens_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", default="smollm2-135m", help="model name or checkpoint directory (SmolLM2-135M)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--slots", default=None, help="comma-separated slot counts (CPU: 1,16,64; CUDA: 1,16,64,256)")
    ap.add_argument("--new-tokens", type=int, default=None, help="CPU: 64; CUDA: 400")
    ap.add_argument("--values", type=int, default=1000, help="private values banned per row")
    ap.add_argument("--steps", type=int, default=None, help="decode steps timed per slot count")
    ap.add_argument(
        "--reference-up-to",
        type=int,
        default=None,
        help="largest slot count the reference engines run at (CPU: 64; CUDA: all)",
    )
    ap.add_argument("--hf-engine-up-to", type=int, default=None,
                    help="largest slot count HFEngine runs at (default: --reference-up-to; its per-row Python "
                         "blocking is the slow part on a GPU)")  # fmt: skip
    ap.add_argument("--icl-targets", type=int, default=16)
    ap.add_argument("--reference-new-tokens", type=int, default=None,
                    help="new tokens of transformers' generate (default --new-tokens)")  # fmt: skip
    ap.add_argument("--compile-processes", type=int, default=0,
                    help="the whole-call engine compiles automata in this many worker processes (0: threads)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small sizes, to check it runs")
    ap.add_argument("--out", default=None, help="JSON path (default docs/benchmarks/engine_<device>.json)")
    ap.add_argument("--no-write", action="store_true", help="do not render docs/benchmarks.md")
    args = ap.parse_args()

    from ctrlgen.models import resolve_device

    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(args.threads)
    slots = [int(s) for s in (args.slots or ("1,16,64,256" if cuda else "1,16,64")).split(",")]
    new_tokens = args.new_tokens or (400 if cuda else 64)
    steps = args.steps or (64 if cuda else 16)
    ref_up_to = args.reference_up_to or (max(slots) if cuda else 64)
    if args.quick:
        slots, new_tokens, steps, ref_up_to = [1, 4], 8, 4, 4
        args.values, args.icl_targets = 100, 2
    t_start = time.perf_counter()
    model, tok = load_causal_lm(ModelConfig(name=args.model, dtype=args.dtype), device=device)
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=0.7, top_p=0.9)
    n = max(slots)
    _log(f"model loaded in {time.perf_counter() - t_start:.1f} s")
    t0 = time.perf_counter()
    prompts, banned, _ = _workload(tok, n, args.values, 256)
    _log(f"workload of {n} rows built in {time.perf_counter() - t0:.1f} s")
    prompt_tokens = [len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]]
    result: dict[str, Any] = {
        "command": " ".join([COMMAND, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
        "device": _device_name(device),
        "device_type": device.type,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "threads": args.threads if not cuda else None,
        "model": "SmolLM2-135M" if args.model == "smollm2-135m" else f"SmolLM2-135M shapes ({args.model})",
        "new_tokens": new_tokens,
        "values_per_row": args.values,
        "compile_processes": args.compile_processes,
        "banned_sequences_per_row": sum(len(b) for b in banned) / len(banned),
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens),
        "slots": [],
    }
    _log(f"{result['device']}, {args.dtype}: prompts of {result['prompt_tokens_mean']:.0f} tokens, "
         f"{result['banned_sequences_per_row']:.0f} banned sequences per row, {new_tokens} new tokens")  # fmt: skip
    out = Path(args.out) if args.out else ROOT / "docs" / "benchmarks" / f"engine_{device.type}.json"
    if args.quick and not args.out:
        out = ROOT / "runs" / f"engine_{device.type}_quick.json"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = _bandwidth(device)
    result["bandwidth_measured"] = bw
    result["bandwidth_datasheet"] = next((v for k, v in DATASHEET_BW.items() if k in result["device"]), None)
    result["weights_bytes"] = weights
    for s in slots:
        row: dict[str, Any] = {"slots": s}
        reqs = _requests(prompts, banned, s, new_tokens)
        t0 = time.perf_counter()
        fast = FastEngine(model, tok, sampling, slots=s, compile_processes=args.compile_processes)
        fast.generate(reqs[:1])  # warm-up (starts the compile processes, if any)
        _log(f"slots {s}: engine started and warmed up in {time.perf_counter() - t0:.1f} s")
        secs, res = _timed(lambda fast=fast, reqs=reqs: fast.generate(reqs), device)
        fast.close()
        _log(f"slots {s}: whole call of {len(reqs)} rows in {secs:.1f} s; timing decode steps")
        toks = sum(r.new_tokens for r in res)
        row["fast"] = {"seconds": secs, "tokens": toks, "tokens_per_s": toks / secs}
        step, roof = _decode_step_seconds(fast, reqs, steps)  # its automata are cached from the call
        step_free, _ = _decode_step_seconds(FastEngine(model, tok, sampling, slots=s),
                                            _requests(prompts, banned, s, new_tokens, bans=False), steps)  # fmt: skip
        row["fast"]["step_s"] = step
        row["fast"]["step_s_no_blocking"] = step_free
        row["blocking_share"] = max(0.0, (step - step_free) / step)
        kv_per_pos = 2 * len(fast.runner.layers) * fast.runner.num_kv_heads * fast.runner.head_dim * \
            torch.empty((), dtype=fast.runner.dtype).element_size()  # fmt: skip
        read = weights + s * roof["mean_kv_len_read"] * kv_per_pos
        needed = weights + s * roof["mean_kv_positions"] * kv_per_pos
        row["roofline"] = {"bytes_read": read, "bytes_needed": needed, "min_step_s": needed / bw,
                           "fraction_of_bandwidth": needed / bw / step}  # fmt: skip
        _log(f"slots {s}: fast {toks / secs:.1f} tok/s, step {step * 1e3:.1f} ms "
             f"(no blocking {step_free * 1e3:.1f} ms), roofline {needed / bw * 1e3:.2f} ms")  # fmt: skip
        if s <= (ref_up_to if args.hf_engine_up_to is None else args.hf_engine_up_to):
            hf = HFEngine(model, tok, sampling, batch_size=s)
            hf.generate(reqs[:1])
            secs, res = _timed(lambda hf=hf, reqs=reqs: hf.generate(reqs), device)
            toks = sum(r.new_tokens for r in res)
            row["reference"] = {"seconds": secs, "tokens": toks, "tokens_per_s": toks / secs}
            _log(f"slots {s}: reference {toks / secs:.1f} tok/s")
        result["slots"].append(row)
        _save(result, out)  # after every slot count: a run cut short keeps what it measured
    # 8 adapters in one batch vs one (decode steps)
    s = max(slots) if cuda else min(16, max(slots))
    adapters = _random_adapters(model, 8)
    eng = FastEngine(model, tok, sampling, slots=s)
    for name, kv in adapters.items():
        eng.add_adapter(name, kv)
    _decode_step_seconds(eng, _requests(prompts, banned, s, new_tokens, adapters=["a0"]), steps)  # warm-up
    one, _ = _decode_step_seconds(eng, _requests(prompts, banned, s, new_tokens, adapters=["a0"]), steps)
    eight, _ = _decode_step_seconds(eng, _requests(prompts, banned, s, new_tokens, adapters=list(adapters)), steps)
    result["adapters"] = {"slots": s, "one_step_s": one, "eight_step_s": eight, "ratio": eight / one}
    _log(f"adapters at {s} slots: 1 adapter {one * 1e3:.1f} ms/step, 8 adapters {eight * 1e3:.1f} ms/step")
    _save(result, out)
    # transformers' generate(bad_words_ids=...) last: with thousands of sequences it is slow enough on a GPU to
    # use up a step's time limit, so it may run fewer new tokens (its tokens/s is per generated token either way)
    ref_new = args.reference_new_tokens or new_tokens
    for row in result["slots"]:
        s = row["slots"]
        if s > ref_up_to:
            continue
        secs, _ = _timed(lambda s=s: _transformers_generate(model, tok, prompts[:s], banned[0], ref_new,
                                                              sampling), device)  # fmt: skip
        row["transformers_bad_words"] = {"seconds": secs, "tokens": s * ref_new, "tokens_per_s": s * ref_new / secs,
                                         "new_tokens": ref_new}  # fmt: skip
        _log(f"slots {s}: transformers generate {s * ref_new / secs:.1f} tok/s ({ref_new} new tokens)")
        _save(result, out)
    if args.icl_targets:
        result["icl_stage"] = _icl_stage(model, tok, args.icl_targets, device)
    result["seconds"] = time.perf_counter() - t_start
    _save(result, out)
    _log(f"wrote {out} ({result['seconds']:.0f} s)")
    if not args.no_write and not args.quick:
        from render_engine import render

        render([out])


def _save(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("CTRLGEN_COMMIT", "unknown")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


if __name__ == "__main__":
    main()
