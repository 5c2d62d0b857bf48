"""A learned span filter after the clinical engine (issue 41's precision target), by patient-level cross-validation
on the PhysioNet notes: can a classifier over the engine's own output spans drop false positives without losing
recall, when nothing it learns or chooses comes from the notes it is measured on?

The engine (``configs/extract_physionet_ner.yaml``: the spaCy NER and the frozen rules) outputs spans; about one in
six is not PHI (precision 82.8% in docs/extraction.md). A span filter scores each output span with a classifier (a
logistic regression; gradient-boosted trees, added after the regression's first run on these folds) on features of the span and the engine's evidence for it (its category and source recognizer, which
recognizers proposed an overlapping span and their best score, casing and digits, length, the words just before
and after, the note's share of capitals, its other mentions) and drops spans below a bar. Protocol, per outer
patient fold i of the report's 5-fold CV (the same fold models as ``ctrlgen extract-report``, from ``.cache/ner``):

1. **Training spans**: fold i's training notes, each extracted by the NER of the inner 3-fold CV that did not see
   its patient (the inner models rule selection already uses), through the whole engine; each output span
   labelled *correct* when it overlaps a gold span (the precision's definition). No note of fold i is among them.
2. **The bar**: chosen on the training spans by cross-fitting over the inner folds (each inner fold's spans scored
   by a filter fit on the other two): the bar of best F-beta of the filtered notes (beta of
   ``extraction.rule_tuning``, 2: recall weighs 4x precision), the lower bar on a tie; bar 0 keeps every span.
3. **Held-out**: fold i's notes, extracted by the outer fold model (the engine as configured; the in-fold rule
   selection changed nothing in any fold for this seed, docs/extraction.md), filtered by the filter fit on all
   training spans, at that bar.

Pooled over the 5 folds, the held-out rows are the out-of-sample result. Writes docs/benchmarks/span_filter.json
and the section "Entity extraction: a learned span filter after the engine" of docs/benchmarks.md; ``--render``
rewrites the section from the JSON alone. No span text is written (features are computed in memory).

    .venv/bin/python benchmarks/span_filter.py            # ~3-4 min on 2 cores with the fold models cached
    .venv/bin/python benchmarks/span_filter.py --render
    # the transformer engine (its own section and JSON), decoded at several bars on P(O), outer fold 1 only
    # (4 transformer trainings, ~1 h on 2 cores, unless cached):
    .venv/bin/python benchmarks/span_filter.py --config configs/extract_physionet_transformer.yaml --folds 1 \
        --ner-bars argmax,0.5,0.8,0.9,0.95,0.99
    # the same, its 3 inner taggers trained for as many optimizer steps as the outer one (6 epochs, not 4: other
    # models, ~67 min on 2 cores; its own section and JSON)
    .venv/bin/python benchmarks/span_filter.py --config configs/extract_physionet_transformer.yaml --folds 1 \
        --ner-bars argmax,0.5,0.8,0.9,0.95,0.99 --inner-steps
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402
from ner_threshold import PHYSIONET, _bar_name, _pct, _pr, _sum, provenance  # noqa: E402

CONFIG = "configs/extract_physionet_ner.yaml"
JSON = ROOT / "docs" / "benchmarks" / "span_filter.json"
TITLE = "Entity extraction: a learned span filter after the engine"
CONFIG_T = "configs/extract_physionet_transformer.yaml"
JSON_T = ROOT / "docs" / "benchmarks" / "span_filter_transformer.json"
TITLE_T = "Entity extraction: a learned span filter after the transformer engine"
JSON_S = ROOT / "docs" / "benchmarks" / "span_filter_transformer_steps.json"
TITLE_S = "Entity extraction: the transformer span filter, inner taggers trained for the outer tagger's steps"
BARS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
C = 0.5  # the logistic regression's inverse L2 strength (fixed before any run)
CLASSIFIERS = ("logistic regression", "gradient-boosted trees")
#: a spaCy engine's run adds these: the same classifiers with the NER's beam probabilities among the features
#: (added 2026-12-02, after the runs above on the same folds: third and fourth tries on the same held-out notes)
BEAM = " + NER beam"
CLASSIFIERS_SPACY = (*CLASSIFIERS, *(c + BEAM for c in CLASSIFIERS))
_WORD = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")


def _word(w: str) -> str:
    return "<num>" if w.isdigit() else w.lower()


def _shape(s: str) -> str:
    letters = [c for c in s if c.isalpha()]
    if not letters:
        return "no-letters"
    if all(c.isupper() for c in letters):
        return "UPPER"
    if all(c.islower() for c in letters):
        return "lower"
    words = [w for w in s.split() if w[:1].isalpha()]
    return "Title" if words and all(w[0].isupper() for w in words) else "mixed"


def span_features(
    text: str, ents: Sequence[Any], raw: Sequence[tuple[str, Any]], beam: Sequence[tuple[int, int, str, float]] | None
) -> list[dict[str, float]]:
    """Features of each output span of one note (``ents``), from the note and the recognizers' results ``raw``; with
    ``beam`` (the spaCy NER's entities over a beam: start, end, label, probability), the highest probability of an
    entity overlapping the span, of any label and of the span's category (``beam_*``: only the classifiers whose
    name says ``NER beam`` use them)."""
    letters = [c for c in text if c.isalpha()]
    upper = sum(c.isupper() for c in letters) / max(1, len(letters))
    counts: dict[str, int] = {}
    for e in ents:
        counts[text[e.start : e.end].lower()] = counts.get(text[e.start : e.end].lower(), 0) + 1
    out = []
    for e in ents:
        s = text[e.start : e.end]
        over = [(n, r) for n, r in raw if r.start < e.end and e.start < r.end]
        shape = _shape(s)
        f: dict[str, float] = {
            f"cat={e.category}": 1.0,
            f"src={e.source}": 1.0,
            f"shape={shape}": 1.0,
            f"cat|shape={e.category}|{shape}": 1.0,
            "n_by": float(len({n for n, _ in over})),
            "best": max((float(r.score) for _, r in over), default=0.0),
            "digits": sum(c.isdigit() for c in s) / max(1, len(s)),
            "log_len": math.log1p(len(s)),
            "words": float(min(len(s.split()), 5)),
            "note_upper": upper,
            "log_mentions": math.log1p(counts[s.lower()] - 1),
            "line_start": float(e.start == 0 or text[e.start - 1] == "\n"),
        }
        if beam is not None:
            near = [(lab, p) for s0, e0, lab, p in beam if s0 < e.end and e.start < e0]
            f["beam_p"] = max((p for _, p in near), default=0.0)
            f["beam_p_cat"] = max((p for lab, p in near if lab == e.category), default=0.0)
        for n in {n for n, _ in over}:
            f[f"by={n}"] = 1.0
            f[f"cat|by={e.category}|{n}"] = 1.0
        before = _WORD.findall(text[max(0, e.start - 40) : e.start].split("\n")[-1])
        after = _WORD.findall(text[e.end : e.end + 40].split("\n")[0])
        for tag, words in (("prev1", before[-1:]), ("prev2", before[-2:-1]), ("next1", after[:1])):
            f[f"{tag}={_word(words[0]) if words else '<none>'}"] = 1.0
        out.append(f)
    return out


@dataclasses.dataclass
class Spans:
    """The engine's output on some gold notes: per note its entities and their features and labels."""

    gold: list[Any]
    ents: list[list[Any]]
    feats: list[list[dict[str, float]]]

    def labels(self) -> list[int]:
        return [
            int(any(e.start < g.end and g.start < e.end for g in d.entities))
            for d, es in zip(self.gold, self.ents, strict=True)
            for e in es
        ]

    def flat(self, name: str) -> list[dict[str, float]]:
        """Every span's features, as classifier ``name`` sees them (the ``beam_*`` ones only with ``NER beam``)."""
        if BEAM in name:
            return [f for fs in self.feats for f in fs]
        return [{k: v for k, v in f.items() if not k.startswith("beam_")} for fs in self.feats for f in fs]

    def documents(self) -> list[Any]:
        """The notes with the engine's entities (no filter)."""
        from ctrlgen.schema import Document

        return [Document(d.doc_id, d.text, d.metadata, es) for d, es in zip(self.gold, self.ents, strict=True)]


