"""A real head node (cluster/start_head.sh: dashboard, token auth) and jobs sent to it with `ctrlgen submit`.

The code travels as the job's working_dir and the resolved config in its runtime_env; the
driver joins the head's cluster (ray.address unset, RAY_ADDRESS set by Ray's job supervisor).
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.dataset as pads
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory, s3_server):
    tmp = tmp_path_factory.mktemp("head")
    port, dash = 6391 + os.getpid() % 50, 8300 + os.getpid() % 50
    env = dict(
        os.environ,
        **s3_server,  # the cluster's credentials and endpoint for s3:// (an instance role, on a real cluster)
        RAY_STATE=str(tmp / "state"),
        GCS_PORT=str(port),
        DASHBOARD_PORT=str(dash),
        AGENT_PORT=str(_free_port()),  # not Ray's default, which a test's private cluster may hold
        NUM_CPUS="4",
        RAY_TEMP_DIR=f"/tmp/ray-cg-{os.getpid()}",
        BIN=str(Path(sys.executable).parent),
    )
    for var in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(var, None)
    try:
        subprocess.run(["bash", "cluster/start_head.sh"], cwd=ROOT, env=env, check=True, timeout=180,
                       capture_output=True, text=True)  # fmt: skip
        yield env, dash, tmp / "state" / "auth_token"
    finally:
        subprocess.run(["bash", "cluster/stop_head.sh"], cwd=ROOT, env=env, timeout=60)
    import psutil

    left = [p.pid for p in psutil.process_iter(["cmdline"]) if env["RAY_TEMP_DIR"] in " ".join(p.info["cmdline"] or [])]
    assert left == [], "stop_head.sh left Ray processes running"


def _submit(env, args, timeout=600):
    return subprocess.run(["bash", "cluster/submit.sh", *args], cwd=ROOT, env=env, timeout=timeout,
                          capture_output=True, text=True)  # fmt: skip


def test_dashboard_and_jobs_api_need_the_token(head):
    env, dash, token_file = head
    token = token_file.read_text().strip()
    assert _get(f"http://127.0.0.1:{dash}/api/version") == 401
    assert _get(f"http://127.0.0.1:{dash}/api/version", token) == 200
    res = subprocess.run(
        [sys.executable, "-m", "ctrlgen.cli", "submit", "extract", "-c", "configs/extract_demo.yaml",
         "--address", f"http://127.0.0.1:{dash}"],
        cwd=ROOT, env=env | {"CTRLGEN_CACHE": str(token_file.parent / "no-token-here")},
        timeout=120, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode != 0
    assert "401" in res.stderr or "nauthori" in res.stderr or "uthentication" in res.stderr, res.stderr[-2000:]


def test_submit_extraction(head, tmp_path):
    env, _, _ = head
    out_dir = tmp_path / "out"
    res = _submit(env, ["extract", "-c", "configs/extract_demo.yaml", "demo_corpus.n_notes=400",
                        f"demo_corpus.output_dir={tmp_path / 'notes'}", f"output_dir={out_dir}",
                        "extraction.num_actors=1"])  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "rows in 400 = documents out" in res.stdout
    assert "SUCCEEDED" in res.stderr
    ok = pads.dataset(str(out_dir / "extracted" / "status=ok"), format="parquet").count_rows()
    assert 390 <= ok <= 400


def test_submit_the_synthesize_pipeline_on_s3_then_resubmit_skips_it(head, tmp_path, shared):
    """Input corpus and every output in s3:// (the S3 server of the tests); the job runs on the head's cluster."""
    from ctrlgen import storage
    from ctrlgen.config import PhysionetCorpusConfig
    from ctrlgen.corpora import read_corpus
    from ctrlgen.io import write_records

    env, _, _ = head
    corpus, out = "s3://ctrlgen-test/submit-corpus", "s3://ctrlgen-test/submit-run"
    src = PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=120)
    write_records(read_corpus(src), tmp_path / "docs")  # ctrlgen's document shards, gold spans included
    storage.upload(str(tmp_path / "docs"), corpus)
    args = ["synthesize", "-c", "configs/generate_tiny.yaml", f"output_dir={out}", "generation.num_documents=4",
            "corpus.format=mimic", f"corpus.path={corpus}", "corpus.limit=null", "generation.num_actors=1"]  # fmt: skip
    res = _submit(env, args)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for stage in ("extract", "generate", "score", "export"):
        assert storage.exists(f"{out}/pipeline/{stage}.json")
    card = json.loads(storage.read_text(f"{out}/release/release.json"))  # the release, on S3 too
    assert list(card["modes"]) == ["icl_blocking"] and card["modes"]["icl_blocking"]["generated"] == 4
    table = json.loads(storage.read_text(f"{out}/generated/leakage.json"))
    assert {r["mode"] for r in table} == {"baseline", "icl", "icl_blocking"}
    again = _submit(env, args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("skipped (done)") == 4  # extract, generate, score, export
