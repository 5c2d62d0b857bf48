"""Privacy and utility metrics (METHOD.md section 6) as plain functions."""

from ctrlgen.metrics.leakage import (
    LeakageReport,
    elp_finetune,
    elp_icl,
    leakage_report,
    leaked_values,
    pipp_finetune,
    pipp_icl,
    value_matcher,
)

__all__ = [
    "LeakageReport",
    "elp_finetune",
    "elp_icl",
    "leakage_report",
    "leaked_values",
    "pipp_finetune",
    "pipp_icl",
    "value_matcher",
]
