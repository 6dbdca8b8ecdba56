"""Read-only access to local or remote files, so the format-level tools work on any Beam filesystem.

The lower layers (the manifest, verify) read through a ``FileAccess``; ``LocalFiles`` serves local
paths with the standard library, and ``tfrbeam.beam.filesystem.BeamFiles`` serves ``gs://`` and the
other Beam filesystems. Only the Beam layer ever imports Beam.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Protocol


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
        return open(path, "rb")

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
