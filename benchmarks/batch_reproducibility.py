"""Do the same sampled notes give the same synthetic notes whatever the input's file layout?

A row's sampled text depends on its batch companions (padding; bf16), and an unknown-setting
extraction writes its rows in a different order on every run. This script generates from one
extraction output twice: as written, and rewritten as 5 files of shuffled rows (the same rows),
then once more as written at half the batch size. It counts the (note, mode) texts that are equal.

    .venv/bin/ctrlgen extract -c configs/extract_physionet.yaml output_dir=/tmp/rep/A
    .venv/bin/python benchmarks/batch_reproducibility.py --extracted /tmp/rep/A/extracted

``--code DIR`` runs another checkout's code (``PYTHONPATH=DIR``), for a before/after comparison.
Results: docs/results.md ("Run-to-run variation in the unknown rows").
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _reshuffled(extracted: str, out: Path, files: int = 5, seed: int = 3) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted(glob.glob(os.path.join(extracted, "status=ok", "*.parquet")))
    if not parts:
        raise SystemExit(f"no status=ok Parquet files under {extracted}")
    table = pa.concat_tables([pq.read_table(p) for p in parts])
    order = list(range(table.num_rows))
    random.Random(seed).shuffle(order)
    table = table.take(order)
    d = out / "status=ok"
    d.mkdir(parents=True)
    step = -(-table.num_rows // files)
    for f in range(files):
        pq.write_table(table.slice(f * step, step), d / f"part-{f}.parquet")
    return str(out)


def _generate(code: Path, extracted: str, out: Path, batch: int, docs: int, tokens: int) -> dict:
    from ctrlgen.generation.report import read_generated

    cmd = [
        str(ROOT / ".venv" / "bin" / "ctrlgen"), "generate", "-c", "configs/generate_physionet.yaml",
        f"generation.input={extracted}", f"generation.num_documents={docs}", "generation.modes=[icl,icl_blocking]",
        f"generation.sampling.max_new_tokens={tokens}", "generation.dtype=bfloat16", f"generation.batch_size={batch}",
        "generation.gate.enabled=false", f"output_dir={out}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code)}
    with open(out.with_suffix(".log"), "w") as log:
        print(f"  generate ({batch} per batch) from {extracted} ...", file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return {(r["doc_id"], r["mode"]): r["text"] for r in read_generated(out / "generated")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extracted", required=True, help="an extraction output (status=ok/*.parquet)")
    ap.add_argument("--code", default=str(ROOT), help="the checkout whose code generates")
    ap.add_argument("--documents", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    code = Path(args.code).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        shuffled = _reshuffled(args.extracted, t / "shuffled")
        as_written = _generate(code, args.extracted, t / "a", args.batch, args.documents, args.tokens)
        relaid = _generate(code, shuffled, t / "b", args.batch, args.documents, args.tokens)
        half = _generate(code, args.extracted, t / "c", max(1, args.batch // 2), args.documents, args.tokens)
    same = lambda x: sum(as_written[k] == x.get(k) for k in as_written)  # noqa: E731
    n = len(as_written)
    print(f"code: {code}")
    print(f"{args.documents} sampled notes x 2 modes, SmolLM2 bf16, {args.tokens} new tokens, {args.batch} per batch")
    print(f"- same input, other file layout (5 files, rows shuffled): {same(relaid)} of {n} texts equal")
    print(f"- same input, {max(1, args.batch // 2)} per batch: {same(half)} of {n} texts equal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
