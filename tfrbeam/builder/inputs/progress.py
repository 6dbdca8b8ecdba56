"""Progress counted across worker processes: small append-only files in the run's local staging directory.

Readers count rows and input bytes read; shard writers count examples written. The build's own
process sums the files (``read_progress``) for its progress bar or log lines, so any runner whose
workers share this machine's disk (in-process, multi-process) reports. An object store cannot
append, so remote staging has no progress files.
"""

from __future__ import annotations

import os
import uuid

PROGRESS_DIR_NAME = "progress"
READ, WRITTEN = "read", "written"  # what a counter file counts: rows and input bytes read; examples and bytes written


def progress_dir(staging_dir: str) -> str | None:
    """Where the workers of a run count what they did: local staging only."""
    if "://" in staging_dir:
        return None
    return f"{staging_dir.rstrip('/')}/{PROGRESS_DIR_NAME}"


class ProgressCounter:
    """Appends "count bytes" lines to one file per worker process and kind; the build's own process sums them.

    One small append per batch or shard (thousands of rows), so counting costs nothing noticeable.
    """

    _names: dict[tuple[str, str, int], str] = {}

    def __init__(self, directory: str, kind: str = READ):
        self.directory = directory
        self.kind = kind

    def add(self, count: int, size: int) -> None:
        try:
            with open(self._path(), "ab") as handle:
                handle.write(f"{count} {size}\n".encode("ascii"))
        except OSError:  # progress is a courtesy: never fail a build over it
            return

    def _path(self) -> str:
        key = (self.directory, self.kind, os.getpid())
        if key not in self._names:
            os.makedirs(self.directory, exist_ok=True)
            self._names[key] = os.path.join(self.directory, f"{os.getpid()}-{uuid.uuid4().hex[:8]}.{self.kind}")
        return self._names[key]


def read_progress(directory: str, offsets: dict[str, int], totals: list[int], kind: str = READ) -> tuple[int, int]:
    """Add the lines the `kind` counter files got since the last call to totals [count, bytes]; returns the totals."""
    try:
        names = [name for name in os.listdir(directory) if name.endswith(f".{kind}")]
    except OSError:
        return totals[0], totals[1]
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as handle:
                handle.seek(offsets.get(path, 0))
                data = handle.read()
        except OSError:
            continue
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        offsets[path] = offsets.get(path, 0) + len(complete)
        for line in complete.splitlines():
            count, size = line.split()
            totals[0] += int(count)
            totals[1] += int(size)
    return totals[0], totals[1]
