"""What the frozen rules leave for precision: the unknown-setting engine with a perfect NER (issue 41).

Issue 41 asks the engine (NER + rules) for recall >= 98.5% and precision >= 85% by patient-level CV. Both
engines measured so far trade one for the other around those figures (docs/extraction.md, and the sections
above). This benchmark asks how much of the precision target the rules themselves allow: the engine of
``configs/extract_physionet_ner.yaml`` (the transformer config runs the same rules) with its NER replaced by an
**oracle** that returns every gold span, and nothing else, in the gold category, as the spaCy NER's recognizer
would (``SpacyRecognizer``, its score 0.85), then the rules as configured: the other recognizers, Presidio's
threshold and de-duplication, the vetoes (which also judge the NER's spans), the overlap resolution, mention
propagation and initials (``PresidioExtractor.finish``). Whatever such an engine predicts that overlaps no gold
span comes from the rules, so its precision is the highest any NER can reach with them.

Nothing is trained and nothing is chosen: the rules are frozen (no in-fold selection) and the oracle has no
parameter, so the figures are over all notes at once. The per-recognizer rows (the ceiling with one rule off,
and what that rule finds by itself) are in-sample diagnostics: the rules were written by reading this corpus'
errors, and issue 41's protocol forbids editing a rule from the errors of the notes it is measured on, so they
can only inform what an in-fold selection (``extraction.rule_tuning``) could trade, not a rule edit.

Writes docs/benchmarks/rules_ceiling.json and the section "Entity extraction: the rules' precision ceiling
(a perfect NER)" of docs/benchmarks.md; ``--render`` rewrites the section from the JSON alone.

    .venv/bin/python benchmarks/rules_ceiling.py          # ~1 min on 2 cores (no NER runs)
    .venv/bin/python benchmarks/rules_ceiling.py --render
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402
from ner_threshold import PHYSIONET, _pct, _scores, _sum, provenance  # noqa: E402

CONFIG = "configs/extract_physionet_ner.yaml"
JSON = ROOT / "docs" / "benchmarks" / "rules_ceiling.json"
TITLE = "Entity extraction: the rules' precision ceiling (a perfect NER)"
ORACLE = "SpacyRecognizer"  # the oracle stands where the trained NER's recognizer stands
TARGET_P, TARGET_R = 0.85, 0.985
PROPAGATED = "mention propagation or initials"


def _oracle(doc: Any, score: float) -> list[tuple[str, Any]]:
    """The gold spans of ``doc`` as the NER's recognizer results (its name, its entity types, its score)."""
    from presidio_analyzer import RecognizerResult

    from ctrlgen.extract.presidio import _NER_LABELS

    meta = {RecognizerResult.RECOGNIZER_NAME_KEY: ORACLE, RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: "oracle"}
    return [
        (ORACLE, RecognizerResult(_NER_LABELS[e.category], e.start, e.end, score, recognition_metadata=dict(meta)))
        for e in doc.entities
    ]


def _sources(ents: Sequence[Any], results: Sequence[Any], gold: Any) -> Counter[str]:
    """Each predicted span that overlaps no gold span, by the recognizer of the highest-scored (then longest)
    kept result overlapping it; one that no result overlaps came from mention propagation or initials."""
    out: Counter[str] = Counter()
    spans = [(g.start, g.end) for g in gold.entities]
    for e in ents:
        if any(s < e.end and e.start < t for s, t in spans):
            continue
        over = [r for r in results if r.start < e.end and e.start < r.end]
        best = max(over, key=lambda r: (r.score, r.end - r.start), default=None)
        out[(best.recognition_metadata or {}).get("recognizer_name", "?") if best is not None else PROPAGATED] += 1
    return out


def measure() -> dict[str, Any]:
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.presidio import PresidioExtractor, _below_age, _vetoed
    from ctrlgen.extract.report import _without_ner, rules_digest
    from ctrlgen.extract.rules import FLAGS, KEEP, analysis_under
    from ctrlgen.schema import Document

    cfg = load_config(str(ROOT / CONFIG))
    ex = cfg.extraction.model_copy(update={"setting": "unknown"})
    ex = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi"))[0]
    rules_cfg = _without_ner(ex)
    # Analysed once: every recognizer's results per note (the NER off, spaCy only tokenizes), then each engine
    # below is what an engine built with its configuration finds (ctrlgen.extract.rules' scoring path).
    ext = PresidioExtractor(rules_cfg, cfg.nlp.spacy_model, "direct+quasi")
    raw = ext.recognizer_results([d.text for d in docs])
    print(f"[rules_ceiling] {len(docs)} notes analysed", file=sys.stderr, flush=True)
    score = SpacyRecognizer().ner_strength
    with_oracle = [r + _oracle(d, score) for r, d in zip(raw, docs, strict=True)]

    def run(c: Any, analyses: Sequence[Sequence[tuple[str, Any]]]) -> tuple[list[Any], Counter[str]]:
        pred, fp = [], Counter()
        for d, a in zip(docs, analyses, strict=True):
            kept = analysis_under(a, c)
            ents = ext.finish(d.text, kept, c)
            pred.append(Document(d.doc_id, d.text, d.metadata, ents))
            if c.min_age:  # the results finish() drops before resolving overlaps
                kept = [r for r in kept if not _below_age(d.text, r, c.min_age)]
            if c.clinical_number_veto:
                kept = [r for r in kept if not _vetoed(d.text, r)]
            fp.update(_sources(ents, kept, d))
        return pred, fp

    engines: dict[str, Any] = {}
    for name, c, analyses in (("rules alone", rules_cfg, raw), ("perfect NER + rules", ex, with_oracle),
                              ("perfect NER alone", ex.model_copy(update={"recognizers": [ORACLE],
                               **dict.fromkeys(FLAGS, False)}), with_oracle)):  # fmt: skip
        pred, fp = run(c, analyses)
        engines[name] = {"by": _scores(docs, pred), "false_by_source": dict(fp)}
    # One rule off at a time: the ceiling without it, and what the rules alone lose without it.
    drops: dict[str, Any] = {}
    for rule in [r for r in ex.recognizers if r not in KEEP] + [f for f in FLAGS if getattr(ex, f)]:
        off = {"recognizers": [r for r in ex.recognizers if r != rule]} if rule in ex.recognizers else {rule: False}
        pred, _ = run(ex.model_copy(update=off), with_oracle)
        alone_off = rules_cfg.model_copy(
            update={"recognizers": [r for r in rules_cfg.recognizers if r != rule]} if rule in ex.recognizers
            else {rule: False}
        )  # fmt: skip
        pred_alone, _ = run(alone_off, raw)
        drops[rule] = {"ceiling": _scores(docs, pred), "rules_alone": _scores(docs, pred_alone)}
    return {
        **provenance("rules_ceiling.py", []),
        "config": CONFIG,
        "rules_digest": rules_digest(),
        "notes": len(docs),
        "oracle_score": score,
        "engines": engines,
        "drops": drops,
    }


