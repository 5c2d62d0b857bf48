"""A :class:`~ctrlgen.generation.engine.GenerationEngine` over an OpenAI-compatible completions endpoint.

For the jobs that only need text in, text out (the LLM anonymiser): a vLLM server, any
OpenAI-compatible gateway, or ctrlgen's own Serve endpoint (``POST /v1/completions``, see
docs/serving.md). Each request is one ``POST {base_url}/completions`` with ``prompt``,
``max_tokens``, ``temperature``, ``top_p``, ``seed`` and ``stop``; up to ``concurrency`` are in
flight at once, so a server that batches (vLLM, Serve's ``@serve.batch``) sees them together.

Banned token sequences cannot travel through this API (``logit_bias`` bans single tokens of the
server's own vocabulary): requests that carry them are sent without, and the caller's checks
(the anonymiser's attacker, the release gate) are what stands between a value and the output.
Failures (connection refused, HTTP errors, timeouts, malformed answers) come back as results with
``error`` set, naming the endpoint and the status, never the prompt. The API key is read from an
environment variable, never from the config file.

Example:
    >>> eng = OpenAICompletionsEngine("http://127.0.0.1:9/v1", timeout_s=0.5, retries=0)
    >>> eng.generate([GenerationRequest("hello")])[0].finish
    'error'
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ctrlgen.config import SamplingConfig
from ctrlgen.generation.engine import GenerationRequest, GenerationResult

__all__ = ["OpenAICompletionsEngine"]

_RETRYABLE = {429, 500, 502, 503, 504}


@dataclass
class OpenAICompletionsEngine:
    """Completions from ``base_url`` (ending in ``/v1``); ``model`` is the server's model name."""

    base_url: str
    model: str = "ctrlgen"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    api_key_env: str | None = "CTRLGEN_LLM_API_KEY"
    timeout_s: float = 300.0
    concurrency: int = 16
    retries: int = 2  # on connection errors and 429/5xx, with a short backoff

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _one(self, req: GenerationRequest) -> GenerationResult:
        t0 = time.perf_counter()
        body = {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.max_new_tokens or self.sampling.max_new_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "seed": int(req.seed) % (2**63),
        }
        if req.stop:
            body["stop"] = list(req.stop)[:4]  # the OpenAI API takes at most 4
        url = self.base_url.rstrip("/") + "/completions"
        data = json.dumps(body).encode()
        err = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(4.0, 0.5 * 2**attempt))
            try:
                http = urllib.request.Request(url, data=data, headers=self._headers(), method="POST")
                with urllib.request.urlopen(http, timeout=self.timeout_s) as resp:
                    out = json.loads(resp.read())
                choice = out["choices"][0]
                text = str(choice.get("text") or "")
                cut = min((text.find(s) for s in req.stop if s in text), default=-1)
                finish = {"stop": "stop", "length": "length"}.get(choice.get("finish_reason"), "stop")
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                tokens = int((out.get("usage") or {}).get("completion_tokens") or 0)
                return GenerationResult(text.strip(), tokens, finish, None, time.perf_counter() - t0)
            except urllib.error.HTTPError as exc:
                err = f"{url} answered HTTP {exc.code}"
                if exc.code not in _RETRYABLE:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                err = f"{url} unreachable ({type(reason).__name__})"
            except (ValueError, KeyError, IndexError, TypeError):
                err = f"{url} sent an answer that is not an OpenAI completion"
                break
        return GenerationResult("", 0, "error", err, time.perf_counter() - t0)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(requests)))) as pool:
            return list(pool.map(self._one, requests))
