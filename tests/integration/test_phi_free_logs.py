"""Planted private strings go through the whole pipeline and reach no Ray log file and no console output."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _planted(i: int) -> tuple[str, str]:
    rng = random.Random(i)
    word = lambda: "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(4)).capitalize()  # noqa: E731
    return word(), word()


def test_planted_names_reach_no_log_and_no_console(tmp_path):
    names = [_planted(i) for i in range(24)]
    with open(tmp_path / "notes.jsonl", "w") as f:
        for i, (first, last) in enumerate(names):
            text = (f"Mr. {first} {last} was admitted on 03/0{i % 9 + 1}/2021 with chest pain. "
                    f"Dr. {last} spoke with {first}'s wife at Saint Mary Hospital. Vitals stable, plan discharge.")  # fmt: skip
            f.write(json.dumps({"id": f"n{i}", "text": text}) + "\n")
    ray_tmp = Path(f"/tmp/cgphi-{os.getpid()}")  # short: Ray's socket paths must stay under 107 bytes
    shutil.rmtree(ray_tmp, ignore_errors=True)
    ray_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp)}
    cmd = [sys.executable, "-m", "ctrlgen.cli", "synthesize", "-c", "configs/generate_tiny.yaml",
           "corpus.format=generic", f"corpus.path={tmp_path / 'notes.jsonl'}", "corpus.id_column=id",
           "extraction.setting=unknown", "generation.num_documents=6", "generation.context_pool_size=12",
           f"output_dir={tmp_path / 'out'}", "ray.num_cpus=4"]  # fmt: skip
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        planted = {s for pair in names for s in pair}
        # the pipeline did see them: extraction put them into control codes
        import pyarrow.dataset as pads

        codes = pads.dataset(str(tmp_path / "out" / "extracted" / "status=ok"), format="parquet").to_table(
            columns=["control_code"]).column("control_code").to_pylist()  # fmt: skip
        assert any(p in c for c in codes for p in planted), "no planted name was extracted: the test proves nothing"
        console = res.stdout + res.stderr
        assert not [p for p in planted if p in console]
        logs = [f for f in ray_tmp.rglob("*") if f.is_file() and "/logs/" in str(f)]
        assert logs, "no Ray log files found"
        hits = [(f.name, p) for f in logs for p in planted if p.encode() in f.read_bytes()]
        assert hits == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
