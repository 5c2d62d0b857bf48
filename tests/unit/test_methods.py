"""The experiment's methods table (ctrlgen/methods.py): what every other place reads a method from."""

from __future__ import annotations

import typing

import pytest

from ctrlgen.config import CtrlgenConfig, GenerationMode, TrainingConfig
from ctrlgen.errors import ConfigError
from ctrlgen.methods import METHODS, REFERENCE_LABELS, of_kind


def test_every_entry_names_what_its_kind_needs_and_nothing_else() -> None:
    modes = set(typing.get_args(GenerationMode))
    variants = set(typing.get_args(TrainingConfig.model_fields["variant"].annotation))
    for name, m in METHODS.items():
        assert m.label and m.label not in REFERENCE_LABELS.values(), name
        given = {k for k in ("mode", "variant", "epsilon", "anonymizer") if getattr(m, k) is not None}
        if m.kind == "icl":
            assert given == {"mode"} and m.mode in modes - {"prefix"}, name
        elif m.kind == "prefix":
            assert given <= {"variant", "epsilon"} and m.variant in variants, name
            assert (m.variant == "dp") == (m.epsilon is not None), name
        else:
            assert given == {"anonymizer"} and m.anonymizer in ("redact", "surrogate", "llm"), name
        assert m.compare_to is None or METHODS[m.compare_to].kind == m.kind, name
    assert sorted(of_kind("icl") + of_kind("prefix") + of_kind("anon")) == sorted(METHODS)
    assert of_kind("prefix", ["icl", "prefix_dp4", "prefix"]) == ["prefix", "prefix_dp4"]  # the table's order


def test_the_config_accepts_the_tables_methods_and_names_them_when_one_is_unknown() -> None:
    from ctrlgen.experiment import METHOD_LABELS

    cfg = CtrlgenConfig.model_validate({"experiment": {"methods": list(METHODS)}})
    assert cfg.experiment.methods == list(METHODS)
    assert set(METHOD_LABELS) == set(METHODS) | set(REFERENCE_LABELS)
    with pytest.raises((ConfigError, ValueError), match="prefix_dp4.*input_value=.prefix_dp2."):
        CtrlgenConfig.model_validate({"experiment": {"methods": ["icl", "prefix_dp2"]}})


def test_icl_mode_of_every_icl_method_and_none_other() -> None:
    from ctrlgen.methods import icl_mode

    assert [icl_mode(m) for m in of_kind("icl")] == ["baseline", "icl", "icl_blocking"]
    with pytest.raises(ValueError, match="not an ICL method"):
        icl_mode("prefix_masked")
