"""Read-only access to local or remote files, so the format-level tools work on any Beam filesystem.

The lower layers (the manifest, verify) read through a ``FileAccess``; ``LocalFiles`` serves local
paths with the standard library, and ``tfrbeam.beam.filesystem.BeamFiles`` serves ``gs://`` and the
other Beam filesystems. Only the Beam layer ever imports Beam.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Protocol

from tfrbeam.base.bounded_read import at_most, open_regular, read_regular


class FileAccess(Protocol):
    """What the read-only tools need of a filesystem."""

    def exists(self, path: str) -> bool: ...

    def open_read(self, path: str) -> BinaryIO: ...

    def list_names(self, directory: str) -> list[str]:
        """Names directly inside ``directory`` (hidden ones too); [] when it does not exist."""
        ...

    def join(self, base: str, *parts: str) -> str: ...


def is_remote(path: str) -> bool:
    """Whether ``path`` names an object store or other non-local filesystem (``scheme://``)."""
    return "://" in path


class LocalFiles:
    """``FileAccess`` for paths on this machine."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def open_read(self, path: str) -> BinaryIO:
        """``path`` opened once proven a regular file: a FIFO or device is ``RefusedFileError``, never a hang."""
        return open_regular(path)

    def list_names(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)


LOCAL_FILES = LocalFiles()


def files_for(path: str) -> FileAccess:
    """Local access for local paths, ``pyarrow.fs`` for ``gs://`` and ``s3://``; other schemes need the Beam layer's."""
    if not is_remote(path):
        return LOCAL_FILES
    from tfrbeam.base.object_store import OBJECT_STORE_FILES, is_object_store

    if is_object_store(path):
        return OBJECT_STORE_FILES
    raise ValueError(f"{path}: only local, gs:// and s3:// paths are read without Beam; pass "
                     "tfrbeam.beam.filesystem.BEAM_FILES to read another Beam filesystem")


def read_found(path: str, max_bytes: int, what: str, *, follow_links: bool = False,
               files: FileAccess | None = None) -> bytes:
    """The whole of a found file of at most ``max_bytes``, bounded and typed: the one entry point for every file
    tfrbeam reads whole but did not just write (a manifest, lock, owner record, journal or index).

    A local file must be a regular file (``tfrbeam.base.bounded_read``; a symlink is refused unless
    ``follow_links``); an object in a bucket has its size checked before it is read; a file of another
    filesystem (``files``, a ``FileAccess``) has at most ``max_bytes + 1`` bytes read. ``what`` names the
    kind in the one-line ``RefusedFileError``; ``FileNotFoundError`` when there is none.
    """
    if not is_remote(path):
        return read_regular(path, max_bytes, what, follow_links=follow_links)
    if files is not None:
        with files.open_read(path) as handle:
            return at_most(handle.read(max_bytes + 1), path, max_bytes, what)
    from tfrbeam.base.object_store import read_object

    return read_object(path, max_bytes, what)
