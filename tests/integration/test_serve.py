"""The synthesis service on a local Ray cluster started by the tests: real Serve HTTP endpoint, tiny model.

One cluster and one deployment of configs/serve/tiny.yaml serve the whole module; the tests that
change the deployment's state (replica kill, autoscaling) run last and wait for it to settle.
Every load loop here is bounded in count and time and targets 127.0.0.1 only.
"""

import concurrent.futures as cf
import json
import os
import re
import socket
import time
import urllib.request
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrlgen.config import load_config
from ctrlgen.metrics.leakage import leaked_values

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "Zyxwquorpl Vantablack-7731"  # appears in request bodies; must never reach a log file
SCORE_RATE = (40, 4.0)  # /v1/score: texts per token per window (s); small so the test can exceed it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def service(tmp_path_factory, shared):
    """Extraction output of 200 PhysioNet notes (known setting) -> the service on a private cluster."""
    ray = pytest.importorskip("ray")
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract import KnownExtractor
    from ctrlgen.extract.stage import extract_rows
    from serve.launch import start_service, stop_service

    tmp = tmp_path_factory.mktemp("serve")
    cfg = load_config(ROOT / "configs/serve_tiny.yaml", [f"corpus.path={shared / 'physionet-deid'}"])
    docs, _, _ = load_corpus(cfg.corpus)
    table = extract_rows([d.to_row() for d in docs], KnownExtractor(), cfg.corpus, "documents")
    table = table.filter(pa.compute.equal(table.column("status"), "ok"))
    (tmp / "extracted" / "status=ok").mkdir(parents=True)
    pq.write_table(table, tmp / "extracted" / "status=ok" / "part-0.parquet")
    (tmp / "token").write_text("t0ken-for-the-serve-tests-" + os.urandom(8).hex())
    (tmp / "audit_token").write_text("audit-t0ken-for-the-serve-tests-" + os.urandom(8).hex())
    os.environ["RAY_AUTH_MODE"] = "disabled"
    metrics_port = _free_port()
    ray.init(
        address="local", num_cpus=6, include_dashboard=False, configure_logging=False, _metrics_export_port=metrics_port
    )
    overrides = [f"corpus.path={shared / 'physionet-deid'}", f"serve.contexts={tmp / 'extracted'}",
                 f"serve.token_file={tmp / 'token'}", f"serve.audit_token_file={tmp / 'audit_token'}",
                 "serve.max_texts=32", f"serve.score_rate_texts={SCORE_RATE[0]}",
                 f"serve.score_rate_window_s={SCORE_RATE[1]}", f"serve.scorer_index_dir={tmp / 'scorer_index'}"]  # fmt: skip
    cfg = load_config(ROOT / "configs/serve_tiny.yaml", overrides)
    svc = start_service(cfg, ROOT / "configs/serve/tiny.yaml", str(ROOT / "configs/serve_tiny.yaml"), overrides,
                        port=_free_port())  # fmt: skip
    svc.metrics_port = metrics_port
    svc.extracted = tmp / "extracted"
    svc.scorer_index = tmp / "scorer_index"
    yield svc
    stop_service()
    ray.shutdown()


def call(svc, path, body=None, token="audit", method=None, timeout=120):
    """One request with the audit-scope token (token="release": the release one; None: no token)."""
    from serve.launch import http

    given = {"audit": svc.audit_token, "release": svc.token, None: None}[token]
    return http(method or ("POST" if body is not None else "GET"), svc.url + path, body, given, timeout)


def concurrently(fn, args, workers=16):
    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, args))


