"""The Python API's config building (the jobs themselves run in tests/integration/test_quickstart.py)."""

import subprocess
import sys

import pytest

import ctrlgen


def test_build_config_layers_file_corpus_output_sections_and_overrides() -> None:
    c = ctrlgen.build_config(
        "configs/quickstart.yaml", corpus="/data/notes.csv", output="/tmp/out", generation={"num_documents": 5},
        overrides=["generation.sampling.max_new_tokens=7"],
    )  # fmt: skip
    assert (c.corpus.format, c.corpus.path, c.corpus.identifiers) == ("mimic", "/data/notes.csv", "direct+quasi")
    assert (c.output_dir, c.generation.num_documents, c.generation.sampling.max_new_tokens) == ("/tmp/out", 5, 7)
    assert c.generation.modes == ["icl_blocking"] and c.extraction.setting == "unknown"  # the file's, kept
    other = ctrlgen.build_config(c, corpus={"format": "physionet", "path": "/p"}, ray_address="auto")
    assert (other.corpus.format, other.ray.address, other.output_dir) == ("physionet", "auto", "/tmp/out")


def test_build_config_names_the_bad_key() -> None:
    with pytest.raises(ctrlgen.ConfigError, match="generation.num_documents"):
        ctrlgen.build_config(generation={"num_documents": 0})
    with pytest.raises(ctrlgen.ConfigError, match="export.format"):
        ctrlgen.build_config(export={"format": "xlsx"})


def test_importing_the_api_imports_no_ray() -> None:
    code = "import sys, ctrlgen; ctrlgen.build_config(); print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
