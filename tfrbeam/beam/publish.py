"""The commit protocol: how a finished write becomes visible, for the sink and the build alike.

Invariants (tested under injected faults at every file-system call, ``kill -9``, ENOSPC and
concurrent runs; see the README's "Commit protocol"):

- A reader sees the complete old output or the complete new one, never a mix.
- A crash at any point leaves only what the next run into the same output recovers: it rolls an
  interrupted commit forward and removes what dead runs left, without ``--overwrite``.
- A run never touches another live run's files; two commits into one output never interleave.

The pieces, each used by both writers:

- ``RunIdentity``: run id, host, pid, the process's start time and the command; it names the other
  run in every "busy" error and tells dead runs from live ones.
- ``OutputLock``: an exclusive lock file beside the output (``.{name}.tfrbeam-lock``). Locally it
  is held with ``flock`` for as long as the run, so a lock left by a killed process is detected as
  stale and taken over. On object stores it is advisory (create, then read back).
- Staging directories beside the output (``.{name}.tfrbeam-{run}/``) with an ``owner.json``:
  everything is written there first.
- ``CommitJournal``: the deletions and renames of a commit, written (atomically) before the first
  of them; applying it is idempotent, so a run that finds a dead run's journal rolls it forward.
- ``swap_into_place``: a local dataset directory is published with one ``renameat2(RENAME_EXCHANGE)``
  (or one rename when the output does not exist yet): the crash window of a replace is zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import posixpath
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.errors import CommitError, ManifestError, OutputLockedError, OutputNotWritableError
from tfrbeam.manifest import read_manifest
from tfrbeam.naming import is_staging_name, lock_path, staging_path, staging_prefix

__all__ = [
    "CommitJournal", "OutputLock", "RunIdentity", "StagingDir", "dead_staging_dirs", "lock_path", "recover",
    "staging_path", "swap_into_place", "this_run",
]

_LOG = logging.getLogger(__name__)

OWNER_NAME = "owner.json"
ABANDONED_NAME = "abandoned.json"  # owner.json renamed: the run is over, its staging directory is garbage
JOURNAL_NAME = "commit.json"


# ----------------------------------------------------------------------------------- run identity


def _process_start(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): tells a live run from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """Who is writing: enough to name the run in an error and to tell whether it still runs."""

    run_id: str
    host: str
    pid: int
    started: str
    process_start: int | None
    command: str

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host}, started {self.started}: {self.command})"

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> RunIdentity | None:
        try:
            raw = json.loads(data.decode("utf-8"))
            return cls(**{field.name: raw[field.name] for field in dataclasses.fields(cls)})
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def is_alive(self) -> bool | None:
        """True or False for a run on this host; None when it ran elsewhere (cannot be told from here)."""
        if self.host != socket.gethostname():
            return None
        if self.pid == os.getpid():
            return True
        start = _process_start(self.pid)
        if start is None:
            return False
        return self.process_start is None or start == self.process_start


def this_run(run_id: str) -> RunIdentity:
    """The identity of a run started by this process."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    command = " ".join(os.path.basename(arg) if index == 0 else arg for index, arg in enumerate(sys.argv))[:200]
    return RunIdentity(run_id, socket.gethostname(), os.getpid(), now, _process_start(os.getpid()), command or "python")


# ------------------------------------------------------------------------------------- paths


def _staging_dirs(target: str) -> list[str]:
    directory, _ = staging_prefix(target)
    return [fs.join(directory, name) for name in fs.list_names(directory) if is_staging_name(target, name)]


# ------------------------------------------------------------------------------------- the lock


