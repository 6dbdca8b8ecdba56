"""Object stores (``gs://``, ``s3://``) without Beam: clients, conditional writes, range reads and their errors.

Two kinds of access live here, each with the client a user already has:

- *Conditional single-object requests* (the output lock, the switch of a commit): the storage
  clients of Beam's ``gcp`` and ``aws`` extras (``google-cloud-storage``, ``boto3``), which expose
  GCS preconditions (``ifGenerationMatch``) and S3 conditional writes (``If-None-Match: *``, ``If-Match``).
- *Reads* by the tools and the training reader: range GETs, no Beam import. ``gs://`` objects through an
  authorised ``requests`` session of google-auth (``_GcsRanges``) when ``google-cloud-storage`` is installed,
  else, and ``s3://`` objects always, through ``pyarrow.fs`` (``GcsFileSystem``, ``S3FileSystem``).

Endpoints and credentials come the way the clients take them: ``STORAGE_EMULATOR_HOST`` for GCS,
``AWS_ENDPOINT_URL`` and the ``AWS_*`` credentials for S3, or Beam's ``--s3_endpoint_url`` family,
which the Beam layer hands to ``configure_s3``. ``storage_error`` is the one place where a client's
own exception becomes ours.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import fnmatch
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from tfrbeam.base.bounded_read import open_regular
from tfrbeam.errors import (
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    StorageError,
    StoragePermissionError,
    StorageUnavailableError,
)

__all__ = [
    "OBJECT_STORE_FILES", "ObjectPath", "ObjectStoreFiles", "S3Settings", "check_reachable", "configure_s3",
    "copy_object", "note_unreachable",
    "create_if_absent", "delete_if_match", "delete_object", "forget_object_store_clients", "is_object_store",
    "put_object", "pyarrow_filesystem", "read_versioned", "replace_if_match", "storage_error", "translated",
    "upload_file",
]

_T = TypeVar("_T")
_SCHEMES = ("gs", "s3")
_RETRY_SECONDS = 20


def is_object_store(path: str) -> bool:
    return path.split("://", 1)[0] in _SCHEMES and "://" in path


@dataclasses.dataclass(frozen=True)
class ObjectPath:
    """``scheme://bucket/key`` split into its parts."""

    scheme: str
    bucket: str
    key: str

    @classmethod
    def parse(cls, path: str) -> ObjectPath:
        scheme, _, rest = path.partition("://")
        bucket, _, key = rest.partition("/")
        if scheme not in _SCHEMES or not bucket:
            raise ValueError(f"{path} is not a gs:// or s3:// path with a bucket")
        return cls(scheme, bucket, key)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """What Beam's S3 options say (``--s3_endpoint_url`` ...); None: what boto3 finds in the environment."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region_name: str | None = None
    verify: bool | str | None = None


_S3 = S3Settings()
_CLIENTS: dict[str, Any] = {}
_LOCK = threading.Lock()


def configure_s3(settings: S3Settings) -> None:
    """Use Beam's S3 options (the pipeline's) for every S3 request of this process, as Beam's own S3 IO does."""
    global _S3
    if settings != _S3:
        _S3 = settings
        forget_object_store_clients()


def forget_object_store_clients() -> None:
    """Drop the cached clients (and what is known of unreachable stores): the next request starts afresh."""
    with _LOCK:
        _CLIENTS.clear()
        _UNREACHABLE.clear()


def _cached(name: str, make: Callable[[], _T]) -> _T:
    with _LOCK:
        if name not in _CLIENTS:
            _CLIENTS[name] = make()
        return _CLIENTS[name]


def _s3_endpoint() -> str | None:
    return _S3.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


# google-cloud-storage 3.11+ fetches a bucket's metadata in the background for its tracing (one buckets.get per
# client and bucket, and one more after every 404), billed requests that tracing off never uses
# (googleapis/google-cloud-python#17650); this variable is the library's own switch.
BUCKET_METADATA_PROBES_OFF = "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA"


def no_bucket_metadata_probes() -> None:
    """In a process of our own (a ``tfrbeam`` command and the workers it starts): no background bucket-metadata
    requests, unless the environment already says otherwise. A library call leaves the caller's process alone."""
    os.environ.setdefault(BUCKET_METADATA_PROBES_OFF, "true")


def _gcs_client() -> Any:
    def make() -> Any:
        from google.cloud import storage

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"),
                                  credentials=AnonymousCredentials())
        return storage.Client()

    return _cached("gcs", make)


def _s3_client() -> Any:
    def make() -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=_s3_endpoint(), aws_access_key_id=_S3.access_key_id,
            aws_secret_access_key=_S3.secret_access_key, aws_session_token=_S3.session_token,
            region_name=_S3.region_name, verify=_S3.verify)

    return _cached("s3", make)


# ----------------------------------------------------------------------------- errors


