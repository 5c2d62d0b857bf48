"""Start and stop the service from Python: what ``ctrlgen serve``, the demo, the tests and the benchmark use.

:func:`start_service` does what ``serve run configs/serve/<file>.yaml`` does (Serve's own CLI
path: ``serve_start`` with the file's HTTP options, then ``deploy_apps`` with the file
validated as a ``ServeDeploySchema``), after injecting the application args (ctrlgen config
file and overrides) and an optional port. The deployment options of the file (replicas,
autoscaling, queues) apply as written. It waits until the application is RUNNING, printing
one line per change of state, and raises with Serve's own message if the deploy fails.
Ray is pinned to 2.60.0 in pyproject.toml: ``serve_start`` is the call Serve's CLI makes.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ctrlgen.config import CtrlgenConfig, default_cache_dir
from ctrlgen.errors import CtrlgenError
from ray_jobs.runtime import init_ray

__all__ = [
    "Service",
    "app_args",
    "ensure_tokens",
    "http",
    "init_ray",
    "load_serve_config",
    "start_service",
    "stop_service",
]

APP_NAME = "ctrlgen"


@dataclass
class Service:
    """A running service: its URL and one bearer token (and the file holding it) per scope."""

    url: str
    token: str  # release scope: synthesis in the gated modes
    token_file: str
    audit_token: str  # audit scope: every route
    audit_token_file: str
    app: str = APP_NAME


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ensure_one(file: str | None, env_name: str, key: str, cache_name: str) -> tuple[str, str]:
    if file:
        path = Path(file).expanduser().resolve()
        if not path.is_file():
            raise CtrlgenError(f"serve.{key} {path} does not exist")
        return path.read_text(encoding="utf-8").strip(), str(path)
    path = default_cache_dir() / "serve" / cache_name
    env = os.environ.get(env_name, "").strip()
    if env or not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write((env or secrets.token_hex(32)) + "\n")
    return path.read_text(encoding="utf-8").strip(), str(path)


def ensure_tokens(cfg: CtrlgenConfig) -> dict[str, tuple[str, str]]:
    """{scope: (token, file)} for the release and audit scopes.

    Per scope: its file setting (``serve.token_file``, ``serve.audit_token_file``), else its variable
    (``$serve.token_env``, ``$serve.audit_token_env``) written to a file, else a new random token. Files
    written go to ``$CTRLGEN_CACHE/serve/token`` and ``.../audit_token`` (mode 600) and are reused next time.
    """
    sv = cfg.serve
    tokens = {
        "release": _ensure_one(sv.token_file, sv.token_env, "token_file", "token"),
        "audit": _ensure_one(sv.audit_token_file, sv.audit_token_env, "audit_token_file", "audit_token"),
    }
    if tokens["release"][0] == tokens["audit"][0]:
        raise CtrlgenError(
            f"the release token ({tokens['release'][1]}) and the audit token ({tokens['audit'][1]}) are the same: "
            "give each scope its own token"
        )
    return tokens


def app_args(config_file: str | None, overrides: list[str], tokens: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """The application's ``args``: the ctrlgen config and overrides, and the tokens' digests (never the tokens:
    the digests reach replicas on every node through the Serve config, no token file needed there)."""
    from serve.api import token_digest

    return {
        "config": str(Path(config_file).resolve()) if config_file else None,
        "overrides": [
            *overrides,
            f"serve.token_sha256={token_digest(tokens['release'][0])}",
            f"serve.audit_token_sha256={token_digest(tokens['audit'][0])}",
        ],
    }


def load_serve_config(
    path: str | Path,
    app_args: dict[str, Any],
    port: int | None = None,
    host: str | None = None,
    replace_args: bool = False,
) -> Any:
    """A Serve config file with ``args`` injected into its application (and the HTTP port / host given),
    validated by Serve's schema."""
    from ray.serve.schema import ServeDeploySchema

    p = Path(path)
    if not p.is_file():
        raise CtrlgenError(f"Serve config {p} does not exist")
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    apps = data.get("applications") or []
    if len(apps) != 1:
        raise CtrlgenError(f"Serve config {p} must hold exactly one application (found {len(apps)})")
    apps[0]["args"] = dict(app_args) if replace_args else {**(apps[0].get("args") or {}), **app_args}
    if port is not None:
        data.setdefault("http_options", {})["port"] = port
    if host is not None:
        data.setdefault("http_options", {})["host"] = host
    try:
        return ServeDeploySchema.model_validate(data)
    except Exception as exc:  # pydantic's message names the offending keys
        raise CtrlgenError(f"Serve config {p} is not a valid Serve config: {exc}") from None


def start_service(
    cfg: CtrlgenConfig,
    serve_config: str | Path,
    config_file: str | None,
    overrides: list[str],
    *,
    port: int | None = None,
    host: str | None = None,
    timeout_s: float = 600.0,
) -> Service:
    """Deploy the service on the cluster Ray is connected to (started by :func:`init_ray`)."""
    from ray import serve
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions

    tokens = ensure_tokens(cfg)
    schema = load_serve_config(serve_config, app_args(config_file, overrides, tokens), port, host)
    http = schema.http_options
    client = serve_api.serve_start(
        http_options=http.model_dump(),
        proxy_location=schema.proxy_location,
        grpc_options=gRPCOptions(**schema.grpc_options.model_dump()),
    )
    client.deploy_apps(schema, _blocking=False)
    name = schema.applications[0].name
    t0, last = time.monotonic(), ""
    while True:
        status = serve.status().applications.get(name)
        state = str(status.status) if status else "NOT_STARTED"
        deps = status.deployments if status else {}
        line = ", ".join(f"{d} {str(s.status).split('.')[-1]}" for d, s in sorted(deps.items()))
        if f"{state}|{line}" != last:
            _say(f"serve: {state.split('.')[-1]} {f'({line})' if line else ''} after {time.monotonic() - t0:.0f} s")
            last = f"{state}|{line}"
        if state.endswith("RUNNING"):
            break
        if state.endswith("DEPLOY_FAILED") or state.endswith("UNHEALTHY"):
            msg = status.message if status else ""
            raise CtrlgenError(f"the service failed to deploy: {msg}")
        if time.monotonic() - t0 > timeout_s:
            raise CtrlgenError(f"the service was not running after {timeout_s:.0f} s (last state {state})")
        time.sleep(1.0)
    host = "127.0.0.1" if http.host in ("0.0.0.0", "::") else http.host
    return Service(f"http://{host}:{http.port}", *tokens["release"], *tokens["audit"], name)


def stop_service() -> None:
    """Shut Serve down on this cluster (its deployments, proxies and controller)."""
    from ray import serve

    serve.shutdown()


def http(
    method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 120.0
) -> tuple[int, dict[str, Any]]:
    """One JSON request (standard library only): (status, parsed JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return e.code, {"error": raw.decode(errors="replace")[:200]}
