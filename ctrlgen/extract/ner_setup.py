"""Training the configured clinical NER: by `ctrlgen train-ner`, or on first use of the unknown setting.

:func:`train_configured_ner` trains ``extraction.ner_model`` on a corpus with gold spans (kept when a model
trained on the same documents with the same settings is already there); :func:`ensure_ner_model` is what
the extraction job calls first: an untrained ``ner_model`` is trained from ``extraction.ner_training.data``,
or named in a clear error.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctrlgen.config import CtrlgenConfig, ExtractionConfig
from ctrlgen.errors import CtrlgenError

__all__ = [
    "compare_to_recorded", "cv_range", "cv_row", "ensure_ner_model", "recorded_machines", "set_up_spread",
    "train_configured_ner", "veto_numerics", "weight_groups",
]  # fmt: skip


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train_configured_ner(
    cfg: CtrlgenConfig,
    corpus: Any,
    out: str,
    *,
    limit: int | None = None,
    force: bool = False,
    provenance: dict[str, Any] | None = None,
) -> str:
    """Train the NER of ``cfg.extraction`` on ``corpus`` (a corpus config with gold spans) into ``out``;
    returns a one-line summary. An identical model already at ``out`` is kept unless ``force``."""
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import TrainJob, ner_model_dir, train_cached
    from ctrlgen.extract.ner import META_FILE

    ex = cfg.extraction
    docs, quarantined, _ = load_corpus(corpus)
    if limit:
        docs = docs[:limit]
    if not docs:
        raise CtrlgenError(f"train-ner: the corpus {corpus.path} has no documents to train on")
    # The key: what the model is trained on and how; an existing model with the same key is kept.
    key = ner_model_dir(Path("."), docs, ex.ner_training, cfg.nlp.spacy_model, "k").name
    meta_path = Path(out) / META_FILE
    if meta_path.is_file() and not force:
        old = json.loads(meta_path.read_text()).get("trained_on", {}).get("key")
        if old == key:
            return f"train-ner: {out} is already trained on these {len(docs)} documents with these settings (--force retrains)"
    if Path(out).exists():
        shutil.rmtree(out)
    meta = {"key": key, "corpus": corpus.path, "format": corpus.format, "documents": len(docs),
            "quarantined": len(quarantined), "limit": limit, **(provenance or {})}  # fmt: skip
    job = TrainJob(list(docs), Path(out), ex.ner_training, cfg.nlp.spacy_model, ex.name_lists, meta)
    train_cached([job], 1)  # in a fresh process with the pinned BLAS environment (spaCy NERs)
    res = json.loads(meta_path.read_text())
    kernels = ", ".join(f"{b['internal_api']} {b['architecture']}" for b in res["blas"]) or "BLAS unknown"
    kernels += " kernels"
    recorded, section = RECORDED, "the clinical NER's weights across CPUs"
    if ex.ner_training.kind == "transformer":
        t = res["trained_on"]
        kernels = (f"torch's {t.get('torch_cpu_capability', '?')} kernels on {t.get('torch_threads', '?')} threads, "
                   f"numerics {t.get('numerics', 'native')},")  # fmt: skip
        recorded, section = RECORDED_TAGGER, "the veto tagger's weights across CPUs"
    same = compare_to_recorded(res["trained_on"].get("key", ""), res["weights_sha256"], recorded, section)
    return (f"train-ner: NER trained on {res['documents']} documents ({res['spans']} spans), {res['epochs']} epochs, "
            f"seed {res['seed']}, in {res['seconds']:.0f} s -> {out}; weights sha256 {res['weights_sha256']} "
            f"({kernels} on {res.get('cpu') or 'an unrecorded CPU'}){'; ' + same if same else ''}")  # fmt: skip


#: the configured NER's hash on each CPU benchmarks/ner_kernels.py ran on (absent from an installed package)
RECORDED = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "ner_kernels.json"
#: the veto tagger's (configs/extract_physionet_transformer.yaml) hash on each CPU benchmarks/tagger_kernels.py ran on
RECORDED_TAGGER = RECORDED.with_name("tagger_kernels.json")


def recorded_machines(recorded: Path) -> dict[str, Any]:
    """A kernels benchmark's record (benchmarks/ner_kernels.py or tagger_kernels.py): its entry per CPU, {} when
    there is none (an installed package, or a file that does not parse)."""
    try:
        machines = json.loads(recorded.read_text())["machines"]
    except (OSError, ValueError, KeyError):
        return {}
    return machines if isinstance(machines, dict) else {}


def weight_groups(rows: list[dict[str, Any]], name: Callable[[dict[str, Any]], str]) -> dict[str, list[str]]:
    """Runs grouped by the weights they trained: each ``sha256`` (first seen first) and its runs' names."""
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["sha256"], []).append(name(r))
    return by


