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
    # percent; no outputs recorded: Student's t over the 3 seeds (20.0 ± 24.8), cut at 0
    assert "| known | ICL | – | 20.0 [0.0, 44.8] |" in md and "PIPP %: Student's t" in md
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


def test_proportion_intervals_match_known_values() -> None:
    from ctrlgen.intervals import clopper_pearson, wilson

    # 0 of n: the upper bound, never 0 +- 0 (the exact bound is 1 - 0.025 ** (1 / n))
    assert wilson(0, 96) == (0.0, pytest.approx(0.0385, abs=5e-5))
    assert clopper_pearson(0, 96) == (0.0, pytest.approx(1 - 0.025 ** (1 / 96), abs=1e-9))  # 3.77%
    assert clopper_pearson(0, 24)[1] == pytest.approx(0.1425, abs=5e-5)  # 14.2% at 24 outputs
    # textbook values: 5 of 10 and 0 of 10
    assert wilson(5, 10) == (pytest.approx(0.2366, abs=5e-5), pytest.approx(0.7634, abs=5e-5))
    assert clopper_pearson(5, 10) == (pytest.approx(0.1871, abs=5e-5), pytest.approx(0.8129, abs=5e-5))
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=5e-5) and clopper_pearson(0, 10)[1] == pytest.approx(
        0.3085, abs=5e-5
    )
    # 1 of 96: the exact interval from the beta quantiles (scipy's, as computed once)
    assert clopper_pearson(1, 96) == (pytest.approx(0.000264, abs=1e-6), pytest.approx(0.05667, abs=1e-5))
    for k, n in ((1, 96), (17, 96), (3, 7)):  # never outside [0, 1], symmetric in k <-> n - k
        lo, hi = clopper_pearson(k, n)
        lo2, hi2 = clopper_pearson(n - k, n)
        assert 0 < lo < k / n < hi < 1 and (lo, hi) == (pytest.approx(1 - hi2), pytest.approx(1 - lo2))
        wlo, whi = wilson(k, n)
        assert 0 < wlo < k / n < whi < 1 and (whi - wlo) < (hi - lo)  # Wilson is the narrower
    assert clopper_pearson(96, 96)[1] == 1.0 and wilson(96, 96)[1] == 1.0
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(5, 4)


