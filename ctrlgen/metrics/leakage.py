"""PIPP and ELP (METHOD.md section 6): how many private values reappear in generated text.

A private value matches when it, or one of its variants (:mod:`ctrlgen.variants`: the
rewritings a reader takes for the same value, per category), occurs case-insensitively on
word boundaries (``"Smith"`` matches ``"dr. SMITH,"`` but not ``"Smithson"``); whitespace
inside a value matches any run of whitespace. A match is reported as the value it stands
for (normalised), so ``"Smith, John"`` in a text leaks the value ``"john smith"``. Values
are plain strings (no category: the value as written only), :class:`~ctrlgen.variants.Value`
strings or ``(value, category)`` pairs; hard blocking bans the same variants.

* ICL: each output is compared with the private values of its own context documents.
  PIPP = share of outputs leaking at least one; ELP = mean over outputs of
  leaked values / context values (outputs whose context has no values count 0).
* Fine-tuning: every output is compared with all private values of the fine-tuning
  set. PIPP as above; ELP = distinct leaked values / distinct private values.

Example:
    >>> leaked_values("Seen by Dr. SMITH today.", ["Smith", "Jones"])
    {'smith'}
    >>> pipp_icl(["Smith came", "nobody"], [["Smith"], ["Jones"]])
    0.5
    >>> sorted(leaked_values("Seen by Smith, J. on Oct 20, 2101", [("John Smith", "PERSON"), ("2101-10-20", "DATETIME")]))
    ['2101-10-20', 'john smith']
"""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from ctrlgen.variants import ValueLike, match_keys, normalize, split_value

__all__ = [
    "ValueIndex",
    "as_index",
    "elp_finetune",
    "elp_icl",
    "leaked_values",
    "normalize_value",
    "pipp_finetune",
    "pipp_icl",
    "value_keys",
    "value_matcher",
]


def normalize_value(value: str) -> str:
    """How values are compared: whitespace folded, case folded."""
    return normalize(value)


def value_keys(values: Iterable[ValueLike]) -> dict[str, set[str]]:
    """Every string to look for (a variant of a value, normalised) -> the normalised values it stands for."""
    out: dict[str, set[str]] = {}
    for item in values:
        value, category = split_value(item)
        if not value or not value.strip():
            continue
        norm = normalize(value)
        for key in match_keys(value, category):
            out.setdefault(key, set()).add(norm)
    return out


def value_matcher(values: Iterable[ValueLike]) -> re.Pattern[str] | None:
    """One compiled pattern finding any of ``values`` or their variants (case-insensitive, word boundaries)."""
    keys = sorted(value_keys(values), key=len, reverse=True)
    if not keys:
        return None
    alts = "|".join(r"\s+".join(re.escape(part) for part in k.split(" ")) for k in keys)
    # Lookarounds instead of \b: values may start or end with punctuation ("Dr.", "$87,500").
    return re.compile(rf"(?<!\w)(?:{alts})(?!\w)", re.IGNORECASE)


def _is_word(ch: str) -> bool:
    """What ``\\w`` of Python's ``re`` matches in a str pattern: alphanumerics and underscore."""
    return ch.isalnum() or ch == "_"


