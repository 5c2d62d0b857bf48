"""The Ray Data ICL generation job on a local Ray cluster started by the test (tiny model)."""

import pytest

from ctrlgen.generation.report import read_generated
from ctrlgen.metrics.leakage import leaked_values

pytestmark = pytest.mark.integration


def test_generation_job_on_the_shared_clinical_notes(ray_cluster, tmp_path, shared, capsys):
    from ctrlgen.cli import main

    overrides = [f"output_dir={tmp_path}", f"corpus.path={shared / 'physionet-deid'}"]
    assert main(["generate", "-c", "configs/generate_tiny.yaml", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "targets 6 x modes -> rows 18" in printed and "| icl_blocking |" in printed
    rows = read_generated(tmp_path / "generated")
    assert len(rows) == 18 and {r["mode"] for r in rows} == {"baseline", "icl", "icl_blocking"}
    assert all(r["status"] == "ok" for r in rows)
    by_doc = {}
    for r in rows:
        by_doc.setdefault(r["doc_id"], {})[r["mode"]] = r
    for modes in by_doc.values():
        assert len({tuple(m["context_ids"]) for m in modes.values()}) == 1
        # The fictional code never reuses a real value of the contexts.
        fake = modes["icl"]["fictional_code"]
        assert fake and not leaked_values(fake, modes["icl"]["context_values"])
    for r in rows:
        if r["mode"] == "icl_blocking" and r["released"]:
            assert not leaked_values(r["text"], r["context_values"])
    # Same config, same seed: the same synthetic notes (per-row seeds, no dependence on scheduling).
    assert main(["generate", "-c", "configs/generate_tiny.yaml", *overrides, f"output_dir={tmp_path / 'again'}",
                 f"generation.input={tmp_path / 'extracted'}"]) == 0  # fmt: skip
    again = {(r["doc_id"], r["mode"]): r["text"] for r in read_generated(tmp_path / "again" / "generated")}
    assert again == {(r["doc_id"], r["mode"]): r["text"] for r in rows}


def test_generation_job_reports_a_missing_input(ray_cluster, tmp_path, capsys):
    from ctrlgen.cli import main

    code = main(["generate", "-c", "configs/generate_tiny.yaml", f"generation.input={tmp_path / 'none'}"])
    assert code == 2 and "holds no Parquet files" in capsys.readouterr().err
