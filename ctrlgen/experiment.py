"""The experiment matrix's Ray-free parts: the patient split, statistics over seeds, table, plot.

``ray_jobs/experiment.py`` runs the jobs and measures every (setting, method,
seed) cell; this module turns the cells into mean and 95% confidence interval per
(setting, method) (Student's t over the seeds, as the paper's "mean and 95% CI over
3 runs"), a Markdown table and a privacy-utility plot.

Example:
    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> m, round(h, 3)
    (2.0, 2.484)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctrlgen.generation.icl import row_seed

__all__ = [
    "METHOD_LABELS",
    "METRICS",
    "mean_ci",
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
    """The patient a document belongs to (``metadata.patient``), else the document itself."""
    try:
        meta = json.loads(row.get("metadata") or "{}")
    except (TypeError, ValueError):
        meta = {}
    patient = meta.get("patient") if isinstance(meta, dict) else None
    return str(patient) if patient not in (None, "") else str(row["doc_id"])


def split_of(patient: str, seed: int, test_fraction: float) -> str:
    """``test`` for a seeded ``test_fraction`` of patients, else ``train`` (all notes of a patient together)."""
    return "test" if (row_seed(seed, "split", patient) % 10_000) < test_fraction * 10_000 else "train"


_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the two-sided 95% t interval); half-width NaN for one value."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, _T975.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))


def summarize(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cells (``setting``, ``method``, ``seed``, metric values) -> one row per (setting, method).

    Each metric becomes ``{"mean", "ci95", "n"}`` over the seeds that have it.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["setting"], c["method"]), []).append(c)
    order = list(METHOD_LABELS)
    out = []
    for (setting, method), cs in sorted(groups.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        row: dict[str, Any] = {"setting": setting, "method": method, "seeds": sorted(c["seed"] for c in cs)}
        for key, *_ in METRICS:
            vals = [float(c[key]) for c in cs if c.get(key) is not None]
            if vals:
                m, h = mean_ci(vals)
                row[key] = {"mean": m, "ci95": h, "n": len(vals)}
        out.append(row)
    return out


def _fmt(v: Mapping[str, float] | None, scale: float, dec: int) -> str:
    if not v:
        return "–"
    m, h = v["mean"] * scale, v["ci95"] * scale
    return f"{m:.{dec}f}" if math.isnan(h) else f"{m:.{dec}f} ± {h:.{dec}f}"


def table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one row per (setting, method), mean ± 95% CI half-width per metric."""
    head = "| setting | method | " + " | ".join(h for _, h, _, _ in METRICS) + " |"
    lines = [head, "|" + "---|" * (2 + len(METRICS))]
    for r in summary:
        cells = [_fmt(r.get(k), s, d) for k, _, s, d in METRICS]
        lines.append(f"| {r['setting']} | {METHOD_LABELS.get(r['method'], r['method'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Privacy (PIPP %) vs utility (perplexity; MAUVE) per method and setting, with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    markers = {"known": "o", "unknown": "s"}
    colors = dict(zip(METHOD_LABELS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, (key, label) in zip(axes, (("perplexity", "downstream perplexity (lower = more useful)"),
                                       ("mauve", "MAUVE (higher = closer to real)")), strict=True):  # fmt: skip
        for r in summary:
            if r["setting"] == "reference" and key in r:  # real notes / base model: utility without privacy
                ax.axhline(r[key]["mean"], color="grey", ls="--" if r["method"] == "real" else ":", lw=1,
                           label=METHOD_LABELS.get(r["method"], r["method"]))  # fmt: skip
            if "pipp" not in r or key not in r:
                continue
            x, y = r["pipp"], r[key]
            ax.errorbar(
                100 * x["mean"], y["mean"],
                xerr=None if math.isnan(x["ci95"]) else 100 * x["ci95"],
                yerr=None if math.isnan(y["ci95"]) else y["ci95"],
                fmt=markers.get(r["setting"], "o"), color=colors.get(r["method"]), capsize=3,
                label=f"{METHOD_LABELS.get(r['method'], r['method'])} ({r['setting']})",
            )  # fmt: skip
        ax.set_xlabel("PIPP % (lower = more private)")
        ax.set_xlim(left=-5)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