def _all(by: dict[str, Any]) -> Any:
    return _sum([by])["ALL"]


def report(r: dict[str, Any]) -> str:
    eng = r["engines"]
    ceil = _all(eng["perfect NER + rules"]["by"])
    false = ceil.predicted - ceil.correct
    budget = int(ceil.correct * (1 - TARGET_P) / TARGET_P)
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/rules_ceiling.json). "
        f"The engine of `{r['config']}` (the transformer config runs the same rules), rules frozen (digest "
        f"`{r['rules_digest']}`, no in-fold selection), with its NER replaced by an **oracle**: every gold span, "
        f"nothing else, in its gold category, from the NER's recognizer at its score ({r['oracle_score']}); then the "
        "rules as configured (the other recognizers, the threshold, the vetoes, which also judge the NER's spans, "
        "overlap resolution, mention propagation, initials). A predicted span that overlaps no gold span then "
        "comes from the rules, so the oracle engine's precision is, to within the overlap resolution, the **highest any NER can reach with these "
        f"rules**. Nothing is trained or chosen, so the figures are over all {r['notes']:,} notes. False spans are "
        "attributed to the recognizer of the highest-scored result overlapping them (none: mention propagation "
        "or initials).",
        "",
        "| engine | recall % | precision % | found / gold | predicted | overlapping no gold span |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in eng.items():
        a = _all(e["by"])
        lines.append(f"| {name} | {_pct(a.recall)} | {_pct(a.precision)} | {a.detected} / {a.gold} | "
                     f"{a.predicted} | {a.predicted - a.correct} |")  # fmt: skip
    lines += [
        "",
        f"**The ceiling: {_pct(ceil.precision)}% precision** at {_pct(ceil.recall)}% recall. Issue 41's target is "
        f"{100 * TARGET_P:.0f}% precision with >= {100 * TARGET_R:.1f}% recall: with {ceil.correct} correct "
        f"predictions an engine may predict at most {budget} spans overlapping no gold span; the rules bring "
        f"{false} of them beside a perfect NER, "
        + (
            f"which leaves a real NER **{budget - false}** false spans. "
            if budget > false
            else "more than the whole allowance: **the precision target is out of reach of any NER beside these rules "
            "as they are.** "
        )
        + "Fewer false spans from the rules (an in-fold selection that weighs precision more, or rules written "
        "and measured on notes outside this corpus) would raise the ceiling; a better NER alone cannot.",
        "",
        "Where the perfect-NER engine's false spans come from (by predicted category, and by recognizer):",
        "",
        "| predicted category | predicted | overlapping no gold span | precision % |",
        "|---|---|---|---|",
    ]
    by = _sum([eng["perfect NER + rules"]["by"]])
    for cat in sorted((c for c in by if c != "ALL" and by[c].predicted), key=lambda c: -by[c].predicted):
        s = by[cat]
        lines.append(f"| {cat} | {s.predicted} | {s.predicted - s.correct} | {_pct(s.precision)} |")
    lines += ["", "| source | false spans beside a perfect NER | false spans, rules alone |", "|---|---|---|"]
    srcs = eng["perfect NER + rules"]["false_by_source"]
    alone = eng["rules alone"]["false_by_source"]
    for src in sorted(set(srcs) | set(alone), key=lambda s: (-srcs.get(s, 0), -alone.get(s, 0), s)):
        lines.append(f"| {src} | {srcs.get(src, 0)} | {alone.get(src, 0)} |")
    lines += [
        "",
        "One rule off at a time (in-sample: what an in-fold selection could trade, not a ground for editing a rule): "
        "the perfect-NER engine's ceiling without it, and the rules alone without it (the recall that rule brings "
        "where the NER misses):",
        "",
        "| rule off | ceiling: recall % | ceiling: precision % | rules alone: recall % | rules alone: precision % |",
        "|---|---|---|---|---|",
    ]
    base = _all(eng["rules alone"]["by"])
    lines.append(f"| (none) | {_pct(ceil.recall)} | {_pct(ceil.precision)} | {_pct(base.recall)} | "
                 f"{_pct(base.precision)} |")  # fmt: skip
    for rule, d in r["drops"].items():
        c, a = _all(d["ceiling"]), _all(d["rules_alone"])
        lines.append(f"| {rule} | {_pct(c.recall)} | {_pct(c.precision)} | {_pct(a.recall)} | {_pct(a.precision)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    args = ap.parse_args()
    publish(TITLE, JSON, report, None if args.render else measure())


if __name__ == "__main__":
    main()