def compare_to_recorded(key: str, sha256: str, recorded: Path = RECORDED,
                        section: str = "the clinical NER's weights across CPUs",
                        machines: dict[str, Any] | None = None) -> str:
    """Whether a model just trained has the weights recorded for the same training (its cache ``key``) on other
    CPUs by benchmarks/ner_kernels.py (a tagger: benchmarks/tagger_kernels.py, ``recorded``; ``section``: where
    docs/benchmarks.md shows them; ``machines``: that file's entries when already read): "" when none is recorded
    for that key."""
    machines = recorded_machines(recorded) if machines is None else machines
    same: list[str] = []
    other: list[str] = []
    for cpu, m in machines.items():
        conf = m.get("configured", {})
        if conf.get("key") == key:
            (same if conf.get("sha256") == sha256 else other).append(cpu)
    parts = []
    if same:
        parts.append(f"the weights recorded on {', '.join(same)}")
    if other:
        parts.append(
            f"NOT the weights recorded on {', '.join(other)} (the same training on another CPU: "
            f"docs/benchmarks.md, {section})"
        )
    return f"{' and '.join(parts)} ({recorded.name})" if parts else ""


def ensure_ner_model(cfg: CtrlgenConfig, log: Callable[[str], None] = _log) -> None:
    """Before an unknown-setting extraction: train ``extraction.ner_model`` from ``extraction.ner_training.data``
    when it is not trained yet (nothing to do in the known setting, without a ner_model, or for a URI).

    Raises:
        CtrlgenError: the model is missing and no training data is configured; ``extraction.ner_veto`` holds no
            trained transformer NER (it is never trained on first use).
    """
    from ctrlgen import storage
    from ctrlgen.extract.ner import META_FILE

    ex = cfg.extraction
    if ex.setting == "unknown" and ex.ner_veto:  # not trained on first use: named here, before any actor starts
        from ctrlgen.extract.transformer_ner import check_veto_model

        check_veto_model(ex.ner_veto)
    if ex.setting != "unknown" or not ex.ner_model or storage.is_uri(ex.ner_model):
        return
    if (Path(ex.ner_model) / META_FILE).is_file():
        return
    data = ex.ner_training.data
    if data is None:
        raise CtrlgenError(
            f"extraction.ner_model {ex.ner_model} holds no trained NER: train it with `ctrlgen train-ner -c <config>`, "
            "or set extraction.ner_training.data (a corpus with gold spans) to train it on first use"
        )
    log(f"extract: the clinical NER {ex.ner_model} is not trained yet: training it on the {data.format} corpus "
        f"{data.path} first (minutes; once)")  # fmt: skip
    log(train_configured_ner(cfg, data, ex.ner_model, provenance={"trained_on_first_use": True}))


