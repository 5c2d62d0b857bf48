"""Entity-in-context leakage: a real private value reappearing *with its surrounding words*.

A value alone may reappear by chance (a common surname, a date); the value together
with the k words that surrounded it in the real document is copying. For every
private mention of a reference document (ICL: its context documents; fine-tuning:
the fine-tuning set) and every k in 1..4, two windows are formed on word tokens
(``\\w+``, case folded): the k words before the mention followed by the mention,
and the mention followed by the k words after it (a side with fewer than k words
gives no window). An output leaks at level k when it contains any window of level
k as a contiguous word sequence.

Example:
    >>> w = context_windows("Seen by Dr Smith today at noon", [(11, 16)], ks=(1, 2))
    >>> sorted(w[1])
    [('dr', 'smith'), ('smith', 'today')]
    >>> leaks_by_k("we met dr smith", w)
    {1: True, 2: False}
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["KS", "WindowSets", "context_windows", "leaks_by_k", "merge_windows", "window_hash", "words"]

KS: tuple[int, ...] = (1, 2, 3, 4)
_WORD = re.compile(r"\w+")


def words(text: str) -> list[tuple[str, int, int]]:
    """Word tokens with their character spans (case folded)."""
    return [(m.group().casefold(), m.start(), m.end()) for m in _WORD.finditer(text)]


def context_windows(
    text: str, spans: Iterable[tuple[int, int]], ks: Sequence[int] = KS
) -> dict[int, set[tuple[str, ...]]]:
    """k -> the windows (word tuples) of every private mention ``[start, end)`` of ``text``."""
    toks = words(text)
    out: dict[int, set[tuple[str, ...]]] = {k: set() for k in ks}
    for start, end in spans:
        idx = [i for i, (_, s, e) in enumerate(toks) if s < end and e > start]
        if not idx:
            continue
        first, last = idx[0], idx[-1]
        mention = tuple(t for t, _, _ in toks[first : last + 1])
        for k in ks:
            if first - k >= 0:
                out[k].add(tuple(t for t, _, _ in toks[first - k : first]) + mention)
            if last + k < len(toks):
                out[k].add(mention + tuple(t for t, _, _ in toks[last + 1 : last + 1 + k]))
    return out


class WindowSets:
    """k -> windows, held as the sorted 64-bit hashes of the windows (:func:`window_hash`; 8 bytes a window: a
    fine-tuning set's windows run to tens of millions at MIMIC scale), with the word lengths of each k's windows.
    :func:`merge_windows` builds it; :func:`leaks_by_k` probes it with the text's own n-grams of those lengths.
    Two different windows share a hash with probability 2**-64: a text of n n-grams against W windows is a false
    hit with probability about n * W / 2**64 (1e-9 at n = 10**4, W = 10**9)."""

    def __init__(self, hashes: Mapping[int, np.ndarray], lengths: Mapping[int, Iterable[int]]) -> None:
        self.hashes = {k: np.asarray(h, dtype=np.int64) for k, h in hashes.items()}
        self.lengths = {k: sorted(v) for k, v in lengths.items()}

    def __bool__(self) -> bool:
        return any(len(h) for h in self.hashes.values())

    def __len__(self) -> int:
        """The number of (k, window) pairs held."""
        return sum(len(h) for h in self.hashes.values())

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.hashes.values())

    def holds_any(self, k: int, probes: np.ndarray) -> bool:
        """Whether any of these window hashes is a level-k window."""
        ws = self.hashes.get(k)
        if ws is None or not len(ws) or not len(probes):
            return False
        at = np.minimum(np.searchsorted(ws, probes), len(ws) - 1)
        return bool((ws[at] == probes).any())


def window_hash(window: Sequence[str]) -> int:
    """A 64-bit hash of a word sequence (blake2b: the same in every process and run)."""
    raw = hashlib.blake2b("\x1f".join(window).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def merge_windows(parts: Iterable[Mapping[int, set[tuple[str, ...]]]]) -> WindowSets:
    """The union of several documents' windows, per k, hashed (each document's sets may be dropped as it goes:
    only 8 bytes a window are kept)."""
    acc: dict[int, array[int]] = {}
    lengths: dict[int, set[int]] = {}
    for p in parts:
        for k, ws in p.items():
            a = acc.setdefault(k, array("q"))
            ls = lengths.setdefault(k, set())
            for w in ws:
                a.append(window_hash(w))
                ls.add(len(w))
    return WindowSets({k: np.unique(np.frombuffer(a, dtype=np.int64)) for k, a in acc.items()}, lengths)


def leaks_by_k(text: str, windows: WindowSets | Mapping[int, set[tuple[str, ...]]]) -> dict[int, bool]:
    """k -> whether ``text`` contains any level-k window (each n-gram of the text of a window length looked up:
    the cost follows the text's length, not the number of windows)."""
    toks = [t for t, _, _ in words(text)]
    if isinstance(windows, WindowSets):
        grams: dict[int, np.ndarray] = {}
        for n in {n for ls in windows.lengths.values() for n in ls}:
            grams[n] = np.array([window_hash(toks[i : i + n]) for i in range(len(toks) - n + 1)], dtype=np.int64)
        return {k: any(windows.holds_any(k, grams[n]) for n in windows.lengths.get(k, ())) for k in windows.hashes}
    lengths = {k: sorted({len(w) for w in ws}) for k, ws in windows.items()}
    return {
        k: any(tuple(toks[i : i + n]) in ws for n in lengths[k] for i in range(len(toks) - n + 1))
        for k, ws in windows.items()
    }
