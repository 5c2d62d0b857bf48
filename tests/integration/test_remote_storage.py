"""Remote storage end to end: the synthesize pipeline reading and writing only s3:// on a real
S3-compatible server (moto's server mode on 127.0.0.1), with the tiny model.

The corpus (demo NOTEEVENTS shards) is uploaded first; then extraction, prefix training (Ray
Train checkpoints in s3://), the adapter (loaded by the generation actors from s3://),
generation and scoring all go through pyarrow.fs. Nothing is written to the local disk
but Ray's own session files and the model cache.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from ctrlgen import storage

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
S3_BUCKET = "ctrlgen-test"  # made by the s3_server fixture


def test_storage_round_trip_on_s3(s3_server, tmp_path):
    base = f"s3://{S3_BUCKET}/roundtrip"
    assert not storage.exists(base) and storage.list_files(base) == []
    storage.write_text(storage.join(base, "_commits", "a"), "marker")
    storage.write_parquet(pa.table({"x": [1, 2]}), storage.join(base, "mode=icl", "p.parquet"))
    assert storage.is_dir(base) and storage.read_text(storage.join(base, "_commits", "a")) == "marker"
    files = storage.parquet_files(base)
    assert files == [f"s3://{S3_BUCKET}/roundtrip/mode=icl/p.parquet"]
    assert storage.parquet_rows(files) == 2 and storage.parquet_rows([]) == 0
    assert storage.dataset(files, base=base).to_table().to_pylist() == [
        {"x": 1, "mode": "icl"},
        {"x": 2, "mode": "icl"},
    ]
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    storage.upload(str(tmp_path / "adapter"), storage.join(base, "adapter"))
    with storage.local_copy(storage.join(base, "adapter")) as local:
        assert Path(local, "adapter_config.json").read_text() == "{}"
    assert not Path(local).exists()  # the download is removed with the block
    storage.remove(base)
    assert not storage.exists(base)


def _upload_demo_corpus(n_notes: int, dest: str) -> None:
    from ctrlgen.config import DemoCorpusConfig
    from ctrlgen.demo import write_demo_corpus

    with tempfile.TemporaryDirectory() as d:
        src = write_demo_corpus(DemoCorpusConfig(n_notes=n_notes, seed=3, shard_size=100, output_dir=d), progress=False)
        storage.upload(str(src), dest)


def _objects(prefix: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, p = storage.filesystem(prefix)
    return sorted(
        i.path for i in fs.get_file_info(pafs.FileSelector(p, recursive=True)) if i.type == pafs.FileType.File
    )


def test_synthesize_pipeline_reads_and_writes_only_s3(s3_server, tmp_path):
    corpus, out = f"s3://{S3_BUCKET}/corpus-a", f"s3://{S3_BUCKET}/run-a"
    _upload_demo_corpus(300, corpus)
    cmd = [sys.executable, "-m", "ctrlgen.cli", "synthesize", "-c", str(ROOT / "configs" / "train_tiny.yaml"),
           "corpus.format=mimic", f"corpus.path={corpus}", "corpus.limit=null", f"output_dir={out}",
           "generation.modes=[icl_blocking,prefix]", "generation.num_documents=4", "training.num_workers=1",
           "ray.num_cpus=4"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | s3_server
    env["PYTHONPATH"] = str(ROOT)
    work = tmp_path / "cwd"  # relative paths would land here: nothing may
    work.mkdir()
    res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list(work.iterdir()) == []

    keys = _objects(out)
    rel = [k.split("/run-a/", 1)[1] for k in keys]
    for stage in ("extract", "train", "generate", "score", "export"):
        assert f"pipeline/{stage}.json" in rel
    assert {"release/RELEASE.md", "release/release.json"} <= set(rel)  # the release and its card, on S3
    assert any(r.startswith("extracted/status=ok/") and r.endswith(".parquet") for r in rel)
    assert any(r.startswith("train_data/status=ok/") for r in rel)
    assert "adapter/adapter_config.json" in rel
    assert any(r.startswith("ray_train/") and "checkpoint" in r for r in rel)  # Ray Train's storage_path
    assert {r.split("/")[1] for r in rel if r.startswith("generated/mode=")} == {"mode=icl_blocking", "mode=prefix"}
    stats = json.loads(storage.read_text(f"{out}/generated/leakage.json"))
    assert {s["mode"]: s["outputs"] + s["quarantined"] for s in stats} == {"icl_blocking": 4, "prefix": 4}
    assert f"adapter written to {out}/adapter" in res.stdout
    # without a dashboard Ray Train's placement-group cleaner cannot reach the State API: its warning each
    # second is silenced by init_ray's worker set-up hook
    assert "Failed to query Ray Train Controller" not in res.stdout + res.stderr

    again = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("skipped (done)") == 5  # extract, train, generate, score, export

    # The evaluation job on the same output: references (the extraction) sharded on s3, records on s3.
    ev_cmd = [sys.executable, "-m", "ctrlgen.cli", "evaluate", *cmd[4:], "evaluation.num_shards=3"]
    ev = subprocess.run(ev_cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    assert list(work.iterdir()) == []
    metrics = json.loads(storage.read_text(f"{out}/evaluation/metrics.json"))
    assert {m: v["outputs"] + v["quarantined"] for m, v in metrics.items()} == {"icl_blocking": 4, "prefix": 4}
    rel = [k.split("/run-a/", 1)[1] for k in _objects(out)]
    ft_shards = {r.split("/")[3] for r in rel if r.startswith("evaluation/references/finetune/")}
    assert ft_shards and ft_shards <= {"shard=0", "shard=1", "shard=2"}
    assert any(r.startswith("evaluation/records/") and r.endswith(".parquet") for r in rel)
    assert "| prefix |" in ev.stdout and "| icl_blocking |" in ev.stdout


def test_experiment_reads_and_writes_only_s3(s3_server, tmp_path):
    """The research matrix with its corpus and output_dir on S3 (a small matrix: ICL + blocking and masked
    prefix tuning, one seed, the sharded Ray evaluation, one canary): nothing is written to the local disk
    where it runs, and the results page and its JSON land on S3."""
    corpus, out = f"s3://{S3_BUCKET}/corpus-e", f"s3://{S3_BUCKET}/exp-e"
    _upload_demo_corpus(120, corpus)
    cmd = [sys.executable, "-m", "ctrlgen.cli", "experiment", "-c", str(ROOT / "configs" / "experiment_tiny.yaml"),
           "corpus.format=mimic", f"corpus.path={corpus}", "corpus.limit=null", f"output_dir={out}",
           "experiment.settings=[known]", "experiment.methods=[icl_blocking,prefix_masked]", "experiment.seeds=[0]",
           "experiment.distributed_eval=true", "experiment.canaries=1", "experiment.canary_repeats=[1]",
           "experiment.canary_candidates=9", "training.num_workers=1", "ray.num_cpus=4"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | s3_server
    env["PYTHONPATH"] = str(ROOT)
    work = tmp_path / "cwd"
    work.mkdir()
    res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert list(work.iterdir()) == []
    rel = [k.split("/exp-e/", 1)[1] for k in _objects(out)]
    assert {"results/results.json", "results/results.md", "results/privacy_utility.png"} <= set(rel)
    assert any(r.startswith("data/known/split/split=train/") for r in rel)
    assert "runs/known/prefix_masked-s0/adapter/adapter_config.json" in rel
    assert any(r.startswith("eval_references/") for r in rel)
    data = json.loads(storage.read_text(f"{out}/results/results.json"))
    cells = {(c["setting"], c["method"]) for c in data["cells"]}
    assert {("known", "icl_blocking"), ("known", "prefix_masked")} <= cells
    assert all(c["outputs"] >= 1 for c in data["cells"] if c["setting"] == "known")
    assert "exposure" in next(c for c in data["cells"] if c["method"] == "prefix_masked")
