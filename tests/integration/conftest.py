"""Integration fixtures: a real local Ray cluster per test module, a real S3-compatible server."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings

import psutil
import pytest


def _is_ray_process(p: psutil.Process, ray_dir: str) -> bool:
    """Ray's own processes only: raylet, gcs_server, ``ray::`` workers, or a program under Ray's package
    (dashboard agent, log monitor...); not any process whose path merely contains "ray" (a checkout under
    /home/raymond/ running moto's S3 server)."""
    name, cmd = p.name(), p.cmdline()
    return (name in ("raylet", "gcs_server") or name.startswith("ray::") or (bool(cmd) and cmd[0].startswith("ray::"))
            or any(a.startswith(ray_dir) for a in cmd))  # fmt: skip


def _ray_processes(before: set[int], ray_dir: str) -> list[psutil.Process]:
    """This process' descendants that belong to the Ray cluster, except those in ``before`` (pids alive before
    the cluster started, such as the S3 server)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in before and _is_ray_process(p, ray_dir):
                found.append(p)
        except psutil.Error:  # gone meanwhile, or not ours to read
            pass
    return found


def _stop_leftovers(procs: list[psutil.Process], grace: float = 20.0) -> list[str]:
    """Wait up to ``grace`` seconds for ``procs`` to exit, kill those that have not, and name them.

    ``ray.shutdown()`` ends a cluster's processes, but a worker has outlived its raylet before (a
    ``ray::TrainController`` of test_train_job's first run, reparented to init, 0.5 GB, alive after the suite):
    such a process would hold memory and cores for every later module and outlive CI."""
    _, alive = psutil.wait_procs(procs, timeout=grace)
    named = []
    for p in alive:
        try:
            named.append(f"{p.name()} (pid {p.pid})")
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
    return named


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")

    os.environ["RAY_AUTH_MODE"] = "disabled"
    from ray_jobs.runtime import parquet_reader

    parquet_reader()  # the jobs' Parquet reader (V1), set before the workers start so that they inherit it
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # 4 logical CPUs on 2 cores: avoids the read-task deadlocks listed in RAY_NOTES.
    ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False)
    yield ray
    procs = _ray_processes(before, os.path.dirname(ray.__file__) + os.sep)
    ray.shutdown()
    left = _stop_leftovers(procs)
    if left:  # killed, so that later modules run on a clean machine; named, so that a leak is seen, not hidden
        warnings.warn(f"the module's Ray cluster left processes alive after ray.shutdown(), killed: {', '.join(left)}",
                      stacklevel=1)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def free_port():
    """A function that returns a free TCP port on 127.0.0.1."""
    return _free_port


S3_BUCKET = "ctrlgen-test"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 (a real HTTP server speaking the S3 API, not a mock in
    this process), with one bucket. Yields the environment variables that point boto3,
    pyarrow's S3 file system and every Ray worker started with them at it."""
    port = _free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(env["AWS_ENDPOINT_URL"], timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start (see {log.name})") from None
                time.sleep(0.2)
        os.environ.update(env)  # this process' pyarrow and boto3 too
        import boto3

        boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
