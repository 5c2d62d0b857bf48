"""Slots and admission for continuous batching: pure Python, no tensors.

The engine owns a fixed number of slots. :class:`Scheduler` keeps the waiting sequences in arrival order
and hands a free slot to the next one the moment a slot is released (:meth:`Scheduler.release`), so a row
that stops early never holds its slot until the longest row of a batch ends. The engine drives it:
``admit()`` -> prefill what it returned -> decode steps -> ``release(slot)`` for rows that finished.

Example:
    >>> s = Scheduler(slots=2)
    >>> for name in "abc":
    ...     s.add(name)
    >>> s.admit()
    [(0, 'a'), (1, 'b')]
    >>> s.release(1)
    'b'
    >>> s.admit(), s.running
    ([(1, 'c')], {0: 'a', 1: 'c'})
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["Scheduler"]

T = TypeVar("T")


class Scheduler(Generic[T]):
    """Waiting sequences (FIFO) and the sequence in each busy slot."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.waiting: deque[T] = deque()
        self.running: dict[int, T] = {}
        self._free: deque[int] = deque(range(slots))

    def add(self, seq: T) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[tuple[int, T]]:
        """Give every free slot (lowest first) to the next waiting sequence; the pairs admitted."""
        out = []
        while self._free and self.waiting:
            slot = self._free.popleft()
            seq = self.waiting.popleft()
            self.running[slot] = seq
            out.append((slot, seq))
        return out

    def release(self, slot: int) -> T:
        """Free ``slot``; its sequence."""
        seq = self.running.pop(slot)
        self._free.append(slot)
        self._free = deque(sorted(self._free))
        return seq

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)
