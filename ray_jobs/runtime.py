"""How a ctrlgen process reaches Ray: one place for the jobs, the service and ``ctrlgen submit``.

``ray.address`` (config) decides:

* unset (the default): join the cluster this process runs in when there is one (a job
  submitted with ``ctrlgen submit`` / ``ray job submit`` has ``RAY_ADDRESS`` set by Ray's job
  supervisor), else start a private local cluster for this process;
* ``local``: always a private local cluster;
* ``auto``, ``host:port`` or ``ray://host:port``: join that cluster.

Parquet is read with Ray Data's V1 reader (:func:`parquet_reader`): Ray 2.60's default V2 reader starts a
pool of ``FooterReader`` actors (new worker processes) for every ``read_parquet`` to read the files'
footers, several seconds before the first row even for a one-file table (``benchmarks/parquet_reader.py``);
the jobs read few, large files. ``RAY_DATA_USE_DATASOURCE_V2=1`` in the environment keeps V2.
"""

from __future__ import annotations

import os
from typing import Any

from ctrlgen.config import CtrlgenConfig

__all__ = ["init_ray", "parquet_reader", "quiet_cleaner_without_dashboard", "resolve_address"]

_V2_ENV = "RAY_DATA_USE_DATASOURCE_V2"


def resolve_address(address: str | None, environ: dict[str, str] | None = None) -> str:
    """``local`` (start a private cluster) or the address to join, from the config and the environment."""
    env = os.environ if environ is None else environ
    if address is None:
        return "auto" if env.get("RAY_ADDRESS") else "local"
    return address


# Ray Train's placement-group cleaner asks the State API (served by the dashboard) every second whether the
# train controller is alive, and warns on every failure: without a dashboard, one line a second per training.
_PG_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_cleaner_without_dashboard() -> None:
    """Worker set-up hook of a private cluster started without the dashboard: the cleaner's
    State-API warnings (it cannot reach the API there) become errors-only; nothing else changes."""
    import logging

    logging.getLogger(_PG_CLEANER_LOGGER).setLevel(logging.ERROR)


def parquet_reader() -> str:
    """Make this process's Ray Data read Parquet with the V1 reader unless ``RAY_DATA_USE_DATASOURCE_V2`` is set
    (then that choice stands); sets the variable's default for the worker processes of a cluster started after.
    Returns ``v1`` or ``v2``, the reader now in effect."""
    import ray.data

    chosen = os.environ.get(_V2_ENV)
    v2 = chosen is not None and chosen.strip().lower() in ("1", "true", "yes")
    if chosen is None:
        os.environ[_V2_ENV] = "0"  # inherited by a local cluster's raylet and its workers
    ray.data.DataContext.get_current().use_datasource_v2 = v2
    return "v2" if v2 else "v1"


def init_ray(cfg: CtrlgenConfig, **kwargs: Any) -> str:
    """Join the configured cluster or start a private local one (no-op when Ray is already up); Parquet is
    read with the reader :func:`parquet_reader` chooses.

    Returns the address resolved (``local`` for a private cluster).
    """
    import ray

    address = resolve_address(cfg.ray.address)
    parquet_reader()
    if ray.is_initialized():
        return address
    if address == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private cluster of this process only
        cpus = cfg.ray.num_cpus or (os.cpu_count() or 2) + 2
        kwargs.setdefault("log_to_driver", True)
        if not cfg.ray.include_dashboard:
            env = dict(kwargs.pop("runtime_env", None) or {})
            env.setdefault("worker_process_setup_hook", "ray_jobs.runtime.quiet_cleaner_without_dashboard")
            kwargs["runtime_env"] = env
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=cfg.ray.include_dashboard,
            configure_logging=False,
            **kwargs,
        )
    else:
        ray.init(address=address, **kwargs)
    return address
