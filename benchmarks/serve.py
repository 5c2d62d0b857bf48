"""The synthesis service against the offline engine, in one run (SmolLM2, loopback only, bounded).

    .venv/bin/python benchmarks/serve.py [--new-tokens 32] [--quick]

1. Contexts: the PhysioNet notes (known setting) as an extraction output in a temp directory.
2. Offline: the same ``SynthesisPlanner`` + ``HFEngine`` + ``gated_generate`` the Generator replica
   runs, in this process before Ray starts, on 16 icl_blocking outputs at once (batch 16), with
   the replica's torch threads. Best of 2 runs (the first warms up).
3. The service (configs/serve/bench.yaml: one Generator replica, no autoscaling, so the
   comparison is one engine against one replica) on a private local cluster: at each
   concurrency c, ``max(2c, 4)`` single-output requests from c client threads; tokens/s over the
   wall time, p50 / p99 request latency.
4. /v1/score: 512 note snippets (up to 2,000 characters) sent 64 per request from 2 threads, against the app with 2
   reference shards, then redeployed with 1 shard; texts/s ratio.

Targets (issue 15): c=16 >= 0.9x the offline batch-16 tokens/s; c=16 >= 1.6x the service's own
c=1 throughput; score with 2 shards >= 1.7x one. The section written to docs/benchmarks.md
states which held.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from _report import write_section  # noqa: E402

SERVE_CONFIG = ROOT / "configs" / "serve" / "bench.yaml"
CONFIG = ROOT / "configs" / "demo.yaml"


def _say(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _extraction(tmp: Path) -> tuple[Path, list[str]]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ctrlgen.config import PhysionetCorpusConfig
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract import KnownExtractor
    from ctrlgen.extract.stage import extract_rows

    corpus = PhysionetCorpusConfig(
        path=str(ROOT.parent / "shared" / "data" / "physionet-deid"), identifiers="direct+quasi"
    )
    docs, _, _ = load_corpus(corpus)
    table = extract_rows([d.to_row() for d in docs], KnownExtractor(), corpus, "documents")
    table = table.filter(pc.equal(table.column("status"), "ok"))
    out = tmp / "extracted" / "status=ok"
    out.mkdir(parents=True)
    pq.write_table(table, out / "part-0.parquet")
    texts = [t[:2000] for t in pa.Table.to_pydict(table.select(["text"]))["text"] if len(t) > 200]
    return tmp / "extracted", texts


def _overrides(contexts: Path, threads: int, extra: list[str]) -> list[str]:
    # A batch forms from the requests that arrive within generator_batch_wait_s of the first; 0.3 s (the
    # default 0.05 s is tuned for latency) lets the 16 clients' requests, which reach the replica spread over
    # a few hundred ms on 2 busy cores, meet in one batch. Every concurrency, c=1 included, runs with it.
    return [f"serve.contexts={contexts}", f"serve.torch_threads={threads}", "serve.generator_batch_size=16",
            "serve.generator_batch_wait_s=0.3", "generation.max_context_tokens=128", *extra]  # fmt: skip


def offline(contexts: Path, threads: int, new_tokens: int, batch: int) -> float:
    """Tokens/s of the replica's code path, in this process, one batch of ``batch`` outputs."""
    import torch

    from ctrlgen.config import load_config
    from ctrlgen.fictional import FictionalCodes
    from ctrlgen.generation.engine import HFEngine
    from ctrlgen.generation.gate import gated_generate
    from ctrlgen.generation.synthesis import SynthesisPlanner, corpus_values, load_pool_rows
    from ctrlgen.models import load_causal_lm

    cfg = load_config(CONFIG, _overrides(contexts, threads, []))
    torch.set_num_threads(threads)
    g = cfg.generation
    model, tok = load_causal_lm(cfg.model)
    engine = HFEngine(model, tok, g.sampling, batch)
    planner = SynthesisPlanner(load_pool_rows(contexts, g), tok, g, FictionalCodes(g.seed, corpus_values(contexts)))
    work = [planner.plan("icl_blocking", seed=s, max_new_tokens=new_tokens)[0].work for s in range(batch)]
    best = 0.0
    for run in range(2):
        t0 = time.perf_counter()
        out = gated_generate(engine, [w.request for w in work], [w.known for w in work], enabled=True)
        secs = time.perf_counter() - t0
        rate = sum(o.result.new_tokens for o in out) / secs
        _say(f"offline batch {batch}, run {run + 1}: {rate:.1f} tokens/s ({secs:.1f} s)")
        best = max(best, rate)
    return best


