"""The one layer every local file change goes through: create, write, rename, delete, mkdir, each named.

Every mutating call passes ``mutating(op, path, action)``, the single point a fault harness wraps
(tests/faults.py numbers the operations and crashes or fails one), so "a fault at every file
operation" covers the framing writers, the read indexes, stats, export and the commit alike.
``write_atomically`` is the one write-then-rename: a new temp beside the target (a random name
created exclusively, never a guessable or planted name, never a symlink followed), fsynced, then
renamed over the target; a failure at any step leaves the target as it was and no temp behind.
Every file is created with mode 0666 and the process's umask applied, as ``open()`` creates one: a
published file is readable by whoever the user's umask lets read it (``mkstemp``'s 0600 made the
indexes, statistics and exports unreadable to every other user). Beam's file systems
(``tfrbeam.beam.filesystem``) route their changes through the same ``mutating``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, TypeVar, cast

__all__ = ["FILE_MODE", "PARTIAL_INFIX", "atomic_file", "beside", "create", "makedirs", "mutating", "partial_path", "remove",
           "remove_temp", "replace", "split_target", "staged_file", "write_atomically"]

PARTIAL_INFIX = ".tfrbeam-partial-"  # a file being written, hidden beside its final name
FILE_MODE = 0o666  # new files: the umask takes away what the user does not give others (0644 under umask 022)
_TEMP_ATTEMPTS = 100  # random temp names tried before giving up (as mkstemp does)

_T = TypeVar("_T")


def mutating(op: str, path: str, action: Callable[[], _T]) -> _T:
    """Run one file-changing ``action`` on ``path``; ``op`` names it (write, rename, delete, mkdirs, ...)."""
    return action()


def _mutate(op: str, path: str, action: Callable[[], _T]) -> _T:
    # Looked up on the module at each call, so a harness that replaces ``mutating`` sees every operation.
    try:
        return globals()["mutating"](op, path, action)
    except OSError as error:
        raise _naming(error, path) from error


def _naming(error: OSError, path: str) -> OSError:
    """The error with the path it concerns (a failed write() names no file, so "disk full" would say not where)."""
    if error.filename is not None:
        return error
    return type(error)(error.errno, error.strerror or str(error), path)


def makedirs(directory: str) -> None:
    """Create a directory and its parents (an existing one is fine)."""
    if directory and not os.path.isdir(directory):
        _mutate("mkdirs", directory, lambda: os.makedirs(directory, exist_ok=True))


def replace(source: str, destination: str) -> None:
    """Rename ``source`` over ``destination`` in one atomic step."""
    _mutate("rename", destination, lambda: os.replace(source, destination))


def remove(path: str, missing_ok: bool = False) -> None:
    """Delete one file; with missing_ok a file already gone is fine (the step is done)."""

    def delete() -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    _mutate("delete", path, delete)


def create(path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> BinaryIO:
    """Open ``path`` for writing (binary), never through a symlink at ``path``."""
    descriptor = _mutate("create", path, lambda: os.open(path, flags | os.O_NOFOLLOW, FILE_MODE))
    return cast(BinaryIO, os.fdopen(descriptor, "wb"))


def _new_temp(path: str) -> tuple[int, str]:
    """A new file ``.{name}.XXXXXXXX.tmp`` beside ``path``, created exclusively (never a planted file or symlink),
    with the umask's mode (``mkstemp`` would make it 0600 whatever the umask)."""
    directory, name = os.path.dirname(path) or ".", os.path.basename(path)
    for _ in range(_TEMP_ATTEMPTS):
        temp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE), temp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temp name for {name} after {_TEMP_ATTEMPTS} tries")


@contextlib.contextmanager
def atomic_file(path: str, fsync: bool = False) -> Iterator[BinaryIO]:
    """A new temp file beside ``path`` to write into; renamed over ``path`` when the block ends, removed on error."""
    with staged_file(path, fsync) as (handle, temp):
        yield handle
    try:
        replace(temp, path)
    except BaseException:
        remove_temp(temp)
        raise


@contextlib.contextmanager
def staged_file(path: str, fsync: bool = False) -> Iterator[tuple[BinaryIO, str]]:
    """A new temp file beside ``path`` and its name, to write into and rename later (``replace``); removed on error.

    For outputs of many files published together: each is staged, and renamed only once all are whole.
    """
    directory = os.path.dirname(path) or "."
    makedirs(directory)
    descriptor, temp = _mutate("create", path, lambda: _new_temp(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            try:
                yield cast(BinaryIO, handle), temp
                handle.flush()
            except OSError as error:
                raise _naming(error, path) from error
            if fsync:
                _mutate("fsync", temp, lambda: os.fsync(handle.fileno()))
    except BaseException:
        remove_temp(temp)
        raise


def remove_temp(temp: str) -> None:
    """Remove a temp file this process created (``staged_file``); one already gone, or that cannot go, is left."""
    with contextlib.suppress(OSError):
        os.remove(temp)  # our own exclusive temp name: cleaning it up is not an operation on the user's data


def write_atomically(path: str, data: bytes | bytearray | str = b"", chunks: Iterable[bytes] = (),
                     fsync: bool = False) -> None:
    """Write ``data`` (text is UTF-8), then each of ``chunks``, to ``path`` through ``atomic_file``."""
    payload: Any = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_file(path, fsync=fsync) as handle:
        _mutate("write", path, lambda: _write_all(handle, payload, chunks))


def _write_all(handle: BinaryIO, data: bytes | bytearray, chunks: Iterable[bytes]) -> None:
    handle.write(data)
    for chunk in chunks:
        handle.write(chunk)


def split_target(target: str) -> tuple[str, str, bool]:
    """(directory, name, remote) of a local path or a URL, the directory absolute for a local one."""
    remote = "://" in target
    if remote:
        directory, name = posixpath.split(target.rstrip("/"))
    else:
        directory, name = os.path.split(os.path.abspath(target))
    return directory, name, remote


def beside(target: str, suffix: str) -> str:
    """The hidden name ``.{name}{suffix}`` in ``target``'s directory: shard globs and TensorFlow never match it."""
    directory, name, remote = split_target(target)
    return (posixpath.join if remote else os.path.join)(directory, f".{name}{suffix}")


def partial_path(path: str, unique: str) -> str:
    """Where a file being written to ``path`` lives until it is complete (then renamed to ``path``)."""
    return beside(path, f"{PARTIAL_INFIX}{unique}")
