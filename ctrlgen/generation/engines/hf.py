"""The reference engine: transformers' ``generate`` with per-row banned sequences and per-row seeds.

:class:`HFEngine` sorts the requests by prompt length, runs them ``batch_size`` at
a time with left padding and attention masks, and applies two logits processors:
:class:`~ctrlgen.generation.blocking.RowBannedTokens` (each row's banned
sequences) and :class:`RowSampler`, which draws each row's token from its own
``torch.Generator`` seeded by the request, so an output depends on its request
and seed, not on which other prompts share the batch (up to floating-point
differences that padding can cause in batched matmuls). Generation stops at the
request's stop strings (the text is cut before them), at EOS, or after
``max_new_tokens``. Prefix adapters are PEFT models given by name (``adapters``);
a request's ``adapter`` picks one, and rows are grouped per adapter.

It is kept simple and slow on purpose: the fast engine
(:class:`~ctrlgen.generation.engines.fast.engine.FastEngine`) is tested against it.

Example:
    >>> from ctrlgen.models import tiny_llama
    >>> from ctrlgen.config import SamplingConfig
    >>> engine = HFEngine(*tiny_llama(), SamplingConfig(max_new_tokens=4, temperature=0))
    >>> [r.new_tokens for r in engine.generate([GenerationRequest("Vital signs", seed=1)])]
    [4]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ctrlgen.config import SamplingConfig
from ctrlgen.generation.blocking import RowBannedTokens
from ctrlgen.generation.types import GenerationRequest, GenerationResult

__all__ = ["HFEngine", "RowSampler"]


class RowSampler:
    """Logits processor that samples each row's next token with its own generator.

    It returns scores that are ``-inf`` everywhere except the drawn token, so the
    greedy step of ``generate`` picks it. Temperature 0 means argmax (plain greedy).
    The generators live on the logits' device (made at the first step), so a GPU step
    draws on the GPU; the only host sync per step reads two flags per row (all banned; nucleus among the
    top :attr:`TOP_K` tokens).
    A seed gives the same tokens on the same kind of device (CPU and CUDA streams differ).
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, top_k: int = 0) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.seeds = [int(s) % (2**63) for s in seeds]
        self.generators: list[torch.Generator] = []

    def _generators(self, device: torch.device) -> list[torch.Generator]:
        if not self.generators or self.generators[0].device != device:
            self.generators = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        return self.generators

    #: Candidates taken with ``topk`` before top-p: a full sort of the vocabulary was most of the sampler's time.
    TOP_K = 256

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0:
            return scores
        logits = scores.float() / self.temperature  # [batch, vocab]
        if 0 < self.top_k < logits.shape[-1]:  # tokens less likely than the k-th are out (ties with it stay)
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        norm = torch.logsumexp(logits, dim=-1, keepdim=True)  # probabilities over the whole vocabulary
        if self.top_p >= 1.0:  # no nucleus: the whole vocabulary, sorted (the draws of earlier versions)
            top_logits, top_idx = torch.sort(logits, descending=True, dim=-1)
        else:
            top_logits, top_idx = torch.topk(logits, min(self.TOP_K, logits.shape[-1]), dim=-1)  # descending
        probs = torch.exp(top_logits - norm)
        # A row whose top k hold top_p of the mass has its whole nucleus among them: sampling there is exact.
        # Other rows sort their whole vocabulary. The choice is the row's own, never its batch companions'.
        covered = probs.sum(-1) >= self.top_p
        finite = torch.isfinite(norm[:, 0])  # rows with every token banned keep the argmax: the caller sees them
        flags = torch.stack([covered | (self.top_p >= 1.0), finite]).tolist()  # the step's one host sync
        chosen = top_idx[:, 0].clone()  # the argmax
        gens = self._generators(scores.device)
        for b in range(logits.shape[0]):
            if not flags[1][b]:
                continue
            if flags[0][b]:
                p, idx = probs[b], top_idx[b]
            else:
                srt, idx = torch.sort(logits[b], descending=True)
                p = torch.exp(srt - norm[b])
            if self.top_p < 1.0:  # keep the smallest prefix whose mass reaches top_p (always at least one token)
                p = p.masked_fill((torch.cumsum(p, dim=-1) - p) >= self.top_p, 0.0)
            chosen[b] = idx[torch.multinomial(p, 1, generator=gens[b])[0]]
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(scores.shape[0], device=scores.device), chosen] = 0.0
        return out


