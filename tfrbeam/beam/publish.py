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
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tfrbeam.base import object_store
from tfrbeam.base.file_access import read_found
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.errors import (
    CommitError,
    ManifestError,
    ObjectTooLargeError,
    OutputLockedError,
    OutputNotWritableError,
    PreconditionFailedError,
    RefusedFileError,
    StorageError,
)
from tfrbeam.layout.manifest import MAX_MANIFEST_BYTES, dataset_files, read_manifest
from tfrbeam.layout.names import (
    ABANDONED_NAME,
    INDEX_DIR_NAME,
    JOURNAL_NAME,
    OWNER_NAME,
    is_built_shard_path,
    is_staging_name,
    lock_path,
    staging_path,
    staging_prefix,
)

__all__ = [
    "CommitJournal", "OutputLock", "RunIdentity", "StagingDir", "dead_staging_dirs", "delete_missing_ok",
    "delete_staging", "is_gone", "lock_path",
    "owner_record", "recover", "remove_published_staging",
    "staging_path", "swap_into_place", "this_run",
]

_LOG = logging.getLogger(__name__)
# Up to 5 s for a lock holder to write its identity (1 s was too little for a process on a loaded machine).
_HOLDER_WAITS, _HOLDER_WAIT_SECONDS = 100, 0.05



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


# ------------------------------------------------------------------------------------- whole records


def write_whole(path: str, data: bytes) -> None:
    """Write a small record (journal, commit record) so that a reader finds all of it or none: on an object store one
    whole-object write (one request), elsewhere a temp file and a rename."""
    if object_store.is_object_store(path):
        fs.write_bytes(path, data, "application/json")
        return
    temp = path + ".tmp"
    fs.write_bytes(temp, data, "application/json")
    fs.rename([(temp, path)])


def read_whole(path: str, max_bytes: int, what: str) -> bytes | None:
    """A small record's bytes, None when there is none (on an object store one request); RefusedFileError when it
    is larger than ``max_bytes`` or no regular file."""
    if object_store.is_object_store(path):
        found = object_store.read_versioned(path, max_bytes)  # ObjectTooLargeError is a RefusedFileError
        return None if found is None else found[0]
    if not fs.exists(path):
        return None
    return read_found(path, max_bytes, what, files=BEAM_FILES)


# ------------------------------------------------------------------------------------- paths


def _staging_dirs(target: str) -> list[str]:
    directory, prefix = staging_prefix(target)
    if not fs.is_remote(directory) or any(char in base_name for char in "*?[" for base_name in (directory, prefix)):
        return [fs.join(directory, name) for name in fs.list_names(directory) if is_staging_name(target, name)]
    # One listing of the objects whose names start with the staging prefix, not of everything beside the output.
    base = directory.rstrip("/") + "/"
    names = {path[len(base):].split("/")[0] for path in fs.match(base + prefix + "*/**") if path.startswith(base)}
    return [fs.join(directory, name) for name in sorted(names) if is_staging_name(target, name)]


# ------------------------------------------------------------------------------------- the lock


class OutputLock:
    """An exclusive lock on one output; ``acquire`` fails naming the run that holds it.

    Locally the lock file is held with ``flock`` while this object is acquired; a file left by a
    killed run is not locked by anyone and is taken over. On ``gs://`` and ``s3://`` the lock is an
    object created only if absent, with a lease the holder renews (``LockLease``).
    """

    def __init__(self, target: str, owner: RunIdentity, lease_seconds: float | None = None):
        self.target = target
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.path = lock_path(target)
        self._fd: int | None = None
        self._lease: LockLease | None = None

    def holder(self) -> RunIdentity | None:
        """The run that the lock file names (None: no lock file, or an unreadable one)."""
        try:
            data = read_found(self.path, MAX_LOCK_BYTES, "lock file", files=BEAM_FILES)  # a FIFO or giant: unreadable
        except (OSError, FileNotFoundError):
            return None
        return RunIdentity.from_json(data)

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
        # The holder writes its identity just after it takes the lock: give it a moment to say who it is.
        for _ in range(_HOLDER_WAITS):
            if holder is not None:
                break
            time.sleep(_HOLDER_WAIT_SECONDS)
            holder = self.holder()
        who = holder.describe() if holder else "another run (its lock file does not say which: not written yet, or unreadable)"
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
            _HELD[self.path] = self
            return
        raise self._busy(self.holder())

    def _acquire_remote(self) -> None:
        if object_store.is_object_store(self.path):
            self._lease = LockLease.take(self, self.lease_seconds)
            _HELD[self.path] = self
            return
        # Other Beam filesystems offer no create-if-absent: the lock is advisory (create, then read back).
        holder = self.holder()
        if holder is not None and holder.run_id != self.owner.run_id:
            raise self._busy(holder)
        fs.write_bytes(self.path, self.owner.to_json(), "application/json")
        if not self.names_owner():
            raise self._busy(self.holder())
        _HELD[self.path] = self

    def check_held(self) -> None:
        """Raise CommitError when this run's lease on an object-store lock was lost (it could not renew it in time)."""
        if self._lease is not None:
            self._lease.check()

    def release(self) -> None:
        """Remove the lock file if it still names this run, then let go of it."""
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.release()
            return
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


