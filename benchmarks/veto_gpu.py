"""The veto engine on an actor with a GPU (issue 41, item 3): notes/s of ``configs/extract_physionet_veto.yaml``.

On the CPU the veto (``extraction.ner_veto``) reading whole notes costs the spaCy engine 20x: 10.1 against 207.7
notes/s on one thread (docs/benchmarks.md, the transformer tagger as a veto), under the unknown-setting job's 100
notes/s per core, so it is a choice for actors with a GPU. This measures that choice where a GPU is lent: the whole
engine of the veto config (Presidio, the spaCy NER, the rules, then the veto) over every PhysioNet note, its CPU
part on one thread (a Ray actor of 1 CPU and a GPU), the veto's tagger on the GPU reading whole notes and, when the
config sets ``extraction.ner_veto_context``, only its spans' neighbourhoods (on the CPU: docs/benchmarks.md, the veto
on its spans' neighbourhoods), against the same engine without the veto on the same thread. The spaCy NER is the
configured one (``make setup``'s, carried from here as ``.gpu/ner-spacy``); the tagger has the configured shapes
and random weights, its head biased to O as in benchmarks/ner_gpu.py (speed only: such a tagger vetoes every span,
so no span figure is reported).

    here:  bash benchmarks/gpu_prepare.sh --kernels          # carries .gpu/ner-spacy and .gpu/ner-tagger-arch
    there: bash benchmarks/kernels_run.sh                    # runs this after ner_kernels.py where CUDA is
    here:  .venv/bin/python benchmarks/veto_gpu.py --render <files_at>/veto_gpu.json
    here:  .venv/bin/python benchmarks/veto_gpu.py --device cpu --limit 40 --out /tmp/veto.json   # a dry run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402

CONFIG = "configs/extract_physionet_veto.yaml"
JSON = ROOT / "docs" / "benchmarks" / "veto_gpu.json"
TITLE = "Entity extraction: the veto engine on a GPU actor"


def best_pass(ext: Any, docs: list[Any], passes: int) -> tuple[float, list[Any]]:
    """An engine over ``docs`` after a warm-up: the fastest of ``passes`` passes in seconds, and its output."""
    ext(docs[:8])  # warm: the first batch loads kernels and caches
    best, out = float("inf"), []
    for _ in range(passes):
        t0 = time.perf_counter()
        out = ext(docs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def _timed(ext: Any, docs: list[Any], passes: int) -> dict[str, Any]:
    best, out = best_pass(ext, docs, passes)
    return {"notes_per_s": round(len(docs) / best, 1), "seconds": round(best, 2),
            "spans": sum(len(d.entities) for d in out)}  # fmt: skip


def measure(device: str, spacy_ner: Path, arch: Path, deid: Path, limit: int | None, passes: int) -> dict[str, Any]:
    import torch
    from ner_gpu import _notes, run_header, tagger_dir

    from ctrlgen.config import load_config
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.schema import Document

    torch.set_num_threads(1)  # the engine's CPU part: one thread, as a Ray actor of 1 CPU
    tagger, weights = tagger_dir(None, arch)
    overrides = [f"extraction.ner_model={spacy_ner.resolve()}", f"extraction.ner_veto={tagger}",
                 f"extraction.name_lists={(deid / 'lists').resolve()}",
                 f"extraction.common_words={(deid / 'dict').resolve()}"]  # fmt: skip
    cfg = load_config(str(ROOT / CONFIG), overrides)
    docs = [Document(f"n{i}", t) for i, t in enumerate(_notes(limit))]
    rows = []
    plain = PresidioExtractor(cfg.extraction.model_copy(update={"ner_veto": None}), cfg.nlp.spacy_model, "direct+quasi")
    rows.append({"engine": "spaCy engine", "veto": "none", **_timed(plain, docs, passes)})
    print(f"[veto_gpu] {rows[-1]}", file=sys.stderr, flush=True)
    del plain
    # the veto reading whole notes, and (when the config sets extraction.ner_veto_context) its spans' neighbourhoods
    contexts = dict.fromkeys([None, cfg.extraction.ner_veto_context])
    for context in contexts:
        vetoed = PresidioExtractor(cfg.extraction.model_copy(update={"ner_veto_context": context}),
                                   cfg.nlp.spacy_model, "direct+quasi")  # fmt: skip
        on = vetoed._veto.device  # the tagger's device: CUDA where there is one (TransformerTagger's default)
        if on.split(":")[0] != device.split(":")[0]:
            raise SystemExit(f"the veto's tagger runs on {on}, not {device}")
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        reads = "whole notes" if context is None else f"its spans and {context} word pieces each side"
        rows.append({"engine": "spaCy engine + veto", "veto": f"{on}, float32", "reads": reads,
                     **_timed(vetoed, docs, passes)})  # fmt: skip
        if device.startswith("cuda"):
            rows[-1]["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(f"[veto_gpu] {rows[-1]}", file=sys.stderr, flush=True)
        del vetoed
    return {
        **run_header(device, weights, CONFIG),
        "notes": len(docs),
        "passes": passes,
        "dry_run": not device.startswith("cuda") or limit is not None,
        "rows": rows,
    }


def report(r: dict[str, Any]) -> str:
    plain = next(x for x in r["rows"] if x["veto"] == "none")
    lines = [
        f"Command: `bash benchmarks/kernels_run.sh` (its `veto_gpu` step: `python benchmarks/veto_gpu.py`; `--render` "
        f"rewrites this section from its JSON) on {r['device']}, torch {r['torch']}, host CPU {r['host_cpu']}. The "
        f"engine of `{r['config']}` over {r['notes']} PhysioNet notes, its CPU part on one thread (a Ray actor of 1 "
        f"CPU), best of {r['passes']} passes after a warm-up; the veto's tagger: {r['weights']}.",
        "",
        "| engine | veto's tagger | the tagger reads | notes/s | vs the engine without the veto "
        "| peak GPU memory (GiB) |",
        "|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        mem = f"{x['peak_gib']:.2f}" if "peak_gib" in x else "-"
        # runs before extraction.ner_veto_context existed read whole notes
        reads = "-" if x["veto"] == "none" else x.get("reads", "whole notes")
        lines.append(f"| {x['engine']} | {x['veto']} | {reads} | {x['notes_per_s']:.1f} | "
                     f"{x['notes_per_s'] / plain['notes_per_s']:.2f}x | {mem} |")  # fmt: skip
    lines += ["", "The unknown-setting job's target: 100 notes/s per actor of one CPU (issue 41, item 3)."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--spacy-ner", default=str(ROOT / ".gpu" / "ner-spacy"), help="the configured spaCy NER")
    ap.add_argument("--arch", default=str(ROOT / ".gpu" / "ner-tagger-arch"), help="the tagger's shapes")
    ap.add_argument("--deid-lists", default=str(ROOT / ".gpu" / "deid"), help="a folder with lists/ and dict/")
    ap.add_argument("--limit", type=int, help="the first N notes only (a dry run)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", help="write the JSON here (no section)")
    ap.add_argument("--render", metavar="FILE", help="the section of docs/benchmarks.md from a run's JSON")
    args = ap.parse_args()
    if args.render:
        r = json.loads(Path(args.render).read_text())
        if r.get("dry_run"):
            raise SystemExit("a dry run is not published")
        publish(TITLE, JSON, report, r)
        return
    r = measure(args.device, Path(args.spacy_ner), Path(args.arch), Path(args.deid_lists), args.limit, args.passes)
    if not args.out:
        raise SystemExit("give --out (a run's JSON; --render FILE publishes it)")
    Path(args.out).write_text(json.dumps(r, indent=1) + "\n")
    print(report(r))


if __name__ == "__main__":
    main()
