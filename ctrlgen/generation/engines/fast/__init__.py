"""The fast engine (see :mod:`ctrlgen.generation.engines.fast.engine`)."""

from ctrlgen.generation.engines.fast.engine import FastEngine

__all__ = ["FastEngine"]
