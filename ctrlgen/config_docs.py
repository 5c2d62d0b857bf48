"""Field descriptions of the config models: ``ctrlgen config --describe`` and docs/configuration.md.

Both are generated from the pydantic models of :mod:`ctrlgen.config` (types, defaults and each field's
``description``), so the page cannot drift from the code: a test renders it and compares.

Example:
    >>> rows = describe()
    >>> any(r.key == "generation.sampling.temperature" and r.default == "0.7" for r in rows)
    True
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ctrlgen.config import CorpusConfig, CtrlgenConfig

__all__ = ["FieldDoc", "describe", "describe_text", "render_markdown"]


@dataclass(frozen=True)
class FieldDoc:
    key: str  # dotted path (corpus fields: corpus.<field>, per format)
    type: str
    default: str
    description: str


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, dict):
        args = ", ".join(_type_name(a) for a in typing.get_args(tp) if a is not Ellipsis)
        return f"{origin.__name__}[{args}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value) if not isinstance(value, str) else value


def _submodel(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return None


def _walk(model: type[BaseModel], prefix: str, out: list[FieldDoc]) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _submodel(field.annotation)
        if sub is not None:
            out.append(FieldDoc(key, "section", "", (field.description or sub.__doc__ or "").strip().split("\n")[0]))
            _walk(sub, key + ".", out)
            continue
        if name == "corpus" and not prefix:
            out.append(FieldDoc(key, "section", "", "The corpus to read; its fields depend on `corpus.format`."))
            continue
        desc = " ".join((field.description or "").split())
        out.append(FieldDoc(key, _type_name(field.annotation), _default(field), desc))


def _corpus_configs() -> dict[str, type[BaseModel]]:
    """format -> its corpus model (the members of the discriminated union ``CorpusConfig``)."""
    members = typing.get_args(typing.get_args(CorpusConfig)[0])
    return {m.model_fields["format"].default: m for m in members}


def describe() -> list[FieldDoc]:
    """Every config field, depth first in declaration order (the corpus formats after the root's fields)."""
    out: list[FieldDoc] = []
    _walk(CtrlgenConfig, "", out)
    for fmt, cls in _corpus_configs().items():
        for row in _corpus_rows(cls):
            out.append(FieldDoc(f"corpus[{fmt}].{row.key}", row.type, row.default, row.description))
    return out


def _corpus_rows(cls: type[BaseModel]) -> list[FieldDoc]:
    rows: list[FieldDoc] = []
    _walk(cls, "", rows)
    return rows


def describe_text(cfg: CtrlgenConfig | None = None) -> str:
    """``key = value  # type; description`` for every field, values from ``cfg`` (resolved) or the defaults."""
    data = (cfg or CtrlgenConfig()).model_dump(mode="json")
    fmt = data["corpus"]["format"]
    rows = describe()
    corpus_rows = [r for r in rows if r.key.startswith(f"corpus[{fmt}].")]
    lines = []
    for row in rows:
        if row.key.startswith("corpus["):
            continue
        if row.type == "section":
            lines.append(f"\n# {row.key}: {row.description}")
            if row.key == "corpus":  # the fields of the format this config reads
                for c in corpus_rows:
                    key = "corpus." + c.key.split("].", 1)[1]
                    lines.append(f"{key} = {json.dumps(data['corpus'].get(key[7:]))}  # {c.type}; {c.description}")
            continue
        node: Any = data
        for part in row.key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        lines.append(f"{row.key} = {json.dumps(node)}  # {row.type}; {row.description}")
    return "\n".join(lines).lstrip("\n") + "\n"


_HEAD = """# Configuration

Generated from the config models (`ctrlgen/config.py`) by `ctrlgen config --markdown --out docs/configuration.md`;
a test checks that this page equals the rendering. `ctrlgen config --describe -c FILE` prints the same
descriptions beside the values a config resolves to.

One YAML file per run under `configs/`, each a full config whose missing sections and fields take the defaults
below. Unknown keys are errors, named with their path. Overrides go after the options, `key.sub=value`, values
parsed as YAML:

```bash
ctrlgen synthesize -c configs/quickstart.yaml corpus.path=/data/NOTEEVENTS.csv generation.num_documents=500
ctrlgen ingest -c configs/corpora/tab.yaml corpus.annotator=annotator10 corpus.segments='[[1, 12]]'
```

From Python: `ctrlgen.build_config("configs/quickstart.yaml", corpus="/data/NOTEEVENTS.csv",
generation={"num_documents": 500})` (docs/quickstart.md).

What a user must set: `corpus.format` and `corpus.path` (their notes), `extraction.setting` (known for
`[**...**]` placeholders, unknown for raw notes), `output_dir`. Everything else has a working default.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """docs/configuration.md: one table per section, one per corpus format."""
    rows = describe()
    parts = [_HEAD]
    table: list[str] = []

    def flush() -> None:
        if table:
            parts.append("| key | type | default | description |\n|---|---|---|---|\n" + "\n".join(table) + "\n")
            table.clear()

    parts.append("## Top level\n")
    for row in rows:
        if row.type == "section":
            flush()
            parts.append(f"## `{row.key}`\n\n{row.description}\n")
            continue
        if row.key.startswith("corpus[") and row.key.endswith("].path"):
            flush()
            fmt = row.key[len("corpus[") : row.key.index("]")]
            if fmt == next(iter(_corpus_configs())):
                parts.append("## `corpus`, per `corpus.format`\n\nEach reader's fields (`corpus.<field>`).\n")
            parts.append(f"### `corpus.format: {fmt}`\n")
        table.append(f"| `{_cell(row.key)}` | {_cell(row.type)} | `{_cell(row.default)}` | {_cell(row.description)} |")
    flush()
    return "\n".join(parts)
