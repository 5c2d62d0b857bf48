"""HTTP ingress (FastAPI through ``@serve.ingress``): versioned routes, limits, auth, JSON errors.

Routes: ``POST /v1/synthesize``, ``POST /v1/extract``, ``POST /v1/score``, ``GET /v1/adapters``,
``POST /v1/completions`` (OpenAI-compatible text completion with the base model, for the LLM
anonymiser and other OpenAI clients), ``GET /healthz`` (no auth), OpenAPI at ``/docs`` and ``/openapi.json``.

* **Auth**: ``Authorization: Bearer <token>`` on every route but ``/healthz``; the token is read
  at replica start from ``serve.token_file`` or the ``serve.token_env`` variable and compared in
  constant time (``hmac.compare_digest``). No token configured: the replica refuses to start.
* **Errors** are JSON ``{"error": ..., "request_id": ...}``: 401 no/bad token, 404 unknown
  adapter (with the known ones), 413 body over ``serve.max_body_bytes``, 422 malformed input
  (validation messages, never the input itself), 503 queue full or replica lost
  (``retryable: true``, ``Retry-After``), 504 not answered within ``serve.request_timeout_s``.
* **Logs** carry request ids, sizes and timings only: never a request body or a generated text.
"""

# No `from __future__ import annotations` here: the ingress class travels to its replica pickled by
# value, and FastAPI must see the route annotations (SynthesizeIn, Request) as objects, not strings.
import asyncio
import hmac
import logging
import os
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from ctrlgen.config import CtrlgenConfig
from serve.metrics import metrics

__all__ = ["Api", "CompletionIn", "ExtractIn", "ScoreIn", "SynthesizeIn", "app", "read_token"]

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


class CompletionIn(BaseModel):
    """An OpenAI-style completion request (``POST /v1/completions``); unknown OpenAI fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="Accepted for compatibility; the service has one base model.")
    prompt: str | list[str] = Field(description="A prompt, or a list of prompts (one choice each).")
    max_tokens: int | None = Field(None, ge=1, description="New tokens per choice; capped by the server.")
    temperature: float | None = Field(None, ge=0, description="Accepted; the server's sampling settings apply.")
    top_p: float | None = Field(None, gt=0, le=1, description="Accepted; the server's sampling settings apply.")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Seeds sampling (prompt i: a seed derived from it).")
    stop: str | list[str] | None = Field(None, description="Up to 4 stop strings (cut before them).")
    n: int = Field(1, ge=1, le=1, description="Choices per prompt (only 1).")
    stream: bool = Field(False, description="Streaming is not supported.")


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def read_token(cfg: CtrlgenConfig) -> str:
    """The bearer token: ``serve.token_file`` if set, else the ``serve.token_env`` variable."""
    if cfg.serve.token_file:
        path = Path(cfg.serve.token_file)
        if not path.is_file():
            raise RuntimeError(f"serve.token_file {path} does not exist")
        token = path.read_text(encoding="utf-8").strip()
        where = str(path)
    else:
        token = os.environ.get(cfg.serve.token_env, "").strip()
        where = f"${cfg.serve.token_env}"
    if len(token) < 16:
        raise RuntimeError(
            f"no bearer token of at least 16 characters in {where}: the service does not run without auth"
        )
    return token


app = FastAPI(
    title="ctrlgen synthesis service",
    version="1",
    description="Privacy-preserving synthetic clinical text by controlled generation: synthesis with hard "
    "token blocking and a release gate, entity extraction, leakage scoring. Every route but /healthz "
    "needs `Authorization: Bearer <token>`.",
)


def _error(status: int, message: str, request_id: str, **extra: Any) -> JSONResponse:
    headers = {"X-Request-Id": request_id}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if extra.get("retryable"):
        headers["Retry-After"] = "1"
    return JSONResponse({"error": message, "request_id": request_id, **extra}, status_code=status, headers=headers)


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
    known = {"/v1/synthesize", "/v1/extract", "/v1/score", "/v1/adapters", "/healthz", "/docs", "/openapi.json"}
    return path if path in known else "other"  # a fixed set: metric tags never carry what a client typed


@app.middleware("http")
async def _frame(request: Request, call_next: Any) -> Any:
    """Request id, body-size limit, metrics and one PHI-free log line per request."""
    rid = _rid(request)
    t0 = time.perf_counter()
    route = _route_name(request.url.path)
    limit = _limits.get("max_body_bytes", 1_048_576)
    size = int(request.headers.get("content-length") or 0)
    if size > limit:
        response = _error(413, f"request body of {size} bytes is over the limit of {limit}", rid)
    else:
        body = await request.body()
        if len(body) > limit:
            response = _error(413, f"request body of {len(body)} bytes is over the limit of {limit}", rid)
        else:
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
_token: dict[str, str] = {}


def _configure(token: str, max_body_bytes: int) -> None:
    _token["value"] = token
    _limits["max_body_bytes"] = max_body_bytes


async def _auth(request: Request) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    expected = _token.get("value", "")
    ok = (
        scheme.lower() == "bearer" and bool(expected) and hmac.compare_digest(given.strip().encode(), expected.encode())
    )
    if not ok:
        raise ApiError(401, "missing or invalid bearer token (send 'Authorization: Bearer <token>')")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the ingress answers (no auth, no model call)."""
    return {"status": "ok"}


