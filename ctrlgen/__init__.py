"""ctrlgen: controlled generation of private synthetic text (Ray-free core library).

The core works on plain data: corpus readers, entities, control codes and (as the
project grows) fictional codes, prompts, token blocking, masked loss and metrics.
Distributed jobs live in ``ray_jobs/`` and Serve apps in ``serve/``; importing
``ctrlgen`` never imports Ray. The pipeline as functions (:mod:`ctrlgen.api`):
``ctrlgen.synthesize(corpus, output, config=...)``, ``extract``, ``evaluate``, ``export``.
"""

from ctrlgen.api import SynthesisResult, build_config, evaluate, export, extract, synthesize
from ctrlgen.codes import build_control_code, format_control_code, parse_control_code
from ctrlgen.config import CtrlgenConfig, load_config
from ctrlgen.corpora import load_corpus, read_corpus
from ctrlgen.errors import ConfigError, CorpusError, CtrlgenError, ModelError
from ctrlgen.schema import CATEGORIES, DOCUMENT_SCHEMA, Document, Entity, Quarantined

__version__ = "0.1.0"

__all__ = [
    "CATEGORIES",
    "DOCUMENT_SCHEMA",
    "ConfigError",
    "CorpusError",
    "CtrlgenConfig",
    "CtrlgenError",
    "Document",
    "Entity",
    "ModelError",
    "Quarantined",
    "SynthesisResult",
    "build_config",
    "build_control_code",
    "evaluate",
    "export",
    "extract",
    "format_control_code",
    "load_config",
    "load_corpus",
    "parse_control_code",
    "read_corpus",
    "synthesize",
]
