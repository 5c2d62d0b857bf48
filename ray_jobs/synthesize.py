"""The whole pipeline as one job: extraction -> (prefix training) -> generation -> scoring.

    ctrlgen synthesize -c configs/generate_tiny.yaml            # here, on a private cluster
    ctrlgen submit synthesize -c configs/generate_tiny.yaml     # on a Ray cluster

Stages and where they write (all under ``output_dir``):

1. ``extract``  -> extracted/ (the extraction job);
2. ``train``    -> adapter/, train_data/ (prefix tuning; only when ``generation.modes`` has ``prefix``);
3. ``generate`` -> generated/mode=*/ (ICL / prefix generation with the release gate, resumable);
4. ``score``    -> generated/leakage.md, leakage.json (PIPP / ELP per mode);
5. ``export``   -> release/ (the releasable corpus and its release card, :mod:`ctrlgen.export`;
   only when generation.modes has a mode that may be released: icl_blocking or prefix).

Each finished stage leaves ``pipeline/<stage>.json`` (its summary and a fingerprint of the
settings it depends on). A re-run skips the stages whose fingerprint still matches and runs
the others, and every stage after the first one it runs. An interrupted generation goes on
from the documents already committed (:mod:`ray_jobs.generate`); an interrupted training
resumes from its last checkpoint (:mod:`ray_jobs.train`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, fingerprint

__all__ = ["STAGES", "SynthesizeSummary", "main", "run"]

STAGES = ("extract", "train", "generate", "score", "export")
# The config sections each stage's output depends on (with those of the stages before it).
_DEPENDS = {
    "extract": ("corpus", "demo_corpus", "extraction", "nlp"),
    "train": ("training", "model"),
    "generate": ("generation", "model"),
    "score": (),
    "export": ("export",),
}


@dataclass
class SynthesizeSummary:
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ran" | "skipped (done)" | "not needed"
    texts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    output: str = ""

    def text(self) -> str:
        lines = [f"{s}: {how}" for s, how in self.stages.items()]
        for s, t in self.texts.items():
            lines.append(f"--- {s}\n{t}")
        lines.append(f"pipeline output in {self.output} ({self.seconds:.1f} s)")
        return "\n".join(lines)


def fingerprints(cfg: CtrlgenConfig) -> dict[str, str]:
    """Per stage: a hash of the settings its output depends on, cumulative over the stages before it."""
    out: dict[str, str] = {}
    sections: list[str] = []
    for stage in STAGES:
        sections += _DEPENDS[stage]
        out[stage] = fingerprint(cfg, sections)
    return out


def _say(msg: str) -> None:
    print(f"synthesize: {msg}", file=sys.stderr, flush=True)


def _with_inputs(cfg: CtrlgenConfig, out: str) -> CtrlgenConfig:
    """The later stages read the extraction stage's output (not a fresh extraction of their own)."""
    extracted = storage.join(out, "extracted")
    return cfg.model_copy(
        update={
            "generation": cfg.generation.model_copy(update={"input": cfg.generation.input or extracted}),
            "training": cfg.training.model_copy(update={"input": cfg.training.input or extracted}),
        }
    )


def run(cfg: CtrlgenConfig) -> SynthesizeSummary:
    from ctrlgen.export import LEAKY_MODES, export_run
    from ray_jobs import extract, generate, train

    t0 = time.perf_counter()
    out = storage.absolute(cfg.output_dir)
    marks = storage.join(out, "pipeline")
    fps = fingerprints(cfg)
    cfg = _with_inputs(cfg, out)
    summary = SynthesizeSummary(output=out)
    rerun = False  # once a stage runs, every later one runs too
    for stage in STAGES:
        mark = storage.join(marks, f"{stage}.json")
        if stage == "train" and "prefix" not in cfg.generation.modes:
            summary.stages[stage] = "not needed (no prefix mode)"
            continue
        if stage == "export" and not set(cfg.generation.modes) - set(LEAKY_MODES):
            summary.stages[stage] = "not needed (only modes that leak by design: nothing to release)"
            continue
        if not rerun and storage.exists(mark) and json.loads(storage.read_text(mark)).get("fingerprint") == fps[stage]:
            summary.stages[stage] = "skipped (done)"
            _say(f"stage {stage}: done in an earlier run, skipped")
            continue
        rerun = True
        storage.remove(mark)
        _say(f"stage {stage}: running")
        s0 = time.perf_counter()
        result: Any
        if stage == "extract":
            result = extract.run(cfg)
        elif stage == "train":
            # Examples made from a new extraction: the old run's checkpoints are of other data.
            fresh = summary.stages.get("extract", "").startswith("ran")
            result = train.run(cfg.model_copy(update={"training": cfg.training.model_copy(
                update={"resume": cfg.training.resume and not fresh})}))  # fmt: skip
        elif stage == "generate":
            result = generate.run(cfg, resume=True, score=False)
        elif stage == "score":
            result = generate.score_output(cfg, storage.join(out, "generated"))
        else:
            result = export_run(cfg, progress=lambda msg: _say(f"export: {msg}"))
        text = result.text()
        summary.stages[stage] = f"ran ({time.perf_counter() - s0:.1f} s)"
        summary.texts[stage] = text
        storage.write_text(mark, json.dumps({"fingerprint": fps[stage], "summary": text}, indent=2) + "\n")
        _say(f"stage {stage}: done in {time.perf_counter() - s0:.1f} s")
    summary.seconds = time.perf_counter() - t0
    return summary


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("synthesize", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
