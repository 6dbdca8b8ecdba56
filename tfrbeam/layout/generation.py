"""Pinning one generation of a dataset for a read, so a concurrent ``--overwrite`` can never mix two.

A build publishes a dataset by swapping whole directories (``tfrbeam.beam.filesystem``'s exchange),
and each build's manifest carries its own ``run_id``. A read pins the manifest's bytes when it starts;
each time it opens a shard it checks, *after* the open (and after reading the shard's index),
that the manifest is still those bytes. Manifests are unique per run, and a replaced generation
never comes back, so an unchanged manifest proves that the open file belongs to the pinned run;
the read then goes on through that open file, which stays readable after a later replace. The
cost is one small-file read per shard opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import BinaryIO

from tfrbeam.base.object_store import is_object_store, open_to_read, read_input
from tfrbeam.errors import DatasetChangedError, ObjectNotFoundError
from tfrbeam.layout.names import MANIFEST_NAME


@dataclasses.dataclass(frozen=True)
class Generation:
    """A dataset directory as it was when a read started: the sha256 of its manifest and its run id."""

    root: str
    digest: str
    run_id: str

    @classmethod
    def of(cls, root: str, manifest_data: bytes) -> Generation:
        """The generation whose manifest has ``manifest_data``."""
        return cls(root, hashlib.sha256(manifest_data).hexdigest(), _run_id(manifest_data))

    def check(self) -> None:
        """``DatasetChangedError`` (naming both run ids) when the dataset's manifest is not the pinned one any more."""
        path = os.path.join(self.root, MANIFEST_NAME)
        # In a bucket only "no such object" means gone: a refused or failed request is reported as what it is.
        gone = ObjectNotFoundError if is_object_store(path) else OSError
        try:
            data = read_input(path)
        except gone:
            raise DatasetChangedError(self.root, self.run_id, "none (the manifest is gone)") from None
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


def _run_id(data: bytes) -> str:
    try:
        value = json.loads(data.decode("utf-8")).get("run_id")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return "unknown (an unreadable manifest)"
    return str(value)[:200] if value is not None else "unknown (no run_id)"
