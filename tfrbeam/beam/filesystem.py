"""One home for file-system operations on any Beam filesystem: match, exists, read, write, rename, delete.

Everything the source, the sink, the Parquet export, the stats pipeline, the build and the commit
protocol do to files goes through this module, so each operation has one meaning (``delete_tree``
removes a directory or every object under a prefix; ``delete_files`` removes only files that
exist) and the fault-injection tests can wrap the whole file-system layer in one place.
``BEAM_FILES`` is the read-only ``FileAccess`` the format-level tools (``tfrbeam.layout.manifest``)
take for ``gs://`` and other remote paths.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import logging
import os
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO, TypeVar

from apache_beam.io.filesystem import BeamIOError, CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, S3Options

from tfrbeam.base import fileops, object_store
from tfrbeam.base.file_access import is_remote
from tfrbeam.errors import TfrbeamError

__all__ = [
    "BEAM_FILES",
    "BeamFiles",
    "create",
    "delete_files",
    "delete_tree",
    "exchange",
    "exists",
    "in_threads",
    "is_local",
    "is_remote",
    "join",
    "list_names",
    "list_objects",
    "match",
    "match_metadata",
    "mkdirs",
    "open_read",
    "parent",
    "read_at_most",
    "read_bytes",
    "rename",
    "rename_local",
    "report_source_lineage",
    "same_content",
    "split",
    "storage_settings",
    "use_pipeline_options",
    "write_bytes",
    "write_if_absent",
]

_LOG = logging.getLogger(__name__)
_MAX_IO_THREADS = 32
_T = TypeVar("_T")


def _mutating(kind: str, path: str, action: Callable[[], _T]) -> _T:
    """Every operation that changes a file goes through layout.fileops.mutating, the one function a fault harness wraps."""
    return fileops.mutating(kind, path, lambda: _storage(path, kind, action))


def _client_errors(error: BaseException, object_store_path: bool) -> list[BaseException]:
    """The storage clients' own exceptions inside ``error`` (Beam wraps them in BeamIOError, once or twice).

    On ``gs://`` and ``s3://`` every error is the client's (Beam's S3 IO turns a 404 into an OSError);
    on other filesystems an OSError is already what callers handle.
    """
    details = getattr(error, "exception_details", None)
    if isinstance(error, BeamIOError) and isinstance(details, dict) and details:
        return [inner for value in details.values() for inner in _client_errors(value, object_store_path)]
    if isinstance(error, OSError) and error.args and isinstance(error.args[0], BaseException):
        return _client_errors(error.args[0], object_store_path)
    if isinstance(error, TfrbeamError) or (isinstance(error, OSError) and not object_store_path):
        return []
    return [error]


def _storage(path: str, request: str, action: Callable[[], _T]) -> _T:
    """Run one request on Beam's FileSystems: a storage client's exception (GCS, S3) becomes our StorageError here.

    Local errors, and OSErrors of filesystems other than object stores, pass through as they are.
    """
    if object_store.is_object_store(path):
        object_store.check_reachable(path, request)
    try:
        return action()
    except Exception as error:
        inner = _client_errors(error, object_store.is_object_store(path)) if is_remote(path) else []
        if not inner:
            raise
        translated = [object_store.storage_error(each, path, request) for each in inner]
        chosen = next((each for each in translated if not isinstance(each, FileNotFoundError)), translated[0])
        raise object_store.note_unreachable(path, chosen) from error


def storage_settings(options: PipelineOptions | None) -> object_store.S3Settings:
    """Beam's S3 options (``--s3_endpoint_url`` and the rest) as the object-store clients take them."""
    if options is None:
        return object_store.S3Settings()
    s3 = options.view_as(S3Options)
    verify: bool | str | None = s3.s3_verify
    if s3.s3_disable_ssl:
        verify = False
    return object_store.S3Settings(endpoint_url=s3.s3_endpoint_url, access_key_id=s3.s3_access_key_id,
                                   secret_access_key=s3.s3_secret_access_key, session_token=s3.s3_session_token,
                                   region_name=s3.s3_region_name, verify=verify)


