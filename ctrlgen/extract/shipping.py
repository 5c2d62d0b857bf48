"""One set of extraction models for every actor of a job: its driver's.

``make setup`` trains the clinical NER and the veto's tagger on each machine, and a machine of another CPU or
core count can train other weights (docs/extraction.md, the models' reproducibility). On a cluster whose nodes
each ran ``make setup``, one job's actors would then find different spans in the same note, by node. So a job
ships the models its driver loads: the driver reads each trained model directory the engine names
(:func:`trained_models`, :func:`model_files`), each actor compares its node's copy by digest
(:func:`~ctrlgen.extract.ner.model_digest`, the ``weights_sha256`` that ``ctrlgen train-ner`` records) and, where
that copy is missing or differs, writes the driver's files under the cache (:func:`unpack_model`, checked against
the digest) and loads those. Pure functions: the transport (Ray's object store) is ray_jobs/extract.py's.

Example:
    >>> import tempfile
    >>> from ctrlgen.extract.ner import META_FILE, model_digest
    >>> src, cache = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    >>> _ = (src / "weights.bin").write_bytes(b"w"), (src / META_FILE).write_text("{}")
    >>> copy = unpack_model(model_files(src), model_digest(src), cache)
    >>> model_digest(copy) == model_digest(src), unpack_model(model_files(src), model_digest(src), cache) == copy
    (True, True)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ctrlgen.config import ExtractionConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.extract.ner import META_FILE, files_digest, model_digest

__all__ = ["MODEL_FIELDS", "check_models", "model_digests", "model_files", "resolve_model", "trained_models",
           "unpack_model"]  # fmt: skip

#: The extraction settings that name a trained model directory the engine loads
MODEL_FIELDS: tuple[str, ...] = ("ner_model", "ner_veto")


def trained_models(cfg: ExtractionConfig) -> dict[str, str]:
    """The trained model directories (a ``META_FILE`` beside their files) that ``cfg``'s engine loads, by setting.
    A setting that names no trained model here (unset, a spaCy package, a path not trained yet) is left out: the
    actor loads it as the setting says, with that setting's own errors."""
    if cfg.setting != "unknown":
        return {}
    return {f: str(p) for f in MODEL_FIELDS if (p := getattr(cfg, f)) and (Path(p) / META_FILE).is_file()}


def model_digests(cfg: ExtractionConfig) -> dict[str, str]:
    """The :func:`~ctrlgen.extract.ner.model_digest` of each of :func:`trained_models`, by setting."""
    return {f: model_digest(p) for f, p in trained_models(cfg).items()}


def _trained_digest(path: str | Path) -> str:
    """:func:`~ctrlgen.extract.ner.model_digest` of the trained model at ``path``; "" when none is there."""
    return model_digest(path) if (Path(path) / META_FILE).is_file() else ""


def check_models(cfg: ExtractionConfig, expected: dict[str, str]) -> None:
    """A :class:`CtrlgenError` when this machine's copy of a model ``cfg`` names has not the digest in ``expected``
    (:func:`model_digests` where the service was built): a replica that would find other spans than the others."""
    for setting, digest in expected.items():
        path = Path(getattr(cfg, setting) or "")
        found = _trained_digest(path)
        if found != digest:
            raise CtrlgenError(
                f"extraction.{setting}: this node's {path} is not the model the service was built with "
                f"({'digest ' + found[:16] if found else 'no trained model there'}; built with {digest[:16]}): copy "
                "that model's directory here (every replica must find the same spans; docs/cluster.md)"
            )


def model_files(path: str | Path) -> dict[str, bytes]:
    """Every file of a trained model directory, by its name relative to ``path`` (its ``META_FILE`` included)."""
    root = Path(path)
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def unpack_model(files: dict[str, bytes], digest: str, root: Path) -> Path:
    """The model of ``files`` (:func:`model_files`) as a directory under ``root``, named by ``digest`` (its
    :func:`~ctrlgen.extract.ner.model_digest`): written once per machine and reused (several actors of a node may
    write it at once: each writes its own copy, and one finding a good copy already there keeps it). A
    :class:`CtrlgenError` when the files do not have that digest or a name leaves the directory."""
    dest = root / f"model-{digest[:32]}"
    if _trained_digest(dest) == digest:
        return dest
    root.mkdir(parents=True, exist_ok=True)
    for name in files:
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise CtrlgenError(f"a shipped model file has a name outside its directory: {name!r}")
    got = files_digest(files)
    if got != digest:
        raise CtrlgenError(f"the shipped model's files have digest {got[:16]}, not the driver's {digest[:16]}")
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".incoming-"))
    try:
        for name, data in files.items():
            out = tmp.joinpath(*PurePosixPath(name).parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        if _trained_digest(dest) == digest:  # another actor of this node was first
            return dest  # (kept as it is: that actor may be loading it)
        if dest.exists():  # a stale or partial copy (its digest differs): replaced
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.rename(tmp, dest)
        except OSError:  # another actor of this node renamed its copy first
            if _trained_digest(dest) != digest:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve_model(path: str, digest: str, fetch: Callable[[], dict[str, bytes]], root: Path) -> tuple[str, str]:
    """The directory to load for a model the driver loads from ``path`` with ``digest``: ``path`` itself when this
    machine's copy there has that digest, else the driver's copy, its files got by calling ``fetch()`` and unpacked
    under ``root``. Also a line for the actor's log saying which (names and digests only), "" when ``path`` is used."""
    local = _trained_digest(path)
    if local == digest:
        return path, ""
    found = f"digest {local[:16]}" if local else "no trained model there"
    dest = unpack_model(fetch(), digest, root)
    return str(dest), (
        f"this node's {path} is not the driver's model ({found}; the driver's {digest[:16]}): loading the driver's "
        f"copy from {dest}"
    )