class OutputLock:
    """An exclusive lock on one output; ``acquire`` fails naming the run that holds it.

    Locally the lock file is held with ``flock`` while this object is acquired; a file left by a
    killed run is not locked by anyone and is taken over. On object stores the file's existence is
    the lock (advisory: an object store offers no create-if-absent through Beam's FileSystems).
    """

    def __init__(self, target: str, owner: RunIdentity):
        self.target = target
        self.owner = owner
        self.path = lock_path(target)
        self._fd: int | None = None

    def holder(self) -> RunIdentity | None:
        """The run that the lock file names (None: no lock file, or an unreadable one)."""
        try:
            return RunIdentity.from_json(fs.read_bytes(self.path))
        except (OSError, FileNotFoundError):
            return None

    def names_owner(self) -> bool:
        holder = self.holder()
        return holder is not None and holder.run_id == self.owner.run_id

    def acquire(self) -> OutputLock:
        if fs.is_remote(self.path):
            self._acquire_remote()
        else:
            self._acquire_local()
        return self

    def _busy(self, holder: RunIdentity | None) -> OutputLockedError:
        who = holder.describe() if holder else "another run (its lock file is unreadable)"
        return OutputLockedError(
            f"{self.target} is in use by {who}; wait for it to finish or choose another output "
            f"(lock file {self.path})"
        )

    def _acquire_local(self) -> None:
        import fcntl

        parent = os.path.dirname(self.path)
        for _ in range(5):
            try:
                os.makedirs(parent, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise OutputNotWritableError(
                        f"{self.path}: the lock file is a symbolic link; tfrbeam never follows one, remove it"
                    ) from error
                raise OutputNotWritableError(f"{parent}: cannot create the lock file {self.path}: {error.strerror}") from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._busy(self.holder()) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released (unlinked) between our open and our flock: try the new file
                os.close(fd)
                continue
            stale = self.holder()
            if stale is not None and stale.run_id != self.owner.run_id:
                _LOG.warning("taking over the lock of %s, which no longer runs", stale.describe())
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, self.owner.to_json(), 0)
                os.fsync(fd)
            except OSError as error:
                os.close(fd)
                raise OutputNotWritableError(f"{self.path}: cannot write the lock file: {error.strerror}") from error
            self._fd = fd
            return
        raise self._busy(self.holder())

    def _acquire_remote(self) -> None:
        holder = self.holder()
        if holder is not None and holder.run_id != self.owner.run_id:
            raise self._busy(holder)
        fs.write_bytes(self.path, self.owner.to_json(), "application/json")
        if not self.names_owner():
            raise self._busy(self.holder())

    def release(self) -> None:
        """Remove the lock file if it still names this run, then let go of it."""
        try:
            if self.names_owner():
                fs.delete_files([self.path])
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


@contextlib.contextmanager
def held_or_taken(target: str, owner: RunIdentity) -> Iterator[None]:
    """Hold the output's lock for a commit: confirm the launcher holds it for this run, or take it now."""
    lock = OutputLock(target, owner)
    if lock.names_owner():
        yield
        return
    with lock:
        yield


# ---------------------------------------------------------------------------------- staging


@dataclasses.dataclass(frozen=True)
class StagingDir:
    """A run's staging directory and the identity written into it."""

    path: str
    owner: RunIdentity

    def create(self) -> StagingDir:
        """Create it with its ``owner.json`` (kept when present); also the probe that the output's place is writable."""
        owner = fs.join(self.path, OWNER_NAME)
        try:
            fs.mkdirs(self.path)
            if not fs.exists(owner):
                fs.write_bytes(owner, self.owner.to_json(), "application/json")
        except OSError as error:
            reason = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
            raise OutputNotWritableError(f"{self.path}: cannot write beside the output ({reason})") from error
        return self

    def join(self, *parts: str) -> str:
        return fs.join(self.path, *parts)


def abandon(staging: str) -> None:
    """Mark a finished or failed run's staging directory as garbage for the next run (a rename: needs no disk space)."""
    owner = fs.join(staging, OWNER_NAME)
    try:
        if fs.exists(owner):
            fs.rename([(owner, fs.join(staging, ABANDONED_NAME))])
    except OSError as error:
        _LOG.warning("could not mark %s as abandoned (%s); it goes once this process has ended", staging, error)


def _owner_of(directory: str) -> RunIdentity | None:
    for name in (OWNER_NAME, ABANDONED_NAME):
        try:
            return RunIdentity.from_json(fs.read_bytes(fs.join(directory, name)))
        except (OSError, FileNotFoundError):
            continue
    return None


def _is_abandoned(directory: str) -> bool:
    return fs.exists(fs.join(directory, ABANDONED_NAME)) or not fs.exists(fs.join(directory, OWNER_NAME))


