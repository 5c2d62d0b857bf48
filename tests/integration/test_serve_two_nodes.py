"""`ctrlgen serve --write-deploy` deployed onto a two-node Ray cluster on this machine (issue 40, item 6).

A head node with the HTTP proxy and the ingress, and a second node (``ray.cluster_utils.Cluster``: two raylets
on 127.0.0.1) with a custom resource that the Generator, the Extractor, the Scorer and its shards ask for, so
they can only run there. The
Serve config is the one `--write-deploy` writes: the resolved ctrlgen config and the tokens' SHA-256 digests in
the application's args. The token files and variables are gone before the deploy, so the replicas on the second
node can only check tokens against the digests they were given. Bounded: a few requests on 127.0.0.1.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "release-token-two-nodes-" + os.urandom(6).hex()
AUDIT = "audit-token-two-nodes-" + os.urandom(6).hex()


def _contexts(tmp: Path) -> Path:
    """Extraction output (known setting) of 60 demo notes: the service's contexts and references."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.config import DemoCorpusConfig, MimicCorpusConfig
    from ctrlgen.corpora import load_corpus
    from ctrlgen.demo import write_demo_corpus
    from ctrlgen.extract import KnownExtractor
    from ctrlgen.extract.stage import extract_rows

    notes = write_demo_corpus(DemoCorpusConfig(n_notes=60, output_dir=str(tmp / "notes")), progress=False)
    corpus = MimicCorpusConfig(path=str(notes), identifiers="direct+quasi")
    docs, _, _ = load_corpus(corpus)
    table = extract_rows([d.to_row() for d in docs], KnownExtractor(), corpus, "documents")
    table = table.filter(pa.compute.equal(table.column("status"), "ok"))
    out = tmp / "extracted"
    (out / "status=ok").mkdir(parents=True)
    pq.write_table(table, out / "status=ok" / "part-0.parquet")
    return out


def test_a_written_deploy_config_serves_from_a_second_node_with_token_digests_only(tmp_path, monkeypatch, free_port):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from ctrlgen.cli import main
    from serve.launch import http

    contexts = _contexts(tmp_path)
    monkeypatch.setenv("CTRLGEN_SERVE_TOKEN", RELEASE)
    monkeypatch.setenv("CTRLGEN_SERVE_AUDIT_TOKEN", AUDIT)
    port, dash = free_port(), free_port()
    deploy = tmp_path / "deploy.yaml"
    assert main(["serve", "-c", "configs/serve_tiny.yaml", "--serve-config", "configs/serve/tiny.yaml",
                 "--port", str(port), "--write-deploy", str(deploy), f"serve.contexts={contexts}"]) == 0  # fmt: skip
    monkeypatch.delenv("CTRLGEN_SERVE_TOKEN")
    monkeypatch.delenv("CTRLGEN_SERVE_AUDIT_TOKEN")
    text = deploy.read_text()
    assert RELEASE not in text and AUDIT not in text
    spec = yaml.safe_load(text)
    for d in spec["applications"][0]["deployments"]:  # the ingress on the head, everything else on the second node
        where = "head_node" if d["name"] == "Api" else "second_node"
        d.setdefault("ray_actor_options", {})["resources"] = {where: 0.01}
        d["autoscaling_config"] = {**d.get("autoscaling_config", {}), "min_replicas": 1, "max_replicas": 1}
    deploy.write_text(yaml.safe_dump(spec, sort_keys=False))

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True,
                                                            "dashboard_port": dash, "resources": {"head_node": 1}})  # fmt: skip
    second = cluster.add_node(num_cpus=3, resources={"second_node": 1})
    address = f"http://127.0.0.1:{dash}"
    serve_cli = str(Path(sys.executable).with_name("serve"))
    try:
        ray.init(address=cluster.address, configure_logging=False)
        subprocess.run([serve_cli, "deploy", str(deploy), "--address", address], check=True, timeout=120)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 240
        while True:  # the documented recipe: deploy returns at once, the replicas start in the background
            got = subprocess.run([serve_cli, "status", "--address", address], capture_output=True, text=True,
                                 timeout=60).stdout  # fmt: skip
            if "status: RUNNING" in got and "DEPLOY_FAILED" not in got and "UPDATING" not in got:
                break
            assert "DEPLOY_FAILED" not in got, got
            assert time.monotonic() < deadline, got
            time.sleep(3)
        assert http("GET", url + "/healthz", None, None, 60) == (200, {"status": "ok"})
        assert http("GET", url + "/v1/models", None, "wrong-token", 60)[0] == 401
        status, body = http("POST", url + "/v1/synthesize", {"n": 1, "seed": 3, "max_new_tokens": 8}, RELEASE, 300)
        assert status == 200, body
        assert body["outputs"] and body["outputs"][0]["new_tokens"] > 0
        status, body = http("POST", url + "/v1/score", {"texts": ["Patient seen today, stable."]}, AUDIT, 300)
        assert status == 200, body
        # where the replicas ran: the Generator, the Scorer and its shards on the second node, the ingress not
        nodes = {a.class_name: a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)}
        on_second = {n for n, node in nodes.items() if node == second.node_id}
        assert {"ServeReplica:ctrlgen:Generator", "ServeReplica:ctrlgen:Scorer",
                "ServeReplica:ctrlgen:ScorerShard0", "ServeReplica:ctrlgen:ScorerShard1",
                "ServeReplica:ctrlgen:Extractor"} <= on_second, nodes  # fmt: skip
        assert nodes["ServeReplica:ctrlgen:Api"] == cluster.head_node.node_id, nodes
    finally:
        subprocess.run([serve_cli, "shutdown", "--address", address, "-y"], timeout=120, check=False)
        ray.shutdown()
        cluster.shutdown()