class ValueIndex:
    """Finds every value of a large set in a text in one pass over the text.

    An Aho-Corasick automaton (``pyahocorasick``) over the normalised values, built once:
    the cost of a search grows with the text and the matches, not with the number of
    values (a regex alternation or a loop over values is infeasible at a million values).
    Matches are those of :func:`leaked_values` (the values' variants, folded case and
    whitespace, no word character on either side); ``len`` and iteration are over the
    distinct normalised values, not their variants. Picklable, so one index can be built
    on the driver and shared with actors through the object store.

    Held compactly (a corpus' values run to millions, each with about ten variant keys): the
    automaton stores an integer per key (``STORE_INTS``, no Python object per key), and what a
    key stands for is a run of positions into the sorted values (flat integer arrays).

    Example:
        >>> sorted(ValueIndex(["Smith", "John Smith", "Dr."]).find("seen by DR. john  smith"))
        ['dr.', 'john smith', 'smith']
        >>> ValueIndex([("John Smith", "PERSON")]).find("Smith, John was seen")
        {'john smith'}
    """

    def __init__(self, values: Iterable[ValueLike]) -> None:
        import ahocorasick
        import numpy as np

        from ctrlgen.metrics.rouge import distinct_pairs

        # Streamed (no dict of every key's value set, which at a million values is most of the build's memory):
        # each value's variant keys go into the automaton once (the key's number is its value there), and each
        # (key, value) pair into two integer arrays.
        self._automaton: Any = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        self._key_len = array("i")
        norms: dict[str, int] = {}
        pair_key, pair_value = array("i"), array("i")
        for item in values:
            value, category = split_value(item)
            if not value or not value.strip():
                continue
            v = norms.setdefault(normalize(value), len(norms))
            for key in match_keys(value, category):
                k = self._automaton.get(key, -1)
                if k < 0:
                    k = len(self._key_len)
                    self._automaton.add_word(key, k)
                    self._key_len.append(len(key))
                pair_key.append(k)
                pair_value.append(v)
        ordered = sorted(norms.items())
        self._values = tuple(v for v, _ in ordered)
        position = np.empty(len(ordered), dtype=np.int32)  # a value's first-seen number -> its sorted position
        position[[i for _, i in ordered]] = np.arange(len(ordered), dtype=np.int32)
        del norms, ordered
        keys = np.frombuffer(pair_key, dtype=np.int32) if pair_key else np.zeros(0, dtype=np.int32)
        vals = position[np.frombuffer(pair_value, dtype=np.int32)] if pair_value else np.zeros(0, dtype=np.int32)
        keys, vals, _ = distinct_pairs(keys, vals)
        # key i stands for the values self._values[members[starts[i]:starts[i + 1]]] (in value order)
        self._members = vals
        self._starts = np.searchsorted(keys, np.arange(len(self._key_len) + 1)).astype(np.int64)
        if len(self._key_len):
            self._automaton.make_automaton()

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Any:
        return iter(self._values)

    def find(self, text: str) -> set[str]:
        """The distinct (normalised) values occurring in ``text`` on word boundaries, as themselves or a variant."""
        return {v for _, _, _, stands_for in self.spans(text) for v in stands_for}

    def spans(self, text: str) -> list[tuple[int, int, str, tuple[str, ...]]]:
        """Every match ``(start, end, variant, values it stands for)``, offsets into ``normalize_value(text)``."""
        if not self._values or not text:
            return []
        norm = normalize_value(text)
        last = len(norm) - 1
        out = []
        for end, i in self._automaton.iter(norm):
            start = end - self._key_len[i] + 1
            if (start == 0 or not _is_word(norm[start - 1])) and (end == last or not _is_word(norm[end + 1])):
                stands_for = tuple(
                    self._values[j] for j in self._members[self._starts[i] : self._starts[i + 1]].tolist()
                )
                out.append((start, end + 1, norm[start : end + 1], stands_for))
        return out


def as_index(values: Iterable[ValueLike] | ValueIndex) -> ValueIndex:
    """``values`` as a :class:`ValueIndex` (built once by the caller, or here)."""
    return values if isinstance(values, ValueIndex) else ValueIndex(values)


@functools.lru_cache(maxsize=65536)
def _one(value: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)")


def leaked_values(
    text: str, values: Iterable[ValueLike] | ValueIndex, matcher: re.Pattern[str] | None = None
) -> set[str]:
    """The distinct values (normalised: folded case and whitespace) that occur in ``text``, as such or a variant.

    Every variant is tested on its own (a plain substring test first, then the
    word-boundary check), so overlapping values ("John Smith", "Smith") are all found.
    ``matcher`` (from :func:`value_matcher`) is an optional quick reject. A
    :class:`ValueIndex` (large value sets) is searched in one pass instead.
    """
    if isinstance(values, ValueIndex):
        return values.find(text)
    if matcher is not None and not matcher.search(text):
        return set()
    norm_text = normalize_value(text)
    found: set[str] = set()
    for key, stands_for in value_keys(values).items():
        if key in norm_text and _one(key).search(norm_text):
            found |= stands_for
    return found


def pipp_icl(outputs: Sequence[str], context_values: Sequence[Iterable[ValueLike]]) -> float:
    """Share of outputs containing at least one private value of their own context."""
    if len(outputs) != len(context_values):
        raise ValueError(f"{len(outputs)} outputs but {len(context_values)} contexts")
    if not outputs:
        return 0.0
    return sum(bool(leaked_values(o, vs)) for o, vs in zip(outputs, context_values, strict=True)) / len(outputs)


def elp_icl(outputs: Sequence[str], context_values: Sequence[Iterable[ValueLike]]) -> float:
    """Mean over outputs of (distinct leaked context values / distinct context values)."""
    if len(outputs) != len(context_values):
        raise ValueError(f"{len(outputs)} outputs but {len(context_values)} contexts")
    if not outputs:
        return 0.0
    total = 0.0
    for o, vs in zip(outputs, context_values, strict=True):
        vs = list(vs)
        distinct = {normalize_value(split_value(v)[0]) for v in vs if split_value(v)[0].strip()}
        if distinct:
            total += len(leaked_values(o, vs)) / len(distinct)
    return total / len(outputs)


def pipp_finetune(outputs: Sequence[str], private_values: Iterable[ValueLike] | ValueIndex) -> float:
    """Share of outputs containing any private value of the whole fine-tuning set."""
    index = as_index(private_values)
    if not outputs or not len(index):
        return 0.0
    return sum(bool(index.find(o)) for o in outputs) / len(outputs)


def elp_finetune(outputs: Sequence[str], private_values: Iterable[ValueLike] | ValueIndex) -> float:
    """Distinct private values leaked by any output / distinct private values of the set."""
    index = as_index(private_values)
    if not len(index):
        return 0.0
    leaked: set[str] = set()
    for o in outputs:
        leaked |= index.find(o)
    return len(leaked) / len(index)
