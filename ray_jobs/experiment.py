"""The experiment matrix (METHOD.md section 7) on one Ray cluster, reusing the other jobs.

{baseline, ICL, ICL + blocking, prefix tuning, prefix tuning + masking (the masking loss,
or the paper's as written), DP-SGD prefix tuning at epsilon 8 and 4, the real test notes
anonymised by redaction, by fictional surrogates and by the LLM anonymiser} x {known,
unknown entities} x seeds, read straight down:

1. **extract** the corpus in each setting (the extraction job; the known setting
   always runs: its gold entities are what leakage is measured against);
2. **split by patient** into train / test (``experiment.test_fraction``, seeded;
   every note of a patient on one side), written as Parquet per setting;
3. **fine-tuning set**: a seeded sample of train-split notes with ``experiment.canaries``
   canaries planted (:mod:`ctrlgen.metrics.canary`), the same notes in both settings;
4. **train** a prefix per setting and variant (plain for ``prefix``, masked for
   ``prefix_masked``, masked_paper for ``prefix_masked_paper``; per seed with
   ``train_per_seed``) with the training job;
   canary exposure of each adapter;
5. **generate**, per setting and seed, ``experiment.num_documents`` outputs per
   method from test-split notes' fictional codes (ICL contexts from the train split),
   every cell of the matrix in one Ray Data job (:mod:`ray_jobs.generate_cells`);
6. **evaluate** every (setting, method, seed) cell: per-document privacy metrics over
   Ray Data (:mod:`ray_jobs.evaluate`), the linkage attack, the semantic attack (and the same attack on
   ``semantic_chance_documents`` held-out notes per seed, its chance level), downstream perplexity
   (a fresh base model fine-tuned on the cell's outputs, perplexity on real test
   notes), MAUVE against real test notes and category F1; anonymiser cells release the seeded
   test notes edited (``ctrlgen.anonymize``, or the LLM anonymiser's Ray Data job); two reference rows: the base model
   and the same fine-tuning on real train notes;
7. **report**: mean and 95% interval per (setting, method) (:mod:`ctrlgen.experiment`) -> ``results.json``
   (with each output's and attacked note's scores and patient, the command, commit, date and machine),
   ``results.md`` (the page, :func:`ctrlgen.experiment_report.run_page`), ``privacy_utility.png`` under
   ``<output_dir>/results``.

The baseline prompt has no control codes, so its outputs are the same in both
settings: it is generated once per seed and reported under each setting.

    python -m ray_jobs.experiment --config configs/experiment_physionet.yaml
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.methods import METHODS, icl_mode, of_kind

__all__ = ["ExperimentSummary", "main", "run"]

_DOC_COLUMNS = ["doc_id", "text", "metadata", "entities", "control_code"]
_ICL_METHOD = {icl_mode(m): m for m in of_kind("icl")}  # generation mode -> its ICL method
_ROWS_PER_FILE = 100_000  # a split's files gather at least this many notes (400 files at 200k notes without)
_ATTACK_BATCH = 64  # records per semantic-attack batch


_T0 = [time.perf_counter()]  # the run's start (reset by run): every log line says the minutes since


def _log(msg: str) -> None:
    sys.stderr.write(f"[experiment {(time.perf_counter() - _T0[0]) / 60:5.1f} min] {msg}\n")
    sys.stderr.flush()


def _with(cfg: CtrlgenConfig, **dotted: Any) -> CtrlgenConfig:
    """A copy of ``cfg`` with ``section__key=value`` overrides."""
    data = cfg.model_dump()
    for key, value in dotted.items():
        node = data
        *path, last = key.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    return CtrlgenConfig.model_validate(data)


def _provenance() -> dict[str, Any]:
    """How the run was made, for its page: the command line, the git commit (and whether the checkout had
    uncommitted changes), the date (UTC) and the machine."""
    import datetime
    import os
    import shlex
    import subprocess

    import torch

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    prog = sys.argv[0].replace("\\", "/")
    head = {"ray_jobs/experiment.py": ["python", "-m", "ray_jobs.experiment"], "ctrlgen/cli.py": ["ctrlgen"]}
    argv = next((v for k, v in head.items() if prog.endswith(k)), [Path(prog).name]) + sys.argv[1:]
    commit = git("rev-parse", "--short", "HEAD")
    machine = f"{os.cpu_count()} CPU cores"
    if torch.cuda.is_available():
        machine += f", {torch.cuda.get_device_name(0)}"
    return {"command": shlex.join(argv), "commit": commit,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None,
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(), "machine": machine}  # fmt: skip


def _split_fn(seed: int, fraction: float) -> Any:
    from ctrlgen.experiment import patient_of, split_of

    def fn(batch: pa.Table) -> pa.Table:
        rows = batch.select(["doc_id", "metadata"]).to_pylist()
        return batch.append_column("split", pa.array([split_of(patient_of(r), seed, fraction) for r in rows]))

    return fn


def _keep_ids(ids: set[str]) -> Any:
    keep = pa.array(sorted(ids), pa.string())

    def fn(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_in(batch.column("doc_id").cast(pa.string()), value_set=keep))

    return fn


def _rows(path: str, ids: set[str] | None = None) -> list[dict[str, Any]]:
    """The notes at ``path`` (only those of ``ids``, selected in the cluster), sorted by doc_id."""
    import ray

    ds = ray.data.read_parquet(path).select_columns(_DOC_COLUMNS)
    if ids is not None:
        ds = ds.map_batches(_keep_ids(ids), batch_format="pyarrow")
    return sorted(ds.take_all(), key=lambda r: str(r["doc_id"]))  # not the order of Ray's file names


def _patient_column(batch: pa.Table) -> pa.Table:
    from ctrlgen.experiment import patient_of

    rows = batch.select(["doc_id", "metadata"]).to_pylist()
    return pa.table({"doc_id": pa.array([str(r["doc_id"]) for r in rows], pa.string()),
                     "patient": pa.array([patient_of(r) for r in rows], pa.string())})  # fmt: skip


class _Patients(Mapping[str, str]):
    """doc_id -> patient over the whole corpus, held as two sorted Arrow columns (binary search): a dict of a
    MIMIC-sized corpus' ids is ~250 MB of Python strings on the driver, these ~40 MB."""

    def __init__(self, paths: list[str]) -> None:
        import ray

        refs = [ref for p in paths for ref in ray.data.read_parquet(p).select_columns(["doc_id", "metadata"])
                .map_batches(_patient_column, batch_format="pyarrow").to_arrow_refs()]  # fmt: skip
        tables = [t for t in ray.get(refs) if t.num_rows]
        table = pa.concat_tables(tables).sort_by("doc_id") if tables else _patient_column(pa.table(
            {"doc_id": pa.array([], pa.string()), "metadata": pa.array([], pa.string())}))  # fmt: skip
        self._ids = table.column("doc_id").combine_chunks()
        self._patients = table.column("patient").combine_chunks()

    def __getitem__(self, doc_id: str) -> str:
        import bisect

        i = bisect.bisect_left(self._ids, doc_id, key=lambda s: s.as_py())  # type: ignore[arg-type]
        if i < len(self._ids) and self._ids[i].as_py() == doc_id:
            return str(self._patients[i].as_py())
        raise KeyError(doc_id)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return (str(s) for s in self._ids.to_pylist())


