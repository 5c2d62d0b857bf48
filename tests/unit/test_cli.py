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