_HELD: dict[str, OutputLock] = {}  # lock file → the lock this process holds on it

MAX_LOCK_BYTES = 64 << 10  # a lock (or staging owner record) tfrbeam writes is well under 1 KiB
MAX_JOURNAL_BYTES = 4 * MAX_MANIFEST_BYTES  # a journal names each file of a dataset (3 per shard), deleted or moved
LEASE_SECONDS = 120.0  # an object-store lock whose holder has not renewed it for this long is a dead run's


def _lease_record(owner: RunIdentity, seconds: float) -> bytes:
    record = dataclasses.asdict(owner)
    record["lease_expires"] = time.time() + seconds
    record["lease_seconds"] = seconds
    return json.dumps(record, indent=1).encode("utf-8")


def _lease_expired(data: bytes) -> bool:
    """Whether a lock object's lease has run out (an unreadable one counts as expired only once its run is dead)."""
    try:
        expires = json.loads(data.decode("utf-8"))["lease_expires"]
        return isinstance(expires, (int, float)) and time.time() > expires
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False


class LockLease:
    """An object-store lock: created only if absent, renewed by a thread of the holder, released by version.

    The object names the run and when its lease ends. A run finding it takes it over only when the
    lease has run out or the holder is a dead process on this host, and only by a conditional
    replace of the version it read, so two runs never both win. Renewal is conditional too: a
    holder that lost its lock (it could not renew in time) learns so at ``check`` before it commits.
    """

    def __init__(self, lock: OutputLock, token: str, seconds: float):
        self.lock, self.token, self.seconds = lock, token, seconds
        self._stop = threading.Event()
        self._lost: str | None = None
        self._guard = threading.Lock()
        self._thread = threading.Thread(target=self._renew_until_stopped, name="tfrbeam-lock-lease", daemon=True)
        self._thread.start()

    @classmethod
    def take(cls, lock: OutputLock, seconds: float | None = None) -> LockLease:
        seconds = LEASE_SECONDS if seconds is None else seconds
        record = _lease_record(lock.owner, seconds)
        try:
            return cls(lock, object_store.create_if_absent(lock.path, record), seconds)
        except PreconditionFailedError:
            pass
        try:
            found = object_store.read_versioned(lock.path, MAX_LOCK_BYTES)
        except ObjectTooLargeError as error:
            raise OutputLockedError(f"{lock.target}: its lock {error}") from None
        if found is None:  # released between our two requests: try once more
            try:
                return cls(lock, object_store.create_if_absent(lock.path, record), seconds)
            except PreconditionFailedError:
                raise lock._busy(lock.holder()) from None
        data, token = found
        holder = RunIdentity.from_json(data)
        dead = holder is not None and holder.run_id != lock.owner.run_id and holder.is_alive() is False
        if not (dead or _lease_expired(data)):
            raise lock._busy(holder)
        try:
            token = object_store.replace_if_match(lock.path, record, token)
        except PreconditionFailedError:
            raise lock._busy(lock.holder()) from None
        _LOG.warning("taking over the lock of %s, %s", holder.describe() if holder else "an unreadable holder",
                     "which no longer runs" if dead else "whose lease ran out")
        return cls(lock, token, seconds)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.seconds / 4) and self.renew():
            pass

    def renew(self) -> bool:
        """Extend the lease by a conditional replace; False once the lock is lost (another run replaced it)."""
        with self._guard:
            if self._stop.is_set() or self._lost is not None:
                return False
            try:
                self.token = object_store.replace_if_match(
                    self.lock.path, _lease_record(self.lock.owner, self.seconds), self.token)
            except PreconditionFailedError as error:
                self._lost = f"another run replaced it ({error})"
                return False
            except Exception as error:  # an unreachable store: try again at the next beat
                _LOG.warning("could not renew the lock %s (%s); trying again", self.lock.path, error)
            return True

    def check(self) -> None:
        if self._lost is not None:
            raise CommitError(f"{self.lock.target}: this run lost its lock {self.lock.path}: {self._lost}; nothing "
                              "was published by this run")

    def release(self) -> None:
        """Delete the lock object if it is still this run's version; a store that does not answer leaves it to expire."""
        self._stop.set()
        with self._guard:
            try:
                object_store.delete_if_match(self.lock.path, self.token)
            except (PreconditionFailedError, StorageError) as error:
                _LOG.warning("could not remove the lock %s (%s); it expires within %.0f s, or at once for a run on "
                             "this host", self.lock.path, error, self.seconds)
        self._thread.join(5)


