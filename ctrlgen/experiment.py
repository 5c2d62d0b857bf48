"""The experiment matrix's Ray-free parts: the patient split, statistics over the cells, tables, plot.

``ray_jobs/experiment.py`` runs the jobs and measures every (setting, method, seed) cell; this module turns
the cells into a mean and a 95% confidence interval per (setting, method), Markdown tables and a
privacy-utility plot (the page around them: :mod:`ctrlgen.experiment_report`). Each figure's interval
(``"ci"`` in the summary row; docs/evaluation.md defines them):

* ``exact``: a proportion k of n (PIPP, PIPP >= 4 characters, entity-in-context, semantic linkage), the
  outputs (or linkable notes) of all seeds pooled: Clopper-Pearson (:func:`ctrlgen.intervals.clopper_pearson`),
  so 0 of n gets its upper bound and no bound leaves [0, 1];
* ``cluster``: a mean of per-output or per-note scores (ROUGE, lexical and semantic privacy, their chance
  levels) where the cells record each item's cluster, the patient of the note an output was made for or of
  the note attacked: whole patients are resampled (:func:`ctrlgen.intervals.cluster_bootstrap`), since
  outputs and attacked notes of one patient, or of one note in several seeds, are not independent;
* ``canary``: canary exposure, the mean over the canaries (``per_canary``) with whole canaries resampled: the
  sampling error of the planted secrets (their exposure varies with how likely the base model finds each);
* ``gap``: a chance level minus its score, the difference of two cluster bootstraps;
* ``t``: Student's t over the per-seed values, cut at the metric's range (every other metric, and the
  above where a run recorded no counts or clusters);
* ``None``: one value (one seed; a trained prefix's exposure or epsilon copied into every seed).

The intervals are the sampling error of the outputs and notes given the trained prefixes: with
``train_per_seed: false`` they do not include training variance.

Example:
    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> m, round(h, 3)
    (2.0, 2.484)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctrlgen.generation.icl import row_seed
from ctrlgen.intervals import clopper_pearson, cluster_bootstrap, cluster_bootstrap_diff, t_interval
from ctrlgen.methods import METHODS, REFERENCE_LABELS
from ctrlgen.schema import patient_id

__all__ = [
    "COLUMNS",
    "DP_FIELDS",
    "INTERVALS",
    "METHOD_LABELS",
    "METRICS",
    "TABLES",
    "fmt",
    "legend",
    "mean_ci",
    "mean_sd",
    "patient_of",
    "plot",
    "split_of",
    "summarize",
    "table",
]

#: Method -> row label (METHOD.md section 7's names; :data:`ctrlgen.methods.METHODS`), then the reference rows.
METHOD_LABELS = {m: x.label for m, x in METHODS.items()} | REFERENCE_LABELS

#: (key, column header, scale, decimals) of every metric a cell records.
METRICS: tuple[tuple[str, str, float, int], ...] = (
    ("pipp", "PIPP %", 100.0, 1),
    ("pipp_long", "PIPP ≥4ch %", 100.0, 1),
    ("elp", "ELP %", 100.0, 2),
    ("rouge2", "ROUGE-2", 1.0, 3),
    ("rougeL", "ROUGE-L", 1.0, 3),
    ("ctx_1", "ctx k=1 %", 100.0, 1),
    ("ctx_4", "ctx k=4 %", 100.0, 1),
    ("link_values", "linkage %", 100.0, 1),
    ("sem_link", "semantic linkage %", 100.0, 1),
    ("lexical_privacy", "lexical privacy", 1.0, 3),
    ("semantic_privacy", "semantic privacy", 1.0, 3),
    ("exposure", "canary exposure", 1.0, 2),
    ("epsilon", "DP epsilon", 1.0, 2),
    ("perplexity", "perplexity", 1.0, 1),
    ("mauve", "MAUVE", 1.0, 3),
    ("cls_f1", "category F1", 1.0, 3),
)


def patient_of(row: Mapping[str, Any]) -> str:
    """The patient a document belongs to (:func:`ctrlgen.schema.patient_id`), else the document itself."""
    meta = row.get("metadata")
    patient = patient_id(meta if isinstance(meta, (str, Mapping)) else None)
    return patient if patient is not None else str(row["doc_id"])


def split_of(patient: str, seed: int, test_fraction: float) -> str:
    """``test`` for a seeded ``test_fraction`` of patients, else ``train`` (all notes of a patient together)."""
    return "test" if (row_seed(seed, "split", patient) % 10_000) < test_fraction * 10_000 else "train"


_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_sd(values: Sequence[float | None]) -> tuple[float, float, int]:
    """(mean, sample sd, n) of the values that are not None / NaN; NaN where undefined."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return float("nan"), float("nan"), 0
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd, len(xs)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the two-sided 95% t interval); half-width NaN for one value."""
    m, sd, n = mean_sd(values)
    if n < 2:
        return m, float("nan")
    return m, _T975.get(n - 1, 1.96) * sd / math.sqrt(n)


#: What a DP-SGD cell records beside its epsilon: the privacy unit (``patient`` or ``note``) and, only for a run
#: whose DP randomness came from the config seed (``training.dp.reproducible_noise``), why it is not private.
DP_FIELDS = ("dp_unit", "not_private")

#: Proportions k of n and where n comes from when a cell records no per-item values: key -> cell count key.
PROPORTIONS = {"pipp": "outputs", "pipp_long": "outputs", "ctx_1": "outputs", "ctx_4": "outputs",
               "sem_link": "sem_linkable"}  # fmt: skip
#: Means of per-item scores: key -> the cell section holding the items and their ``cluster`` ids.
CLUSTERED = {"rouge2": "per_output", "rougeL": "per_output", "lexical_privacy": "per_record",
             "semantic_privacy": "per_record", "exposure": "per_canary"}  # fmt: skip
#: A property of the trained prefix, copied into each seed's cell (no interval across the copies; exposure: over
#: the canaries where the cells record each one's, ``per_canary``).
PER_MODEL = ("exposure", "epsilon")
#: Attack scores measured against a chance level (held-out notes: ``cell["per_record_chance"]``).
CHANCE = ("lexical_privacy", "semantic_privacy")

#: Every column of the tables: key -> (header, scale, decimals, (lowest, highest) value).
COLUMNS: dict[str, tuple[str, float, int, tuple[float, float]]] = {
    **{k: (h, s, d, (1.0, math.inf) if k == "perplexity" else (0.0, math.inf) if k in PER_MODEL else (0.0, 1.0))
       for k, h, s, d in METRICS},
    "sem_link_chance": ("semantic linkage: chance %", 100.0, 1, (0.0, 1.0)),
    "lexical_privacy_chance": ("lexical privacy: chance", 1.0, 3, (0.0, 1.0)),
    "semantic_privacy_chance": ("semantic privacy: chance", 1.0, 3, (0.0, 1.0)),
    "semantic_privacy_gap": ("semantic: chance − score", 1.0, 3, (-1.0, 1.0)),
}  # fmt: skip

#: (title, columns) of the Markdown tables.
TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Leakage", ("pipp", "pipp_long", "elp", "rouge2", "rougeL", "ctx_1", "ctx_4")),
    ("Attacks, against their chance level", ("link_values", "sem_link", "sem_link_chance", "lexical_privacy",
                                             "lexical_privacy_chance", "semantic_privacy", "semantic_privacy_chance",
                                             "semantic_privacy_gap")),
    ("Memorisation and utility", ("exposure", "epsilon", "perplexity", "mauve", "cls_f1")),
)  # fmt: skip

#: What each interval kind (a summary figure's ``"ci"``) is, as the tables' legends say it.
INTERVALS: dict[str | None, str] = {
    "exact": "Clopper-Pearson (exact) interval of k of n, the outputs (semantic linkage: the linkable notes) of "
    "all seeds pooled",
    "cluster": "cluster bootstrap of the mean over all seeds' outputs (or attacked notes): whole patients "
    "resampled (the patient of the note an output was made for, or of the note attacked), 2,000 draws",
    "canary": "cluster bootstrap of the mean exposure over the canaries: whole canaries resampled (a canary's "
    "exposure in every seed together), 2,000 draws",
    "gap": "chance level minus score: the difference of the two cluster bootstraps (attacked and held-out "
    "notes resampled independently)",
    "t": "Student's t over the per-seed values, cut at the metric's range (zero width: every seed gave the same value)",
    None: "one value, no interval (one seed, or the one trained prefix the seeds share)",
}
_NAN = float("nan")
#: A chance column -> the column it is the chance level of.
_CHANCE_OF = {"sem_link_chance": "sem_link", "lexical_privacy_chance": "lexical_privacy",
              "semantic_privacy_chance": "semantic_privacy", "semantic_privacy_gap": "semantic_privacy"}  # fmt: skip


def _counts(cell: Mapping[str, Any], key: str) -> tuple[int, int] | None:
    """(k, n) of a proportion in one cell: from its per-item values, else its rate times its count."""
    rec = cell.get("per_record") or {}
    if key == "sem_link" and "linkable" in rec:
        pairs = list(zip(rec["linkable"], rec["correct"], strict=True))
        n = sum(bool(li) for li, _ in pairs)
        return (sum(bool(li and co) for li, co in pairs), n) if n else None
    per = (cell.get("per_output") or {}).get(key)
    if per:
        return round(sum(per)), len(per)
    count = cell.get(PROPORTIONS[key])
    if cell.get(key) is None or not count:
        return None
    return round(float(cell[key]) * int(count)), int(count)


def _clustered(cells: Sequence[Mapping[str, Any]], section: str, key: str) -> tuple[list[float], list[str]] | None:
    """The per-item values of ``key`` in ``cells[*][section]`` with their cluster ids, pooled over the cells;
    None when a cell has the values without cluster ids, or no cell has them."""
    values: list[float] = []
    clusters: list[str] = []
    for c in cells:
        d = c.get(section) or {}
        if key not in d:
            continue
        if "cluster" not in d or len(d["cluster"]) != len(d[key]):
            return None
        values += [float(v) for v in d[key]]
        clusters += [str(x) for x in d["cluster"]]
    return (values, clusters) if values else None


def _fig(mean: float, lo: float, hi: float, n: int, ci: str | None, **extra: Any) -> dict[str, Any]:
    return {"mean": mean, "lo": lo, "hi": hi, "n": n, "ci": ci, **extra}


def _summarize_metric(key: str, cs: Sequence[Mapping[str, Any]], seed: int) -> dict[str, Any] | None:
    vals = [float(c[key]) for c in cs if c.get(key) is not None]
    if not vals:
        return None
    if key in PROPORTIONS:
        counts = [_counts(c, key) for c in cs if c.get(key) is not None]
        if all(x is not None for x in counts):
            k, n = sum(x[0] for x in counts if x), sum(x[1] for x in counts if x)
            lo, hi = clopper_pearson(k, n)
            return _fig(k / n, lo, hi, n, "exact", k=k)
    if key in CLUSTERED:
        got = _clustered(cs, CLUSTERED[key], key)
        if got:
            m, lo, hi = cluster_bootstrap(*got, seed=seed)
            kind = "canary" if key == "exposure" else "cluster"
            return _fig(m, lo, hi, len(got[0]), kind if not math.isnan(lo) else None, clusters=len(set(got[1])))
    if len(vals) == 1 or (key in PER_MODEL and len(set(vals)) == 1):
        return _fig(vals[0], _NAN, _NAN, len(vals), None)
    m, lo, hi = t_interval(vals)
    low, high = COLUMNS[key][3]
    return _fig(m, max(lo, low), min(hi, high), len(vals), "t")


def summarize(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cells (``setting``, ``method``, ``seed``, metric values) -> one row per (setting, method).

    Each metric becomes ``{"mean", "lo", "hi", "n", "ci"}`` (the 95% interval's bounds; ``ci`` its kind, see the
    module docstring; ``k`` for a proportion, ``clusters`` for a cluster bootstrap); NaN bounds: no interval.
    Where the cells ran the semantic attack on held-out notes, ``<metric>_chance`` is that attack's score and
    ``semantic_privacy_gap`` the chance level minus the score; ``sem_link_chance`` is a random link's rate.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["setting"], c["method"]), []).append(c)
    order = list(METHOD_LABELS)
    out: list[dict[str, Any]] = []
    for (setting, method), cs in sorted(groups.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        row: dict[str, Any] = {"setting": setting, "method": method, "seeds": sorted(c["seed"] for c in cs),
                               "outputs": int(sum(c.get("outputs") or 0 for c in cs))}  # fmt: skip
        for key in DP_FIELDS:  # what a DP row's epsilon is about: carried over, never averaged
            found = sorted({str(c[key]) for c in cs if c.get(key) is not None})
            if found:
                row[key] = found[0] if len(found) == 1 else found

        def seed_of(key: str, setting: str = setting, method: str = method) -> int:  # stable per row and metric
            return zlib.crc32(f"{setting}\x1f{method}\x1f{key}".encode())

        for key, *_ in METRICS:
            fig = _summarize_metric(key, cs, seed_of(key))
            if fig is not None:
                row[key] = fig
        for key in CHANCE:
            held = _clustered(cs, "per_record_chance", key)
            if not held:
                continue
            m, lo, hi = cluster_bootstrap(*held, seed=seed_of(f"{key}_chance"))
            row[f"{key}_chance"] = _fig(m, lo, hi, len(held[0]), "cluster", clusters=len(set(held[1])))
            attacked = _clustered(cs, "per_record", key)
            if attacked and key == "semantic_privacy":
                d, lo, hi = cluster_bootstrap_diff(*held, *attacked, seed=seed_of(f"{key}_gap"))
                row[f"{key}_gap"] = _fig(d, lo, hi, len(attacked[0]), "gap" if not math.isnan(lo) else None)
        chance = [(float(c["sem_link_chance"]), int(c.get("sem_linkable") or 0)) for c in cs
                  if c.get("sem_link_chance") is not None and c.get("sem_linkable")]  # fmt: skip
        if chance:
            n = sum(w for _, w in chance)
            row["sem_link_chance"] = _fig(sum(p * w for p, w in chance) / n, _NAN, _NAN, n, None)
        out.append(row)
    return out


def _num(x: float, dec: int) -> str:
    s = f"{x:.{dec}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s  # no "-0.000"


def fmt(v: Mapping[str, Any] | None, key: str) -> str:
    """One summary figure as the tables show it: ``mean [lower, upper]`` in the column's unit, ``–`` if absent."""
    if not v:
        return "–"
    _, scale, dec, _ = COLUMNS[key]
    m, lo, hi = (float(v.get(x, _NAN)) * scale for x in ("mean", "lo", "hi"))
    if math.isnan(lo) or math.isnan(hi):
        return _num(m, dec)
    return f"{_num(m, dec)} [{_num(lo, dec)}, {_num(hi, dec)}]"


