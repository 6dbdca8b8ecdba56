"""A tool run in a child process under a time limit and a memory ceiling, and a snapshot that never opens a FIFO.

A planted file of the wrong kind makes a careless tool hang (a FIFO) or run out of memory (a sparse
file, ``/dev/zero``): each run here is killed when it passes either limit, so a failing test fails
in seconds instead of hanging the suite or the machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

_POLL_SECONDS = 0.02
_HASHED_BYTES = 64 << 20  # larger regular files (a planted sparse file) are told apart by size, inode and times

# Reads a dataset through the Python API and prints the record count and a digest of every record's bytes.
API_READER = """
import hashlib, sys
from tfrbeam.errors import TfrbeamError
tool, path = sys.argv[1:3]
try:
    digest, count = hashlib.sha256(), 0
    for split in ("train", "eval"):
        if tool == "open_dataset":
            from tfrbeam.dataset import open_dataset
            records = [record for batch in open_dataset(path, split, batch_size=64, raw=True, prefetch=0,
                                                        executor="threads") for record in batch["record"]]
        else:
            from tfrbeam.dataset import open_random_access
            dataset = open_random_access(path, split, raw=True)
            records = [dataset[number] for number in range(len(dataset))]
        for record in records:
            digest.update(bytes(record))
            count += 1
except (TfrbeamError, OSError) as error:
    print(f"{type(error).__name__}: {error}", file=sys.stderr)
    sys.exit(1)
print(count, digest.hexdigest())
"""


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """What a bounded child run did: its exit code (None when killed), output, time and peak memory."""

    command: tuple[str, ...]
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    killed: str | None  # "timeout" or "memory" when the limits ended it

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def tool_command(*arguments: str) -> list[str]:
    """``tfrbeam ARGUMENTS`` as a child process of this interpreter."""
    return [sys.executable, "-m", "tfrbeam.cli.main", *arguments]


def api_command(tool: str, path: str) -> list[str]:
    """``open_dataset`` or ``open_random_access`` (``tool``) reading every split of ``path``, as a child process."""
    return [sys.executable, "-c", API_READER, tool, path]


def run_bounded(command: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, timeout: float = 30.0,
                max_rss_mb: float = 1024.0) -> ChildRun:
    """Run ``command`` in its own session; kill that session when it passes ``timeout`` or ``max_rss_mb``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        child = subprocess.Popen(list(command), cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        peak_kb, killed = 0, None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            rss_kb = _rss_kb(child.pid)
            peak_kb = max(peak_kb, rss_kb)
            if rss_kb > max_rss_mb * 1024 or time.monotonic() - start > timeout:
                killed = "memory" if rss_kb > max_rss_mb * 1024 else "timeout"
                os.killpg(child.pid, signal.SIGKILL)  # the session this run started, and only it
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(_POLL_SECONDS)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return ChildRun(tuple(command), None if killed else child.returncode, out.read().decode(errors="replace"),
                        err.read().decode(errors="replace"), seconds, max(peak_kb, usage.ru_maxrss) / 1024, killed)


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def kind_snapshot(root: pathlib.Path) -> dict[str, str]:
    """Every path below ``root``, symlinks and FIFOs never opened: its kind, link target or content digest."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = _describe(path)
    return found


def _describe(path: str) -> str:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "link -> " + os.readlink(path)
    if stat.S_ISDIR(info.st_mode):
        return f"dir {stat.S_IMODE(info.st_mode):o}"
    if not stat.S_ISREG(info.st_mode):
        return f"special {stat.S_IFMT(info.st_mode):o} inode {info.st_ino}"
    if info.st_size > _HASHED_BYTES:
        return f"large {info.st_size} inode {info.st_ino} mtime {info.st_mtime_ns}"
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def changed_outside(before: dict[str, str], after: dict[str, str], inside: str) -> dict[str, tuple]:
    """Paths that changed, appeared or vanished between two snapshots, other than ``inside`` and what lies below it."""
    return {name: (before.get(name), after.get(name)) for name in sorted(set(before) | set(after))
            if name != inside and not name.startswith(inside + os.sep) and before.get(name) != after.get(name)}