def holds_lock(target: str, run_id: str) -> bool:
    """Whether this process holds ``target``'s lock for run ``run_id`` (acquired here, its lease not known lost)."""
    held = _HELD.get(lock_path(target))
    return held is not None and held.owner.run_id == run_id and (held._lease is None or held._lease._lost is None)


@contextlib.contextmanager
def held_or_taken(target: str, owner: RunIdentity) -> Iterator[None]:
    """Hold the output's lock for a commit: this process holds it for this run already, or it takes it now.

    What the lock file says is never taken as proof: a file naming this run may be left by this
    run's launcher after it was killed (its ``flock`` died with it). Only a lock acquired in this
    process counts; otherwise the lock is taken here, which fails naming any other holder.
    """
    held = _HELD.get(lock_path(target))
    if held is not None and held.owner.run_id == owner.run_id:
        held.check_held()  # an object-store lease this run could not renew is another run's lock now
        yield
        return
    with OutputLock(target, owner):
        yield


# ---------------------------------------------------------------------------------- staging


_OWNERS_WRITTEN: set[str] = set()  # object-store owner records this process wrote whole (run ids make them unique)


@dataclasses.dataclass(frozen=True)
class StagingDir:
    """A run's staging directory, the identity written into it and the output it stages for."""

    path: str
    owner: RunIdentity
    output: str  # the output (dataset directory or file prefix) this directory belongs to; owner.json records it

    def create(self) -> StagingDir:
        """Create it with its ``owner.json`` (kept when present); also the probe that the output's place is writable."""
        owner = fs.join(self.path, OWNER_NAME)
        try:
            if object_store.is_object_store(owner):  # one request: create the record unless it is there
                if owner in _OWNERS_WRITTEN:  # record_writes made it, in this process: no request at all
                    return self
                with contextlib.suppress(PreconditionFailedError):
                    fs.write_if_absent(owner, owner_record(self.owner, self.output))
                return self
            fs.mkdirs(self.path)
            if not fs.exists(owner):
                fs.write_bytes(owner, owner_record(self.owner, self.output), "application/json")
        except OSError as error:
            raise self._not_writable(error) from error
        return self

    def record_writes(self, paths: Sequence[str]) -> None:
        """Before the run writes objects straight into the output: ``owner.json`` names them, in one whole-object
        write, so recovery removes those a dead run wrote and never published."""
        owner = fs.join(self.path, OWNER_NAME)
        try:
            fs.write_bytes(owner, owner_record(self.owner, self.output, paths), "application/json")
        except OSError as error:
            raise self._not_writable(error) from error
        _OWNERS_WRITTEN.add(owner)

    def _not_writable(self, error: OSError) -> OutputNotWritableError:
        reason = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
        return OutputNotWritableError(f"{self.path}: cannot write beside the output ({reason})")

    def join(self, *parts: str) -> str:
        return fs.join(self.path, *parts)


