"""The per-token privacy mask: which output tokens overlap a private character span.

METHOD.md section 5 writes M_t = 0 on private tokens and 1 elsewhere; this module
returns the *private* flags (``True`` where M_t = 0), which is what the loss needs.

Example:
    >>> private_token_mask([(0, 3), (3, 9), (9, 10)], [(4, 9)])
    [False, True, False]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["private_token_mask"]


def private_token_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """``True`` for every token whose character range overlaps a private span.

    Args:
        offsets: per token ``(start, end)`` character offsets (end exclusive), as a fast
            tokenizer's ``offset_mapping`` gives them; empty ranges (special tokens) are
            never private.
        spans: private entity spans ``(start, end)``, end exclusive.
    """
    spans = sorted((s, e) for s, e in spans if e > s)
    out = []
    for ts, te in offsets:
        out.append(te > ts and any(s < te and ts < e for s, e in spans))
    return out
