"""Benchmark: the unknown-setting engine with the clinical NER, one core and through the Ray job,
against PhysioNet's deid tool on the same notes. Writes its section of docs/benchmarks.md.

1. One core, plain loop: notes/s of the clinical-NER engine (configs/extract_physionet_ner.yaml)
   and of the general-NER engine over the 1,818 PhysioNet notes (models loaded first), and the
   clinical-NER engine without its patterns' gates: the same spans (checked), the speed-up measured.
2. The deid tool on the first N notes (Perl, one core): notes/s.
3. The Ray Data extraction job with the clinical-NER engine over the PhysioNet notes repeated
   R times (a generic JSONL corpus), 2 actors on this 2-core machine: notes/s per core =
   notes / (actors x job seconds), cluster start-up excluded (a first small job warms it).
4. When the transformer NER of configs/extract_physionet_transformer.yaml is trained: the same
   one-core loop and Ray job (the notes once) with it, for the trade-off of its recall against its speed;
   and the default engine (configs/extract_physionet.yaml: the clinical-NER engine with that tagger as the
   veto of its spans, reading their neighbourhoods), one core and the Ray job over the R copies and over 2R
   copies: the difference of the two jobs is the rate of each further note, a long job's rate.

    .venv/bin/ctrlgen train-ner -c configs/extract_physionet_ner.yaml          # the NER, once (cached)
    .venv/bin/ctrlgen train-ner -c configs/extract_physionet_transformer.yaml  # optional: ~17 min (make setup trains both)
    .venv/bin/python benchmarks/extract_ner.py                                 # about 5 (10) minutes here
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import write_section  # noqa: E402
from ner_kernels import cpu  # noqa: E402

from ctrlgen.config import ExtractionConfig, PhysionetCorpusConfig, load_config  # noqa: E402
from ctrlgen.corpora import load_corpus  # noqa: E402
from ctrlgen.extract.deid_tool import run_deid  # noqa: E402
from ctrlgen.extract.presidio import PresidioExtractor  # noqa: E402

CONFIG = ROOT / "configs" / "extract_physionet_ner.yaml"
TRANSFORMER = ROOT / "configs" / "extract_physionet_transformer.yaml"
DEFAULT = ROOT / "configs" / "extract_physionet.yaml"  # the clinical-NER engine + the transformer tagger's veto
PHYSIONET = ROOT / ".." / "shared" / "data" / "physionet-deid"
DEID = ROOT / ".." / "shared" / "tools" / "physionet-deid"
TARGET = 100.0  # notes/s per core (issue 17)


def _say(msg: str) -> None:
    print(f"[extract_ner] {msg}", file=sys.stderr, flush=True)


def _build_seconds(config: Path) -> float:
    """Seconds a fresh process takes to import ctrlgen and build ``config``'s extractor: what each Ray actor spends
    before its first note (inside the job's time)."""
    import subprocess

    code = (
        "import time; t0 = time.perf_counter(); from ctrlgen.config import load_config; "
        "from ctrlgen.extract.presidio import PresidioExtractor; "
        f"c = load_config({str(config)!r}); PresidioExtractor(c.extraction, c.nlp.spacy_model, 'direct+quasi'); "
        "print(time.perf_counter() - t0)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=6, help="Copies of the PhysioNet notes the Ray job extracts.")
    ap.add_argument("--deid-notes", type=int, default=300, help="Notes the deid tool is timed on.")
    ap.add_argument("--rounds", type=int, default=2, help="Timed passes of each one-core loop (the best one counts).")
    args = ap.parse_args()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    this_cpu = cpu()
    cfg = load_config(str(CONFIG), [f"corpus.path={PHYSIONET}"])
    ex = cfg.extraction
    if not ex.ner_model or not (ROOT / ex.ner_model / "ctrlgen_ner.json").is_file():
        _say(f"no trained NER at {ex.ner_model}: run `ctrlgen train-ner -c {CONFIG.relative_to(ROOT)}` first")
        return 2
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    tcfg = load_config(str(TRANSFORMER), [f"corpus.path={PHYSIONET}"])
    with_transformer = (
        bool(tcfg.extraction.ner_model) and (ROOT / str(tcfg.extraction.ner_model) / "ctrlgen_ner.json").is_file()
    )
    if not with_transformer:
        _say(f"no trained transformer NER ({TRANSFORMER.relative_to(ROOT)}): its rows are left out")
    import torch

    torch.set_num_threads(1)  # one core, as the Ray actors (OMP_NUM_THREADS = their 1 CPU)

    # 1. One core.
    loop: dict[str, float] = {}
    found: dict[str, list] = {}
    engines = [("clinical NER", ex, True), ("general NER", ExtractionConfig(setting="unknown"), True)]
    if with_transformer:
        dcfg = load_config(str(DEFAULT), [f"corpus.path={PHYSIONET}"])
        if dcfg.extraction.ner_veto != tcfg.extraction.ner_model:
            raise SystemExit(f"{DEFAULT.name}'s veto is not {TRANSFORMER.name}'s tagger: the rows would mislead")
        engines.append(("transformer NER", tcfg.extraction, True))
        engines.append(("default", dcfg.extraction, True))
    engines.append(("clinical NER, no pattern gates", ex, False))
    from threadpoolctl import threadpool_limits

    for name, ecfg, gates in engines:
        ext = PresidioExtractor(ecfg, cfg.nlp.spacy_model, "direct+quasi", pattern_gates=gates)
        with threadpool_limits(1):  # numpy's OpenBLAS too (the spaCy NER's products): it would take every core
            ext(docs[:32])  # warm
            best = 0.0
            for _ in range(args.rounds):  # best of the rounds: a loaded machine only slows a round down
                t0 = time.perf_counter()
                found[name] = ext(docs)
                best = max(best, len(docs) / (time.perf_counter() - t0))
            loop[name] = best
        _say(f"one core, {name}: {loop[name]:.1f} notes/s")
    if found["clinical NER"] != found["clinical NER, no pattern gates"]:
        raise SystemExit("the pattern gates changed what the engine finds: a gate is not implied by its pattern")

    # 2. The deid tool.
    sub = docs[: args.deid_notes]
    _, seconds = run_deid(sub, DEID)
    deid_rate = len(sub) / seconds
    _say(f"deid tool: {deid_rate:.1f} notes/s")

    # 3. The Ray job.
    import ray

    from ray_jobs.extract import run as run_extract
    from ray_jobs.runtime import init_ray

    def ray_job(config: Path, repeat: int, tmp: str) -> tuple[int, float]:
        corpus = Path(tmp) / f"notes-{repeat}.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for r in range(repeat):
                for d in docs:
                    f.write(json.dumps({"id": f"{d.doc_id}-r{r}", "text": d.text}) + "\n")
        n = len(docs) * repeat
        over = [f"corpus.path={corpus}", "corpus.format=generic", "corpus.text_column=text", "corpus.id_column=id",
                "corpus.identifiers=direct+quasi", "extraction.num_actors=2", "ray.num_cpus=4"]  # fmt: skip
        job_cfg = load_config(str(config), [*over, f"output_dir={tmp}/out-{config.stem}"])
        init_ray(job_cfg)
        warm = load_config(str(config), [*over, f"output_dir={tmp}/warm", "corpus.limit=64"])
        run_extract(warm)  # the cluster's first Ray Data run starts its coordinator actors
        t0 = time.perf_counter()
        summary = run_extract(job_cfg)
        job_s = time.perf_counter() - t0
        if summary.documents + summary.quarantined != n:
            raise SystemExit(f"the job wrote {summary.documents} + {summary.quarantined} rows for {n} notes")
        _say(
            f"Ray job ({config.stem}): {n} notes in {job_s:.1f} s with 2 actors: {n / (2 * job_s):.1f} notes/s per core"
        )
        return n, job_s

    with tempfile.TemporaryDirectory() as tmp:
        n, job_s = ray_job(CONFIG, args.repeat, tmp)
        t_n, t_s = ray_job(TRANSFORMER, 1, tmp) if with_transformer else (0, 0.0)
        d_n, d_s = ray_job(DEFAULT, args.repeat, tmp) if with_transformer else (0, 0.0)
        # twice the notes: what each further note costs once the actors are built (a MIMIC-scale job's rate)
        d2_n, d2_s = ray_job(DEFAULT, 2 * args.repeat, tmp) if with_transformer else (0, 0.0)
        ray.shutdown()
    steady = (d2_n - d_n) / (2 * (d2_s - d_s)) if with_transformer and d2_s > d_s else float("nan")
    fixed = d_s - d_n / (2 * steady) if with_transformer and steady > 0 else float("nan")
    builds = {c: _build_seconds(c) for c in ([CONFIG, DEFAULT] if with_transformer else [CONFIG])}
    _say("extractor build in a fresh process: " + ", ".join(f"{c.stem} {b:.1f} s" for c, b in builds.items()))
    per_core = n / (2 * job_s)

    body = (
        f"Command: `.venv/bin/python benchmarks/extract_ner.py` (started {started} UTC; {this_cpu['cores']} cores of "
        f"{this_cpu['key']} ({this_cpu['name']}); the NER of `ctrlgen train-ner -c configs/extract_physionet_ner.yaml`). "
        "These machines differ up to ~3x in speed: a run on another CPU replaces this one (git keeps the earlier ones)."
        + (
            ""
            if with_transformer
            else " The transformer NER was not trained on this machine (`ctrlgen train-ner -c "
            "configs/extract_physionet_transformer.yaml`): its rows are left out."
        )
        + "\n\n"
        "| path | notes | notes/s per core | vs the deid tool | vs the target (100/s per core) |\n|---|---|---|---|---|\n"
        f"| one core, clinical NER engine | {len(docs):,} | {loop['clinical NER']:.1f} | "
        f"{loop['clinical NER'] / deid_rate:.1f}x | {loop['clinical NER'] / TARGET:.2f} |\n"
        f"| one core, clinical NER engine without the patterns' gates | {len(docs):,} | "
        f"{loop['clinical NER, no pattern gates']:.1f} | {loop['clinical NER, no pattern gates'] / deid_rate:.1f}x | "
        f"{loop['clinical NER, no pattern gates'] / TARGET:.2f} |\n"
        f"| one core, general NER engine | {len(docs):,} | {loop['general NER']:.1f} | "
        f"{loop['general NER'] / deid_rate:.1f}x | {loop['general NER'] / TARGET:.2f} |\n"
        f"| Ray Data job, clinical NER, 2 actors | {n:,} | **{per_core:.1f}** | {per_core / deid_rate:.1f}x | "
        f"**{per_core / TARGET:.2f}** |\n"
        + (
            f"| one core, transformer NER engine | {len(docs):,} | {loop['transformer NER']:.1f} | "
            f"{loop['transformer NER'] / deid_rate:.1f}x | {loop['transformer NER'] / TARGET:.2f} |\n"
            f"| Ray Data job, transformer NER, 2 actors | {t_n:,} | {t_n / (2 * t_s):.1f} | "
            f"{t_n / (2 * t_s) / deid_rate:.1f}x | {t_n / (2 * t_s) / TARGET:.2f} |\n"
            f"| one core, default engine (clinical NER + transformer veto) | {len(docs):,} | {loop['default']:.1f} | "
            f"{loop['default'] / deid_rate:.1f}x | {loop['default'] / TARGET:.2f} |\n"
            f"| Ray Data job, default engine (clinical NER + transformer veto), 2 actors | {d_n:,} | "
            f"**{d_n / (2 * d_s):.1f}** | {d_n / (2 * d_s) / deid_rate:.1f}x | **{d_n / (2 * d_s) / TARGET:.2f}** |\n"
            f"| Ray Data job, default engine, 2 actors, twice the notes | {d2_n:,} | {d2_n / (2 * d2_s):.1f} | "
            f"{d2_n / (2 * d2_s) / deid_rate:.1f}x | {d2_n / (2 * d2_s) / TARGET:.2f} |\n"
            f"| Ray Data job, default engine, each further note (the two jobs' difference) | {d2_n - d_n:,} more | "
            f"**{steady:.1f}** | {steady / deid_rate:.1f}x | **{steady / TARGET:.2f}** |\n"
            if with_transformer
            else ""
        )
        + f"| PhysioNet deid tool (Perl), one core | {len(sub):,} | {deid_rate:.1f} | 1.0x | {deid_rate / TARGET:.2f} |\n\n"
        f"Ray job: {n:,} notes (the PhysioNet notes {args.repeat} times over, a generic JSONL corpus) in "
        f"{job_s:.1f} s, reading, extraction and writing included, cluster start-up excluded; per core = notes / "
        "(2 actors x job seconds). Loops: models loaded and warmed before the clock starts, numpy's OpenBLAS (the "
        "spaCy NER's products) on one thread as in a Ray actor of 1 CPU (runs before 2026-12-01 let it take both "
        f"cores), best of {args.rounds} passes. The patterns' gates (`needs` in ctrlgen/extract/recognizers.py: a "
        "pattern runs only on a text holding the literal words it cannot match without) are a speed-up only: "
        f"the engine with and without them found the same spans in every note of this run ({loop['clinical NER'] / loop['clinical NER, no pattern gates']:.2f}x "
        "the notes/s with them; runs before 2026-12-01 had none)"
        + (
            "; the transformer NER (configs/extract_physionet_transformer.yaml: MiniLM, 6 layers, windows of "
            f"{tcfg.extraction.ner_training.max_length} word pieces) on one torch thread, its Ray job over the notes "
            "once. Its recall against the spaCy NER's: docs/extraction_transformer.md beside docs/extraction.md. The "
            "default engine (configs/extract_physionet.yaml) is the clinical-NER engine with that tagger as the veto "
            f"of its spans, reading each span's word pieces and {dcfg.extraction.ner_veto_context} more each side, on "
            f"one torch thread; its Ray job over the same {d_n:,} notes as the clinical NER's "
            f"({d_s:.1f} s; the clinical NER's {job_s:.1f} s). Each actor first builds its extractor: in a fresh process, "
            f"imports included, {builds.get(DEFAULT, 0.0):.1f} s for the default engine (torch and the tagger) against "
            f"{builds[CONFIG]:.1f} s for the clinical NER's, inside the job's time (a longer job spreads it over more "
            f"notes). The same job over twice the notes ({d2_n:,}) took {d2_s:.1f} s: the {d2_n - d_n:,} further notes "
            f"ran {steady:.1f} notes/s per core, the rate of a long (MIMIC-scale) job once its actors are built, and "
            f"the job's fixed cost (start, builds, the last blocks' tail) was about {fixed:.1f} s (two single runs: "
            "the difference carries both runs' noise). Its quality: docs/extraction.md"
            if with_transformer
            else ""
        )
        + ".\n"
    )
    write_section("Entity extraction: the clinical-NER engine vs the deid tool", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