def use_pipeline_options(options: PipelineOptions | None) -> None:
    """Let every file operation of this process (Beam's FileSystems and our own requests) use the pipeline's options.

    Beam hands a pipeline's options to its FileSystems only when the pipeline is made; the checks
    before it (inputs listed, the output probed, the lock taken) need them first, or ``s3://`` has
    no endpoint or credentials. Under ``STORAGE_EMULATOR_HOST`` Beam's GCS IO is asked for ``--no_auth``
    (Beam 2.77 ignores it and retries Google credentials for 20-30 s first: docs/cloud-storage.md).
    """
    options = options if options is not None else PipelineOptions([])
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        options.view_as(GoogleCloudOptions).no_auth = True
    FileSystems.set_options(options)
    object_store.configure_s3(storage_settings(options))


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local or remote base with the right separator."""
    return FileSystems.join(base, *parts) if parts else base


def split(path: str) -> tuple[str, str]:
    """(directory, basename) of a local or remote path."""
    return FileSystems.split(path)


def parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(os.path.abspath(path))


def is_local(path: str) -> bool:
    return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def match(pattern: str) -> dict[str, FileMetadata]:
    """Files matching a glob, by path; {} when nothing matches (or the directory does not exist)."""
    try:
        results = _storage(pattern, "list", lambda: FileSystems.match([pattern]))
    except (OSError, ValueError):
        return {}
    return {meta.path: meta for result in results for meta in result.metadata_list}


def match_metadata(pattern: str, limit: int | None = None) -> list[FileMetadata]:
    """The metadata of the files matching one glob (at most ``limit``), in Beam's order; Beam's errors propagate."""
    limits = None if limit is None else [limit]
    return _storage(pattern, "list", lambda: FileSystems.match([pattern], limits=limits))[0].metadata_list


def report_source_lineage(path: str) -> None:
    """Tell Beam's lineage metrics that a pipeline reads ``path`` (a file or a pattern)."""
    FileSystems.report_source_lineage(path)


def exists(path: str) -> bool:
    """Whether a file (an object) is there; on ``gs://`` and ``s3://`` one metadata request (Beam's GCS IO also reads
    the bucket's metadata first)."""
    if object_store.is_object_store(path):
        return object_store.object_version(path) is not None
    return _storage(path, "look up", lambda: FileSystems.exists(path))


def list_objects(directory: str) -> dict[str, int]:
    """Every file under ``directory`` (recursively), by full path, with its size; {} when there is none.

    On ``gs://`` and ``s3://`` one listing request per 1,000 objects (Beam's match also reads the bucket's
    metadata twice on GCS); elsewhere Beam's match of ``directory/**``.
    """
    if object_store.is_object_store(directory):
        return object_store.ObjectStoreFiles().list_files(directory)
    return {path: meta.size_in_bytes for path, meta in match(directory.rstrip("/") + "/**").items()}


def list_names(directory: str) -> list[str]:
    """Names directly inside ``directory`` (files and sub-directories, hidden ones too); [] when it does not exist."""
    if not is_remote(directory):
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    prefix = directory.rstrip("/") + "/"
    return sorted({path[len(prefix):].split("/")[0] for path in list_objects(directory) if path.startswith(prefix)})


def open_read(path: str) -> BinaryIO:
    """``path`` opened for reading; in an object store its reads, like its open, raise our StorageError, never a client's."""
    handle = _storage(path, "open", lambda: FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED))
    return typing.cast(BinaryIO, _StorageReads(path, handle)) if is_remote(path) else handle


class _StorageReads:
    """A Beam file handle of an object whose reads go through ``_storage``: an object deleted (or a server gone)
    between the open and a read is one StorageError naming it (GCS's client raises its own NotFound there)."""

    def __init__(self, path: str, handle: BinaryIO):
        self._path, self._handle = path, handle

    def read(self, size: int = -1) -> bytes:
        return _storage(self._path, "read", lambda: self._handle.read(size))

    def readinto(self, buffer: Any) -> int:
        return _storage(self._path, "read", lambda: self._handle.readinto(buffer))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _StorageReads:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handle.close()


def create(path: str, mime_type: str = "application/octet-stream") -> BinaryIO:
    """``path`` opened for writing; on ``gs://`` and ``s3://`` an object that stays small is uploaded in one request."""
    if object_store.is_object_store(path):
        _mutating("create", path, lambda: None)
        return typing.cast(BinaryIO, _ObjectWriter(path, mime_type))
    return _beam_create(path, mime_type)


