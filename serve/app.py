"""``build_app(args)``: the application a Serve config file names (``import_path: serve.app:build_app``).

``args`` (the config file's ``args:``)::

    config: configs/demo.yaml          # a ctrlgen config (model, generation, extraction, serve sections)
    overrides: ["serve.contexts=..."]  # key.sub=value overrides, as on the command line
    config_json: "{...}"               # or: a whole resolved config (`ctrlgen serve --write-deploy`)

The graph: ``Api`` (ingress) -> ``Generator``, ``Extractor``, ``Scorer`` -> ``ScorerShard0..n-1``, and
``ScoreLimiter`` (one replica: the /v1/score rate per token for the whole service).
Paths in the config should be absolute when the app is deployed on a cluster (replicas do not
share the deployer's working directory); ``ctrlgen serve`` makes them so. The extraction models' digests are taken
where the app is built: an ``Extractor`` replica on a node holding other models refuses to start
(:func:`ctrlgen.extract.shipping.check_models`).
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from ctrlgen.config import CtrlgenConfig, apply_overrides, load_config
from ctrlgen.extract.shipping import model_digests
from serve.api import Api
from serve.deployments import Extractor, Generator, ScoreLimiter, Scorer, ScorerShard, contexts_path, references_path

__all__ = ["build_app", "shard_name"]


def shard_name(i: int) -> str:
    """Deployment name of reference shard ``i`` (Serve config files refer to it)."""
    return f"ScorerShard{i}"


def build_app(args: dict[str, Any]) -> Application:
    """The service graph from a ctrlgen config file and overrides."""
    unknown = set(args) - {"config", "overrides", "config_json"}
    if unknown:
        raise ValueError(f"unknown application args {sorted(unknown)} (expected: config, overrides or config_json)")
    if args.get("config_json"):  # a resolved config (`ctrlgen serve --write-deploy`): nothing to read on this node
        cfg = CtrlgenConfig.model_validate_json(args["config_json"])
        cfg = CtrlgenConfig.model_validate(
            apply_overrides(cfg.model_dump(mode="json"), list(args.get("overrides") or []))
        )
    else:
        cfg = load_config(args.get("config"), list(args.get("overrides") or []))
    contexts_path(cfg), references_path(cfg)  # fail at build time, with the config's own message
    cfg_json = cfg.model_dump_json()
    # the digests of the extraction models here: a replica whose node holds others refuses to start
    models = model_digests(cfg.extraction.model_copy(update={"setting": "unknown"}))
    n = cfg.serve.scorer_shards
    shards = [ScorerShard.options(name=shard_name(i)).bind(cfg_json, i, n) for i in range(n)]
    limiter = ScoreLimiter.bind(cfg.serve.score_rate_texts, cfg.serve.score_rate_window_s)
    return Api.bind(cfg_json, Generator.bind(cfg_json), Extractor.bind(cfg_json, models), Scorer.bind(shards), limiter)