def _split_rows(path: str, setting: str, split: str) -> tuple[int, list[str]]:
    """Rows of one side of the patient split (from the files' footers) and its files; an empty side is an error."""
    files = storage.parquet_files(path)
    if not files:
        raise CtrlgenError(
            f"experiment: the {setting} setting's {split} split is empty ({path}): the corpus' notes come from too "
            "few patients for experiment.test_fraction"
        )
    return storage.parquet_rows(files), files


def _write(rows: list[dict[str, Any]], path: str, schema: pa.Schema) -> str:
    """``rows`` as the one Parquet file of the directory ``path`` (a local path or a URI), replacing it."""
    from ray_jobs.common import reset_dir

    storage.write_parquet(pa.Table.from_pylist(rows, schema=schema), storage.join(reset_dir(path), "part-0.parquet"))
    return path


@dataclass
class ExperimentSummary:
    cells: int
    seconds: float
    output: str
    table: str = ""
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        return f"{self.table}\n\n{self.cells} cells; results in {self.output} after {self.seconds / 60:.1f} min"


class _Utility:
    """Downstream perplexity and MAUVE against a fixed sample of real test notes."""

    def __init__(self, cfg: CtrlgenConfig, test_texts: list[str], test_labels: list[set[str]]) -> None:
        from ctrlgen.assets import load_sentence_encoder
        from ctrlgen.metrics.utility import text_features

        self.cfg, self.x = cfg, cfg.experiment
        self.test = test_texts
        self.test_labels = test_labels
        self.encoder = load_sentence_encoder(cfg.nlp.embedding_model)
        self.q = text_features(self.encoder, test_texts)

    def _cap(self, texts: list[str], seed: int) -> list[str]:
        """At most ``experiment.utility_outputs`` of a cell's texts (a seeded choice, order kept)."""
        import random

        n = self.x.utility_outputs
        if n is None or len(texts) <= n:
            return texts
        keep = sorted(random.Random(f"utility\x1f{seed}").sample(range(len(texts)), n))
        return [texts[i] for i in keep]

    def perplexity(self, texts: list[str] | None, seed: int) -> float:
        from ctrlgen.metrics.utility import finetune_lm, perplexity
        from ctrlgen.models import load_causal_lm

        model, tok = load_causal_lm(self.cfg.model)
        if texts is not None:
            texts = self._cap(texts, seed)
            finetune_lm(model, tok, texts, epochs=self.x.ppl_epochs, learning_rate=self.x.ppl_learning_rate,
                        max_tokens=self.x.ppl_max_tokens, seed=seed, autocast=self.x.utility_autocast)  # fmt: skip
        return perplexity(model, tok, self.test, self.x.ppl_max_tokens)

    def classify(self, texts: list[str], labels: list[set[str]]) -> float | None:
        """Train on these texts (entity categories as labels), macro-F1 on the real test notes."""
        from ctrlgen.metrics.utility import category_f1

        return category_f1(texts, labels, self.test, self.test_labels)

    def mauve(self, texts: list[str], seed: int) -> float:
        from ctrlgen.metrics.utility import mauve_score, text_features

        return mauve_score(text_features(self.encoder, self._cap(texts, seed)), self.q, seed=seed)