def _status_of(error: BaseException) -> tuple[int | None, str]:
    """(HTTP status, the store's error code) of a client exception, where it carries them."""
    code = getattr(error, "code", None)  # google.api_core exceptions carry the HTTP status
    if isinstance(code, int):
        return code, type(error).__name__
    response = getattr(error, "response", None)  # botocore.exceptions.ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (status if isinstance(status, int) else None), str(response.get("Error", {}).get("Code", ""))
    return None, type(error).__name__


def _unreachable(error: BaseException) -> bool:
    names = {cls.__name__ for cls in type(error).__mro__}
    connection_errors = {"ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "RetryError",
                         "ServiceUnavailable", "NewConnectionError", "MaxRetryError", "ReadTimeoutError"}
    return bool(names & connection_errors) or isinstance(error, (ConnectionError, TimeoutError))


def storage_error(error: BaseException, path: str, request: str) -> StorageError:
    """The one translation of a storage client's exception (google, botocore, pyarrow) into our own error."""
    if isinstance(error, StorageError):
        return error
    status, code = _status_of(error)
    detail = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else code}"
    where = f"{path}: {request}"
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound") or isinstance(error, FileNotFoundError):
        return ObjectNotFoundError(f"{where}: no such object or bucket ({detail})")
    if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
        return PreconditionFailedError(f"{where}: the object changed or already exists ({detail})")
    if status in (401, 403) or code in ("AccessDenied", "Forbidden", "Unauthorized") or isinstance(error, PermissionError):
        return StoragePermissionError(
            f"{where}: permission denied ({detail}); check the credentials in use (GOOGLE_APPLICATION_CREDENTIALS or "
            "`gcloud auth application-default login` for gs://; AWS_PROFILE or AWS_ACCESS_KEY_ID for s3://)")
    if _unreachable(error) or (status is not None and status >= 500):
        return StorageUnavailableError(f"{where}: the object store did not answer ({detail}); try again")
    return StorageError(f"{where}: the request failed ({detail})")


UNREACHABLE_SECONDS = 60.0  # after a store failed a request past its client's retries, fail fast for this long
_UNREACHABLE: dict[tuple[str, str], tuple[float, str]] = {}  # (scheme, bucket) → (until, the request it failed)


def _store_of(path: str) -> tuple[str, str] | None:
    try:
        where = ObjectPath.parse(path)
    except ValueError:
        return None
    return where.scheme, where.bucket


def check_reachable(path: str, request: str) -> None:
    """StorageUnavailableError at once when ``path``'s store failed past its retries moments ago.

    The client already retried for minutes (Beam's and Google's policies); the cleanup after such a
    failure (removing staging, releasing the lock) would wait as long again per request. Failing
    those fast leaves nothing worse: the next run finishes or undoes what this one could not.
    """
    store = _store_of(path)
    marked = _UNREACHABLE.get(store) if store else None
    if marked is not None and time.monotonic() < marked[0]:
        raise StorageUnavailableError(f"{path}: {request}: not tried: the store did not answer {marked[1]} moments ago")


def note_unreachable(path: str, error: StorageError) -> StorageError:
    """Remember that ``path``'s store did not answer (for ``check_reachable``); returns the error."""
    store = _store_of(path)
    if store is not None and isinstance(error, StorageUnavailableError):
        _UNREACHABLE[store] = (time.monotonic() + UNREACHABLE_SECONDS, f"a request for {path}")
    return error


def translated(path: str, request: str, action: Callable[[], _T]) -> _T:
    """Run one storage request; any client exception comes out as our ``StorageError``, chained."""
    check_reachable(path, request)
    try:
        return action()
    except StorageError:
        raise
    except Exception as error:
        raise note_unreachable(path, storage_error(error, path, request)) from error


# --------------------------------------------------------------------- conditional writes


def read_versioned(path: str, max_bytes: int) -> tuple[bytes, str] | None:
    """An object's bytes and its version token (GCS generation, S3 ETag); None when it does not exist.

    Reads at most ``max_bytes + 1`` bytes (a ranged GET): a larger object, planted or damaged, is
    ObjectTooLargeError naming it, never read whole.
    """
    where = ObjectPath.parse(path)

    def read() -> tuple[bytes, str]:
        if where.scheme == "gs":
            blob = _gcs_client().bucket(where.bucket).blob(where.key)
            data = blob.download_as_bytes(start=0, end=max_bytes)
            return data, str(blob.generation)
        response = _s3_client().get_object(Bucket=where.bucket, Key=where.key, Range=f"bytes=0-{max_bytes}")
        return response["Body"].read(max_bytes + 1), response["ETag"]

    try:
        data, token = translated(path, "read", read)
    except ObjectNotFoundError:
        return None
    if len(data) > max_bytes:
        raise ObjectTooLargeError(f"{path}: more than {max_bytes} bytes, larger than any object tfrbeam writes there; "
                                  "it is not tfrbeam's: remove it by hand")
    return data, token


