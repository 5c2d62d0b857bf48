"""The experiment matrix's Ray-free parts: the patient split, statistics over seeds, table, plot.

``ray_jobs/experiment.py`` runs the jobs and measures every (setting, method,
seed) cell; this module turns the cells into mean and 95% confidence interval per
(setting, method), a Markdown table and a privacy-utility plot. Two intervals:

* over seeds (Student's t over the per-seed values, as the paper's "mean and 95% CI over
  3 runs"), for every metric;
* by a **stratified bootstrap over outputs** (:func:`bootstrap_ci`) for the metrics a cell
  records per output or per attacked record (``per_output``: PIPP, PIPP >= 4 characters, semantic and
  lexical privacy, semantic linkage): each seed's values are resampled with replacement within that
  seed, the pooled mean is recomputed, 2,000 times; the half-width is half the 2.5-97.5 percentile
  range. It measures the sampling error of the outputs given the trained models (it does not include
  training variance when the prefixes are shared by the seeds). Where it exists the table shows it.

Example:
    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> m, round(h, 3)
    (2.0, 2.484)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctrlgen.generation.icl import row_seed
from ctrlgen.schema import patient_id

__all__ = [
    "DP_FIELDS",
    "METHOD_LABELS",
    "METRICS",
    "PER_OUTPUT",
    "bootstrap_ci",
    "mean_ci",
    "mean_sd",
    "patient_of",
    "plot",
    "split_of",
    "summarize",
    "table",
]

#: Method -> row label (METHOD.md section 7's names).
METHOD_LABELS = {
    "baseline": "Baseline (ICL, no codes)",
    "icl": "ICL",
    "icl_blocking": "ICL + blocking",
    "prefix": "Prefix tuning",
    "prefix_masked": "Prefix tuning + masking",
    "prefix_masked_paper": "Prefix tuning + masking (paper's loss)",
    "prefix_dp8": "Prefix tuning, DP-SGD eps 8",
    "prefix_dp4": "Prefix tuning, DP-SGD eps 4",
    "anon_redact": "Anonymised: redaction",
    "anon_surrogate": "Anonymised: fictional surrogates",
    "anon_llm": "Anonymised: LLM rewrite + attacker",
    "real": "(real train notes)",
    "base": "(base model, no tuning)",
}

#: (key, column header, scale, decimals) of the Markdown table.
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

#: Metrics a cell may also record per output / attacked record (``cell["per_output"][key]``: a list of values).
PER_OUTPUT = ("pipp", "pipp_long", "semantic_privacy", "lexical_privacy", "sem_link")


def bootstrap_ci(groups: Sequence[Sequence[float]], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """(pooled mean, 95% half-width) of the values in ``groups`` (one group per seed), by a bootstrap that
    resamples each group within itself (stratified); half-width NaN with fewer than 2 values."""
    import numpy as np

    gs = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    n = sum(len(g) for g in gs)
    if not n:
        return float("nan"), float("nan")
    mean = float(sum(g.sum() for g in gs) / n)
    if n < 2:
        return mean, float("nan")
    rng = np.random.default_rng(seed)
    totals = np.zeros(resamples)
    for g in gs:
        totals += g[rng.integers(0, len(g), size=(resamples, len(g)))].sum(axis=1)
    lo, hi = np.percentile(totals / n, [2.5, 97.5])
    return mean, float(hi - lo) / 2


def summarize(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cells (``setting``, ``method``, ``seed``, metric values) -> one row per (setting, method).

    Each metric becomes ``{"mean", "ci95", "n"}`` over the seeds that have it (t interval). A metric the
    cells also record per output (:data:`PER_OUTPUT`) becomes the pooled mean over outputs with the stratified
    bootstrap half-width (``"ci": "bootstrap"``, ``n`` = outputs, ``ci95_seeds`` = the t interval over seeds).
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
        for key, *_ in METRICS:
            vals = [float(c[key]) for c in cs if c.get(key) is not None]
            if vals:
                m, h = mean_ci(vals)
                row[key] = {"mean": m, "ci95": h, "n": len(vals)}
            per_seed = [c["per_output"][key] for c in cs if key in (c.get("per_output") or {})]
            if key in PER_OUTPUT and any(per_seed):
                bm, bh = bootstrap_ci(per_seed, seed=len(out))
                row[key] = {"mean": bm, "ci95": bh, "n": sum(len(g) for g in per_seed), "ci": "bootstrap",
                            "ci95_seeds": h if vals else float("nan")}  # fmt: skip
        out.append(row)
    return out


def _fmt(v: Mapping[str, float] | None, scale: float, dec: int) -> str:
    if not v:
        return "–"
    m, h = v["mean"] * scale, v["ci95"] * scale
    return f"{m:.{dec}f}" if math.isnan(h) else f"{m:.{dec}f} ± {h:.{dec}f}"


def table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one row per (setting, method), outputs pooled over seeds, mean ± 95% CI half-width per metric
    (bootstrap over outputs where recorded, marked †; else t over seeds)."""
    head = "| setting | method | outputs | " + " | ".join(h for _, h, _, _ in METRICS) + " |"
    lines = [head, "|" + "---|" * (3 + len(METRICS))]
    for r in summary:
        cells = [_fmt(r.get(k), s, d) + (" †" if (r.get(k) or {}).get("ci") == "bootstrap" else "")
                 for k, _, s, d in METRICS]  # fmt: skip
        label = METHOD_LABELS.get(r["method"], r["method"])
        if r.get("dp_unit"):
            label += f" (per {r['dp_unit'] if isinstance(r['dp_unit'], str) else ' / '.join(r['dp_unit'])})"
        if r.get("not_private"):
            label += " **NOT PRIVATE: reproducible DP noise**"
        lines.append(f"| {r['setting']} | {label} | {r.get('outputs') or '–'} | " + " | ".join(cells) + " |")
    lines += ["", "± is the 95% CI half-width: † stratified bootstrap over the outputs (or attacked records) pooled "
              "over seeds (ctrlgen.experiment.bootstrap_ci), otherwise Student's t over the seeds."]  # fmt: skip
    return "\n".join(lines)


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
                    scale * x["mean"], y["mean"],
                    xerr=None if math.isnan(x["ci95"]) else scale * x["ci95"],
                    yerr=None if math.isnan(y["ci95"]) else y["ci95"],
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