def owner_record(owner: RunIdentity, output: str, writes: Sequence[str] = ()) -> bytes:
    """``owner.json``: the run, and the output it writes (absolute), so recovery can tell whose directory it is;
    ``writes``: the objects it may write straight into an object-store output (``StagingDir.record_writes``)."""
    record: dict[str, Any] = dataclasses.asdict(owner)
    record["output"] = _normalized(output)
    if writes:
        record["writes"] = list(writes)
    return json.dumps(record, indent=1).encode("utf-8")


_REMOVED: set[str] = set()  # staging directories this process removed whole after publishing (nothing to abandon)


def remove_published_staging(staging: str) -> None:
    """After a publish: remove the run's staging directory (``delete_staging``)."""
    delete_staging(staging)
    _REMOVED.add(staging)


def delete_staging(staging: str) -> None:
    """Remove a run's staging directory, its owner records last: until they go, the next run's recovery trusts what
    is left, so a run killed in the middle leaves nothing only a person can remove. An object store deletes its
    objects in any order otherwise: one listing, then one delete per object. Objects already gone are fine."""
    if not object_store.is_object_store(staging):
        delete_tree_missing_ok(staging)
        return
    records = {fs.join(staging, OWNER_NAME), fs.join(staging, ABANDONED_NAME)}
    objects = list(fs.list_objects(staging))
    delete_missing_ok([path for path in objects if path not in records])
    delete_missing_ok([path for path in objects if path in records])


def abandon(staging: str) -> None:
    """Mark a finished or failed run's staging directory as garbage for the next run (a rename: needs no disk space)."""
    if staging in _REMOVED:
        return
    owner = fs.join(staging, OWNER_NAME)
    try:
        if fs.exists(owner):
            fs.rename([(owner, fs.join(staging, ABANDONED_NAME))])
    except OSError as error:
        _LOG.warning("could not mark %s as abandoned (%s); it goes once this process has ended", staging, error)


@dataclasses.dataclass(frozen=True)
class _Owner:
    """What a staging directory's owner file says: the run, the output it names, whether the run is over."""

    run: RunIdentity
    output: str | None
    abandoned: bool
    writes: tuple[str, ...] = ()  # objects the run wrote straight into the output (None: the record is malformed)

    def is_dead(self) -> bool:
        return self.abandoned or self.run.is_alive() is False


def _owner_of(directory: str) -> _Owner | None:
    """The owner file of a staging directory (``owner.json``, or ``abandoned.json`` once the run is over); None if unreadable."""
    for name in (OWNER_NAME, ABANDONED_NAME):
        try:
            data = read_found(fs.join(directory, name), MAX_LOCK_BYTES, "staging owner record", files=BEAM_FILES)
        except (OSError, FileNotFoundError):
            continue
        run = RunIdentity.from_json(data)
        if run is None:
            return None
        try:
            raw = json.loads(data.decode("utf-8"))
            output, writes = raw.get("output"), raw.get("writes", [])
        except (ValueError, UnicodeDecodeError, AttributeError):
            output, writes = None, []
        if not isinstance(writes, list) or not all(isinstance(path, str) for path in writes):
            output = None  # a record naming its objects wrongly is no proof of anything: left alone
        return _Owner(run, output if isinstance(output, str) else None, name == ABANDONED_NAME,
                      tuple(writes) if isinstance(writes, list) else ())
    return None


def _holds_nothing(directory: str) -> bool:
    """Local: a directory holding nothing, or only an empty ``owner.json`` (a run killed while creating it).

    The owner file is written with one small write, so a killed run leaves it complete or empty.
    """
    if fs.is_remote(directory) or os.path.islink(directory) or not os.path.isdir(directory):
        return False
    names = os.listdir(directory)
    if not names:
        return True
    owner = os.path.join(directory, OWNER_NAME)
    return names == [OWNER_NAME] and not os.path.islink(owner) and os.path.isfile(owner) and os.path.getsize(owner) == 0


def _remove_empty(directory: str) -> bool:
    """Remove a directory ``_holds_nothing`` approved (rmdir: it fails if anything appeared meanwhile)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, OWNER_NAME))
        os.rmdir(directory)
    except OSError:
        return False
    return True


def _not_ours(directory: str, owner: _Owner | None, target: str) -> str | None:
    """Why a staging directory is not provably ``target``'s (None when its owner file names ``target``)."""
    if owner is None:
        return "its owner.json is missing or unreadable"
    if owner.output is None:
        return "its owner.json names no output"
    if _normalized(owner.output) != _normalized(target):
        return f"its owner.json names another output ({owner.output})"
    return None


