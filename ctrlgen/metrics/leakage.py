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
from collections.abc import Iterable, Mapping, Sequence
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


_MASK = (1 << 64) - 1
_BASE = 0x100000001B3  # odd: invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)


def _key_hash(key: str) -> int:
    """The 64-bit polynomial hash of a string, as :meth:`ValueIndex.spans` computes it for a text's substrings."""
    h = 0
    for ch in key:
        h = (h * _BASE + ord(ch) + 1) & _MASK
    return h


class ValueIndex:
    """Finds every value of a large set in a text, at a cost that follows the text, not the number of values.

    Every variant key of every value (normalised) is held as a 64-bit polynomial hash with its length, sorted,
    and what a key stands for is a run of positions into the sorted values (flat integer arrays): about 20
    bytes a key, where a character trie (an Aho-Corasick automaton) took hundreds. A search hashes, with a
    handful of vectorised NumPy calls, every substring of the normalised text that starts and ends on a word
    boundary and has the length of some key, and looks the hashes up with one ``searchsorted``. Matches are
    those of :func:`leaked_values` (the values' variants, folded case and whitespace, no word character on
    either side); two different strings share a 64-bit hash with probability about 2**-64 per pair compared,
    which this index accepts (a false match would count a leak that is not there, never hide one). ``len``
    and iteration are over the distinct normalised values, not their variants. Picklable (arrays), so one
    index can be built once and shared with actors through the object store.

    Example:
        >>> sorted(ValueIndex(["Smith", "John Smith", "Dr."]).find("seen by DR. john  smith"))
        ['dr.', 'john smith', 'smith']
        >>> ValueIndex([("John Smith", "PERSON")]).find("Smith, John was seen")
        {'john smith'}
    """

    def __init__(self, values: Iterable[ValueLike]) -> None:
        import numpy as np

        from ctrlgen.metrics.rouge import distinct_pairs

        # Streamed: each (key hash, key length, value) triple goes into integer arrays, no dict of keys.
        norms: dict[str, int] = {}
        pair_hash, pair_len, pair_value = array("Q"), array("i"), array("i")
        for item in values:
            value, category = split_value(item)
            if not value or not value.strip():
                continue
            v = norms.setdefault(normalize(value), len(norms))
            for key in match_keys(value, category):
                pair_hash.append(_key_hash(key))
                pair_len.append(len(key))
                pair_value.append(v)
        ordered = sorted(norms.items())
        self._values = tuple(v for v, _ in ordered)
        position = np.empty(len(ordered), dtype=np.int32)  # a value's first-seen number -> its sorted position
        position[[i for _, i in ordered]] = np.arange(len(ordered), dtype=np.int32)
        del norms, ordered
        hashes = np.frombuffer(pair_hash, dtype=np.uint64) if pair_hash else np.zeros(0, dtype=np.uint64)
        lens = np.frombuffer(pair_len, dtype=np.int32) if pair_len else np.zeros(0, dtype=np.int32)
        vals = position[np.frombuffer(pair_value, dtype=np.int32)] if pair_value else np.zeros(0, dtype=np.int32)
        # a key is its (hash, length); one sort gives the distinct keys and, per key, its distinct values
        key_of = hashes ^ (lens.astype(np.uint64) << np.uint64(48))  # the length folded in the top bits
        keys, members, _ = distinct_pairs(key_of, vals)
        self._keys, starts = np.unique(keys, return_index=True)  # sorted distinct keys
        self._starts = np.append(starts, len(keys)).astype(np.int64)  # key i: members[starts[i]:starts[i + 1]]
        self._members = members.astype(np.int32)
        # a bitmap of the keys' low bits (about 8 bits a key): most substrings are no key and are turned away by
        # it, so that only the rest are looked up in the sorted keys (a binary search, a cache miss a step)
        self._bloom_bits = max(6, int(np.ceil(np.log2(max(1, len(self._keys)) * 8))))
        mark = np.zeros(1 << self._bloom_bits, dtype=bool)
        mark[(self._keys & np.uint64((1 << self._bloom_bits) - 1)).astype(np.int64)] = True
        self._bloom = np.packbits(mark, bitorder="little")
        del mark
        self._max_len = int(lens.max()) if len(lens) else 0
        self._has_len = np.zeros(self._max_len + 1, dtype=bool)  # the key lengths a substring must have
        self._has_len[lens] = True

    _ARRAYS = ("_keys", "_starts", "_members", "_has_len", "_bloom")

    def to_arrays(self) -> dict[str, Any]:
        """The index's arrays (its values, sorted and normalised, are ``list(self)``): what
        :meth:`from_arrays` needs, without building anything again."""
        return {name[1:]: getattr(self, name) for name in self._ARRAYS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], values: Sequence[str]) -> ValueIndex:
        """The index :meth:`to_arrays` wrote, with its values ``list(index)`` (the same matches)."""
        self = cls.__new__(cls)
        for name in cls._ARRAYS:
            setattr(self, name, arrays[name[1:]])
        self._values = tuple(values)
        self._bloom_bits = int(len(self._bloom) * 8).bit_length() - 1
        self._max_len = len(self._has_len) - 1
        return self

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Any:
        return iter(self._values)

    @property
    def nbytes(self) -> int:
        """Bytes of the index's arrays (the values' strings not counted)."""
        return int(
            self._keys.nbytes + self._starts.nbytes + self._members.nbytes + self._has_len.nbytes + self._bloom.nbytes
        )

    def find(self, text: str) -> set[str]:
        """The distinct (normalised) values occurring in ``text`` on word boundaries, as themselves or a variant."""
        return {v for _, _, _, stands_for in self.spans(text) for v in stands_for}

    def spans(self, text: str) -> list[tuple[int, int, str, tuple[str, ...]]]:
        """Every match ``(start, end, variant, values it stands for)``, offsets into ``normalize_value(text)``,
        ordered by end, the longer first."""
        import numpy as np

        if not self._values or not text:
            return []
        norm = normalize_value(text)
        n = len(norm)
        if not n:
            return []
        inv, pw, ascii_word = _tables(n)
        if norm.isascii():
            raw = np.frombuffer(norm.encode("ascii"), dtype=np.uint8)
            word = ascii_word[raw]
        else:
            raw = np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32)
            word = np.fromiter(map(_is_word, norm), dtype=bool, count=n)
        code = raw.astype(np.uint64) + np.uint64(1)
        # prefix sums q[i] = sum_{j<i} code[j] * BASE**-j (mod 2**64): the hash of norm[s:e] is
        # BASE**(e-1) * (q[e] - q[s]), as _key_hash computes it
        q = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(code * inv[:n], out=q[1:])
        starts = np.flatnonzero(np.concatenate(([True], ~word[:-1])))  # no word character before
        ends = np.flatnonzero(np.concatenate((~word[1:], [True]))) + 1  # no word character after
        lo = np.searchsorted(ends, starts, side="right")
        hi = np.searchsorted(ends, starts + self._max_len, side="right")
        count = hi - lo
        if not count.sum():
            return []
        s = np.repeat(starts, count)
        e = ends[np.repeat(lo - np.cumsum(count) + count, count) + np.arange(int(count.sum()))]
        length = e - s
        ok = self._has_len[length]
        s, e, length = s[ok], e[ok], length[ok]
        with np.errstate(over="ignore"):
            h = pw[e - 1] * (q[e] - q[s])
        key = h ^ (length.astype(np.uint64) << np.uint64(48))
        low = (key & np.uint64((1 << self._bloom_bits) - 1)).astype(np.int64)
        maybe = ((self._bloom[low >> 3] >> (low & 7).astype(np.uint8)) & 1).astype(bool)
        s, e, key = s[maybe], e[maybe], key[maybe]
        at = np.searchsorted(self._keys, key)
        at[at == len(self._keys)] = 0
        hit = self._keys[at] == key
        out = []
        for a, b, i in sorted(zip(s[hit].tolist(), e[hit].tolist(), at[hit].tolist(), strict=True),
                              key=lambda m: (m[1], m[0])):  # fmt: skip
            stands_for = tuple(self._values[j] for j in self._members[self._starts[i] : self._starts[i + 1]].tolist())
            out.append((a, b, norm[a:b], stands_for))
        return out


_TABLES: list[Any] = []  # [BASE**-j, BASE**j for j < the longest text seen (grown on demand), ASCII -> \w]


def _tables(n: int) -> tuple[Any, Any, Any]:
    """The powers of the hash's base for texts of up to ``n`` characters, and which ASCII codes are word
    characters (:func:`_is_word`)."""
    import numpy as np

    if not _TABLES or len(_TABLES[0]) < n + 1:
        size = max(n + 1, 2 * len(_TABLES[0]) if _TABLES else 4096)
        inv, pw = np.empty(size, dtype=np.uint64), np.empty(size, dtype=np.uint64)
        a = b = 1
        for j in range(size):
            inv[j], pw[j] = a, b
            a, b = (a * _BASE_INV) & _MASK, (b * _BASE) & _MASK
        _TABLES[:] = [inv, pw, np.array([_is_word(chr(i)) for i in range(128)], dtype=bool)]
    return _TABLES[0], _TABLES[1], _TABLES[2]


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
