"""HTTP ingress (FastAPI through ``@serve.ingress``): versioned routes, limits, auth, JSON errors.

Routes: ``POST /v1/synthesize``, ``POST /v1/extract``, ``POST /v1/score``, ``GET /v1/adapters``,
``POST /v1/completions`` and ``GET /v1/models`` (OpenAI-compatible text completion with the base model, for the
LLM anonymiser and OpenAI clients: ``n``, ``temperature``, ``top_p``, ``seed``, ``stop`` per request, ``stream``
as server-sent events), ``GET /healthz`` (no auth), OpenAPI at ``/docs`` and ``/openapi.json``.

* **Auth**: ``Authorization: Bearer <token>`` on every route but ``/healthz`` (and on ``/docs``,
  ``/openapi.json`` unless ``serve.docs_need_token`` is off). Two tokens, one per scope, read at
  replica start (``serve.token_file`` / ``serve.token_env`` for ``release``, ``serve.audit_token_file`` /
  ``serve.audit_token_env`` for ``audit``) and compared in constant time (``hmac.compare_digest``).
  ``release``: ``/v1/synthesize`` in the gated modes only, answers without real document ids;
  ``audit``: every route. No release token: the replica refuses to start; no audit token: no token
  has the audit scope.
* **Errors** are JSON ``{"error": ..., "request_id": ...}``: 401 no/bad token, 403 a route or mode
  outside the token's scope, 404 unknown adapter (with the known ones), 413 body over
  ``serve.max_body_bytes`` (a chunked body is refused as soon as it passes the limit), 422 malformed
  input (validation messages, never the input itself), 429 ``/v1/score`` over its per-token rate
  (``Retry-After``), 503 queue full or replica lost (``retryable: true``, ``Retry-After``), 504 not
  answered within ``serve.request_timeout_s``.
* **Logs** carry request ids, sizes and timings only: never a request body or a generated text.
"""

# No `from __future__ import annotations` here: the ingress class travels to its replica pickled by
# value, and FastAPI must see the route annotations (SynthesizeIn, Request) as objects, not strings.
import asyncio
import hashlib
import hmac
import logging
import math
import os
import secrets
import time
import uuid
from collections.abc import Collection, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from ctrlgen.config import CtrlgenConfig
from serve.metrics import metrics

__all__ = [
    "RELEASE_MODES",
    "SCOPES",
    "Api",
    "CompletionIn",
    "ExtractIn",
    "RateLimiter",
    "ScoreIn",
    "SynthesizeIn",
    "app",
    "read_tokens",
    "release_mode_error",
    "scope_of",
    "token_digest",
]

logger = logging.getLogger("ray.serve")

Mode = Literal["baseline", "icl", "icl_blocking", "prefix"]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SynthesizeIn(_In):
    """A request for synthetic notes."""

    mode: Mode | None = Field(None, description="Generation mode (default: the server's serve.default_mode).")
    control_code: str | None = Field(
        None,
        min_length=1,
        description="Fictional control code to generate from, one 'CATEGORY: value, value' line per category. "
        "None: a code is drawn from the corpus' shapes and fictionalised.",
    )
    n: int = Field(1, ge=1, description="Outputs to generate (at most serve.max_outputs).")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Seeds everything; None: drawn and returned.")
    max_new_tokens: int | None = Field(None, ge=1, description="New tokens per output; capped by the server.")
    adapter: str | None = Field(None, description="Prefix adapter for mode=prefix (GET /v1/adapters lists them).")


class EntityIn(_In):
    start: int = Field(ge=0)
    end: int = Field(ge=1)
    category: Literal["PERSON", "CODE", "LOC", "ORG", "DEM", "DATETIME", "QUANTITY", "MISC"]
    kind: Literal["DIRECT", "QUASI"] = "DIRECT"


class DocumentIn(_In):
    id: str | None = Field(None, max_length=200, description="Your id for the document (echoed back).")
    text: str
    entities: list[EntityIn] | None = Field(
        None, description="Known private spans (known setting); None: the server's unknown-setting engine finds them."
    )


class ExtractIn(_In):
    documents: list[DocumentIn] = Field(min_length=1)


