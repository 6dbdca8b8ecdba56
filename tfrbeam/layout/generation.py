"""Pinning one generation of a dataset for a read, so a concurrent ``--overwrite`` can never mix two.

A build publishes a dataset by swapping whole directories (``tfrbeam.beam.filesystem``'s exchange),
and each build's manifest carries its own run id (in its ``run`` record). A read pins the manifest's bytes when it starts;
each time it opens a shard it checks, *after* the open (and after reading the shard's index),
that the manifest is still those bytes. Manifests are unique per run, and a replaced generation
never comes back, so an unchanged manifest proves that the open file belongs to the pinned run;
the read then goes on through that open file, which stays readable after a later replace.

The bytes are read and hashed once per process and generation (bounded and typed: ``read_found``).
Every later check of a local dataset is one ``stat``: the manifest's path must still name the very
file that was hashed (device, inode, size, mtime and ctime alike). The process keeps that file open,
so its inode cannot be freed and reused by a later manifest; a build never rewrites a manifest in
place (it renames or swaps a new file in), and any write changes the ctime. A file that differs
(a touch, a copy, a replace) is read and hashed again. So reading N shards costs one manifest read
and N stats, not N reads of a manifest that grows with N (issue 43 item 6). In a bucket each check
asks for the manifest object's version token (GCS generation, S3 ETag: one metadata request); the
bytes are read, bounded by ``MAX_MANIFEST_BYTES``, and hashed only when that token was not proven yet.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import threading
from typing import BinaryIO

from tfrbeam.base.bounded_read import open_found, read_open
from tfrbeam.base.file_access import read_found
from tfrbeam.base.object_store import is_object_store, object_version, open_to_read
from tfrbeam.errors import DatasetChangedError, ObjectNotFoundError, RefusedFileError
from tfrbeam.layout.manifest_schema import MAX_MANIFEST_BYTES, run_id_of
from tfrbeam.layout.names import MANIFEST_NAME

_MAX_HELD = 16  # manifests a process keeps open as proofs (the least recently proven is closed first)
_PROVING = threading.Lock()
_GONE = "none (the manifest is gone)"


@dataclasses.dataclass(frozen=True)
class Generation:
    """A dataset directory as it was when a read started: the sha256 of its manifest and its run id."""

    root: str
    digest: str
    run_id: str
    manifest_name: str = MANIFEST_NAME  # LEGACY_MANIFEST_NAME for a dataset built before the manifest had its own

    @classmethod
    def of(cls, root: str, manifest_data: bytes, manifest_name: str = MANIFEST_NAME) -> Generation:
        """The generation whose manifest, named ``manifest_name``, has ``manifest_data``."""
        return cls(root, hashlib.sha256(manifest_data).hexdigest(), _run_id(manifest_data), manifest_name)

    def check(self) -> None:
        """``DatasetChangedError`` (naming both run ids) when the dataset's manifest is not the pinned one any more."""
        path = os.path.join(self.root, self.manifest_name)
        if is_object_store(path):
            self._check_object(path)
            return
        try:
            now = os.stat(path, follow_symlinks=False)
        except OSError:
            raise DatasetChangedError(self.root, self.run_id, _GONE) from None
        if _PROOFS.shows(self, _identity(now)):
            return
        with _PROVING:  # reader threads opening shards at once: one reads the manifest, the others find its proof
            if not _PROOFS.shows(self, _identity(now)):
                self._prove(path)

    def _check_object(self, path: str) -> None:
        """In a bucket: the manifest object's version token (one metadata request) against the one proven to hold the
        pinned bytes; a token not proven yet means reading the manifest (bounded) and hashing it once."""
        version = object_version(path)  # a refused or failed request is reported as what it is, not as "gone"
        if version is None:
            raise DatasetChangedError(self.root, self.run_id, _GONE)
        if _OBJECT_PROOFS.get((self.root, self.digest)) == version:
            return
        try:
            data = read_found(path, MAX_MANIFEST_BYTES, "manifest")
        except ObjectNotFoundError:
            raise DatasetChangedError(self.root, self.run_id, _GONE) from None
        self._compare(data)
        if object_version(path) == version:  # the bytes read are that version's: it proves them from now on
            _OBJECT_PROOFS[(self.root, self.digest)] = version

    def _prove(self, path: str) -> None:
        """Read and hash the manifest; when it is the pinned one, keep it open as the proof later checks stat against."""
        try:
            descriptor, info = open_found(path, "manifest", follow_links=False)
        except RefusedFileError:
            raise  # a FIFO, device or link where the manifest was: one line naming it
        except OSError:
            raise DatasetChangedError(self.root, self.run_id, _GONE) from None
        try:
            self._compare(read_open(descriptor, info, path, MAX_MANIFEST_BYTES, "manifest"))
        except BaseException:
            os.close(descriptor)
            raise
        _PROOFS.keep(self, descriptor, _identity(info))

    def _compare(self, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != self.digest:
            raise DatasetChangedError(self.root, self.run_id, _run_id(data))

    def open(self, path: str) -> BinaryIO:
        """``path`` opened for reading, proven to belong to this generation (see ``check``)."""
        handle = open_to_read(path, prefetch=True)
        try:
            self.check()
        except BaseException:
            handle.close()
            raise
        return handle


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)


class _Proofs:
    """This process's proven manifests: (root, digest) -> (the open manifest file, its stat identity)."""

    def __init__(self) -> None:
        self._held: collections.OrderedDict[tuple[str, str], tuple[int, tuple[int, ...]]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def shows(self, generation: Generation, identity: tuple[int, ...]) -> bool:
        """Whether the manifest file now at the path is the one proven to hold ``generation``'s bytes."""
        with self._lock:
            held = self._held.get((generation.root, generation.digest))
        return held is not None and held[1] == identity

    def keep(self, generation: Generation, descriptor: int, identity: tuple[int, ...]) -> None:
        closed = []
        with self._lock:
            previous = self._held.pop((generation.root, generation.digest), None)
            self._held[(generation.root, generation.digest)] = (descriptor, identity)
            if previous is not None:
                closed.append(previous[0])
            while len(self._held) > _MAX_HELD:
                closed.append(self._held.popitem(last=False)[1][0])
        for old in closed:
            os.close(old)


_PROOFS = _Proofs()
# In a bucket, per (root, digest): the manifest object's version token proven to hold those bytes. A version names
# one write of the object (GCS generation; S3 ETag, the bytes' MD5 for tfrbeam's single-part writes).
_OBJECT_PROOFS: dict[tuple[str, str], str] = {}


def _run_id(data: bytes) -> str:
    """The manifest's run id, for messages (the pin itself is the bytes' digest)."""
    try:
        value = run_id_of(json.loads(data.decode("utf-8")))
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return "unknown (an unreadable manifest)"
    return value[:200] if value is not None else "unknown (no run_id)"
