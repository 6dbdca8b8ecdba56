"""File contents as features: a column of paths or URIs read, through Beam's FileSystems, into the files' bytes
and (with Pillow, the optional ``tfrbeam[image]`` extra) the image header facts height, width, channels, format.

convert_batch uses it for the specs whose ``file`` is set (``from_file`` in the config). The files of a
batch are read concurrently on a few threads; what cannot be read is a row's problem worded with the
file's path, never an exception. A relative path is taken from the directory of the input file that
lists it (so a CSV and its image folder move together, locally or on gs://); absolute paths and URIs
are used as they are. Image facts come from the header only: Pillow never decodes the pixels.

A local file is opened without blocking and checked with fstat before a byte is read: a FIFO, device,
directory or socket is refused in one line (it would hang or never end), and a file over the limit is
sized, not read. ``file_root`` confines the paths to a directory (or an object-store prefix): a path
outside it (``..``, absolute, another scheme) or a symlink leading out of it is a row's problem.
"""

from __future__ import annotations

import importlib.util
import io
import os
import posixpath
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrbeam.base.bounded_read import describe_mode, open_found
from tfrbeam.beam import filesystem
from tfrbeam.errors import RefusedFileError

__all__ = [
    "BATCH_FILE_BYTES",
    "DEFAULT_MAX_FILE_BYTES",
    "FILE_PARTS",
    "FileBatchTooLarge",
    "FileOptions",
    "FileRead",
    "IMAGE_EXTRA",
    "IMAGE_PARTS",
    "MAX_FILE_BYTES",
    "confinement",
    "files_base",
    "pillow_missing",
    "read_files",
    "resolve_file_path",
]

DEFAULT_MAX_FILE_BYTES = 64 << 20
MAX_FILE_BYTES = 1 << 30  # a record is at most 2 GiB - 1 (TFRecord framing, protobuf): one file at most half of it
FILE_PARTS = ("bytes", "height", "width", "channels", "format")  # what a from_file feature holds
IMAGE_PARTS = FILE_PARTS[1:]
IMAGE_EXTRA = "pip install 'tfrbeam[image]'"
# The most file bytes one converted batch may hold (an Arrow binary column holds at most 2 GiB - 1).
BATCH_FILE_BYTES = 1 << 30
# Threads reading one batch's files: an object store answers each read after tens of milliseconds, so many
# reads wait at once; local files come from the page cache or a disk queue, where more threads only contend.
_REMOTE_READERS = 32
_LOCAL_READERS = 8


@dataclass(frozen=True)
class FileOptions:
    """How a from_file feature reads its column of paths: the file's bytes, or one fact of an image's header.

    max_bytes bounds a file read for its bytes (None for header facts: only the header is read).
    file_root (the config's) confines the paths read to a directory or object-store prefix (None:
    any path). root is the directory the build was started in (a relative input file's directory,
    and a relative file_root, are taken from it on workers that run elsewhere); it is set when the
    config is resolved and is not part of the config (not compared, not written).
    """

    part: str = "bytes"
    max_bytes: int | None = DEFAULT_MAX_FILE_BYTES
    file_root: str | None = None
    root: str | None = field(default=None, compare=False)

    @property
    def feature_type(self) -> str:
        return "int64" if self.part in ("height", "width", "channels") else "bytes"


class FileBatchTooLarge(Exception):
    """The files of one batch hold more than BATCH_FILE_BYTES: the caller converts the batch in smaller slices."""


@dataclass(frozen=True)
class FileRead:
    """One file as read: its bytes (None when only the header was asked or it is above the limit), its size,
    its image header facts, or why it could not be read or is not an image."""

    path: str
    size: int = -1
    data: bytes | None = None
    image: tuple[int, int, int, bytes] | None = None  # (height, width, channels, format)
    problem: str | None = None
    image_problem: str | None = None


def pillow_missing() -> bool:
    """Whether Pillow (the ``tfrbeam[image]`` extra, needed for image header facts) is not installed."""
    return importlib.util.find_spec("PIL") is None


def files_base(input_path: str, root: str | None) -> str:
    """The directory the relative file paths listed in ``input_path`` are taken from: that input file's own."""
    if filesystem.scheme_of(input_path) is not None:
        return filesystem.parent(input_path)
    return os.path.dirname(os.path.join(root or os.getcwd(), input_path))


def confinement(file_root: str | None, root: str | None) -> str | None:
    """The directory (or object-store prefix) from_file reads are confined to: file_root, a relative one taken from
    the build's directory ``root``; None when there is no file_root."""
    if file_root is None or filesystem.scheme_of(file_root) is not None:
        return file_root
    return os.path.normpath(os.path.join(root or os.getcwd(), file_root))


def resolve_file_path(path: str, base: str) -> str:
    """A listed path as read: absolute paths and URIs as they are, relative ones joined onto ``base``."""
    if filesystem.scheme_of(path) is not None or os.path.isabs(path) or not path:
        return path
    if filesystem.scheme_of(base) is not None:
        return filesystem.join(base, path)
    return os.path.normpath(os.path.join(base, path))


def read_files(paths: Sequence[str | None], base: str, max_bytes: int | None, image: bool,
               confine: str | None = None) -> list[FileRead | None]:
    """Each listed file read concurrently (None for a null path): its bytes up to max_bytes (None: header
    only), and its image facts when ``image``; a path outside ``confine`` (see confinement) is not read. Raises
    FileBatchTooLarge as soon as the bytes read pass BATCH_FILE_BYTES (the reads not yet started are skipped),
    for the caller to read fewer rows at a time."""
    resolved = [resolve_file_path(path, base) if path is not None else None for path in paths]
    distinct = list(dict.fromkeys(path for path in resolved if path is not None))
    remote = any(filesystem.scheme_of(path) is not None for path in distinct)
    budget = _Budget(BATCH_FILE_BYTES if len(distinct) > 1 else None)
    reads = filesystem.in_threads(lambda path: budget.spend(_read_one(path, max_bytes, image, confine))
                                  if budget.left() else None,
                                  distinct, max_workers=_REMOTE_READERS if remote else _LOCAL_READERS)
    if not budget.left():
        raise FileBatchTooLarge(f"the {len(distinct)} files of one batch hold more than {BATCH_FILE_BYTES} bytes")
    by_path = dict(zip(distinct, reads))
    return [by_path[path] if path is not None else None for path in resolved]


