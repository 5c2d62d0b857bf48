"""Benchmark: the private-value index (issue 39, the Scorer's and the evaluation's values): hashed keys in sorted
arrays (``ctrlgen.metrics.leakage.ValueIndex``) vs an Aho-Corasick automaton of the same keys (pyahocorasick,
``STORE_INTS``: what the index was before), in one run.

Values: N synthetic private values (names from PhysioNet deid's general name lists as PERSON, dates as DATETIME,
phone numbers as CODE), each with its variants (ctrlgen.variants). Texts: notes of common clinical words with
one name, one date and one phone drawn from the values (so that every text has matches). Per index: the memory
it keeps (``tracemalloc`` after the build, the variant caches cleared; pyahocorasick's nodes are allocated
through Python's allocator, so they are counted), its pickled size (what goes through the object store), build
seconds and milliseconds per text; both must find the same values in every text.

    .venv/bin/python benchmarks/value_index.py            # ~2 min; docs/benchmarks/value_index.json + docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import random
import sys
import time
import tracemalloc
from array import array
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402

from ctrlgen import variants  # noqa: E402
from ctrlgen.metrics.leakage import ValueIndex, _is_word, normalize_value  # noqa: E402
from ctrlgen.variants import match_keys, normalize, split_value  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/value_index.py"
LISTS = ROOT / ".." / "shared" / "tools" / "physionet-deid" / "lists"
WORDS = ("the patient was seen today by dr and his wife on with no acute events overnight vitals stable "
         "pain 12 mg po q6h bp 120/80 hr 88 afebrile plan continue").split()  # fmt: skip


class AutomatonIndex:
    """The reference: the same variant keys in an Aho-Corasick automaton (an int per key), the values a key
    stands for as runs of positions (as ValueIndex held them before its keys were hashed)."""

    def __init__(self, values: list[Any]) -> None:
        import ahocorasick
        import numpy as np

        from ctrlgen.metrics.rouge import distinct_pairs

        self._automaton: Any = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        self._key_len = array("i")
        norms: dict[str, int] = {}
        pk, pv = array("i"), array("i")
        for item in values:
            value, category = split_value(item)
            v = norms.setdefault(normalize(value), len(norms))
            for key in match_keys(value, category):
                k = self._automaton.get(key, -1)
                if k < 0:
                    k = len(self._key_len)
                    self._automaton.add_word(key, k)
                    self._key_len.append(len(key))
                pk.append(k)
                pv.append(v)
        ordered = sorted(norms.items())
        self._values = tuple(v for v, _ in ordered)
        position = np.empty(len(ordered), dtype=np.int32)
        position[[i for _, i in ordered]] = np.arange(len(ordered), dtype=np.int32)
        keys, vals, _ = distinct_pairs(np.frombuffer(pk, dtype=np.int32), position[np.frombuffer(pv, dtype=np.int32)])
        self._members = vals
        self._starts = np.searchsorted(keys, np.arange(len(self._key_len) + 1)).astype(np.int64)
        self._automaton.make_automaton()

    def find(self, text: str) -> set[str]:
        norm = normalize_value(text)
        last = len(norm) - 1
        out: set[str] = set()
        for end, i in self._automaton.iter(norm):
            start = end - self._key_len[i] + 1
            if (start == 0 or not _is_word(norm[start - 1])) and (end == last or not _is_word(norm[end + 1])):
                out.update(self._values[j] for j in self._members[self._starts[i] : self._starts[i + 1]].tolist())
        return out

    def __reduce__(self) -> Any:  # pickled as what it holds (the automaton pickles itself)
        return (object.__new__, (AutomatonIndex,), self.__dict__)


def _lines(name: str) -> list[str]:
    return [x.strip() for x in (LISTS / name).read_text(errors="replace").splitlines() if x.strip().isalpha()]


def corpus(n_values: int, n_texts: int, seed: int = 0) -> tuple[list[Any], list[str]]:
    rng = random.Random(seed)
    first, last = (
        _lines("female_names_popular.txt") + _lines("male_names_popular.txt"),
        _lines("last_names_popular.txt"),
    )
    people = [(f"{rng.choice(first)} {rng.choice(last)}", "PERSON") for _ in range(int(n_values * 0.6))]
    dates = [(f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(2000, 2199)}", "DATETIME")
             for _ in range(int(n_values * 0.3))]  # fmt: skip
    phones = [(f"{rng.randint(200, 999)}-{rng.randint(0, 9999):04d}", "CODE") for _ in range(int(n_values * 0.1))]
    values = people + dates + phones
    texts = []
    for _ in range(n_texts):
        words = [rng.choice(WORDS) for _ in range(330)]
        for v in (rng.choice(people)[0], rng.choice(dates)[0], rng.choice(phones)[0]):
            words.insert(rng.randrange(len(words)), v)
        texts.append(" ".join(words))
    return values, texts


def measure(cls: Any, values: list[Any], texts: list[str]) -> tuple[dict[str, float], list[set[str]]]:
    for f in (variants._variants, variants._keys):
        f.cache_clear()
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    index = cls(values)
    build = time.perf_counter() - t0
    for f in (variants._variants, variants._keys):  # the caches are the variants', not the index's
        f.cache_clear()
    gc.collect()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pickled = len(pickle.dumps(index))
    index.find(texts[0])  # warm
    t0 = time.perf_counter()
    found = [index.find(t) for t in texts]
    find = time.perf_counter() - t0
    return {"kept_mb": kept / 1e6, "build_peak_mb": peak / 1e6, "pickled_mb": pickled / 1e6, "build_s": build,
            "find_ms": 1000 * find / len(texts), "bytes_per_value": kept / len(values)}, found  # fmt: skip


def _rows(a: dict[str, float], h: dict[str, float]) -> list[tuple[str, dict[str, float]]]:
    return [("Aho-Corasick automaton (pyahocorasick, before)", a), ("hashed keys in sorted arrays (ValueIndex)", h)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--values", type=int, default=150_000)
    ap.add_argument("--texts", type=int, default=500)
    ap.add_argument("--render", action="store_true", help="Write the section again from the JSON (no run).")
    args = ap.parse_args()
    out = ROOT / "docs" / "benchmarks" / "value_index.json"
    if args.render:
        render(json.loads(out.read_text()))
        return 0
    values, texts = corpus(args.values, args.texts)
    keys = sum(len(match_keys(*split_value(v))) for v in values)
    res: dict[str, Any] = {"values": len(values), "variant_keys": keys, "texts": len(texts),
                           "chars_per_text": sum(map(len, texts)) / len(texts)}  # fmt: skip
    found = {}
    for name, cls in (("automaton", AutomatonIndex), ("hashed", ValueIndex)):
        res[name], found[name] = measure(cls, values, texts)
        print(f"[value_index] {name}: {res[name]}", file=sys.stderr, flush=True)
    res["same_matches"] = found["automaton"] == found["hashed"]
    res["matches"] = sum(map(len, found["hashed"]))
    if not res["same_matches"]:
        raise SystemExit("the two indexes found different values: see the JSON")
    out.write_text(json.dumps(res, indent=2) + "\n")
    render(res)
    return 0


def render(res: dict[str, Any]) -> None:
    a, h = res["automaton"], res["hashed"]
    body = (
        f"Command: `{COMMAND}` ({res['values']:,} private values with {res['variant_keys']:,} variant keys; "
        f"{res['texts']} notes of ~{res['chars_per_text']:.0f} characters, {res['matches']:,} value matches in all, "
        f"the same for both indexes; JSON docs/benchmarks/value_index.json).\n\n"
        "| index | kept after the build | per value | pickled | build peak | build | find, per note |\n"
        "|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {label} | {r['kept_mb']:.0f} MB | {r['bytes_per_value']:.0f} B | {r['pickled_mb']:.0f} MB | "
            f"{r['build_peak_mb']:.0f} MB | {r['build_s']:.1f} s | {r['find_ms']:.2f} ms |\n"
            for label, r in _rows(a, h)
        )
        + f"\nRatios (hashed / automaton): memory kept {h['kept_mb'] / a['kept_mb']:.2f}, pickled "
        f"{h['pickled_mb'] / a['pickled_mb']:.2f}, build time {h['build_s'] / a['build_s']:.2f}, find time "
        f"{h['find_ms'] / a['find_ms']:.2f}. Builds are timed with `tracemalloc` on (it slows both, the hashed "
        "index's per-character hashing in Python the more). Memory is what `tracemalloc` sees still allocated after the build with "
        "the variant caches cleared (tracemalloc counts the automaton's nodes: pyahocorasick allocates them through Python's allocator); a process's "
        "RSS after an in-process build is higher for both (the build peak, freed, stays as fragmented arenas), "
        "which is why a Scorer replica loads a saved shard (the arrays only) rather than building it.\n"
    )
    write_section("Serve Scorer: private-value index memory", body)


if __name__ == "__main__":
    sys.exit(main())