def test_cluster_bootstrap_resamples_whole_clusters() -> None:
    import random

    from ctrlgen.intervals import cluster_bootstrap, cluster_bootstrap_diff

    rng = random.Random(0)
    base = [rng.random() for _ in range(30)]
    once = cluster_bootstrap(base, list(range(30)), seed=1)
    # every value 4 times, as when one note is attacked in 4 seeds: as items, 120 "independent" values
    values = [v for v in base for _ in range(4)]
    as_items = cluster_bootstrap(values, list(range(120)), seed=1)
    as_clusters = cluster_bootstrap(values, [i // 4 for i in range(120)], seed=1)
    width = lambda t: t[2] - t[1]  # noqa: E731
    assert as_items[0] == as_clusters[0] == pytest.approx(sum(base) / 30)
    assert width(as_clusters) == pytest.approx(width(once), rel=0.15)  # 30 clusters carry 30 values' information
    assert width(as_items) == pytest.approx(width(once) / 2, rel=0.2)  # item resampling: too narrow by sqrt(4)
    assert cluster_bootstrap(values, [i // 4 for i in range(120)], seed=1) == as_clusters  # seeded
    m, lo, hi = cluster_bootstrap([0.2, 0.4], ["a", "a"])  # one cluster: no interval
    assert m == pytest.approx(0.3) and math.isnan(lo) and math.isnan(hi)
    assert cluster_bootstrap([1.0] * 6, list("aabbcc"))[1:] == (1.0, 1.0)
    with pytest.raises(ValueError, match="cluster ids"):
        cluster_bootstrap([1.0, 2.0], ["a"] * 3)
    # a difference of means: contains the true difference, and 0 when both samples come from one distribution
    a = [rng.gauss(0.9, 0.05) for _ in range(60)]
    b = [rng.gauss(0.5, 0.05) for _ in range(60)]
    d, lo, hi = cluster_bootstrap_diff(a, list(range(60)), b, list(range(60)))
    assert lo < 0.4 < hi and d == pytest.approx(sum(a) / 60 - sum(b) / 60)
    c = [rng.gauss(0.9, 0.05) for _ in range(60)]
    _, lo, hi = cluster_bootstrap_diff(a, list(range(60)), c, list(range(60)))
    assert lo < 0 < hi


def _cell(seed: int, pipp: list[float], **extra: object) -> dict:
    return {"setting": "known", "method": "icl_blocking", "seed": seed, "outputs": len(pipp),
            "pipp": sum(pipp) / len(pipp), "per_output": {"pipp": pipp}, **extra}  # fmt: skip


def test_zero_of_n_shows_its_upper_bound_and_counts_are_recovered_without_per_output_values() -> None:
    [row] = summarize([_cell(s, [0.0] * 32) for s in range(3)])
    assert (row["pipp"]["k"], row["pipp"]["n"], row["pipp"]["ci"]) == (0, 96, "exact")
    assert row["pipp"]["lo"] == 0.0 and row["pipp"]["hi"] == pytest.approx(0.0377, abs=5e-5)
    md = table([row])
    assert "| 0.0 [0.0, 3.8] |" in md and "± 0.0" not in md and "Clopper-Pearson" in md
    # an older cell without per-output values: k from the rate and the output count; ctx_1 the same way
    old = [{"setting": "known", "method": "icl", "seed": s, "outputs": 32, "pipp": r, "ctx_1": 1 / 32}
           for s, r in enumerate([1 / 32, 0.0, 2 / 32])]  # fmt: skip
    [row] = summarize(old)
    assert (row["pipp"]["k"], row["pipp"]["n"]) == (3, 96) and (row["ctx_1"]["k"], row["ctx_1"]["n"]) == (3, 96)
    assert row["pipp"]["lo"] > 0  # 3 of 96: a positive lower bound, never a negative one


def test_per_record_scores_are_bootstrapped_by_patient_and_read_against_their_chance_level() -> None:
    """The attacked notes' scores are resampled by patient (the same patient attacked in every seed is one
    cluster); the held-out notes give the chance level and the gap; a run without clusters falls back to t."""
    import random

    rng = random.Random(3)
    cells = []
    for s in range(3):
        patients = [f"p{i // 2}" for i in range(20)]  # 10 patients, 2 notes each, the same every seed
        per_record = {"cluster": patients, "linkable": [True] * 20, "correct": [i < 5 for i in range(20)],
                      "semantic_privacy": [rng.uniform(0.3, 0.5) for _ in range(20)],
                      "lexical_privacy": [rng.uniform(0.6, 0.8) for _ in range(20)]}  # fmt: skip
        chance = {"cluster": [f"h{i}" for i in range(16)], "semantic_privacy": [rng.uniform(0.8, 1.0) for _ in range(16)],
                  "lexical_privacy": [rng.uniform(0.85, 0.95) for _ in range(16)]}  # fmt: skip
        cells.append({"setting": "known", "method": "anon_llm", "seed": s, "outputs": 20, "sem_linkable": 20,
                      "sem_link": 0.25, "sem_link_chance": 0.05, "per_record": per_record, "per_record_chance": chance,
                      "semantic_privacy": sum(per_record["semantic_privacy"]) / 20,
                      "lexical_privacy": sum(per_record["lexical_privacy"]) / 20})  # fmt: skip
    [row] = summarize(cells)
    sp = row["semantic_privacy"]
    assert sp["ci"] == "cluster" and sp["clusters"] == 10 and sp["n"] == 60 and sp["lo"] < sp["mean"] < sp["hi"]
    assert (row["sem_link"]["k"], row["sem_link"]["n"], row["sem_link"]["ci"]) == (15, 60, "exact")
    assert row["sem_link_chance"]["mean"] == pytest.approx(0.05)
    chance, gap = row["semantic_privacy_chance"], row["semantic_privacy_gap"]
    assert chance["clusters"] == 16 and 0.8 < chance["mean"] < 1.0
    assert gap["mean"] == pytest.approx(chance["mean"] - sp["mean"]) and 0.3 < gap["lo"] < gap["mean"] < gap["hi"]
    md = table([row])
    assert "cluster bootstrap" in md and "chance level minus score" in md
    # the same cells without cluster ids or held-out notes (an older run): t over the seeds, "not in this run"
    for c in cells:
        c.pop("per_record_chance")
        c.pop("sem_link_chance")
        c["per_record"].pop("cluster")
    [old] = summarize(cells)
    assert old["semantic_privacy"]["ci"] == "t" and "semantic_privacy_chance" not in old
    assert old["sem_link"]["ci"] == "exact"  # linkable / correct still give k of n
    assert table([old]).count("not in this run") == 4  # semantic linkage, lexical and semantic chance, the gap


def test_canary_exposure_is_bootstrapped_over_the_canaries() -> None:
    """A prefix shared by the seeds: every seed's cell copies its per-canary exposures; the interval resamples
    whole canaries (the mean exposure does not move, and the copies do not narrow it). Without per-canary
    values the copies give one value and no interval."""
    from ctrlgen.intervals import cluster_bootstrap

    ex = [0.5, 1.2, 4.0, 8.9]
    per = {"exposure": ex, "cluster": [f"canary{i}" for i in range(4)]}
    cells = [{"setting": "known", "method": "prefix", "seed": s, "exposure": sum(ex) / 4, "per_canary": per}
             for s in range(3)]  # fmt: skip
    [row] = summarize(cells)
    fig = row["exposure"]
    assert fig["ci"] == "canary" and fig["clusters"] == 4 and fig["mean"] == pytest.approx(sum(ex) / 4)
    _, lo, hi = cluster_bootstrap(ex, per["cluster"], seed=0)
    assert fig["lo"] < fig["mean"] < fig["hi"] and (fig["lo"], fig["hi"]) == pytest.approx((lo, hi), abs=0.3)
    md = table([row])
    assert "whole canaries resampled" in md
    [row] = summarize([{k: v for k, v in c.items() if k != "per_canary"} for c in cells])
    assert row["exposure"]["ci"] is None and math.isnan(row["exposure"]["lo"])


def test_an_empty_side_of_the_patient_split_is_a_clear_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.errors import CtrlgenError
    from ray_jobs.experiment import _split_rows

    (tmp_path / "split=train").mkdir()
    pq.write_table(pa.table({"doc_id": ["a", "b", "c"]}), tmp_path / "split=train" / "part-0.parquet")
    n, files = _split_rows(str(tmp_path / "split=train"), "known", "train")
    assert n == 3 and [f.rsplit("/", 1)[-1] for f in files] == ["part-0.parquet"]
    with pytest.raises(CtrlgenError, match="known setting's test split is empty"):
        _split_rows(str(tmp_path / "split=test"), "known", "test")