def set_up_spread(key: str, fold_hashes: list[str], recorded: Path = RECORDED) -> str:
    """Markdown: the configured engine's patient-level CV on each CPU's own fold NERs, as benchmarks/ner_kernels.py
    ``--cv`` recorded it for the training of cache ``key``, with the range over those CPUs and which CPU's fold
    NERs ``fold_hashes`` (this run's) are; "" when no CPU's CV is recorded for that training."""
    rows = {cpu: m["cv"] for cpu, m in recorded_machines(recorded).items()
            if m.get("cv") and m.get("configured", {}).get("key") == key}  # fmt: skip
    if not rows:
        return ""
    lines = ["| CPU | fold NERs sha256 | recall % | precision % | found / gold | predicted |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [cv_row(cpu, c) for cpu, c in rows.items()]
    same = [cpu for cpu, c in rows.items() if [f["sha256"] for f in c["folds"]] == fold_hashes]
    spread = cv_range(list(rows.values()))
    return (
        "\nThe configured engine over set-ups (the rules frozen: no in-fold selection), cross-validated by patient "
        "with the fold NERs each CPU trains (benchmarks/ner_kernels.py `--cv`, recorded in "
        f"docs/benchmarks/{recorded.name}): a CPU whose set-up trains other weights gives other figures.\n\n"
        + "\n".join(lines) + "\n\n"
        + (f"**Range over set-ups on these {len(rows)} CPUs: {spread}.**" if len(rows) > 1
           else "One CPU recorded for this training so far: no range yet.")
        + " This run's fold NERs are "
        + (f"those recorded on {', '.join(same)}." if same else "none of those recorded (another CPU).")
        + "\n"
    )  # fmt: skip


def veto_numerics(ex: ExtractionConfig | None, recorded: Path = RECORDED_TAGGER) -> str:
    """The extraction report head's sentences on the numerics of the veto engine ``ex``'s taggers: the configured
    tagger's (its metadata), what benchmarks/tagger_kernels.py recorded for its training (``recorded``), the fold
    taggers'; "" without a veto or with an untrained one."""
    from ctrlgen.extract.ner import META_FILE

    meta_file = Path(ex.ner_veto) / META_FILE if ex is not None and ex.ner_veto else None
    if ex is None or meta_file is None or not meta_file.is_file():
        return ""
    meta = json.loads(meta_file.read_text())
    t = meta.get("trained_on", {})
    trained = t.get("numerics", "native")  # "native", or the pinned numerics' description
    numerics = "native numerics" if trained == "native" else f"pinned numerics ({trained})"
    text = (f" This run's veto tagger ({ex.ner_veto}) trained on {numerics}, torch's "
            f"{t.get('torch_cpu_capability', 'unrecorded')} kernels on {t.get('torch_threads', '?')} threads, on "
            f"{meta.get('cpu') or 'an unrecorded CPU'}: weights sha256 `{meta.get('weights_sha256', '?')[:16]}`")  # fmt: skip
    machines = recorded_machines(recorded)
    same = compare_to_recorded(t.get("key", ""), meta.get("weights_sha256", ""), recorded,
                               "the veto tagger's weights across CPUs", machines)  # fmt: skip
    text += f", {same}." if same else " (no record of its training in benchmarks/tagger_kernels.py's runs)."
    for cpu, m in sorted(machines.items()):
        red = m.get("reduced", {})
        pinned = [r["sha256"] for r in red.get("rows", []) if r["numerics"] == "pinned"]
        native = [r["sha256"] for r in red.get("rows", []) if r["numerics"] == "native"]
        text += (f" Its reduced training on {cpu}: {len(set(native))} distinct weights over {len(native)} native "
                 f"runs (threads and kernels set otherwise), {len(set(pinned))} over {len(pinned)} pinned ones")  # fmt: skip
        for variant in ("native", "pinned"):
            runs = [e for e in red.get("emulated", []) if e.get("variant", e["numerics"]) == variant]
            if not any(e.get("model") for e in runs):
                continue
            groups = weight_groups(runs, lambda e: e["model"] or "that CPU")
            text += (f"; a tiny encoder's {variant} training there and under qemu-user's CPU models, grouped by "
                     "weights: " + " | ".join(", ".join(g) for g in groups.values()))  # fmt: skip
        text += "."
    h = ex.ner_veto_training
    if h is not None:
        text += " The cross-validation's fold and inner taggers (`extraction.ner_veto_training`) train on " + (
            "this CPU's native numerics (trained before the pin; pinning them retrains every one): the veto rows "
            "below are one set-up's taggers, not a range over set-ups." if h.numerics == "native"
            else f"{'pinned' if trained == 'native' else 'the same pinned'} numerics.")  # fmt: skip
    return text


def cv_row(cpu: str, c: dict[str, Any], *cells: str) -> str:
    """A Markdown row of one CPU's ``--cv`` record (benchmarks/ner_kernels.py): its fold NERs' hashes, pooled recall
    and precision, found / gold and predicted; ``cells`` go between the CPU and the hashes."""
    hashes = ", ".join(f"`{f['sha256'][:8]}`" for f in c["folds"])
    return (f"| {' | '.join([cpu, *cells])} | {hashes} | {100 * c['recall']:.1f} | {100 * c['precision']:.1f} | "
            f"{c['found']} / {c['gold']} | {c['predicted']} |")  # fmt: skip


def cv_range(records: list[dict[str, Any]]) -> str:
    """The range of ``--cv`` records' pooled recall and precision, in percent."""
    rec = [100 * c["recall"] for c in records]
    pre = [100 * c["precision"] for c in records]
    return f"recall {min(rec):.1f}-{max(rec):.1f}%, precision {min(pre):.1f}-{max(pre):.1f}%"
