"""Paths that may be URIs: ``s3://``, ``gs://``, ``file://`` or plain local paths, through ``pyarrow.fs``.

The jobs' inputs and outputs are strings, never ``pathlib.Path`` of a URI: ``Path("s3://b/x")``
collapses to ``s3:/b/x``. These helpers keep URIs intact and give the file system to read and
write them with (``pyarrow.fs``; Ray Data and Ray Train take the same strings).

S3-compatible servers other than AWS (MinIO, a test's moto server) are reached through the
standard ``AWS_ENDPOINT_URL`` environment variable, which Arrow's S3 file system reads, or through
query parameters of the URI (``s3://bucket/x?endpoint_override=127.0.0.1:9000&scheme=http``).

Example:
    >>> join("s3://bucket/runs", "extracted", "status=ok")
    's3://bucket/runs/extracted/status=ok'
    >>> join("runs/x", "generated")
    'runs/x/generated'
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["exists", "filesystem", "is_dir", "is_uri", "join", "list_files", "read_text", "remove", "write_text"]


def is_uri(path: str) -> bool:
    """True for ``scheme://...`` (a Windows drive letter is not a scheme)."""
    return "://" in path and len(path.split("://", 1)[0]) > 1


def join(base: str, *parts: str) -> str:
    """``base`` / parts, keeping a URI's scheme, bucket and query intact."""
    if not is_uri(base):
        return posixpath.join(base, *parts)
    u = urlsplit(base)
    return urlunsplit((u.scheme, u.netloc, posixpath.join(u.path or "/", *parts), u.query, u.fragment))


def filesystem(path: str) -> tuple[Any, str]:
    """(``pyarrow.fs`` file system, path inside it) for a URI or a local path (made absolute)."""
    import os

    import pyarrow.fs as pafs

    if not is_uri(path):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    fs, inner = pafs.FileSystem.from_uri(path)
    return fs, inner


def exists(path: str) -> bool:
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    return bool(fs.get_file_info(p).type != pafs.FileType.NotFound)


def is_dir(path: str) -> bool:
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    return bool(fs.get_file_info(p).type == pafs.FileType.Directory)


def list_files(path: str, suffix: str = "", recursive: bool = True) -> list[str]:
    """Files under ``path`` ending in ``suffix``, as strings of the same kind as ``path`` (sorted).

    Names starting with ``_`` or ``.`` (markers, temporary files) are left out, as Arrow's
    dataset readers do.
    """
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    if fs.get_file_info(p).type != pafs.FileType.Directory:
        return []
    infos = fs.get_file_info(pafs.FileSelector(p, recursive=recursive))
    out = []
    for info in infos:
        rel = posixpath.relpath(info.path, p)
        if info.type != pafs.FileType.File or not rel.endswith(suffix):
            continue
        if any(part.startswith(("_", ".")) for part in rel.split("/")):
            continue
        out.append(join(path, rel))
    return sorted(out)


def read_text(path: str) -> str:
    fs, p = filesystem(path)
    with fs.open_input_stream(p) as f:
        return bytes(f.read()).decode("utf-8")


def write_text(path: str, text: str) -> None:
    """Write ``text`` so that a reader sees the old file or the whole new one, never a part.

    Object stores make a PUT visible whole; a local file is written beside and renamed over.
    """
    fs, p = filesystem(path)
    parent = posixpath.dirname(p)
    if parent:
        fs.create_dir(parent, recursive=True)
    if fs.type_name == "local":
        tmp = posixpath.join(parent, f".{posixpath.basename(p)}.{uuid.uuid4().hex[:8]}.tmp")
        with fs.open_output_stream(tmp) as f:
            f.write(text.encode("utf-8"))
        fs.move(tmp, p)
    else:
        with fs.open_output_stream(p) as f:
            f.write(text.encode("utf-8"))


def remove(path: str) -> None:
    """Delete a file or a whole directory tree; nothing when it does not exist."""
    import pyarrow.fs as pafs

    fs, p = filesystem(path)
    kind = fs.get_file_info(p).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(p)
    elif kind == pafs.FileType.File:
        fs.delete_file(p)