def object_version(path: str) -> str | None:
    """An object's version token (GCS generation, S3 ETag) from its metadata alone; None when it does not exist.

    One small request whatever the object's size: what a reader checks a pinned object against.
    """
    where = ObjectPath.parse(path)

    def look_up() -> str | None:
        if where.scheme == "gs" and _gcs_reads_available():
            found = _gcs_metadata(path, "generation")  # the read session's GET: a third less CPU than the client's get_blob
            return None if found is None else str(found["generation"])
        return str(_s3_client().head_object(Bucket=where.bucket, Key=where.key)["ETag"])

    try:
        return translated(path, "look up", look_up)
    except ObjectNotFoundError:
        return None


def create_if_absent(path: str, data: bytes) -> str:
    """Create the object only if no object has that name (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``).

    Returns its version token; raises PreconditionFailedError when another writer's object is there.
    """
    where = ObjectPath.parse(path)

    def create() -> str:
        if where.scheme == "gs":
            blob = _gcs_client().bucket(where.bucket).blob(where.key)
            blob.upload_from_string(data, content_type="application/json", if_generation_match=0)
            return str(blob.generation)
        return _s3_client().put_object(Bucket=where.bucket, Key=where.key, Body=data, IfNoneMatch="*")["ETag"]

    return translated(path, "create if absent", create)


def replace_if_match(path: str, data: bytes, token: str) -> str:
    """Overwrite the object only if it is still the version ``token`` names; returns the new token."""
    where = ObjectPath.parse(path)

    def replace() -> str:
        if where.scheme == "gs":
            blob = _gcs_client().bucket(where.bucket).blob(where.key)
            blob.upload_from_string(data, content_type="application/json", if_generation_match=int(token))
            return str(blob.generation)
        return _s3_client().put_object(Bucket=where.bucket, Key=where.key, Body=data, IfMatch=token)["ETag"]

    return translated(path, "replace if unchanged", replace)


def delete_if_match(path: str, token: str) -> None:
    """Delete the object only if it is still the version ``token`` names (gone already is fine)."""
    where = ObjectPath.parse(path)

    def delete() -> None:
        if where.scheme == "gs":
            _gcs_client().bucket(where.bucket).blob(where.key).delete(if_generation_match=int(token))
            return
        _s3_client().delete_object(Bucket=where.bucket, Key=where.key, IfMatch=token)

    try:
        translated(path, "delete if unchanged", delete)
    except ObjectNotFoundError:
        pass


def copy_object(source: str, destination: str) -> None:
    """A server-side copy of one object (GCS rewrite, S3 managed copy: any size); the destination is replaced."""
    src, dst = ObjectPath.parse(source), ObjectPath.parse(destination)
    if src.scheme != dst.scheme:
        raise ValueError(f"cannot copy {source} to {destination}: different object stores")

    def copy() -> None:
        if src.scheme == "gs":
            client = _gcs_client()
            target = client.bucket(dst.bucket).blob(dst.key)
            token, _, _ = target.rewrite(client.bucket(src.bucket).blob(src.key))
            while token is not None:
                token, _, _ = target.rewrite(client.bucket(src.bucket).blob(src.key), token=token)
            return
        _s3_client().copy({"Bucket": src.bucket, "Key": src.key}, dst.bucket, dst.key)

    translated(source, f"copy to {destination}", copy)


def put_object(path: str, data: bytes, content_type: str = "application/octet-stream") -> None:
    """Write a whole object in one request: a reader sees the object it replaces or this one, never a part."""
    where = ObjectPath.parse(path)

    def put() -> None:
        if where.scheme == "gs":
            _gcs_client().bucket(where.bucket).blob(where.key).upload_from_string(data, content_type=content_type)
            return
        _s3_client().put_object(Bucket=where.bucket, Key=where.key, Body=data, ContentType=content_type)

    translated(path, "write", put)


def upload_file(local_path: str, path: str) -> None:
    """Upload a local file as one object (GCS resumable, S3 multipart above their thresholds): the object appears
    whole when the upload completes, so a reader sees the object it replaces or this one, never a part."""
    where = ObjectPath.parse(path)

    def upload() -> None:
        if where.scheme == "gs":
            _gcs_client().bucket(where.bucket).blob(where.key).upload_from_filename(local_path)
            return
        _s3_client().upload_file(local_path, where.bucket, where.key)

    translated(path, f"upload {local_path}", upload)


def delete_object(path: str, missing_ok: bool = False) -> None:
    """Delete one object; ObjectNotFoundError when there is none, unless ``missing_ok``."""
    where = ObjectPath.parse(path)

    def delete() -> None:
        if where.scheme == "gs":
            _gcs_client().bucket(where.bucket).blob(where.key).delete()
            return
        client = _s3_client()
        if not missing_ok:  # S3 answers a delete of nothing with success
            client.head_object(Bucket=where.bucket, Key=where.key)
        client.delete_object(Bucket=where.bucket, Key=where.key)

    try:
        translated(path, "delete", delete)
    except ObjectNotFoundError:
        if not missing_ok:
            raise


# ----------------------------------------------------------------------------- reads