class _Budget:
    """The bytes the reads of one batch may keep (None: no limit), spent from several threads."""

    def __init__(self, limit: int | None):
        self._limit = limit
        self._spent = 0
        self._lock = threading.Lock()

    def left(self) -> bool:
        return self._limit is None or self._spent <= self._limit

    def spend(self, read: FileRead) -> FileRead:
        if read.data is not None:
            with self._lock:
                self._spent += len(read.data)
        return read


def _read_one(path: str, max_bytes: int | None, image: bool, confine: str | None) -> FileRead:
    if not path:
        return FileRead(path, problem="an empty path names no file")
    outside = _outside(path, confine) if confine is not None else None
    if outside is not None:
        return FileRead(path, problem=outside)
    if filesystem.scheme_of(path) is None:
        return _read_local(path, max_bytes, image, confine)
    try:
        if max_bytes is None:
            return FileRead(path, **_header_facts(path, None))
        data, size = filesystem.read_at_most(path, max_bytes)
    except Exception as error:  # Beam and the OS raise many kinds; each is this row's problem, worded
        return FileRead(path, problem=f"cannot read {path}: {_why(error)}")
    facts = _header_facts(path, data) if image and data is not None else {}
    return FileRead(path, size=size, data=data, **facts)


def _not_regular(path: str, info: os.stat_result) -> str:
    return f"{path} is {describe_mode(info.st_mode)}, not a regular file; from_file reads regular files only"


def _read_local(path: str, max_bytes: int | None, image: bool, confine: str | None) -> FileRead:
    """A local file typed and sized by fstat before any read: at most max_bytes + 1 bytes of it are read."""
    try:
        fd, status = open_found(path, "file", follow_links=True, refusal=_not_regular)
    except RefusedFileError as refused:
        return FileRead(path, problem=str(refused))
    except OSError as error:
        return FileRead(path, problem=f"cannot read {path}: {_why(error)}")
    with open(fd, "rb", closefd=True) as handle:
        escape = _leads_out(path, status, confine) if confine is not None else None
        if escape is not None:
            return FileRead(path, problem=escape)
        if max_bytes is None:
            return FileRead(path, **_header_facts(path, None, handle))
        if status.st_size > max_bytes:
            return FileRead(path, size=status.st_size)
        try:
            data = _read_at_most(handle, status.st_size, max_bytes + 1)
        except OSError as error:
            return FileRead(path, problem=f"cannot read {path}: {_why(error)}")
    if len(data) > max_bytes:  # it grew while being read
        return FileRead(path, size=-1)
    facts = _header_facts(path, data) if image else {}
    return FileRead(path, size=len(data), data=data, **facts)


def _read_at_most(handle, expected: int, limit: int) -> bytes:
    """Up to ``limit`` bytes, asked for by the size fstat gave: a read of ``limit`` would allocate all of it up
    front, 64 MiB for a 3-byte file (eight reader threads, 512 MiB). A file that grew is read on to the limit."""
    data = handle.read(min(expected + 1, limit))
    if len(data) <= expected or len(data) >= limit:
        return data
    return data + handle.read(limit - len(data))


def _outside(path: str, confine: str) -> str | None:
    """Why a path is outside the confining root by its text (``..``, absolute, another scheme), or None."""
    remote = filesystem.scheme_of(confine) is not None
    if remote != (filesystem.scheme_of(path) is not None):
        inside = False
    elif remote:  # object names have no symlinks; a ".." segment is refused, not resolved
        prefix = confine.rstrip("/") + "/"
        inside = path.startswith(prefix) and not {".", ".."} & set(path[len(prefix):].split("/"))
    else:
        inside = _within(posixpath.normpath(path), confine)
    return None if inside else f"{path} is outside file_root {confine} (only files under it are read)"


def _within(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory


def _leads_out(path: str, opened: os.stat_result, confine: str) -> str | None:
    """Why the file opened at path is not one under the root once links are followed, or None: its real path
    must lie under the root's, and be the very file opened (not one swapped in since)."""
    real = os.path.realpath(path)
    try:
        same = os.path.samestat(os.stat(real), opened)
    except OSError:
        same = False
    if _within(real, os.path.realpath(confine)) and same:
        return None
    return f"{path} leads outside file_root {confine} through a symlink (to {real})"


def _header_facts(path: str, data: bytes | None, opened: Any = None) -> dict[str, Any]:
    """FileRead's image or image_problem from the header (of data, else of the file opened, else opened by path)."""
    from PIL import Image, UnidentifiedImageError  # the optional extra; parse_config refused image facts without it

    try:
        handle = io.BytesIO(data) if data is not None else opened or filesystem.open_read(path)
    except Exception as error:
        return {"problem": f"cannot read {path}: {_why(error)}"}
    try:
        with handle, Image.open(handle) as picture:
            width, height = picture.size
            return {"image": (height, width, len(picture.getbands()), (picture.format or "").lower().encode())}
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as error:
        return {"image_problem": f"{path} is not an image Pillow can read ({_why(error)})"}


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    cause = error.__cause__ or error.__context__
    if cause is not None and isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(error) or type(error).__name__
