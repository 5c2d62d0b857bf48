"""``ctrlgen extract-report``: quality of the unknown setting against gold spans, as Markdown.

Runs ctrlgen's configured Presidio engine and Presidio's stock ``AnalyzerEngine``
(same spaCy pipeline, all predefined recognizers, its default threshold) over the
PhysioNet deid notes and the TAB case, and scores both against the gold spans
(all identifier kinds: every gold span is something a leak would be measured on).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ctrlgen.config import CtrlgenConfig, PhysionetCorpusConfig, TabCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.extract.presidio import PresidioExtractor, build_stock_analyzer, results_to_entities
from ctrlgen.extract.quality import Scores, scores_table, span_scores
from ctrlgen.schema import Document

__all__ = ["extraction_report"]


def _stock(docs: list[Document], spacy_model: str) -> list[Document]:
    analyzer = build_stock_analyzer(spacy_model)
    out = []
    for d in docs:
        results = analyzer.analyze(text=d.text, language="en")
        out.append(
            Document(d.doc_id, d.text, d.metadata, results_to_entities(d.text, results, 0.0, ("DIRECT", "QUASI")))
        )
    return out


def extraction_report(cfg: CtrlgenConfig, physionet: Path, tab: Path, limit: int | None = None) -> str:
    """Score both engines on both corpora; return the Markdown body of docs/extraction.md."""
    corpora = {
        "PhysioNet deid": load_corpus(
            PhysionetCorpusConfig(path=str(physionet), identifiers="direct+quasi", limit=limit)
        )[0],
        "TAB (annotator1)": load_corpus(
            TabCorpusConfig(path=str(tab), identifiers="direct+quasi", annotator="annotator1", segments=None)
        )[0],
    }
    ours = PresidioExtractor(
        cfg.extraction.model_copy(update={"setting": "unknown"}), cfg.nlp.spacy_model, "direct+quasi"
    )
    sections = []
    for name, gold in corpora.items():
        scores: dict[str, dict[str, Scores]] = {}
        timing = []
        for engine, fn in (("ctrlgen", ours), ("stock", lambda ds: _stock(ds, cfg.nlp.spacy_model))):
            t0 = time.perf_counter()
            pred = fn(gold)
            dt = time.perf_counter() - t0
            scores[engine] = span_scores(gold, pred)
            timing.append(f"{engine}: {len(gold) / dt:.1f} documents/s")
            print(f"[extract-report] {name}: {engine} done in {dt:.0f} s", file=sys.stderr, flush=True)
        n_spans = sum(len(d.entities) for d in gold)
        sections.append(
            f"### {name}\n\n{len(gold)} documents, {n_spans} gold spans. Speed in this run (one core, "
            f"including Presidio's own overhead): {'; '.join(timing)}.\n\n{scores_table(scores)}\n"
        )
    return "\n".join(sections)
