"""A dataset copied into a sandbox directory, and snapshots of that directory's whole tree (paths, links, contents).

A tool run against ``sandbox/ds`` may write inside ``ds`` (its derived files) and into the
output it was given; every other path of the sandbox must come out byte for byte as it went in.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

from tfrbeam.tfrecord.records import RecordReader


def snapshot(root: pathlib.Path) -> dict[str, str]:
    """Every path below ``root`` (symlinks not followed): "dir", "link -> target" or the file's sha256."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = os.path.join(directory, name)
            key = os.path.relpath(path, root)
            if os.path.islink(path):
                found[key] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                found[key] = "dir"
            else:
                with open(path, "rb") as handle:
                    found[key] = hashlib.sha256(handle.read()).hexdigest()
    return found


def changed_outside(before: dict[str, str], after: dict[str, str], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The paths that changed, appeared or vanished between two snapshots, other than those under ``allowed``."""
    def outside(name: str) -> bool:
        return not any(name == prefix or name.startswith(prefix + os.sep) for prefix in allowed)

    return {name: (before.get(name), after.get(name)) for name in sorted(set(before) | set(after))
            if outside(name) and before.get(name) != after.get(name)}


def copy_dataset(source: pathlib.Path, sandbox: pathlib.Path) -> pathlib.Path:
    """``source`` copied (times kept, so its read indexes stay current) to ``sandbox/ds``."""
    dataset = sandbox / "ds"
    shutil.copytree(source, dataset, copy_function=shutil.copy2)
    return dataset


def edit_manifest(dataset: pathlib.Path, change: Callable[[dict], None]) -> None:
    """Rewrite the dataset's manifest with ``change`` applied to its JSON."""
    path = dataset / "tfrbeam_dataset.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def record_offsets(path: pathlib.Path) -> list[int]:
    """The byte offset of every record of an uncompressed TFRecord file."""
    with RecordReader(str(path)) as reader:
        return [offset for offset, _ in reader.records_with_offsets()]


def cut_at_record(path: pathlib.Path, keep: int) -> None:
    """Truncate ``path`` right after its first ``keep`` records: a file that is still well framed."""
    end = record_offsets(path)[keep]
    with open(path, "r+b") as handle:
        handle.truncate(end)
