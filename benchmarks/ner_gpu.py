"""The transformer NER's tagger on a GPU (issue 41, item 3): notes per second, float32 and bf16, by batch size.

On CPU the transformer engine runs at 7-17 notes/s per core (docs/benchmarks.md, the transformer NER's number
format), under the unknown-setting job's 100; the issue asks for its GPU figure. A lent GPU machine has torch and
transformers but not Presidio or spaCy (nor the room to carry them beside Ray), so this measures the part a GPU
runs: ``TransformerTagger`` (word pieces in windows, the encoder, log-probabilities, spans) over every PhysioNet
note, on the GPU, with

- the configured tagger's shapes (``configs/extract_physionet_transformer.yaml``: the MiniLM encoder, BIO head,
  windows of ``max_length`` pieces overlapping by ``stride``) and **random weights** where no trained tagger is at
  hand (a trained one is ~90 MB, more than the device tool carries beside Ray): speed does not depend on the
  weights' values, the spans do, so no span figure is reported from random weights;
- ``float32`` and ``bfloat16`` (``extraction.ner_dtype``), at batches of 32 (the config's), 128 and 512 windows;
- one core of the same machine's CPU on the first ``--cpu-notes`` notes, float32, batches of 32: the ratio of the
  GPU to what that machine's CPU gives one engine actor.

The engine around the tagger (Presidio, spaCy's tokenizer, the rules) stays on the CPU: docs/extraction_transformer.md
measures the rules alone per core, which bounds an engine actor whose tagger runs on a GPU.

    .venv/bin/python benchmarks/ner_gpu.py --prepare          # here: .gpu/ner-tagger-arch (config, tokenizer: ~1 MB)
    python benchmarks/ner_gpu.py --device cuda --out DIR/ner_tagger_cuda.json   # there: benchmarks/gpu_run.py's step
    .venv/bin/python benchmarks/ner_gpu.py --device cpu --quick --out /tmp/x.json  # here: a dry run of the same path
    .venv/bin/python benchmarks/ner_gpu.py --render FILE      # back here: the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import cpu_name, publish  # noqa: E402

CONFIG = "configs/extract_physionet_transformer.yaml"
ARCH = ROOT / ".gpu" / "ner-tagger-arch"
TITLE = "Entity extraction: the transformer tagger on a GPU"
JSON = ROOT / "docs" / "benchmarks" / "ner_gpu.json"
BATCHES = (32, 128, 512)


def prepare(arch: Path = ARCH) -> Path:
    """The configured tagger's shapes without its weights: the encoder's config with ctrlgen's BIO head, its
    tokenizer, and the metadata TransformerTagger reads (window length and stride)."""
    from transformers import AutoConfig, AutoTokenizer

    from ctrlgen.assets import offline_env, sentence_encoder_dir
    from ctrlgen.config import load_config
    from ctrlgen.extract.ner import META_FILE
    from ctrlgen.extract.transformer_ner import BIO

    offline_env()
    h = load_config(str(ROOT / CONFIG)).extraction.ner_training
    base = sentence_encoder_dir(h.encoder)
    cfg = AutoConfig.from_pretrained(str(base), local_files_only=True, num_labels=len(BIO),
                                     id2label=dict(enumerate(BIO)), label2id={t: i for i, t in enumerate(BIO)})  # fmt: skip
    arch.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(arch))
    AutoTokenizer.from_pretrained(str(base), local_files_only=True).save_pretrained(str(arch))
    meta = {"trained_on": {"kind": "transformer", "max_length": h.max_length, "stride": h.stride, "encoder": h.encoder,
                           "config": CONFIG},
            "weights": "none: random weights of these shapes are drawn where the benchmark runs"}  # fmt: skip
    (arch / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return arch


def tagger_dir(model: str | None, arch: Path) -> tuple[Path, str]:
    """A tagger directory to load: ``model`` (a trained tagger) or random weights of ``arch``'s shapes."""
    if model:
        return Path(model), f"the trained tagger {Path(model).name}"
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    from ctrlgen.extract.ner import META_FILE

    if not (arch / "config.json").is_file():
        raise SystemExit(f"{arch}: no tagger shapes (run `benchmarks/ner_gpu.py --prepare` on the CPU box)")
    target = Path(os.environ.get("TMPDIR", "/tmp")) / "ner-tagger-random"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(arch, target)
    torch.manual_seed(0)
    net = AutoModelForTokenClassification.from_config(AutoConfig.from_pretrained(str(arch)))
    # a random head tags most pieces, and turning them into spans then costs what it never costs a trained tagger
    # (about one span a note): biased to O, it tags none, as near a trained tagger's cost as random weights get
    with torch.no_grad():
        net.classifier.bias[0] = 50.0
    net.save_pretrained(str(target))
    if not (target / META_FILE).is_file():
        raise SystemExit(f"{arch}: no {META_FILE} (window length and stride): run `benchmarks/ner_gpu.py --prepare`")
    return target, "random weights of the configured tagger's shapes, its head biased to O (speed only)"


def run_header(device: str, weights: str, config: str) -> dict[str, Any]:
    """The first keys of a device run's JSON: the day, the device, the host's CPU, torch, the weights, the config."""
    import torch

    return {
        "date": datetime.now(UTC).date().isoformat(),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU",
        "host_cpu": cpu_name(isa=True),
        "torch": torch.__version__,
        "weights": weights,
        "config": config,
    }


def _notes(limit: int | None) -> list[str]:
    from ctrlgen.config import PhysionetCorpusConfig
    from ctrlgen.corpora import load_corpus

    path = os.environ.get("CTRLGEN_PHYSIONET") or str(ROOT / ".." / "shared" / "data" / "physionet-deid")
    docs = load_corpus(PhysionetCorpusConfig(path=path, identifiers="direct+quasi"))[0]
    return [d.text for d in docs][:limit]


