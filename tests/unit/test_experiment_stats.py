"""Torch utility metrics on a tiny model, and the experiment's split / statistics / table / plot."""

from __future__ import annotations

import math

import pytest
import torch

from ctrlgen.experiment import mean_ci, patient_of, plot, split_of, summarize, table
from ctrlgen.metrics.utility import finetune_lm, perplexity, sequence_nll
from ctrlgen.models import tiny_llama

TEXTS = ["the patient was seen today", "fever and cough at home", "discharged in good condition"]


def test_sequence_nll_matches_the_model_loss() -> None:
    model, tok = tiny_llama(seed=0)
    per = sequence_nll(model, tok, TEXTS, batch_size=2)  # padded batches
    for text, (nll, n) in zip(TEXTS, per, strict=True):
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            loss = model(input_ids=ids, labels=ids).loss
        assert n == ids.shape[1] - 1
        assert nll / n == pytest.approx(float(loss), rel=1e-4)


def test_finetuning_lowers_perplexity_on_its_texts() -> None:
    model, tok = tiny_llama(seed=0)
    before = perplexity(model, tok, TEXTS)
    losses = finetune_lm(model, tok, TEXTS * 4, epochs=3, learning_rate=1e-2, batch_size=4, seed=0)
    after = perplexity(model, tok, TEXTS)
    assert len(losses) == 9 and after < 0.5 * before
    with pytest.raises(ValueError, match="no non-empty"):
        finetune_lm(model, tok, ["", "  "])


def test_mean_ci_student_t() -> None:
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci([5.0])[1]) and mean_ci([5.0])[0] == 5.0
    assert mean_ci([2.0, 2.0])[1] == 0.0


def test_split_keeps_patients_together_and_is_seeded() -> None:
    rows = [{"doc_id": f"{p}-{n}", "metadata": f'{{"patient": "{p}"}}'} for p in range(200) for n in range(3)]
    by_patient: dict[str, set[str]] = {}
    for r in rows:
        by_patient.setdefault(patient_of(r), set()).add(split_of(patient_of(r), 0, 0.2))
    assert all(len(s) == 1 for s in by_patient.values())
    test = sum(s == {"test"} for s in by_patient.values())
    assert 20 <= test <= 60  # about 20% of 200 patients
    assert patient_of({"doc_id": "x", "metadata": "{}"}) == "x"
    assert patient_of({"doc_id": "7", "metadata": '{"corpus": "mimic", "SUBJECT_ID": "109"}'}) == "109"
    other = {p for p in by_patient if split_of(p, 1, 0.2) == "test"}
    assert other != {p for p, s in by_patient.items() if s == {"test"}}


def test_summarize_table_and_plot(tmp_path) -> None:
    cells = [
        {"setting": "known", "method": "icl", "seed": s, "pipp": p, "perplexity": 20.0 + s, "mauve": 0.5}
        for s, p in enumerate([0.1, 0.2, 0.3])
    ] + [{"setting": "known", "method": "baseline", "seed": 0, "pipp": 0.5, "perplexity": 19.0, "mauve": None}]
    summary = summarize(cells)
    assert [r["method"] for r in summary] == ["baseline", "icl"]  # METHOD.md order
    icl = summary[1]
    assert icl["pipp"]["mean"] == pytest.approx(0.2) and icl["pipp"]["n"] == 3
    assert "mauve" not in summary[0]
    md = table(summary)
    assert "| known | ICL | – | 20.0 ± 24.8 |" in md  # percent, t-interval over 3 seeds (no outputs recorded)
    assert "| known | Baseline (ICL, no codes) | – | 50.0 |" in md  # one seed: no interval
    plot(summary, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_dp_rows_state_their_unit_and_the_not_private_stamp() -> None:
    """A DP cell's privacy unit and (only for reproducible noise) its not-private stamp reach the summary row
    and the table; other rows carry neither."""
    stamp = "reproducible DP noise (training.dp.reproducible_noise)"
    cells = [{"setting": "known", "method": "prefix_dp8", "seed": s, "epsilon": 7.9, "dp_unit": "patient"}
             for s in (0, 1)]  # fmt: skip
    cells += [{"setting": "known", "method": "prefix_dp4", "seed": 0, "epsilon": 3.9, "dp_unit": "note",
               "not_private": stamp}, {"setting": "known", "method": "icl", "seed": 0, "pipp": 0.1}]  # fmt: skip
    rows = {r["method"]: r for r in summarize(cells)}
    assert rows["prefix_dp8"]["dp_unit"] == "patient" and "not_private" not in rows["prefix_dp8"]
    assert rows["prefix_dp4"]["dp_unit"] == "note" and rows["prefix_dp4"]["not_private"] == stamp
    assert "dp_unit" not in rows["icl"] and "not_private" not in rows["icl"]
    md = table(summarize(cells)).splitlines()
    dp8, dp4 = (next(x for x in md if f"eps {e} (" in x) for e in (8, 4))
    assert "(per patient)" in dp8 and "NOT PRIVATE" not in dp8
    assert "(per note)" in dp4 and "NOT PRIVATE" in dp4


def test_bootstrap_ci_matches_the_binomial_interval_and_pools_seeds():
    import random

    from ctrlgen.experiment import bootstrap_ci

    rng = random.Random(0)
    groups = [[float(rng.random() < 0.3) for _ in range(32)] for _ in range(3)]  # 96 outputs, 3 seeds
    m, h = bootstrap_ci(groups, seed=1)
    p = sum(map(sum, groups)) / 96
    assert m == pytest.approx(p) and h == pytest.approx(1.96 * (p * (1 - p) / 96) ** 0.5, rel=0.15)
    assert h <= 0.10  # 96 outputs bound a proportion's half-width by 10 points
    assert bootstrap_ci([[1.0] * 10, [1.0] * 5]) == (1.0, 0.0)
    assert bootstrap_ci([[0.5]])[0] == 0.5 and bootstrap_ci([[]])[0] != bootstrap_ci([[]])[0]  # NaN when empty
    assert bootstrap_ci(groups, seed=1) == (m, h)  # seeded


def test_summary_uses_the_bootstrap_where_outputs_are_recorded():
    from ctrlgen.experiment import summarize, table

    cells = [{"setting": "known", "method": "icl", "seed": s, "outputs": 4, "pipp": sum(v) / 4, "mauve": 0.5 + s / 10,
              "per_output": {"pipp": v}} for s, v in enumerate([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])]  # fmt: skip
    [row] = summarize(cells)
    assert row["outputs"] == 8 and row["pipp"]["ci"] == "bootstrap" and row["pipp"]["n"] == 8
    assert row["pipp"]["mean"] == pytest.approx(3 / 8) and row["mauve"]["n"] == 2 and "ci" not in row["mauve"]
    md = table([row])
    assert "| known | ICL | 8 | 37.5 ± " in md and "† stratified bootstrap" in md
