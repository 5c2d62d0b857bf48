"""Per-row hard token blocking on the device: each row's banned sequences as an Aho-Corasick automaton.

Semantics are those of transformers' ``bad_words_ids`` (``NoBadWordsLogitsProcessor``) and of
:class:`~ctrlgen.generation.blocking.RowBannedTokens` (the reference): a banned sequence ``s`` bans its last
token when the row's last ``len(s) - 1`` tokens (prompt included) equal ``s[:-1]``; a one-token sequence bans
its token at every step.

:func:`compile_banned` builds, on the host and once per distinct list, a trie of the sequences with failure
links, with array operations (NumPy) rather than a Python loop over sequences (3x faster on a row of 1,000
values, ~8,000-18,000 sequences: docs/benchmarks.md, "Generation engine: row admission"). Trie nodes are the
sequences' distinct proper prefixes, found by a 64-bit polynomial hash of each prefix and checked token by
token; a hash collision falls back to the loop, :func:`compile_banned_reference`, so the result is always
exact. The automaton's state after a row's history is the longest suffix of that history that is a trie
node; the suffixes of the history that are trie nodes are exactly the state's failure chain, so the tokens
banned next are the *terminal* children of the nodes on that chain. They are precomputed per node:

* the root's (one-token sequences) are a fixed ``[vocab]`` mask of the row;
* the others are a short list per node (CSR: ``ban_off``, ``ban_tok``).

:class:`BanTables` holds every slot's tables as padded tensors; each decode step :meth:`BanTables.apply`
masks the banned tokens with one gather and one scatter, and :meth:`BanTables.advance` moves every row's
state on the device (its failure chain gathered, then one batched ``searchsorted`` of every link's edge over
the slot's sorted edge keys). There is no cap on sequences per row and no host sync per step; the cost per step does
not depend on how many sequences a row bans.

Example:
    >>> import torch
    >>> tabs = BanTables(slots=2, vocab=8, device="cpu")
    >>> tabs.load(0, compile_banned([[5], [1, 2]], 8), initial_state_of=[0, 1])
    >>> tabs.load(1, compile_banned([[3, 4]], 8), initial_state_of=[0, 3])
    >>> scores = tabs.apply(torch.zeros(2, 8))
    >>> (scores[0] == float("-inf")).nonzero().flatten().tolist(), (scores[1] == float("-inf")).nonzero().flatten().tolist()
    ([2, 5], [4])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

__all__ = ["BanTables", "CompiledBans", "compile_banned", "compile_banned_arrays", "compile_banned_reference"]


@dataclass(frozen=True)
class CompiledBans:
    """One row's automaton (host tensors, int64). Node 0 is the root.

    Attributes:
        edge_keys: sorted ``node * vocab + token`` of every trie edge.
        edge_next: the child node of each edge.
        fail: ``[nodes]`` failure link of each node (the root's is the root).
        ban_off: ``[nodes + 1]`` CSR offsets into ``ban_tok`` (the root's list is empty: see ``root_bans``).
        ban_tok: tokens banned at each non-root node (terminal children along its failure chain, root excluded).
        root_bans: tokens banned at every step (one-token sequences).
        depth: the deepest node's depth (failure links followed per step: ``depth + 1`` lookups at most).
        vocab: the vocabulary size the keys were made with.
    """

    edge_keys: torch.Tensor
    edge_next: torch.Tensor
    fail: torch.Tensor
    ban_off: torch.Tensor
    ban_tok: torch.Tensor
    root_bans: torch.Tensor
    depth: int
    vocab: int
    # for the host-side initial state: node hashes (sorted; node i + 1 has hash node_hash[i]) and each node's
    # tokens (padded with -1), or, from the reference compile, the goto function and failure links
    node_hash: np.ndarray | None = None
    node_tok: np.ndarray | None = None
    goto_host: dict[tuple[int, int], int] | None = None
    fail_host: list[int] | None = None

    @property
    def nodes(self) -> int:
        return int(self.fail.shape[0])

    @property
    def max_bans(self) -> int:
        """The longest per-node ban list."""
        if self.nodes <= 1:
            return 0
        return int((self.ban_off[1:] - self.ban_off[:-1]).max())

    def state_after(self, tokens: Sequence[int]) -> int:
        """The automaton state after ``tokens`` (only the last ``depth`` matter), computed on the host: the
        longest suffix of ``tokens`` that is a trie node."""
        if self.goto_host is None:
            tail = [int(t) for t in tokens[-self.depth :]] if self.depth else []
            for k in range(len(tail), 0, -1):
                node = self._node_of(tail[-k:])
                if node:
                    return node
            return 0
        q = 0
        for t in tokens[-self.depth :] if self.depth else ():
            q = self._goto(q, int(t))
        return q

    def to_arrays(self) -> dict[str, Any]:
        """Its fields with the tensors as NumPy arrays: what a worker process sends back (pickled by value, not
        as shared-memory handles)."""
        return {f.name: (v.numpy() if isinstance(v, torch.Tensor) else v) for f in fields(self)
                for v in (getattr(self, f.name),)}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any]) -> CompiledBans:
        """The inverse of :meth:`to_arrays`."""
        return cls(**{k: (torch.from_numpy(v) if k in _TENSOR_FIELDS else v) for k, v in arrays.items()})

    def _node_of(self, toks: list[int]) -> int:
        assert self.node_hash is not None and self.node_tok is not None
        h = _hash_of(toks)
        i = int(np.searchsorted(self.node_hash, h))
        if i < len(self.node_hash) and self.node_hash[i] == h:
            row = self.node_tok[i]
            if (
                len(toks) <= row.shape[0]
                and row[: len(toks)].tolist() == toks
                and (len(toks) == row.shape[0] or row[len(toks)] == -1)
            ):
                return i + 1
        return 0

    def _goto(self, q: int, t: int) -> int:
        assert self.goto_host is not None and self.fail_host is not None
        while True:
            nxt = self.goto_host.get((q, t))
            if nxt is not None:
                return nxt
            if q == 0:
                return 0
            q = self.fail_host[q]


_TENSOR_FIELDS = ("edge_keys", "edge_next", "fail", "ban_off", "ban_tok", "root_bans")


def compile_banned_arrays(banned: Sequence[Sequence[int]], vocab: int) -> dict[str, Any]:
    """:func:`compile_banned` for a worker process: the automaton as :meth:`CompiledBans.to_arrays`."""
    return compile_banned(banned, vocab).to_arrays()


_MUL = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the prefix hash (wraps modulo 2**64)


def _hash_of(toks: Sequence[int]) -> np.uint64:
    h = np.uint64(0)
    with np.errstate(over="ignore"):
        for t in toks:
            h = h * _MUL + np.uint64(t + 1)
    return h


def compile_banned(banned: Sequence[Sequence[int]], vocab: int) -> CompiledBans:
    """The automaton of one row's banned sequences (see module doc); equal to
    :func:`compile_banned_reference`'s, computed with array operations.

    Raises:
        ValueError: a token id outside ``[0, vocab)``.
    """
    seqs = [s for s in banned if len(s)]
    if not seqs:
        return compile_banned_reference(seqs, vocab)
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    if flat.min() < 0 or flat.max() >= vocab:
        bad = sorted({int(t) for t in flat[(flat < 0) | (flat >= vocab)]})[:10]
        raise ValueError(f"banned token ids {bad} outside the vocabulary of {vocab}")
    n_seq, width = len(seqs), int(lens.max())
    starts = np.cumsum(lens) - lens
    pad = np.full((n_seq, width), -1, dtype=np.int64)
    pad[np.repeat(np.arange(n_seq), lens), np.arange(len(flat)) - np.repeat(starts, lens)] = flat
    # prefix hashes: hashes[i, d] of the first d tokens of sequence i
    hashes = np.zeros((n_seq, width + 1), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for d in range(1, width + 1):
            hashes[:, d] = hashes[:, d - 1] * _MUL + (pad[:, d - 1] + 1).astype(np.uint64)
        powers = np.ones(width + 1, dtype=np.uint64)
        for d in range(1, width + 1):
            powers[d] = powers[d - 1] * _MUL
    # trie nodes: the distinct proper prefixes (depth 1 .. len - 1); node 0 is the root
    depths = np.arange(width + 1)
    ent_i, ent_d = np.nonzero((depths[None, :] >= 1) & (depths[None, :] <= lens[:, None] - 1))
    cols = np.arange(width)
    if len(ent_i):
        node_hash, first, inv = _unique_index_inverse(hashes[ent_i, ent_d])
        rep_i, rep_d = ent_i[first], ent_d[first]
        # every prefix equals its node's representative token by token, or two prefixes share a hash
        same = (rep_d[inv] == ent_d) & ((pad[ent_i] == pad[rep_i[inv]]) | (cols[None, :] >= ent_d[:, None])).all(1)
        if not same.all():
            return compile_banned_reference(seqs, vocab)
    else:
        node_hash = np.zeros(0, dtype=np.uint64)
        rep_i = rep_d = np.zeros(0, dtype=np.int64)
    n = len(node_hash) + 1
    node_tok = np.where(cols[None, :] < rep_d[:, None], pad[rep_i], -1)  # [n - 1, width]

    def node_of(h: np.ndarray) -> np.ndarray:
        """Node ids of prefix hashes known to be nodes."""
        return np.searchsorted(node_hash, h) + 1

    # edges: node k (depth d, representative i) hangs under the node of i's first d - 1 tokens
    ids = np.arange(1, n)
    parent = np.where(rep_d > 1, node_of(hashes[rep_i, np.maximum(rep_d - 1, 0)]), 0)
    edge_tok = pad[rep_i, rep_d - 1] if n > 1 else np.zeros(0, dtype=np.int64)
    keys = parent * vocab + edge_tok
    order = np.argsort(keys, kind="stable")
    # terminals: sequence i bans its last token after the node of its first len - 1 tokens
    last = pad[np.arange(n_seq), lens - 1]
    root_bans = _unique(last[lens == 1])
    multi = lens > 1
    term_node = node_of(hashes[multi, lens[multi] - 1])
    term_tok = last[multi]
    # suffixes of each node that are nodes (its failure chain): node k's tokens from j on, 1 <= j < depth
    pk, pj = np.nonzero((cols[None, :] >= 1) & (cols[None, :] < rep_d[:, None]))
    slen = rep_d[pk] - pj
    with np.errstate(over="ignore"):
        sh = hashes[rep_i[pk], rep_d[pk]] - hashes[rep_i[pk], pj] * powers[slen]
    pos = np.minimum(np.searchsorted(node_hash, sh), max(n - 2, 0))
    hit = node_hash[pos] == sh if len(node_hash) else np.zeros(len(sh), dtype=bool)
    if hit.any():  # check token by token: the node of that hash must be this very suffix
        shifted = pad[rep_i[pk[hit]][:, None], np.minimum(pj[hit][:, None] + cols[None, :], width - 1)]
        want = np.where(cols[None, :] < slen[hit][:, None], shifted, -1)
        exact = (node_tok[pos[hit]] == want).all(1)
        hit[np.flatnonzero(hit)[~exact]] = False
    chain_k, chain_j, chain_m = pk[hit] + 1, pj[hit], pos[hit] + 1
    fail = np.zeros(n, dtype=np.int64)
    if len(chain_k):  # the longest suffix (smallest j) is the failure link
        o = np.lexsort((chain_j, chain_k))  # by node, then j ascending
        _, first_of = np.unique(chain_k[o], return_index=True)
        fail[chain_k[o][first_of]] = chain_m[o][first_of]
    # bans per node: terminal tokens of the node and of every node on its failure chain (root excluded)
    src = np.concatenate([ids, chain_k])
    via = np.concatenate([ids, chain_m])
    t_order = np.argsort(term_node, kind="stable")
    t_node, t_tok = term_node[t_order], term_tok[t_order]
    lo, hi = np.searchsorted(t_node, via, "left"), np.searchsorted(t_node, via, "right")
    cnt = hi - lo
    b_src = np.repeat(src, cnt)
    b_tok = t_tok[np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))]
    b_key = _unique(b_src * vocab + b_tok)
    ban_node, ban_tok = b_key // vocab, b_key % vocab
    ban_off = np.searchsorted(ban_node, np.arange(n + 1), "left")
    return CompiledBans(
        edge_keys=torch.from_numpy(keys[order]),
        edge_next=torch.from_numpy(ids[order]),
        fail=torch.from_numpy(fail),
        ban_off=torch.from_numpy(ban_off.astype(np.int64)),
        ban_tok=torch.from_numpy(ban_tok.astype(np.int64)),
        root_bans=torch.from_numpy(root_bans.astype(np.int64)),
        depth=int(rep_d.max()) if len(rep_d) else 0,
        vocab=vocab,
        node_hash=node_hash,
        node_tok=node_tok,
    )


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (by a sort: NumPy's hash-based ``unique`` is several times slower here)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def _unique_index_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(a, return_index=True, return_inverse=True)`` by a stable sort."""
    order = np.argsort(a, kind="stable")
    srt = a[order]
    new = np.concatenate(([True], srt[1:] != srt[:-1]))
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return srt[new], order[new], inv


def compile_banned_reference(banned: Sequence[Sequence[int]], vocab: int) -> CompiledBans:
    """The automaton of one row's banned sequences, built by a loop over the sequences (the reference of
    :func:`compile_banned`, and its fallback when two prefixes share a hash).

    Raises:
        ValueError: a token id outside ``[0, vocab)``.
    """
    children: list[dict[int, int]] = [{}]  # node -> token -> child; the nodes are the sequences' proper prefixes
    terminal: list[set[int]] = [set()]  # node -> tokens t such that node + [t] is a banned sequence
    depth = [0]
    for s in banned:
        if not s:
            continue
        bad = [t for t in s if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"banned token ids {bad} outside the vocabulary of {vocab}")
        q = 0
        for t in s[:-1]:
            t = int(t)
            nxt = children[q].get(t)
            if nxt is None:
                nxt = len(children)
                children[q][t] = nxt
                children.append({})
                terminal.append(set())
                depth.append(depth[q] + 1)
            q = nxt
        terminal[q].add(int(s[-1]))
    n = len(children)
    fail = [0] * n
    order: list[int] = []
    frontier = list(children[0].values())  # depth 1: failure link to the root
    while frontier:  # breadth first: a node's failure link is resolved before its children's
        order.extend(frontier)
        nxt_frontier = []
        for q in frontier:
            for t, c in children[q].items():
                if q != 0:
                    f = fail[q]
                    while f != 0 and t not in children[f]:
                        f = fail[f]
                    fail[c] = children[f].get(t, 0)  # shallower than c, never c itself
                nxt_frontier.append(c)
        frontier = nxt_frontier
    # Banned tokens per node: terminal children of the node and of its failure chain, root excluded.
    bans: list[set[int]] = [set() for _ in range(n)]
    for q in order:  # parents' failure targets are shallower, hence already done
        bans[q] = terminal[q] | (bans[fail[q]] if fail[q] != 0 else set())
    keys: list[int] = []
    nexts: list[int] = []
    for q in range(n):
        for t, c in children[q].items():
            keys.append(q * vocab + t)
            nexts.append(c)
    order_keys = sorted(range(len(keys)), key=keys.__getitem__)
    ban_off = [0]
    ban_tok: list[int] = []
    for q in range(n):
        if q:
            ban_tok.extend(sorted(bans[q]))
        ban_off.append(len(ban_tok))
    goto_host = {(q, t): c for q in range(n) for t, c in children[q].items()}
    return CompiledBans(
        edge_keys=torch.tensor([keys[i] for i in order_keys], dtype=torch.int64),
        edge_next=torch.tensor([nexts[i] for i in order_keys], dtype=torch.int64),
        fail=torch.tensor(fail, dtype=torch.int64),
        ban_off=torch.tensor(ban_off, dtype=torch.int64),
        ban_tok=torch.tensor(ban_tok, dtype=torch.int64),
        root_bans=torch.tensor(sorted(terminal[0]), dtype=torch.int64),
        depth=max(depth),
        vocab=vocab,
        goto_host=goto_host,
        fail_host=fail,
    )


_PAD_KEY = torch.iinfo(torch.int64).max


class BanTables:
    """Every slot's automaton as padded device tensors, plus each slot's current state (see module doc).

    Capacities (edges, nodes, ban-list entries, longest per-node list, depth) grow when a loaded row needs
    more; :attr:`version` changes then, so a captured decode step knows to capture again.
    """

    edge_keys: torch.Tensor  # [slots, edges] sorted node * vocab + token, padded with int64 max
    edge_next: torch.Tensor  # [slots, edges]
    fail: torch.Tensor  # [slots, nodes]
    ban_off: torch.Tensor  # [slots, nodes + 1]
    ban_tok: torch.Tensor  # [slots, bans]
    root_mask: torch.Tensor  # [slots, vocab] bool
    state: torch.Tensor  # [slots]

    def __init__(self, slots: int, vocab: int, device: torch.device | str) -> None:
        self.slots, self.vocab, self.device = slots, vocab, torch.device(device)
        self.version = 0
        self.any_rows = False
        self._loaded = False
        self._alloc(edges=16, nodes=16, bans=16, per_node=1, depth=1)

    def _alloc(self, *, edges: int, nodes: int, bans: int, per_node: int, depth: int) -> None:
        s, dev = self.slots, self.device
        new_keys = torch.full((s, edges), _PAD_KEY, dtype=torch.int64, device=dev)
        new_next = torch.zeros((s, edges), dtype=torch.int64, device=dev)
        new_fail = torch.zeros((s, nodes), dtype=torch.int64, device=dev)
        new_off = torch.zeros((s, nodes + 1), dtype=torch.int64, device=dev)
        new_tok = torch.zeros((s, bans), dtype=torch.int64, device=dev)
        if self._loaded:  # keep the loaded rows
            e, n, b = self.edge_keys.shape[1], self.fail.shape[1], self.ban_tok.shape[1]
            new_keys[:, :e] = self.edge_keys
            new_next[:, :e] = self.edge_next
            new_fail[:, :n] = self.fail
            new_off[:, : n + 1] = self.ban_off
            new_off[:, n + 1 :] = self.ban_off[:, n : n + 1]
            new_tok[:, :b] = self.ban_tok
        else:
            self.root_mask = torch.zeros((s, self.vocab), dtype=torch.bool, device=dev)
            self.state = torch.zeros(s, dtype=torch.int64, device=dev)
            self._loaded = True
        self.edge_keys, self.edge_next, self.fail, self.ban_off, self.ban_tok = (
            new_keys, new_next, new_fail, new_off, new_tok
        )  # fmt: skip
        self.per_node = per_node
        self.depth = depth
        self._arange = torch.arange(per_node, device=dev)
        self.version += 1

    def load(self, slot: int, bans: CompiledBans | None, initial_state_of: Sequence[int] = ()) -> None:
        """Put ``bans`` (None: nothing banned) into ``slot``, its state after the tokens ``initial_state_of``."""
        if bans is not None and bans.vocab != self.vocab:
            raise ValueError(f"bans compiled for a vocabulary of {bans.vocab}, tables hold {self.vocab}")
        e = int(bans.edge_keys.shape[0]) if bans is not None else 0
        n = bans.nodes if bans is not None else 1
        b = int(bans.ban_tok.shape[0]) if bans is not None else 0
        k = bans.max_bans if bans is not None else 0
        d = bans.depth if bans is not None else 0
        cap_e, cap_n, cap_b = self.edge_keys.shape[1], self.fail.shape[1], self.ban_tok.shape[1]
        if e > cap_e or n > cap_n or b > cap_b or k > self.per_node or d > self.depth:
            grow = lambda need, cap: max(cap, 1 << max(need - 1, 1).bit_length())  # noqa: E731
            self._alloc(edges=grow(e, cap_e), nodes=grow(n, cap_n), bans=grow(b, cap_b),
                        per_node=grow(k, self.per_node), depth=max(d, self.depth))  # fmt: skip
        dev = self.device
        # Only what a step reads is reset: keys past this row's edges (padding never matches), its ban offsets
        # and root mask; edge_next, fail and ban_tok past this row's sizes are never read (states stay below
        # its node count, ban indices below its offsets).
        self.edge_keys[slot, e:].fill_(_PAD_KEY)
        self.root_mask[slot].zero_()
        if bans is None:
            self.ban_off[slot].zero_()
            self.state[slot] = 0
            return
        self.any_rows = True
        self.edge_keys[slot, :e] = bans.edge_keys.to(dev, non_blocking=True)
        self.edge_next[slot, :e] = bans.edge_next.to(dev, non_blocking=True)
        self.fail[slot, :n] = bans.fail.to(dev, non_blocking=True)
        self.ban_off[slot, : n + 1] = bans.ban_off.to(dev, non_blocking=True)
        self.ban_off[slot, n + 1 :] = int(bans.ban_off[-1])
        if b:
            self.ban_tok[slot, :b] = bans.ban_tok.to(dev, non_blocking=True)
        if bans.root_bans.numel():
            self.root_mask[slot, bans.root_bans.to(dev, non_blocking=True)] = True
        self.state[slot] = bans.state_after(initial_state_of)

    def mask(self) -> torch.Tensor:
        """``[slots, vocab]`` True where the next token is banned for that slot."""
        start = self.ban_off.gather(1, self.state[:, None])  # [slots, 1]
        end = self.ban_off.gather(1, self.state[:, None] + 1)
        idx = start + self._arange[None, :]  # [slots, per_node]
        valid = idx < end
        tok = self.ban_tok.gather(1, idx.clamp(max=self.ban_tok.shape[1] - 1))
        tok = torch.where(valid, tok, torch.full_like(tok, self.vocab))  # the extra column takes the misses
        extra = torch.zeros((self.slots, self.vocab + 1), dtype=torch.bool, device=self.device)
        extra.scatter_(1, tok, True)
        return extra[:, : self.vocab] | self.root_mask

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` ``[slots, vocab]`` with every banned next token at -inf (in place)."""
        return scores.masked_fill_(self.mask(), float("-inf"))

    def advance(self, tokens: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Move every slot's state past its new token ``tokens`` ``[slots]`` (rows not ``active`` keep theirs)."""
        # The state's failure chain (q, fail(q), ...; failure links shorten the match by >= 1 each, so depth + 1
        # nodes reach the root), one small gather per link; then every (node, token) edge of the chain is looked
        # up at once and the first hit - the longest suffix that extends by the token - is the next state. The
        # lookups are one batched search instead of one search per link (a decode step's blocking is a chain of
        # small kernels: fewer of them is what makes it cheaper).
        chain = [self.state]
        for _ in range(self.depth):
            chain.append(self.fail.gather(1, chain[-1][:, None])[:, 0])
        keys = torch.stack(chain, 1) * self.vocab + tokens.to(torch.int64)[:, None]  # [slots, depth + 1]
        pos = torch.searchsorted(self.edge_keys, keys).clamp(max=self.edge_keys.shape[1] - 1)
        hit = self.edge_keys.gather(1, pos) == keys
        first = hit.to(torch.uint8).argmax(1, keepdim=True)  # the first hit along the chain (0 when none)
        nxt = torch.where(hit.any(1), self.edge_next.gather(1, pos.gather(1, first))[:, 0], 0)
        new = nxt if active is None else torch.where(active, nxt, self.state)
        self.state.copy_(new)
