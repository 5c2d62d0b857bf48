"""``ctrlgen <verb> --config FILE key.sub=value ...``: one entry point, one verb per stage.

Run ``ctrlgen --help`` or ``ctrlgen <verb> --help`` for what each verb does.
Errors meant for the user (bad config, unreadable corpus, missing model) print
one clear message and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ctrlgen.config import CtrlgenConfig, ExtractionConfig, load_config
from ctrlgen.errors import CtrlgenError

__all__ = ["main"]

_EPILOG = """\
Configs are YAML files under configs/ (see docs/configuration.md). Any field can be
overridden after the options as key.sub=value, for example:
  ctrlgen demo demo_corpus.n_notes=5000
  ctrlgen ingest --config configs/corpora/physionet.yaml corpus.identifiers=direct+quasi
"""


def cmd_config(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from pathlib import Path

    from ctrlgen.config_docs import describe_text, render_markdown

    if args.markdown:
        page = render_markdown()
        if args.out is None:
            print(page, end="")
            return 0
        if args.check:
            same = Path(args.out).is_file() and Path(args.out).read_text(encoding="utf-8") == page
            print(f"{args.out} {'matches' if same else 'differs from'} the config models' rendering")
            return 0 if same else 1
        Path(args.out).write_text(page, encoding="utf-8")
        print(f"wrote {args.out}")
        return 0
    if args.describe:
        print(describe_text(cfg), end="")
        return 0
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def cmd_demo_corpus(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.demo import write_demo_corpus

    out = write_demo_corpus(cfg.demo_corpus)
    print(f"demo corpus: {cfg.demo_corpus.n_notes:,} notes (seed {cfg.demo_corpus.seed}) in {out}")
    return 0


def cmd_ingest(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.corpora import read_corpus
    from ctrlgen.demo import resolve_corpus
    from ctrlgen.io import write_records

    corpus = resolve_corpus(cfg).corpus
    out = Path(cfg.output_dir) / "documents"
    t0 = time.perf_counter()
    report = write_records(read_corpus(corpus), out, progress="ingest")
    print(f"ingest {corpus.format} corpus {corpus.path} -> {out} ({time.perf_counter() - t0:.1f} s)")
    print(report.summary())
    return 0


def _print_codes(cfg: CtrlgenConfig, docs_dir: Path) -> None:
    from ctrlgen.codes import build_control_code, format_control_code
    from ctrlgen.io import iter_documents

    shown = 0
    for doc in iter_documents(docs_dir):
        if shown >= cfg.show:
            break
        print(f"--- control code of document {doc.doc_id} ({len(doc.entities)} private mentions)")
        print(format_control_code(build_control_code(doc.entities)) or "(no private entities)")
        shown += 1


def cmd_codes(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    docs_dir = Path(cfg.output_dir) / "documents"
    if not docs_dir.is_dir():
        raise CtrlgenError(f"{docs_dir} does not exist: run `ctrlgen ingest` with the same config first")
    _print_codes(cfg, docs_dir)
    return 0


def _quiet_ray() -> None:
    """One progress line per stage: no Ray Data operator-state dumps, Serve replica logs to their files only.

    Ray Data logs every operator's state every few seconds when stdout is not a terminal; the
    jobs print their own progress. Serve replicas write their logs under the session's
    logs/serve/ (and the dashboard) instead of the driver's terminal. Set before Ray starts.
    """
    import logging
    import os

    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False


def cmd_demo(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    """The main job on the embedded default: the stages that exist, end to end."""
    from ctrlgen.demo import write_demo_corpus
    from ctrlgen.generation.report import read_generated
    from ray_jobs.extract import run
    from ray_jobs.generate import run as run_generate

    _quiet_ray()
    n = cfg.demo_corpus.n_notes
    print(f"== 1/5 demo corpus: {n:,} MIMIC-format notes (seed {cfg.demo_corpus.seed})")
    demo_dir = write_demo_corpus(cfg.demo_corpus)
    print(f"   {demo_dir}")
    # Codes and notes are printed from the generated demo corpus only: another configured corpus is private.
    synthetic = _is_demo_corpus(cfg, demo_dir)
    withheld = "   (not printed: corpus.path is not the generated demo corpus, and its values are private)"
    print(f"== 2/5 entity extraction on Ray ({cfg.extraction.setting} setting, {cfg.extraction.num_actors} actors)")
    summary = run(cfg)
    print(summary.text())
    print("== 3/5 control codes of the first documents")
    if synthetic:
        _print_extracted_codes(cfg, Path(summary.output))
    else:
        print(withheld)
    g = cfg.generation
    print(
        f"== 4/5 ICL generation on Ray ({cfg.model.name}, {g.num_documents or 'all'} documents, "
        f"modes {', '.join(g.modes)}, {g.num_actors} actors)"
    )
    cfg = cfg.model_copy(update={"generation": g.model_copy(update={"input": summary.output})})
    gen = run_generate(cfg)
    print(gen.text())
    released = [r for r in read_generated(gen.output) if r["mode"] != "baseline" and r["released"]]
    for row in released[: min(cfg.show, 1)]:
        if not synthetic:
            print(f"--- a synthetic note ({row['mode']}) was released{withheld}")
            break
        print(f"--- synthetic note ({row['mode']}) for the fictional code\n{row['fictional_code']}\n---\n{row['text']}")
    print("== 5/5 the synthesis service on Ray Serve (configs/serve/demo.yaml): start, a few requests, stop")
    _demo_service(cfg, args, str(Path(summary.output).resolve()), show_texts=synthetic)
    print("done; outputs in", cfg.output_dir)
    return 0


def _serve_contexts(cfg: CtrlgenConfig) -> str:
    """The extraction output the service reads (absolute); runs the extraction job when none is configured."""
    given = cfg.serve.contexts or cfg.generation.context_input or cfg.generation.input
    if given is None:
        from ray_jobs.extract import run

        print("serve: no extraction output configured (serve.contexts); running the extraction job first")
        summary = run(cfg)
        print(summary.text())
        given = summary.output
    return str(Path(given).resolve())


def _start_service(cfg: CtrlgenConfig, args: argparse.Namespace, extra: list[str]) -> object:
    from serve.launch import init_ray, start_service

    init_ray(cfg)
    overrides = [*args.overrides, *extra]
    return start_service(cfg, args.serve_config, args.config, overrides, port=args.port,
                         host=getattr(args, "host", None))  # fmt: skip


def _write_deploy(cfg: CtrlgenConfig, args: argparse.Namespace, contexts: str) -> int:
    """A self-contained Serve config for ``serve deploy`` on a running cluster: the resolved ctrlgen config
    and the tokens' digests travel in the application's args (no file of this machine is needed there)."""
    from pathlib import Path

    from ray_jobs.submit import absolute_paths
    from serve.api import token_digest
    from serve.launch import ensure_tokens, load_serve_config

    tokens = ensure_tokens(cfg)
    resolved = absolute_paths(cfg)[0]
    sv = resolved.serve.model_copy(
        update={"contexts": contexts, "token_file": None, "audit_token_file": None,
                "token_sha256": token_digest(tokens["release"][0]),
                "audit_token_sha256": token_digest(tokens["audit"][0])}
    )  # fmt: skip
    resolved = resolved.model_copy(update={"serve": sv})
    schema = load_serve_config(args.serve_config, {"config_json": resolved.model_dump_json()}, args.port, args.host,
                               replace_args=True)  # fmt: skip
    Path(args.write_deploy).write_text(yaml.safe_dump(schema.model_dump(mode="json", exclude_unset=True),
                                                      sort_keys=False), encoding="utf-8")  # fmt: skip
    print(f"wrote {args.write_deploy}: deploy it with `serve deploy {args.write_deploy} --address <dashboard URL>`")
    print(f"  the paths in it must exist on the cluster's nodes (contexts: {contexts}); bearer tokens: "
          f"{tokens['release'][1]} (release), {tokens['audit'][1]} (audit); the file holds their digests only")  # fmt: skip
    return 0


def cmd_serve(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    """Start the service (a private local cluster by default), print how to call it, serve until stopped."""
    from serve.launch import stop_service

    contexts = _serve_contexts(cfg)
    if args.write_deploy:
        return _write_deploy(cfg, args, contexts)
    svc = _start_service(cfg, args, [f"serve.contexts={contexts}"])
    url, token_file, audit_file = svc.url, svc.token_file, svc.audit_token_file  # type: ignore[attr-defined]
    print(f"serving on {url} (OpenAPI: {url}/openapi.json, with a token); release-scope bearer token in {token_file}")
    print(
        f"  (synthesis in the gated modes; the audit-scope token, for scoring, extraction, the ungated modes and "
        f"context ids, is in {audit_file}: docs/serving.md)"
    )
    print(
        f"  curl -s -H \"Authorization: Bearer $(cat {token_file})\" -H 'Content-Type: application/json' "
        f'-d \'{{"n": 1, "seed": 7, "max_new_tokens": 48}}\' {url}/v1/synthesize'
    )
    try:
        if args.duration is not None:
            print(f"stopping after {args.duration:g} s")
            time.sleep(args.duration)
        else:
            print("Ctrl-C stops the service")
            while True:
                time.sleep(3600)
    finally:
        stop_service()
        print("service stopped")
    return 0


def _demo_service(cfg: CtrlgenConfig, demo_args: argparse.Namespace, contexts: str, show_texts: bool = True) -> None:
    """Start the service on the demo's extraction output, send a few requests, print the answers, stop it
    (a synthetic note only with ``show_texts``: contexts from the generated demo corpus)."""
    import concurrent.futures as cf

    from serve.launch import http, stop_service

    args = argparse.Namespace(
        serve_config="configs/serve/demo.yaml", config=demo_args.config, overrides=demo_args.overrides, port=None
    )
    svc = _start_service(cfg, args, [f"serve.contexts={contexts}"])
    url, token, audit = svc.url, svc.token, svc.audit_token  # type: ignore[attr-defined]
    try:
        print(f"   service on {url}; GET /healthz -> {http('GET', url + '/healthz')[0]}")
        print(f"   POST /v1/synthesize without a token -> {http('POST', url + '/v1/synthesize', {})[0]}")
        doc = "Seen by Dr. Maria Lopez on 12/03/2104; pt's husband John called from Springfield."
        status, ext = http("POST", url + "/v1/extract", {"documents": [{"text": doc}]}, audit)
        print(f"   POST /v1/extract -> {status}; control code:")
        print("     " + (ext["documents"][0].get("control_code") or "(none)").replace("\n", "\n     "))
        reqs = [{"n": 1, "seed": s, "max_new_tokens": 48} for s in (1, 2, 3)]
        with cf.ThreadPoolExecutor(len(reqs)) as pool:
            answers = list(pool.map(lambda r: http("POST", url + "/v1/synthesize", r, token), reqs))
        for (status, ans), r in zip(answers, reqs, strict=True):
            if status != 200:
                print(f"   POST /v1/synthesize seed {r['seed']} -> {status}: {ans.get('error')}")
                continue
            o = ans["outputs"][0]
            print(
                f"   POST /v1/synthesize seed {r['seed']} -> {status}: mode {ans['mode']}, batch of {o['batch_size']}, "
                f"{o['new_tokens']} tokens, {'released' if o['released'] else 'withheld'}, {ans['seconds']:.1f} s"
            )
        status, ans = answers[0]
        if status == 200 and ans["outputs"][0]["released"] and show_texts:
            o = ans["outputs"][0]
            print(f"   --- fictional code\n{o['fictional_code']}\n   --- synthetic note\n{o['text']}")
        texts = [a["outputs"][0]["text"] for s, a in answers if s == 200 and a["outputs"][0]["released"]]
        if texts:
            status, sc = http("POST", url + "/v1/score", {"texts": texts}, audit)
            print(
                f"   POST /v1/score ({len(texts)} texts vs {sc['reference']['documents']:,} notes in "
                f"{sc['reference']['shards']} shards) -> {status}: PIPP {sc['pipp']:.2f}, ELP {sc['elp']:.4f}, "
                f"ROUGE-2 {sc['rouge2']:.3f}, ROUGE-L {sc['rougeL']:.3f}"
            )
    finally:
        stop_service()
        print("   service stopped")


def _is_demo_corpus(cfg: CtrlgenConfig, demo_dir: Path) -> bool:
    """Whether the configured corpus is the generated demo corpus (``corpus.path: demo`` or its directory)."""
    from ctrlgen import storage
    from ctrlgen.config import MimicCorpusConfig

    corpus = cfg.corpus
    if not isinstance(corpus, MimicCorpusConfig):
        return False
    if corpus.path == "demo":
        return True
    return not storage.is_uri(corpus.path) and Path(corpus.path).resolve() == demo_dir.resolve()


def _print_extracted_codes(cfg: CtrlgenConfig, extracted: Path) -> None:
    import pyarrow.dataset as pads

    table = pads.dataset(str(extracted / "status=ok"), format="parquet").head(
        cfg.show, columns=["doc_id", "entities", "control_code"]
    )
    for row in table.to_pylist():
        print(f"--- control code of document {row['doc_id']} ({len(row['entities'])} private mentions)")
        print(row["control_code"] or "(no private entities)")


def _job(name: str) -> Callable[[CtrlgenConfig, argparse.Namespace], int]:
    """A verb that hands the config to ``ray_jobs.<name>.run`` (the Ray jobs live outside the core)."""

    def cmd(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
        import importlib

        summary = importlib.import_module(f"ray_jobs.{name}").run(cfg)
        print(summary.text())
        return 0

    return cmd


cmd_extract, cmd_generate, cmd_train, cmd_evaluate, cmd_experiment, cmd_synthesize, cmd_anonymize, cmd_semantic = (
    _job(n) for n in ("extract", "generate", "train", "evaluate", "experiment", "synthesize", "anonymize", "semantic")
)


def cmd_submit(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ray_jobs.submit import SubmitOptions, submit

    opts = SubmitOptions(
        address=args.address, token_file=args.token_file, wait=not args.no_wait, pip=args.pip,
        python=args.python, job_id=args.job_id,
    )  # fmt: skip
    return submit(args.job, cfg, opts)


def cmd_export(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.export import export_run

    update = {k: v for k, v in (("format", args.format), ("output", args.out)) if v is not None}
    if update:
        cfg = cfg.model_copy(update={"export": cfg.export.model_copy(update=update)})
    summary = export_run(cfg, progress=lambda msg: print(f"export: {msg}", file=sys.stderr, flush=True))
    print(summary.text())
    return 0


def cmd_leakage(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen import storage
    from ctrlgen.generation.report import (
        FINETUNE_MODES,
        finetune_values,
        leakage_by_mode,
        leakage_table,
        read_generated,
    )

    rows = read_generated(args.input or storage.join(cfg.output_dir, "generated"))
    finetune = None
    if any(r["mode"] in FINETUNE_MODES for r in rows):
        finetune = finetune_values(cfg.generation.finetune_data or storage.join(cfg.output_dir, "train_data"))
    print(leakage_table(leakage_by_mode(rows, finetune), args.format))
    return 0


_REPORT_HEAD = """# Entity extraction quality (unknown setting)