def dead_staging_dirs(target: str, keep: str | None = None) -> list[str]:
    """Staging directories of ``target`` whose run is known to be dead (not ``keep``)."""
    dead = []
    for directory in _staging_dirs(target):
        if keep is not None and directory.rstrip("/") == keep.rstrip("/"):
            continue
        owner = _owner_of(directory)
        if owner is None or _is_abandoned(directory) or owner.is_alive() is False:
            dead.append(directory)
    return dead


def live_staging_dirs(target: str, keep: str | None = None) -> list[str]:
    """Staging directories of other runs that are alive, or whose liveness cannot be told."""
    dead = set(dead_staging_dirs(target, keep))
    return [d for d in _staging_dirs(target) if d not in dead and (keep is None or d.rstrip("/") != keep.rstrip("/"))]


# ---------------------------------------------------------------------------------- journal


@dataclasses.dataclass(frozen=True)
class CommitJournal:
    """The file operations of one commit, written before the first one runs; applying it again is harmless."""

    run_id: str
    target: str
    deletions: tuple[str, ...]
    moves: tuple[tuple[str, str], ...]  # (staged, final), applied in order after the deletions

    def write(self, staging: str) -> None:
        """Write the journal atomically: a reader finds the whole journal or none."""
        data = json.dumps({"run_id": self.run_id, "target": self.target, "deletions": list(self.deletions),
                           "moves": [list(pair) for pair in self.moves]}, indent=1).encode("utf-8")
        temp, final = fs.join(staging, JOURNAL_NAME + ".tmp"), fs.join(staging, JOURNAL_NAME)
        fs.write_bytes(temp, data, "application/json")
        fs.rename([(temp, final)])

    @classmethod
    def read(cls, staging: str) -> CommitJournal | None:
        path = fs.join(staging, JOURNAL_NAME)
        if not fs.exists(path):
            return None
        try:
            raw = json.loads(fs.read_bytes(path).decode("utf-8"))
            return cls(raw["run_id"], raw["target"], tuple(raw["deletions"]), tuple((a, b) for a, b in raw["moves"]))
        except (ValueError, KeyError, TypeError) as error:
            raise CommitError(f"{path}: an unreadable commit journal ({error}); remove {staging} by hand") from error

    def apply(self) -> None:
        """Delete what the commit replaces, then rename every staged file whose source still exists."""
        fs.delete_files(self.deletions)
        pending = [(source, destination) for source, destination in self.moves if fs.exists(source)]
        for directory in sorted({fs.parent(destination) for _, destination in pending}):
            fs.mkdirs(directory)
        fs.rename(pending)


# ------------------------------------------------------------------------------ swapping a dir


def swap_into_place(new_dir: str, target: str, old_dir: str) -> str:
    """Make the local directory ``new_dir`` be ``target``; returns where the replaced directory now is.

    One atomic rename when ``target`` does not exist, one atomic exchange when it does (the old
    directory then sits at ``new_dir``). Where the filesystem cannot exchange, two renames
    (target → ``old_dir``, new_dir → target); a crash between them is rolled forward by ``recover``.
    """
    if not os.path.lexists(target):
        fs.rename_local(new_dir, target)
        return old_dir
    try:
        fs.exchange(new_dir, target)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        fs.rename_local(target, old_dir)
        fs.rename_local(new_dir, target)
        return old_dir
    return new_dir


def committed_run(target: str) -> str | None:
    """The run id in ``target``'s manifest (the run whose dataset is published there), if any."""
    try:
        manifest = read_manifest(target, BEAM_FILES)
    except (ManifestError, OSError):
        return None
    return None if manifest is None else manifest.get("run_id")


# ---------------------------------------------------------------------------------- recovery


def _normalized(path: str) -> str:
    """A path with ``.``/``..`` resolved (local: absolute), so confinement is a prefix test."""
    if fs.is_remote(path):
        scheme, rest = path.split("://", 1)
        return scheme + "://" + posixpath.normpath(rest)
    return os.path.normpath(os.path.abspath(path))


