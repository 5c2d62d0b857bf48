"""Write one benchmark's section into docs/benchmarks.md, replacing its earlier version; sections are kept in
the order of the system's stages (``ORDER``), whatever order the benchmarks ran in."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"

#: (stage, the section titles of that stage in reading order); a section not listed goes last.
ORDER: list[tuple[str, list[str]]] = [
    ("Data path", ["Demo corpus generation and ingest (streaming)", "Driver memory and training ingest vs corpus size",
                   "Parquet reader: Ray Data V2 vs V1 on small reads", "MIMIC-scale rehearsal"]),
    ("Extraction", ["Entity extraction", "Entity extraction: the clinical-NER engine vs the deid tool",
                    "Entity extraction: the transformer NER's bar on P(O)",
                    "Entity extraction: the transformer NER's training length",
                    "Entity extraction: word-shape features for the uncased transformer NER",
                    "Entity extraction: the clinical NER's weights across CPUs",
                    "Entity extraction: the veto tagger's weights across CPUs",
                    "Entity extraction: the transformer tagger as a veto",
                    "Entity extraction: a learned span filter after the engine",
                    "Entity extraction: a learned span filter after the transformer engine",
                    "Entity extraction: the transformer span filter, inner taggers trained for the outer tagger's steps",
                    "Entity extraction: the transformer tagger's stall check",
                    "Entity extraction: the veto tagger's training (length, seed, surrogates) and two-tagger ensembles",
                    "Entity extraction: the transformer tagger with its word embeddings frozen",
                    "Entity extraction: the veto on its spans' neighbourhoods",
                    "Entity extraction: the spaCy NER's capacity and training",
                    "Entity extraction: the spaCy NER decoded by beam search",
                    "Entity extraction: names and places spread over a patient's notes",
                    "Entity extraction: the rules' precision ceiling (a perfect NER)",
                    "Entity extraction: the rules chosen for both targets",
                    "Entity extraction: the tie-break of the in-fold bar choice",
                    "Entity extraction: how many inner folds choose the bars",
                    "Entity extraction: the transformer NER's number format",
                    "Entity extraction: the transformer NER trained under bf16 autocast",
                    "Entity extraction: the CPU's matrix products (float32 vs bf16)",
                    "Entity extraction: the transformer tagger on a GPU",
                    "Entity extraction: the veto engine on a GPU actor",
                    "spaCy release and NER speed"]),
    ("Prefix training", ["Prefix tuning: masked vs plain, 1 vs 2 Ray Train workers",
                         "DP-SGD step vs plain prefix-tuning step"]),
    ("Generation", ["Generation engine: CPU", "Generation engine: GPU", "Generation engine: row admission",
                    "Generation engine: blocking step", "GPU run",
                    "ICL generation: hard token blocking and batched generation",
                    "Generation speed: shared prefill, static cache, bf16", "Value variants: over-blocking and cost"]),
    ("Serving", ["Serve: synthesis service vs offline engine", "Serve Scorer: reference index memory",
                 "Serve Scorer: private-value index memory"]),
    ("Evaluation and the experiment", ["Experiment: the CI matrix, before vs after",
                                       "ROUGE maximum over a fine-tuning set: pruned vs all pairs",
                                       "Canary exposure scoring: shared prompt pass",
                                       "Downstream perplexity: float32 vs bf16 autocast"]),
    ("Tests", ["Test suite: time and slowest tests"]),
]  # fmt: skip

_INTRO = (
    "# Benchmarks\n\n"
    "Every figure here is written by a script under `benchmarks/` (the command is in each\n"
    "section); comparisons are made within one run, as ratios. Machine: 2 CPU cores, 24 GiB, no GPU,\n"
    "unless a section says otherwise. Sections follow the system's stages; each says when it ran.\n"
)


def cpu_name(isa: bool = False) -> str:
    """The CPU's model name; with ``isa``, its vendor, family and model (one "AMD EPYC" name covers several
    generations) and the vector extensions that choose torch's kernels."""
    from ctrlgen.extract.ner import cpu_identity, cpuinfo  # (every benchmark puts the repository on sys.path)

    fields, flags = cpuinfo()
    name = fields.get("model name", "unknown CPU")
    if not isa:
        return name
    ext = [f for f in ("avx512_bf16", "amx_bf16", "avx512_vnni", "avx512f", "avx2") if f in flags]
    return f"{name} ({cpu_identity()}; {', '.join(ext) or 'no AVX'})"


_SECTION = re.compile(r"^## (.+?)\n.*?(?=^## |\Z)", re.S | re.M)


def _anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render(sections: dict[str, str]) -> str:
    """The page: the intro, a contents list by stage, then the sections in ``ORDER`` (unlisted ones last)."""
    rank = {t: i for i, t in enumerate(t for _, titles in ORDER for t in titles)}
    titles = sorted(sections, key=lambda t: (rank.get(t, len(rank)), t))
    lines = [_INTRO, "Contents:\n"]
    for stage, listed in [*ORDER, ("Other", [t for t in titles if t not in rank])]:
        here = [t for t in listed if t in sections]
        if here:
            lines.append(f"- {stage}: " + "; ".join(f"[{t}](#{_anchor(t)})" for t in here))
    body = "\n".join(lines) + "\n\n" + "\n".join(sections[t].rstrip() + "\n" for t in titles)
    return body.rstrip() + "\n"


def sections_of(text: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in _SECTION.finditer(text)}


def write_section(title: str, body: str, run_date: str | None = None) -> None:
    """Set one section of the page; ``run_date`` (YYYY-MM-DD) when the figures are older than today (a re-render)."""
    sections = sections_of(DOC.read_text()) if DOC.exists() else {}
    sections[title] = f"## {title}\n\n_Run on {run_date or date.today().isoformat()}._\n\n{body.strip()}\n"
    DOC.write_text(render(sections))


def publish(
    title: str, json_path: Path, report: Callable[[dict[str, Any]], str], measured: dict[str, Any] | None = None,
    smoke: bool = False,
) -> None:  # fmt: skip
    """The tail every measuring benchmark shares: ``measured`` None re-renders the section from ``json_path`` alone;
    otherwise the run's JSON is written there (a ``smoke`` run's to /tmp instead, with no section) and the section
    is rendered from it. The section is printed too."""
    if measured is None:
        r = json.loads(json_path.read_text())
    else:
        r = measured
        out = Path("/tmp") / f"{json_path.stem}_smoke.json" if smoke else json_path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(r, indent=1) + "\n")
        if smoke:
            print(report(r))
            print(f"(a smoke run: its JSON is {out}, docs/benchmarks.md unchanged)")
            return
    body = report(r)
    write_section(title, body, run_date=r["date"])
    print(body)


if __name__ == "__main__":  # re-render the page in stage order, every section as it is
    DOC.write_text(render(sections_of(DOC.read_text())))
    print(f"{DOC}: {len(sections_of(DOC.read_text()))} sections")
