"""docs/quickstart.md followed on a NOTEEVENTS CSV with PHI typed in: warned in the known setting,
released in the unknown one with none of the typed values and a release card."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ctrlgen.metrics.leakage import ValueIndex

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

FIRST = ["John", "Maria", "Robert", "Linda", "Ahmed", "Grace", "Peter", "Helen", "Tomas", "Nadia", "Oscar", "Ruth"]
LAST = ["Smithers", "Kowalski", "Okafor", "Brennan", "Haddad", "Lindqvist", "Moreau", "Castillo", "Novak",
        "Petrova", "Delgado", "Whitfield"]  # fmt: skip


def _notes() -> tuple[list[dict[str, str]], list[str]]:
    rows, typed = [], []
    for i, (first, last) in enumerate(zip(FIRST, LAST, strict=True)):
        mrn, date = f"{4810223 + 7919 * i}", f"{1 + i % 12}/{3 + i}/2101"
        text = (
            f"Patient: {first} {last}\nMRN: {mrn}\nAdmission Date: {date}\n\n"
            f"{first} {last} is a 67 year old seen by Dr. {LAST[(i + 3) % 12]} for chest pain. "
            f"Troponin negative. Discharged home on aspirin. Follow up with Dr. {LAST[(i + 5) % 12]} in two weeks."
        )
        rows.append({"ROW_ID": str(100 + i), "SUBJECT_ID": str(900 + i), "HADM_ID": "", "CHARTDATE": "",
                     "CHARTTIME": "", "STORETIME": "", "CATEGORY": "Discharge summary", "DESCRIPTION": "Report",
                     "CGID": "", "ISERROR": "", "TEXT": text})  # fmt: skip
        typed += [f"{first} {last}", last, mrn, date]
    return rows, typed


def _run(args, tmp_path, name):
    res = subprocess.run([sys.executable, "-m", "ctrlgen.cli", *args, "ray.num_cpus=4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    (tmp_path / f"{name}.log").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return res


def test_raw_notes_warn_in_the_known_setting_and_release_clean_in_the_unknown(tmp_path):
    rows, typed = _notes()
    csv_path = tmp_path / "NOTEEVENTS.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base = ["-c", "configs/quickstart.yaml", f"corpus.path={csv_path}", "extraction.num_actors=1"]

    # The mistake the quickstart warns of: raw notes read in the known setting give no entity, and say so.
    known = _run(["extract", *base, "extraction.setting=known", f"output_dir={tmp_path / 'known'}"], tmp_path, "k")
    assert "12 of 12 notes (100%) have no private entity" in known.stderr
    assert "written out" in known.stderr and "extraction.setting=unknown" in known.stderr

    # The raw-notes run through the Python API, as docs/quickstart.md shows it.
    out = tmp_path / "run"
    script = f"""
import json, ctrlgen
r = ctrlgen.synthesize({str(csv_path)!r}, {str(out)!r}, config="configs/quickstart.yaml",
    model={{"name": "tiny-llama"}}, extraction={{"num_actors": 1}}, ray={{"num_cpus": 4}},
    generation={{"num_documents": 8, "num_actors": 1, "context_pool_size": 12, "max_context_tokens": 128,
                "sampling": {{"max_new_tokens": 24}}}})
print("RESULT", json.dumps({{"release": r.release, "exported": r.card["exported"], "stages": r.stages}}))
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=900)
    (tmp_path / "s.log").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    result = json.loads(res.stdout.split("RESULT ", 1)[1])
    release = out / "release"
    assert result["release"] == str(release) and result["stages"]["export"].startswith("ran")
    card = json.loads((release / "release.json").read_text())
    assert card["exported"] == result["exported"]
    assert card["method"]["extraction_setting"] == "unknown" and "missed" in card["guarantee"]["extraction"]
    assert card["modes"]["icl_blocking"]["generated"] == 8
    files = [f for f in release.rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {"RELEASE.md", "release.json", "notes-00000.csv"} or card["exported"] == 0
    found = ValueIndex(typed)
    for f in files:
        text = pq.read_table(f).to_pandas().to_csv() if f.suffix == ".parquet" else f.read_text()
        assert not found.find(text), f"{f.name} holds a value typed into the input"
    # The extractor saw what was typed: every note's name and MRN is a private value of its control code.
    from ctrlgen.generation.synthesis import iter_extracted

    codes = " ".join(r["control_code"] or "" for b in iter_extracted(out / "extracted") for r in b)
    assert all(f"{a} {b}" in codes for a, b in zip(FIRST, LAST, strict=True)), codes[:2000]