def test_health_needs_no_token_and_every_other_route_does(service):
    assert call(service, "/healthz", token=None) == (200, {"status": "ok"})
    for path, body in [("/v1/synthesize", {}), ("/v1/extract", {"documents": [{"text": "x"}]}),
                       ("/v1/score", {"texts": ["x"]}), ("/v1/adapters", None), ("/v1/completions", {"prompt": "x"}),
                       ("/v1/models", None), ("/openapi.json", None), ("/docs", None)]:  # fmt: skip
        status, ans = call(service, path, body, token=None)
        assert status == 401 and "bearer token" in ans["error"], path
    from serve.launch import http

    assert http("GET", service.url + "/v1/adapters", token="wrong-" + service.token)[0] == 401
    assert http("GET", service.url + "/openapi.json", token=service.token[:-1])[0] == 401
    for token in (service.token, service.audit_token):  # the docs: any scope
        req = urllib.request.Request(service.url + "/openapi.json", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert "/v1/synthesize" in r.read().decode()


def test_release_scope_synthesizes_in_gated_modes_only_and_never_sees_document_ids(service):
    for body in ({"mode": "baseline"}, {"mode": "icl", "seed": 1}):
        status, ans = call(service, "/v1/synthesize", body, token="release")
        assert status == 403 and f"mode {body['mode']} is not gated" in ans["error"] and "audit" in ans["error"], ans
    status, ans = call(service, "/v1/synthesize", {"mode": "prefix"}, token="release")  # not gated on this server
    assert status == 403 and "mode prefix is not gated on this server" in ans["error"]
    for path, body in [("/v1/score", {"texts": ["x"]}), ("/v1/extract", {"documents": [{"text": "x"}]}),
                       ("/v1/completions", {"prompt": "x", "max_tokens": 2})]:  # fmt: skip
        status, ans = call(service, path, body, token="release")
        assert status == 403 and f"{path} needs an audit-scope token" in ans["error"], path
    assert call(service, "/v1/adapters", token="release") == (200, {"adapters": []})
    body = {"seed": 11, "n": 3, "max_new_tokens": 8}  # no mode: the server's default, icl_blocking
    status, rel = call(service, "/v1/synthesize", body, token="release")
    assert status == 200 and rel["mode"] == "icl_blocking" and rel["gate"] is True
    status, aud = call(service, "/v1/synthesize", body)
    assert status == 200 and all(o["context_ids"] for o in aud["outputs"]) and "regenerated" in aud
    assert "regenerated" not in rel
    for r, a in zip(rel["outputs"], aud["outputs"], strict=True):
        assert not {"context_ids", "template_id", "attempts"} & set(r), r
        assert (r["text"], r["fictional_code"], r["released"]) == (a["text"], a["fictional_code"], a["released"])
        if not r["released"]:
            assert r["withheld_reason"] == "withheld by the release gate"
    # Neither the context ids nor the template id appear anywhere in the release answer's JSON.
    rel_json = json.dumps(rel)
    ids = {c for o in aud["outputs"] for c in o["context_ids"]} | {o["template_id"] for o in aud["outputs"]} - {None}
    assert not [i for i in ids if f'"{i}"' in rel_json]


def test_score_names_reference_documents_only_when_asked(service):
    text = "Patient stable overnight, plan to continue heparin."
    status, plain = call(service, "/v1/score", {"texts": [text]})
    assert status == 200 and list(plain["texts"][0]) == ["leaked_values"]
    status, full = call(service, "/v1/score", {"texts": [text], "closest_reference": True})
    assert status == 200 and {"rouge2", "rouge2_doc", "rougeL", "rougeL_doc"} <= set(full["texts"][0])
    assert full["texts"][0]["rougeL"] > 0 and full["texts"][0]["rougeL_doc"] is not None


def _score_with_headers(svc, n_texts):
    req = urllib.request.Request(svc.url + "/v1/score", json.dumps({"texts": ["heparin drip"] * n_texts}).encode(),
                                 headers={"Authorization": f"Bearer {svc.audit_token}",
                                          "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def test_score_is_rate_limited_per_token_with_retry_after(service):
    capacity, window = SCORE_RATE
    time.sleep(window)  # a full bucket whatever the earlier tests sent
    t0, accepted, limited = time.monotonic(), 0, None
    for _ in range(16):
        status, ans, headers = _score_with_headers(service, 16)
        if status == 429:
            limited = (ans, headers)
            break
        assert status == 200, ans
        accepted += 16
    assert limited is not None, f"{accepted} texts accepted, no 429"
    ans, headers = limited
    # One bucket for the whole service (the ScoreLimiter deployment), whatever the number of ingress replicas,
    # plus what refilled meanwhile.
    assert _replicas("ScoreLimiter") == 1
    bound = capacity + (time.monotonic() - t0) * capacity / window
    assert accepted <= bound, (accepted, bound)
    assert ans["retryable"] is True and "rate limit" in ans["error"]
    wait = int(headers["Retry-After"])
    assert 1 <= wait <= window and wait == ans["retry_after_s"]
    time.sleep(wait)
    assert _score_with_headers(service, 16)[0] == 200
    time.sleep(window)  # leave a full bucket to the later tests


def test_body_limit_holds_for_chunked_bodies(service):
    """No Content-Length: the ingress reads the chunks as they come and answers 413 once past the limit,
    without waiting for a body that never ends (a server reading it whole first would hang here)."""
    limit = load_config(ROOT / "configs/serve_tiny.yaml").serve.max_body_bytes
    parts = urlsplit(service.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer "
                     f"{service.audit_token}\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())  # fmt: skip
        chunk = b"x" * 65536
        try:
            for _ in range(limit // len(chunk) + 2):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server may close once it has answered
        # No terminating chunk is sent: the body never ends.
        answer = b""
        while b"\r\n\r\n" not in answer:
            got = sock.recv(65536)
            if not got:
                break
            answer += got
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # A chunked body under the limit reaches the route whole.
    conn = HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = iter([b'{"texts": ["Patient stable', b' overnight."], ', b'"closest_reference": true}'])
    conn.request("POST", "/v1/score", body=body, encode_chunked=True,
                 headers={"Authorization": f"Bearer {service.audit_token}", "Content-Type": "application/json",
                          "Transfer-Encoding": "chunked"})  # fmt: skip
    r = conn.getresponse()
    ans = json.loads(r.read())
    conn.close()
    assert r.status == 200 and len(ans["texts"]) == 1 and "rouge2" in ans["texts"][0], ans


def test_malformed_and_oversized_requests_get_clear_json_errors(service):
    status, ans = call(service, "/v1/synthesize", {"n": "many", "secret": PLANTED})
    assert status == 422 and {d["loc"] for d in ans["detail"]} == {"body.n", "body.secret"}
    assert PLANTED not in str(ans)  # validation errors never echo the input
    assert call(service, "/v1/synthesize", {"n": 99})[0] == 422  # over serve.max_outputs
    status, ans = call(service, "/v1/synthesize", {"control_code": "no categories here"})
    assert status == 422 and "CATEGORY" in ans["error"]
    status, ans = call(service, "/v1/extract", {"documents": [{"text": "Pt Alice", "entities": [
        {"start": 3, "end": 40, "category": "PERSON"}]}]})  # fmt: skip
    assert status == 422 and "documents[0].entities[0]" in ans["error"] and "outside the text" in ans["error"]
    status, ans = call(service, "/v1/score", {"texts": ["a" * 20_001]})
    assert status == 413 and "texts[0]" in ans["error"]
    status, ans = call(service, "/v1/score", {"texts": ["word " * 250_000]})  # a body over max_body_bytes
    assert status == 413 and "over the limit" in ans["error"]
    status, ans = call(service, "/v1/synthesize", {"mode": "prefix", "adapter": "nope"})
    assert status == 404 and ans["known_adapters"] == []


def test_concurrent_requests_share_batches_and_answers_do_not_depend_on_companions(service):
    alone = call(service, "/v1/synthesize", {"seed": 5, "mode": "icl_blocking", "max_new_tokens": 16})[1]
    assert alone["outputs"][0]["batch_size"] == 1
    mixed = [{"seed": 5, "mode": "icl_blocking", "max_new_tokens": 16}] + [
        {"seed": 100 + i, "mode": ("icl", "icl_blocking", "baseline")[i % 3], "max_new_tokens": 8 + i} for i in range(7)
    ]
    answers = concurrently(lambda b: call(service, "/v1/synthesize", b), mixed)
    assert all(s == 200 for s, _ in answers)
    sizes = [a["outputs"][0]["batch_size"] for _, a in answers]
    assert max(sizes) > 1, sizes  # observed, not assumed
    together = answers[0][1]["outputs"][0]
    assert together["batch_size"] > 1
    for key in ("text", "fictional_code", "context_ids", "new_tokens"):
        assert together[key] == alone["outputs"][0][key], key
    assert all(a["outputs"][0]["new_tokens"] <= b["max_new_tokens"] for (_, a), b in zip(answers, mixed, strict=True))


def test_blocking_holds_per_row_inside_a_mixed_batch(service):
    from ctrlgen.codes import parse_control_code
    from ctrlgen.fictional import code_values
    from ctrlgen.generation.synthesis import iter_extracted

    values = {}
    for rows in iter_extracted(service.extracted):
        for r in rows:
            values[r["doc_id"]] = code_values(parse_control_code(r["control_code"] or ""))
    bodies = [{"seed": s, "mode": "icl_blocking" if s % 2 else "icl", "n": 2, "max_new_tokens": 24} for s in range(8)]
    answers = concurrently(lambda b: call(service, "/v1/synthesize", b), bodies)
    seen_batch = 0
    for (status, ans), body in zip(answers, bodies, strict=True):
        assert status == 200
        for o in ans["outputs"]:
            seen_batch = max(seen_batch, o["batch_size"])
            ctx_values = [v for c in o["context_ids"] for v in values[c]]
            assert not leaked_values(o["fictional_code"], ctx_values)
            if body["mode"] == "icl_blocking" and o["released"]:
                assert not leaked_values(o["text"], ctx_values)
            if not o["released"]:
                assert o["text"] is None and "known private value" in o["withheld_reason"]
    assert seen_batch > 2


def test_extract_uses_sent_spans_or_the_unknown_engine(service):
    text = "Seen by Dr. John Smith on 3/4/2005."
    docs = [{"id": "a", "text": text}, {"id": "b", "text": "Pt Alice here", "entities": [
        {"start": 3, "end": 8, "category": "PERSON"}]}, {"id": "c", "text": "   "}]  # fmt: skip
    status, ans = call(service, "/v1/extract", {"documents": docs})
    assert status == 200
    a, b, c = ans["documents"]
    assert a["id"] == "a" and {e["category"] for e in a["entities"]} >= {"PERSON", "DATETIME"}
    assert all(e["source"] != "request" for e in a["entities"])
    assert b["control_code"] == "PERSON: Alice" and b["entities"][0]["source"] == "request"
    assert c["status"] == "quarantined" and c["reason"] == "empty document"


def test_openai_completions_route_drives_the_llm_anonymiser(service, monkeypatch):
    """/v1/completions speaks OpenAI's completion API: ctrlgen's own remote engine (the anonymiser's
    endpoint mode) runs against it, seeds reproduce, and a missing key is an error result, not a hang."""
    from ctrlgen.anonymize_llm import AnonymizerSettings, llm_anonymize
    from ctrlgen.config import SamplingConfig
    from ctrlgen.generation.engine import GenerationRequest
    from ctrlgen.generation.remote import OpenAICompletionsEngine
    from ctrlgen.schema import Entity

    status, ans = call(service, "/v1/completions", {"model": "x", "prompt": ["Vital signs", "Pt is"], "max_tokens": 6,
                                                     "seed": 3, "temperature": 0.7, "user": "ignored"})  # fmt: skip
    assert status == 200 and ans["object"] == "text_completion" and len(ans["choices"]) == 2
    assert 0 < ans["usage"]["completion_tokens"] <= 12 and ans["usage"]["prompt_tokens"] > 0
    assert call(service, "/v1/completions", {"prompt": "x", "stop": list("abcde")})[0] == 422
    assert call(service, "/v1/completions", {"prompt": "x", "n": 9})[0] == 422
    monkeypatch.setenv("CTRLGEN_TEST_KEY", service.audit_token)
    engine = OpenAICompletionsEngine(service.url + "/v1", sampling=SamplingConfig(max_new_tokens=6),
                                     api_key_env="CTRLGEN_TEST_KEY", timeout_s=60)  # fmt: skip
    a, b = engine.generate([GenerationRequest("Vital signs", seed=3), GenerationRequest("Vital signs", seed=3)])
    assert a.error is None and a.text == b.text == ans["choices"][0]["text"].strip()
    text = "Pt John Smith seen at Mercy Hospital.\nHe is doing well."
    ents = [Entity(3, 13, "John Smith", "PERSON", "DIRECT", "gold", ""), Entity(22, 36, "Mercy Hospital", "ORG",
            "DIRECT", "gold", "")]  # fmt: skip
    [res] = llm_anonymize(engine, [("d0", text, ents)], AnonymizerSettings(rounds=2, max_new_tokens=16,
                                                                          attack_max_new_tokens=8))  # fmt: skip
    assert res.status in ("private", "redacted") and res.rounds >= 1 and res.text is not None
    assert not leaked_values(res.text, ["John Smith", "Mercy Hospital"])
    unauth = OpenAICompletionsEngine(service.url + "/v1", api_key_env=None, retries=0)
    out = unauth.generate([GenerationRequest("x", max_new_tokens=2)])[0]
    assert out.finish == "error" and "HTTP 401" in (out.error or "")


def test_the_official_openai_client_lists_models_completes_samples_n_and_streams(service):
    """OpenAI's own Python client against /v1: models.list (tools call it first), n choices, the request's
    temperature / top_p / seed honoured, stream=True as server-sent events."""
    import openai

    client = openai.OpenAI(base_url=service.url + "/v1", api_key=service.audit_token, timeout=120, max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    kw = {"model": "tiny-llama", "prompt": "Vital signs", "max_tokens": 8, "seed": 11}
    greedy = client.completions.create(**kw, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1  # temperature 0: the same text whatever each choice's seed
    hot = client.completions.create(**kw, temperature=2.0, top_p=1.0, n=3)
    assert len({c.text for c in hot.choices}) > 1  # the request's temperature, not the server's
    again = client.completions.create(**kw, temperature=2.0, top_p=1.0, n=3)
    assert [c.text for c in again.choices] == [c.text for c in hot.choices]  # the seed reproduces
    two = client.completions.create(**{**kw, "prompt": ["Vital signs", "Pt is"]}, temperature=0, n=2)
    assert [c.index for c in two.choices] == [0, 1, 2, 3] and two.choices[0].text == greedy.choices[0].text
    chunks = list(client.completions.create(**kw, temperature=2.0, top_p=1.0, n=3, stream=True))
    streamed = {c.index: c.text for ch in chunks for c in ch.choices}
    assert streamed == {c.index: c.text for c in hot.choices}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=service.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):  # the release scope has no raw completions
        openai.OpenAI(base_url=service.url + "/v1", api_key=service.token, max_retries=0).models.list()


def test_sharded_scores_equal_the_whole_corpus_metrics(service):
    from ctrlgen.metrics.leakage import elp_finetune, pipp_finetune
    from ctrlgen.metrics.rouge import RougeIndex
    from ctrlgen.metrics.shard import iter_references

    refs = list(iter_references(service.extracted))
    texts = [refs[3][1][:300], "Patient stable overnight, plan to continue heparin.", refs[10][1][:80] + " and more"]
    status, ans = call(service, "/v1/score", {"texts": texts, "closest_reference": True})
    assert status == 200 and ans["reference"]["shards"] == 2 and ans["reference"]["documents"] == len(refs)
    index = RougeIndex([r[1] for r in refs])
    for text, got in zip(texts, ans["texts"], strict=True):
        best = index.best(text)
        assert got["rouge2"] == pytest.approx(best.rouge2) and got["rougeL"] == pytest.approx(best.rougeL)
    values = [v for r in refs for v in r[2]]
    assert ans["pipp"] == pytest.approx(pipp_finetune(texts, values))
    assert ans["elp"] == pytest.approx(elp_finetune(texts, values))
    assert ans["texts"][0]["leaked_values"] > 0 and "leaked" not in ans["texts"][0]  # counts, never values
    # each shard's replica saved its index for the replicas after it; loaded, it scores as the service did
    from ctrlgen.metrics.shard import ReferenceShard, floors_of, merge_shard_scores

    files = sorted(service.scorer_index.glob("shard-*-of-2-*.npz"))
    assert [f.name[:12] for f in files] == ["shard-0-of-2", "shard-1-of-2"]
    shards = [ReferenceShard.load(f) for f in files]
    probes = [s.probe(texts) for s in shards]
    merged = merge_shard_scores([s.score(texts, floors_of(probes)) for s in shards], probes)
    assert [m.rougeL for m in merged] == pytest.approx([t["rougeL"] for t in ans["texts"]])


def test_metrics_reach_the_prometheus_endpoint(service):
    call(service, "/v1/synthesize", {"seed": 1, "max_new_tokens": 4})
    wanted = ["ctrlgen_serve_requests", "ctrlgen_serve_request_seconds", "ctrlgen_serve_batch_size",
              "ctrlgen_serve_queue_wait_seconds", "ctrlgen_serve_tokens_generated"]  # fmt: skip
    this_request = r'ctrlgen_serve_requests_total\{[^}]*route="/v1/synthesize"[^}]*status="200"'
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:  # the counter may be exported for other routes before this one's sample
        with urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        if all(w in text for w in wanted) and re.search(this_request, text):
            break
        time.sleep(2)
    missing = [w for w in wanted if w not in text]
    assert not missing, missing
    assert re.search(this_request, text)


def test_batch_job_metrics_reach_the_same_endpoint(service, tmp_path):
    """The extraction job's actors count rows and entities as Ray metrics (cluster of this module)."""
    from ray_jobs.extract import run

    cfg = load_config(ROOT / "configs/extract_demo.yaml", ["demo_corpus.n_notes=120", f"output_dir={tmp_path}",
                      f"demo_corpus.output_dir={tmp_path / 'notes'}", "extraction.num_actors=1",
                      "extraction.actor_num_cpus=0.5"])  # fmt: skip
    summary = run(cfg)

    def ok_rows(text):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("ray_ctrlgen_job_rows_total{") and 'job="extract"' in line
                   and 'status="ok"' in line)  # fmt: skip

    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        if ok_rows(text) >= summary.documents and "ctrlgen_job_entities_total" in text:
            break
        time.sleep(2)
    assert ok_rows(text) == summary.documents
    assert re.search(r'ctrlgen_job_entities_total\{[^}]*category="PERSON"', text)


def test_queue_overflow_answers_503_with_a_retry_hint(service):
    bodies = [{"seed": i, "n": 8, "max_new_tokens": 64} for i in range(48)]
    answers = concurrently(lambda b: call(service, "/v1/synthesize", b), bodies, workers=48)
    codes = [s for s, _ in answers]
    assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
    busy = next(a for s, a in answers if s == 503)
    assert busy["retryable"] is True and "capacity" in busy["error"]


def test_no_request_text_reaches_the_log_files(service):
    import ray

    call(service, "/v1/extract", {"documents": [{"text": f"Seen by {PLANTED} today."}]})
    call(service, "/v1/score", {"texts": [f"{PLANTED} was here"]})
    call(service, "/v1/synthesize", {"control_code": f"PERSON: {PLANTED}", "max_new_tokens": 4})
    call(service, "/v1/synthesize", {"control_code": f"PERSON: {PLANTED}", "n": "x"})
    time.sleep(2)
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = [f for f in logs.rglob("*") if f.is_file()]
    assert any("serve" in str(f) for f in files)
    hits = [str(f) for f in files if PLANTED.encode() in f.read_bytes()]
    assert not hits, hits


def _replica_states(name="Generator") -> dict[str, int]:
    """The deployment's replicas by state (states with none left out), from one read of the Serve status."""
    from ray import serve

    return {k: v for k, v in serve.status().applications["ctrlgen"].deployments[name].replica_states.items() if v}


def _replicas(name="Generator"):
    return _replica_states(name).get("RUNNING", 0)


def _settle_at_one(name="Generator", timeout=120.0):
    """Wait until the deployment holds exactly one replica, running, none starting or stopping, and return its
    replica states as last read (one read per check: a count read twice can change between the reads, as when
    the previous test's upscale was still starting a replica)."""
    deadline = time.monotonic() + timeout
    while True:
        states = _replica_states(name)
        if states == {"RUNNING": 1} or time.monotonic() > deadline:
            return states
        time.sleep(2)


def test_a_killed_replica_under_load_loses_no_request_and_recovers(service):
    import ray

    def one(i):
        t0 = time.monotonic()
        status, ans = call(service, "/v1/synthesize", {"seed": i, "max_new_tokens": 48}, timeout=150)
        return status, ans, time.monotonic() - t0

    with cf.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, i) for i in range(12)]
        time.sleep(1.0)
        actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if "Generator" in a["name"]]
        assert actors
        ray.kill(ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"]), no_restart=True)
        results = [f.result(timeout=170) for f in futures]  # none hangs
    assert len(results) == 12  # one answer per request
    for status, ans, _ in results:
        assert status in (200, 503), (status, ans)
        if status == 503:
            assert ans["retryable"] is True and ans["error"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if call(service, "/v1/synthesize", {"seed": 1, "max_new_tokens": 4}, timeout=60)[0] == 200:
            break
        time.sleep(2)
    else:
        pytest.fail("the service did not recover within 120 s")


def test_generator_scales_to_two_replicas_under_load_and_back(service):
    settled = _settle_at_one()  # after the previous test (its load may have started an upscale)
    assert settled == {"RUNNING": 1}, settled
    stop = time.monotonic() + 90
    peak = 1

    def client(i):
        nonlocal peak
        k = 0
        while time.monotonic() < stop and peak < 2:
            call(service, "/v1/synthesize", {"seed": 1000 * i + k, "max_new_tokens": 32}, timeout=60)
            k += 1
        return k

    with cf.ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(client, i) for i in range(8)]
        while time.monotonic() < stop and peak < 2:
            peak = max(peak, _replicas())
            time.sleep(1)
        sent = sum(f.result(timeout=120) for f in futures)
    assert peak == 2, f"still one replica after {sent} requests"
    settled = _settle_at_one(timeout=90)
    assert settled == {"RUNNING": 1}, settled
