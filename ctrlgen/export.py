"""The releasable corpus of a pipeline output, and its release card (no Ray).

A generation output is not a release: its rows carry the real values of their contexts
(``context_values``, ``leaked``), real note ids (``doc_id``, ``context_ids``), and the
``baseline`` / ``icl`` modes put real notes in the prompt and block nothing. :func:`export_run`
writes only what may leave the building:

* rows of the modes that may be released (``icl_blocking``, ``prefix``; ``baseline`` and ``icl``
  never), generated without error and released by the gate;
* checked once more, row by row (a run with the gate off gets the check too):

  - against the row's own private values, with every variant the gate knows
    (:mod:`ctrlgen.variants`): its contexts' values (ICL) or the fine-tuning set's (prefix);
  - against every private value of the corpus of at least ``export.min_value_chars``
    characters, as written (case and whitespace folded, word boundaries): a real value copied
    from any note, not only the row's own contexts;

  a row that fails is withheld and counted, never written;
* columns ``id`` (``syn-0000001``, in export order), ``mode``, ``text`` and ``control_code`` (the
  fictional code that drove it); no real id, context id or value;
* in parquet, jsonl, csv (MIMIC ``NOTEEVENTS`` columns: ``ctrlgen``'s mimic reader reads it back) or
  ``hf`` (``data/train-*.parquet`` and a dataset card: ``datasets.load_dataset(<dir>)``);
* with a release card, ``RELEASE.md`` and ``release.json``: what was run, sizes, what was withheld
  and why, leakage figures with intervals, and which guarantee holds (:func:`guarantee`).

Rows stream file by file and batch by batch; only the corpus' value index and the contexts'
codes are held in memory.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ctrlgen import storage
from ctrlgen.codes import parse_control_code
from ctrlgen.config import CtrlgenConfig
from ctrlgen.corpora.mimic import NOTEEVENTS_COLUMNS
from ctrlgen.errors import ConfigError, CtrlgenError
from ctrlgen.intervals import wilson
from ctrlgen.metrics.leakage import ValueIndex, leaked_values
from ctrlgen.variants import Value, code_items

__all__ = [
    "LEAKY_MODES",
    "ExportSummary",
    "ModeCounts",
    "export_run",
    "guarantee",
    "release_card",
]

#: Modes whose prompt holds real notes with nothing blocked: they leak by design and are never exported.
LEAKY_MODES = ("baseline", "icl")
_READ_COLUMNS = ["doc_id", "context_ids", "fictional_code", "text", "leaked_first", "released", "status"]


@dataclass
class ModeCounts:
    """One mode's rows from generation to release."""

    generated: int = 0  # rows of the generation output
    failed: int = 0  # generation errors (status != ok): never released
    first_leaks: int = 0  # rows whose first attempt held one of the row's own values (before the gate)
    withheld_gate: int = 0  # still leaking after the gate's retries
    withheld_own: int = 0  # released by the generation run, but holding one of the row's own values here
    withheld_corpus: int = 0  # holding a private value of another note of the corpus
    exported: int = 0

    def check(self) -> None:
        total = self.failed + self.withheld_gate + self.withheld_own + self.withheld_corpus + self.exported
        if total != self.generated:  # rows are never lost silently
            raise CtrlgenError(f"export counts do not balance: {self.generated} rows in, {total} accounted for")