def _label(r: Mapping[str, Any]) -> str:
    label = METHOD_LABELS.get(r["method"], r["method"])
    if r.get("dp_unit"):
        label += f" (per {r['dp_unit'] if isinstance(r['dp_unit'], str) else ' / '.join(r['dp_unit'])})"
    if r.get("not_private"):
        label += " **NOT PRIVATE: reproducible DP noise**"
    return label


def legend(summary: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """Which interval each of the columns ``keys`` uses in ``summary`` (columns grouped by interval kind)."""
    by_kind: dict[str | None, list[str]] = {}
    for key in keys:
        kinds = {r[key].get("ci") for r in summary if r.get(key)}
        for kind in sorted(kinds, key=lambda k: list(INTERVALS).index(k)):
            by_kind.setdefault(kind, []).append(COLUMNS[key][0])
    parts = [f"{', '.join(cols)}: {INTERVALS[kind]}" for kind, cols in
             sorted(by_kind.items(), key=lambda kv: list(INTERVALS).index(kv[0]))]  # fmt: skip
    return "95% intervals in brackets. " + "; ".join(parts) + "."


def table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: the :data:`TABLES`, one row per (setting, method) that has one of a table's columns, each
    figure ``mean [95% interval]`` (:func:`fmt`), each table followed by its :func:`legend`. A chance column
    of a row whose run did not measure it reads "not in this run"."""
    blocks = []
    for title, keys in TABLES:
        rows = [r for r in summary if any(r.get(k) for k in keys)]
        if not rows:
            continue
        head = "| setting | method | outputs | " + " | ".join(COLUMNS[k][0] for k in keys) + " |"
        lines = [f"**{title}**", "", head, "|" + "---|" * (3 + len(keys))]
        for r in rows:
            cells = []
            for k in keys:
                base = _CHANCE_OF.get(k)
                missing = base is not None and r.get(base) and not r.get(k)
                cells.append("not in this run" if missing else fmt(r.get(k), k))
            lines.append(f"| {r['setting']} | {_label(r)} | {r.get('outputs') or '–'} | " + " | ".join(cells) + " |")
        lines += ["", legend(rows, keys)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _err(v: Mapping[str, Any], scale: float) -> list[list[float]] | None:
    """matplotlib's asymmetric error bar [[below], [above]] of a summary figure; None without an interval."""
    lo, hi = float(v.get("lo", _NAN)), float(v.get("hi", _NAN))
    if math.isnan(lo) or math.isnan(hi):
        return None
    return [[scale * max(v["mean"] - lo, 0.0)], [scale * max(hi - v["mean"], 0.0)]]


def plot(summary: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Every method on (privacy, utility) axes with 95% CIs: privacy as PIPP % (surface) and as semantic privacy
    (the semantic attack), utility as downstream perplexity and MAUVE; a 2 x 2 grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    markers = {"known": "o", "unknown": "s"}
    colors = dict(zip(METHOD_LABELS, plt.cm.tab20.colors, strict=False))  # type: ignore[attr-defined]
    privacy = (("pipp", 100.0, "PIPP % (lower = more private)"),
               ("semantic_privacy", 1.0, "semantic privacy (higher = more private)"))  # fmt: skip
    utility = (("perplexity", "downstream perplexity (lower = more useful)"),
               ("mauve", "MAUVE (higher = closer to real)"))  # fmt: skip
    for (px, scale, xlabel), row_axes in zip(privacy, axes, strict=True):
        for (key, ylabel), ax in zip(utility, row_axes, strict=True):
            for r in summary:
                if r["setting"] == "reference" and key in r:  # real notes / base model: utility without privacy
                    ax.axhline(r[key]["mean"], color="grey", ls="--" if r["method"] == "real" else ":", lw=1,
                               label=METHOD_LABELS.get(r["method"], r["method"]))  # fmt: skip
                if px not in r or key not in r:
                    continue
                x, y = r[px], r[key]
                ax.errorbar(
                    scale * x["mean"], y["mean"], xerr=_err(x, scale), yerr=_err(y, 1.0),
                    fmt=markers.get(r["setting"], "o"), color=colors.get(r["method"]), capsize=3,
                    label=f"{METHOD_LABELS.get(r['method'], r['method'])} ({r['setting']})",
                )  # fmt: skip
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    seen: dict[str, Any] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