class ScoreIn(_In):
    texts: list[str] = Field(min_length=1)
    closest_reference: bool = Field(
        False,
        description="Also answer, per text, its ROUGE-2/L maxima and the ids of the reference documents they "
        "come from (audit scope).",
    )


class CompletionIn(BaseModel):
    """An OpenAI-style completion request (``POST /v1/completions``); unknown OpenAI fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="Accepted for compatibility; the service has one base model.")
    prompt: str | list[str] = Field(description="A prompt, or a list of prompts (n choices each).")
    max_tokens: int | None = Field(None, ge=1, description="New tokens per choice; capped by the server.")
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature (0: greedy); default the server's."
    )
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus mass; default the server's.")
    seed: int | None = Field(
        None, ge=0, le=2**63 - 1, description="Seeds sampling (each choice: a seed derived from it)."
    )
    stop: str | list[str] | None = Field(None, description="Up to 4 stop strings (cut before them).")
    n: int = Field(1, ge=1, le=8, description="Choices per prompt (at most 8).")
    stream: bool = Field(
        False,
        description="Answer as server-sent events in OpenAI's chunk format: one chunk per choice once it is "
        "generated (whole texts, not token by token), then [DONE].",
    )


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


SCOPES = ("release", "audit")
RELEASE_MODES = ("icl_blocking", "prefix")  # the modes a release token may ask for, when the server gates them


def _read_one(file: str | None, env: str, key: str) -> tuple[str, str]:
    if file:
        path = Path(file)
        if not path.is_file():
            raise RuntimeError(f"serve.{key} {path} does not exist")
        return path.read_text(encoding="utf-8").strip(), str(path)
    return os.environ.get(env, "").strip(), f"${env}"


def token_digest(token: str) -> str:
    """What a replica keeps of a token: its SHA-256 (hex). A random token of 16+ characters cannot be
    recovered from it, so the digest may travel in a Serve config to replicas on any node."""
    return hashlib.sha256(token.strip().encode()).hexdigest()


def read_tokens(cfg: CtrlgenConfig) -> dict[str, str]:
    """{scope: SHA-256 digest of its token}: release from ``serve.token_sha256``, else ``serve.token_file`` /
    ``$serve.token_env`` (required), audit likewise from ``serve.audit_token_sha256`` / ``serve.audit_token_file``
    / ``$serve.audit_token_env`` (absent: no token has the audit scope)."""
    sv = cfg.serve
    digests = {}
    for scope, digest, file, env, key in (
        ("release", sv.token_sha256, sv.token_file, sv.token_env, "token_file"),
        ("audit", sv.audit_token_sha256, sv.audit_token_file, sv.audit_token_env, "audit_token_file"),
    ):
        if digest:
            digests[scope] = digest
            continue
        token, where = _read_one(file, env, key)
        if not token and scope == "audit":
            continue
        if len(token) < 16:
            raise RuntimeError(
                f"no {scope} bearer token of at least 16 characters in {where}: the service does not run without auth"
            )
        digests[scope] = token_digest(token)
    if digests.get("audit") == digests["release"]:
        raise RuntimeError("the release and audit tokens are the same: give each scope its own token")
    return digests


def scope_of(header: str, digests: Mapping[str, str]) -> str | None:
    """The scope of an ``Authorization: Bearer <token>`` header, None when it names no configured token.

    ``digests``: {scope: SHA-256 hex of its token}. The given token's digest is compared with every
    configured one (constant time each), whichever matches.
    """
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    given_d = token_digest(given).encode()
    found = None
    for scope, digest in digests.items():
        if digest and hmac.compare_digest(given_d, digest.encode()):
            found = scope
    return found


def release_mode_error(mode: str, gated: Collection[str]) -> str | None:
    """Why a release-scope token may not synthesize in ``mode`` (None: it may). ``gated``: the modes whose
    outputs this server passes through the release gate (``generation.gate``)."""
    if mode not in RELEASE_MODES:
        return (
            f"mode {mode} is not gated: a release-scope token may ask for {' or '.join(RELEASE_MODES)} only "
            "(the ungated modes need an audit-scope token)"
        )
    if mode not in gated:
        return f"mode {mode} is not gated on this server (generation.gate): a release-scope token may not use it"
    return None


class RateLimiter:
    """A token bucket per key: ``capacity`` units, refilled at ``capacity / window_s`` units per second."""

    def __init__(self, capacity: int, window_s: float) -> None:
        self.capacity, self.rate = float(capacity), capacity / window_s
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (units left, when)

    def take(self, key: str, cost: int, now: float | None = None) -> float:
        """Take ``cost`` units for ``key``: 0.0 when taken, else the seconds until they would be (nothing taken)."""
        if cost > self.capacity:
            raise ValueError(f"a cost of {cost} is over the bucket's capacity of {self.capacity:g}")
        now = time.monotonic() if now is None else now
        left, when = self._buckets.get(key, (self.capacity, now))
        left = min(self.capacity, left + (now - when) * self.rate)
        if left >= cost:
            self._buckets[key] = (left - cost, now)
            return 0.0
        self._buckets[key] = (left, now)
        return (cost - left) / self.rate


app = FastAPI(
    title="ctrlgen synthesis service",
    version="1",
    description="Privacy-preserving synthetic clinical text by controlled generation: synthesis with hard "
    "token blocking and a release gate, entity extraction, leakage scoring. Every route but /healthz "
    "needs `Authorization: Bearer <token>`: a release-scope token may synthesize in the gated modes, an "
    "audit-scope token may use every route (docs/serving.md).",
)


def _error(status: int, message: str, request_id: str, **extra: Any) -> JSONResponse:
    headers = {"X-Request-Id": request_id}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if extra.get("retryable"):
        headers["Retry-After"] = str(extra.get("retry_after_s", 1))
    return JSONResponse({"error": message, "request_id": request_id, **extra}, status_code=status, headers=headers)


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events as OpenAI streams them: one ``data: <json>`` event per chunk, then ``data: [DONE]``."""
    import json

    async def events() -> Any:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _rid(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = request.state.request_id = uuid.uuid4().hex[:16]
    return str(rid)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Messages and locations only: pydantic's "input" field would echo request content.
    detail = [{"loc": ".".join(str(x) for x in e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
    return _error(422, "malformed request", _rid(request), detail=detail)


@app.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _error(exc.status, exc.message, _rid(request), **exc.extra)


def _route_name(path: str) -> str:
    known = {"/v1/synthesize", "/v1/extract", "/v1/score", "/v1/completions", "/v1/models", "/v1/adapters",
             "/healthz", *_DOCS}  # fmt: skip
    return path if path in known else "other"  # a fixed set: metric tags never carry what a client typed


_DOCS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


async def _read_body(request: Request, limit: int) -> tuple[bytes | None, int]:
    """(body, bytes read), read chunk by chunk; body None as soon as more than ``limit`` bytes arrived
    (the rest is never read: a chunked body without Content-Length cannot make the replica hold it)."""
    chunks, size = [], 0
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                return None, size
            chunks.append(chunk)
    return b"".join(chunks), size


@app.middleware("http")
async def _frame(request: Request, call_next: Any) -> Any:
    """Request id, token on the docs, body-size limit, metrics and one PHI-free log line per request."""
    rid = _rid(request)
    t0 = time.perf_counter()
    route = _route_name(request.url.path)
    limit = _limits.get("max_body_bytes", 1_048_576)
    size = int(request.headers.get("content-length") or 0)
    if route in _DOCS and _limits.get("docs_need_token", 1) and not _scope(request):
        response = _error(401, "missing or invalid bearer token (send 'Authorization: Bearer <token>')", rid)
    elif size > limit:
        response = _error(413, f"request body of {size} bytes is over the limit of {limit}", rid)
    else:
        body, size = await _read_body(request, limit)
        if body is None:
            response = _error(413, f"request body is over the limit of {limit} bytes", rid)
        else:
            request._body = body  # what Request.body() caches: the routes read it from here
            try:
                response = await call_next(request)
            except Exception as exc:  # the message may quote content: log the type only
                logger.error("request %s %s failed: %s", rid, route, type(exc).__name__)
                response = _error(500, "internal error", rid)
    response.headers["X-Request-Id"] = rid
    seconds = time.perf_counter() - t0
    m = metrics()
    m.requests.inc(tags={"route": route, "status": str(response.status_code)})
    m.latency.observe(seconds, tags={"route": route})
    logger.info("request %s %s -> %d, %d bytes in, %.3f s", rid, route, response.status_code, size, seconds)
    return response


# Per-process state of the routes, set by the replica's constructor through _configure. The class is
# pickled by value (its functions carry copies of the globals they name), while module-level functions
# travel by reference: state is therefore written by a module-level function, never by the class itself.
_limits: dict[str, int] = {}
_tokens: dict[str, str] = {}


def _configure(tokens: Mapping[str, str], max_body_bytes: int, docs_need_token: bool) -> None:
    _tokens.clear()
    _tokens.update(tokens)
    _limits["max_body_bytes"] = max_body_bytes
    _limits["docs_need_token"] = int(docs_need_token)


def _scope(request: Request) -> str | None:
    return scope_of(request.headers.get("authorization", ""), _tokens)


async def _auth(request: Request) -> None:
    """Any scope; the scope goes to ``request.state.scope``."""
    scope = _scope(request)
    if scope is None:
        raise ApiError(401, "missing or invalid bearer token (send 'Authorization: Bearer <token>')")
    request.state.scope = scope


async def _audit(request: Request) -> None:
    """The audit scope only."""
    await _auth(request)
    if request.state.scope != "audit":
        raise ApiError(
            403, f"{_route_name(request.url.path)} needs an audit-scope token (this one has the "
            f"{request.state.scope} scope)"
        )  # fmt: skip


def _released_view(o: dict[str, Any]) -> dict[str, Any]:
    """An output as a release-scope token sees it: no real document ids, no gate counts."""
    view = {k: v for k, v in o.items() if k not in ("context_ids", "template_id", "attempts")}
    if not o["released"]:  # no detail: a failure's detail counts the prompt's tokens, the real contexts' size
        failed = str(o.get("withheld_reason", "")).startswith("generation failed")
        view["withheld_reason"] = "generation failed" if failed else "withheld by the release gate"
    return view


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the ingress answers (no auth, no model call)."""
    return {"status": "ok"}


@serve.deployment(name="Api", max_ongoing_requests=64)
@serve.ingress(app)
class Api:
    """The ingress: checks, auth, limits and error mapping around the model-side deployments."""

    def __init__(self, cfg_json: str, generator: Any, extractor: Any, scorer: Any, limiter: Any = None) -> None:
        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        self.cfg = cfg.serve
        self.default_max_new_tokens = cfg.generation.sampling.max_new_tokens
        gate = cfg.generation.gate
        self.gated = frozenset(gate.modes if gate.enabled else ())
        # Per token (one per scope), for the whole service: the ScoreLimiter deployment (one replica) holds the
        # buckets; without one (an app built by hand), a bucket per ingress replica.
        self.limiter = limiter
        self.score_limiter = RateLimiter(cfg.serve.score_rate_texts, cfg.serve.score_rate_window_s)
        _configure(read_tokens(cfg), cfg.serve.max_body_bytes, cfg.serve.docs_need_token)
        self.generator, self.extractor, self.scorer = generator, extractor, scorer
        self.adapter_names = sorted(cfg.serve.adapters)
        self.model_name = cfg.model.name
        self.started = int(time.time())

    async def _call(self, response: Any, what: str) -> Any:
        """Await a handle call with the request timeout; map Serve's failures onto 503 / 504."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError

        try:
            return await asyncio.wait_for(response, timeout=self.cfg.request_timeout_s)
        except TimeoutError:
            response.cancel()
            raise ApiError(504, f"{what} was not answered within {self.cfg.request_timeout_s:g} s") from None
        except BackPressureError:
            raise ApiError(503, f"{what}: the service is at capacity; retry later", retryable=True) from None
        except (
            ActorDiedError,
            ActorUnavailableError,
            RayActorError,
            DeploymentUnavailableError,
            RequestCancelledError,
        ):
            raise ApiError(
                503, f"{what}: a replica was lost while serving the request; retry", retryable=True
            ) from None

    @app.get("/v1/adapters", dependencies=[Depends(_auth)])
    async def adapters(self) -> dict[str, Any]:
        """The prefix adapters this service loaded (names for ``adapter`` with mode=prefix)."""
        return {"adapters": self.adapter_names}

    @app.post("/v1/synthesize", dependencies=[Depends(_auth)])
    async def synthesize(self, body: SynthesizeIn, request: Request) -> dict[str, Any]:
        """Synthetic notes from a (fictional) control code, through the release gate."""
        t0 = time.perf_counter()
        mode = body.mode or self.cfg.default_mode
        release = request.state.scope != "audit"
        if release and (why := release_mode_error(mode, self.gated)):
            raise ApiError(403, why)
        if body.n > self.cfg.max_outputs:
            raise ApiError(422, f"n={body.n} is over the server's limit of {self.cfg.max_outputs} outputs")
        if body.control_code is not None and len(body.control_code) > self.cfg.max_code_chars:
            raise ApiError(422, f"control_code has {len(body.control_code)} characters, over {self.cfg.max_code_chars}")
        if body.control_code is not None:
            from ctrlgen.codes import parse_control_code

            if not parse_control_code(body.control_code):
                raise ApiError(
                    422, "control_code holds no 'CATEGORY: value' line with a known category "
                    "(PERSON, CODE, LOC, ORG, DEM, DATETIME, QUANTITY, MISC)"
                )  # fmt: skip
        adapter = body.adapter
        if mode == "prefix":
            if adapter is None and len(self.adapter_names) == 1:
                adapter = self.adapter_names[0]
            if adapter not in self.adapter_names:
                raise ApiError(
                    404 if adapter else 422,
                    f"unknown adapter {adapter!r}" if adapter else "mode=prefix needs an adapter",
                    known_adapters=self.adapter_names,
                )
        elif adapter is not None:
            raise ApiError(422, f"adapter is only used with mode=prefix (mode is {mode})")
        seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
        max_new = min(body.max_new_tokens or self.default_max_new_tokens, self.cfg.max_new_tokens)
        req = {"mode": mode, "n": body.n, "seed": seed, "control_code": body.control_code,
               "max_new_tokens": max_new, "adapter": adapter}  # fmt: skip
        out = await self._call(self.generator.synthesize.remote(req), "synthesis")
        rid = _rid(request)
        logger.info(
            "synthesize %s: mode %s, %d outputs (%d withheld, %d regenerated), %d new tokens, %.2f s",
            rid, mode, len(out["outputs"]), out["withheld"], out["regenerated"],
            sum(o["new_tokens"] for o in out["outputs"]), time.perf_counter() - t0,
        )  # fmt: skip
        if release:  # no real document ids, and no count of the gate's findings
            out = {k: v for k, v in out.items() if k != "regenerated"}
            out["outputs"] = [_released_view(o) for o in out["outputs"]]
        return {"id": rid, "seed": seed, "max_new_tokens": max_new, **out, "seconds": time.perf_counter() - t0}

    def _texts_ok(self, texts: list[str], what: str) -> None:
        if len(texts) > self.cfg.max_texts:
            raise ApiError(422, f"{len(texts)} {what} sent; the limit is {self.cfg.max_texts}")
        for i, t in enumerate(texts):
            if len(t) > self.cfg.max_text_chars:
                raise ApiError(413, f"{what}[{i}] has {len(t)} characters, over the limit of {self.cfg.max_text_chars}")

    @app.post("/v1/extract", dependencies=[Depends(_audit)])
    async def extract(self, body: ExtractIn, request: Request) -> dict[str, Any]:
        """Entities and control code of each document (known spans as sent, else found by the engine)."""
        self._texts_ok([d.text for d in body.documents], "documents")
        rid = _rid(request)
        rows = []
        for i, d in enumerate(body.documents):
            ents = None
            if d.entities is not None:
                ents = []
                for j, e in enumerate(d.entities):
                    if not e.start < e.end <= len(d.text):
                        raise ApiError(
                            422, f"documents[{i}].entities[{j}]: span [{e.start}, {e.end}) is outside the text "
                            f"(length {len(d.text)}) or empty"
                        )  # fmt: skip
                    ents.append({"start": e.start, "end": e.end, "text": d.text[e.start : e.end],
                                 "category": e.category, "kind": e.kind, "source": "request", "label": ""})  # fmt: skip
            rows.append({"doc_id": f"{rid}/{i}", "text": d.text, "entities": ents})
        found = await self._call(self.extractor.extract.remote(rows), "extraction")
        docs = []
        for d, row in zip(body.documents, found, strict=True):
            item: dict[str, Any] = {"id": d.id, "status": row["status"]}
            if row["status"] == "ok":
                item["control_code"] = row["control_code"]
                item["entities"] = [{k: e[k] for k in ("start", "end", "text", "category", "kind", "source")}
                                    for e in row["entities"]]  # fmt: skip
            else:
                item["reason"] = row["reason"]
            docs.append(item)
        return {"id": rid, "documents": docs}

    @app.post("/v1/score", dependencies=[Depends(_audit)])
    async def score(self, body: ScoreIn, request: Request) -> dict[str, Any]:
        """PIPP / ELP (fine-tuning definitions) and mean ROUGE-2/L maxima against the reference corpus.

        Per text: how many corpus values it contains; with ``closest_reference``, also its best ROUGE
        scores and the reference documents they come from. Audit scope, rate-limited per token.
        """
        self._texts_ok(body.texts, "texts")
        scope, cost = request.state.scope, len(body.texts)
        if self.limiter is not None:
            wait = await self._call(self.limiter.take.remote(scope, cost), "rate limiting")
        else:
            wait = self.score_limiter.take(scope, cost)
        if wait > 0:
            raise ApiError(
                429, f"over the rate limit of {self.cfg.score_rate_texts} texts per "
                f"{self.cfg.score_rate_window_s:g} s for this token; retry later",
                retryable=True, retry_after_s=math.ceil(wait),
            )  # fmt: skip
        out = await self._call(self.scorer.score.remote(body.texts), "scoring")
        if not body.closest_reference:
            out["texts"] = [{"leaked_values": t["leaked_values"]} for t in out["texts"]]
        return {"id": _rid(request), **out}

    @app.post("/v1/completions", dependencies=[Depends(_audit)])
    async def completions(self, body: CompletionIn, request: Request) -> Any:  # a dict, or the event stream
        """OpenAI-compatible completions from the base model (no control codes, no release gate): the
        endpoint ``anonymizer.endpoint`` and other OpenAI clients can use. Batched with the other outputs."""
        t0 = time.perf_counter()
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise ApiError(422, "prompt is an empty list")
        self._texts_ok(prompts, "prompts")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > 4:
            raise ApiError(422, f"{len(stop)} stop strings sent; at most 4")
        seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
        max_new = min(body.max_tokens or self.default_max_new_tokens, self.cfg.max_new_tokens)
        if len(prompts) * body.n > 64:
            raise ApiError(422, f"{len(prompts)} prompts x n={body.n} is over 64 choices a request")
        req = {"prompts": prompts, "seed": seed, "max_new_tokens": max_new, "stop": stop, "n": body.n,
               "temperature": body.temperature, "top_p": body.top_p}  # fmt: skip
        out = await self._call(self.generator.complete.remote(req), "completion")
        rid = _rid(request)
        failed = [(i, c["error"]) for i, c in enumerate(out["choices"]) if c.get("error")]
        if failed:  # engine errors name sizes only (e.g. a prompt over the model's positions)
            raise ApiError(422, f"prompt[{failed[0][0]}]: {failed[0][1]}")
        logger.info("completions %s: %d prompts x %d, %d new tokens, %.2f s", rid, len(prompts), body.n,
                    out["completion_tokens"], time.perf_counter() - t0)  # fmt: skip
        choices = [
            {"index": i, "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None}
            for i, c in enumerate(out["choices"])
        ]
        usage = {
            "prompt_tokens": out["prompt_tokens"],
            "completion_tokens": out["completion_tokens"],
            "total_tokens": out["prompt_tokens"] + out["completion_tokens"],
        }
        head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                "model": body.model or out["model"]}  # fmt: skip
        if body.stream:
            return _sse([{**head, "choices": [c]} for c in choices] + [{**head, "choices": [], "usage": usage}])
        return {**head, "choices": choices, "usage": usage}

    @app.get("/v1/models", dependencies=[Depends(_audit)])
    async def models(self) -> dict[str, Any]:
        """OpenAI's model list (clients call it first): the one base model ``/v1/completions`` serves."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.started,
                                            "owned_by": "ctrlgen"}]}  # fmt: skip
