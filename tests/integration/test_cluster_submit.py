"""A real head node with dashboard and token auth, a job submitted to it with `ray job submit`."""

import os
import subprocess
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


def test_submit_extraction_to_a_token_protected_head(tmp_path):
    port, dash = 6391 + os.getpid() % 50, 8300 + os.getpid() % 50
    env = dict(
        os.environ,
        RAY_STATE=str(tmp_path / "state"),
        GCS_PORT=str(port),
        DASHBOARD_PORT=str(dash),
        NUM_CPUS="4",
        RAY_TEMP_DIR=f"/tmp/ray-cg-{os.getpid()}",
        BIN=str(Path(os.sys.executable).parent),
    )
    for var in ("RAY_AUTH_MODE", "RAY_ADDRESS"):
        env.pop(var, None)
    try:
        subprocess.run(
            ["bash", "cluster/start_head.sh"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=180,
            capture_output=True,
            text=True,
        )
        token = (tmp_path / "state" / "auth_token").read_text().strip()
        assert _get(f"http://127.0.0.1:{dash}/api/version") == 401
        assert _get(f"http://127.0.0.1:{dash}/api/version", token) == 200
        out_dir = tmp_path / "out"
        res = subprocess.run(
            [
                "bash",
                "cluster/submit.sh",
                "configs/extract_demo.yaml",
                "demo_corpus.n_notes=400",
                f"demo_corpus.output_dir={tmp_path / 'notes'}",
                f"output_dir={out_dir}",
                "extraction.num_actors=1",
            ],
            cwd=ROOT,
            env=env,
            timeout=600,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "rows in 400 = documents out" in res.stdout
        ok = pads.dataset(str(out_dir / "extracted" / "status=ok"), format="parquet").count_rows()
        assert 390 <= ok <= 400
    finally:
        subprocess.run(["bash", "cluster/stop_head.sh"], cwd=ROOT, env=env, timeout=60)
    import psutil

    left = [p.pid for p in psutil.process_iter(["cmdline"]) if env["RAY_TEMP_DIR"] in " ".join(p.info["cmdline"] or [])]
    assert left == [], "stop_head.sh left Ray processes running"
