"""docs/results.md is rendered from its results JSONs (ctrlgen.experiment_report), never typed around the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrlgen.errors import CtrlgenError
from ctrlgen.experiment_report import check_note, render_page, write_or_check

ROOT = Path(__file__).resolve().parents[2]


def test_committed_results_page_equals_its_rendering_from_the_json() -> None:
    page = render_page(ROOT / "docs" / "results_page.json")
    assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == page, (
        "docs/results.md is not the rendering of docs/results_page.json and its results JSONs: "
        "run `ctrlgen results-page` (and commit both)"
    )


def test_figures_on_the_page_follow_the_json(tmp_path: Path) -> None:
    """Change one output in the comparison JSON: the table, its interval and the reading's sentence change with it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    spec = json.loads((ROOT / "docs" / "results_page.json").read_text())
    spec["runs"] = spec["runs"][:1]
    (docs / "results_page.json").write_text(json.dumps(spec))
    # The committed run's ICL + blocking (known) cells, set to exactly one leaking output of 96 (any rerun's
    # figures may differ; the test is about the page following them)
    data = json.loads((ROOT / "docs" / "results_compare.json").read_text())
    cells = [c for c in data["cells"] if c["setting"] == "known" and c["method"] == "icl_blocking"]
    for k, c in enumerate(cells):
        n = len(c["per_output"]["pipp"])
        c["per_output"]["pipp"] = [1.0 if (k, i) == (0, 0) else 0.0 for i in range(n)]
        c["pipp"] = sum(c["per_output"]["pipp"]) / n
    (docs / "results_compare.json").write_text(json.dumps(data))
    before = render_page(docs / "results_page.json")
    assert "| known | ICL + blocking | 96 | 1.0 [0.0, 5.7] |" in before  # 1 of 96, Clopper-Pearson
    assert "ICL + blocking 1.0% [0.0, 5.7] (1 of 96)" in before

    data = json.loads((docs / "results_compare.json").read_text())
    for c in data["cells"]:  # the one leaking output of ICL + blocking (known) no longer leaks
        if c["setting"] == "known" and c["method"] == "icl_blocking" and 1.0 in c["per_output"]["pipp"]:
            c["per_output"]["pipp"] = [0.0] * len(c["per_output"]["pipp"])
            c["pipp"] = 0.0
    (docs / "results_compare.json").write_text(json.dumps(data))
    after = render_page(docs / "results_page.json")
    assert "| known | ICL + blocking | 96 | 0.0 [0.0, 3.8] |" in after  # 0 of 96: its upper bound, not 0 +- 0
    assert "ICL + blocking 0.0% [0.0, 3.8] (0 of 96)" in after and "± 0.0" not in after

    assert write_or_check(docs / "results_page.json", docs / "results.md", check=True) == 1  # nothing written yet
    assert write_or_check(docs / "results_page.json", docs / "results.md", check=False) == 0
    assert write_or_check(docs / "results_page.json", docs / "results.md", check=True) == 0
    assert (docs / "results_compare_privacy_utility.png").read_bytes()[:4] == b"\x89PNG"  # the plot, redrawn


def test_hand_written_notes_may_not_hold_figures(tmp_path: Path) -> None:
    assert check_note("Run `ctrlgen results-page` after a rerun (`configs/experiment_compare.yaml`).")
    with pytest.raises(CtrlgenError, match="holds a figure"):
        check_note("Masking lowers PIPP from 62.5 to 60.4%.")
    spec = {"title": "t", "intro": "The table shows 96 outputs.", "runs": []}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    with pytest.raises(CtrlgenError, match="intro holds a figure"):
        render_page(tmp_path / "s.json")
    (tmp_path / "s.json").write_text(json.dumps({"title": "t", "runs": [{"title": "r", "json": "missing.json"}]}))
    with pytest.raises(CtrlgenError, match="cannot read"):
        render_page(tmp_path / "s.json")
