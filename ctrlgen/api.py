"""The Python API: the pipeline's jobs as functions, for notebooks and scripts.

Each function takes a config (a YAML path, a :class:`~ctrlgen.config.CtrlgenConfig` or nothing for
the defaults), the corpus and output directory as plain arguments, and any other setting as a
section mapping (``generation={"num_documents": 100}``) or dotted overrides
(``overrides=["generation.sampling.max_new_tokens=256"]``). Jobs run on the Ray cluster this
process is connected to (``ray.init(...)`` first), else on ``ray_address``, else on a private local
cluster started on first use and kept for the next call. Importing this module imports no Ray.

Example (docs/quickstart.md)::

    import ctrlgen

    result = ctrlgen.synthesize("/data/NOTEEVENTS.csv", "runs/mynotes", config="configs/quickstart.yaml")
    print(result.release, result.card["exported"])
    print(open(result.release + "/RELEASE.md").read())
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, apply_overrides, load_config

__all__ = ["SynthesisResult", "build_config", "evaluate", "export", "extract", "synthesize"]


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def build_config(
    config: str | CtrlgenConfig | None = None,
    *,
    corpus: str | Mapping[str, Any] | None = None,
    output: str | None = None,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> CtrlgenConfig:
    """A validated config: ``config`` (file, object or defaults), then ``corpus`` (a path, or the
    corpus section), ``output``, ``ray_address``, the ``sections`` mappings and the dotted ``overrides``.

    Raises:
        ConfigError: the result does not validate; the message names the keys.
    """
    base = config if isinstance(config, CtrlgenConfig) else load_config(config)
    data = base.model_dump(mode="json")
    update: dict[str, Any] = {k: v for k, v in sections.items() if v is not None}
    if corpus is not None:
        update["corpus"] = {"path": corpus} if isinstance(corpus, str) else dict(corpus)
        if update["corpus"].get("format", data["corpus"]["format"]) != data["corpus"]["format"]:
            data["corpus"] = {}  # another reader: its own fields, not the old reader's
    if output is not None:
        update["output_dir"] = output
    if ray_address is not None:
        update["ray"] = {"address": ray_address}
    data = apply_overrides(_merge(data, update), list(overrides))
    from pydantic import ValidationError

    from ctrlgen.errors import ConfigError

    try:
        return CtrlgenConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


@dataclass
class SynthesisResult:
    """What :func:`synthesize` made: where, the stages, and the release card when there is a release."""

    output: str
    release: str | None
    card: dict[str, Any] | None
    stages: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    summary: str = ""

    def __str__(self) -> str:
        return self.summary


def synthesize(
    corpus: str | Mapping[str, Any] | None = None,
    output: str | None = None,
    *,
    config: str | CtrlgenConfig | None = None,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> SynthesisResult:
    """The whole pipeline (``ctrlgen synthesize``): extraction, prefix training when asked, generation with
    blocking and the release gate, leakage scoring and the export with its release card."""
    from ray_jobs.synthesize import run

    cfg = build_config(config, corpus=corpus, output=output, ray_address=ray_address, overrides=overrides, **sections)
    s = run(cfg)
    release = storage.absolute(cfg.export.output or storage.join(s.output, "release"))
    card_path = storage.join(release, "release.json")
    has_release = storage.exists(card_path)
    card = json.loads(storage.read_text(card_path)) if has_release else None
    return SynthesisResult(s.output, release if has_release else None, card, dict(s.stages), s.seconds, s.text())


def extract(
    corpus: str | Mapping[str, Any] | None = None,
    output: str | None = None,
    *,
    config: str | CtrlgenConfig | None = None,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> Any:
    """The extraction job (``ctrlgen extract``): entities and control codes into ``<output>/extracted``;
    returns its summary (counts in = out + quarantined, entities per category, warnings)."""
    from ray_jobs.extract import run

    return run(build_config(config, corpus=corpus, output=output, ray_address=ray_address, overrides=overrides,
                            **sections))  # fmt: skip


def evaluate(
    output: str | None = None,
    *,
    config: str | CtrlgenConfig | None = None,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> Any:
    """The evaluation job (``ctrlgen evaluate``): per-document privacy metrics of ``<output>/generated``."""
    from ray_jobs.evaluate import run

    return run(build_config(config, output=output, ray_address=ray_address, overrides=overrides, **sections))


def export(
    output: str | None = None,
    *,
    config: str | CtrlgenConfig | None = None,
    overrides: Sequence[str] = (),
    **sections: Any,
) -> Any:
    """The releasable corpus of the pipeline output ``output`` and its release card (``ctrlgen export``;
    no Ray); returns an :class:`~ctrlgen.export.ExportSummary` (``.card``: the card's content)."""
    from ctrlgen.export import export_run

    return export_run(build_config(config, output=output, overrides=overrides, **sections))
