"""The fast engine's key/value cache: one preallocated tensor, a fixed region per slot.

Layout ``[layers, 2, slots, kv_heads, max_len, head_dim]``: slot ``s`` owns ``[:, :, s]``; a row's cache
index equals its position (a prefix adapter's virtual tokens first). Nothing is allocated while decoding.
The memory is zeroed once: positions past a row's length are masked, and zeros (never NaN) keep masked
products exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache", "kv_bytes_per_slot"]


def kv_bytes_per_slot(layers: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one slot of ``max_len`` positions takes (keys and values of every layer)."""
    return 2 * layers * kv_heads * max_len * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass
class KVCache:
    data: torch.Tensor  # [layers, 2, slots, kv_heads, max_len, head_dim]

    @classmethod
    def allocate(cls, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> KVCache:  # fmt: skip
        return cls(torch.zeros((layers, 2, slots, kv_heads, max_len, head_dim), dtype=dtype, device=device))

    @property
    def slots(self) -> int:
        return int(self.data.shape[2])

    @property
    def max_len(self) -> int:
        return int(self.data.shape[4])

    def view(self, layer: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every slot, first ``kv_len`` positions (views, ``[slots, kv_heads, kv_len, hd]``)."""
        return self.data[layer, 0, :, :, :kv_len], self.data[layer, 1, :, :, :kv_len]

    def slot_view(self, layer: int, slot: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot's keys and values, ``[1, kv_heads, kv_len, hd]`` views."""
        return (self.data[layer, 0, slot : slot + 1, :, :kv_len], self.data[layer, 1, slot : slot + 1, :, :kv_len])

    def read(self, slot: int, start: int, end: int) -> torch.Tensor:
        """A copy of positions ``[start, end)`` of ``slot``: ``[layers, 2, kv_heads, end - start, hd]``."""
        return self.data[:, :, slot, :, start:end].clone()

    def write(self, slot: int, start: int, block: torch.Tensor) -> None:
        """Put ``block`` (as :meth:`read` returns) at positions ``[start, start + len)`` of ``slot``."""
        self.data[:, :, slot, :, start : start + block.shape[3]] = block

    def copy_slot(self, src: int, dst: int, end: int) -> None:
        """Positions ``[0, end)`` of ``src`` into ``dst`` (rows that share a prompt)."""
        self.data[:, :, dst, :, :end] = self.data[:, :, src, :, :end]
