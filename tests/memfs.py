"""An in-memory Beam FileSystem (``memfs://``) for tests: a non-local filesystem, like ``gs://``, that needs no network.

Beam finds FileSystem subclasses by scheme once this module is imported. The files live in one
dict in this process, so only in-process runners (the default FnApiRunner, the DirectRunner)
see them. Like an object store it has no directories: a path is a key, a listing is a prefix.
"""

from __future__ import annotations

import io
import os
import pathlib
import time

from apache_beam.io.filesystem import BeamIOError, CompressedFile, CompressionTypes, FileMetadata, FileSystem

SCHEME = "memfs"
_FILES: dict[str, tuple[bytes, float]] = {}  # path -> (content, mtime)


class _Writer(io.BytesIO):
    """A write channel that stores its bytes under its path when closed."""

    def __init__(self, path: str):
        super().__init__()
        self.name = path

    def close(self) -> None:
        if not self.closed:
            _FILES[self.name] = (self.getvalue(), time.time())
        super().close()


class _Reader(io.BytesIO):
    def __init__(self, path: str, data: bytes):
        super().__init__(data)
        self.name = path


class MemoryFileSystem(FileSystem):
    """``memfs://bucket/key`` paths held in memory."""

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def join(self, basepath: str, *paths: str) -> str:
        return "/".join([basepath.rstrip("/"), *(path.strip("/") for path in paths)])

    def split(self, path: str) -> tuple[str, str]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path: str) -> None:
        pass  # no directories, as in an object store

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str):
        for path, (data, mtime) in sorted(_FILES.items()):
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(data), mtime)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        writer = _Writer(path)
        kind = FileSystem._get_compression_type(path, compression_type)
        return writer if kind == CompressionTypes.UNCOMPRESSED else CompressedFile(writer, kind)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        if path not in _FILES:
            raise BeamIOError("open failed", {path: FileNotFoundError(path)})
        reader = _Reader(path, _FILES[path][0])
        kind = FileSystem._get_compression_type(path, compression_type)
        return reader if kind == CompressionTypes.UNCOMPRESSED else CompressedFile(reader, kind)

    def copy(self, source_file_names, destination_file_names) -> None:
        for source, destination in zip(source_file_names, destination_file_names):
            _FILES[destination] = _FILES[source]

    def rename(self, source_file_names, destination_file_names) -> None:
        for source, destination in zip(source_file_names, destination_file_names):
            _FILES[destination] = _FILES.pop(source)

    def exists(self, path: str) -> bool:
        return path in _FILES

    def size(self, path: str) -> int:
        return len(_FILES[path][0])

    def last_updated(self, path: str) -> float:
        return _FILES[path][1]

    def checksum(self, path: str) -> str:
        return str(hash(_FILES[path][0]))

    def metadata(self, path: str) -> FileMetadata:
        if path not in _FILES:
            raise BeamIOError("metadata failed", {path: FileNotFoundError(path)})
        data, mtime = _FILES[path]
        return FileMetadata(path, len(data), mtime)

    def delete(self, paths) -> None:
        for path in paths:
            prefix = path.rstrip("/") + "/"
            doomed = [key for key in _FILES if key == path or key.startswith(prefix)]
            if not doomed:
                raise BeamIOError("delete failed", {path: FileNotFoundError(path)})
            for key in doomed:
                del _FILES[key]


def upload(directory: str | os.PathLike, url: str) -> str:
    """Copy every file under a local directory to ``url`` (hidden ones too); returns url."""
    root = pathlib.Path(directory)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            _FILES[f"{url.rstrip('/')}/{path.relative_to(root).as_posix()}"] = (path.read_bytes(), path.stat().st_mtime)
    return url


def files_under(url: str) -> dict[str, bytes]:
    """The files under ``url`` (relative path -> bytes)."""
    prefix = url.rstrip("/") + "/"
    return {path[len(prefix):]: data for path, (data, _) in sorted(_FILES.items()) if path.startswith(prefix)}


def clear(url: str) -> None:
    prefix = url.rstrip("/") + "/"
    for path in [path for path in _FILES if path.startswith(prefix)]:
        del _FILES[path]
