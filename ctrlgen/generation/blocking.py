"""Hard token blocking with a different list of banned token sequences per batch row.

Semantics are those of transformers' ``bad_words_ids`` (``NoBadWordsLogitsProcessor``):
a banned sequence ``s`` of length n bans its last token ``s[-1]`` at a step when the
last n-1 tokens of the row (prompt included) equal ``s[:-1]``; a one-token
sequence bans its token at every step. The difference is that each row has its
own list and the cost does not grow with the number of banned sequences:

* one-token sequences become fixed ``(row, token)`` index pairs, applied with one
  ``index_put_`` per step;
* longer ones go into a table ``(row, prefix) -> last tokens`` built once per batch;
  at each step the processor reads every row's last ``max_prefix`` tokens once and
  looks up its suffixes of each prefix length present (exact tuple keys), then bans
  all hits with one ``index_put_``.

Per step this is O(batch x K) lookups (K distinct prefix lengths, a handful) whatever
the number N of banned sequences, instead of comparing every row with all N
sequences.

Which sequences to ban for a value is :func:`banned_sequences`: every variant of
:func:`ctrlgen.variants.value_variants` (casing, and per category the rewritings a reader
takes for the same value, the ones the release gate and the leakage metrics match), each
also with a leading space.

Example:
    >>> import torch
    >>> proc = RowBannedTokens([[[5], [1, 2]], [[3, 4]]], vocab_size=8)
    >>> scores = proc(torch.tensor([[0, 1], [0, 3]]), torch.zeros(2, 8))
    >>> (scores[0] == float("-inf")).nonzero().flatten().tolist(), (scores[1] == float("-inf")).nonzero().flatten().tolist()
    ([2, 5], [4])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ctrlgen.variants import ValueLike, casing_variants, split_value, value_variants

__all__ = ["RowBannedTokens", "banned_sequences", "casing_variants"]


def banned_sequences(tokenizer: Any, values: Iterable[ValueLike], *, leading_space: bool = True) -> list[list[int]]:
    """Token sequences to ban so that none of ``values`` is generated as such or as a variant.

    ``values``: plain strings (casing variants only), :class:`~ctrlgen.variants.Value`
    strings or ``(value, category)`` pairs (the category's rewritings too). Every variant
    is tokenised as is and, for byte-level BPE tokenizers where ``" Smith"`` and
    ``"Smith"`` are different tokens, with a leading space. Sequences are distinct;
    empty ones are dropped.
    """
    texts: dict[str, None] = {}
    for item in values:
        value, category = split_value(item)
        for variant in value_variants(value, category):
            texts[variant] = None
            if leading_space:
                texts[" " + variant] = None
    if not texts:
        return []
    # One batched call: a value has tens of variants, a context tens of values.
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    seqs: dict[tuple[int, ...], None] = {}
    for ids in encoded:
        if ids:
            seqs[tuple(int(i) for i in ids)] = None
    return [list(s) for s in seqs]


class RowBannedTokens:
    """A logits processor banning per-row token sequences (see module doc).

    Args:
        banned: for each batch row, its banned token sequences.
        vocab_size: size of the score vectors.
        device: where the score tensors live.
        inplace: write the bans into ``scores`` instead of a copy (saves a ``[batch, vocab]``
            copy per step; only safe when nothing else keeps the raw scores, e.g. not with
            ``generate(output_logits=True)``).

    Call it like any transformers ``LogitsProcessor``: ``scores = proc(input_ids, scores)``
    with ``input_ids`` ``[batch, seq]`` and ``scores`` ``[batch, vocab]``.
    """

    def __init__(
        self,
        banned: Sequence[Sequence[Sequence[int]]],
        vocab_size: int,
        device: Any = "cpu",
        *,
        inplace: bool = False,
    ) -> None:
        self.inplace = inplace
        self.batch = len(banned)
        self.vocab_size = vocab_size
        single: dict[tuple[int, int], None] = {}
        multi: dict[tuple[int, tuple[int, ...]], dict[int, None]] = {}
        plens: set[int] = set()
        for b, seqs in enumerate(banned):
            for s in seqs:
                if not s:
                    continue
                bad = [t for t in s if not 0 <= t < vocab_size]
                if bad:
                    raise ValueError(f"row {b}: banned token ids {bad} outside the vocabulary of {vocab_size}")
                if len(s) == 1:
                    single[(b, int(s[0]))] = None
                else:
                    prefix = tuple(int(t) for t in s[:-1])
                    multi.setdefault((b, prefix), {})[int(s[-1])] = None
                    plens.add(len(prefix))
        # One-token bans: fixed (row, token) index pairs applied with one index_put.
        pairs = list(single)
        self.single_rows = torch.tensor([r for r, _ in pairs], dtype=torch.long, device=device)
        self.single_toks = torch.tensor([t for _, t in pairs], dtype=torch.long, device=device)
        # Longer bans: (row, prefix) -> last tokens; a step looks up each row's suffixes.
        self.multi = {k: list(v) for k, v in multi.items()}
        ends: dict[tuple[int, int], set[int]] = {}
        for b, prefix in multi:
            ends.setdefault((b, prefix[-1]), set()).add(len(prefix))
        self.ends = {k: sorted(v) for k, v in ends.items()}  # (row, last prefix token) -> prefix lengths
        self.plen_values = sorted(plens)
        self.max_plen = max(plens, default=0)

    def _step_pairs(self, input_ids: torch.Tensor) -> tuple[list[int], list[int]]:
        """(row, token) pairs banned at this step by sequences longer than one token."""
        rows: list[int] = []
        toks: list[int] = []
        if not self.multi:
            return rows, toks
        tails = input_ids[:, -self.max_plen :].tolist()  # [batch, <= max_plen]
        for b, tail in enumerate(tails):
            # Only prefix lengths whose prefixes end with this row's last token can match.
            lengths = self.ends.get((b, tail[-1]))
            if not lengths:
                continue
            n = len(tail)
            t = tuple(tail)
            for k in lengths:
                if k > n:  # prefix longer than the sequence: cannot match (as in transformers)
                    continue
                hit = self.multi.get((b, t[n - k :]))
                if hit:
                    rows.extend([b] * len(hit))
                    toks.extend(hit)
        return rows, toks

    def banned_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[batch, vocab]`` True where the next token is banned for that row."""
        self._check(input_ids)
        mask = torch.zeros(self.batch, self.vocab_size, dtype=torch.bool, device=input_ids.device)
        mask[self.single_rows, self.single_toks] = True
        rows, toks = self._step_pairs(input_ids)
        if rows:
            mask[torch.tensor(rows, device=mask.device), torch.tensor(toks, device=mask.device)] = True
        return mask

    def _check(self, input_ids: torch.Tensor) -> None:
        if input_ids.shape[0] != self.batch:
            raise ValueError(f"processor built for {self.batch} rows, called with {input_ids.shape[0]}")

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._check(input_ids)
        rows, toks = self._step_pairs(input_ids)
        out = scores if self.inplace else scores.clone()
        neg = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
        out.index_put_((self.single_rows, self.single_toks), neg)
        if rows:
            out.index_put_((torch.tensor(rows, device=scores.device), torch.tensor(toks, device=scores.device)), neg)
        return out