def _beam_create(path: str, mime_type: str) -> BinaryIO:
    return _mutating("create", path, lambda: FileSystems.create(
        path, mime_type=mime_type, compression_type=CompressionTypes.UNCOMPRESSED))


SMALL_OBJECT_BYTES = 8 << 20  # the GCS client's one-request (multipart) limit; Beam streams every object in 16 MiB chunks


class _ObjectWriter:
    """An object being written: kept in memory while it is small and put in one request when closed (Beam's
    streamed upload costs two on GCS, three on S3); past ``SMALL_OBJECT_BYTES`` it becomes Beam's streamed upload.

    The object appears only when it is closed; leaving a ``with`` block by an exception uploads nothing while it
    is small (Beam's writer would publish the part written).
    """

    def __init__(self, path: str, mime_type: str):
        self._path, self._mime_type = path, mime_type
        self._buffer = bytearray()
        self._stream: BinaryIO | None = None
        self._written = 0
        self.closed = False

    def tell(self) -> int:
        return self._written

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self._written += size
        if self._stream is None and len(self._buffer) + size <= SMALL_OBJECT_BYTES:
            self._buffer += data
            return size
        if self._stream is None:
            self._stream = _beam_create(self._path, self._mime_type)
            buffered, self._buffer = bytes(self._buffer), bytearray()
            _storage(self._path, "write", lambda: self._stream.write(buffered))  # type: ignore[union-attr]
        stream = self._stream
        return _storage(self._path, "write", lambda: stream.write(data))

    def flush(self) -> None:
        if self._stream is not None:
            stream = self._stream
            _storage(self._path, "write", stream.flush)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._stream is not None:
            stream = self._stream
            _storage(self._path, "write", stream.close)
            return
        data = bytes(self._buffer)
        self._buffer = bytearray()
        _mutating("write", self._path, lambda: object_store.put_object(self._path, data, self._mime_type))

    def __enter__(self) -> _ObjectWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None and self._stream is None:
            self.closed = True  # a failed write of a small object: nothing appears
            return
        self.close()


def read_bytes(path: str) -> bytes:
    with open_read(path) as handle:
        return _storage(path, "read", handle.read)


def read_at_most(path: str, limit: int) -> tuple[bytes | None, int]:
    """(the file's bytes, its size) when it holds at most ``limit`` bytes, else (None, its size or -1 when unknown).

    Reads at most ``limit + 1`` bytes, so a huge file costs no more than the limit; its size then
    comes from seeking to its end. Beam's and the OS's errors (a missing file, a directory) propagate.
    """
    with open_read(path) as handle:
        data = handle.read(limit + 1)
        if len(data) <= limit:
            return data, len(data)
        try:
            return None, handle.seek(0, os.SEEK_END)
        except (OSError, ValueError):  # a stream that cannot seek: only "more than limit" is known
            return None, -1


