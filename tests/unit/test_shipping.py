"""A job's extraction models shipped from its driver to actors whose node holds another copy (ctrlgen.extract.shipping)."""

import json
import os
from pathlib import Path

import pytest

from ctrlgen.config import ExtractionConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.extract.ner import META_FILE, model_digest
from ctrlgen.extract.shipping import (
    check_models,
    model_digests,
    model_files,
    resolve_model,
    trained_models,
    unpack_model,
)


def _model(path, weights=b"weights-0"):
    (path / "ner").mkdir(parents=True)
    (path / "ner" / "model").write_bytes(weights)
    (path / "config.cfg").write_text("[nlp]\n")
    (path / META_FILE).write_text('{"seed": 0}\n')
    return path


def test_the_unpacked_copy_has_the_drivers_files_and_is_reused(tmp_path):
    src = _model(tmp_path / "src")
    cache = tmp_path / "cache"
    copy = unpack_model(model_files(src), model_digest(src), cache)
    assert model_digest(copy) == model_digest(src)
    assert (copy / META_FILE).read_text() == (src / META_FILE).read_text()  # the metadata travels too
    stamp = (copy / "ner" / "model").stat().st_mtime_ns
    assert unpack_model(model_files(src), model_digest(src), cache) == copy
    assert (copy / "ner" / "model").stat().st_mtime_ns == stamp  # not rewritten
    assert [p.name for p in cache.iterdir()] == [copy.name]  # no leftover temporary directory


def test_a_stale_copy_under_the_digests_name_is_replaced(tmp_path):
    src = _model(tmp_path / "src")
    cache = tmp_path / "cache"
    copy = unpack_model(model_files(src), model_digest(src), cache)
    (copy / "ner" / "model").write_bytes(b"truncated")
    assert unpack_model(model_files(src), model_digest(src), cache) == copy
    assert model_digest(copy) == model_digest(src)


