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
import tempfile
from collections.abc import Callable, Mapping, Sequence

from tfrbeam.base import fileops, object_store

__all__ = ["export_into_bucket", "put_stats_objects"]


def put_stats_objects(output_dir: str, files: Mapping[str, str]) -> list[str]:
    """Put each ``name -> text`` as the object ``output_dir/name``, one whole-object write each; returns their URLs."""
    urls = []
    for name, text in files.items():
        url = posixpath.join(output_dir.rstrip("/"), name)
        content_type = "text/html; charset=utf-8" if name.endswith(".html") else "application/json"
        fileops.mutating("write", url, functools.partial(object_store.put_object, url, text.encode(), content_type))
        urls.append(url)
    return urls


def export_into_bucket(
    path: str, output_dir: str, splits: Sequence[str] | None, columns: Sequence[str] | None,
    progress: Callable[[int, int | None], None] | None, overwrite: bool,
) -> list[str]:
    """``export_to_parquet`` into a bucket prefix: the Parquet objects it leaves are the files a local export writes.

    Earlier Parquet objects where it writes are refused before anything is written (unless
    ``overwrite``: then export's own go once the new ones are uploaded). A failure before the
    uploads leaves the bucket as it was; one during them removes the objects this export put.
    """
    from tfrbeam.stats.export import existing_files_error, export_to_parquet, files_to_replace, plan_export

    output_dir = output_dir.rstrip("/")
    plan = plan_export(path, output_dir, splits, columns, join=posixpath.join)
    targets = [target for _, target, _, _ in plan.files]
    found = sorted({url for directory in {posixpath.dirname(target) for target in targets}
                    for url in object_store.object_glob(directory + "/*.parquet")})
    if found and not overwrite:
        raise existing_files_error(found)
    stale = files_to_replace(plan, found)
    with tempfile.TemporaryDirectory(prefix="tfrbeam-export-") as local:
        written = export_to_parquet(path, local, splits, columns, progress)
        uploads = [(file, posixpath.join(output_dir, os.path.relpath(file, local).replace(os.sep, "/")))
                   for file in written]
        _publish(uploads, [url for url in stale if url not in set(targets)])
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