def engine_spans(
    ext: Any, cfg: Any, gold: Sequence[Any], beams: Sequence[Sequence[tuple[int, int, str, float]]] | None = None
) -> Spans:
    """Run the engine on ``gold``'s texts once: its entities (as ``ext(gold)`` gives them) and their features
    (``beams``: per note, the spaCy NER's entities over a beam, :func:`beam_entities`)."""
    from ctrlgen.extract.rules import analysis_under

    raw = ext.recognizer_results([d.text for d in gold])
    ents = [ext.finish(d.text, analysis_under(r, cfg), cfg) for d, r in zip(gold, raw, strict=True)]
    per = beams if beams is not None else [None] * len(gold)
    feats = [span_features(d.text, es, r, b) for d, es, r, b in zip(gold, ents, raw, per, strict=True)]
    return Spans(list(gold), ents, feats)


def beam_entities(model: str, texts: Sequence[str]) -> list[list[tuple[int, int, str, float]]]:
    """Per text, the entities of spaCy NER ``model`` over a beam (ctrlgen's width and density, as
    ``extraction.ner_beam_bar`` decodes): character start, end, label, probability. The engine itself decodes as
    configured; this is a second pass for the features."""
    from spacy.util import minibatch

    from ctrlgen.extract.ner import BEAM_DENSITY, BEAM_WIDTH, scored_entities
    from ctrlgen.extract.presidio import load_ner

    nlp = load_ner(model)
    ner = nlp.get_pipe("ner")
    ner.cfg.update(beam_width=BEAM_WIDTH, beam_density=BEAM_DENSITY)
    out = []
    for batch in minibatch(texts, size=64):
        docs = [nlp.make_doc(t) for t in batch]
        for doc, scored in zip(docs, scored_entities(ner, docs), strict=True):
            out.append([(doc[a].idx, doc[b - 1].idx + len(doc[b - 1]), lab, p) for (a, b, lab), p in scored.items()])
    return out