def test_files_that_do_not_have_the_digest_are_refused_and_leave_nothing(tmp_path):
    src = _model(tmp_path / "src")
    files = model_files(src)
    files["ner/model"] = b"weights-1"
    with pytest.raises(CtrlgenError, match="not the driver's"):
        unpack_model(files, model_digest(src), tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.parametrize("name", ["../escape", "/etc/x", "ner/../../x"])
def test_a_file_name_outside_the_model_directory_is_refused(tmp_path, name):
    src = _model(tmp_path / "src")
    files = {**model_files(src), name: b"x"}
    with pytest.raises(CtrlgenError, match="outside its directory"):
        unpack_model(files, model_digest(src), tmp_path / "cache")
    assert not (tmp_path / "escape").exists() and list((tmp_path / "cache").iterdir()) == []


def test_the_nodes_own_copy_is_loaded_when_it_is_the_drivers(tmp_path):
    src = _model(tmp_path / "src")

    def fetch():
        raise AssertionError("fetched although this node's copy is the driver's")

    assert resolve_model(str(src), model_digest(src), fetch, tmp_path / "cache") == (str(src), "")


@pytest.mark.parametrize("node", ["other weights", "missing", "untrained"])
def test_a_node_without_the_drivers_model_loads_the_drivers_copy(tmp_path, node):
    driver = _model(tmp_path / "driver")
    local = tmp_path / "node"
    if node == "other weights":
        _model(local, b"weights-of-another-cpu")
    elif node == "untrained":
        _model(local)
        os.remove(local / META_FILE)
    calls = []

    def fetch():
        calls.append(1)
        return model_files(driver)

    path, note = resolve_model(str(local), model_digest(driver), fetch, tmp_path / "cache")
    assert calls == [1] and model_digest(path) == model_digest(driver) and path != str(local)
    assert f"this node's {local} is not the driver's model" in note and model_digest(driver)[:16] in note
    assert ("no trained model there" in note) == (node != "other weights")
    assert "weights-" not in note  # names and digests only


def test_the_models_shipped_are_the_trained_directories_the_engine_loads(tmp_path):
    ner, veto = _model(tmp_path / "ner"), _model(tmp_path / "veto")
    cfg = ExtractionConfig(setting="unknown", ner_model=str(ner), ner_veto=str(veto))
    assert trained_models(cfg) == {"ner_model": str(ner), "ner_veto": str(veto)}
    assert trained_models(cfg.model_copy(update={"ner_veto": str(tmp_path / "not-trained")})) == {"ner_model": str(ner)}
    assert trained_models(ExtractionConfig(setting="unknown")) == {}  # the general engine: a spaCy package
    assert trained_models(cfg.model_copy(update={"setting": "known"})) == {}


def test_a_node_whose_models_differ_from_the_builders_is_named(tmp_path):
    built = _model(tmp_path / "built")
    cfg = ExtractionConfig(setting="unknown", ner_model=str(built))
    expected = model_digests(cfg)
    assert expected == {"ner_model": model_digest(built)}
    check_models(cfg, expected)  # the same copy: nothing to say
    check_models(cfg, {})  # nothing recorded where the service was built: its own copy
    other = _model(tmp_path / "other", b"weights-of-another-cpu")
    for path, said in ((other, f"digest {model_digest(other)[:16]}"), (tmp_path / "none", "no trained model there")):
        with pytest.raises(CtrlgenError, match="not the model the service was built with") as err:
            check_models(cfg.model_copy(update={"ner_model": str(path)}), expected)
        assert f"extraction.ner_model: this node's {path}" in str(err.value) and said in str(err.value)
        assert expected["ner_model"][:16] in str(err.value)


def test_a_serve_extractor_replica_refuses_models_other_than_the_builders(tmp_path):
    """The Serve ``Extractor`` checks before loading anything: a replica on a node that trained other weights does
    not start (Serve cannot ship files to a declaratively deployed app's replicas)."""
    from ctrlgen.config import CtrlgenConfig
    from serve.deployments import Extractor

    node = _model(tmp_path / "node", b"weights-of-another-cpu")
    cfg = CtrlgenConfig.model_validate({"extraction": {"ner_model": str(node)}})
    built = "0" * 64
    with pytest.raises(CtrlgenError, match="not the model the service was built with"):
        Extractor.func_or_class(cfg.model_dump_json(), {"ner_model": built})


def test_a_good_copy_another_actor_wrote_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two actors of one node unpack at once: the second, finding the first's copy complete once its own is
    written, keeps that copy (the first may be loading it) and drops its own."""
    import ctrlgen.extract.shipping as shipping

    src = _model(tmp_path / "src")
    cache = tmp_path / "cache"
    first = unpack_model(model_files(src), model_digest(src), tmp_path / "other")
    dest = cache / first.name
    real = model_digest
    checked = shipping.files_digest

    def digest_then_race(files):  # the first check found nothing; meanwhile the other actor renames its copy
        if not dest.exists():
            cache.mkdir(parents=True, exist_ok=True)
            os.rename(first, dest)
        return checked(files)

    stamp = (first / "ner" / "model").stat().st_ino  # a rename keeps it
    monkeypatch.setattr(shipping, "files_digest", digest_then_race)
    got = unpack_model(model_files(src), model_digest(src), cache)
    assert got == dest and real(dest) == real(src)
    assert (dest / "ner" / "model").stat().st_ino == stamp  # the other actor's files, not replaced
    assert [p.name for p in cache.iterdir()] == [dest.name]  # its own copy removed


def test_the_modules_example_runs():
    import doctest

    import ctrlgen.extract.shipping as shipping

    result = doctest.testmod(shipping)
    assert result.attempted > 0 and result.failed == 0


def test_the_digest_of_files_read_is_the_digest_of_the_directory(tmp_path):
    """ner.files_digest (the driver hashes the files it ships, read once) is ner.model_digest, whatever the names'
    order ("a.b" sorts before "a/b" as text, after it as a path)."""
    from ctrlgen.extract.ner import files_digest

    src = _model(tmp_path / "src")
    (src / "a").mkdir()
    (src / "a" / "b").write_bytes(b"1")
    (src / "a.b").write_bytes(b"2")
    files = model_files(src)
    assert files_digest(files) == model_digest(src)
    assert files_digest(dict(reversed(list(files.items())))) == model_digest(src)
    for real in (".cache/ner/physionet-deid", ".cache/ner/physionet-deid-transformer"):  # the models make setup trains
        if (Path(real) / META_FILE).is_file():
            recorded = json.loads((Path(real) / META_FILE).read_text())["weights_sha256"]
            assert files_digest(model_files(real)) == model_digest(real) == recorded
