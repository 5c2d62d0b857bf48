"""The shipped Serve config files are valid Ray Serve configs with the options the service needs."""

from pathlib import Path

import pytest
import yaml

from ctrlgen.config import load_config

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "configs" / "serve").glob("*.yaml"))


def test_there_are_serve_configs():
    assert {f.name for f in FILES} >= {"demo.yaml", "tiny.yaml"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_serve_config_is_valid_and_every_deployment_autoscales(path):
    from ray.serve.schema import ServeDeploySchema

    data = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(data)
    (app,) = schema.applications
    assert app.import_path == "serve.app:build_app"
    cfg = load_config(ROOT / app.args["config"], app.args.get("overrides") or [])
    names = {d.name for d in app.deployments}
    shards = {f"ScorerShard{i}" for i in range(cfg.serve.scorer_shards)}
    assert names == {"Api", "Generator", "Extractor", "Scorer"} | shards
    batch = {"Generator": cfg.serve.generator_batch_size, "Extractor": cfg.serve.extractor_batch_size}
    for d in app.deployments:
        auto = d.autoscaling_config
        assert auto and auto["min_replicas"] >= 1 and auto["max_replicas"] >= auto["min_replicas"], d.name
        assert d.max_ongoing_requests >= batch.get(d.name, 1), d.name
        assert d.max_queued_requests and d.max_queued_requests > 0, d.name


def test_the_grafana_dashboard_charts_every_service_metric():
    import json
    import re

    source = (ROOT / "serve" / "metrics.py").read_text()
    names = set(re.findall(r'"(ctrlgen_serve_[a-z_]+)"', source))
    dashboard = json.loads((ROOT / "cluster" / "monitoring" / "ctrlgen_serve_grafana.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert len(names) == 8
    assert not [n for n in names if f"ray_{n}" not in exprs]


def test_the_jobs_dashboard_charts_every_job_metric():
    import json
    import re

    source = (ROOT / "ray_jobs" / "metrics.py").read_text()
    names = set(re.findall(r'"(ctrlgen_(?:job|train)_[a-z_]+)"', source))
    dashboard = json.loads((ROOT / "cluster" / "monitoring" / "ctrlgen_jobs_grafana.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert len(names) == 7
    assert not [n for n in names if f"ray_{n}" not in exprs]


def test_write_deploy_gives_a_self_contained_serve_config_with_token_digests_only(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.serve.schema import ServeDeploySchema

    from ctrlgen.cli import main
    from serve.api import read_tokens, token_digest
    from serve.app import build_app

    ext = tmp_path / "extracted" / "status=ok"
    ext.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"doc_id": "a", "text": "Seen by Smith.", "control_code": "PERSON: Smith",
                                          "entities": []}]), ext / "part-0.parquet")  # fmt: skip
    monkeypatch.setenv("CTRLGEN_SERVE_TOKEN", "release-token-for-deploy-0123")
    monkeypatch.setenv("CTRLGEN_SERVE_AUDIT_TOKEN", "audit-token-for-deploy-0123")
    out = tmp_path / "deploy.yaml"
    rc = main(["serve", "-c", "configs/serve_tiny.yaml", "--serve-config", "configs/serve/tiny.yaml", "--host", "0.0.0.0",
               "--write-deploy", str(out), f"serve.contexts={tmp_path / 'extracted'}"])  # fmt: skip
    assert rc == 0
    text = out.read_text()
    assert "release-token-for-deploy" not in text and "audit-token-for-deploy" not in text
    schema = ServeDeploySchema.model_validate(yaml.safe_load(text))
    assert schema.http_options.host == "0.0.0.0"
    args = schema.applications[0].args
    assert set(args) == {"config_json"}  # no path of this machine's config files
    cfg = load_config(None, []).model_validate_json(args["config_json"])
    assert read_tokens(cfg) == {"release": token_digest("release-token-for-deploy-0123"),
                                "audit": token_digest("audit-token-for-deploy-0123")}  # fmt: skip
    assert build_app(args) is not None  # what a replica's node builds from it
