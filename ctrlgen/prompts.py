"""ICL prompts (METHOD.md section 4): three real (code, document) pairs, then a fictional code.

::

    Control code:
    PERSON: Alice Jones
    Document:
    <real document 1>

    ... (pairs 2 and 3)

    Control code:
    PERSON: Mr. Liam Moore
    Document:

The model continues with a document grounded in the last (fictional) code and is
stopped when it starts a new control code (``Control code:``). The baseline
prompt is the three real documents without codes, stopped at the next
``Document:``. Context documents longer than ``max_context_tokens`` are cut at a
token boundary (the cut is stated in docs/generation.md: long MIMIC notes would
otherwise overflow the model's window). Prefix tuning (variant B) uses one
block alone, :func:`prefix_prompt`: ``Control code:\n<code>\nDocument:\n``, as
the training input c_i (the document is the output) and, with a fictional code,
as the generation prompt.

Example:
    >>> p = icl_prompt([("PERSON: A B", "Doc one.")], "PERSON: C D")
    >>> p.endswith("Control code:\\nPERSON: C D\\nDocument:\\n")
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CODE_HEADER",
    "DOC_HEADER",
    "baseline_prompt",
    "icl_prompt",
    "prefix_prompt",
    "stop_strings",
    "truncate_to_tokens",
]

CODE_HEADER = "Control code:"
DOC_HEADER = "Document:"


def _block(code: str | None, doc: str | None) -> str:
    parts = []
    if code is not None:
        parts.append(f"{CODE_HEADER}\n{code.strip() or '(none)'}")
    parts.append(DOC_HEADER + "\n" + (doc.strip() + "\n" if doc is not None else ""))
    return "\n".join(parts)


def icl_prompt(contexts: Sequence[tuple[str, str]], fictional_code: str) -> str:
    """``contexts`` are (control-code text, document text) pairs; the prompt ends after ``Document:``."""
    blocks = [_block(code, doc) for code, doc in contexts]
    blocks.append(_block(fictional_code, None))
    return "\n".join(blocks)


def baseline_prompt(documents: Sequence[str]) -> str:
    """The baseline: real documents without codes; the prompt ends after ``Document:``."""
    blocks = [_block(None, doc) for doc in documents]
    blocks.append(_block(None, None))
    return "\n".join(blocks)


def prefix_prompt(code: str) -> str:
    """Prefix tuning's input c_i (training) and c_f (generation): one code, ending after ``Document:``."""
    return _block(code, None)


def stop_strings(mode: str) -> list[str]:
    """Where generation stops: the start of the next control code (or next document for the baseline)."""
    return [DOC_HEADER] if mode == "baseline" else [CODE_HEADER]


def truncate_to_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """``text`` cut after its first ``max_tokens`` tokens (at a token boundary); unchanged if shorter."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_tokens:
        return text
    return text[: offsets[max_tokens - 1][1]]
