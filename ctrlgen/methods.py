"""The experiment's methods (METHOD.md section 7), one entry each: how a method's released set is made.

Every place that branches on a method reads this table: the config's allowed ``experiment.methods``, the
experiment job (which generation mode, training variant and DP budget, or which anonymiser), the results
table's row labels and order, and the results page's comparisons. A new method of an existing kind is one
entry here.

Kinds:

* ``icl``: a generation mode of the ICL prompt (``mode``), generated for the test notes' codes;
* ``prefix``: a prefix-tuning adapter trained with ``variant`` (``training.variant``; ``epsilon``: DP-SGD at
  that target), then the ``prefix`` generation mode; scored against the fine-tuning set, with canary exposure
  (and the run's epsilon when DP); ``compare_to``: the method the page compares it with, outputs matched;
* ``anon``: the real test notes released through ``anonymizer`` (``ctrlgen.anonymize``'s method).

    >>> [m for m, x in METHODS.items() if x.kind == "prefix" and x.epsilon]
    ['prefix_dp8', 'prefix_dp4']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["METHODS", "REFERENCE_LABELS", "Method", "icl_mode", "of_kind"]


@dataclass(frozen=True)
class Method:
    label: str  # the results table's row name
    kind: Literal["icl", "prefix", "anon"]
    mode: str | None = None  # icl: the generation mode
    variant: str | None = None  # prefix: training.variant
    epsilon: float | None = None  # prefix with DP-SGD: its target epsilon
    anonymizer: str | None = None  # anon: ctrlgen.anonymize's method
    compare_to: str | None = None  # the results page's comparison (prefix variants: the plain prefix)
    short: str = ""  # the results page's short name in comparisons


METHODS: dict[str, Method] = {
    "baseline": Method("Baseline (ICL, no codes)", "icl", mode="baseline"),
    "icl": Method("ICL", "icl", mode="icl"),
    "icl_blocking": Method("ICL + blocking", "icl", mode="icl_blocking"),
    "prefix": Method("Prefix tuning", "prefix", variant="plain"),
    "prefix_masked": Method(
        "Prefix tuning + masking", "prefix", variant="masked", compare_to="prefix", short="Masking"
    ),
    "prefix_masked_paper": Method(
        "Prefix tuning + masking (paper's loss)",
        "prefix",
        variant="masked_paper",
        compare_to="prefix",
        short="The paper's masking loss",
    ),
    "prefix_dp8": Method(
        "Prefix tuning, DP-SGD eps 8", "prefix", variant="dp", epsilon=8.0, compare_to="prefix", short="DP-SGD eps 8"
    ),
    "prefix_dp4": Method(
        "Prefix tuning, DP-SGD eps 4", "prefix", variant="dp", epsilon=4.0, compare_to="prefix", short="DP-SGD eps 4"
    ),
    "anon_redact": Method("Anonymised: redaction", "anon", anonymizer="redact"),
    "anon_surrogate": Method("Anonymised: fictional surrogates", "anon", anonymizer="surrogate"),
    "anon_llm": Method("Anonymised: LLM rewrite + attacker", "anon", anonymizer="llm"),
}

#: The reference rows of the results table (not methods: nothing is released).
REFERENCE_LABELS = {"real": "(real train notes)", "base": "(base model, no tuning)"}


def of_kind(kind: str, methods: list[str] | None = None) -> list[str]:
    """The methods of ``kind`` (in the table's order), among ``methods`` when given."""
    return [m for m, x in METHODS.items() if x.kind == kind and (methods is None or m in methods)]


def icl_mode(method: str) -> str:
    """The generation mode of an ICL method (``ValueError`` for a method of another kind)."""
    m = METHODS[method]
    if m.kind != "icl" or m.mode is None:
        raise ValueError(f"{method} is not an ICL method with a generation mode")
    return m.mode
