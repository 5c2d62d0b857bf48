"""Training the configured clinical NER: by `ctrlgen train-ner`, or on first use of the unknown setting.

:func:`train_configured_ner` trains ``extraction.ner_model`` on a corpus with gold spans (kept when a model
trained on the same documents with the same settings is already there); :func:`ensure_ner_model` is what
the extraction job calls first: an untrained ``ner_model`` is trained from ``extraction.ner_training.data``,
or named in a clear error.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctrlgen.config import CtrlgenConfig
from ctrlgen.errors import CtrlgenError

__all__ = ["ensure_ner_model", "train_configured_ner"]


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
    env = pinned_blas_env()
    if env and any(os.environ.get(k) != v for k, v in env.items()):
        # OpenBLAS reads its kernel choice when numpy loads: train in a fresh process that starts with it set.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                pool.submit(train_cached, [job], 1).result()
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    else:
        train_cached([job], 1)
    res = json.loads(meta_path.read_text())
    kernels = ", ".join(f"{b['internal_api']} {b['architecture']}" for b in res["blas"]) or "BLAS unknown"
    same = compare_to_recorded(res["trained_on"].get("key", ""), res["weights_sha256"])
    return (f"train-ner: NER trained on {res['documents']} documents ({res['spans']} spans), {res['epochs']} epochs, "
            f"seed {res['seed']}, in {res['seconds']:.0f} s -> {out}; weights sha256 {res['weights_sha256']} "
            f"({kernels} kernels){'; ' + same if same else ''}")  # fmt: skip


#: the configured NER's hash on each CPU benchmarks/ner_kernels.py ran on (absent from an installed package)
RECORDED = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "ner_kernels.json"


def compare_to_recorded(key: str, sha256: str, recorded: Path = RECORDED) -> str:
    """Whether a model just trained has the weights recorded for the same training (its cache ``key``) on other
    CPUs by benchmarks/ner_kernels.py: "" when none is recorded for that key."""
    try:
        machines = json.loads(recorded.read_text())["machines"]
    except (OSError, ValueError, KeyError):
        return ""
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
        parts.append(f"NOT the weights recorded on {', '.join(other)} (this CPU's kernels differ)")
    return f"{' and '.join(parts)} ({recorded.name})" if parts else ""


def pinned_blas_env() -> dict[str, str]:
    """The environment that makes the NER's training use the same floating-point kernels on every x86-64 CPU with
    AVX2, read when numpy loads (so training runs in a fresh process started with it):

    - ``OPENBLAS_CORETYPE=Haswell``: OpenBLAS (numpy's, which runs the matrix products: :data:`~ctrlgen.extract.ner.
      NUMERICS`) otherwise picks its kernels per CPU (SkylakeX, Haswell, Zen...), and the weights then differ in
      their last bits, which training amplifies;
    - ``OPENBLAS_NUM_THREADS=1``: its products split over threads give other last bits than on one thread (two
      threads on 2 cores, another count elsewhere: another model), and the NER's matrices are small;
    - ``NPY_DISABLE_CPU_FEATURES``: numpy's own loops above AVX2 (its AVX-512 dispatch targets, on CPUs that have
      them) switched off, so an AVX-512 CPU runs the AVX2 loops every other such CPU runs.

    Empty elsewhere (another architecture, or a CPU without AVX2/FMA). Training is deterministic on one machine with
    or without it (seeded; checked by tests/unit/test_clinical_ner.py)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return {}
    if not {"avx2", "fma"} <= flags:
        return {}
    return {
        "OPENBLAS_CORETYPE": "Haswell",
        "OPENBLAS_NUM_THREADS": "1",
        "NPY_DISABLE_CPU_FEATURES": " ".join(numpy_above_avx2()),
    }


def numpy_above_avx2() -> list[str]:
    """numpy's dispatch targets above AVX2 (x86-64-v3) in this numpy build: x86-64-v4 and the AVX-512 groups."""
    import importlib

    umath = importlib.import_module("numpy._core._multiarray_umath")
    return [f for f in umath.__cpu_dispatch__ if f == "X86_V4" or f.startswith("AVX512")]


def ensure_ner_model(cfg: CtrlgenConfig, log: Callable[[str], None] = _log) -> None:
    """Before an unknown-setting extraction: train ``extraction.ner_model`` from ``extraction.ner_training.data``
    when it is not trained yet (nothing to do in the known setting, without a ner_model, or for a URI).

    Raises:
        CtrlgenError: the model is missing and no training data is configured.
    """
    from ctrlgen import storage
    from ctrlgen.extract.ner import META_FILE

    ex = cfg.extraction
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
