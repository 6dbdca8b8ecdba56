"""``tfrbeam stats`` and ``tfrbeam export`` writing into a bucket (``gs://``, ``s3://``).

Locally each file is written under a temp name and renamed into place once whole. An object store
has no rename, but one whole-object write is as atomic: stats' two files are each put in one
request, and an export is first written whole into a local temp directory (the same code as a
local export, so the same files), then each file is uploaded as one object, with the same refusal
of earlier Parquet files and the same ``--overwrite`` as locally.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
from collections.abc import Mapping, Sequence

from tfrbeam.base import fileops, object_store

__all__ = ["parquet_objects_beside", "put_stats_objects", "upload_export"]


def put_stats_objects(output_dir: str, files: Mapping[str, str]) -> list[str]:
    """Put each ``name -> text`` as the object ``output_dir/name``, one whole-object write each; returns their URLs."""
    urls = []
    for name, text in files.items():
        url = posixpath.join(output_dir.rstrip("/"), name)
        content_type = "text/html; charset=utf-8" if name.endswith(".html") else "application/json"
        fileops.mutating("write", url, functools.partial(object_store.put_object, url, text.encode(), content_type))
        urls.append(url)
    return urls


def parquet_objects_beside(targets: Sequence[str]) -> list[str]:
    """The Parquet objects already in the prefixes (``directories``) the export's ``targets`` go to: one listing each."""
    directories = {posixpath.dirname(target) for target in targets}
    return sorted({url for directory in directories for url in object_store.object_glob(directory + "/*.parquet")})


def upload_export(local: str, written: Sequence[str], output_dir: str, stale: Sequence[str]) -> list[str]:
    """Upload each file ``written`` under ``local`` to its place under ``output_dir``, then delete the ``stale``
    objects the new files do not replace; returns the new objects' URLs. A failed upload removes those already put."""
    uploads = [(file, posixpath.join(output_dir.rstrip("/"), os.path.relpath(file, local).replace(os.sep, "/")))
               for file in written]
    finals = {url for _, url in uploads}
    _publish(uploads, [url for url in stale if url not in finals])
    return [url for _, url in uploads]


def _publish(uploads: Sequence[tuple[str, str]], stale: Sequence[str]) -> None:
    """Upload each (local file, URL), then delete ``stale``; on a failed upload the objects already put go again."""
    published: list[str] = []
    try:
        for file, url in uploads:
            fileops.mutating("write", url, functools.partial(object_store.upload_file, file, url))
            published.append(url)
    except BaseException:
        for url in published:
            with contextlib.suppress(OSError):
                object_store.delete_object(url, missing_ok=True)
        raise
    for url in stale:
        fileops.mutating("delete", url, functools.partial(object_store.delete_object, url, missing_ok=True))