def _classifier(name: str) -> Any:
    """A fresh classifier of ``CLASSIFIERS``: span features (a dict each) in, P(correct) out."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    if name.startswith("logistic regression"):
        return make_pipeline(DictVectorizer(), LogisticRegression(C=C, max_iter=2000))
    return make_pipeline(
        DictVectorizer(sparse=False), HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, random_state=0)
    )


def _fit(parts: Sequence[Spans], name: str) -> Any:
    x = [f for p in parts for f in p.flat(name)]
    y = [v for p in parts for v in p.labels()]
    if not name.startswith("logistic regression"):  # trees on dense input: features seen fewer than 5 times dropped
        seen: dict[str, int] = {}
        for f in x:
            for key in f:
                seen[key] = seen.get(key, 0) + 1
        x = [{k: v for k, v in f.items() if seen[k] >= 5} for f in x]
    return _classifier(name).fit(x, y)


def _probs(model: Any, spans: Spans, name: str) -> list[list[float]]:
    flat = spans.flat(name)
    p = list(model.predict_proba(flat)[:, 1]) if flat else []
    out, i = [], 0
    for es in spans.ents:
        out.append(p[i : i + len(es)])
        i += len(es)
    return out


def _filtered(spans: Spans, probs: Sequence[Sequence[float]], bar: float) -> list[Any]:
    from ctrlgen.schema import Document

    return [
        Document(d.doc_id, d.text, d.metadata, [e for e, p in zip(es, ps, strict=True) if p >= bar])
        for d, es, ps in zip(spans.gold, spans.ents, probs, strict=True)
    ]


def _counts(gold: Sequence[Any], pred: Sequence[Any]) -> dict[str, Any]:
    """Per category and per gold type (``type:<label>``: found / gold), counts for the JSON."""
    from ctrlgen.extract.quality import span_scores

    out: dict[str, Any] = {
        c: dataclasses.asdict(s) for c, s in span_scores(gold, pred).items() if s.gold or s.predicted
    }
    by_id = {d.doc_id: d for d in pred}
    for d in gold:
        preds = by_id[d.doc_id].entities
        for g in d.entities:
            t = out.setdefault(f"type:{g.label}", {"gold": 0, "detected": 0})
            t["gold"] += 1
            t["detected"] += any(q.start < g.end and g.start < q.end for q in preds)
    return out


def _decoding(
    parts: Sequence[Spans], test: Spans, held: Sequence[Any], beta: float, label: str, names: Sequence[str]
) -> dict[str, Any]:
    """One engine's output (training spans ``parts`` of the inner folds, held-out spans ``test``) filtered by each
    classifier of ``names`` at the bar chosen on ``parts`` by cross-fitting; the counts for the JSON."""
    from ctrlgen.extract.quality import span_scores
    from ctrlgen.extract.rules import f_beta

    t1 = time.perf_counter()
    gold_in = [d for p in parts for d in p.gold]
    out: dict[str, Any] = {
        "training_spans": sum(len(es) for p in parts for es in p.ents), "engine": _counts(held, test.documents()), "by": {},
    }  # fmt: skip
    for name in names:
        curve = []
        oof = [_probs(_fit([q for m, q in enumerate(parts) if m != j], name), p, name) for j, p in enumerate(parts)]
        for bar in BARS:
            pred = [d for p, pr in zip(parts, oof, strict=True) for d in _filtered(p, pr, bar)]
            a = span_scores(gold_in, pred)["ALL"]
            curve.append({"bar": bar, "recall": a.recall, "precision": a.precision,
                          "f_beta": f_beta(a.precision, a.recall, beta)})  # fmt: skip
        best = max(c["f_beta"] for c in curve)
        bar = min(c["bar"] for c in curve if c["f_beta"] >= best - 1e-12)
        probs = _probs(_fit(parts, name), test, name)
        out["by"][name] = {"bar": bar, "curve": curve, "filtered": _counts(held, _filtered(test, probs, bar))}
        print(f"[span_filter] {label}, {name}: bar {bar:g} chosen on {len(gold_in)} training notes "
              f"({time.perf_counter() - t1:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return out


def measure(
    config: str,
    overrides: Sequence[str] = (),
    limit: int | None = None,
    folds: Sequence[int] | None = None,
    ner_bars: Sequence[float | None] | None = None,
    inner_steps: bool = False,
) -> dict[str, Any]:
    """``folds``: the outer folds to run (1-based; None: all). ``ner_bars``: for a transformer NER, the bars on P(O)
    its engine decodes at (None: argmax), each note tagged once per model; None keeps the config's one decoding.
    ``inner_steps``: the inner NERs train for as many optimizer steps as their outer NER (the configured epochs
    times the outer training notes over their own, rounded; other cache keys, so other models)."""
    from ner_threshold import _cached

    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.report import NER_CACHE, rules_digest

    cfg = load_config(str(ROOT / config), list(overrides))
    ex = cfg.extraction.model_copy(update={"setting": "unknown"})
    how, beta = ex.ner_training, ex.rule_tuning.beta
    if ner_bars is not None and how.kind != "transformer":
        raise SystemExit(f"{config}: --ner-bars needs extraction.ner_training.kind transformer")
    docs = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi", limit=limit))[0]
    cache, spacy_model = ROOT / NER_CACHE, cfg.nlp.spacy_model
    outer = _fold_jobs(docs, how.folds, ex, cache, spacy_model, "physionet-deid")
    picked = list(range(len(outer))) if folds is None else [f - 1 for f in folds]
    if any(not 0 <= i < len(outer) for i in picked):
        raise SystemExit(f"--folds: folds are 1..{len(outer)}")
    # inner_steps: each inner tagger takes as many optimizer steps as its outer one (crossval.matched_epochs)
    inner = {
        i: _fold_jobs(outer[i][0].docs, ex.rule_tuning.inner_folds, ex, cache, spacy_model, "physionet-deid",
                      within=(i, how.folds), match_notes=len(outer[i][0].docs) if inner_steps else None)
        for i in picked
    }  # fmt: skip
    inner_epochs = {str(i + 1): [job.how.epochs for job, _, _ in inner[i]] for i in picked} if inner_steps else {}
    t0 = time.perf_counter()
    train_cached([outer[i][0] for i in picked] + [j for i in picked for j, _, _ in inner[i]], how.workers)
    train_s = time.perf_counter() - t0
    bars = [ex.ner_o_threshold] if ner_bars is None else list(ner_bars)

    def spans_of(model: str, gold: Sequence[Any]) -> dict[float | None, Spans]:
        """The engine with NER ``model`` on ``gold``, at each bar (the notes tagged once)."""
        run = ex.model_copy(update={"ner_model": model})
        ext = PresidioExtractor(run, spacy_model, "direct+quasi")
        if ext.transformer_tagger is None:
            return {bars[0]: engine_spans(ext, run, gold, beam_entities(model, [d.text for d in gold]))}
        _cached(ext.transformer_tagger, {})
        out = {}
        for bar in bars:
            ext.transformer_tagger.o_threshold = bar
            out[bar] = engine_spans(ext, run, gold)
        return out

    out_folds = []
    for i in picked:
        _, patients, held = outer[i]
        parts = [spans_of(str(job.out), scored) for job, _, scored in inner[i]]
        test = spans_of(str(outer[i][0].out), held)
        fold: dict[str, Any] = {
            "fold": i + 1, "patients": len(patients), "notes": len(held),
            "training_notes": sum(len(p[bars[0]].gold) for p in parts),
        }  # fmt: skip
        names = CLASSIFIERS_SPACY if how.kind == "spacy" else CLASSIFIERS
        by_bar = {
            _bar_name(b): _decoding(
                [p[b] for p in parts], test[b], held, beta, f"fold {i + 1}, NER bar {_bar_name(b)}", names
            )
            for b in bars
        }
        if ner_bars is None:
            fold.update(by_bar[_bar_name(bars[0])])
        else:
            fold["decodings"] = by_bar
        out_folds.append(fold)
    args = [*(["--config", config] if config != CONFIG else [])]
    if folds is not None:
        args += ["--folds", ",".join(str(f) for f in folds)]
    if ner_bars is not None:
        args += ["--ner-bars", ",".join(_bar_name(b) for b in ner_bars)]
    if inner_steps:
        args.append("--inner-steps")
    return {
        **provenance("span_filter.py", [*args, *overrides]),
        "config": config,
        "rules_digest": rules_digest(),
        "beta": beta,
        "c": C,
        "k": len(outer),
        "models": [outer[i][0].out.name for i in picked],
        "train_seconds": round(train_s, 1),
        **({"ner_bars": [_bar_name(b) for b in ner_bars]} if ner_bars is not None else {}),
        **({"epochs": how.epochs, "inner_epochs": inner_epochs} if inner_steps else {}),
        "folds": out_folds,
    }


def _engine_row(name: str, parts: Sequence[dict[str, Any]]) -> str:
    s = _sum([{c: v for c, v in part.items() if not c.startswith("type:")} for part in parts])
    rec, prec = _pr(s.get("ALL"))
    cats = " | ".join(
        f"{_pct(_pr(s.get(c))[0])} / {_pct(_pr(s.get(c))[1])}" for c in ("PERSON", "LOC", "DATETIME", "CODE")
    )
    return f"| {name} | {_pct(rec)} | {_pct(prec)} | {s['ALL'].predicted} | {cats} |"


def _found(parts: Sequence[dict[str, Any]], t: str) -> str:
    g = sum(p.get(t, {}).get("gold", 0) for p in parts)
    a = sum(p.get(t, {}).get("detected", 0) for p in parts)
    return f"{a} ({100 * a / g:.1f}%)" if g else "-"


def _filter_cells(engine: dict[str, Any], by: dict[str, Any], beta: float | None = None) -> str:
    """A per-fold row's last cells: the filter's bar, recall / precision on the training notes (cross-fitted, bar 0
    -> the bar; with ``beta``, their F-beta too) and on the held-out notes (engine -> engine + filter)."""
    e, q = _pr(_sum([{"ALL": engine["ALL"]}])["ALL"]), _pr(_sum([{"ALL": by["filtered"]["ALL"]}])["ALL"])
    c0 = next(c for c in by["curve"] if c["bar"] == 0.0)
    cb = next(c for c in by["curve"] if c["bar"] == by["bar"])
    f = "" if beta is None else f" (F{beta:g} {c0['f_beta']:.3f} -> {cb['f_beta']:.3f})"
    return (f"{by['bar']:g} | {_pct(c0['recall'])} / {_pct(c0['precision'])} -> {_pct(cb['recall'])} / "
            f"{_pct(cb['precision'])}{f} | {_pct(e[0])} / {_pct(e[1])} -> {_pct(q[0])} / {_pct(q[1])}")  # fmt: skip


def _beam_text(names: Sequence[str]) -> str:
    if not any(BEAM in n for n in names):
        return ""
    return (f" The classifiers \"{BEAM.strip(' +')}\" (added 2026-12-02, after those runs: the third and fourth tries on "
            "the same held-out notes) see the same features and, for each span, the highest probability of an "
            "overlapping entity of the spaCy NER decoded by a beam (16 parses, as `extraction.ner_beam_bar`; of any "
            "label, and of the span's category); the engine itself decodes greedily, as configured.")  # fmt: skip


def report(r: dict[str, Any]) -> str:
    k, folds = len(r["folds"]), r["folds"]
    names = list(folds[0]["by"])
    rows = [_engine_row("engine as configured", [f["engine"] for f in folds])]
    rows += [_engine_row(f"engine + span filter ({n})", [f["by"][n]["filtered"] for f in folds]) for n in names]
    types = sorted({c for f in folds for c in f["engine"] if c.startswith("type:")})
    trows = []
    for t in types:
        g = sum(f["engine"].get(t, {}).get("gold", 0) for f in folds)
        cells = [_found([f["engine"] for f in folds], t)] + [
            _found([f["by"][n]["filtered"] for f in folds], t) for n in names
        ]
        trows.append(f"| {t[5:]} | {g} | {' | '.join(cells)} |")
    frows = []
    for i, f in enumerate(folds):
        for n in names:
            frows.append(f"| {f.get('fold', i + 1)} | {n} | {f['training_notes']} | {f['training_spans']} | "
                         f"{_filter_cells(f['engine'], f['by'][n])} |")  # fmt: skip
    return "\n".join([
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/span_filter.json). "
        f"The engine of `{r['config']}` (rules frozen, digest `{r['rules_digest']}`) on its {k} patient folds, the fold "
        f"models of `ctrlgen extract-report`. Per outer fold, a classifier over the engine's output spans (features: "
        f"category, source, proposing recognizers and best score, casing, digits, length, the words before and after, "
        f"the note's capitals, other mentions; a logistic regression, L2 with C {r['c']:g}, and gradient-boosted trees) "
        f"is fit on the fold's training notes as the inner 3-fold CV's NERs extract them, its bar on P(correct) chosen "
        f"there by cross-fitting over the inner folds (best F-beta, beta {r['beta']:g}), then applied to the fold's "
        f"held-out notes as the outer fold model extracts them: no held-out note trains or chooses anything. The "
        f"trees were added after a first run of the regression alone on the same folds (2026-11-29): a second "
        f"classifier tried on the same held-out notes, so their row is one of two tries.{_beam_text(names)}",
        "",
        f"Pooled over the {k} folds' held-out notes (targets, issue 41: recall >= 98.5%, precision >= 85%):",
        "",
        "| engine | recall % | precision % | predicted | PERSON R / P % | LOC R / P % | DATETIME R / P % | CODE R / P % |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Recall by gold type (found / gold), the same held-out notes:",
        "",
        "| gold type | gold | engine as configured | " + " | ".join(f"+ filter ({n})" for n in names) + " |",
        "|---|---|---|" + "---|" * len(names),
        *trows,
        "",
        "Per fold: the bar chosen on the training notes, recall / precision there (cross-fitted, bar 0 -> chosen bar) "
        "and on the held-out notes (engine -> engine + filter):",
        "",
        "| fold | classifier | training notes | training spans | bar | training R / P % | held-out R / P % |",
        "|---|---|---|---|---|---|---|",
        *frows,
        "",
        f"Fold models trained in this run in {r['train_seconds'] / 60:.1f} min (0 when all were cached).",
    ])  # fmt: skip


def _chosen(fold: dict[str, Any], name: str | None) -> tuple[str, dict[str, Any]]:
    """The NER bar (and, for classifier ``name``, its filter's bar) of best cross-fitted F-beta on the fold's
    training notes, the earlier NER bar of ``ner_bars`` on a tie; ``name`` None: the engine unfiltered (bar 0)."""
    best, pick = -1.0, None
    for d, dec in fold["decodings"].items():
        curve = dec["by"][CLASSIFIERS[0] if name is None else name]["curve"]
        f = next(c["f_beta"] for c in curve if c["bar"] == 0.0) if name is None else max(c["f_beta"] for c in curve)
        if f > best + 1e-12:
            best, pick = f, d
    assert pick is not None
    dec = fold["decodings"][pick]
    return pick, (dec["engine"] if name is None else dec["by"][name]["filtered"])


def report_decodings(r: dict[str, Any]) -> str:
    """The section of a run over the transformer engine's decodings (``--ner-bars``)."""
    folds, bars = r["folds"], r["ner_bars"]
    names = list(folds[0]["decodings"][bars[0]]["by"])
    which = ", ".join(str(f["fold"]) for f in folds)
    rows, tcols = [], []
    for b in bars:
        decs = [f["decodings"][b] for f in folds]
        rows.append(_engine_row(f"bar {b}: engine", [d["engine"] for d in decs]))
        rows += [
            _engine_row(f"bar {b}: engine + span filter ({n})", [d["by"][n]["filtered"] for d in decs]) for n in names
        ]
        tcols.append((f"bar {b}: engine", [d["engine"] for d in decs]))
    chosen_rows, picks = [], []
    for n in [None, *names]:
        got = [_chosen(f, n) for f in folds]
        label = (
            "engine, NER bar chosen in-fold" if n is None else f"engine + span filter ({n}), both bars chosen in-fold"
        )
        chosen_rows.append(_engine_row(label, [c for _, c in got]))
        picks.append(f"{'no filter' if n is None else n}: NER bar " + ", ".join(
            f"{d} (fold {f['fold']})" for (d, _), f in zip(got, folds, strict=True)))  # fmt: skip
        tcols.append((label, [c for _, c in got]))
    types = sorted({c for f in folds for d in f["decodings"].values() for c in d["engine"] if c.startswith("type:")})
    trows = []
    for t in types:
        g = sum(f["decodings"][bars[0]]["engine"].get(t, {}).get("gold", 0) for f in folds)
        trows.append(f"| {t[5:]} | {g} | " + " | ".join(_found(parts, t) for _, parts in tcols) + " |")
    frows = []
    for f in folds:
        for b in bars:
            dec = f["decodings"][b]
            for n in names:
                frows.append(f"| {f['fold']} | {b} | {n} | {dec['training_spans']} | "
                             f"{_filter_cells(dec['engine'], dec['by'][n], r['beta'])} |")  # fmt: skip
    scope = "every fold" if len(folds) == r["k"] else f"fold {which} of {r['k']} only"
    steps = "inner_epochs" in r
    inner = (
        f" **The inner taggers trained for as many optimizer steps as the outer one** (`--inner-steps`, fixed before "
        f"the run: the configured {r['epochs']} epochs times the outer tagger's training notes over the inner "
        f"tagger's, rounded; "
        + "; ".join(f"fold {f}: {', '.join(map(str, e))} epochs" for f, e in r["inner_epochs"].items())
        + "): the section above trained them for the configured epochs over their fewer notes, hence fewer steps "
        "than the outer tagger. Everything else as there."
        if steps
        else ""
    )
    return "\n".join([
        f"Command: `{r['command']}` (`--render --config {r['config']}{' --inner-steps' if steps else ''}` rewrites "
        f"this section from docs/benchmarks/{(JSON_S if steps else JSON_T).name}). The engine of `{r['config']}` (the MiniLM tagger, then the frozen rules, "
        f"digest `{r['rules_digest']}`), decoded at each bar on P(O) (a word piece with P(O) below the bar takes its "
        f"most probable entity tag; `argmax`: its most probable tag), then the span filter of the section above (the "
        f"same features, the tagger's span score among them, and the same two classifiers), with the same protocol: "
        f"per outer patient fold, the filter is fit on the fold's training notes as the 3 inner folds' taggers extract "
        f"them and its bar chosen there by cross-fitting (best F-beta, beta {r['beta']:g}); in the rows \"chosen "
        f"in-fold\" the NER bar is chosen the same way, on the training notes. **Run on {scope}** "
        f"({sum(f['notes'] for f in folds)} held-out notes){'' if len(folds) == r['k'] else ': a pilot, not a cross-validated figure (a fold needs 4 transformer trainings)'}. No held-out note trains or chooses "
        f"anything; the NER bars listed were fixed before the run (the sweep of the section on the bar above)." + inner,
        "",
        "Held-out notes (targets, issue 41: recall >= 98.5%, precision >= 85%):",
        "",
        "| engine | recall % | precision % | predicted | PERSON R / P % | LOC R / P % | DATETIME R / P % | CODE R / P % |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        *chosen_rows,
        "",
        "Chosen in-fold: " + "; ".join(picks) + ".",
        "",
        "Recall by gold type (found / gold), the same held-out notes:",
        "",
        "| gold type | gold | " + " | ".join(label for label, _ in tcols) + " |",
        "|---|---|" + "---|" * len(tcols),
        *trows,
        "",
        "Per fold, NER bar and classifier: the filter's bar chosen on the training notes, recall / precision there "
        "(cross-fitted, bar 0 -> chosen bar) and on the held-out notes (engine -> engine + filter):",
        "",
        "| fold | NER bar | classifier | training spans | filter bar | training R / P % | held-out R / P % |",
        "|---|---|---|---|---|---|---|",
        *frows,
        "",
        f"Models: {', '.join(f'`{m}`' for m in r['models'])} (outer) and their inner folds' taggers (`.cache/ner`). "
        f"Trained in this run in {r['train_seconds'] / 60:.1f} min (0 when all were cached).",
    ])  # fmt: skip


def _kind(config: str, overrides: Sequence[str]) -> str:
    """The config's NER kind (``extraction.ner_training.kind``): which section and JSON a run writes."""
    from ctrlgen.config import load_config

    return load_config(str(ROOT / config), list(overrides)).extraction.ner_training.kind


def _bars(arg: str) -> list[float | None]:
    return [None if b == "argmax" else float(b) for b in arg.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument(
        "--limit",
        type=int,
        help="the first N notes only (a smoke run: JSON to /tmp, no section); not cheap: other notes give "
        "other fold-model cache keys, so it trains its 5 outer and 15 inner fold NERs (~20 small NERs)",
    )
    ap.add_argument("--folds", help="outer folds to run, 1-based, comma-separated (default: all)")
    ap.add_argument(
        "--ner-bars",
        help="a transformer NER's bars on P(O), comma-separated, argmax for none; its own "
        f"section and JSON (docs/benchmarks/{JSON_T.name})",
    )
    ap.add_argument(
        "--inner-steps",
        action="store_true",
        help="with --ner-bars: the inner taggers train for as many optimizer steps as the outer one (other models; "
        f"its own section and JSON, docs/benchmarks/{JSON_S.name})",
    )
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    transformer = _kind(args.config, args.overrides) == "transformer"
    if bool(args.ner_bars) != transformer and not args.render:
        raise SystemExit(
            f"{args.config}: --ner-bars goes with a config whose extraction.ner_training.kind is transformer "
            f"(such as {CONFIG_T}), and such a config with --ner-bars"
        )
    if args.inner_steps and not transformer:
        raise SystemExit("--inner-steps goes with a transformer config (and --ner-bars)")
    folds = [int(f) for f in args.folds.split(",")] if args.folds else None
    measured = (
        None
        if args.render
        else measure(
            args.config,
            args.overrides,
            args.limit,
            folds,
            _bars(args.ner_bars) if args.ner_bars else None,
            args.inner_steps,
        )
    )
    if args.inner_steps:
        publish(TITLE_S, JSON_S, report_decodings, measured, smoke=bool(args.limit))
    elif transformer:
        publish(TITLE_T, JSON_T, report_decodings, measured, smoke=bool(args.limit))
    else:
        publish(TITLE, JSON, report, measured, smoke=bool(args.limit))


if __name__ == "__main__":
    main()
