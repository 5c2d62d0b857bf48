"""The experiment matrix end to end (tiny random Llama, 200 PhysioNet notes), and Ray vs local evaluation."""

import json

import pytest

from ctrlgen.experiment import summarize, table
from ctrlgen.metrics.evaluate import Evaluator, RealDoc, aggregate

pytestmark = pytest.mark.integration

CONFIG = "configs/experiment_tiny.yaml"
METHODS = ["baseline", "icl", "icl_blocking", "prefix", "prefix_masked"]


def test_experiment_matrix_writes_table_json_and_plot(ray_cluster, tmp_path, shared, capsys):
    from ctrlgen.cli import main

    out = tmp_path / "exp"
    assert main(["experiment", "-c", CONFIG, f"output_dir={out}", f"corpus.path={shared / 'physionet-deid'}"]) == 0
    res = out / "results"
    data = json.loads((res / "results.json").read_text())
    cells = data["cells"]
    for setting in ("known", "unknown"):
        for method in METHODS:
            seeds = sorted(c["seed"] for c in cells if c["setting"] == setting and c["method"] == method)
            assert seeds == [0, 1], (setting, method)
    matrix = [c for c in cells if c["setting"] != "reference"]
    assert all(c["outputs"] >= 2 and c["quarantined"] == 0 for c in matrix)
    for c in matrix:  # every metric present and in range
        assert 0 <= c["pipp"] <= 1 and 0 <= c["elp"] <= 1 and 0 <= c["rouge2"] <= 1 and 0 <= c["rougeL"] <= 1
        assert all(0 <= c[f"ctx_{k}"] <= 1 for k in (1, 2, 3, 4)) and 0 <= c["link_values"] <= 1
        assert c["perplexity"] > 1 and 0 < c["mauve"] <= 1
        assert ("exposure" in c) == c["method"].startswith("prefix")
    # the baseline has no codes: one generation per seed, reported under both settings
    base = {s: [c for c in matrix if c["method"] == "baseline" and c["setting"] == s] for s in ("known", "unknown")}
    assert [c["rougeL"] for c in base["known"]] == [c["rougeL"] for c in base["unknown"]]
    assert {c["method"] for c in cells if c["setting"] == "reference"} == {"real", "base"}
    # the committed Markdown is the JSON's cells summarised (mean and 95% CI over seeds)
    assert (res / "results.md").read_text() == table(summarize(cells)) + "\n"
    assert (res / "privacy_utility.png").read_bytes()[:4] == b"\x89PNG"
    assert "| known | Prefix tuning + masking |" in capsys.readouterr().out


def test_ray_evaluation_equals_the_local_loop(ray_cluster):
    from ray_jobs.evaluate import evaluate_rows

    real = [
        RealDoc("a", "Seen by Dr Smith on ward 5 today.", ("Smith", "5"), ((11, 16), (25, 26))),
        RealDoc("b", "Mrs Jones called from Boston about her mother.", ("Jones", "Boston"), ((4, 9), (22, 28))),
        RealDoc("c", "No names here at all, only fever.", (), ()),
    ]
    texts = ["Dr Smith saw her on ward 5.", "Mrs Jones called from Boston.", "fever only", "", "Smith and Jones"]
    rows = [
        {"doc_id": f"t{i}", "mode": mode, "text": t, "context_ids": ctx, "status": "ok" if t else "quarantined"}
        for i, t in enumerate(texts)
        for mode, ctx in (("icl", ["a", "b", "c"]), ("prefix", []))
    ]
    ft = ["a", "b"]
    local = Evaluator({d.doc_id: d for d in real}, ft).table(rows).to_pylist()
    ray_records = evaluate_rows(rows, real, ft, num_actors=2, block_rows=3)
    assert ray_records == local
    n_values = len(Evaluator({d.doc_id: d for d in real}, ft).ft_values)
    assert aggregate(ray_records, n_values) == aggregate(local, n_values)
    assert aggregate(local, n_values)["icl"]["pipp"] == pytest.approx(3 / 4)
