"""Generation: batched engine, per-row hard token blocking, release gate, ICL stage."""

from ctrlgen.generation.blocking import RowBannedTokens, banned_sequences, casing_variants
from ctrlgen.generation.engine import GenerationEngine, GenerationRequest, GenerationResult, HFEngine, RowSampler
from ctrlgen.generation.gate import GatedResult, gated_generate

__all__ = [
    "GatedResult",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "HFEngine",
    "RowBannedTokens",
    "RowSampler",
    "banned_sequences",
    "casing_variants",
    "gated_generate",
]
