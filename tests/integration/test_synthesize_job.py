"""The synthesize pipeline killed mid-generation, then run again: it resumes, nothing twice, nothing lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from ctrlgen.config import PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.metrics.leakage import ValueIndex

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cmd(out_dir, shared):
    return [sys.executable, "-m", "ctrlgen.cli", "synthesize", "-c", "configs/generate_tiny.yaml",
            f"output_dir={out_dir}", f"corpus.path={shared / 'physionet-deid'}", "generation.num_documents=24",
            "generation.batch_size=1", "generation.rows_per_file=1", "generation.num_actors=1", "generation.sampling.max_new_tokens=48",
            "ray.num_cpus=4"]  # fmt: skip


def test_killed_mid_generation_the_pipeline_resumes(tmp_path, shared):
    out_dir = tmp_path / "synth"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    commits = out_dir / "generated" / "_commits"
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(_cmd(out_dir, shared), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if commits.is_dir() and len(list(commits.iterdir())) >= 3:
                break
            time.sleep(0.2)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and the private cluster it started
        except ProcessLookupError:  # it ended first: the assertion below says so, with its log
            pass
        proc.wait(timeout=60)
    first = (tmp_path / "first.log").read_text()
    done_first = len(list(commits.iterdir())) if commits.is_dir() else 0
    assert 3 <= done_first < 24, f"not killed mid-generation ({done_first} blocks committed)\n{first[-2000:]}"
    assert not (out_dir / "pipeline" / "generate.json").exists()
    time.sleep(2)  # the killed cluster's processes exit (they share its fate)

    res = subprocess.run(_cmd(out_dir, shared), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "stage extract: done in an earlier run, skipped" in res.stderr
    resumed = [ln for ln in res.stderr.splitlines() if "resuming:" in ln]
    assert resumed, res.stderr[-3000:]
    n_done = int(resumed[0].split("resuming:")[1].split()[0])
    assert n_done >= 3 and f"{24 - n_done} to go" in resumed[0]

    gen = out_dir / "generated"
    files = sorted(str(f) for f in gen.glob("mode=*/*.parquet"))
    t = pads.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(gen)).to_table(
        columns=["mode", "doc_id"]
    )
    keys = list(zip(t.column("mode").to_pylist(), t.column("doc_id").to_pylist(), strict=True))
    assert len(keys) == 24 * 3 and len(set(keys)) == len(keys)  # every (document, mode) once
    committed = {f.name for f in (gen / "_commits").iterdir()}
    assert all(f.stem in committed for f in gen.glob("mode=*/*.parquet"))  # nothing uncommitted left
    stats = json.loads((gen / "leakage.json").read_text())
    assert {s["mode"]: s["outputs"] for s in stats} == {"baseline": 24, "icl": 24, "icl_blocking": 24}

    # The last stage: the release. No value of the input's entities (4+ characters: the export's corpus-wide
    # check; shorter ones are checked against each note's own contexts) and no real id is anywhere in it.
    assert "stage export: done" in res.stderr
    release = out_dir / "release"
    card = json.loads((release / "release.json").read_text())
    assert list(card["modes"]) == ["icl_blocking"] and card["modes"]["icl_blocking"]["generated"] == 24
    docs, _, _ = load_corpus(  # the input: configs/generate_tiny.yaml reads the first 200 notes
        PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=200)
    )
    values = {e.text.strip() for d in docs for e in d.entities if len(e.text.strip()) >= 4}
    found = ValueIndex(sorted(values))
    files = [f for f in release.rglob("*") if f.is_file()]
    assert (release / "RELEASE.md") in files and any(f.suffix == ".parquet" for f in files)
    for f in files:
        text = pq.read_table(f).to_pandas().to_csv() if f.suffix == ".parquet" else f.read_text()
        assert not found.find(text), f"{f.name} holds a private value of the input"
        if f.suffix == ".parquet":  # the release's columns only: no doc_id, context_ids or values
            assert pq.read_table(f).column_names == ["id", "mode", "text", "control_code"]
