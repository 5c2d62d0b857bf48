"""Training examples for prefix tuning: (control code -> document) pairs with a privacy mask.

One example per document of the extraction output::

    input  c_i = "Control code:\\n<code>\\nDocument:\\n"      (labels -100: no loss)
    output d_i = <document tokens> [+ EOS]                  (labels = the tokens)

The code prompt and the document are tokenised separately (so no BPE merge crosses
the boundary) and concatenated; the document keeps its first ``max_doc_tokens``
tokens, and gets EOS only when it was not cut (a cut document must not teach the
model to stop there). The document's offset mapping and its private entity spans
give the per-token mask (:func:`~ctrlgen.training.masking.private_token_mask`).
:func:`collate` pads a batch on the right; padding has label -100 and is never
private, so it takes no loss.

Example:
    >>> from ctrlgen.models import tiny_tokenizer
    >>> tok = tiny_tokenizer()
    >>> ex = encode_example("PERSON: Al", "Al was seen.", [(0, 2)], tok, max_doc_tokens=64)
    >>> n_prompt = ex.labels.count(-100)
    >>> ex.private[n_prompt], ex.labels[-1] == tok.eos_token_id
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ctrlgen.prompts import prefix_prompt
from ctrlgen.schema import patient_id
from ctrlgen.training.masking import private_token_mask

__all__ = [
    "TRAIN_SCHEMA",
    "ExampleLayout",
    "IngestCount",
    "TrainExample",
    "collate",
    "encode_example",
    "encode_rows",
    "example_layout",
    "rank_batches",
    "rank_range",
    "read_rows",
]

TRAIN_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string()),
        pa.field("patient", pa.string()),  # the note's patient (ctrlgen.schema.patient_id); null if unknown
        pa.field("control_code", pa.string()),  # c_i: the reference set of fine-tuning leakage
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("labels", pa.list_(pa.int32())),
        pa.field("private", pa.list_(pa.bool_())),
        pa.field("n_output", pa.int32()),  # tokens that take loss
        pa.field("n_private", pa.int32()),  # of which private
        pa.field("status", pa.string()),  # "ok" | "quarantined"
        pa.field("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class TrainExample:
    input_ids: list[int]
    labels: list[int]  # -100 on the code prompt
    private: list[bool]  # True on document tokens overlapping a private span


def encode_example(
    code: str,
    text: str,
    spans: Sequence[tuple[int, int]],
    tokenizer: Any,
    max_doc_tokens: int,
) -> TrainExample:
    """Tokenise one (code, document) pair; ``spans`` are private character spans of ``text``."""
    prompt = tokenizer(prefix_prompt(code), add_special_tokens=False)["input_ids"]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])[:max_doc_tokens]
    offsets = [tuple(o) for o in enc["offset_mapping"]][:max_doc_tokens]
    private = private_token_mask(offsets, spans)
    if len(enc["input_ids"]) <= max_doc_tokens and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
        private.append(False)
    return TrainExample(
        input_ids=list(prompt) + ids,
        labels=[-100] * len(prompt) + ids,
        private=[False] * len(prompt) + private,
    )


def _quarantined(doc_id: str, reason: str) -> dict[str, Any]:
    return {"doc_id": doc_id, "patient": None, "control_code": "", "input_ids": [], "labels": [], "private": [], "n_output": 0, "n_private": 0,
            "status": "quarantined", "reason": reason}  # fmt: skip


def encode_rows(rows: Iterable[dict[str, Any]], tokenizer: Any, max_doc_tokens: int, max_code_tokens: int) -> pa.Table:
    """Extraction rows (``doc_id``, ``text``, ``entities``, ``control_code``, ``metadata`` for the patient) ->
    :data:`TRAIN_SCHEMA`.

    Rows are never dropped: an empty document, a control code longer than
    ``max_code_tokens`` tokens, or an entity span outside the text comes back
    ``quarantined`` with the reason (no text in it).
    """
    out = []
    for r in rows:
        doc_id = str(r.get("doc_id"))
        text = r.get("text") or ""
        code = r.get("control_code") or ""
        if not text.strip():
            out.append(_quarantined(doc_id, "empty document"))
            continue
        spans = [(int(e["start"]), int(e["end"])) for e in (r.get("entities") or [])]
        bad = [s for s in spans if not 0 <= s[0] < s[1] <= len(text)]
        if bad:
            out.append(_quarantined(doc_id, f"{len(bad)} entity span(s) outside the text of {len(text)} characters"))
            continue
        ex = encode_example(code, text, spans, tokenizer, max_doc_tokens)
        n_code = ex.labels.count(-100)  # the code prompt's tokens
        if n_code > max_code_tokens:
            out.append(
                _quarantined(doc_id, f"control code prompt of {n_code} tokens > max_code_tokens {max_code_tokens}")
            )
            continue
        n_out = len(ex.labels) - n_code
        out.append({"doc_id": doc_id, "patient": patient_id(r.get("metadata")), "control_code": code, "input_ids": ex.input_ids, "labels": ex.labels, "private": ex.private,
                    "n_output": n_out, "n_private": sum(ex.private), "status": "ok", "reason": ""})  # fmt: skip
    return pa.Table.from_pylist(out, schema=TRAIN_SCHEMA)


def collate(
    input_ids: Sequence[Sequence[int]],
    labels: Sequence[Sequence[int]],
    private: Sequence[Sequence[bool]],
    pad_token_id: int,
) -> dict[str, Any]:
    """Right-pad a batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 on padding), ``private``."""
    import torch

    n = max(len(x) for x in input_ids)
    b = len(input_ids)
    ids = torch.full((b, n), pad_token_id, dtype=torch.long)
    lab = torch.full((b, n), -100, dtype=torch.long)
    att = torch.zeros((b, n), dtype=torch.long)
    prv = torch.zeros((b, n), dtype=torch.bool)
    for i, (x, y, p) in enumerate(zip(input_ids, labels, private, strict=True)):
        k = len(x)
        if not (len(y) == len(p) == k):
            raise ValueError(f"example {i}: input_ids, labels and private differ in length")
        ids[i, :k] = torch.as_tensor(np.asarray(x, dtype=np.int64))
        lab[i, :k] = torch.as_tensor(np.asarray(y, dtype=np.int64))
        prv[i, :k] = torch.as_tensor(np.asarray(p, dtype=bool))
        att[i, :k] = 1
    return {"input_ids": ids, "attention_mask": att, "labels": lab, "private": prv}


# --- per-rank shards of the training examples -------------------------------------------------
#
# The examples of an epoch are w contiguous slices [s * n, (s + 1) * n) with n = steps_per_epoch *
# batch_size; in epoch e rank r trains on slice (r + e) % w, reshuffled (:func:`epoch_batches`). A
# rank reads only the Parquet row groups that overlap its slice (the files' row-group sizes, from
# their footers, are the layout the job hands every rank), so the bytes one worker reads fall as
# workers are added, and a resumed epoch skips the windows already trained without reading them.

ExampleLayout = list[tuple[str, list[int]]]  # (file, rows of each row group), in training order


def example_layout(files: Sequence[str]) -> ExampleLayout:
    """Row-group sizes of the example files (footers only), in the given (training) order."""
    from ctrlgen import storage

    layout = []
    for f in files:
        md = storage.parquet_file(f).metadata
        layout.append((f, [md.row_group(i).num_rows for i in range(md.num_row_groups)]))
    return layout


def rank_range(rank: int, steps_per_epoch: int, batch_size: int, skip_batches: int = 0) -> tuple[int, int]:
    """The example rows ``[lo, hi)`` rank ``rank`` trains on in an epoch, after ``skip_batches`` done."""
    n = steps_per_epoch * batch_size
    return rank * n + skip_batches * batch_size, (rank + 1) * n


@dataclass
class IngestCount:
    """What one rank read: rows and compressed bytes of the row groups it opened."""

    rows: int = 0
    bytes: int = 0


def rank_batches(
    layout: ExampleLayout, lo: int, hi: int, batch_size: int, columns: Sequence[str], count: IngestCount | None = None
) -> Iterator[dict[str, list[Any]]]:
    """Batches of ``batch_size`` rows (as Python lists per column) of the example rows ``[lo, hi)``,
    reading only the row groups that overlap that range."""
    from ctrlgen import storage

    pending: list[Any] = []
    have = 0
    pos = 0
    for path, groups in layout:
        pf = None
        for gi, n in enumerate(groups):
            a, b = pos, pos + n
            pos = b
            if b <= lo or a >= hi:
                continue
            pf = pf or storage.parquet_file(path)
            table = pf.read_row_group(gi, columns=list(columns))
            if count is not None:
                rg = pf.metadata.row_group(gi)
                names = [rg.column(j).path_in_schema.split(".")[0] for j in range(rg.num_columns)]
                count.bytes += sum(rg.column(j).total_compressed_size for j in range(rg.num_columns)
                                   if names[j] in columns)  # fmt: skip
                count.rows += n
            part = table.slice(max(lo - a, 0), min(hi, b) - max(lo, a))
            pending.append(part)
            have += part.num_rows
            while have >= batch_size:
                merged = pa.concat_tables(pending)
                yield {c: merged.column(c).slice(0, batch_size).to_pylist() for c in columns}
                rest = merged.slice(batch_size)
                pending, have = [rest], rest.num_rows
        if pos >= hi:
            break


class ListColumn(Sequence[Any]):
    """The rows of an Arrow list column as NumPy views into one flat array (its values and offsets): about
    the Arrow bytes in memory (4-8 per token), where Python lists of ints take about 40 per token."""

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        self._offsets = arr.offsets.to_numpy()
        self._values = arr.values.to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._values[self._offsets[i] : self._offsets[i + 1]]


#: Rows are shuffled within windows of this many batches (a row group holds 16: one or two reads per window).
SHUFFLE_WINDOW_BATCHES = 16


def epoch_batches(
    layout: ExampleLayout,
    rank: int,
    world: int,
    steps_per_epoch: int,
    batch_size: int,
    epoch: int,
    seed: int,
    columns: Sequence[str],
    skip_batches: int = 0,
    count: IngestCount | None = None,
    window: int = SHUFFLE_WINDOW_BATCHES,
) -> Iterator[dict[str, list[Any]]]:
    """Rank ``rank``'s ``steps_per_epoch`` batches of epoch ``epoch``, after ``skip_batches`` already trained.

    Reshuffled every epoch while reading only one slice: the rank takes the contiguous slice
    ``(rank + epoch) % world`` of the epoch's examples (:func:`rank_range`), cuts it into windows of
    ``window`` batches, visits them in a seeded order and permutes each window's rows (seeded by ``seed``,
    ``epoch`` and the window) before cutting batches. Every example is trained once per epoch, by one rank;
    the same (seed, epoch) gives the same batches, so a resumed epoch skips whole windows unread and
    continues with the batch it stopped at.
    """
    import random

    s = (rank + epoch) % world
    lo, hi = rank_range(s, steps_per_epoch, batch_size)
    size = window * batch_size
    windows = [(a, min(a + size, hi)) for a in range(lo, hi, size)]
    random.Random(f"windows\x1f{seed}\x1f{epoch}\x1f{s}").shuffle(windows)
    left = skip_batches
    for a, b in windows:
        n_batches = (b - a) // batch_size
        if left >= n_batches:
            left -= n_batches
            continue
        block = next(rank_batches(layout, a, b, b - a, columns, count))  # the window's rows, in file order
        order = list(range(b - a))
        random.Random(f"rows\x1f{seed}\x1f{epoch}\x1f{a}").shuffle(order)
        for j in range(left, n_batches):
            idx = order[j * batch_size : (j + 1) * batch_size]
            yield {c: [block[c][i] for i in idx] for c in columns}
        left = 0


def read_rows(
    layout: ExampleLayout,
    rows: Sequence[int],
    columns: Sequence[str],
    count: IngestCount | None = None,
    as_arrays: bool = False,
) -> dict[str, Any]:
    """The example rows ``rows`` (ascending, distinct), as Python lists per column (``as_arrays``: list columns
    as :class:`ListColumn`, NumPy views per row), reading only the row groups that hold one of them (a DP
    worker's notes: those of its share of patients, wherever they lie)."""
    import bisect

    from ctrlgen import storage

    parts: list[pa.Table] = []
    pos = 0
    for path, groups in layout:
        pf = None
        for gi, n in enumerate(groups):
            a, b = pos, pos + n
            pos = b
            first, last = bisect.bisect_left(rows, a), bisect.bisect_left(rows, b)
            if first == last:
                continue
            pf = pf or storage.parquet_file(path)
            table = pf.read_row_group(gi, columns=list(columns))
            if count is not None:
                rg = pf.metadata.row_group(gi)
                names = [rg.column(j).path_in_schema.split(".")[0] for j in range(rg.num_columns)]
                count.bytes += sum(rg.column(j).total_compressed_size for j in range(rg.num_columns)
                                   if names[j] in columns)  # fmt: skip
                count.rows += n
            parts.append(table.take(pa.array([r - a for r in rows[first:last]], type=pa.int64())))
    got = sum(t.num_rows for t in parts)
    if got != len(rows):
        raise ValueError(f"read_rows: {len(rows)} rows asked, {got} found in the layout of {pos} rows")
    if not parts:
        return {c: [] for c in columns}
    merged = pa.concat_tables(parts)
    if as_arrays:
        return {c: ListColumn(merged.column(c)) if pa.types.is_list(merged.schema.field(c).type)
                else merged.column(c).to_pylist() for c in columns}  # fmt: skip
    return {c: merged.column(c).to_pylist() for c in columns}