def write_bytes(path: str, data: bytes, mime_type: str = "application/octet-stream") -> None:
    """Write a whole file; local files are flushed to disk before this returns (a commit relies on them)."""
    def write() -> None:
        if not is_remote(path):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            return
        if object_store.is_object_store(path):  # one request, and the object appears whole
            object_store.put_object(path, data, mime_type)
            return
        with FileSystems.create(path, mime_type=mime_type, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.write(data)

    _mutating("write", path, write)


def write_if_absent(path: str, data: bytes) -> None:
    """Object stores: write a whole object only if none has its name (PreconditionFailedError when one has)."""
    _mutating("write", path, lambda: object_store.create_if_absent(path, data))


def same_content(left: str, right: str) -> bool:
    """Whether two files hold the same bytes (read in chunks)."""
    with open_read(left) as a, open_read(right) as b:
        while True:
            chunk_a, chunk_b = a.read(1 << 20), b.read(1 << 20)
            if chunk_a != chunk_b:
                return False
            if not chunk_a:
                return True


def mkdirs(directory: str) -> None:
    """Create a directory and its parents; an existing one (or an object store without directories) is fine."""
    if not is_remote(directory):
        if not os.path.isdir(directory):
            _mutating("mkdirs", directory, lambda: os.makedirs(directory, exist_ok=True))
        return
    try:
        _mutating("mkdirs", directory, lambda: FileSystems.mkdirs(directory))
    except OSError:  # object stores have no directories: GCS and S3 refuse mkdirs, and need none
        pass


def rename(pairs: Sequence[tuple[str, str]]) -> None:
    """Rename (source, destination) pairs, a few at a time: object stores take ~50 ms per call."""
    in_threads(lambda pair: _mutating("rename", pair[1], lambda: _rename_one(*pair)), list(pairs))


def _rename_one(source: str, destination: str) -> None:
    """Object stores: our client's copy and delete (no batch calls); elsewhere Beam's rename."""
    if object_store.is_object_store(source):
        object_store.copy_object(source, destination)
        object_store.delete_object(source)
        return
    FileSystems.rename([source], [destination])


def _delete(paths: list[str]) -> None:
    """Object stores: one delete request per object through our client; elsewhere Beam's delete."""
    if paths and object_store.is_object_store(paths[0]):
        for path in paths:
            object_store.delete_object(path)
        return
    FileSystems.delete(paths)


def rename_local(source: str, destination: str) -> None:
    """One atomic local rename (of a file or a directory)."""
    _mutating("rename", destination, lambda: os.rename(source, destination))


def unlink_local(path: str) -> None:
    """Delete one local file with one call (``FileNotFoundError`` when it is gone): no glob match, no metadata read."""
    _mutating("delete", path, lambda: os.unlink(path))


def exchange(first: str, second: str) -> None:
    """Swap two local paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); OSError where unsupported."""
    _mutating("exchange", second, lambda: _renameat2(first, second, _RENAME_EXCHANGE))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(first: str, second: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)
    if function is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available on this system", second)
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), second)


def delete_files(paths: Iterable[str]) -> None:
    """Delete those of ``paths`` that exist (a retried step may have deleted some already)."""
    paths = list(paths)
    if paths and object_store.is_object_store(paths[0]):  # one request each: a missing object is not an error
        in_threads(lambda path: _mutating("delete", path, lambda: _delete_missing_ok(path)), paths)
        return
    existing = [path for path in paths if exists(path)]
    in_threads(lambda path: _mutating("delete", path, lambda: _delete([path])), existing)


def delete_tree(directory: str) -> None:
    """Delete a directory and everything in it (on object stores: every object under ``directory/``); missing is fine."""
    if not is_remote(directory):
        if os.path.lexists(directory):
            _mutating("delete", directory, lambda: _delete([directory]))
        return
    doomed = list(list_objects(directory))
    if exists(directory):
        doomed.append(directory)
    if doomed and object_store.is_object_store(directory):
        in_threads(lambda path: _mutating("delete", path, lambda: _delete_missing_ok(path)), doomed)
    elif doomed:
        _mutating("delete", directory, lambda: FileSystems.delete(doomed))


def _delete_missing_ok(path: str) -> None:
    object_store.delete_object(path, missing_ok=True)


def in_threads(function: Callable[[_T], Any], items: Sequence[_T], max_workers: int = _MAX_IO_THREADS) -> list[Any]:
    """Run ``function`` over ``items`` on a few threads (at most ``max_workers``), results in order."""
    if len(items) <= 1 or max_workers <= 1:
        return [function(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        return list(pool.map(function, items))


class BeamFiles:
    """``tfrbeam.base.file_access.FileAccess`` over Beam's FileSystems (local, ``gs://``, ``s3://``, ...)."""

    def exists(self, path: str) -> bool:
        return exists(path)

    def open_read(self, path: str) -> BinaryIO:
        return open_read(path)

    def list_names(self, directory: str) -> list[str]:
        return list_names(directory)

    def join(self, base: str, *parts: str) -> str:
        return join(base, *parts)


BEAM_FILES = BeamFiles()


# --- inputs ---


def match_pattern(pattern: str) -> list[FileMetadata]:
    """The files matching one glob; Beam's errors propagate, so the caller can name the config key that gave it."""
    return _storage(pattern, "list", lambda: FileSystems.match([pattern]))[0].metadata_list


def scheme_of(path: str) -> str | None:
    """The filesystem scheme a path names (gs, s3, memfs, ...), or None for a local path."""
    return FileSystems.get_scheme(path)