def pyarrow_filesystem(path: str) -> Any:
    """The ``pyarrow.fs`` file system serving ``path``'s store, set up from the same environment as the clients."""
    scheme = ObjectPath.parse(path).scheme
    return _cached(f"pyarrow-{scheme}", _make_gcs_filesystem if scheme == "gs" else _make_s3_filesystem)


def _make_gcs_filesystem() -> Any:
    from pyarrow import fs as pafs

    retry = datetime.timedelta(seconds=_RETRY_SECONDS)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        scheme, _, host = emulator.rpartition("://")
        return pafs.GcsFileSystem(anonymous=True, scheme=scheme or "http", endpoint_override=host.rstrip("/"),
                                  retry_time_limit=retry)
    return pafs.GcsFileSystem(retry_time_limit=retry)


def _make_s3_filesystem() -> Any:
    from pyarrow import fs as pafs

    options: dict[str, Any] = {}
    endpoint = _s3_endpoint()
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        options.update(endpoint_override=host.rstrip("/"), scheme=scheme or "https")
    if _S3.access_key_id and _S3.secret_access_key:
        options.update(access_key=_S3.access_key_id, secret_key=_S3.secret_access_key, session_token=_S3.session_token)
    region = _S3.region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


class ObjectStoreFiles:
    """``tfrbeam.base.file_access.FileAccess`` for ``gs://`` and ``s3://`` over ``pyarrow.fs`` (no Beam import).

    Opened objects are random-access files (``seek``/``read_at`` are ranged GETs), so a reader can
    read a shard's parts in parallel; every error comes out as our ``StorageError``.
    """

    def exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        info = translated(path, "look up", lambda: pyarrow_filesystem(path).get_file_info(_key(path)))
        return info.type != pafs.FileType.NotFound

    def is_file(self, path: str) -> bool:
        from pyarrow import fs as pafs

        info = translated(path, "look up", lambda: pyarrow_filesystem(path).get_file_info(_key(path)))
        return info.type == pafs.FileType.File

    def size(self, path: str) -> int:
        from pyarrow import fs as pafs

        info = translated(path, "look up", lambda: pyarrow_filesystem(path).get_file_info(_key(path)))
        if info.type != pafs.FileType.File:
            raise ObjectNotFoundError(f"{path}: look up: no such object")
        return int(info.size)

    def open_read(self, path: str) -> Any:
        return translated(path, "open", lambda: pyarrow_filesystem(path).open_input_file(_key(path)))

    def list_names(self, directory: str) -> list[str]:
        from pyarrow import fs as pafs

        prefix = _key(directory).rstrip("/")
        selector = pafs.FileSelector(prefix, allow_not_found=True, recursive=False)
        infos = translated(directory, "list", lambda: pyarrow_filesystem(directory).get_file_info(selector))
        return sorted({info.path[len(prefix) + 1:].split("/")[0] for info in infos if info.path.startswith(prefix + "/")})

    def list_files(self, directory: str) -> dict[str, int]:
        """Every object under ``directory/`` (recursively), by full path, with its size."""
        from pyarrow import fs as pafs

        scheme = ObjectPath.parse(directory).scheme
        selector = pafs.FileSelector(_key(directory).rstrip("/"), allow_not_found=True, recursive=True)
        infos = translated(directory, "list", lambda: pyarrow_filesystem(directory).get_file_info(selector))
        return {f"{scheme}://{info.path}": int(info.size) for info in infos if info.type == pafs.FileType.File}

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])


def _key(path: str) -> str:
    """``bucket/key``: how pyarrow.fs names an object."""
    where = ObjectPath.parse(path)
    return f"{where.bucket}/{where.key}".rstrip("/")


OBJECT_STORE_FILES = ObjectStoreFiles()


# ------------------------------------------------------------- reading objects: range reads, globs


_RANGE_BYTES = 8 << 20  # one ranged GET of a sequential read: large enough that a request's latency is small beside it
_COALESCE_GAP = 64 << 10  # random access reads records this close together with one request (the gap is discarded)
_PREFETCH_THREADS = 8
_POOL: tuple[int, Any] | None = None  # (the pid that made it, a ThreadPoolExecutor): a forked child makes its own
_OPENED_IN: int | None = None  # the pid whose cached clients are in use


def _range_pool() -> Any:
    """The threads that run background and parallel range reads (one set per process)."""
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            _POOL = (os.getpid(), ThreadPoolExecutor(_PREFETCH_THREADS, thread_name_prefix="tfrbeam-range-read"))
        return _POOL[1]


def in_background(function: Callable[..., _T], *arguments: Any) -> Future[_T]:
    """``function(*arguments)`` run by the threads of the range reads: a request made while this thread does another."""
    return _range_pool().submit(function, *arguments)


def _filesystem_here(path: str) -> Any:
    """``pyarrow_filesystem``, made afresh in a forked child (a parent's client connections are not its to use)."""
    global _OPENED_IN
    if _OPENED_IN != os.getpid():
        forget_object_store_clients()
        _OPENED_IN = os.getpid()
    return pyarrow_filesystem(path)


