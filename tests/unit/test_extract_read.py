"""The extraction job's read of NOTEEVENTS files: large gzip files, which one task must read whole, are named."""

from __future__ import annotations

import gzip

from ray_jobs.extract import _compressed_csv_warnings


def test_a_large_gzip_noteevents_file_gets_a_warning_naming_it_and_the_ingest_step(tmp_path) -> None:
    gz = tmp_path / "NOTEEVENTS.csv.gz"
    gz.write_bytes(gzip.compress(b"ROW_ID,SUBJECT_ID,CATEGORY,TEXT\n1,2,Nursing,Patient John Smith\n" * 2000))
    plain = tmp_path / "other.csv"
    plain.write_text("ROW_ID,SUBJECT_ID,CATEGORY,TEXT\n")
    (warning,) = _compressed_csv_warnings([str(gz), str(plain)], limit=1)
    assert warning.startswith("NOTEEVENTS.csv.gz (") and "one task" in warning and "ctrlgen ingest" in warning
    assert "John" not in warning and str(tmp_path) not in warning  # the file name only, no text
    assert _compressed_csv_warnings([str(gz)]) == []  # under the default 64 MiB
