"""Hard token blocking with a different list of banned token sequences per batch row.

Semantics are those of transformers' ``bad_words_ids`` (``NoBadWordsLogitsProcessor``):
a banned sequence ``s`` of length n bans its last token ``s[-1]`` at a step when the
last n-1 tokens of the row (prompt included) equal ``s[:-1]``; a one-token
sequence bans its token at every step. The difference is that each row has its
own list and the cost does not grow with the number of banned sequences:

* one-token sequences become a ``[batch, vocab]`` boolean mask built once;
* longer ones are keyed by a 62-bit hash of ``(row, prefix length, prefix)``, kept
  sorted; at each step the processor hashes the last k tokens of every row for each
  prefix length k present (``[batch, K]`` keys), finds them with ``searchsorted``,
  checks the few candidates token by token (so a hash collision can never ban
  anything) and bans their last tokens.

Per step this is O(batch x K x log N) instead of the stock processor's
O(batch x N) comparisons (N banned sequences, K distinct prefix lengths).

Which sequences to ban for a value (casing and leading-space variants) is
:func:`banned_sequences`.

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

__all__ = ["RowBannedTokens", "banned_sequences", "casing_variants"]

_P1 = 2_147_483_647  # 2^31 - 1
_P2 = 2_147_483_629  # a prime below 2^31
_B1 = 1_000_003
_B2 = 999_983


def casing_variants(value: str) -> list[str]:
    """As written, lower, upper, title and capitalised (METHOD.md section 4), distinct, in that order."""
    out: list[str] = []
    for v in (value, value.lower(), value.upper(), value.title(), value[:1].upper() + value[1:]):
        if v and v not in out:
            out.append(v)
    return out


def banned_sequences(tokenizer: Any, values: Iterable[str], *, leading_space: bool = True) -> list[list[int]]:
    """Token sequences to ban so that none of ``values`` is generated as such.

    Every casing variant is tokenised as is and, for byte-level BPE tokenizers
    where ``" Smith"`` and ``"Smith"`` are different tokens, with a leading
    space. Sequences are distinct; empty ones are dropped.
    """
    seqs: dict[tuple[int, ...], None] = {}
    for value in values:
        value = " ".join(value.split())
        if not value:
            continue
        for variant in casing_variants(value):
            texts = [variant, " " + variant] if leading_space else [variant]
            for text in texts:
                ids = tokenizer.encode(text, add_special_tokens=False)
                if ids:
                    seqs[tuple(int(i) for i in ids)] = None
    return [list(s) for s in seqs]


def _hash_step(h1: torch.Tensor, h2: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Both factors stay below 2^31, so the products fit in int64.
    return (h1 * _B1 + x) % _P1, (h2 * _B2 + x) % _P2


class RowBannedTokens:
    """A logits processor banning per-row token sequences (see module doc).

    Args:
        banned: for each batch row, its banned token sequences.
        vocab_size: size of the score vectors.
        device: where to keep the tables.

    Call it like any transformers ``LogitsProcessor``: ``scores = proc(input_ids, scores)``
    with ``input_ids`` ``[batch, seq]`` and ``scores`` ``[batch, vocab]``.
    """

    def __init__(self, banned: Sequence[Sequence[Sequence[int]]], vocab_size: int, device: Any = "cpu") -> None:
        self.batch = len(banned)
        self.vocab_size = vocab_size
        single = torch.zeros(self.batch, vocab_size, dtype=torch.bool)
        rows: list[int] = []
        plens: list[int] = []
        lasts: list[int] = []
        prefixes: list[Sequence[int]] = []
        for b, seqs in enumerate(banned):
            for s in seqs:
                if not s:
                    continue
                bad = [t for t in s if not 0 <= t < vocab_size]
                if bad:
                    raise ValueError(f"row {b}: banned token ids {bad} outside the vocabulary of {vocab_size}")
                if len(s) == 1:
                    single[b, s[0]] = True
                else:
                    rows.append(b)
                    plens.append(len(s) - 1)
                    lasts.append(s[-1])
                    prefixes.append(s[:-1])
        self.single = single.to(device) if bool(single.any()) else None  # [batch, vocab]
        self.n_multi = len(rows)
        if not rows:
            return
        self.max_plen = max(plens)
        self.plen_values = sorted(set(plens))
        # Prefixes right-aligned in [N, max_plen], padded with -1.
        pref = torch.full((len(rows), self.max_plen), -1, dtype=torch.long)
        for i, p in enumerate(prefixes):
            pref[i, self.max_plen - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        row_t = torch.tensor(rows, dtype=torch.long)
        plen_t = torch.tensor(plens, dtype=torch.long)
        keys = self._keys_of(pref, plen_t, row_t)
        order = torch.argsort(keys)
        self.keys = keys[order].to(device)  # [N] sorted
        self.rows = row_t[order].to(device)  # [N]
        self.plens = plen_t[order].to(device)  # [N]
        self.lasts = torch.tensor(lasts, dtype=torch.long)[order].to(device)  # [N]
        self.prefixes = pref[order].to(device)  # [N, max_plen]

    def _keys_of(self, pref: torch.Tensor, plen: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """62-bit keys of right-aligned prefixes ``[N, max_plen]`` of lengths ``plen`` for rows ``row``."""
        n = pref.shape[0]
        h1 = torch.zeros(n, dtype=torch.long)
        h2 = torch.zeros(n, dtype=torch.long)
        # Hash from the last token backwards, so a row's suffix hashes grow one token at a time.
        for j in range(1, self.max_plen + 1):
            tok = pref[:, -j]
            active = j <= plen
            n1, n2 = _hash_step(h1, h2, tok + 2)
            h1 = torch.where(active, n1, h1)
            h2 = torch.where(active, n2, h2)
        h1, h2 = _hash_step(h1, h2, plen)
        h1, h2 = _hash_step(h1, h2, row)
        return h1 * _P2 + h2

    def _suffix_keys(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Keys of every row's last-k-token suffix, for each prefix length k present: ``[batch, K]``."""
        batch, seq = input_ids.shape
        h1 = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        h2 = torch.zeros_like(h1)
        row = torch.arange(batch, device=input_ids.device)
        wanted = set(self.plen_values)
        cols = []
        for k in range(1, self.max_plen + 1):
            # Beyond the start of the sequence the suffix cannot match (as in transformers).
            tok = input_ids[:, -k] + 2 if k <= seq else torch.full_like(h1, -(10**6))
            h1, h2 = _hash_step(h1, h2, tok)
            if k in wanted:
                f1, f2 = _hash_step(h1, h2, torch.full_like(h1, k))
                f1, f2 = _hash_step(f1, f2, row)
                cols.append(f1 * _P2 + f2)
        return torch.stack(cols, dim=1)

    def banned_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[batch, vocab]`` True where the next token is banned for that row."""
        batch = input_ids.shape[0]
        if batch != self.batch:
            raise ValueError(f"processor built for {self.batch} rows, called with {batch}")
        mask = (
            self.single.clone()
            if self.single is not None
            else torch.zeros(batch, self.vocab_size, dtype=torch.bool, device=input_ids.device)
        )
        if self.n_multi == 0:
            return mask
        q = self._suffix_keys(input_ids).flatten()  # [batch * K]
        lo = torch.searchsorted(self.keys, q, side="left")
        hi = torch.searchsorted(self.keys, q, side="right")
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return mask
        # Candidate entries: lo[i] .. hi[i]-1 for every query i.
        starts = torch.repeat_interleave(lo, counts)
        offsets = torch.arange(total, device=q.device) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts
        )
        cand = starts + offsets
        rows = self.rows[cand]
        # Exact check: compare the candidate's prefix with the row's tail, token by token.
        seq = input_ids.shape[1]
        width = self.max_plen
        tail = torch.full((batch, width), -1, dtype=torch.long, device=input_ids.device)
        take = min(seq, width)
        tail[:, width - take :] = input_ids[:, seq - take :]
        pref = self.prefixes[cand]  # [C, max_plen]
        ok = ((pref == tail[rows]) | (pref < 0)).all(dim=1) & (self.plens[cand] <= seq)
        mask[rows[ok], self.lasts[cand][ok]] = True
        return mask

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(self.banned_mask(input_ids), float("-inf"))