@dataclass
class ExportSummary:
    output: str
    format: str
    modes: dict[str, ModeCounts]
    files: list[str]
    card: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def exported(self) -> int:
        return sum(c.exported for c in self.modes.values())

    def text(self) -> str:
        lines = [
            f"export: {self.exported:,} synthetic notes in {len(self.files)} {self.format} file(s) under {self.output}"
        ]
        for mode, c in self.modes.items():
            lines.append(
                f"  {mode}: {c.generated:,} generated, {c.exported:,} exported; withheld: {c.failed} failed, "
                f"{c.withheld_gate} by the gate, {c.withheld_own} with a value of their own contexts, "
                f"{c.withheld_corpus} with a value of another note"
            )
        lines.append(f"  release card: {storage.join(self.output, 'RELEASE.md')}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Paths:
    generated: str
    extracted: str
    adapter: str
    train_data: str
    output: str


def _paths(cfg: CtrlgenConfig) -> _Paths:
    out = storage.absolute(cfg.output_dir)
    g = cfg.generation
    return _Paths(
        generated=storage.absolute(cfg.evaluation.input or storage.join(out, "generated")),
        extracted=storage.absolute(g.input or storage.join(out, "extracted")),
        adapter=storage.absolute(g.adapter or storage.join(out, "adapter")),
        train_data=storage.absolute(g.finetune_data or storage.join(out, "train_data")),
        output=storage.absolute(cfg.export.output or storage.join(out, "release")),
    )


def _mode_of(path: str) -> str | None:
    for part in path.split("/"):
        if part.startswith("mode="):
            return part[len("mode=") :]
    return None


def _files_by_mode(generated: str) -> dict[str, list[str]]:
    files = storage.parquet_files(generated)
    if not files:
        raise CtrlgenError(f"{generated} holds no generated Parquet files (run `ctrlgen synthesize` first)")
    by: dict[str, list[str]] = {}
    for f in files:
        mode = _mode_of(f)
        if mode is not None:
            by.setdefault(mode, []).append(f)
    return by


def _modes(cfg: CtrlgenConfig, present: Sequence[str]) -> list[str]:
    asked = cfg.export.modes
    if asked is not None:
        bad = [m for m in asked if m in LEAKY_MODES]
        if bad:
            raise ConfigError(
                f"export.modes lists {', '.join(bad)}: these modes put real notes in the prompt and block nothing, "
                "so they leak by design and are never exported (use icl_blocking or prefix)"
            )
        missing = [m for m in asked if m not in present]
        if missing:
            raise CtrlgenError(f"export.modes lists {', '.join(missing)}, which this run did not generate")
        return list(asked)
    modes = [m for m in present if m not in LEAKY_MODES]
    if not modes:
        raise CtrlgenError(
            f"this run generated only {', '.join(sorted(present))}, which leak by design: add icl_blocking "
            "(or prefix) to generation.modes to get a releasable corpus"
        )
    return sorted(modes)


def _batches(files: Sequence[str], columns: Sequence[str], batch_rows: int = 4096) -> Iterator[list[dict[str, Any]]]:
    for f in files:
        pf = storage.parquet_file(f)
        have = [c for c in columns if c in pf.schema_arrow.names]
        for batch in pf.iter_batches(batch_size=batch_rows, columns=have):
            yield batch.to_pylist()


def _as_list(value: Any) -> list[str]:
    """A list column, or the string form older outputs wrote."""
    if value is None:
        return []
    if isinstance(value, str):
        import ast

        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return [value] if value else []
        return [str(v) for v in parsed] if isinstance(parsed, (list, tuple)) else [str(parsed)]
    return [str(v) for v in value]


def _references(
    extracted: str, context_ids: set[str], min_chars: int
) -> tuple[dict[str, list[Value]], ValueIndex, int]:
    """The contexts' values (with categories) and an index of the corpus' values of ``min_chars`` or more."""
    from ctrlgen.generation.synthesis import iter_extracted

    contexts: dict[str, list[Value]] = {}
    corpus: set[str] = set()
    for rows in iter_extracted(extracted):
        for r in rows:
            items = code_items(parse_control_code(r["control_code"] or ""))
            if str(r["doc_id"]) in context_ids:
                contexts[str(r["doc_id"])] = items
            corpus.update(str(v) for v in items if len(v.strip()) >= min_chars)
    return contexts, ValueIndex(sorted(corpus)), len(corpus)


class _Writer:
    """Rows into numbered files of one format; returns the files written."""

    def __init__(self, output: str, fmt: str, rows_per_file: int) -> None:
        self.output, self.fmt, self.rows_per_file = output, fmt, rows_per_file
        self.rows: list[dict[str, Any]] = []
        self.files: list[str] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.rows_per_file:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        import pyarrow as pa

        n = len(self.files)
        rows, self.rows = self.rows, []
        # csv: ROW_ID, SUBJECT_ID (one synthetic subject per note), CATEGORY, DESCRIPTION (the mode) and TEXT
        if self.fmt in ("parquet", "hf"):
            name = f"data/train-{n:05d}.parquet" if self.fmt == "hf" else f"notes-{n:05d}.parquet"
            path = storage.join(self.output, name)
            storage.write_parquet(pa.Table.from_pylist(rows), path)
        elif self.fmt == "jsonl":
            path = storage.join(self.output, f"notes-{n:05d}.jsonl")
            storage.write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        else:
            path = storage.join(self.output, f"notes-{n:05d}.csv")
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(NOTEEVENTS_COLUMNS)
            for r in rows:
                num = int(r["id"].rsplit("-", 1)[1])
                w.writerow([num, num, "", "", "", "", "Synthetic", r["mode"], "", "", r["text"]])
            storage.write_text(path, buf.getvalue())
        self.files.append(path)


def export_run(cfg: CtrlgenConfig, progress: Any = None) -> ExportSummary:
    """Write the releasable corpus of the pipeline output ``cfg.output_dir`` and its release card.

    Raises:
        ConfigError: ``export.modes`` asks for a mode that leaks by design.
        CtrlgenError: the run has no generation output, no releasable mode, or an unreadable file.
    """
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    paths = _paths(cfg)
    by_mode = _files_by_mode(paths.generated)
    modes = _modes(cfg, sorted(by_mode))
    files = [f for m in modes for f in by_mode[m]]

    context_ids: set[str] = set()
    for rows in _batches(files, ["context_ids"]):
        for r in rows:
            context_ids.update(_as_list(r.get("context_ids")))
    contexts, corpus_index, n_corpus = _references(paths.extracted, context_ids, cfg.export.min_value_chars)
    say(f"checking against {n_corpus:,} corpus values of {cfg.export.min_value_chars}+ characters and "
        f"the values of {len(contexts):,} context notes")  # fmt: skip
    finetune: ValueIndex | None = None
    if "prefix" in modes:
        from ctrlgen.generation.report import finetune_values

        finetune = ValueIndex(finetune_values(paths.train_data))

    if (
        storage.exists(paths.output)
        and storage.list_files(paths.output)
        and not storage.exists(storage.join(paths.output, "release.json"))
    ):  # only an earlier export is replaced, never another directory
        raise CtrlgenError(f"{paths.output} exists and is not an earlier export: choose another export.output")
    storage.remove(paths.output)
    writer = _Writer(paths.output, cfg.export.format, cfg.export.rows_per_file)
    counts: dict[str, ModeCounts] = {}
    for mode in modes:
        c = counts[mode] = ModeCounts()
        for rows in _batches(by_mode[mode], _READ_COLUMNS):
            for r in rows:
                c.generated += 1
                if _as_list(r.get("leaked_first")):
                    c.first_leaks += 1
                if (r.get("status") or "ok") != "ok":
                    c.failed += 1
                    continue
                if not r.get("released", True):
                    c.withheld_gate += 1
                    continue
                text = r.get("text") or ""
                code = r.get("fictional_code") or ""
                if mode == "prefix":
                    own = bool(finetune.find(text)) if finetune is not None else False
                else:
                    vals = [v for d in _as_list(r.get("context_ids")) for v in contexts.get(d, [])]
                    own = bool(leaked_values(text, vals))
                if own:
                    c.withheld_own += 1
                    continue
                if corpus_index.find(text) or corpus_index.find(code):
                    c.withheld_corpus += 1
                    continue
                c.exported += 1
                writer.add({"id": f"syn-{sum(x.exported for x in counts.values()):07d}", "mode": mode,
                            "text": text, "control_code": code})  # fmt: skip
        c.check()
        say(f"{mode}: {c.exported:,} of {c.generated:,} rows exported")
    writer.flush()
    summary = ExportSummary(paths.output, cfg.export.format, counts, writer.files)
    if cfg.export.format == "hf":
        storage.write_text(storage.join(paths.output, "README.md"), _hf_card(summary))
    summary.card = release_card(cfg, summary, _adapter_privacy(paths.adapter) if "prefix" in modes else None, n_corpus)
    storage.write_text(storage.join(paths.output, "release.json"), json.dumps(summary.card, indent=2) + "\n")
    storage.write_text(storage.join(paths.output, "RELEASE.md"), render_card(summary.card))
    summary.seconds = time.perf_counter() - t0
    return summary


def _adapter_privacy(adapter: str) -> dict[str, Any] | None:
    path = storage.join(adapter, "privacy.json")
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def _hf_card(summary: ExportSummary) -> str:
    return (
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n"
        '---\n\n# Synthetic notes (ctrlgen)\n\nLoad with `datasets.load_dataset("<this directory>")`. '
        "Columns: id, mode, text, control_code (the fictional code). What was withheld and which guarantee "
        "holds: RELEASE.md.\n"
    )


def guarantee(cfg: CtrlgenConfig, modes: Sequence[str], privacy: dict[str, Any] | None) -> dict[str, Any]:
    """Which guarantee holds for the release: formal DP only for rows of a DP-trained prefix, per its unit."""
    checked = (
        "Every exported text was checked, after generation, against its own private values with their "
        "variants (casing, name orders and initials, date formats, identifier separators) and against every "
        f"private value of the corpus of {cfg.export.min_value_chars} or more characters as written; rows that "
        "held one were withheld. This is a check of what the extractor found, not a proof: a value the "
        "extractor missed is neither blocked nor checked, and a paraphrase of a fact is not a value."
    )
    out: dict[str, Any] = {"empirical": checked, "formal": None}
    if cfg.extraction.setting == "unknown":
        out["extraction"] = (
            "Unknown setting: the private values are those ctrlgen's extractor found (docs/extraction.md gives "
            "its recall); every value it missed may appear in the release."
        )
    if "prefix" in modes and privacy is not None:
        unit = privacy.get("unit", "note")
        if privacy.get("not_private"):
            out["formal"] = None
            out["dp_not_private"] = (
                f"The prefix was trained with DP-SGD but its noise was reproducible ({privacy['not_private']}): "
                "no differential privacy holds."
            )
        else:
            out["formal"] = (
                f"The prefix rows are ({privacy['epsilon']:.3g}, {privacy['delta']:g})-differentially private "
                f"per {unit} of the fine-tuning set: adding or removing all the notes of one {unit} changes the "
                "distribution of the trained prefix, and of everything generated from it, by at most that "
                "much, against anyone (the noise came from the operating system's secure random source and "
                "is recorded nowhere). Not covered: the number of values per category of each row's fictional "
                "code, copied from one real note (generation.same_counts), and the icl_blocking rows, whose "
                "prompts hold real notes."
            )
    elif "prefix" in modes:
        out["dp_absent"] = "The prefix was trained without DP-SGD: no formal guarantee."
    return out


def release_card(
    cfg: CtrlgenConfig, summary: ExportSummary, privacy: dict[str, Any] | None, n_corpus_values: int
) -> dict[str, Any]:
    """The release card's content (``release.json``; :func:`render_card` writes ``RELEASE.md`` from it)."""
    modes: dict[str, Any] = {}
    for mode, c in summary.modes.items():
        entry: dict[str, Any] = asdict(c)
        n = c.generated
        if n:
            lo, hi = wilson(c.first_leaks, n)
            entry["pipp_first"] = {"k": c.first_leaks, "n": n, "rate": c.first_leaks / n, "wilson95": [lo, hi]}
        if c.exported:
            lo, hi = wilson(0, c.exported)
            entry["pipp_exported"] = {"k": 0, "n": c.exported, "rate": 0.0, "wilson95": [lo, hi]}
        modes[mode] = entry
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": {
            "modes": list(summary.modes),
            "model": cfg.model.name,
            "corpus_format": cfg.corpus.format,
            "identifiers": getattr(cfg.corpus, "identifiers", None),
            "extraction_setting": cfg.extraction.setting,
            "gate": {
                "enabled": cfg.generation.gate.enabled,
                "modes": list(cfg.generation.gate.modes),
                "max_retries": cfg.generation.gate.max_retries,
            },
            "max_new_tokens": cfg.generation.sampling.max_new_tokens,
        },
        "format": summary.format,
        "files": [posixpath.relpath(f, summary.output) if not storage.is_uri(f) else f for f in summary.files],
        "exported": summary.exported,
        "corpus_values_checked": n_corpus_values,
        "min_value_chars": cfg.export.min_value_chars,
        "modes": modes,
        "dp": privacy,
        "guarantee": guarantee(cfg, list(summary.modes), privacy),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render_card(card: dict[str, Any]) -> str:
    """RELEASE.md from :func:`release_card`'s content: every figure comes from it."""
    m = card["method"]
    lines = [
        "# Release card",
        "",
        f"Synthetic notes made by ctrlgen ({', '.join(m['modes'])}) with `{m['model']}` from a "
        f"`{m['corpus_format']}` corpus (identifiers: {m['identifiers']}; extraction: {m['extraction_setting']} "
        f"setting), {m['max_new_tokens']} new tokens at most per note. Created {card['created']}.",
        "",
        f"**{card['exported']:,} notes** in {len(card['files'])} {card['format']} file(s). Columns: `id` "
        "(synthetic, in export order), `mode`, `text`, `control_code` (the fictional code that drove the note). "
        "No real value, note id or context id is in the release.",
        "",
        "## From generation to release",
        "",
        "| mode | generated | failed | withheld by the gate | own value (export check) | corpus value (export check) "
        "| exported | first attempt leaking (Wilson 95%) | exported leaking (Wilson 95%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, e in card["modes"].items():
        first = e.get("pipp_first")
        exp = e.get("pipp_exported")
        f_txt = f"{first['k']}/{first['n']} = {_pct(first['rate'])} [{_pct(first['wilson95'][0])}, {_pct(first['wilson95'][1])}]" if first else "-"  # fmt: skip
        e_txt = f"0/{exp['n']} [0.0%, {_pct(exp['wilson95'][1])}]" if exp else "-"
        lines.append(
            f"| {mode} | {e['generated']:,} | {e['failed']:,} | {e['withheld_gate']:,} | {e['withheld_own']:,} "
            f"| {e['withheld_corpus']:,} | {e['exported']:,} | {f_txt} | {e_txt} |"
        )
    g = card["guarantee"]
    gate = m["gate"]
    lines += [
        "",
        f"The release gate was {'on' if gate['enabled'] else 'off'} (modes {', '.join(gate['modes'])}, "
        f'{gate["max_retries"]} retries). "Leaking" is PIPP\'s definition: the note holds at least one private '
        f"value of its own contexts (or of the fine-tuning set, for prefix), in any variant. The export check "
        f"also looked for each of the corpus' {card['corpus_values_checked']:,} values of "
        f"{card['min_value_chars']} or more characters, as written.",
        "",
        "## What is guaranteed",
        "",
        f"- **Formal:** {g['formal'] or 'none. No differential privacy holds for this release.'}",
        f"- **Checked:** {g['empirical']}",
    ]
    for key in ("extraction", "dp_not_private", "dp_absent"):
        if g.get(key):
            lines.append(f"- {g[key]}")
    lines += [
        "",
        "## Not measured here",
        "",
        "Re-identification by meaning (the semantic attack, METHOD.md 8.2) and utility (downstream perplexity, "
        "MAUVE) are not part of an export: `ctrlgen semantic-attack` and `ctrlgen experiment` measure them "
        "(docs/evaluation.md).",
        "",
    ]
    return "\n".join(lines)