_WARNED: set[str] = set()


def _leave_alone(directory: str, why: str) -> None:
    """One warning per directory and process: recovery runs more than once in a build."""
    if directory in _WARNED:
        return
    _WARNED.add(directory)
    journal = f"; its {JOURNAL_NAME} is not acted on" if fs.exists(fs.join(directory, JOURNAL_NAME)) else ""
    _LOG.warning("left %s alone: %s, so it is not provably this output's%s; remove it by hand", directory, why, journal)


def dead_staging_dirs(target: str, keep: str | None = None) -> list[str]:
    """Staging directories of ``target`` whose owner file names ``target`` and a run known to be dead (not ``keep``)."""
    dead = []
    for directory in _staging_dirs(target):
        if keep is not None and directory.rstrip("/") == keep.rstrip("/"):
            continue
        owner = _owner_of(directory)
        if _not_ours(directory, owner, target) is None and owner is not None and owner.is_dead():
            dead.append(directory)
    return dead


def live_staging_dirs(target: str, keep: str | None = None) -> list[str]:
    """Staging directories of other runs into ``target`` that are alive, or whose liveness cannot be told."""
    found = []
    for directory in _staging_dirs(target):
        if keep is not None and directory.rstrip("/") == keep.rstrip("/"):
            continue
        owner = _owner_of(directory)
        if _not_ours(directory, owner, target) is None and owner is not None and not owner.is_dead():
            found.append(directory)
    return found


# ---------------------------------------------------------------------------------- journal


@dataclasses.dataclass(frozen=True)
class CommitJournal:
    """The file operations of one commit, written before the first one runs; applying it again is harmless.

    Two kinds. A *replace* journal (the sink; object-store outputs before tfrbeam 0.2) deletes first
    and renames after. A *switch* journal (``switch=True``: a dataset in a bucket) renames the new
    objects into names no live object has, its last move (the manifest) is the one whole-object write
    that switches readers from the old generation to the new, and only then deletes ``deletions``
    (the old generation's objects). ``replaces`` is the run whose dataset it switches away from.
    """

    run_id: str
    target: str
    deletions: tuple[str, ...]
    moves: tuple[tuple[str, str], ...]  # (staged, final), applied in order
    switch: bool = False
    replaces: str | None = None

    def write(self, staging: str) -> None:
        """Write the journal atomically: a reader finds the whole journal or none."""
        record: dict[str, Any] = {"run_id": self.run_id, "target": self.target, "deletions": list(self.deletions),
                                  "moves": [list(pair) for pair in self.moves]}
        if self.switch:
            record.update(switch=True, replaces=self.replaces)
        write_whole(fs.join(staging, JOURNAL_NAME), json.dumps(record, indent=1).encode("utf-8"))

    @classmethod
    def read(cls, staging: str) -> CommitJournal | None:
        path = fs.join(staging, JOURNAL_NAME)
        try:
            data = read_whole(path, MAX_JOURNAL_BYTES, "commit journal")
            if data is None:
                return None
            raw = json.loads(data.decode("utf-8"))
            replaces = raw.get("replaces")
            return cls(raw["run_id"], raw["target"], tuple(raw["deletions"]), tuple((a, b) for a, b in raw["moves"]),
                       switch=raw.get("switch") is True, replaces=replaces if isinstance(replaces, str) else None)
        except (ValueError, KeyError, TypeError, AttributeError, RefusedFileError) as error:
            raise CommitError(f"{path}: an unreadable commit journal ({error}); remove {staging} by hand") from error

    def apply(self, missing_ok: bool = False) -> None:
        """Carry the commit out (a switch journal: ``_apply_switch``); a replace journal deletes, then renames.

        ``missing_ok`` (recovery): a file that goes away while this runs (an earlier attempt, still
        running somewhere, did that step) is a step already done, not an error.
        """
        if self.switch:
            self._apply_switch(missing_ok)
            return
        if missing_ok:
            delete_missing_ok(self.deletions)
        else:
            fs.delete_files(self.deletions)
        self._move(self.moves, missing_ok)

    def _move(self, moves: Sequence[tuple[str, str]], missing_ok: bool) -> None:
        # A first apply moves what this run just staged; only a recovery asks which sources are still there.
        pending = [(source, destination) for source, destination in moves if not missing_ok or fs.exists(source)]
        for directory in sorted({fs.parent(destination) for _, destination in pending}):
            fs.mkdirs(directory)
        if not missing_ok:
            fs.rename(pending)
            return

        def move(pair: tuple[str, str]) -> None:
            try:
                fs.rename([pair])
            except Exception as error:
                if not (is_gone(error) and fs.exists(pair[1])):
                    raise

        fs.in_threads(move, pending)

    def _apply_switch(self, missing_ok: bool) -> None:
        """New objects in, the manifest (the last move) as the switch, the old generation out; from any point.

        What the output's manifest names now decides: this run's (switched: only the deletions are
        left), the replaced run's (roll forward), or a third run's (it published since: this run's
        objects that it does not list are removed, and its dataset stays).
        """
        published = committed_run(self.target)
        if published == self.run_id:
            delete_missing_ok(self.deletions)
            return
        if published != self.replaces:
            listed = _listed_paths(self.target)
            delete_missing_ok([final for _, final in self.moves[:-1] if final not in listed])
            return
        self._move(self.moves[:-1], missing_ok)
        self._move(self.moves[-1:], missing_ok)  # the switch: one whole-object write of the manifest
        delete_missing_ok(self.deletions)