@serve.deployment(name="Api", max_ongoing_requests=64)
@serve.ingress(app)
class Api:
    """The ingress: checks, auth, limits and error mapping around the model-side deployments."""

    def __init__(self, cfg_json: str, generator: Any, extractor: Any, scorer: Any) -> None:
        cfg = CtrlgenConfig.model_validate_json(cfg_json)
        self.cfg = cfg.serve
        self.default_max_new_tokens = cfg.generation.sampling.max_new_tokens
        _configure(read_token(cfg), cfg.serve.max_body_bytes)
        self.generator, self.extractor, self.scorer = generator, extractor, scorer
        self.adapter_names = sorted(cfg.serve.adapters)

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
        return {"id": rid, "seed": seed, "max_new_tokens": max_new, **out, "seconds": time.perf_counter() - t0}

    def _texts_ok(self, texts: list[str], what: str) -> None:
        if len(texts) > self.cfg.max_texts:
            raise ApiError(422, f"{len(texts)} {what} sent; the limit is {self.cfg.max_texts}")
        for i, t in enumerate(texts):
            if len(t) > self.cfg.max_text_chars:
                raise ApiError(413, f"{what}[{i}] has {len(t)} characters, over the limit of {self.cfg.max_text_chars}")

    @app.post("/v1/extract", dependencies=[Depends(_auth)])
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

    @app.post("/v1/score", dependencies=[Depends(_auth)])
    async def score(self, body: ScoreIn, request: Request) -> dict[str, Any]:
        """PIPP / ELP (fine-tuning definitions) and ROUGE-2/L maxima against the reference corpus.

        Per text: how many corpus values it contains (never which) and its best ROUGE scores
        with the reference document they come from.
        """
        self._texts_ok(body.texts, "texts")
        out = await self._call(self.scorer.score.remote(body.texts), "scoring")
        return {"id": _rid(request), **out}

    @app.post("/v1/completions", dependencies=[Depends(_auth)])
    async def completions(self, body: CompletionIn, request: Request) -> dict[str, Any]:
        """OpenAI-compatible completions from the base model (no control codes, no release gate): the
        endpoint ``anonymizer.endpoint`` and other OpenAI clients can use. Batched with the other outputs."""
        t0 = time.perf_counter()
        if body.stream:
            raise ApiError(422, "stream=true is not supported; send stream=false")
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise ApiError(422, "prompt is an empty list")
        self._texts_ok(prompts, "prompts")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > 4:
            raise ApiError(422, f"{len(stop)} stop strings sent; at most 4")
        seed = body.seed if body.seed is not None else secrets.randbelow(2**63)
        max_new = min(body.max_tokens or self.default_max_new_tokens, self.cfg.max_new_tokens)
        req = {"prompts": prompts, "seed": seed, "max_new_tokens": max_new, "stop": stop}
        out = await self._call(self.generator.complete.remote(req), "completion")
        rid = _rid(request)
        failed = [(i, c["error"]) for i, c in enumerate(out["choices"]) if c.get("error")]
        if failed:  # engine errors name sizes only (e.g. a prompt over the model's positions)
            raise ApiError(422, f"prompt[{failed[0][0]}]: {failed[0][1]}")
        logger.info("completions %s: %d prompts, %d new tokens, %.2f s", rid, len(prompts),
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
        return {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                "model": body.model or out["model"], "choices": choices, "usage": usage}  # fmt: skip