Produced by `{command}`; nothing in it is typed by hand.

Engines:
- **ctrlgen (general NER)**: Presidio `AnalyzerEngine` with the spaCy pipeline `{spacy}` given
  explicitly (NER only), spaCy's general NER plus ctrlgen's default recognizers (the unknown
  setting's engine without a trained NER).
- **ctrlgen ({ner_label})** (when the config names `extraction.ner_model`): the same engine with
  {architecture} trained on gold spans by `ctrlgen train-ner` (ctrlgen's categories as labels;
  training spans swapped for surrogate names, places and digits from general lists in
  {augment:.0%} of the documents per epoch; {epochs} epochs, seed {seed}{saved}) and the recognizers
  {recognizers}, score threshold {threshold}.{veto} On PhysioNet it is **cross-validated by patient**:
  {folds} folds of patients, each fold's notes extracted by the NER trained on the other folds'
  notes, so no note is scored by a model that saw its patient; the pooled rows are all folds'
  held-out predictions together. The **NER alone** row runs the same fold models with none of the
  hand-written rules (SpacyRecognizer only, no vetoes, no mention propagation): the part of the
  figures that is cross-validated through and through. The **rules alone** row runs the recognizers
  beside the NER, the vetoes and mention propagation with no NER at all (spaCy only tokenizes): what the
  hand-written rules find by themselves (on PhysioNet in-sample: they were written from its errors); on TAB
  and ACI-Bench the NER alone and rules alone rows split the clinical engine the same way. The **in-sample** row is the model trained on every note (the one
  `make setup` trains and the experiment's unknown setting runs) scored on those same notes: how much
  better extraction looks on notes the NER was trained on, not a quality figure. Dictionaries are general lists only
  (`extraction.name_lists`, `extraction.common_words`: PhysioNet deid's public name, place and
  common-word lists); no gold value is a dictionary entry, and the corpus' own name lists are not used.
  On TAB and ACI-Bench the NER trained on all PhysioNet notes runs (trained on no TAB or ACI-Bench text).
  Beside the NER, rules of general clinical-note conventions (ctrlgen/extract/recognizers.py,
  ctrlgen/extract/presidio.py): names after titles, relation words and before credentials
  ("Dr. X", "husband X", "X RRT"), initials, names spread to their other mentions in the note;
  facility and campus names, street addresses, "lives in X"; dates as m-d-y, m/yy and years
  beside procedures; DATETIME spans that read as ventilator settings, pain scores, fractions,
  blood pressures or clock times dropped, and LOC spans made of generic place words dropped
  (clinical_number_veto, propagate_mentions). {rules_made} No rule holds a corpus value (a name, a
  place, a date). The ACI-Bench check below runs on notes that were not read while writing them. Ages follow each
  corpus' definition (`extraction.min_age`): PhysioNet's gold, like HIPAA Safe Harbor, counts
  ages over 89 only, so there the engine reports ages of at least {min_age}; ACI-Bench's metadata
  counts every age, so there it runs with min_age 0. For notes of other layouts, rules find what no
  corpus here annotates: header fields ("Name: SMITH, JOHN", "Attending:", NameFieldRecognizer), MRNs,
  serial, license and policy numbers (MedicalIdRecognizer), e-mail addresses and URLs
  (ContactRecognizer), ISO and date-shifted dates, zip codes after a state code, practices and
  companies; in these three corpora the clinical engine finds the same entities with and without them
  (checked entity for entity), so the figures below do not measure them
  (tests/unit/test_clinical_ner.py runs them on a discharge summary's layout).
{also_engines}- **stock**: `AnalyzerEngine` with the same spaCy pipeline (all components), all predefined
  recognizers, threshold 0.
- **deid tool**: PhysioNet's `deid` (Perl, 2008) with its general lists and its corpus-specific
  lists switched off (`deid-unknown.config`), run on the same notes in the same run. It outputs
  spans without types: its precision and untyped recall compare, its typed recall does not.

Definitions (ctrlgen/extract/quality.py): a gold span is *detected* (recall) when a predicted
span overlaps it, *typed* when an overlapping prediction has its category, *exact* when one has
its offsets; a prediction is *correct* (precision) when it overlaps a gold span. Recall rows
are by gold category, precision by predicted category. All gold spans count (DIRECT and QUASI).
Speeds are documents per second on one core of this machine (2 cores), models loaded.

**The same model on every set-up?** Training is seeded and deterministic on one machine: trained twice in separate
processes it gives the same weights, byte for byte (tests/unit/test_clinical_ner.py), and `ctrlgen train-ner`
records their SHA-256 and the BLAS kernels used in the model's `ctrlgen_ner.json`. Across machines, three
libraries choose their kernels per CPU: numpy's OpenBLAS (SkylakeX, Haswell, Zen...), numpy's own loops (AVX-512
or AVX2) and thinc's BLIS (skx on AVX-512 Intel CPUs, its generic C code on AMD Zen 3, which its build does not
know, with no setting to pin it). The last bits of the weights then differ and training amplifies them: two clean
set-ups of one commit on two machines reached 92.7% / 75.4% and 91.9% / 74.2% (recall / precision) on the same
unseen notes, and an Intel (AVX-512) and an AMD Zen 3 set-up of one commit printed different hashes with OpenBLAS
already pinned. `ctrlgen train-ner`, and this report for its fold models, therefore train in fresh processes, on
thinc's numpy ops without BLIS (the products on numpy's OpenBLAS), OpenBLAS pinned to Haswell on one thread (its
products split over two threads give other weights than on one: another core count, another model) and numpy's
AVX-512 loops off (`OPENBLAS_CORETYPE`, `OPENBLAS_NUM_THREADS`, `NPY_DISABLE_CPU_FEATURES`) on every x86-64 CPU
with AVX2 (for a spaCy NER; a transformer tagger's torch kernels are not pinned). **Measured, that was not enough
until one more layer left BLIS:** spaCy builds the NER's output layer under thinc's "cpu" ops (BLIS's products)
whatever ops are current, and BLIS picks its kernels by CPU vendor (haswell on Intel, generic C code on the AMD
CPUs measured), so two AMD generations (Zen 3 without AVX-512, Zen 5 with it) trained the same weights and an Intel
Xeon others. `ctrlgen train-ner` now puts every layer on the training's numpy ops (a test fails on any BLIS product
in training). benchmarks/ner_kernels.py records each CPU's hash of the configured NER in docs/benchmarks.md; with
`--emulate` it trains under qemu-user's CPU models on one machine: an emulated Intel Haswell, an emulated AMD EPYC
Milan and the AMD Zen 5 it ran on gave one hash, where before the change the emulated Intel gave the real Intel's
hash and the emulated AMD the AMD one; on real hardware, an AMD Zen 4 (AVX-512) trained the Zen 5's configured NER
and its five fold NERs, byte for byte. **A real Intel Xeon did not** (family 6 model 207, the host of a lent GPU
machine, with glibc 2.39 and Python 3.12.3): under the same numerics it trained other weights, for the configured
NER and for the reduced training alike, where the emulated Intel had matched the AMD CPUs. Not through its C
library: an AMD Zen 4 run on Ubuntu 24.04's glibc 2.39 (`--loader`) trains its own weights. The pinned numerics thus give
one model on the AMD CPUs measured, not on every install; what still differs (the Intel CPU itself, or that host's
other software) was not isolated. The configured engine's figures are therefore given **as a range over
set-ups**: the same benchmark (`--cv`) cross-validates the engine by patient with each CPU's own fold NERs, and the
PhysioNet section below lists each CPU's figures for this training and their range. The other figures below are
one set-up's (the models of this run); two set-ups of one commit, before any of this, differed by 0.8 (recall) and 1.2 (precision) points on the unseen notes above.

**The veto's tagger** (an engine with `extraction.ner_veto`, as configs/extract_physionet.yaml's) is seeded too:
trained twice with one seed it gives the same weights (tests/unit/test_transformer_ner.py), and `ctrlgen train-ner`
records their SHA-256, its numerics, torch's kernels and thread count and the CPU in its `ctrlgen_ner.json`. On
native numerics torch chooses its kernels per CPU (ATen's AVX-512 or AVX2 loops, MKL's and oneDNN's code paths) and
splits its sums over the machine's cores; with `ner_training.numerics: pinned` the tagger trains in a fresh process
on AVX2 kernels, MKL's reproducible AVX2 branch and 2 threads, whatever the CPU and its cores
(ctrlgen/extract/transformer_ner.py `pinned_torch_env`; benchmarks/tagger_kernels.py measures both, docs/benchmarks.md,
"the veto tagger's weights across CPUs").{veto_numerics}

"""


_RULES_FIXED = """**How the rules were made:** by reading this
  corpus' pooled cross-validated errors, not inside training folds. The NER is cross-validated;
  the hand-written rules are not, and the PhysioNet figures are optimistic by whatever part of
  them fits this corpus alone."""
_RULES_CHOSEN = """**How the rules were made and chosen:** they were written
  by reading this corpus' pooled cross-validated errors; *which of them run*, and the score threshold,
  is chosen inside each training fold (`extraction.rule_tuning`, ctrlgen/extract/rules.py; the table
  after the per-fold figures): the held-out fold's notes neither train the NER nor choose the rules.
  What stays optimistic is the writing itself: a rule exists because an error was seen on this
  corpus, and a fold's selection can keep it."""


def cmd_train_ner(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.extract.ner_setup import train_configured_ner

    out = args.out or cfg.extraction.ner_model
    if not out:
        raise CtrlgenError("train-ner: give --out DIR or set extraction.ner_model (where the NER is written)")
    provenance = {"config": args.config, "overrides": list(args.overrides)}
    print(train_configured_ner(cfg, cfg.corpus, out, limit=args.limit, force=args.force, provenance=provenance))
    return 0


def _ner_architecture(cfg: CtrlgenConfig) -> str:
    h = cfg.extraction.ner_training
    if h.kind == "transformer":
        return (f"the {h.encoder} encoder fine-tuned as a BIO token classifier (windows of {h.max_length} word pieces "
                f"overlapping by {h.stride}, learning rate {h.learning_rate:g}, batches of {h.batch_size} windows"
                + (", word-shape embeddings added to the uncased pieces" if h.case_features else "")
                + (", the word-piece embeddings frozen as pretrained" if h.freeze_word_embeddings else "")
                + (", under bf16 autocast" if h.bf16 else "")
                + (f"; a training that finds under {h.min_fit_recall:.0%} of the gold spans of {h.fit_sample} of its "
                   f"own training notes stalled and runs again from the next seed, up to {h.fit_retries} times"
                   if h.min_fit_recall > 0 else "") + ")")  # fmt: skip
    if h.width is None:
        return f"{cfg.nlp.spacy_model}'s NER fine-tuned"
    return f"a fresh NER (tok2vec width {h.width}, depth {h.depth}) on {cfg.nlp.spacy_model}'s tokenizer"


def _veto_text(cfg: CtrlgenConfig) -> str:
    """The report head's sentences on ``extraction.ner_veto`` (and its second pass); "" without a veto."""
    ex = cfg.extraction
    if not ex.ner_veto or ex.ner_veto_training is None:
        return ""
    h = ex.ner_veto_training
    arch = _ner_architecture(cfg.model_copy(update={"extraction": ex.model_copy(update={"ner_training": h})}))
    union = (
        f"; and the tagger also runs as the NER of a second pass of the same rules, whose spans overlapping none of "
        f"the engine's are added unless the tagger's P(O) is at least {ex.ner_union_p_outside:g} on each of their "
        f"pieces (`extraction.ner_union_p_outside`)"
        if ex.ner_union_p_outside is not None
        else ""
    )
    reads = (
        f" (the tagger reading only each span's word pieces and {ex.ner_veto_context} pieces each side, "
        "`extraction.ner_veto_context`, not whole notes)"
        if ex.ner_veto_context is not None
        else ""
    )
    return (
        f" Then a transformer tagger vetoes the engine's spans after every rule (`extraction.ner_veto`): a span goes "
        f"when the tagger's P(O) is at least {ex.ner_veto_p_outside:g} on each of its word pieces{reads}{union}. In the "
        f"cross-validation each fold's tagger is {arch} ({h.epochs} epochs, seed {h.seed}; "
        f"`extraction.ner_veto_training`) trained on the same other folds' patients as that fold's NER, and the "
        f"in-fold rule selection scores the engine before the veto. The NER alone and rules alone rows run without "
        f"it; the in-sample row, TAB and ACI-Bench run the tagger trained on every PhysioNet note ({ex.ner_veto}). "
        + (
            "The cross-validation chooses the bars inside each training fold (`extraction.bar_tuning`; the bars "
            "above are the config's, which the in-sample, TAB and ACI-Bench rows run): each fold's chosen bars are "
            "listed below its folds."
            if ex.bar_tuning.enabled
            else "The bars are the config's: the cross-validation does not choose them, so where they were chosen on "
            "some of these notes (the config's comments say where) those notes' figures are not out of sample for them."
        )
    )


def _also(entries: str) -> list[tuple[str, CtrlgenConfig]]:
    """``--also``: comma-separated entries, each a config path and optional overrides after it ("path k=v k=v")."""
    out = []
    for entry in (e.strip() for e in entries.split(",")):
        if entry:
            path, *overrides = entry.split()
            out.append((entry, load_config(path, overrides)))
    return out


def _spacy_saved_and_decoded(ex: ExtractionConfig) -> str:
    from ctrlgen.extract.ner import BEAM_WIDTH

    decoded = (
        "decoded greedily, each step's most probable transition (a beam with a bar on the entities, "
        "`extraction.ner_beam_bar`, is measured in docs/benchmarks.md)"
        if ex.ner_beam_bar is None
        else f"decoded by beam search ({BEAM_WIDTH} parses), every entity of probability at least "
        f"{ex.ner_beam_bar:g} over the beam"
    )
    return f"; the weights saved are the optimizer's running averages, as `spacy train` saves them; {decoded}"


def cmd_extract_report(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.extract.ner_setup import veto_numerics
    from ctrlgen.extract.report import extraction_report, ner_label

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else []
    also_entries = _also(args.also or "")
    also = [c for _, c in also_entries]
    body = extraction_report(
        cfg, Path(args.physionet), Path(args.tab), args.limit, args.deid, Path(args.aci) if args.aci else None, seeds,
        also,
    )  # fmt: skip
    ex = cfg.extraction
    command = "ctrlgen extract-report" + (f" -c {args.config}" if args.config else "") + (
        f" --limit {args.limit}" if args.limit else "") + (f" --seeds {args.seeds}" if args.seeds else "") + (
        f" --also {shlex.quote(args.also)}" if args.also else "") + (
        f" --out {args.out}" if args.out != "docs/extraction.md" else "")  # fmt: skip
    head = _REPORT_HEAD.format(
        command=command,
        spacy=cfg.nlp.spacy_model,
        recognizers=", ".join(ex.recognizers),
        threshold=ex.score_threshold,
        min_age=ex.min_age,
        augment=ex.ner_training.augment_share,
        epochs=ex.ner_training.epochs,
        seed=ex.ner_training.seed,
        folds=ex.ner_training.folds,
        rules_made=_RULES_CHOSEN if ex.rule_tuning.enabled else _RULES_FIXED,
        saved="" if ex.ner_training.kind == "transformer" else _spacy_saved_and_decoded(ex),
        architecture=_ner_architecture(cfg),
        ner_label=ner_label(ex),
        veto=_veto_text(cfg),
        veto_numerics=veto_numerics(
            next((c.extraction for c in (cfg, *also) if c.extraction.ner_veto and c.extraction.ner_veto_training), None)
        ),
        also_engines="".join(
            f"- **ctrlgen ({ner_label(o.extraction)})** (`--also {path.strip()}`): the same engine with "
            f"{_ner_architecture(o)} ({o.extraction.ner_training.epochs} epochs, seed {o.extraction.ner_training.seed}, "
            f"surrogates in {o.extraction.ner_training.augment_share:.0%} of the documents per epoch), the recognizers "
            f"{', '.join(o.extraction.recognizers)}, score threshold {o.extraction.score_threshold}; cross-validated "
            f"and split into NER alone the same way"
            + (
                ", rules chosen in-fold"
                if o.extraction.rule_tuning.enabled
                else ", the rules run as configured (no in-fold selection)"
            )
            + "."
            + _veto_text(o)
            + "\n"
            for path, o in also_entries
        ),
    )
    Path(args.out).write_text(head + body)
    print(body)
    print(f"written to {args.out}")
    return 0


def cmd_results_page(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.experiment_report import write_or_check

    return write_or_check(args.spec, args.out, args.check)


def cmd_model(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.models import load_causal_lm, prepare_builtin

    if args.action == "prepare":
        if cfg.model.name == "smollm2-135m":
            print(prepare_builtin(cfg.model.name, cfg.model.cache_dir))
        else:
            print(f"{cfg.model.name}: nothing to prepare")
        return 0
    t0 = time.perf_counter()
    model, tok = load_causal_lm(cfg.model)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{cfg.model.name}: {type(model).__name__}, {n / 1e6:.1f}M parameters, vocab {len(tok)}, "
        f"loaded in {time.perf_counter() - t0:.1f} s"
    )
    if args.action == "generate":
        import torch

        ids = tok(args.prompt, return_tensors="pt")
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(  # type: ignore[operator]
                **ids, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        print(tok.decode(out[0][ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return 0


def cmd_assets(cfg: CtrlgenConfig, args: argparse.Namespace) -> int:
    from ctrlgen.assets import load_sentence_encoder, load_spacy

    t0 = time.perf_counter()
    nlp = load_spacy(cfg.nlp.spacy_model)
    print(f"spaCy {cfg.nlp.spacy_model}: pipes {nlp.pipe_names} ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    enc = load_sentence_encoder(cfg.nlp.embedding_model)
    dim = enc.encode(["offline check"]).shape[1]
    print(f"sentence encoder {cfg.nlp.embedding_model}: dimension {dim} ({time.perf_counter() - t0:.1f} s)")
    return 0


_VERBS: dict[str, tuple[Callable[[CtrlgenConfig, argparse.Namespace], int], str]] = {
    "demo": (
        cmd_demo,
        "Main job on the embedded default: generate the demo corpus, read it, extract its "
        "known entities, print control codes. Grows as stages land.",
    ),
    "demo-corpus": (
        cmd_demo_corpus,
        "Write the project's MIMIC-format demo corpus (NOTEEVENTS columns, "
        "[**...**] placeholders) as Parquet shards or CSV; deterministic by seed.",
    ),
    "ingest": (
        cmd_ingest,
        "Read a corpus (mimic, physionet, tab, aci, generic) into the ctrlgen document "
        "schema: <output_dir>/documents/*.parquet plus quarantine.parquet; prints counts.",
    ),
    "extract": (
        cmd_extract,
        "Ray Data job: entities and control codes for every document, known (gold / "
        "placeholders) or unknown (extraction.setting=unknown: Presidio) setting, in an actor pool; "
        "writes <output_dir>/extracted/status=ok|quarantined Parquet and prints counts.",
    ),
    "extract-report": (
        cmd_extract_report,
        "Precision / recall per category of the unknown setting (ctrlgen's "
        "Presidio engine and the stock one) against the gold spans of PhysioNet deid and the TAB "
        "case; writes docs/extraction.md.",
    ),
    "results-page": (
        cmd_results_page,
        "Render docs/results.md from its spec (docs/results_page.json) and the experiment results JSONs it names "
        "(tables, intervals, plot, command, commit, the reading); --check compares instead of writing.",
    ),
    "codes": (cmd_codes, "Print the control codes of the first `show` ingested documents."),
    "model": (
        cmd_model,
        "prepare: convert the built-in model once; info: load it and describe it; "
        "generate: greedy continuation of --prompt.",
    ),
    "generate": (
        cmd_generate,
        "Ray Data job: ICL synthetic notes (baseline, icl, icl_blocking + release gate) from the "
        "extraction output; prints PIPP/ELP per mode.",
    ),
    "train": (
        cmd_train,
        "Ray Train job: prefix tuning (training.variant masked | plain with DeepSpeed, dp with Opacus) on "
        "training.num_workers workers; checkpoints, resumes, writes <output_dir>/adapter (PEFT format).",
    ),
    "evaluate": (
        cmd_evaluate,
        "Ray Data job: per-document privacy metrics (PIPP, ELP, ROUGE, entity-in-context leakage) of a generation "
        "output against the real documents, the references sharded over actors; writes <output_dir>/evaluation.",
    ),
    "experiment": (
        cmd_experiment,
        "The experiment matrix {the paper's five methods, DP-SGD prefixes, anonymisers} x {known, unknown} x "
        "seeds: extraction, patient split, training, generation, evaluation; writes results.json / .md / .png.",
    ),
    "anonymize": (
        cmd_anonymize,
        "Ray Data job: the LLM anonymiser (rewrite, attack, feed the hits back; METHOD.md 8.3) over an extraction "
        "output with a local model or an OpenAI-compatible endpoint (anonymizer.*); writes <output_dir>/anonymized.",
    ),
    "semantic-attack": (
        cmd_semantic,
        "Ray Data job: the semantic re-identification attack (METHOD.md 8.2) of a generation output by the real "
        "records (evaluation.references): correct-linkage rate, lexical and semantic privacy (experiment.semantic_*).",
    ),
    "synthesize": (
        cmd_synthesize,
        "The whole pipeline as one job: extraction -> prefix training (when generation.modes has prefix) -> "
        "generation with the release gate -> leakage scoring -> export (<output_dir>/release and its release card). "
        "Resumable: a re-run skips finished stages and generation continues from the documents already written.",
    ),
    "export": (
        cmd_export,
        "The releasable corpus of a pipeline output (output_dir): released rows of icl_blocking / prefix only, "
        "checked again for private values, no real value or id, as parquet, jsonl, csv (NOTEEVENTS) or hf, with a "
        "release card (RELEASE.md, release.json); `synthesize` ends with it. Writes <output_dir>/release.",
    ),
    "submit": (
        cmd_submit,
        "Submit a job (extract, train, generate, evaluate, experiment, synthesize, anonymize) to a Ray cluster through the Job "
        "Submission API: code as working_dir, resolved config in the runtime_env, logs followed; see docs/cluster.md.",
    ),
    "serve": (
        cmd_serve,
        "Start the synthesis service (Ray Serve: /v1/synthesize, /v1/extract, /v1/score) from a Serve config "
        "file on a private local cluster (or ray.address) and serve until Ctrl-C; see docs/serving.md.",
    ),
    "train-ner": (
        cmd_train_ner,
        "Fine-tune the clinical NER of the unknown setting on the config corpus' gold spans (extraction.ner_training; "
        "surrogates from extraction.name_lists) and write it to extraction.ner_model (or --out); kept when already "
        "trained on the same documents with the same settings.",
    ),
    "leakage": (cmd_leakage, "PIPP/ELP per mode of generated Parquet output (recomputed from the text)."),
    "assets": (cmd_assets, "Load the offline spaCy pipeline and sentence encoder to check they are installed."),
    "config": (
        cmd_config,
        "Print the resolved config (file + overrides + defaults) as YAML; --describe: every field with its value, "
        "type and description; --markdown: docs/configuration.md.",
    ),
}

#: The verbs as `ctrlgen --help` lists them, by what a user comes for.
_GROUPS: dict[str, list[str]] = {
    "start here": ["synthesize", "export", "demo", "config"],
    "pipeline stages": ["ingest", "extract", "train-ner", "codes", "train", "generate", "anonymize"],
    "evaluation": ["evaluate", "semantic-attack", "leakage", "experiment", "results-page", "extract-report"],
    "operations": ["serve", "submit", "model", "assets", "demo-corpus"],
}
#: Per verb, the keys a user sets for their own data (the rest has working defaults).
_KEYS: dict[str, str] = {
    "synthesize": "corpus.format, corpus.path, extraction.setting (known: [**...**] placeholders; unknown: raw notes), "
    "generation.modes, generation.num_documents, output_dir",
    "export": "output_dir (the synthesize output), export.format, export.modes",
    "extract": "corpus.format, corpus.path, extraction.setting, output_dir",
    "train": "training.input (an extraction output) or the corpus keys, training.variant, output_dir",
    "generate": "generation.input (an extraction output), generation.modes, output_dir",
    "evaluate": "evaluation.input, evaluation.references, output_dir",
    "serve": "serve.contexts (an extraction output), serve.token_file, --serve-config",
    "submit": "the job's own keys, ray.address / --address",
    "experiment": "corpus.*, experiment.methods, experiment.settings, experiment.seeds, output_dir",
}


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(
        prog="ctrlgen",
        description="Controlled generation of private synthetic text: from a corpus of notes to a synthetic corpus "
        "you may release, with its privacy measured. New here: docs/quickstart.md, then `ctrlgen synthesize`.\n\n"
        + "\n".join(f"  {group + ':':<17} {', '.join(verbs)}" for group, verbs in _GROUPS.items()),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    subs = {}
    ordered = [v for group in _GROUPS.values() for v in group]
    if sorted(ordered) != sorted(_VERBS):
        raise AssertionError(f"verbs and groups differ: {sorted(set(ordered) ^ set(_VERBS))}")
    for name in ordered:
        help_text = _VERBS[name][1]
        keys = f"\n\nKeys to set for your own data: {_KEYS[name]}." if name in _KEYS else ""
        sp = sub.add_parser(
            name,
            help=help_text,
            description=help_text + keys,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        subs[name] = sp
        if name == "submit":
            from ray_jobs.submit import SUBMITTABLE

            sp.add_argument("job", choices=SUBMITTABLE, help="The job to run on the cluster.")
            sp.add_argument(
                "--address",
                default=None,
                help="Jobs API (dashboard) URL; default $RAY_API_SERVER_ADDRESS or http://127.0.0.1:8265.",
            )
            sp.add_argument(
                "--token-file",
                default=None,
                help="Token of a head with RAY_AUTH_MODE=token (default $RAY_AUTH_TOKEN_PATH, "
                "else $CTRLGEN_CACHE/ray/auth_token when it exists).",
            )
            sp.add_argument("--no-wait", action="store_true", help="Print the job id and return.")
            sp.add_argument(
                "--pip",
                action="store_true",
                help="Install the dependencies in the job's runtime_env (nodes without them).",
            )
            sp.add_argument("--python", default="python", help="Interpreter on the cluster (has Ray).")
            sp.add_argument("--job-id", default=None, help="Submission id (default: Ray's).")  # fmt: skip
        sp.add_argument("--config", "-c", default=None, help="YAML config file (default: built-in defaults).")
        sp.add_argument("--config-env", default=None, help=argparse.SUPPRESS)  # a submitted job's resolved config
        if name == "model":
            sp.add_argument("action", choices=("prepare", "info", "generate"), help="What to do with the model.")
            sp.add_argument("--prompt", default="The patient was admitted", help="Prompt for generate.")
            sp.add_argument("--max-new-tokens", type=int, default=30, help="Tokens to generate.")
        if name == "extract-report":
            sp.add_argument("--physionet", default="../shared/data/physionet-deid", help="PhysioNet deid directory.")
            sp.add_argument("--tab", default="../shared/data/tab", help="TAB JSON file or directory.")
            sp.add_argument("--aci", default="../shared/data/aci-bench/valid.csv",
                            help="ACI-Bench CSV whose metadata names are a second check ('' to skip).")  # fmt: skip
            sp.add_argument("--out", default="docs/extraction.md", help="Markdown file to write.")
            sp.add_argument("--limit", type=int, default=None, help="Only the first N PhysioNet notes.")
            sp.add_argument("--deid", default="../shared/tools/physionet-deid",
                            help="PhysioNet's deid tool, run beside ctrlgen on the same notes ('' to skip).")  # fmt: skip
            sp.add_argument("--seeds", default="",
                            help="More NER training seeds, comma-separated (e.g. 1,2): the pooled CV figures of "
                            "each beside the configured seed's, with mean and sd (trains k NERs per seed).")  # fmt: skip
            sp.add_argument("--also", default="",
                            help="Configs of other trained NERs, comma-separated (e.g. "
                            "configs/extract_physionet_transformer.yaml), each optionally followed by overrides "
                            "('configs/extract_physionet_veto.yaml extraction.ner_union_p_outside=0.2'): their "
                            "engines scored beside this one's.")  # fmt: skip
        if name == "config":
            sp.add_argument("--describe", action="store_true", help="Every field: value, type and description.")
            sp.add_argument("--markdown", action="store_true", help="The field reference as Markdown (the docs page).")
            sp.add_argument("--out", default=None, help="With --markdown: write this file (docs/configuration.md).")
            sp.add_argument("--check", action="store_true", help="With --markdown --out: exit 1 if the file differs.")
        if name == "results-page":
            sp.add_argument("--spec", default="docs/results_page.json", help="The page spec (runs, notes, checks).")
            sp.add_argument("--out", default="docs/results.md", help="Markdown file to write.")
            sp.add_argument("--check", action="store_true", help="Exit 1 if --out differs from the rendering.")
        if name == "train-ner":
            sp.add_argument("--out", default=None, help="Directory to write (default extraction.ner_model).")
            sp.add_argument("--limit", type=int, default=None, help="Train on the first N documents only.")
            sp.add_argument("--force", action="store_true", help="Retrain even when an identical model exists.")
        if name == "serve":
            sp.add_argument(
                "--serve-config", default="configs/serve/demo.yaml", help="Ray Serve config file (deployments)."
            )
            sp.add_argument("--port", type=int, default=None, help="HTTP port (default: the Serve config's).")
            sp.add_argument("--host", default=None,
                            help="HTTP host to bind (default: the Serve config's, 127.0.0.1; 0.0.0.0 for colleagues).")  # fmt: skip
            sp.add_argument("--write-deploy", default=None, metavar="FILE",
                            help="Write a self-contained Serve config for `serve deploy` to a running cluster and "
                            "exit (tokens travel as digests only).")  # fmt: skip
            sp.add_argument("--for", dest="duration", type=float, default=None, help="Stop after this many seconds.")
        if name == "export":
            sp.add_argument("--format", choices=("parquet", "jsonl", "csv", "hf"), default=None,
                            help="Output format (default export.format: parquet).")  # fmt: skip
            sp.add_argument(
                "--out", default=None, help="Directory to write (default export.output, <output_dir>/release)."
            )
        if name == "leakage":
            sp.add_argument("--input", default=None, help="Generated output (default <output_dir>/generated).")
            sp.add_argument("--format", choices=("markdown", "json"), default="markdown", help="Table format.")
        sp.add_argument("overrides", nargs="*", metavar="key.sub=value", help="Config overrides.")
    return p, subs


def _config_from_env(args: argparse.Namespace) -> CtrlgenConfig:
    """The resolved config a submitted job carries in an environment variable (see ray_jobs/submit.py)."""
    import os

    if args.config or args.overrides:
        raise CtrlgenError("--config-env carries the whole resolved config: give no --config or overrides with it")
    raw = os.environ.get(args.config_env)
    if not raw:
        raise CtrlgenError(f"environment variable {args.config_env} is not set (it carries a submitted job's config)")
    try:
        return CtrlgenConfig.model_validate_json(raw)
    except ValueError as exc:
        raise CtrlgenError(f"environment variable {args.config_env} does not hold a valid ctrlgen config") from exc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, subs = _parser()
    if argv[:1] == ["submit"]:
        # `submit JOB -c F k=v --no-wait`: a positional before options and more after them, which
        # only argparse's intermixed parsing takes (it does not work through subparsers).
        args = subs["submit"].parse_intermixed_args(argv[1:])
        args.verb = "submit"
    else:
        args = parser.parse_args(argv)
    try:
        cfg = _config_from_env(args) if args.config_env else load_config(args.config, args.overrides)
        return _VERBS[args.verb][0](cfg, args)
    except CtrlgenError as exc:
        print(f"ctrlgen {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ctrlgen {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