def _listed_paths(target: str) -> set[str]:
    """Full paths of every file the output's manifest makes part of its dataset now (none without a readable one)."""
    try:
        manifest = read_manifest(target, BEAM_FILES)
    except (ManifestError, OSError):
        return set()
    if manifest is None:
        return set()
    return {fs.join(target, *relative.split("/")) for relative in dataset_files(manifest)}


def is_gone(error: BaseException) -> bool:
    """Whether a failed delete or rename failed only because its files were already gone (Beam wraps the OSError twice)."""
    if isinstance(error, FileNotFoundError):
        return True
    details = getattr(error, "exception_details", None)
    if isinstance(details, dict) and details:
        return all(is_gone(inner) for inner in details.values())
    if isinstance(error, OSError) and error.args and isinstance(error.args[0], BaseException):
        return is_gone(error.args[0])
    return isinstance(error, OSError) and str(error).startswith("No files found to delete under")


def delete_missing_ok(paths: Sequence[str]) -> None:
    """Delete those of ``paths`` that exist; one another process deletes meanwhile is deleted, not an error."""
    def delete(path: str) -> None:
        try:
            fs.delete_files([path])
        except Exception as error:
            if not is_gone(error):
                raise

    fs.in_threads(delete, list(paths))


def delete_tree_missing_ok(directory: str) -> None:
    """``fs.delete_tree``, where files vanishing under it (removed by another process) are not an error."""
    try:
        fs.delete_tree(directory)
    except Exception as error:
        if not is_gone(error):
            raise


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
    return None if manifest is None else manifest.run_id


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
        if base.startswith(name) and head in (directory, directory + sep + INDEX_DIR_NAME):
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

    Only a staging directory whose owner file names ``target`` and a dead run is acted on; one
    whose owner file is missing, unreadable or names another output is left alone with one
    warning (an empty one, which holds nothing, is removed). A dead run's journal is rolled
    forward (its staged files were complete when it was written); a local swap interrupted
    between its two renames is completed; when the dead run's dataset is the one published,
    ``carry_over(old_dir, target)`` moves the user's files out of the replaced directory first.
    Then the staging directory goes. Live runs' directories are never touched.
    """
    removed = []
    others: set[str] = set()
    for directory in _staging_dirs(target):
        if keep is not None and directory.rstrip("/") == keep.rstrip("/"):
            continue
        if _recover_one(directory, target, new_name, old_name, carry_over, prefix_output):
            removed.append(directory)
        else:
            others.add(directory)
    OTHER_RUNS[_normalized(target)] = others
    return removed


def _recover_one(directory: str, target: str, new_name: str, old_name: str,
                 carry_over: Callable[[str, str], None] | None, prefix_output: bool) -> bool:
    """Recover one staging directory if it is provably a dead run's of ``target``; whether it was removed."""
    problem = _untrusted_staging(directory, new_name, old_name)
    if problem is not None:
        _leave_alone(directory, problem)
        return False
    owner = _owner_of(directory)
    why = _not_ours(directory, owner, target)
    if why is not None and _holds_nothing(directory) and _remove_empty(directory):
        return True  # nothing in it to lose, whoever made it
    if why is not None or owner is None:
        _leave_alone(directory, why or "its owner.json is unreadable")
        return False
    if not owner.is_dead():
        RESERVED_WRITES.setdefault(_normalized(target), set()).update(owner.writes)
        return False
    untrusted = _untrusted_write(owner, target, directory)
    if untrusted is not None:
        _leave_alone(directory, f"its {OWNER_NAME} names {untrusted!r}, not a shard or read index a build writes in "
                                f"{target}")
        return False
    journal = CommitJournal.read(directory)
    if journal is not None:
        why = untrusted_journal(journal, target, directory, prefix_output)
        if why is None and journal.run_id != owner.run.run_id:
            why = f"it is run {journal.run_id}'s, but owner.json names run {owner.run.run_id}"
        if why is not None:
            _leave_alone(directory, f"its {JOURNAL_NAME} cannot be trusted ({why})")
            return False
        _LOG.warning("completing the interrupted commit of run %s into %s", journal.run_id, target)
        journal.apply(missing_ok=True)
    if owner.writes:
        remove_unpublished(target, owner.writes)
        RECOVERED_WRITES.add(_normalized(target))
    new_dir, old_dir = fs.join(directory, new_name), fs.join(directory, old_name)
    if not fs.is_remote(target):
        if not os.path.lexists(target) and os.path.isdir(old_dir) and os.path.isdir(new_dir):
            _LOG.warning("completing the interrupted swap of %s into %s", new_dir, target)
            fs.rename_local(new_dir, target)
        if carry_over is not None and committed_run(target) == owner.run.run_id:
            for replaced in (old_dir, new_dir):
                if os.path.isdir(replaced):
                    carry_over(replaced, target)
    delete_staging(directory)
    return True


