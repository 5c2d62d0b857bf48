from pathlib import Path

import pytest

from ctrlgen.config import CtrlgenConfig, MimicCorpusConfig, TabCorpusConfig, apply_overrides, load_config
from ctrlgen.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# configs/serve/ holds Ray Serve config files (their own schema, tests/unit/test_serve_config.py).
CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "serve" not in p.relative_to(ROOT / "configs").parts)


def test_configs_directory_is_not_empty():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, CtrlgenConfig)


def test_the_default_clinical_engine_is_the_veto_configs_engine():
    """configs/extract_physionet.yaml (the default unknown-setting engine) runs what configs/extract_physionet_veto.yaml
    (its studies and docs/extraction_veto.md) measures: the spaCy NER's engine with the transformer tagger's veto."""
    default = load_config(ROOT / "configs" / "extract_physionet.yaml")
    veto = load_config(ROOT / "configs" / "extract_physionet_veto.yaml")
    assert default.extraction == veto.extraction and default.corpus == veto.corpus
    assert default.extraction.ner_veto and default.extraction.ner_veto_context == 16
    assert default.extraction.ner_union_p_outside is None and default.output_dir != veto.output_dir


def test_defaults_read_the_generated_demo_corpus():
    cfg = load_config(None)
    assert isinstance(cfg.corpus, MimicCorpusConfig) and cfg.corpus.path == "demo"
    assert cfg.corpus.identifiers == "direct"  # METHOD: only DIRECT identifiers by default
    assert cfg.model.name == "smollm2-135m"


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        None,
        [
            "demo_corpus.n_notes=42",
            "corpus.format=tab",
            "corpus.path=x.json",
            "corpus.segments=[[1, 2]]",
            "corpus.annotator=annotator10",
        ],
    )
    assert cfg.demo_corpus.n_notes == 42
    assert isinstance(cfg.corpus, TabCorpusConfig)
    assert cfg.corpus.segments == [(1, 2)] and cfg.corpus.annotator == "annotator10"


def test_override_replaces_file_value(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("demo_corpus:\n  n_notes: 5\n  seed: 3\n")
    cfg = load_config(f, ["demo_corpus.seed=9"])
    assert (cfg.demo_corpus.n_notes, cfg.demo_corpus.seed) == (5, 9)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["demo_corpus.n_notse=3"], "demo_corpus.n_notse"),
        (["demo_corpus.n_notes=-1"], "demo_corpus.n_notes"),
        (["corpus.format=nope"], "corpus"),
        (["no_equals_sign"], "key.sub=value"),
        (["corpus.identifiers=everything"], "corpus.mimic.identifiers"),
    ],
)
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, overrides)


def test_missing_and_malformed_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_apply_overrides_creates_sections():
    assert apply_overrides({}, ["a.b.c=1", "a.d=[1, 2]"]) == {"a": {"b": {"c": 1}, "d": [1, 2]}}