def _serve_config(tmp: Path, shards: int) -> Path:
    data = yaml.safe_load(SERVE_CONFIG.read_text())
    app = data["applications"][0]
    app["deployments"] = [d for d in app["deployments"] if not d["name"].startswith("ScorerShard")
                          or int(d["name"][len("ScorerShard"):]) < shards]  # fmt: skip
    path = tmp / f"serve-{shards}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _load(url: str, token: str, bodies: list[dict[str, Any]], workers: int, route: str) -> tuple[float, list[Any]]:
    from serve.launch import http

    def one(body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        t0 = time.perf_counter()
        status, ans = http("POST", url + route, body, token, timeout=600)
        return status, ans, time.perf_counter() - t0

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, bodies))
    wall = time.perf_counter() - t0
    bad = [(s, a.get("error")) for s, a, _ in results if s != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(bodies)} requests failed, e.g. {bad[0]}")
    return wall, results


_GROUPS = (("Generator replica", "Generator"), ("HTTP proxy", "ProxyActor"), ("Serve controller", "ServeController"),
           ("ingress (Api)", ":Api"), ("scorer shards", "ScorerShard"), ("Scorer", ":Scorer"))  # fmt: skip


def _cpu_snapshot() -> dict[str, float]:
    """CPU-seconds (user + system) so far of every process on this box, by role (Ray names its workers
    ``ray::ServeReplica:<app>:<deployment>``); the client is this process."""
    import psutil

    out: dict[str, float] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        t = p.info["cpu_times"]
        if t is None:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] == me:
            role = "client (this process)"
        else:
            role = next(
                (r for r, key in _GROUPS if key in cmd), "other Ray processes" if "ray" in cmd else "rest of the box"
            )
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def _cpu_shares(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Cores used on average by each role between two snapshots."""
    return {k: (after.get(k, 0.0) - before.get(k, 0.0)) / wall for k in after}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the engine (offline and replica)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--quick", action="store_true", help="small run to check the script (no doc written)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if args.quick:
        args.new_tokens, args.concurrency = 8, [1, 4]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctrlgen-bench-serve-") as d:
        tmp = Path(d)
        contexts, texts = _extraction(tmp)
        _say(f"contexts: {contexts} ({len(texts)} score snippets)")
        off = offline(contexts, args.threads, args.new_tokens, 16)

        import ray

        from ctrlgen.config import load_config
        from serve.launch import start_service, stop_service

        ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
        rows = []
        cpu: dict[int, dict[str, float]] = {}
        score: dict[int, float] = {}
        for shards in (2, 1):
            extra = [f"serve.scorer_shards={shards}"] + ([] if shards == 2 else ["model.name=tiny-llama"])
            overrides = _overrides(contexts, args.threads, extra)
            cfg = load_config(CONFIG, overrides)
            svc = start_service(cfg, _serve_config(tmp, shards), str(CONFIG), overrides, port=8411)
            try:
                if shards == 2:
                    warm = [
                        {"seed": 10**6 + i, "mode": "icl_blocking", "max_new_tokens": args.new_tokens} for i in range(2)
                    ]
                    _load(svc.url, svc.token, warm, 2, "/v1/synthesize")
                    for c in args.concurrency:
                        n = max(2 * c, 4)
                        bodies = [{"seed": 1000 * c + i, "mode": "icl_blocking", "max_new_tokens": args.new_tokens}
                                  for i in range(n)]  # fmt: skip
                        cpu0 = _cpu_snapshot()
                        wall, res = _load(svc.url, svc.token, bodies, c, "/v1/synthesize")
                        cpu[c] = _cpu_shares(cpu0, _cpu_snapshot(), wall)
                        toks = sum(a["outputs"][0]["new_tokens"] for _, a, _ in res)
                        lat = [t for _, _, t in res]
                        sizes = [a["outputs"][0]["batch_size"] for _, a, _ in res]
                        rows.append((c, n, toks / wall, _pct(lat, 0.5), _pct(lat, 0.99), statistics.mean(sizes)))
                        _say(f"c={c}: {n} requests, {toks / wall:.1f} tokens/s, p50 {_pct(lat, 0.5):.1f} s, "
                             f"mean batch {statistics.mean(sizes):.1f}")  # fmt: skip
                sbodies = [{"texts": texts[i : i + 64]} for i in range(0, 512, 64)]
                _load(svc.url, svc.token, sbodies[:1], 1, "/v1/score")  # warm: first call through every hop
                wall, _ = _load(svc.url, svc.token, sbodies, 2, "/v1/score")
                score[shards] = 512 / wall
                _say(f"score with {shards} shard(s): {score[shards]:.1f} texts/s")
            finally:
                stop_service()
        ray.shutdown()
    by_c = {r[0]: r for r in rows}
    c_hi = 16 if 16 in by_c else max(by_c)
    ratio_off = by_c[c_hi][2] / off
    ratio_c1 = by_c[c_hi][2] / by_c[min(by_c)][2]
    ratio_score = score[2] / score[1]
    table = "\n".join(
        f"| {c} | {n} | {tps:.1f} | {p50:.1f} | {p99:.1f} | {mb:.1f} |" for c, n, tps, p50, p99, mb in rows
    )

    shares = cpu[c_hi]
    cpu_line = ", ".join(f"{k} {v:.2f}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v >= 0.005)

    def verdict(x: float, target: float) -> str:
        return f"**{x:.2f}x** (target {target}x: {'met' if x >= target else 'NOT met'})"

    body = f"""Command: `.venv/bin/python benchmarks/serve.py` (SmolLM2-135M, {args.new_tokens} new tokens per output,
mode icl_blocking with the release gate, prompts of 3 PhysioNet contexts cut to 128 tokens, engine with
{args.threads} torch threads; service: configs/serve/bench.yaml, one Generator replica, `@serve.batch` up to 16,
`serve.generator_batch_wait_s=0.3` for every concurrency, private local cluster, loopback HTTP). Whole run {time.perf_counter() - t_start:.0f} s.

Offline engine (same planner, engine and gate in one process, one batch of 16): **{off:.1f} tokens/s**.

| concurrency | requests | service tokens/s | p50 latency s | p99 latency s | mean batch |
|---|---|---|---|---|---|
{table}

- Service at concurrency {c_hi} vs the offline engine at batch 16: {verdict(ratio_off, 0.9)}.
- Service at concurrency {c_hi} vs its own concurrency {min(by_c)}: {verdict(ratio_c1, 1.6)}.
- `/v1/score` (512 note snippets of up to 2,000 characters vs the {len(texts):,}+ PhysioNet notes, 64 per
  request, 2 clients):
  2 shards {score[2]:.1f} texts/s, 1 shard {score[1]:.1f} texts/s: {verdict(ratio_score, 1.7)}.

CPU use at concurrency {c_hi} (cores on average over the load, from each process's CPU time; the box has
{os.cpu_count()}): {cpu_line}.

What limits the figures: the 2 cores are shared by the engine's torch threads, the HTTP proxy, the
ingress replica, the controller and the client threads; on this box every CPU-second Serve spends is
taken from the engine. A batch only forms from requests that arrive while the previous one runs (one
batch at a time per replica), so at concurrency c the mean batch is at most min(c, 16) and latency
grows with it. Scoring: each shard probes (one exact LCS per text), then searches only documents that can
beat the best probe of all shards; but every shard still tokenises each text, matches it against its
values and intersects its bigrams, per-text costs that do not shrink with the shard. With 1,818
reference notes these dominate, so two shards on 2 shared cores gain little; the per-document search,
which grows with the corpus, is what sharding divides.
"""
    if args.quick:
        print(body)
    else:
        write_section("Serve: synthesis service vs offline engine", body)
        print(body)


if __name__ == "__main__":
    main()
