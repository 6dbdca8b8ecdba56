"""File contents as features: a column of paths or URIs read, through Beam's FileSystems, into the files' bytes
and (with Pillow, the optional ``tfrbeam[image]`` extra) the image header facts height, width, channels, format.

convert_batch uses it for the specs whose ``file`` is set (``from_file`` in the config). The files of a
batch are read concurrently on a few threads; what cannot be read is a row's problem worded with the
file's path, never an exception. A relative path is taken from the directory of the input file that
lists it (so a CSV and its image folder move together, locally or on gs://); absolute paths and URIs
are used as they are. Image facts come from the header only: Pillow never decodes the pixels.
"""

from __future__ import annotations

import importlib.util
import io
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tfrbeam.beam import filesystem

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
    root is the directory the build was started in (a relative input file's directory is taken
    from it on workers that run elsewhere); it is set when the config is resolved and is not
    part of the config (not compared, not written).
    """

    part: str = "bytes"
    max_bytes: int | None = DEFAULT_MAX_FILE_BYTES
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


def resolve_file_path(path: str, base: str) -> str:
    """A listed path as read: absolute paths and URIs as they are, relative ones joined onto ``base``."""
    if filesystem.scheme_of(path) is not None or os.path.isabs(path) or not path:
        return path
    if filesystem.scheme_of(base) is not None:
        return filesystem.join(base, path)
    return os.path.normpath(os.path.join(base, path))


def read_files(paths: Sequence[str | None], base: str, max_bytes: int | None, image: bool) -> list[FileRead | None]:
    """Each listed file read concurrently (None for a null path): its bytes up to max_bytes (None: header
    only), and its image facts when ``image``. Raises FileBatchTooLarge as soon as the bytes read pass
    BATCH_FILE_BYTES (the reads not yet started are skipped), for the caller to read fewer rows at a time."""
    resolved = [resolve_file_path(path, base) if path is not None else None for path in paths]
    distinct = list(dict.fromkeys(path for path in resolved if path is not None))
    remote = any(filesystem.scheme_of(path) is not None for path in distinct)
    budget = _Budget(BATCH_FILE_BYTES if len(distinct) > 1 else None)
    reads = filesystem.in_threads(lambda path: budget.spend(_read_one(path, max_bytes, image)) if budget.left()
                                  else None, distinct, max_workers=_REMOTE_READERS if remote else _LOCAL_READERS)
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


def _read_one(path: str, max_bytes: int | None, image: bool) -> FileRead:
    if not path:
        return FileRead(path, problem="an empty path names no file")
    try:
        if max_bytes is None:
            return FileRead(path, **_header_facts(path, None))
        data, size = filesystem.read_at_most(path, max_bytes)
    except Exception as error:  # Beam and the OS raise many kinds; each is this row's problem, worded
        return FileRead(path, problem=f"cannot read {path}: {_why(error)}")
    facts = _header_facts(path, data) if image and data is not None else {}
    return FileRead(path, size=size, data=data, **facts)


def _header_facts(path: str, data: bytes | None) -> dict[str, Any]:
    """FileRead's image or image_problem from the header (of data, else of the file opened by path)."""
    from PIL import Image, UnidentifiedImageError  # the optional extra; parse_config refused image facts without it

    try:
        handle = io.BytesIO(data) if data is not None else filesystem.open_read(path)
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
