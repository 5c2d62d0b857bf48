"""URI-safe paths over pyarrow.fs (local and file:// here; s3:// in the integration tests of remote storage)."""

import pytest

from ctrlgen import storage


def test_uris_keep_their_scheme_and_bucket():
    assert storage.join("s3://bucket/runs", "extracted", "status=ok") == "s3://bucket/runs/extracted/status=ok"
    assert storage.join("s3://bucket", "x") == "s3://bucket/x"
    assert storage.join("s3://b/x?endpoint_override=127.0.0.1:9000&scheme=http", "y") == (
        "s3://b/x/y?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert storage.join("runs/x", "generated") == "runs/x/generated"
    assert storage.is_uri("gs://b/x") and storage.is_uri("file:///tmp/x")
    assert not storage.is_uri("runs/x") and not storage.is_uri("C://x")
    assert storage.parent("s3://b/run/adapter/") == "s3://b/run"
    assert storage.parent("s3://b/run/adapter?scheme=http") == "s3://b/run?scheme=http"
    assert storage.parent("/x/run/adapter") == "/x/run"
    assert storage.absolute("s3://b/x") == "s3://b/x" and storage.absolute("x").startswith("/")


@pytest.mark.parametrize("kind", ["plain", "file"])
def test_write_read_list_remove(tmp_path, kind):
    base = str(tmp_path / "out") if kind == "plain" else f"file://{tmp_path / 'out'}"
    assert not storage.exists(base)
    storage.write_text(storage.join(base, "a", "x.parquet"), "one")
    storage.write_text(storage.join(base, "a", "x.parquet"), "two")  # replaced whole
    storage.write_text(storage.join(base, "b.parquet"), "b")
    storage.write_text(storage.join(base, "_commits", "m"), "marker")
    storage.write_text(storage.join(base, "c.json"), "{}")
    assert storage.is_dir(base) and storage.read_text(storage.join(base, "a", "x.parquet")) == "two"
    files = storage.list_files(base, ".parquet")
    assert files == [storage.join(base, "a", "x.parquet"), storage.join(base, "b.parquet")]
    assert not [p for p in (tmp_path / "out" / "a").iterdir() if p.name.endswith(".tmp")]
    storage.remove(base)
    assert not storage.exists(base) and storage.list_files(base) == []
    storage.remove(base)  # already gone: nothing


@pytest.mark.parametrize("kind", ["plain", "file"])
def test_parquet_rows_sums_the_footers(tmp_path, kind):
    import pyarrow as pa

    base = str(tmp_path / "p") if kind == "plain" else f"file://{tmp_path / 'p'}"
    for name, n in (("a", 3), ("b", 0), ("c", 130)):
        table = pa.table({"x": list(range(n))}, schema=pa.schema([("x", pa.int64())]))
        storage.write_parquet(table, storage.join(base, f"{name}.parquet"), row_group_size=16)
    files = storage.list_files(base, ".parquet")
    assert storage.parquet_rows(files) == 133 == storage.dataset(files).count_rows()
    assert storage.parquet_rows([]) == 0


def test_local_copy_of_a_local_path_is_the_path(tmp_path):
    with storage.local_copy(str(tmp_path)) as d:
        assert d == str(tmp_path)
    assert tmp_path.exists()  # never removed: only downloads are