def _exposures(
    cfg: CtrlgenConfig, adapter: str | None, canaries: list[Any], hosts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Exposure and rank of every canary under the adapter's model (None: the base model), each candidate
    scored after the control-code prompt of the canary's host without the secret (:func:`canary_prompt`)."""
    from ctrlgen.metrics.canary import canary_prompt, exposure
    from ctrlgen.metrics.utility import sequence_nll
    from ctrlgen.models import load_causal_lm
    from ctrlgen.training.prefix import load_prefix_model

    model, tok = load_causal_lm(cfg.model)
    if adapter is not None:
        with storage.local_copy(adapter) as local:  # PEFT reads local files only
            model = load_prefix_model(model, local)

    out = []
    for c in canaries:
        prompt = canary_prompt(hosts, c)

        def nll(texts: list[str], prompt: str = prompt) -> list[float]:
            scored = sequence_nll(model, tok, texts, max_tokens=512, batch_size=32, prompts=[prompt] * len(texts))
            return [n for n, _ in scored]

        e, rank = exposure(c, nll, cfg.experiment.canary_candidates, seed=cfg.experiment.split_seed)
        out.append({"secret_repeats": c.repeats, "exposure": e, "rank": rank})
    return out


def _per_canary(exposures: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each canary's exposure with its cluster (the canary's index; the same canary in every cell), for the
    interval over the canaries (ctrlgen.experiment)."""
    return {"exposure": [e["exposure"] for e in exposures], "cluster": [f"canary{i}" for i in range(len(exposures))]}


def _categories(code: str | None) -> set[str]:
    """The entity categories of a control code's text (the downstream classification label)."""
    from ctrlgen.codes import parse_control_code

    return set(parse_control_code(code)) if code else set()


def _judge(util: _Utility, texts: list[str]) -> Any:
    """The offline semantic judge, its thresholds calibrated on the utility sample of real test notes."""
    from ctrlgen.metrics.semantic import SimilarityJudge, calibrate

    same, partly, medians = calibrate(util.encoder, texts, seed=util.x.split_seed)
    _log(f"semantic judge: similarity >= {same:.3f} same, >= {partly:.3f} partly (pair medians {medians})")
    return SimilarityJudge(util.encoder, same, partly)


#: A cell awaiting the semantic attack: (cell, the real notes its outputs could reveal, its released texts, the
#: notes each text was made from, held-out real notes of patients it was not made from).
_Pending = tuple[dict[str, Any], list[Any], list[str], list[tuple[str, ...]], list[Any]]


def _semantic(pending: list[_Pending], util: _Utility, judge: Any, patients: Mapping[str, str]) -> None:
    """The semantic attack (METHOD.md 8.2) of every pending cell, in one Ray Data job for the whole matrix: per
    cell one group (its outputs are the released set, the real notes they could reveal the records) and one
    chance group (the same released set, held-out notes as the records), each attacked with its cell's seed;
    fills each cell's columns and per-record scores."""
    import ray

    from ctrlgen.metrics.semantic import Released, random_link_rate
    from ray_jobs.semantic import AttackSettings, attack_groups

    todo = [(str(i), p) for i, p in enumerate(pending) if p[1] and p[2]]
    if todo:
        groups = [(g, records) for g, (_, records, *_) in todo]
        groups += [(f"{g}/chance", p[4]) for g, p in todo if p[4]]
        items = [{"group": g, "doc_id": d.doc_id, "text": d.text} for g, recs in groups for d in recs]
        x = util.x
        # blocks of the attack's batch (from_items' default makes many small blocks); the attack itself (MiniLM
        # on every claim, ~0.2 s a record on half a CPU) is most of its time; the chance level's held-out notes
        # (semantic_chance_documents per cell) are most of its records
        records = ray.data.from_items(items, override_num_blocks=max(1, -(-len(items) // _ATTACK_BATCH)))
        released = {g: [{"doc_id": f"out{i}", "text": t, "sources": list(src)}
                        for i, (t, src) in enumerate(zip(texts, sources, strict=True))]
                    for g, (_, _, texts, sources, _) in todo}  # fmt: skip
        sets = {g: ray.data.from_items(rows) for g, rows in released.items()}
        datasets = {g: sets[g.removesuffix("/chance")] for g, _ in groups}  # a cell and its chance: one index
        seeds = {g: int(p[0]["seed"]) for g, p in todo} | {f"{g}/chance": int(p[0]["seed"]) for g, p in todo}
        s = AttackSettings(k=x.semantic_k, retriever=x.semantic_retriever, same=judge.same,
                           partly=judge.partly, embedding_model=util.cfg.nlp.embedding_model,
                           atomizer=x.semantic_atomizer, judge=x.semantic_judge, llm_json=util.cfg.model_dump_json(),
                           num_actors=x.eval_actors, actor_num_cpus=0.5, batch_size=_ATTACK_BATCH)  # fmt: skip
        results = attack_groups(records, datasets, s, keep_scores=True, seeds=seeds)

        def per_record(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:  # for the cluster bootstrap
            return {"cluster": [patients.get(r["doc_id"], r["doc_id"]) for r in rows],
                    "linkable": [bool(r["linkable"]) for r in rows], "correct": [bool(r["correct"]) for r in rows],
                    "semantic_privacy": [r["semantic_privacy"] for r in rows],
                    "lexical_privacy": [r["lexical_privacy"] for r in rows]}  # fmt: skip

        for g, (cell, originals, _, sources, _) in todo:
            res = results[g]
            cell.update({"sem_link": res.linkage_rate if res.linkable else None,
                         "lexical_privacy": res.lexical_privacy, "semantic_privacy": res.semantic_privacy,
                         "sem_attacked": res.attacked, "sem_linkable": res.linkable,
                         "per_record": per_record(res.per_record)})  # fmt: skip
            rel = [Released(str(i), "", tuple(src)) for i, src in enumerate(sources)]
            attacked = {r["doc_id"] for r in res.per_record}
            cell["sem_link_chance"] = random_link_rate([d.doc_id for d in originals if d.doc_id in attacked], rel)
            if f"{g}/chance" in results:
                held = results[f"{g}/chance"]
                cell.update({"lexical_privacy_chance": held.lexical_privacy,
                             "semantic_privacy_chance": held.semantic_privacy, "sem_chance_attacked": held.attacked,
                             "per_record_chance": per_record(held.per_record)})  # fmt: skip
    pending.clear()


def _per_output(records: list[dict[str, Any]], patients: Mapping[str, str]) -> dict[str, dict[str, list[Any]]]:
    """mode -> each scored output's PIPP, PIPP >= 4 characters, entity-in-context hits and ROUGE (evaluation
    records), and its cluster (the patient of the target note it was made for), for the intervals."""
    from ctrlgen.metrics.evaluate import record_terms

    keys = ("pipp", "pipp_long", "ctx_1", "ctx_4", "rouge2", "rougeL")
    out: dict[str, dict[str, list[Any]]] = {}
    for r in sorted(records, key=lambda r: (str(r["mode"]), str(r["doc_id"]))):
        if r["status"] == "ok":
            t = record_terms(r)
            d = out.setdefault(str(r["mode"]), {"cluster": [], **{k: [] for k in keys}})
            d["cluster"].append(patients.get(str(r["doc_id"]), str(r["doc_id"])))
            for k in keys:
                d[k].append(t[k])
    return out


def _picked(
    cfg: CtrlgenConfig,
    method: str,
    setting: str,
    seed: int,
    splits: dict[str, dict[str, str]],
    picks: dict[tuple[str, int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The test notes an anonymiser cell releases (the setting's rows) and the same notes' known-setting rows.

    They are test notes with gold PHI (a note without any has nothing to protect), the same notes in both
    settings; the setting decides which spans the anonymiser edits. Read once per (setting, seed, count).
    """
    import ray

    from ray_jobs.common import has_code, seeded_sample

    x = cfg.experiment
    n = x.anon_llm_documents if method == "anon_llm" and x.anon_llm_documents else x.num_documents
    if (setting, seed, n) not in picks:
        known = ray.data.read_parquet(splits["known"]["test"]).select_columns(_DOC_COLUMNS)
        ids = {str(r["doc_id"]) for r in seeded_sample(known.map_batches(has_code, batch_format="pyarrow"), n,
                                                       seed, "anonymise", ["doc_id"])}  # fmt: skip
        chosen = _rows(splits[setting]["test"], ids)  # sorted by doc_id
        picks[(setting, seed, n)] = (chosen, chosen if setting == "known" else _rows(splits["known"]["test"], ids))
    return picks[(setting, seed, n)]


def _llm_rewrites(
    cfg: CtrlgenConfig,
    settings: list[str],
    splits: dict[str, dict[str, str]],
    picks: dict[tuple[str, int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    schema: pa.Schema,
) -> dict[str, dict[str, dict[str, Any]]]:
    """The LLM anonymiser's rows of every (setting, seed) cell, by ``setting/seed`` then doc_id: one Ray Data job
    (each cell's notes anonymised with its seed; a note's rewrite is seeded by its seed and id, not its batch)."""
    import ray

    from ray_jobs.anonymize import anonymize_dataset

    if "anon_llm" not in cfg.experiment.methods:
        return {}
    items = [{"doc_id": r["doc_id"], "text": r["text"], "entities": r["entities"], "group": f"{setting}/{seed}",
              "seed": seed}
             for seed in cfg.experiment.seeds for setting in settings
             for r in _picked(cfg, "anon_llm", setting, seed, splits, picks)[0]]  # fmt: skip
    fields = [schema.field("doc_id"), schema.field("text"), schema.field("entities"),
              pa.field("group", pa.string()), pa.field("seed", pa.int64())]  # fmt: skip
    _log(f"LLM anonymiser: {len(items)} notes of {len(settings) * len(cfg.experiment.seeds)} cells (one Ray Data job)")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    table = pa.Table.from_pylist(items, schema=pa.schema(fields))
    for r in anonymize_dataset(ray.data.from_arrow(table), cfg).take_all():
        out.setdefault(str(r["group"]), {})[str(r["doc_id"])] = r
    return out


def _anonymised_cell(
    cfg: CtrlgenConfig,
    method: str,
    setting: str,
    seed: int,
    splits: dict[str, dict[str, str]],
    util: _Utility,
    pending: list[_Pending],
    patients: Mapping[str, str],
    heldout: list[Any],
    picks: dict[tuple[str, int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    llm_rewrites: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """One (setting, anonymiser, seed) cell: ``num_documents`` seeded test notes with gold PHI, released anonymised.

    The spans edited are the setting's (gold when known, the extractor's when unknown); leakage,
    ROUGE and the linkage attack are measured against each note's own gold values and text. ``picks``: the
    notes chosen per (setting, seed, count) (:func:`_picked`); ``llm_rewrites``: the LLM anonymiser's rows per
    ``setting/seed``, made for every cell of the matrix in one job (:func:`_llm_rewrites`).
    """
    from ctrlgen.anonymize import anonymize
    from ctrlgen.fictional import FictionalCodes
    from ctrlgen.metrics.evaluate import Evaluator, RealDoc, aggregate
    from ctrlgen.metrics.linkage import RealRecord, linkage_attack
    from ctrlgen.schema import Entity

    picked, known_rows = _picked(cfg, method, setting, seed, splits, picks)
    gold = {str(r["doc_id"]): RealDoc.from_row(r) for r in known_rows}
    # Surrogates avoid the real values of the notes released (as fictional codes avoid the corpus').
    gen = FictionalCodes(seed=seed, exclude={v for d in gold.values() for v in d.values})
    extra: dict[str, Any] = {}
    if method == "anon_llm":  # the Ray Data job of ctrlgen anonymize (every cell's notes in one job)
        rewritten = llm_rewrites[f"{setting}/{seed}"]
        done = [rewritten[str(r["doc_id"])] for r in picked]
        extra = {"anon_rounds": sum(r["rounds"] for r in done) / len(done) if done else None,
                 "anon_private": sum(r["status"] == "private" for r in done),
                 "anon_fallback": sum(r["status"] == "redacted" for r in done)}  # fmt: skip
    rows = []
    for r in picked:
        doc_id = str(r["doc_id"])
        ents = [Entity.from_row(e) for e in (r["entities"] or [])]
        if method == "anon_llm":
            text = rewritten[doc_id]["text"]
        else:
            text = anonymize(r["text"], ents, METHODS[method].anonymizer, gen, doc_id).text  # type: ignore[arg-type]
        rows.append({"doc_id": doc_id, "mode": method, "status": "ok" if text is not None else "withheld",
                     "text": text or "", "context_ids": [doc_id], "labels": {e.category for e in ents}})  # fmt: skip
    records = Evaluator(gold).table(rows).to_pylist()
    by_mode = aggregate(records, 0)
    extra["per_output"] = _per_output(records, patients).get(method, {})
    rows = [r for r in rows if r["status"] == "ok"]
    texts = [r["text"] for r in rows]
    link = linkage_attack([RealRecord(d.doc_id, d.text, d.values) for d in gold.values()], texts, seed)
    cell = {"setting": setting, "method": method, "seed": seed, **by_mode[method],
            "link_values": link.values, "link_any": link.any_value, "link_sentences": link.sentences,
            "link_attacked": link.attacked, "perplexity": util.perplexity(texts, seed) if texts else None,
            "mauve": util.mauve(texts, seed) if len(texts) >= 2 else None,
            "cls_f1": util.classify(texts, [r["labels"] for r in rows]), **extra}  # fmt: skip
    pending.append((cell, list(gold.values()), texts, [(r["doc_id"],) for r in rows], heldout))
    return cell


def run(cfg: CtrlgenConfig) -> ExperimentSummary:
    import ray
    import torch

    from ctrlgen.experiment import METHOD_LABELS, plot, summarize, table
    from ctrlgen.experiment_report import run_page
    from ctrlgen.generation.report import read_generated
    from ctrlgen.metrics.canary import insert_canaries, make_canaries
    from ctrlgen.metrics.evaluate import Evaluator, RealDoc, aggregate, distinct_values, rouge_sample_rate
    from ctrlgen.metrics.linkage import RealRecord, linkage_attack
    from ctrlgen.metrics.semantic import Record
    from ray_jobs.common import extraction_input, has_code, reset_dir, seeded_sample
    from ray_jobs.evaluate import evaluate, shard_references
    from ray_jobs.generate import _generated_dataset
    from ray_jobs.generate_cells import Cell, generate_cells
    from ray_jobs.runtime import init_ray
    from ray_jobs.train import run as run_train

    x = cfg.experiment
    t0 = _T0[0] = time.perf_counter()
    out = storage.absolute(cfg.output_dir)  # a local (shared) path or a URI: every stage reads and writes there
    if x.torch_threads:
        torch.set_num_threads(x.torch_threads)
    settings = list(dict.fromkeys(x.settings))
    init_ray(cfg)

    # 1-2. Extraction per setting, split by patient.
    splits: dict[str, dict[str, str]] = {}
    known_train_files: list[str] = []  # its first file gives the schema of the fine-tuning sets
    for setting in dict.fromkeys(["known", *settings]):
        c = _with(cfg, extraction__setting=setting, output_dir=storage.join(out, "extract", setting))
        src = extraction_input(c, None, f"experiment ({setting} entities)")
        dest = reset_dir(storage.join(out, "data", setting, "split"))
        ray.data.read_parquet(str(src)).select_columns(_DOC_COLUMNS).map_batches(
            _split_fn(x.split_seed, x.test_fraction), batch_format="pyarrow"
        ).write_parquet(dest, partition_cols=["split"], min_rows_per_file=_ROWS_PER_FILE)  # few, large files
        splits[setting] = {s: storage.join(dest, f"split={s}") for s in ("train", "test")}
        n = {s: _split_rows(p, setting, s) for s, p in splits[setting].items()}
        if setting == "known":
            known_train_files = n["train"][1]
        _log(f"{setting}: {n['train'][0]} train / {n['test'][0]} test notes (split by patient)")
    # No corpus-sized state on the driver: the train split stays a dataset; notes are fetched by id when needed.
    train_ds = ray.data.read_parquet(splits["known"]["train"]).select_columns(_DOC_COLUMNS)
    # doc_id -> patient: the clusters of the intervals (outputs and attacked notes of one patient are not independent)
    patients = _Patients([splits["known"]["train"], splits["known"]["test"]])
    schema = storage.parquet_file(known_train_files[0]).schema_arrow
    test_ds = ray.data.read_parquet(splits["known"]["test"]).select_columns(_DOC_COLUMNS)
    test_rows = seeded_sample(test_ds, x.test_documents, x.split_seed, "utility", ["doc_id", "text", "control_code"])
    test_texts = [r["text"] for r in test_rows]
    test_labels = [_categories(r["control_code"]) for r in test_rows]

    # 3. Fine-tuning set (same notes in every setting) with canaries.
    prefix_methods = of_kind("prefix", x.methods)
    canaries = make_canaries(x.canaries, x.split_seed, x.canary_repeats) if prefix_methods else []
    ft_dirs: dict[str, str] = {}
    planted: dict[str, list[dict[str, Any]]] = {}  # the fine-tuning rows (canaries planted) per setting
    real_ft: dict[str, RealDoc] = {}
    if prefix_methods:
        ft_ids = {r["doc_id"] for r in seeded_sample(train_ds.map_batches(has_code, batch_format="pyarrow"),
                                                     x.finetune_documents, x.split_seed, "finetune", ["doc_id"])}  # fmt: skip
        planted_known = insert_canaries(_rows(splits["known"]["train"], ft_ids), canaries, x.split_seed,
                                        x.canary_in_code)  # fmt: skip
        real_ft = {r["doc_id"]: RealDoc.from_row(r) for r in planted_known}
        planted["known"] = planted_known
        for setting in settings:
            rows = planted_known if setting == "known" else insert_canaries(
                _rows(splits[setting]["train"], ft_ids), canaries, x.split_seed, x.canary_in_code)  # fmt: skip
            if len(rows) != len(ft_ids):
                raise CtrlgenError(f"{setting}: {len(rows)} of the {len(ft_ids)} fine-tuning notes found")
            planted[setting] = rows
            ft_dirs[setting] = _write(rows, storage.join(out, "data", setting, "finetune"), schema)
        _log(f"fine-tuning set: {len(ft_ids)} notes, {len(canaries)} canaries planted "
             f"{sum(c.repeats for c in canaries)} times")  # fmt: skip

    # 4. Prefix tuning (+ canary exposure).
    adapters: dict[tuple[str, str, int], str] = {}  # the training run's output_dir (its adapter and data)
    exposures: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    privacy: dict[tuple[str, str, int], dict[str, Any]] = {}  # DP runs: privacy.json
    train_seeds = x.seeds if x.train_per_seed else x.seeds[:1]
    for setting in settings:
        for method in prefix_methods:
            for seed in train_seeds:
                variant, epsilon = METHODS[method].variant, METHODS[method].epsilon
                run_dir = storage.join(out, "runs", setting, f"{method}-s{seed}")
                dp = {"training__dp__target_epsilon": epsilon, "training__dp__noise_multiplier": None} \
                    if epsilon else {}  # fmt: skip
                c = _with(cfg, output_dir=run_dir, training__input=ft_dirs[setting],
                          training__variant=variant, training__num_documents=None, training__seed=seed,
                          training__run_name=f"{setting}-{method}-s{seed}", training__resume=x.resume,
                          **dp)  # fmt: skip
                _log(f"training {method} prefix ({variant}; {setting}, seed {seed})")
                summary = run_train(c)
                _log(summary.text())
                adapters[(setting, method, seed)] = run_dir
                if summary.privacy:
                    privacy[(setting, method, seed)] = summary.privacy
                if canaries:
                    exposures[(setting, method, seed)] = _exposures(cfg, storage.join(run_dir, "adapter"), canaries,
                                                                    planted[setting])  # fmt: skip
    base_exposure = _exposures(cfg, None, canaries, planted["known"]) if canaries else []
    n_ft_values = len(distinct_values(real_ft.values()))
    shards = None
    if x.distributed_eval:
        shards = shard_references(
            ray.data.read_parquet(splits["known"]["train"]).select_columns(_DOC_COLUMNS),
            storage.join(out, "eval_references"), x.eval_shards,
            finetune=ray.data.from_items(list(planted_known)) if prefix_methods else None,
            rouge_sample=cfg.evaluation.rouge_finetune_sample,
        )  # fmt: skip
        if shards.n_finetune_values != n_ft_values:
            raise CtrlgenError(
                f"sharded references hold {shards.n_finetune_values} fine-tuning values, not {n_ft_values}"
            )

    # 5. Generation: every cell of the matrix ((setting, seed) x the ICL modes, each prefix) in one Ray Data job.
    # The baseline prompt has no control codes: generated once per seed (in its first setting).
    gen_cells: list[Cell] = []
    plan: dict[tuple[int, str], list[tuple[list[str], str | None, str]]] = {}
    baseline_setting: dict[int, str] = {}
    for seed in x.seeds:
        train_seed = seed if x.train_per_seed else x.seeds[0]
        for setting in settings:
            runs: list[tuple[list[str], str | None]] = []
            icl_modes = [icl_mode(m) for m in of_kind("icl", x.methods)
                         if not (m == "baseline" and seed in baseline_setting)]  # fmt: skip
            if "baseline" in icl_modes:
                baseline_setting[seed] = setting
            if icl_modes:
                runs.append((icl_modes, None))
            runs += [([m], adapters[(setting, m, train_seed)]) for m in prefix_methods]
            for modes, adapter in runs:
                gen_dir = storage.join(out, "runs", setting, f"gen-{'-'.join(modes)}-s{seed}")
                gen_cells.append(Cell(
                    key=f"{setting}/{'-'.join(modes)}/s{seed}", output=storage.join(gen_dir, "generated"), seed=seed,
                    modes=("prefix",) if adapter else tuple(modes), input=splits[setting]["test"],
                    context_input=splits[setting]["train"], num_documents=x.num_documents,
                    adapter=storage.join(adapter, "adapter") if adapter else None,
                    finetune_data=storage.join(adapter, "train_data") if adapter else None,
                ))  # fmt: skip
                plan.setdefault((seed, setting), []).append((modes, adapter, gen_dir))
    _log(f"generating {len(gen_cells)} cells (every setting and seed; one Ray Data job)")
    # the matrix scores with its own Evaluator; a re-run skips the cells already written
    generate_cells(cfg, gen_cells, resume=x.resume)
    # The real notes the ICL outputs were made from (their contexts: a few pools' worth), by id; the local path's
    # evaluators (built once); the Ray path shards the references once (above).
    icl_ids = {c for cell in gen_cells if cell.adapter is None for r in read_generated(cell.output)
               for c in r["context_ids"]}  # fmt: skip
    real_icl = {str(r["doc_id"]): RealDoc.from_row(r) for r in _rows(splits["known"]["train"], icl_ids)}
    rouge_rate = rouge_sample_rate(cfg.evaluation.rouge_finetune_sample, len(real_ft))
    evaluators = {False: Evaluator(real_icl), True: Evaluator(real_ft, sorted(real_ft), rouge_rate)}

    # 6. Evaluation per (setting, seed).
    util = _Utility(cfg, test_texts, test_labels)
    judge = _judge(util, test_texts)
    pending: list[_Pending] = []
    cells: list[dict[str, Any]] = []
    baseline_cells: dict[int, dict[str, Any]] = {}
    picks: dict[tuple[str, int, int], Any] = {}  # the anonymisers' notes per (setting, seed, count)
    copies: list[tuple[int, int, str]] = []  # (index in cells, seed, setting): the baseline under another setting
    llm_rewrites = _llm_rewrites(cfg, settings, splits, picks, schema)
    for seed in x.seeds:
        train_seed = seed if x.train_per_seed else x.seeds[0]
        real_rows = seeded_sample(train_ds, x.num_documents, seed, "real", ["doc_id", "text", "control_code"])
        real_sample = [r["text"] for r in real_rows]
        # Held-out real notes for the semantic attack's chance level, of patients a released set was not made from:
        # test-split notes (minus a cell's targets) for generated sets, train-split notes for anonymised test notes.
        n_chance = x.semantic_chance_documents
        chance_test = [Record(str(r["doc_id"]), r["text"]) for r in seeded_sample(
            test_ds.map_batches(has_code, batch_format="pyarrow"), n_chance + x.num_documents, seed, "chance",
            ["doc_id", "text"])] if n_chance else []  # fmt: skip
        chance_train = [Record(str(r["doc_id"]), r["text"]) for r in seeded_sample(
            train_ds.map_batches(has_code, batch_format="pyarrow"), n_chance, seed, "chance",
            ["doc_id", "text"])] if n_chance else []  # fmt: skip
        cells.append({"setting": "reference", "method": "real", "seed": seed,
                      "perplexity": util.perplexity(real_sample, seed), "mauve": util.mauve(real_sample, seed),
                      "cls_f1": util.classify(real_sample, [_categories(r["control_code"]) for r in real_rows])})  # fmt: skip
        for setting in settings:
            for modes, adapter, gen_dir in plan.get((seed, setting), []):
                rows = read_generated(storage.join(gen_dir, "generated"))
                ft = adapter is not None
                ft_ids = sorted(real_ft) if ft else []
                if shards is not None:
                    by_mode = evaluate(_generated_dataset(storage.join(gen_dir, "generated")), shards,
                                       storage.join(gen_dir, "evaluation"), num_actors=x.eval_actors)  # fmt: skip
                    per_output = _per_output(ray.data.read_parquet(storage.join(gen_dir, "evaluation")).take_all(),
                                             patients)  # fmt: skip
                else:
                    records = evaluators[ft].table(rows).to_pylist()
                    by_mode = aggregate(records, n_ft_values if ft else 0)
                    per_output = _per_output(records, patients)
                for mode in sorted({r["mode"] for r in rows}):
                    method = modes[0] if ft else _ICL_METHOD[mode]
                    ok = [r for r in rows if r["mode"] == mode and r["status"] == "ok"]
                    texts = [r["text"] for r in ok]
                    if ft:
                        attacked = [real_ft[d] for d in ft_ids]
                    else:
                        attacked = [real_icl[d] for d in sorted({c for r in ok for c in r["context_ids"]})]
                    link = linkage_attack([RealRecord(d.doc_id, d.text, d.values) for d in attacked], texts, seed)
                    # ICL outputs are made from their contexts; what a prefix output was made from is unknown.
                    made_from = [() if ft else tuple(r["context_ids"]) for r in ok]
                    cell = {"setting": setting, "method": method, "seed": seed, **by_mode[mode],
                            "link_values": link.values, "link_any": link.any_value,
                            "link_sentences": link.sentences, "link_attacked": link.attacked,
                            "perplexity": util.perplexity(texts, seed) if texts else None,
                            "mauve": util.mauve(texts, seed) if len(texts) >= 2 else None,
                            "cls_f1": util.classify(texts, [_categories(r["fictional_code"]) for r in ok]),
                            "per_output": dict(per_output.get(mode, {}))}  # fmt: skip
                    targets = {str(r["doc_id"]) for r in rows}
                    heldout = [d for d in chance_test if d.doc_id not in targets][:n_chance]
                    pending.append((cell, attacked, texts, made_from, heldout))
                    if (setting, method, train_seed) in privacy:  # epsilon, per what unit, whether private at all
                        run_dp = privacy[(setting, method, train_seed)]
                        cell |= {"epsilon": float(run_dp["epsilon"]), "dp_unit": run_dp["unit"]}
                        if "not_private" in run_dp:
                            cell["not_private"] = run_dp["not_private"]
                    if ft and canaries:
                        ex = exposures[(setting, method, train_seed)]
                        cell["exposure"] = sum(e["exposure"] for e in ex) / len(ex)
                        cell["canaries"] = ex
                        cell["per_canary"] = _per_canary(ex)
                    _log(f"{setting} / {method} / seed {seed}: PIPP {cell['pipp']:.3f}, ROUGE-L {cell['rougeL']:.3f}, "
                         f"perplexity {cell['perplexity']}, MAUVE {cell['mauve']}")  # fmt: skip
                    if method == "baseline":
                        baseline_cells[seed] = cell
                    cells.append(cell)
            for method in of_kind("anon", x.methods):  # the real test notes, anonymised
                cell = _anonymised_cell(cfg, method, setting, seed, splits, util, pending, patients, chance_train,
                                        picks, llm_rewrites)  # fmt: skip
                _log(f"{setting} / {method} / seed {seed}: PIPP {cell['pipp']:.3f}, ROUGE-L {cell['rougeL']:.3f}, "
                     f"perplexity {cell['perplexity']}, MAUVE {cell['mauve']}")  # fmt: skip
                cells.append(cell)
            if (
                "baseline" in x.methods
                and seed in baseline_cells
                and not any(c and c["setting"] == setting and c["method"] == "baseline" and c["seed"] == seed
                            for c in cells)
            ):  # fmt: skip
                copies.append((len(cells), seed, setting))  # filled in once the attack has scored the original
                cells.append({})
    _log(f"semantic attack on {len(pending)} cells (every setting and seed; one Ray Data job)")
    _semantic(pending, util, judge, patients)
    for i, seed, setting in copies:
        cells[i] = {**baseline_cells[seed], "setting": setting}
    cells.append({"setting": "reference", "method": "base", "seed": x.seeds[0],
                  "perplexity": util.perplexity(None, 0), "mauve": None})  # fmt: skip
    if canaries:
        cells[-1]["exposure"] = sum(e["exposure"] for e in base_exposure) / len(base_exposure)
        cells[-1]["per_canary"] = _per_canary(base_exposure)

    # 7. Report.
    res = storage.join(out, "results")
    summary = summarize(cells)
    md = table(summary)
    meta = {"config": cfg.model_dump(), "methods": {m: METHOD_LABELS[m] for m in x.methods},
            "canaries_base_model": base_exposure, "minutes": (time.perf_counter() - t0) / 60, **_provenance()}  # fmt: skip
    text = json.dumps({"summary": summary, "cells": cells, **meta}, indent=2, default=str)
    with tempfile.TemporaryDirectory(prefix="ctrlgen-results-") as tmp:  # written here, then copied to res whole
        (Path(tmp) / "results.json").write_text(text)
        (Path(tmp) / "results.md").write_text(run_page(json.loads(text)), encoding="utf-8")  # the page of the JSON
        plot(summary, Path(tmp) / "privacy_utility.png")
        storage.upload(tmp, res)
    return ExperimentSummary(len(cells), time.perf_counter() - t0, res, md)


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("experiment", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
