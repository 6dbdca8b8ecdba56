"""One bounded, typed read for every file tfrbeam finds (a manifest, a lock, an owner record, a journal, an index).

A file tfrbeam did not just write may be anything: a FIFO (opening one waits for a writer forever),
a device (``/dev/zero`` never ends), a directory, a symlink planted to lead elsewhere, or a sparse
file of terabytes. So a found file is looked at before it is opened and opened without blocking
(``O_NONBLOCK``) and, where tfrbeam never writes a link, without following one (``O_NOFOLLOW``);
``fstat`` of the open file must say "regular file" of at most the cap of its kind; and at most
cap + 1 bytes are read, so a file that grows or misreports its size (``/proc``) costs no more than
the cap. Anything else is one ``RefusedFileError`` naming the file and what it is, at once.

``tfrbeam.base.file_access.read_found`` is the one entry point for local files and objects in a
bucket (which have no kinds: their size is checked before they are read); it reads local files here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from typing import BinaryIO, cast

from tfrbeam.errors import RefusedFileError

__all__ = ["Refusal", "at_most", "check_found", "describe_mode", "open_found", "open_regular", "read_open", "read_regular"]

_CHUNK = 64 << 10  # reads past the size fstat gave (below malloc's mmap threshold: cheap to allocate)


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def describe_mode(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO (named pipe)", "a directory", "a regular file")."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "not a file")


def read_regular(path: str, max_bytes: int, what: str, *, follow_links: bool = False) -> bytes:
    """The whole of the local regular file ``path`` of at most ``max_bytes`` (``open_found``, then ``read_open``).

    ``what`` names its kind in the refusal ("manifest", "lock file"); a symlink is refused unless
    ``follow_links``. ``FileNotFoundError`` when there is none.
    """
    descriptor, info = open_found(path, what, follow_links=follow_links)
    try:
        return read_open(descriptor, info, path, max_bytes, what)
    finally:
        os.close(descriptor)


def check_found(path: str, max_bytes: int, what: str, *, follow_links: bool = False) -> None:
    """Refuse, without opening it, a local ``path`` that ``read_found`` would refuse: not a regular file (or a link,
    unless ``follow_links``), or more than ``max_bytes``. ``FileNotFoundError`` when there is none."""
    info = os.stat(path, follow_symlinks=follow_links)
    _refuse_unless_regular(path, info, what)
    if info.st_size > max_bytes:
        raise RefusedFileError(_size_refusal(path, f"{info.st_size} bytes", max_bytes, what))


def open_regular(path: str, what: str = "file", *, follow_links: bool = True) -> BinaryIO:
    """A local file opened for reading (binary, buffered), proven a regular file first (``open_found``)."""
    descriptor, _ = open_found(path, what, follow_links=follow_links)
    try:
        return cast(BinaryIO, os.fdopen(descriptor, "rb"))
    except BaseException:
        os.close(descriptor)
        raise


Refusal = Callable[[str, os.stat_result], str]  # the one line refusing a path that is no regular file, given its stat


def open_found(path: str, what: str, *, follow_links: bool, refusal: Refusal | None = None) -> tuple[int, os.stat_result]:
    """A descriptor of the local regular file ``path`` (blocking reads) and its ``fstat``; ``RefusedFileError`` else.

    The kind is checked before the open (a device is never opened) and again on the open descriptor,
    so a file swapped in between is caught too. ``FileNotFoundError`` when there is none. ``refusal`` words
    the error for a file that is not tfrbeam's own (a user's file named in a table); by default it says that
    no ``what`` of tfrbeam's is such a thing.
    """
    def refuse(info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFileError(refusal(path, info) if refusal is not None else _kind_refusal(path, info, what))

    refuse(os.stat(path, follow_symlinks=follow_links))
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link or a socket since the look
            refuse(os.lstat(path) if error.errno == errno.ELOOP else os.stat(path))
        raise
    try:
        info = os.fstat(descriptor)
        refuse(info)
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor, info


def read_open(descriptor: int, info: os.stat_result, path: str, max_bytes: int, what: str) -> bytes:
    """The bytes of an open regular file whose ``fstat`` is ``info``: at most ``max_bytes``, else ``RefusedFileError``.

    The size ``fstat`` gives is checked first (a sparse 5 GB file is refused without a read); at
    most ``max_bytes + 1`` bytes are read, so a file that grows, or reports 0 bytes, is bounded too.
    """
    if info.st_size > max_bytes:
        raise RefusedFileError(_size_refusal(path, f"{info.st_size} bytes", max_bytes, what))
    chunks: list[bytes] = []
    total = 0
    request = info.st_size + 1  # one byte past the size fstat gave: did it grow? (then on in small chunks)
    while True:
        chunk = os.read(descriptor, request)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise RefusedFileError(_size_refusal(path, f"more than {max_bytes} bytes", max_bytes, what))
        request = min(_CHUNK, max_bytes + 1 - total)


def at_most(data: bytes, path: str, max_bytes: int, what: str) -> bytes:
    """``data`` (at most ``max_bytes + 1`` bytes read from ``path``) when it is no more than ``max_bytes``."""
    if len(data) > max_bytes:
        raise RefusedFileError(_size_refusal(path, f"more than {max_bytes} bytes", max_bytes, what))
    return data


def _refuse_unless_regular(path: str, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise RefusedFileError(_kind_refusal(path, info, what))


def _kind_refusal(path: str, info: os.stat_result, what: str) -> str:
    kind = describe_mode(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return (f"{path}: {kind} (to {_link_target(path)}); tfrbeam never writes a {what} as a link, and follows "
                "none there: move it away")
    return f"{path}: {kind}, not a regular file as every {what} is: it is not tfrbeam's, move it away"


def _size_refusal(path: str, size: str, max_bytes: int, what: str) -> str:
    return (f"{path}: {size}, larger than any {what} tfrbeam writes (at most {max_bytes} bytes): it is damaged or "
            "not tfrbeam's, move it away")


def _link_target(path: str) -> str:
    try:
        return repr(os.readlink(path))
    except OSError:
        return "somewhere unreadable"
