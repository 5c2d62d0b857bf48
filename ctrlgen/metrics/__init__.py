"""Privacy and utility metrics (METHOD.md section 6) as plain functions."""

from ctrlgen.metrics.leakage import (
    elp_finetune,
    elp_icl,
    leaked_values,
    normalize_value,
    pipp_finetune,
    pipp_icl,
    value_matcher,
)

__all__ = [
    "elp_finetune",
    "elp_icl",
    "leaked_values",
    "normalize_value",
    "pipp_finetune",
    "pipp_icl",
    "value_matcher",
]