def _timed(tagger: Any, texts: list[str], device: str, passes: int) -> dict[str, Any]:
    """Best of ``passes`` over ``texts`` (after one warm-up call on a few notes), with the spans found."""
    import torch

    tagger(texts[:8])
    best, spans = float("inf"), 0
    for _ in range(passes):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = tagger(texts)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best, spans = min(best, time.perf_counter() - t0), sum(len(s) for s in out)
    row: dict[str, Any] = {"notes": len(texts), "seconds": round(best, 3), "notes_per_s": round(len(texts) / best, 1)}
    if device.startswith("cuda"):
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    row["spans"] = spans
    return row


def measure(
    device: str, model: str | None, arch: Path, limit: int | None, cpu_notes: int, quick: bool
) -> dict[str, Any]:
    import torch

    from ctrlgen.extract.transformer_ner import TransformerTagger, windows

    path, weights = tagger_dir(model, arch)
    texts = _notes(limit)
    batches = (32, 128) if quick else BATCHES
    passes = 1 if quick else 2
    rows = []
    tagger = TransformerTagger(path, device=device)  # loaded once; batch size and number format are read per call
    for dtype in ("float32", "bfloat16"):
        for b in batches:
            tagger.dtype, tagger.batch_size = dtype, b
            rows.append({"device": device, "dtype": dtype, "batch": b, **_timed(tagger, texts, device, passes)})
            print(f"[ner_gpu] {rows[-1]}", file=sys.stderr, flush=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: what one engine actor gets on the CPU
    tagger = TransformerTagger(path, batch_size=32, device="cpu", dtype="float32")
    rows.append(
        {"device": "cpu, 1 thread", "dtype": "float32", "batch": 32, **_timed(tagger, texts[:cpu_notes], "cpu", 1)}
    )
    print(f"[ner_gpu] {rows[-1]}", file=sys.stderr, flush=True)
    torch.set_num_threads(threads)
    n_windows = len(windows(tagger.tokenizer, texts, tagger.max_length, tagger.stride))
    return {
        **run_header(device, weights, CONFIG),
        "notes": len(texts),
        "windows": n_windows,
        "max_length": tagger.max_length,
        "quick": quick,
        "passes": passes,
        "rows": rows,
    }


def report(r: dict[str, Any]) -> str:
    cpu = next(x for x in r["rows"] if x["device"].startswith("cpu, 1"))
    lines = [
        f"Command: `python benchmarks/ner_gpu.py --device cuda` (benchmarks/gpu_run.py's `ner_tagger` step; "
        f"`--render` rewrites this section from its JSON) on {r['device']}, torch {r['torch']}. The tagger of "
        f"`{r['config']}`: {r['weights']}. {r['notes']} PhysioNet notes, {r['windows']} windows of up to "
        f"{r['max_length']} word pieces; best of {r['passes']} pass(es) after a warm-up; the host's CPU: {r['host_cpu']}. The tagger alone (word pieces, the encoder, "
        "spans): the engine's Presidio, spaCy tokenizer and rules stay on the CPU.",
        "",
        "| device | number format | batch (windows) | notes/s | vs one CPU core | peak GPU memory (GiB) |",
        "|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        mem = f"{x['peak_gib']:.2f}" if "peak_gib" in x else "-"
        lines.append(f"| {x['device']} | {x['dtype']} | {x['batch']} | {x['notes_per_s']:.1f} | "
                     f"{x['notes_per_s'] / cpu['notes_per_s']:.1f}x | {mem} |")  # fmt: skip
    lines += [
        "",
        f"The CPU row: one thread of the same machine, float32, batches of 32 (the config's), on the first "
        f"{cpu['notes']} notes. The unknown-setting job's target is 100 notes/s per core (issue 41, item 3); with "
        "the tagger on a GPU, what bounds an actor is its CPU part (the rules alone: their speed in "
        "docs/extraction_transformer.md).",
    ]
    return "\n".join(lines)


def publish_result(r: dict[str, Any]) -> None:
    """A GPU run's result onto the page: its JSON to docs/benchmarks/ner_gpu.json (the page renders from the
    repository's copy) and the section from it. ``--render``, a run here, and render_gpu.py all come through here."""
    if r.get("quick"):
        raise SystemExit("a dry run (--quick) is not published")
    publish(TITLE, JSON, report, r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true", help="write the tagger's shapes to .gpu/ner-tagger-arch")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", help="a trained tagger directory (default: random weights of .gpu/ner-tagger-arch)")
    ap.add_argument("--arch", default=str(ARCH))
    ap.add_argument("--limit", type=int, help="the first N notes only")
    ap.add_argument("--cpu-notes", type=int, default=100, help="notes for the one-core CPU row")
    ap.add_argument("--quick", action="store_true", help="a dry run: 2 batch sizes, one pass")
    ap.add_argument("--out", help="write the JSON here (no section); default: docs/benchmarks/ner_gpu.json + section")
    ap.add_argument("--render", metavar="FILE", nargs="?", const=str(JSON), help="the section from a run's JSON")
    args = ap.parse_args()
    if args.prepare:
        print(f"[ner_gpu] {prepare(Path(args.arch))}")
        return
    if args.render:
        publish_result(json.loads(Path(args.render).read_text()))
        return
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (a CPU dry run: --device cpu --quick --out FILE)")
    if not args.out and (args.quick or not args.device.startswith("cuda") or args.limit):
        raise SystemExit("a dry, CPU or partial run is not published: give --out")
    r = measure(args.device, args.model, Path(args.arch), args.limit, args.cpu_notes, args.quick)
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=1) + "\n")
        print(report(r))
    else:
        publish_result(r)


if __name__ == "__main__":
    main()
