"""Utility of a synthetic set: downstream perplexity and MAUVE (METHOD.md section 6).

* **Downstream perplexity**: a fresh copy of the base model is fine-tuned (all
  weights, AdamW) on the synthetic texts, then its perplexity is measured on the
  real held-out test texts: ``exp(sum NLL / tokens)`` over all predicted tokens of
  all test texts (each cut at ``max_tokens``). Lower = the synthetic set taught
  the model more about the real distribution.
* **MAUVE** between the generated texts and real test texts, on sentence-embedding
  features (the offline all-MiniLM-L6-v2): ``mauve.compute_mauve(p_features=...,
  q_features=...)``, never raw text. Higher = closer to real text.
* **Downstream classification** (:func:`category_f1`; train on synthetic, test on real): one
  TF-IDF + logistic-regression classifier per entity category learns from the released
  texts whether a note mentions that kind of entity (the label every corpus has: the
  control code's category set), then predicts it on real test notes; macro-F1 over the
  categories present in the real labels. Higher = the released set teaches more.

Example:
    >>> import math
    >>> perplexity_from(2 * math.log(3.0), 2)
    3.0
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "category_f1",
    "finetune_lm",
    "mauve_score",
    "perplexity",
    "perplexity_from",
    "sequence_nll",
    "text_features",
]


def perplexity_from(total_nll: float, tokens: int) -> float:
    return math.exp(total_nll / tokens) if tokens else float("nan")


def _encode(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> list[list[int]]:
    ids = []
    for t in texts:
        x = tokenizer(t, add_special_tokens=True, truncation=True, max_length=max_tokens)["input_ids"]
        ids.append(list(x))
    return ids


def _batch(ids: Sequence[list[int]], pad: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(x) for x in ids)
    inp = torch.full((len(ids), width), pad, dtype=torch.long)
    att = torch.zeros((len(ids), width), dtype=torch.long)
    lab = torch.full((len(ids), width), -100, dtype=torch.long)
    for i, x in enumerate(ids):
        inp[i, : len(x)] = torch.tensor(x)
        att[i, : len(x)] = 1
        lab[i, : len(x)] = torch.tensor(x)
    return inp, att, lab


def sequence_nll(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    max_tokens: int = 512,
    batch_size: int = 8,
    prompts: Sequence[str] | None = None,
    share_prompt: bool = True,
) -> list[tuple[float, int]]:
    """Per text: (sum of token NLLs, predicted tokens) under ``model`` (right padding, no grad).

    With ``prompts`` (one per text), each text is scored as the continuation of its prompt: the prompt's
    tokens condition the text but are not counted (e.g. a canary after the control-code prompt it was
    trained behind). With ``share_prompt`` (the default), each distinct prompt runs through the model once
    and its keys/values are copied to the rows that continue it (:func:`_continuation_nll`): canary exposure
    scores hundreds of short candidates behind one long prompt. The sums equal the full-sequence pass up to
    float rounding (tested).
    """
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if prompts is None:
        ids = _encode(tokenizer, texts, max_tokens)
        skip = [0] * len(ids)
    else:
        if len(prompts) != len(texts):
            raise ValueError(f"{len(prompts)} prompts for {len(texts)} texts")
        distinct = list(dict.fromkeys(prompts))
        encoded = dict(zip(distinct, _encode(tokenizer, distinct, max_tokens), strict=True))
        heads = [encoded[p] for p in prompts]
        tails = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        ids = [(h + list(t))[:max_tokens] for h, t in zip(heads, tails, strict=True)]
        skip = [len(h) for h in heads]
        if share_prompt and all(skip):
            return _continuation_nll(model, ids, skip, prompts, pad, batch_size)
    out: list[tuple[float, int]] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(ids), batch_size):
            inp, att, lab = _batch(ids[i : i + batch_size], pad)
            for row, n in enumerate(skip[i : i + batch_size]):
                lab[row, :n] = -100  # the prompt conditions, it is not scored
            inp, att, lab = inp.to(model.device), att.to(model.device), lab.to(model.device)
            logits = model(input_ids=inp, attention_mask=att).logits[:, -inp.shape[1] :, :].float()
            target = lab[:, 1:]
            lp = torch.log_softmax(logits[:, :-1, :], dim=-1)
            mask = target != -100
            tok = lp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
            for row in range(inp.shape[0]):
                out.append((float(-tok[row].sum()), int(mask[row].sum())))
    model.train(was_training)
    return out


def _continuation_nll(
    model: Any, ids: list[list[int]], skip: list[int], prompts: Sequence[str], pad: int, batch_size: int
) -> list[tuple[float, int]]:
    """:func:`sequence_nll` of prompted texts with one forward pass per distinct prompt.

    The prompt pass returns the cache (for a PEFT prefix model, its virtual tokens' keys/values too) and the
    logits of the prompt's last token, which predict the continuation's first token; the continuations then
    run in batches of ``batch_size`` over copies of that cache (right padding: pads come after every scored
    token, so they change nothing)."""
    import copy

    import torch

    peft = getattr(model, "active_peft_config", None)
    prompt_learning = peft is not None and getattr(peft, "is_prompt_learning", False)
    # Behind a filled cache, a prefix model is its base model (as in PEFT's own generate()).
    tail_model = model.get_base_model() if prompt_learning else model
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p, []).append(i)
    out: list[tuple[float, int] | None] = [None] * len(ids)
    was_training = model.training
    model.eval()
    device = model.device
    with torch.no_grad():
        for idx in groups.values():
            head = ids[idx[0]][: skip[idx[0]]]
            res = model(input_ids=torch.tensor([head], device=device), use_cache=True)
            cache, first = res.past_key_values, torch.log_softmax(res.logits[0, -1].float(), dim=-1)
            past = cache.get_seq_length()
            for s in range(0, len(idx), batch_size):
                chunk = idx[s : s + batch_size]
                tails = [ids[i][skip[i] :] for i in chunk]
                width = max(len(t) for t in tails)
                if width == 0:
                    out_rows = [(0.0, 0)] * len(chunk)
                else:
                    inp = torch.full((len(chunk), width), pad, dtype=torch.long)
                    att = torch.zeros((len(chunk), past + width), dtype=torch.long)
                    att[:, :past] = 1
                    for r, t in enumerate(tails):
                        inp[r, : len(t)] = torch.tensor(t, dtype=torch.long)
                        att[r, past : past + len(t)] = 1
                    rows_cache = copy.deepcopy(cache)
                    rows_cache.batch_select_indices(torch.zeros(len(chunk), dtype=torch.long, device=device))
                    logits = tail_model(
                        input_ids=inp.to(device), attention_mask=att.to(device), past_key_values=rows_cache
                    ).logits.float()
                    lp = torch.log_softmax(logits[:, :-1, :], dim=-1)
                    out_rows = []
                    for r, t in enumerate(tails):
                        if not t:
                            out_rows.append((0.0, 0))
                            continue
                        tt = torch.tensor(t, device=device)
                        total = -first[tt[0]]
                        if len(t) > 1:
                            total = total - lp[r, : len(t) - 1].gather(-1, tt[1:].unsqueeze(-1)).sum()
                        out_rows.append((float(total), len(t)))
                for i, row in zip(chunk, out_rows, strict=True):
                    out[i] = row
    model.train(was_training)
    return [r for r in out if r is not None]


def perplexity(model: Any, tokenizer: Any, texts: Sequence[str], max_tokens: int = 512, batch_size: int = 8) -> float:
    """Corpus perplexity: exp(total NLL / total predicted tokens)."""
    per = sequence_nll(model, tokenizer, texts, max_tokens, batch_size)
    return perplexity_from(sum(n for n, _ in per), sum(t for _, t in per))


def finetune_lm(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    epochs: int = 1,
    learning_rate: float = 5e-5,
    batch_size: int = 4,
    max_tokens: int = 256,
    seed: int = 0,
    autocast: str | None = None,
) -> list[float]:
    """Full fine-tuning (causal LM loss, AdamW) in place; returns the loss of every step.

    ``autocast`` (e.g. ``"bfloat16"``): each step's forward and loss run under ``torch.autocast`` in that dtype
    (mixed precision: weights and AdamW state stay float32). The context is entered per step, as PyTorch
    prescribes: its cache of low-precision weight casts lives as long as the context, so one context around
    the whole loop would run every forward on the weights as they were before the first step.
    """
    import contextlib

    import torch

    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no non-empty texts to fine-tune on")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = _encode(tokenizer, texts, max_tokens)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    model.train()
    losses = []
    order = list(range(len(ids)))
    for epoch in range(epochs):
        random.Random(f"{seed}\x1f{epoch}").shuffle(order)
        for i in range(0, len(order), batch_size):
            inp, att, lab = (t.to(model.device) for t in _batch([ids[j] for j in order[i : i + batch_size]], pad))
            with torch.autocast(model.device.type, dtype=getattr(torch, autocast)) if autocast else \
                    contextlib.nullcontext():  # fmt: skip
                loss = model(input_ids=inp, attention_mask=att, labels=lab).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    return losses


def text_features(encoder: Any, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """Sentence-embedding features (one row per text) from a sentence-transformers encoder."""
    feats = encoder.encode(list(texts), batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
    return np.asarray(feats, dtype=np.float32)


def mauve_score(p_features: np.ndarray, q_features: np.ndarray, seed: int = 0, num_buckets: int | None = None) -> float:
    """MAUVE of generated (p) vs real (q) features; ``num_buckets`` defaults to mauve's n/10 (at least 2)."""
    import mauve

    if len(p_features) < 2 or len(q_features) < 2:
        raise ValueError(f"MAUVE needs at least 2 texts per side; got {len(p_features)} and {len(q_features)}")
    buckets = num_buckets or max(2, min(len(p_features), len(q_features)) // 10)
    out = mauve.compute_mauve(
        p_features=p_features, q_features=q_features, num_buckets=buckets, seed=seed, verbose=False
    )
    return float(out.mauve)


def category_f1(
    train_texts: Sequence[str],
    train_labels: Sequence[set[str]],
    test_texts: Sequence[str],
    test_labels: Sequence[set[str]],
) -> float | None:
    """Macro-F1 on real notes of per-category classifiers trained on released notes (None: nothing to score).

    A category whose training labels are all one value gets that constant prediction (a
    released set where every note has a PERSON teaches nothing about notes without one).
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score

    if len(train_texts) != len(train_labels) or len(test_texts) != len(test_labels):
        raise ValueError("texts and labels differ in length")
    categories = sorted(set().union(*test_labels)) if test_labels else []
    if not train_texts or not categories:
        return None
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    x_train = vec.fit_transform(list(train_texts))
    x_test = vec.transform(list(test_texts))
    scores = []
    for cat in categories:
        y = np.array([cat in lab for lab in train_labels])
        truth = np.array([cat in lab for lab in test_labels])
        if y.all() or not y.any():
            pred = np.full(len(test_texts), bool(y[0]))
        else:
            pred = LogisticRegression(max_iter=1000, class_weight="balanced").fit(x_train, y).predict(x_test)
        scores.append(f1_score(truth, pred, zero_division=0.0))
    return float(np.mean(scores))
