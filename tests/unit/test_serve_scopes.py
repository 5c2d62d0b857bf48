"""The pure parts of the service's scoped tokens: which token has which scope, what a release token may
synthesize, the /v1/score rate limiter, and where the tokens come from (the HTTP side: test_serve.py)."""

import os
from pathlib import Path

import pytest

from ctrlgen.config import load_config
from ctrlgen.errors import ConfigError, CtrlgenError
from serve.api import RateLimiter, read_tokens, release_mode_error, scope_of, token_digest
from serve.launch import app_args, ensure_tokens

TOKENS = {"release": token_digest("r" * 32), "audit": token_digest("a" * 32)}  # what a replica holds


def test_scope_of_names_the_matching_token_and_nothing_else():
    assert scope_of("Bearer " + "r" * 32, TOKENS) == "release"
    assert scope_of("bearer " + "a" * 32 + " ", TOKENS) == "audit"
    for header in ("", "Bearer", "Bearer ", "Basic " + "a" * 32, "Bearer " + "a" * 31, "Bearer " + "a" * 33):
        assert scope_of(header, TOKENS) is None, header
    assert scope_of("Bearer ", {"release": TOKENS["release"], "audit": ""}) is None  # an empty token never matches


@pytest.mark.parametrize("mode", ["baseline", "icl"])
def test_release_scope_never_gets_an_ungated_mode(mode):
    why = release_mode_error(mode, {"baseline", "icl", "icl_blocking", "prefix"})  # even if the server gated them
    assert why and f"mode {mode}" in why and "audit" in why


def test_release_scope_gets_a_gated_mode_only_when_the_server_gates_it():
    assert release_mode_error("icl_blocking", {"icl_blocking"}) is None
    assert release_mode_error("prefix", {"icl_blocking", "prefix"}) is None
    why = release_mode_error("prefix", {"icl_blocking"})
    assert why and "not gated on this server" in why
    assert release_mode_error("icl_blocking", set()) is not None  # gate disabled


def test_rate_limiter_is_a_token_bucket_per_key():
    lim = RateLimiter(10, 10.0)  # 10 units, 1 per second
    assert lim.take("a", 6, now=0.0) == 0.0
    assert lim.take("a", 6, now=0.0) == pytest.approx(2.0)  # 4 left: 2 s until 6
    assert lim.take("b", 10, now=0.0) == 0.0  # another token has its own bucket
    assert lim.take("a", 6, now=2.0) == 0.0  # refilled to 6
    assert lim.take("a", 1, now=2.5) == pytest.approx(0.5)  # empty at 2.0: half a unit by 2.5
    assert lim.take("a", 1, now=3.0) == 0.0
    assert lim.take("a", 10, now=1000.0) == 0.0  # never more than the capacity
    assert lim.take("a", 1, now=1000.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="capacity"):
        lim.take("a", 11, now=2000.0)


def test_a_score_request_of_max_texts_must_fit_the_rate():
    with pytest.raises(ConfigError, match="score_rate_texts"):
        load_config(None, ["serve.max_texts=64", "serve.score_rate_texts=32"])


def _cfg(**serve):
    return load_config(None, [f"serve.{k}={v}" for k, v in serve.items()])


def test_replica_reads_one_token_per_scope_and_audit_may_be_absent(tmp_path, monkeypatch):
    (tmp_path / "r").write_text("release-token-0123456789\n")
    (tmp_path / "a").write_text("audit-token-0123456789\n")
    cfg = _cfg(token_file=tmp_path / "r", audit_token_file=tmp_path / "a")
    assert read_tokens(cfg) == {"release": token_digest("release-token-0123456789"),
                                "audit": token_digest("audit-token-0123456789")}  # fmt: skip
    monkeypatch.setenv("X_RELEASE", "release-from-env-0123")
    monkeypatch.delenv("X_AUDIT", raising=False)
    assert read_tokens(_cfg(token_env="X_RELEASE", audit_token_env="X_AUDIT")) == {
        "release": token_digest("release-from-env-0123")
    }
    monkeypatch.setenv("X_AUDIT", "release-from-env-0123")
    with pytest.raises(RuntimeError, match="same"):
        read_tokens(_cfg(token_env="X_RELEASE", audit_token_env="X_AUDIT"))
    monkeypatch.setenv("X_AUDIT", "short")
    with pytest.raises(RuntimeError, match="audit bearer token of at least 16"):
        read_tokens(_cfg(token_env="X_RELEASE", audit_token_env="X_AUDIT"))
    monkeypatch.delenv("X_RELEASE")
    with pytest.raises(RuntimeError, match="release bearer token"):
        read_tokens(_cfg(token_env="X_RELEASE", audit_token_env="X_AUDIT"))


