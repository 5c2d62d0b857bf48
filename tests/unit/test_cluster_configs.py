"""cluster/: the launcher config is valid for Ray's autoscaler, the KubeRay manifests are consistent with the repo."""

import importlib.util
import json
import shlex
from pathlib import Path

import pytest
import yaml

from ctrlgen.config import load_config

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "cluster" / "kuberay"


def test_launcher_config_is_valid_against_the_ray_wheels_schema():
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    cfg = yaml.safe_load((ROOT / "cluster" / "ray-cluster.yaml").read_text())
    jsonschema.validate(cfg, schema)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values()), "no GPU worker type"
    # every node runs the README's set-up and starts Ray from the environment it made
    assert any("make setup" in c for c in cfg["setup_commands"])
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert any(".venv/bin/ray start" in c for c in cfg[key]), key


def test_bad_launcher_config_is_rejected_by_the_same_check():
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    cfg = yaml.safe_load((ROOT / "cluster" / "ray-cluster.yaml").read_text())
    cfg["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema)


def test_rayjob_runs_the_synthesize_pipeline_with_a_shipped_config():
    job = yaml.safe_load((KUBE / "rayjob-synthesize.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:4] == ["python", "-m", "ctrlgen.cli", "synthesize"]
    config = argv[argv.index("-c") + 1]
    overrides = [a for a in argv[argv.index("-c") + 2 :] if "=" in a]
    cfg = load_config(ROOT / config, overrides)
    assert cfg.output_dir.startswith("/shared/") and cfg.corpus.path.startswith("/shared/")
    spec = job["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == __import__("ray").__version__
    gpus = [g for g in spec["workerGroupSpecs"]
            if g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")]  # fmt: skip
    assert gpus and cfg.generation.actor_num_gpus >= 1 and cfg.training.use_gpu


def test_rayservice_embeds_the_gpu_serve_config_unchanged():
    spec = importlib.util.spec_from_file_location("render", KUBE / "render_rayservice.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    committed = (KUBE / "rayservice.yaml").read_text()
    assert committed == render.render(ROOT / "configs" / "serve" / "gpu.yaml"), "rerun render_rayservice.py"
    svc = yaml.safe_load(committed)
    assert svc["kind"] == "RayService"
    embedded = yaml.safe_load(svc["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load((ROOT / "configs" / "serve" / "gpu.yaml").read_text())
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(embedded)


@pytest.mark.parametrize("manifest", ["rayjob-synthesize.yaml", "rayservice.yaml"])
def test_every_ray_container_of_a_kuberay_manifest_takes_rays_token_authentication(manifest):
    """The head's dashboard listens on 0.0.0.0 (the pod network): with no token, whoever reaches it submits jobs."""
    doc = yaml.safe_load((KUBE / manifest).read_text())
    spec = doc["spec"]["rayClusterSpec" if doc["kind"] == "RayJob" else "rayClusterConfig"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    containers = [c for g in groups for c in g["template"]["spec"]["containers"]]
    assert len(containers) == len(groups) >= 2
    for c in containers:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ctrlgen-ray", "key": "token"}, c["name"]
