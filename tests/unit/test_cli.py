import pytest

from ctrlgen.cli import main


def test_help_explains_every_verb(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for verb in ("demo", "demo-corpus", "ingest", "codes", "model", "assets", "config"):
        assert verb in out


def test_ingest_physionet_prints_balanced_counts(tmp_path, shared, capsys):
    rc = main(
        [
            "ingest",
            "-c",
            "configs/corpora/physionet.yaml",
            f"corpus.path={shared / 'physionet-deid'}",
            f"output_dir={tmp_path}",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "rows in 1818 = documents out 1818 + quarantined 0" in out
    assert "entities 1382" in out


def test_user_errors_are_one_line_without_traceback(tmp_path, capsys):
    rc = main(["ingest", "corpus.format=physionet", f"corpus.path={tmp_path / 'missing'}", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2 and "error:" in err and "does not exist" in err and "Traceback" not in err
    rc = main(["config", "corpus.nonsense=1"])
    assert rc == 2 and "corpus.mimic.nonsense" in capsys.readouterr().err


def test_codes_needs_an_ingest_first(tmp_path, capsys):
    assert main(["codes", f"output_dir={tmp_path}"]) == 2
    assert "run `ctrlgen ingest`" in capsys.readouterr().err


def test_model_info_on_tiny_llama(capsys):
    assert main(["model", "info", "model.name=tiny-llama"]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out


def test_the_configuration_page_is_the_rendering_of_the_config_models() -> None:
    from pathlib import Path

    from ctrlgen.config_docs import describe, render_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render_markdown(), (
        "docs/configuration.md is stale: ctrlgen config --markdown --out docs/configuration.md"
    )
    missing = [r.key for r in describe() if r.type != "section" and not r.description and not r.key.endswith(".format")]
    assert not missing, f"config fields without a description: {missing}"


def test_config_describe_prints_the_resolved_values_with_their_descriptions(capsys) -> None:
    assert main(["config", "--describe", "-c", "configs/quickstart.yaml", "generation.num_documents=7"]) == 0
    out = capsys.readouterr().out
    assert 'corpus.path = "NOTEEVENTS.csv"  # str; ' in out and "generation.num_documents = 7  # int | None; " in out
    assert 'extraction.setting = "unknown"  # known | unknown; known: ' in out


def test_help_groups_the_verbs_and_names_the_keys_to_set(capsys) -> None:
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "start here:       synthesize, export, demo, config" in out and "docs/quickstart.md" in out
    with pytest.raises(SystemExit):
        main(["synthesize", "--help"])
    assert "Keys to set for your own data: corpus.format, corpus.path" in capsys.readouterr().out


def test_the_demo_prints_codes_and_notes_of_the_generated_demo_corpus_only(tmp_path):
    """`ctrlgen demo` run with another corpus (a hospital's notes) must not print its private values."""
    from ctrlgen.cli import _is_demo_corpus
    from ctrlgen.config import load_config

    demo_dir = tmp_path / "demo-notes"
    demo_dir.mkdir()
    assert _is_demo_corpus(load_config(None, []), demo_dir)
    assert _is_demo_corpus(load_config(None, [f"corpus.path={demo_dir}/."]), demo_dir)
    assert not _is_demo_corpus(load_config(None, [f"corpus.path={tmp_path / 'NOTEEVENTS.csv'}"]), demo_dir)
    assert not _is_demo_corpus(load_config(None, ["corpus.format=physionet", f"corpus.path={demo_dir}"]), demo_dir)
    assert not _is_demo_corpus(load_config(None, ["corpus.path=s3://bucket/demo-notes"]), demo_dir)