def output_key(target: str) -> str:
    """How ``RECOVERED_WRITES``, ``OTHER_RUNS`` and ``RESERVED_WRITES`` name an output: its normalised path."""
    return _normalized(target)


def entries_besides_runs_objects(target: str, listing: Mapping[str, int] | None = None) -> list[str]:
    """The names directly inside an output, leaving out what holds only objects that a run's owner record (beside
    the output, naming it) says the run writes straight there: an interrupted run's, which recovery removes.
    ``listing``: the output's objects as ``fs.list_objects`` gives them, when the caller has just listed it."""
    if not object_store.is_object_store(target):
        return fs.list_names(target)
    prefix = target.rstrip("/") + "/"
    objects = [path for path in (fs.list_objects(target) if listing is None else listing) if path.startswith(prefix)]
    written: set[str] = set()
    for directory in _staging_dirs(target) if objects else ():
        owner = _owner_of(directory)
        if owner is not None and _not_ours(directory, owner, target) is None and _untrusted_write(
                owner, target, directory) is None:
            written.update(owner.writes)
    return sorted({path[len(prefix):].split("/")[0] for path in objects if path not in written})


def _untrusted_write(owner: _Owner, target: str, directory: str) -> str | None:
    """The first object a run's record says it writes straight into ``target`` that no build writes there: outside
    it, in the run's own directory, or not a shard or read-index name (``is_built_shard_path``); None if none is."""
    prefix = target.rstrip("/") + "/"
    for path in owner.writes:
        if (not confined(path, target, directory) or confined(path, directory, directory) or not path.startswith(prefix)
                or not is_built_shard_path(path[len(prefix):])):
            return path
    return None


RECOVERED_WRITES: set[str] = set()  # outputs where this process removed a dead run's objects written straight there
# Per output, as this process's last recovery found them: the staging directories of other runs it left (alive,
# on another host, or not provably this output's), and the objects live runs' owner records say they write there.
OTHER_RUNS: dict[str, set[str]] = {}
RESERVED_WRITES: dict[str, set[str]] = {}


def remove_unpublished(target: str, writes: Sequence[str]) -> None:
    """Delete those of a run's objects written straight into ``target`` that its manifest does not list now."""
    listed = _listed_paths(target)
    delete_missing_ok([path for path in writes if path not in listed])


def describe_paths(paths: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
