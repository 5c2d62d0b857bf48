"""Compatibility names: the request types live in :mod:`ctrlgen.generation.types`, the engines under
:mod:`ctrlgen.generation.engines`, and :func:`ctrlgen.generation.factory.build_engine` builds them."""

from ctrlgen.generation.engines.hf import HFEngine, RowSampler
from ctrlgen.generation.types import GenerationEngine, GenerationRequest, GenerationResult

__all__ = ["GenerationEngine", "GenerationRequest", "GenerationResult", "HFEngine", "RowSampler"]