def test_serve_writes_two_distinct_private_tokens_and_reuses_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CTRLGEN_SERVE_TOKEN", raising=False)
    monkeypatch.delenv("CTRLGEN_SERVE_AUDIT_TOKEN", raising=False)
    cfg = load_config(None, [])
    first = ensure_tokens(cfg)
    assert set(first) == {"release", "audit"} and first["release"][0] != first["audit"][0]
    for token, file in first.values():
        assert len(token) >= 32 and (tmp_path / "cache").resolve() in Path(file).parents
        assert os.stat(file).st_mode & 0o777 == 0o600
    assert ensure_tokens(cfg) == first  # reused next time
    monkeypatch.setenv("CTRLGEN_SERVE_AUDIT_TOKEN", "audit-from-the-environment-01")
    again = ensure_tokens(cfg)
    assert again["audit"][0] == "audit-from-the-environment-01" and again["release"] == first["release"]
    with pytest.raises(CtrlgenError, match="audit_token_file"):
        ensure_tokens(load_config(None, [f"serve.audit_token_file={tmp_path / 'missing'}"]))


def test_replicas_get_digests_only_and_a_digest_config_needs_no_token_file(tmp_path):
    tokens = {"release": ("r" * 64, str(tmp_path / "r")), "audit": ("a" * 64, str(tmp_path / "a"))}
    args = app_args(None, ["serve.max_texts=8"], tokens)
    text = repr(args)
    assert "r" * 64 not in text and "a" * 64 not in text  # the tokens themselves never travel
    cfg = load_config(None, args["overrides"])
    assert read_tokens(cfg) == {"release": token_digest("r" * 64), "audit": token_digest("a" * 64)}
    assert scope_of("Bearer " + "a" * 64, read_tokens(cfg)) == "audit"
    with pytest.raises(ConfigError, match="token_sha256"):
        load_config(None, ["serve.token_sha256=not-a-digest"])


def test_a_release_token_sees_no_detail_of_a_withheld_output():
    from serve.api import _released_view

    base = {"released": False, "text": None, "context_ids": ["1-1"], "template_id": "t", "attempts": 2}
    failed = _released_view({**base, "withheld_reason": "generation failed: prompt of 812 tokens + 64 new tokens ..."})
    gated = _released_view({**base, "withheld_reason": "still contained 2 known private value(s) after 2 attempt(s)"})
    assert failed["withheld_reason"] == "generation failed"
    assert gated["withheld_reason"] == "withheld by the release gate"
    assert not {"context_ids", "template_id", "attempts"} & (set(failed) | set(gated))


def test_a_replica_method_fails_without_its_exceptions_message():
    """Serve logs a failed request's exception in the replica's log: it must not carry the request's text."""
    import asyncio

    from ray.serve.exceptions import BackPressureError

    from serve.deployments import ReplicaError, content_free_errors

    class Replica:
        @content_free_errors
        async def extract(self, texts):
            raise ValueError(f"cannot tokenise {texts[0]!r}")

        @content_free_errors
        async def busy(self):
            raise BackPressureError(num_queued_requests=3, max_queued_requests=2)

    with pytest.raises(ReplicaError) as info:
        asyncio.run(Replica().extract(["Zelda Quixote"]))
    assert str(info.value) == "ValueError in test_a_replica_method_fails_without_its_exceptions_message.<locals>.Replica.extract"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(BackPressureError):  # Serve's own failures reach the ingress unchanged (-> 503)
        asyncio.run(Replica().busy())
