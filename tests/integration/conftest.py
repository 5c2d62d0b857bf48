"""Integration fixtures: a real local Ray cluster per test module."""

import os

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # 4 logical CPUs on 2 cores: avoids the read-task deadlocks listed in RAY_NOTES.
    ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