def _no_symlink_below(root: str, path: str) -> bool:
    """Local: no component of ``path`` below ``root`` (itself included) is a symlink."""
    if fs.is_remote(path):
        return True
    current = path
    while current != root and len(current) > len(root):
        if os.path.islink(current):
            return False
        current = os.path.dirname(current)
    return True


def confined(path: str, target: str, staging: str, prefix_output: bool = False) -> bool:
    """Whether ``path`` lies inside the staging directory or the output (a directory, or a sink's file prefix)."""
    if not isinstance(path, str) or (fs.is_remote(path) != fs.is_remote(target)):
        return False
    raw = path.split("://", 1)[-1]
    if any(part in ("..", ".") for part in raw.split("/")[1:]):
        return False
    path, target, staging = _normalized(path), _normalized(target), _normalized(staging)
    sep = "/" if fs.is_remote(path) else os.sep
    for root in (staging, target):
        if path.startswith(root + sep):
            return _no_symlink_below(root, path)
    if prefix_output:
        directory, name = target.rsplit(sep, 1)
        head, base = path.rsplit(sep, 1)
        if base.startswith(name) and head in (directory, directory + sep + ".tfrbeam-index"):
            return _no_symlink_below(directory, path)
    return False


def untrusted_journal(journal: CommitJournal, target: str, staging: str, prefix_output: bool = False) -> str | None:
    """Why a journal cannot be acted on (another output's, or a path outside its staging directory and output); None if fine."""
    if _normalized(journal.target) != _normalized(target):
        return f"it names another output ({journal.target!r})"
    for path in [*journal.deletions, *(p for pair in journal.moves for p in pair)]:
        if not confined(path, target, staging, prefix_output):
            return f"it names {path!r}, outside {staging} and {target}"
    return None


def _untrusted_staging(directory: str, new_name: str, old_name: str) -> str | None:
    """Local: a staging directory, its owner files and its dataset entries must be what they claim (no symlinks)."""
    if fs.is_remote(directory):
        return None
    names = [directory] + [os.path.join(directory, name)
                           for name in (OWNER_NAME, ABANDONED_NAME, JOURNAL_NAME, new_name, old_name)]
    for path in names:
        if os.path.islink(path):
            return f"{path} is a symbolic link"
    return None


def recover(target: str, keep: str | None = None, new_name: str = "dataset", old_name: str = "old",
            carry_over: Callable[[str, str], None] | None = None, prefix_output: bool = False) -> list[str]:
    """Finish or undo what dead runs left for ``target``; returns the staging directories removed.

    A dead run's journal is rolled forward (its staged files were complete when it was written);
    a local swap interrupted between its two renames is completed; when the dead run's dataset is
    the one published, ``carry_over(old_dir, target)`` moves the user's files out of the replaced
    directory first. Then the staging directory goes. Live runs' directories are never touched.
    """
    removed = []
    for directory in dead_staging_dirs(target, keep):
        problem = _untrusted_staging(directory, new_name, old_name)
        if problem is not None:
            _LOG.warning("left %s alone: %s, so it is not provably this output's; remove it by hand", directory, problem)
            continue
        owner = _owner_of(directory)
        journal = CommitJournal.read(directory)
        why = None if journal is None else untrusted_journal(journal, target, directory, prefix_output)
        if why is not None:
            _LOG.warning("left %s alone: %s; remove it by hand", fs.join(directory, JOURNAL_NAME), why)
            continue
        if journal is not None:
            _LOG.warning("completing the interrupted commit of run %s into %s", journal.run_id, target)
            journal.apply()
        new_dir, old_dir = fs.join(directory, new_name), fs.join(directory, old_name)
        if not fs.is_remote(target):
            if not os.path.lexists(target) and os.path.isdir(old_dir) and os.path.isdir(new_dir):
                _LOG.warning("completing the interrupted swap of %s into %s", new_dir, target)
                fs.rename_local(new_dir, target)
            if carry_over is not None and owner is not None and committed_run(target) == owner.run_id:
                for replaced in (old_dir, new_dir):
                    if os.path.isdir(replaced):
                        carry_over(replaced, target)
        fs.delete_tree(directory)
        removed.append(directory)
    return removed


def describe_paths(paths: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