class _RowLimits:
    """Stopping criterion: a row is done once it has its own ``max_new_tokens`` (the batch runs to the longest)."""

    def __init__(self, prompt_len: int, limits: Sequence[int]) -> None:
        self.prompt_len = prompt_len
        self.limits = torch.tensor(limits)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.limits.device != input_ids.device:
            self.limits = self.limits.to(input_ids.device)  # once
        return (input_ids.shape[1] - self.prompt_len) >= self.limits  # [batch]


@dataclass
class HFEngine:
    """:class:`GenerationEngine` over a transformers causal LM (any ``generate``-capable model)."""

    model: Any
    tokenizer: Any
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    batch_size: int = 8
    #: Rows of a batch with the same prompt (ICL with and without blocking for one target, n outputs of one
    #: request) share one prefill: the prompt's keys/values are computed once and copied to each row.
    share_prefill: bool = True
    #: transformers' ``cache_implementation`` for ``generate`` (None: its dynamic cache; "static": preallocated).
    cache_implementation: str | None = None
    #: Attention implementation of the decoding steps, the prompt's prefill keeping the model's own (None: the
    #: model's own throughout). Measured on this CPU (docs/benchmarks.md, generation
    #: speed): eager decoding was 0.83x of SDPA, so the default is None. The switch is made on the (possibly
    #: shared) model for the length of a batch: engines sharing a model generate one at a time.
    decode_attention: str | None = None
    #: Prefix adapters by name: PEFT prefix-tuning models (requests name one with ``adapter``).
    adapters: dict[str, Any] = field(default_factory=dict)

    def add_adapter(self, name: str, adapter: Any) -> None:
        """Register a PEFT prefix-tuning model under ``name``."""
        self.adapters[name] = adapter
        self._subs.pop(name, None)

    def _sub(self, name: str) -> HFEngine:
        if name not in self._subs:
            self._subs[name] = HFEngine(self.adapters[name], self.tokenizer, self.sampling, self.batch_size,
                                        self.share_prefill, self.cache_implementation, self.decode_attention)  # fmt: skip
        return self._subs[name]

    def __post_init__(self) -> None:
        self._subs: dict[str, HFEngine] = {}
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        peft = getattr(self.model, "active_peft_config", None)
        if peft is not None and getattr(peft, "is_prompt_learning", False):
            # PEFT prompt learning puts its virtual tokens into the cache inside its own generate(): a cache
            # prefilled here would hold them too and shift every position, so a prefix model prefills per row.
            self.share_prefill = False
        self._base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        if self.decode_attention == self._base.config._attn_implementation:
            self.decode_attention = None

    def limit(self, request: GenerationRequest) -> int:
        """New tokens allowed for ``request``."""
        return request.max_new_tokens or self.sampling.max_new_tokens

    def _prompt_lengths(self, requests: Sequence[GenerationRequest]) -> list[int]:
        enc = self.tokenizer([r.prompt for r in requests], add_special_tokens=False)
        return [len(ids) for ids in enc["input_ids"]]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        results: list[GenerationResult | None] = [None] * len(requests)
        named = sorted({r.adapter for r in requests if r.adapter is not None})
        if named:  # one sub-engine per adapter, the rest here
            for name in named:
                idx = [i for i, r in enumerate(requests) if r.adapter == name]
                if name not in self.adapters:
                    for i in idx:
                        results[i] = GenerationResult("", finish="error", error=f"unknown adapter {name!r}")
                    continue
                plain = [dataclasses.replace(requests[i], adapter=None) for i in idx]  # the sub-engine's own model
                for i, res in zip(idx, self._sub(name).generate(plain), strict=True):
                    results[i] = res
            own = [i for i, r in enumerate(requests) if r.adapter is None]
            for i, res in zip(own, self.generate([requests[i] for i in own]), strict=True):
                results[i] = res
            return [r for r in results if r is not None]
        lengths = self._prompt_lengths(requests)
        todo = []
        for i, n in enumerate(lengths):
            limit = self.limit(requests[i])
            if n == 0:
                results[i] = GenerationResult("", finish="error", error="empty prompt")
            elif self.max_positions and n + limit > self.max_positions:
                results[i] = GenerationResult(
                    "",
                    finish="error",
                    error=f"prompt of {n} tokens + {limit} new tokens exceeds the model's {self.max_positions} positions",
                )
            else:
                todo.append(i)
        # Batches of one sampling setting each (a request's own temperature / top_p, else the engine's).
        groups: dict[tuple[float, float], list[int]] = {}
        for i in todo:
            r = requests[i]
            t = self.sampling.temperature if r.temperature is None else r.temperature
            groups.setdefault((t, self.sampling.top_p if r.top_p is None else r.top_p), []).append(i)
        for (temperature, top_p), members in groups.items():
            members.sort(key=lambda i: (lengths[i], requests[i].prompt))  # same prompts side by side: one prefill
            for start in range(0, len(members), self.batch_size):
                idx = members[start : start + self.batch_size]
                out = self._generate_batch([requests[i] for i in idx], temperature, top_p)
                for i, res in zip(idx, out, strict=True):
                    results[i] = res
        return [r for r in results if r is not None]

    @contextmanager
    def _decoding_attention(self) -> Iterator[None]:
        """The model runs with :attr:`decode_attention` inside (None: unchanged)."""
        if self.decode_attention is None:
            yield
            return
        own = self._base.config._attn_implementation
        self._base.set_attn_implementation(self.decode_attention)
        try:
            yield
        finally:
            self._base.set_attn_implementation(own)

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> Any:
        """The keys/values of each distinct prompt but its last token (positions as ``generate`` computes them
        from the attention mask), copied to the batch rows that use it; ``generate`` then feeds only the last
        prompt token before sampling."""
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True).past_key_values
        cache.batch_select_indices(rows)
        return cache

    @torch.inference_mode()
    def _generate_batch(
        self, batch: Sequence[GenerationRequest], temperature: float, top_p: float
    ) -> list[GenerationResult]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        t0 = time.perf_counter()
        tok = self.tokenizer
        device = self.model.device
        prompts = [r.prompt for r in batch]
        distinct = {p: i for i, p in enumerate(dict.fromkeys(prompts))}  # prompt -> its row in the encoding
        enc = tok(list(distinct), return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        extra: dict[str, Any] = {}
        # Prefill here (the model's attention, one row per distinct prompt) when prompts repeat or when the
        # decoding steps use another attention implementation; generate() then decodes from that cache.
        if len(distinct) < len(batch) or (self.decode_attention and self.share_prefill):
            rows = torch.tensor([distinct[p] for p in prompts], device=device)
            if self.share_prefill and enc["input_ids"].shape[1] > 1:
                extra["past_key_values"] = self._prefill(enc["input_ids"][:, :-1], enc["attention_mask"][:, :-1], rows)
            enc = {k: v.index_select(0, rows) for k, v in enc.items()}
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        processors: list[Any] = []
        if any(r.banned for r in batch):
            # In place: generate() is not asked for raw logits here, so nothing else holds the scores.
            processors.append(RowBannedTokens([r.banned for r in batch], vocab, device, inplace=True))
        processors.append(RowSampler([r.seed for r in batch], temperature, top_p, self.sampling.top_k))
        stops = sorted({s for r in batch for s in r.stop})
        limits = [self.limit(r) for r in batch]
        gen_cfg = GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            stop_strings=stops or None,
            cache_implementation=self.cache_implementation if "past_key_values" not in extra else None,
        )
        criteria = StoppingCriteriaList()
        if len(set(limits)) > 1:
            criteria.append(_RowLimits(enc["input_ids"].shape[1], limits))
        with self._decoding_attention():
            out = self.model.generate(
                **enc,
                generation_config=gen_cfg,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=criteria,
                tokenizer=tok if stops else None,
                **extra,
            )
        new = out[:, enc["input_ids"].shape[1] :]  # [batch, new]
        seconds = (time.perf_counter() - t0) / len(batch)
        results = []
        for r, ids, limit in zip(batch, new.tolist(), limits, strict=True):
            finish = "length"
            ids = ids[:limit]
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id)]
                finish = "eos"
            if tok.pad_token_id in ids:  # rows that stopped early are padded to the batch's length
                ids = ids[: ids.index(tok.pad_token_id)]
            text = tok.decode(ids, skip_special_tokens=True)
            cut = min((text.find(s) for s in r.stop if s in text), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
            elif finish == "length" and len(ids) < limit:
                finish = "stop"  # a stop string that began in the prompt's last characters
            results.append(GenerationResult(text.strip(), len(ids), finish, None, seconds, tuple(ids)))
        return results