class _ArrowRanges:
    """Range reads through a ``pyarrow.fs`` random-access file: S3's ``read_at`` is one bounded ranged GET."""

    def __init__(self, path: str):
        filesystem = _filesystem_here(path)
        self._file = translated(path, "open", lambda: filesystem.open_input_file(_key(path)))
        self.size = int(translated(path, "look up", lambda: _object_size(filesystem, self._file, path)))

    def read(self, offset: int, length: int) -> bytes:
        return self._file.read_at(length, offset)

    def read_into(self, offset: int, out: np.ndarray) -> int:
        data = self._file.read_at(len(out), offset)
        out[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        return len(data)

    def close(self) -> None:
        self._file.close()


_GCS_TIMEOUT = 60  # seconds to connect and between bytes, as google-cloud-storage's own requests wait


class _GcsRanges:
    """Range reads of one generation of a GCS object: each one ``Range:`` GET of its media.

    One metadata GET gives the object's size and generation; each range is then one GET of the
    media, all on an authorised ``requests`` session (google-auth) at the client's endpoint,
    retried as ``google-cloud-storage`` retries and failing with its exceptions. Not the client's
    own ``download_as_bytes``: google-resumable-media moves a body 8 KiB at a time in Python
    (thousands of calls a range), which held the GIL for most of a ``gs://`` epoch. Not pyarrow's
    GCS file: its first read opens a download of the whole object and leaves it unread, which
    costs a request per file and stalls a server that answers one request at a time.
    """

    def __init__(self, path: str):
        _filesystem_here(path)  # a forked child makes its own clients
        self._session = _gcs_read_session()
        endpoint, object_path = _gcs_object_url(path)
        found = translated(path, "look up", lambda: self._metadata(path))
        if found is None:
            raise ObjectNotFoundError(f"{path}: look up: no such object")
        self.size, generation = found
        # The generation pins every range to the object as opened: a replace is never mixed in.
        self._url = f"{endpoint}/download/storage/v1/{object_path}?alt=media&generation={generation}"

    def _metadata(self, path: str) -> tuple[int, int] | None:
        """(size, generation) of the object (one GET of its metadata); None: none."""
        fields = _gcs_metadata(path, "size,generation")
        return None if fields is None else (int(fields["size"]), int(fields["generation"]))

    def read(self, offset: int, length: int) -> bytes:
        from google.cloud.storage.retry import DEFAULT_RETRY

        # One read of the body: the socket fills a new bytes object with the GIL released (its pages are touched
        # there too). urllib3's readinto copies what it read holding the GIL: see read_into for a buffer.
        return DEFAULT_RETRY(self._get)(offset, length, lambda body: bytes(body.read(length)))

    def read_into(self, offset: int, out: np.ndarray) -> int:
        """``len(out)`` bytes from ``offset`` into ``out`` (fewer when the object is shorter now): the socket writes
        them there itself, with the GIL released, through the HTTP response under urllib3's (which would read
        them into a bytes object, then copy that holding the GIL)."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY(self._get)(offset, len(out), lambda body: _read_body_into(body, out))

    def _get(self, offset: int, length: int, take: Callable[[Any], _T]) -> _T:
        """One GET of ``length`` bytes from ``offset`` (fewer when the object is shorter now), its body read by ``take``."""
        last = offset + length - 1
        # Accept-Encoding: gzip is the raw download: an object stored gzip-encoded comes as stored, never decoded.
        headers = {"Range": f"bytes={offset}-{last}", "Accept-Encoding": "gzip"}
        with self._session.get(self._url, headers=headers, stream=True, timeout=_GCS_TIMEOUT) as response:
            _raise_for_status(response)
            ranged = response.headers.get("Content-Range", "")
            if response.status_code != 206 and offset:
                raise StorageError(f"GET {response.url}: the server answered bytes {offset}..{last + 1} with "
                                   f"status {response.status_code} and no range")
            if response.status_code == 206 and not ranged.startswith(f"bytes {offset}-"):
                raise StorageError(f"GET {response.url}: asked for bytes {offset}-{last}, the server sent {ranged!r}")
            return take(response.raw)

    def close(self) -> None:
        pass


def _gcs_metadata(path: str, fields: str) -> dict[str, Any] | None:
    """The ``fields`` of a ``gs://`` object's metadata (one GET on the read session, retried as the client retries);
    None when there is no such object."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    _filesystem_here(path)  # a forked child makes its own clients
    session = _gcs_read_session()
    endpoint, object_path = _gcs_object_url(path)

    def look_up() -> dict[str, Any] | None:
        response = session.get(f"{endpoint}/storage/v1/{object_path}", params={"fields": fields}, timeout=_GCS_TIMEOUT)
        if response.status_code == 404:
            return None
        _raise_for_status(response)
        return dict(response.json())

    return DEFAULT_RETRY(look_up)()


def _read_body_into(body: Any, out: np.ndarray) -> int:
    """Read a streamed response's (urllib3's) body into ``out`` until it is full or the body ends; how many came.

    Through the ``http.client`` response beneath urllib3's when there is one (``readinto`` of the socket's
    buffered reader receives straight into ``out``); urllib3 does not decode a body requests streams raw.
    """
    view = memoryview(out).cast("B")  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
    inner = getattr(body, "_fp", None)
    readinto = getattr(inner, "readinto", None) or body.readinto
    done = 0
    while done < len(view):
        count = readinto(view[done:])
        if not count:
            break
        done += count
    return done


def _gcs_object_url(path: str) -> tuple[str, str]:
    """(the client's endpoint, ``b/<bucket>/o/<object>`` quoted): the JSON API's URLs of a ``gs://`` object."""
    from urllib.parse import quote

    where = ObjectPath.parse(path)
    return _gcs_client().api_endpoint, f"b/{quote(where.bucket, safe='')}/o/{quote(where.key, safe='')}"


def read_small_object(path: str, max_bytes: int, what: str) -> bytes | None:
    """The whole of an object of at most ``max_bytes``; None when there is none; ``ObjectTooLargeError`` when larger.

    On ``gs://`` one GET of its first ``max_bytes + 1`` bytes, with no metadata request first (half the requests of
    ``read_object``); it is not pinned to a generation, so it is for objects checked where they are used (the offset
    index a sequential read checks against the headers).
    """
    if ObjectPath.parse(path).scheme != "gs" or not _gcs_reads_available():
        try:
            return read_object(path, max_bytes, what)
        except ObjectNotFoundError:
            return None
    _filesystem_here(path)
    session = _gcs_read_session()
    endpoint, object_path = _gcs_object_url(path)

    def get() -> bytes | None:
        headers = {"Range": f"bytes=0-{max_bytes}", "Accept-Encoding": "gzip"}
        response = session.get(f"{endpoint}/download/storage/v1/{object_path}?alt=media", headers=headers,
                               timeout=_GCS_TIMEOUT)
        if response.status_code == 404:
            return None
        if response.status_code == 416:  # no byte 0: an empty object
            return b""
        _raise_for_status(response)
        return bytes(response.content)

    from google.cloud.storage.retry import DEFAULT_RETRY

    data = translated(path, "read", lambda: DEFAULT_RETRY(get)())
    if data is not None and len(data) > max_bytes:
        raise ObjectTooLargeError(f"{path}: more than {max_bytes} bytes, larger than any {what} tfrbeam writes: it is "
                                  "damaged or not tfrbeam's, move it away")
    return data


def _raise_for_status(response: Any) -> None:
    """A failed response as the exception google-cloud-storage raises for it (``NotFound``, ...), which
    ``DEFAULT_RETRY`` retries where it is transient and ``storage_error`` translates."""
    if response.status_code >= 300:
        from google.api_core.exceptions import from_http_response

        raise from_http_response(response)


_GCS_CONNECTIONS = 128  # connections kept per host: more than the threads that read at once (each holds one)


def _gcs_read_session() -> Any:
    """An authorised ``requests`` session for range GETs, its pool sized for the reading threads.

    The credentials are the client's: anonymous against ``STORAGE_EMULATOR_HOST``, else Google's
    application default credentials with the client's scopes. A pool keeps only the connections
    made, so a large size costs nothing, and no thread's connection is discarded ("Connection
    pool is full") when many read at once. The environment's proxies for the endpoint and its CA
    bundle (``HTTPS_PROXY``, ``NO_PROXY``, ``REQUESTS_CA_BUNDLE``, ...) are read here, once, as
    requests reads them: per request, requests scans every environment variable twice (a third of
    its own CPU a request).
    """

    endpoint = _gcs_client().api_endpoint  # here: make() runs holding the lock that _gcs_client takes

    def make() -> Any:
        from google.auth.transport.requests import AuthorizedSession
        from requests.adapters import HTTPAdapter
        from requests.utils import get_environ_proxies

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            credentials: Any = AnonymousCredentials()
        else:
            import google.auth
            from google.cloud import storage

            credentials, _ = google.auth.default(scopes=storage.Client.SCOPE)
        session = AuthorizedSession(credentials)
        for prefix in ("http://", "https://"):
            session.mount(prefix, HTTPAdapter(pool_connections=4, pool_maxsize=_GCS_CONNECTIONS))
        session.proxies = get_environ_proxies(endpoint)
        session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        session.trust_env = False  # and no ~/.netrc: the credentials authorise every request
        return session

    return _cached("gcs-read-session", make)


def _gcs_reads_available() -> bool:
    try:
        import google.cloud.storage  # noqa: F401
    except ImportError:
        return False
    return True


class RangedFile:
    """One object opened for reading: a seekable, read-only binary file whose every request is one bounded range read.

    Each request is read whole, so any number of objects can be read interleaved (a stalled,
    half-read download never holds a server up). Sequential reads take ``range_bytes`` at a
    time, and with ``prefetch`` the next range is requested in the background while this one is
    used. gs:// is read through ``google-cloud-storage`` (Beam's gcp extra) when it is installed,
    else through pyarrow's GCS file; s3:// through pyarrow's S3 file. The size is the object's
    when opened; an object that changes under a read is an error, never a short file.
    """

    def __init__(self, path: str, *, prefetch: bool = False, range_bytes: int = _RANGE_BYTES):
        self.name = path
        gcs = ObjectPath.parse(path).scheme == "gs" and _gcs_reads_available()
        self._source: _GcsRanges | _ArrowRanges = _GcsRanges(path) if gcs else _ArrowRanges(path)
        self.size = self._source.size
        self._prefetch = prefetch
        self._range_bytes = range_bytes
        self._position = 0
        self._chunk: bytes = b""
        self._chunk_start = 0
        self._next: tuple[int, Any] | None = None  # (offset, future) of the range requested ahead
        self.closed = False

    # -- positional reads

    def read_range(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset`` (fewer only past the end of the object), with one request."""
        length = max(0, min(length, self.size - offset))
        if not length:
            return b""
        data = translated(self.name, f"read bytes {offset}..{offset + length}", lambda: self._source.read(offset, length))
        if len(data) != length:
            raise StorageError(f"{self.name}: read bytes {offset}..{offset + length}: {len(data)} bytes came; the object "
                               f"was {self.size} bytes when opened, so it changed while it was read: read it again")
        return data

    def read_range_into(self, offset: int, out: np.ndarray) -> None:
        """Exactly ``len(out)`` bytes from ``offset`` into ``out`` (uint8), with one request; they must be in the object."""
        length = len(out)
        if offset + length > self.size:
            raise ValueError(f"{self.name}: bytes {offset}..{offset + length} are past its end ({self.size} bytes)")
        if not length:
            return
        came = translated(self.name, f"read bytes {offset}..{offset + length}", lambda: self._source.read_into(offset, out))
        if came != length:
            raise StorageError(f"{self.name}: read bytes {offset}..{offset + length}: {came} bytes came; the object "
                               f"was {self.size} bytes when opened, so it changed while it was read: read it again")

    def read_spans(self, spans: Sequence[tuple[int, int]], *, ahead: int = 1, slack: int = 0) -> Iterator[np.ndarray]:
        """Each span ``(offset, length)`` read into a writable buffer of its own, followed by ``slack`` zero bytes, in
        order; the next ``ahead`` spans are requested in the background while one is used.

        For a reader that knows where its blocks lie (a shard's read index): each block is used where its span's
        request put it, with no copy into a read window. Closing the generator waits for its requests still running.
        """
        pool = _range_pool()
        upcoming = iter(spans)
        requested: collections.deque[Any] = collections.deque()

        def request_ahead() -> None:
            while len(requested) <= ahead:
                span = next(upcoming, None)
                if span is None:
                    return
                requested.append(pool.submit(self._span_buffer, *span, slack))

        try:
            request_ahead()
            while requested:
                buffer = requested[0].result()
                requested.popleft()
                request_ahead()
                yield buffer
        finally:
            for future in requested:
                if not future.cancel():
                    future.exception()  # wait: the file must not close under a running request (its error is of no use)

    def _span_buffer(self, offset: int, length: int, slack: int) -> np.ndarray:
        buffer = np.empty(length + slack, dtype=np.uint8)
        buffer[length:] = 0
        self.read_range_into(offset, buffer[:length])
        return buffer

    def read_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)``, requested in parallel when there are several."""
        if len(ranges) <= 1:
            return [self.read_range(offset, length) for offset, length in ranges]
        pool = _range_pool()
        return list(pool.map(lambda span: self.read_range(*span), ranges))

    # -- a file object

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: cannot seek to {base + offset}")
        self._position = base + offset
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        wanted = self.size - self._position if size is None or size < 0 else size
        parts = []
        while wanted > 0:
            piece = self._piece(wanted)
            if not piece:
                break
            parts.append(piece)
            wanted -= len(piece)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        # Copied by numpy, which releases the GIL for the copy (and the page faults of a fresh buffer); a memoryview
        # assignment holds it: 30% of the GIL-holding samples of the reader threads in a gs:// raw epoch.
        target = np.frombuffer(buffer, dtype=np.uint8)
        done = 0
        while done < len(target):
            piece = self._piece(len(target) - done)
            if not piece:
                break
            target[done:done + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            done += len(piece)
        return done

    def _piece(self, wanted: int) -> memoryview:
        """Up to ``wanted`` bytes from the position on, from the range that holds it (requested when needed)."""
        if self._position >= self.size:
            return memoryview(b"")
        if not self._chunk_start <= self._position < self._chunk_start + len(self._chunk):
            self._chunk, self._chunk_start = self._range_from(self._position), self._position
        start = self._position - self._chunk_start
        piece = memoryview(self._chunk)[start:start + wanted]
        self._position += len(piece)
        return piece

    def _range_from(self, offset: int) -> bytes:
        """The range that starts at ``offset``: the one requested ahead if it is that one; then the next is asked for."""
        ahead, self._next = self._next, None
        if ahead is not None and ahead[0] == offset:
            data = ahead[1].result()
        else:
            if ahead is not None:
                ahead[1].cancel()
            data = self.read_range(offset, self._range_bytes)
        following = offset + len(data)
        if self._prefetch and following < self.size:
            self._next = (following, _range_pool().submit(self.read_range, following, self._range_bytes))
        return data

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        ahead, self._next = self._next, None
        if ahead is not None and not ahead[1].cancel():
            ahead[1].exception()  # wait: the file must not close under a running request (its error is of no use now)
        self._chunk = b""
        self._source.close()

    def __enter__(self) -> RangedFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _object_size(filesystem: Any, source: Any, path: str) -> int:
    """The object's size. Not the GCS file's ``size()``: that opens a download of the whole object and leaves it unread."""
    if ObjectPath.parse(path).scheme == "s3":
        return int(source.size())  # S3's file knows it from the HEAD request that opened it
    from pyarrow import fs as pafs

    info = filesystem.get_file_info(_key(path))
    if info.type != pafs.FileType.File:
        raise ObjectNotFoundError(f"{path}: look up: no such object")
    return int(info.size)


def open_ranged(path: str, *, prefetch: bool = False) -> RangedFile:
    """``path`` (``gs://`` or ``s3://``) opened for range reads; ``ObjectNotFoundError`` naming it when there is none."""
    return RangedFile(path, prefetch=prefetch)


def open_to_read(path: str, *, prefetch: bool = False) -> Any:
    """A file to read: a local path opened once proven a regular file (a FIFO never hangs), an object as a ``RangedFile``."""
    if is_object_store(path):
        return open_ranged(path, prefetch=prefetch)
    return open_regular(path, "TFRecord file")


def input_size(path: str) -> int:
    """The size of a local file or an object (``OSError`` when there is none: ``ObjectNotFoundError`` for an object)."""
    return OBJECT_STORE_FILES.size(path) if is_object_store(path) else os.path.getsize(path)


def opened_size(handle: Any) -> int:
    """The size of a file opened by ``open_to_read``."""
    return handle.size if isinstance(handle, RangedFile) else os.fstat(handle.fileno()).st_size


def read_object(path: str, max_bytes: int, what: str) -> bytes:
    """The whole of an object of at most ``max_bytes`` (its size checked before it is read); ``ObjectTooLargeError`` else.

    ``tfrbeam.base.file_access.read_found`` is the entry point: local files and objects alike.
    """
    with open_ranged(path) as handle:
        if handle.size > max_bytes:
            raise ObjectTooLargeError(f"{path}: {handle.size} bytes, larger than any {what} tfrbeam writes (at most "
                                      f"{max_bytes} bytes): it is damaged or not tfrbeam's, move it away")
        return handle.read()


def coalesced_ranges(starts: Sequence[int], ends: Sequence[int], gap: int = _COALESCE_GAP) -> list[tuple[int, int]]:
    """Sorted byte spans ``[starts[i], ends[i])`` merged where less than ``gap`` bytes lie between: (offset, length)."""
    merged: list[list[int]] = []
    for start, end in zip(starts, ends):
        if merged and start - merged[-1][1] < gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end - start) for start, end in merged]


def object_glob(pattern: str) -> list[str]:
    """The objects a glob names, sorted, matched as ``glob.glob`` matches local files.

    ``*``, ``?`` and ``[...]`` stay inside one ``/``-separated component and match no hidden
    (``.``-prefixed) name unless the pattern's component starts with ``.``; ``**`` matches any
    number of components. One listing of the prefix before the first wildcard.
    """
    where = ObjectPath.parse(pattern)
    parts = where.key.split("/")
    literal = next((number for number, part in enumerate(parts) if has_magic(part)), len(parts))
    directory = f"{where.scheme}://{where.bucket}/" + "/".join(parts[:literal])
    prefix = directory.rstrip("/") + "/"
    found = []
    for path in OBJECT_STORE_FILES.list_files(directory):
        relative = path[len(prefix):].split("/") if path.startswith(prefix) else None
        if relative is not None and _components_match(parts[literal:], relative):
            found.append(path)
    return sorted(found)


_MAGIC = re.compile(r"[*?\[]")


def has_magic(text: str) -> bool:
    """Whether ``text`` holds a glob wildcard (as ``glob.has_magic``)."""
    return _MAGIC.search(text) is not None


def _components_match(pattern: Sequence[str], names: Sequence[str]) -> bool:
    if not pattern:
        return not names
    if pattern[0] == "**":
        return any(_components_match(pattern[1:], names[skip:]) for skip in range(len(names) + 1)
                   if not any(name.startswith(".") for name in names[:skip]))
    if not names or (names[0].startswith(".") and not pattern[0].startswith(".")):
        return False
    return fnmatch.fnmatchcase(names[0], pattern[0]) and _components_match(pattern[1:], names[1:])
