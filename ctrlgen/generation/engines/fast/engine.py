"""The fast engine: continuous batching over a slot cache, blocking and sampling on the device.

:class:`FastEngine` is a :class:`~ctrlgen.generation.types.GenerationEngine` in pure torch (same code on
CPU and CUDA):

* **continuous batching** - ``slots`` rows decode together over a preallocated key/value cache
  (:mod:`.kv_cache`); a row that ends (EOS, its ``max_new_tokens``, a stop string) frees its slot and the
  next waiting request is admitted at once (:mod:`.scheduler`);
* **prefill** in fixed chunks of ``prefill_chunk`` tokens, one prompt at a time, with a **prefix cache**
  keyed by the exact tokens before each chunk end (and the adapter): rows whose prompts share a prefix
  (the ICL modes of one target, gate retries, targets whose prompts begin alike) compute it once. Chunk
  boundaries are fixed, so a prompt's keys/values are the same numbers whether they were computed or reused;
* **one decode step** (:meth:`FastEngine._step`) with static shapes for a given key/value length bucket:
  the model's forward, per-row hard blocking (:class:`~ctrlgen.generation.logits.automaton.BanTables`),
  counter-keyed sampling (:mod:`~ctrlgen.generation.logits.sampling`), the EOS / length rule and the
  automaton's advance, all as tensor ops; on CUDA it is captured once per bucket as a CUDA graph;
* **banned sequences compiled off the critical path**: each request's automaton is compiled
  (:func:`~ctrlgen.generation.logits.automaton.compile_banned`, array operations) on a pool of
  ``compile_threads`` host threads, or of ``compile_processes`` worker processes (which do not share the
  engine's GIL with its decode loop), as soon as the call starts, in
  admission order; a row waits only for its own automaton when its slot comes, so later rows' automata are
  built while the device decodes;
* **prefix adapters** as cached keys/values written into the first positions of a row's cache
  (:meth:`FastEngine.add_adapter`): rows of different adapters (and of none) share one batch.

A request's text depends on its prompt, seed, banned sequences, adapter and the engine's sampling settings
only: not on the other requests, their order or the slot it lands in (tested on the CPU). The host reads
the generated tokens every ``poll_every`` steps (every step on the CPU, where it costs nothing) to apply
stop strings and refill slots; on CUDA that read is one asynchronous copy, outside the captured step.

Example:
    >>> from ctrlgen.models import tiny_llama
    >>> from ctrlgen.config import SamplingConfig
    >>> eng = FastEngine(*tiny_llama(), SamplingConfig(max_new_tokens=4, temperature=0), slots=2)
    >>> [r.new_tokens for r in eng.generate([GenerationRequest("Vital signs", seed=1)])]
    [4]
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ctrlgen.config import SamplingConfig
from ctrlgen.generation.engines.fast.adapters import prefix_kv
from ctrlgen.generation.engines.fast.kv_cache import KVCache
from ctrlgen.generation.engines.fast.scheduler import Scheduler
from ctrlgen.generation.engines.fast.step import DecoderRunner
from ctrlgen.generation.logits.automaton import BanTables, CompiledBans, compile_banned, compile_banned_arrays
from ctrlgen.generation.logits.sampling import sample_tokens
from ctrlgen.generation.types import GenerationRequest, GenerationResult

__all__ = ["FastEngine"]


def _log(msg: str) -> None:
    print(f"[ctrlgen.engine] {msg}", file=sys.stderr, flush=True)


@dataclass
class _Seq:
    """Host bookkeeping of one request (token ids only ever leave the engine as the result's text)."""

    index: int
    request: GenerationRequest
    prompt: list[int]
    limit: int
    adapter_len: int
    bans: CompiledBans | Future[CompiledBans] | None  # a future while its automaton is being compiled
    banned_key: tuple[tuple[int, ...], ...] = ()
    generated: list[int] = field(default_factory=list)
    started: float = 0.0
    steps: int = 0  # decode steps since admission (an upper bound of tokens generated)


class FastEngine:
    """See module doc.

    Args:
        model: a transformers causal LM of a supported architecture (``step.SUPPORTED_ARCHITECTURES``); a
            PEFT prefix-tuning model is taken as its base model plus that adapter, registered as ``"default"``
            and used by requests with ``adapter=None`` unless ``default_adapter=False``.
        tokenizer: its tokenizer.
        sampling: temperature, top-p, top-k, the default ``max_new_tokens``.
        slots: rows decoded together.
        max_len: cache positions per slot (None: grown to what the requests need, up to the model's limit).
        prefill_chunk: tokens per prefill chunk (fixed boundaries; also the prefix cache's granularity).
        prefix_cache_tokens: positions of prompt keys/values kept for reuse (least recently used dropped).
        kv_bucket: decode attention reads the cache up to the longest row rounded up to this.
        poll_every: decode steps between two host reads of the generated tokens (None: 1 on CPU, 8 on CUDA).
        cuda_graphs: capture the decode step on CUDA.
        compile_threads: host threads compiling the requests' banned-sequence automata (None: the CPUs this
            process may use, at most 8).
        compile_processes: worker processes compiling them instead (0: the threads). Started on first use
            (``spawn``: safe beside CUDA and threads), kept until :meth:`close`; a pool that breaks (a worker
            killed) is dropped with a log line and the compile goes on in this process.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingConfig | None = None,
        *,
        slots: int = 16,
        max_len: int | None = None,
        prefill_chunk: int = 256,
        prefix_cache_tokens: int = 4096,
        kv_bucket: int = 64,
        poll_every: int | None = None,
        cuda_graphs: bool = True,
        default_adapter: bool = True,
        compile_threads: int | None = None,
        compile_processes: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.sampling = sampling or SamplingConfig()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.max_positions = int(getattr(base.config, "max_position_embeddings", 0) or 4096)
        self.runner = DecoderRunner(model, self.max_positions)
        self.device = self.runner.device
        self.slots = int(slots)
        self.prefill_chunk = int(prefill_chunk)
        self.prefix_cache_tokens = int(prefix_cache_tokens)
        self.kv_bucket = int(kv_bucket)
        self.cuda = self.device.type == "cuda"
        self.poll_every = int(poll_every or (8 if self.cuda else 1))
        self.cuda_graphs = bool(cuda_graphs) and self.cuda
        self.eos = tokenizer.eos_token_id
        # A generated pad token (when it is not EOS) also ends a row, as in the reference engine, which cannot
        # tell it from padding.
        pad = tokenizer.pad_token_id
        self.enders = sorted({t for t in (self.eos, pad) if t is not None})
        self.adapters: dict[str, torch.Tensor] = {}
        self._prefix: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
        self._prefix_tokens = 0
        self._bans_cache: OrderedDict[tuple[tuple[int, ...], ...], CompiledBans] = OrderedDict()
        self.compile_threads = int(compile_threads or min(8, _usable_cpus()))
        self.compile_processes = int(compile_processes)
        self._compile_pool: Executor | None = None
        self._graphs: dict[tuple[int, int, bool], Any] = {}
        self._row_sampling = False  # some request of the current call has its own temperature / top_p
        self._requested_len = max_len
        self.cache: KVCache | None = None
        self.stats = {"prefill_tokens": 0, "prefill_reused": 0, "steps": 0, "graph_captures": 0}
        peft = getattr(model, "active_peft_config", None)
        if peft is not None and default_adapter:
            self.add_adapter("default", model)
        self.default_adapter = "default" if (peft is not None and default_adapter) else None
        if max_len is not None:
            self._allocate(int(max_len))

    # --- set-up -------------------------------------------------------------------------------------------
    def add_adapter(self, name: str, adapter: Any) -> None:
        """Register a prefix adapter: a PEFT prefix-tuning model (loaded on this engine's base model or a copy
        of it) or its ``[layers, 2, kv_heads, P, head_dim]`` keys/values."""
        kv = adapter if isinstance(adapter, torch.Tensor) else prefix_kv(adapter)
        r = self.runner
        want = (len(r.layers), 2, r.num_kv_heads)
        if tuple(kv.shape[:3]) != want or kv.shape[4] != r.head_dim:
            raise ValueError(f"adapter {name!r} has key/value shape {tuple(kv.shape)}, the model needs {want} + (P, "
                             f"{r.head_dim})")  # fmt: skip
        self.adapters[name] = kv.to(device=self.device, dtype=r.dtype)
        self._prefix.clear()  # a name may now mean other keys/values
        self._prefix_tokens = 0

    def _allocate(self, max_len: int) -> None:
        r = self.runner
        self.max_len = max_len
        self.cache = r.new_cache(self.slots, max_len)
        s, dev = self.slots, self.device
        self.ids = torch.zeros(s, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(s, dtype=torch.int64, device=dev)
        self.active = torch.zeros(s, dtype=torch.bool, device=dev)
        self.count = torch.zeros(s, dtype=torch.int64, device=dev)
        self.limit = torch.zeros(s, dtype=torch.int64, device=dev)
        self.seeds = torch.zeros(s, dtype=torch.int64, device=dev)
        # Each slot's sampling (a request's own temperature / top_p), read only while a call has such requests.
        self.temps = torch.full((s,), float(self.sampling.temperature), dtype=torch.float32, device=dev)
        self.top_ps = torch.full((s,), float(self.sampling.top_p), dtype=torch.float32, device=dev)
        self.out = torch.zeros((s, max(self.sampling.max_new_tokens, 1)), dtype=torch.int64, device=dev)
        self.bans = BanTables(s, r.vocab, dev)
        self._graphs.clear()

    def _ensure_capacity(self, need_len: int, need_new: int) -> None:
        cur = self.cache.max_len if self.cache is not None else 0
        out_cap = int(self.out.shape[1]) if self.cache is not None else 0
        if need_len <= cur and need_new <= out_cap:
            return
        length = max(need_len, cur)
        if self._requested_len is None:  # grow in steps of 256 positions
            length = min(self.max_positions, -(-length // 256) * 256)
        new = max(need_new, out_cap)
        self._allocate(length)
        if new > self.out.shape[1]:
            self.out = torch.zeros((self.slots, new), dtype=torch.int64, device=self.device)

    # --- requests -----------------------------------------------------------------------------------------
    def limit_of(self, request: GenerationRequest) -> int:
        return request.max_new_tokens or self.sampling.max_new_tokens

    def _compiled(
        self, banned: tuple[tuple[int, ...], ...], pending: dict[Any, Future[CompiledBans]]
    ) -> CompiledBans | Future[CompiledBans] | None:
        """The cached automaton of ``banned``, or a future of it compiling on the pool (one per distinct list
        in a call)."""
        if not banned:
            return None
        hit = self._bans_cache.get(banned)
        if hit is not None:
            self._bans_cache.move_to_end(banned)
            return hit
        fut = pending.get(banned)
        if fut is None:
            fn: Callable[..., Any] = compile_banned_arrays if self.compile_processes else compile_banned
            try:
                fut = self._pool().submit(fn, banned, self.runner.vocab)
            except BrokenExecutor:  # a worker died since the last call
                self._drop_processes()
                fut = self._pool().submit(compile_banned, banned, self.runner.vocab)
            pending[banned] = fut
        return fut

    def _pool(self) -> Executor:
        if self._compile_pool is None:
            self._compile_pool = (
                ProcessPoolExecutor(self.compile_processes, mp_context=multiprocessing.get_context("spawn"))
                if self.compile_processes
                else ThreadPoolExecutor(self.compile_threads, thread_name_prefix="ctrlgen-bans")
            )
        return self._compile_pool

    def _drop_processes(self) -> None:
        """The compile processes broke: log it once, compile on threads from now on."""
        if self.compile_processes:
            _log("the automaton compile processes stopped (a worker died): compiling in this process from now on")
            self.compile_processes = 0
            self.close()

    def compiled_now(self, banned: Sequence[Sequence[int]]) -> CompiledBans | None:
        """The automaton of ``banned``, compiled (or taken from the cache) before returning.

        Raises:
            ValueError: a token id outside the vocabulary.
        """
        key = tuple(tuple(s) for s in banned)
        return self._resolve(key, self._compiled(key, {}))

    def _resolve(
        self, key: tuple[tuple[int, ...], ...], bans: CompiledBans | Future[CompiledBans] | None
    ) -> CompiledBans | None:
        """Wait for a compiling automaton (cached from then on); ValueError if its list is invalid."""
        if not isinstance(bans, Future):
            return bans
        try:
            got = bans.result()
        except BrokenExecutor:
            self._drop_processes()
            got = compile_banned(key, self.runner.vocab)
        if isinstance(got, dict):  # from a worker process
            got = CompiledBans.from_arrays(got)
        self._bans_cache[key] = got
        self._bans_cache.move_to_end(key)
        while len(self._bans_cache) > 512:
            self._bans_cache.popitem(last=False)
        return got

    def close(self) -> None:
        """Stop the compile pool's threads or processes (a later call starts it again)."""
        pool, self._compile_pool = self._compile_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        if getattr(self, "_compile_pool", None) is not None:
            self.close()

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request; results in request order."""
        results: list[GenerationResult | None] = [None] * len(requests)
        self._row_sampling = any(r.temperature is not None or r.top_p is not None for r in requests)
        enc = self.tokenizer([r.prompt for r in requests], add_special_tokens=False)["input_ids"] if requests else []
        seqs: list[_Seq] = []
        pending: dict[Any, Future[CompiledBans]] = {}
        for i, (req, ids) in enumerate(zip(requests, enc, strict=True)):
            limit = self.limit_of(req)
            name = req.adapter if req.adapter is not None else self.default_adapter
            if name is not None and name not in self.adapters:
                results[i] = GenerationResult("", finish="error", error=f"unknown adapter {name!r}")
                continue
            p_len = int(self.adapters[name].shape[3]) if name is not None else 0
            if not ids:
                results[i] = GenerationResult("", finish="error", error="empty prompt")
            elif p_len + len(ids) + limit > self.max_positions:
                results[i] = GenerationResult(
                    "", finish="error",
                    error=f"prompt of {len(ids)} tokens + {limit} new tokens exceeds the model's "
                    f"{self.max_positions} positions",
                )  # fmt: skip
            else:
                key = tuple(tuple(s) for s in req.banned)
                seq = _Seq(i, req, list(ids), limit, p_len, self._compiled(key, pending), key)
                seq.request = req if req.adapter == name else _with_adapter(req, name)
                seqs.append(seq)
        if seqs:
            self._ensure_capacity(
                max(s.adapter_len + len(s.prompt) + s.limit for s in seqs), max(s.limit for s in seqs)
            )
            for seq, res in self._run(seqs):
                results[seq.index] = res
        return [r if r is not None else GenerationResult("", finish="error", error="not generated") for r in results]

    # --- the loop -----------------------------------------------------------------------------------------
    def _run(self, seqs: list[_Seq]) -> list[tuple[_Seq, GenerationResult]]:
        sched: Scheduler[_Seq] = Scheduler(self.slots)
        for s in seqs:
            sched.add(s)
        done: list[tuple[_Seq, GenerationResult]] = []
        self.active.zero_()
        since_poll = 0
        while sched.busy:
            for slot, seq in sched.admit():
                try:
                    seq.bans = self._resolve(seq.banned_key, seq.bans)
                except ValueError as exc:  # its banned list is invalid: an error result, the slot to the next
                    done.append((sched.release(slot), GenerationResult("", finish="error", error=str(exc))))
                    continue
                self._admit(slot, seq)
            if not sched.running:
                continue
            kv_len = self._kv_len(sched.running)
            self._step(kv_len)
            for seq in sched.running.values():
                seq.steps += 1
            since_poll += 1
            if since_poll >= self.poll_every or any(s.steps >= s.limit for s in sched.running.values()):
                since_poll = 0
                for slot, res in self._poll(sched.running):
                    done.append((sched.release(slot), res))
        return done

    def _kv_len(self, running: dict[int, _Seq]) -> int:
        need = max(s.adapter_len + len(s.prompt) + s.steps for s in running.values())  # positions after this step
        return min(self.max_len, -(-need // self.kv_bucket) * self.kv_bucket)

    def _admit(self, slot: int, seq: _Seq) -> None:
        """Prefill ``seq`` into ``slot`` (reusing cached chunks) and arm the slot's device state."""
        assert self.cache is not None
        seq.started = time.perf_counter()
        name = seq.request.adapter
        p_len = seq.adapter_len
        if name is not None:
            self.cache.write(slot, 0, self.adapters[name])
        body = seq.prompt[:-1]  # the last prompt token is the first decode step's input
        c = self.prefill_chunk
        for a in range(0, len(body), c):
            b = min(a + c, len(body))
            key = (name, tuple(body[:b]))
            block = self._prefix.get(key)
            if block is not None:
                self._prefix.move_to_end(key)
                self.cache.write(slot, p_len + a, block)
                self.stats["prefill_reused"] += b - a
                continue
            self.runner.prefill(self.cache, slot, torch.tensor(body[a:b], dtype=torch.int64), p_len + a)
            self.stats["prefill_tokens"] += b - a
            if self.prefix_cache_tokens > 0:
                self._prefix[key] = self.cache.read(slot, p_len + a, p_len + b)
                self._prefix_tokens += b - a
                while self._prefix_tokens > self.prefix_cache_tokens and self._prefix:
                    _, old = self._prefix.popitem(last=False)
                    self._prefix_tokens -= int(old.shape[3])
        self.ids[slot] = seq.prompt[-1]
        self.pos[slot] = p_len + len(seq.prompt) - 1
        self.count[slot] = 0
        self.limit[slot] = seq.limit
        self.seeds[slot] = int(seq.request.seed) % (1 << 63)
        if self._row_sampling:
            req = seq.request
            self.temps[slot] = self.sampling.temperature if req.temperature is None else req.temperature
            self.top_ps[slot] = self.sampling.top_p if req.top_p is None else req.top_p
        self.active[slot] = True
        assert not isinstance(seq.bans, Future), "admitted before its automaton was resolved"
        self.bans.load(slot, seq.bans, seq.prompt)

    def _step(self, kv_len: int) -> None:
        self.stats["steps"] += 1
        if not self.cuda_graphs:
            self._step_body(kv_len)
            return
        key = (kv_len, self.bans.version, self._row_sampling)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(kv_len)
            self._graphs[key] = graph
        graph.replay()

    def _capture(self, kv_len: int) -> Any:
        """The decode step for ``kv_len`` as a CUDA graph (its state tensors are the engine's own buffers).

        Warm-up runs on a side stream mutate the state like a real step would, so the state is saved and
        restored around them."""
        saved = [t.clone() for t in self._state_tensors()]
        cache_saved = self.cache.data.clone() if self.cache is not None else None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step_body(kv_len)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step_body(kv_len)
        for t, s in zip(self._state_tensors(), saved, strict=True):
            t.copy_(s)
        if cache_saved is not None and self.cache is not None:
            self.cache.data.copy_(cache_saved)
        self.stats["graph_captures"] += 1
        return graph

    def _state_tensors(self) -> list[torch.Tensor]:
        return [self.ids, self.pos, self.active, self.count, self.out, self.bans.state]

    def _step_body(self, kv_len: int) -> None:
        """One decode step for every slot, tensors only (no host reads): see module doc."""
        assert self.cache is not None
        logits = self.runner.decode(self.cache, self.ids, self.pos, kv_len)  # [slots, vocab] float32
        if self.bans.any_rows:
            self.bans.apply(logits)
        s = self.sampling
        temperature: float | torch.Tensor = self.temps if self._row_sampling else s.temperature
        top_p: float | torch.Tensor = self.top_ps if self._row_sampling else s.top_p
        tok = sample_tokens(logits, self.seeds, self.count, temperature=temperature, top_p=top_p,
                            top_k=getattr(s, "top_k", 0), candidates=0 if self.cuda else 256)  # fmt: skip
        act = self.active
        rows = torch.arange(self.slots, device=self.device)
        at = self.count.clamp(max=self.out.shape[1] - 1)
        self.out[rows, at] = torch.where(act, tok, self.out[rows, at])
        self.count.add_(act.long())
        self.bans.advance(tok, act)
        ended = self.count >= self.limit
        for t in self.enders:
            ended = ended | (tok == t)
        self.pos.copy_(torch.where(act, (self.pos + 1).clamp(max=self.max_len - 1), self.pos))
        self.ids.copy_(torch.where(act, tok, self.ids))
        self.active.copy_(act & ~ended)

    # --- host side ----------------------------------------------------------------------------------------
    def _poll(self, running: dict[int, _Seq]) -> list[tuple[int, GenerationResult]]:
        """Read the generated tokens; finish rows that ended on the device or hit a stop string."""
        if self.cuda:
            host = torch.empty((self.slots, self.out.shape[1] + 2), dtype=torch.int64, pin_memory=True)
            host.copy_(torch.cat([self.out, self.count[:, None], self.active[:, None].long()], 1), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            ev.synchronize()
            rows = host.tolist()
        else:
            rows = torch.cat([self.out, self.count[:, None], self.active[:, None].long()], 1).tolist()
        finished = []
        stop_now = []
        for slot, seq in running.items():
            row = rows[slot]
            n, alive = row[-2], row[-1]
            seq.generated = row[:n]
            seq.steps = n if not alive else seq.steps
            reason = None
            if not alive:
                last = seq.generated[-1] if n else None
                reason = "eos" if last == self.eos else "pad" if last in self.enders else "length"
            if seq.request.stop and n:
                point = self._stop_point(seq)
                if point is not None:  # the tokens after the stop are dropped (generated while the host looked away)
                    seq.generated = seq.generated[:point]
                    reason = "stop"
                    if alive:
                        stop_now.append(slot)
            if reason is not None:
                finished.append((slot, self._result(seq, reason)))
        if stop_now:
            self.active[torch.tensor(stop_now, device=self.device)] = False
        return finished

    def _stop_in(self, seq: _Seq, ids: list[int]) -> bool:
        """Whether a stop string ends inside the text of ``ids`` (generated tokens), counting one that began in
        the prompt's last characters (as transformers' stop strings see it)."""
        longest = max(len(s) for s in seq.request.stop)
        ctx = seq.prompt[-longest:]
        head = len(self.tokenizer.decode(ctx, skip_special_tokens=True))
        text = self.tokenizer.decode(ctx + ids, skip_special_tokens=True)
        return any(text.find(s, max(0, head - len(s) + 1)) >= 0 for s in seq.request.stop)

    def _stop_point(self, seq: _Seq) -> int | None:
        """The fewest generated tokens after which a stop string has ended (None: none has)."""
        ids = seq.generated
        longest = max(len(s) for s in seq.request.stop)
        window = ids[-(longest + 8 + self.poll_every) :]
        if len(window) < len(ids):  # a cheap look at the recent tokens first (earlier polls saw the rest)
            text = self.tokenizer.decode(window, skip_special_tokens=True)
            if not any(s in text for s in seq.request.stop):
                return None
        if not self._stop_in(seq, ids):
            return None
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._stop_in(seq, ids[:mid]):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def _result(self, seq: _Seq, reason: str) -> GenerationResult:
        ids = seq.generated[: seq.limit]
        if reason in ("eos", "pad"):
            ids = ids[:-1]
            reason = "eos" if reason == "eos" else "stop"  # the reference engine's names
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in seq.request.stop if s in text), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop"
        elif reason == "length" and len(ids) < seq.limit:
            reason = "stop"  # a stop string that began in the prompt's last characters
        return GenerationResult(text.strip(), len(ids), reason, None, time.perf_counter() - seq.started, tuple(ids))


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS reports one, as Linux does)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _with_adapter(req: GenerationRequest, name: str | None) -> GenerationRequest:
    import dataclasses

    return dataclasses.replace(req, adapter=name)
