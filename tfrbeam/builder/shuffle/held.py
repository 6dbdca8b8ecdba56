"""What a run holds in this process's memory, up to a byte budget, the rest spilled to run files: the one home of the
memory store's pieces (``stores.MemoryStore``) and a sequence build's held rows (``tfrbeam.builder.pipeline.held_rows``).

Only for runs whose every worker runs in this process (the in-process local runners: piece store ``memory``).

- Registry: a run's holding of each kind (``HeldRuns``: pieces, rows) lives under its staging directory's name, in one
  process-wide table with one lock, from the first thing it holds until it lets go of the last (``HeldRuns.end``).
  After a failure the commit's cleanup frees every kind of the run at once (``discard_held``), so nothing outlives a
  build: ``runs_holding()`` is empty after it. A holding that is not there is one ``HeldDataMissingError``.
- Budget: a ``Holding`` counts the bytes it keeps in memory against ``--memory_store_bytes`` (``reserve``; each kind
  gets the budget), and gives them back as each item is used (``free``).
- Spill: past the budget, ``Holding.spill`` writes every item held then (and not being written by another thread) to
  one run file, and frees them: files grow with the bytes spilled (one per budget's worth), not with items (one file
  per (batch, bucket) made a 12M-row build write tens of thousands of small files: issue 45).
- Files: ``spill_path``, ``write_spill_file``, ``read_spilled`` and ``delete_spilled`` are every spill file's
  operations (tests count and damage them there). What a run file holds stays its store's: framed records the shard
  writers copy as they are (pieces), Arrow IPC streams with a CRC32C per bucket (rows).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from tfrbeam.beam import filesystem as fs
from tfrbeam.errors import HeldDataMissingError, ShuffledDataError

__all__ = [
    "HeldRuns", "Holding", "damaged_spill", "delete_spilled", "discard_held", "missing", "read_spilled", "runs_holding",
    "spill_path", "write_spill_file",
]

_LOG = logging.getLogger(__name__)
_K = TypeVar("_K", bound=Hashable)
_M = TypeVar("_M")
_R = TypeVar("_R")


class Holding(Generic[_K]):
    """One run's items of one kind held in memory: their bytes against the budget, and which are being spilled now.

    Its ``lock`` guards it and whatever its store keeps beside it. A store subclasses it to keep its items.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_memory = 0  # bytes of the items held in memory (those being written to a run file too)
        self.sizes: dict[_K, int] = {}  # per item held in memory, in the order held: its bytes
        self.spilling: set[_K] = set()  # items being written to a run file now
        self.ended = False  # gone from the registry: a store that finds it so takes the run's new holding

    def reserve(self, size: int, budget: int | None, always: bool = False) -> bool:
        """Whether ``size`` more bytes fit the ``budget`` (None: no bound); counted if so, or ``always`` (under ``lock``)."""
        fits = budget is None or self.in_memory + size <= budget
        if fits or always:
            self.in_memory += size
        return fits

    def keep(self, name: _K, size: int) -> None:
        """Item ``name`` holds the ``size`` bytes ``reserve`` counted (under ``lock``)."""
        self.sizes[name] = size

    def free(self, name: _K) -> None:
        """Item ``name`` no longer holds memory: its bytes go back to the budget (under ``lock``)."""
        self.in_memory -= self.sizes.pop(name, 0)

    def spill(self, gather: Callable[[list[_K]], _M], write: Callable[[_M], _R],
              placed: Callable[[list[_K], _R], None]) -> bool:
        """Write every item held now, and not being written by another thread, as one run; False if there was none.

        ``gather`` takes the items' contents (under ``lock``), ``write`` writes them to one run file (outside it) and
        ``placed`` records where they went and frees them (under ``lock``). They stop being marked as spilling only
        once placed: another thread would take them again and write them twice.
        """
        with self.lock:
            names = [name for name in self.sizes if name not in self.spilling]
            if not names:
                return False
            self.spilling.update(names)
            members = gather(names)
        try:
            result = write(members)
        except BaseException:
            with self.lock:
                self.spilling.difference_update(names)
            raise
        with self.lock:
            placed(names, result)
            self.spilling.difference_update(names)
        return True

    def discarded(self) -> None:
        """The run let go of its holding (its end, or a failure): free what is left (under ``lock``)."""
        self.sizes.clear()
        self.in_memory = 0


_H = TypeVar("_H", bound="Holding[Any]")

# Every run's holding of every kind in this process, by (kind, staging directory).
_HELD: dict[tuple[str, str], Holding[Any]] = {}
_LOCK = threading.Lock()


class HeldRuns(Generic[_H]):
    """The holdings of one kind (``kind``: pieces, rows) of every run in this process, made by ``make``."""

    def __init__(self, kind: str, make: Callable[[], _H]):
        self.kind, self.make = kind, make

    def get(self, run_key: str) -> _H | None:
        """The run's holding, or None (it holds nothing in this process)."""
        with _LOCK:
            return _HELD.get((self.kind, run_key))  # type: ignore[return-value]  # this kind's entries are made by make

    def open(self, run_key: str) -> _H:
        """The run's holding, made if it has none yet."""
        with _LOCK:
            held = _HELD.get((self.kind, run_key))
            if held is None:
                held = _HELD[self.kind, run_key] = self.make()
            return held  # type: ignore[return-value]  # this kind's entries are made by make

    def require(self, run_key: str, what: str, why: str = "the run ended") -> _H:
        """The run's holding, or HeldDataMissingError saying ``what`` is missing (``why``, or another process)."""
        held = self.get(run_key)
        if held is None:
            raise missing(run_key, what, why)
        return held

    def end(self, run_key: str, holding: Holding[Any] | None = None, if_empty: Callable[[], bool] | None = None) -> None:
        """The run lets go of its holding (``holding`` only, and only ``if_empty`` says so): its ``discarded`` frees it."""
        with _LOCK:
            held = _HELD.get((self.kind, run_key))
            if held is None or (holding is not None and held is not holding):
                return
            with held.lock:
                if if_empty is not None and not if_empty():
                    return
                del _HELD[self.kind, run_key]
                held.ended = True
                held.discarded()

    def runs(self) -> list[str]:
        """The runs that hold something of this kind in this process now."""
        with _LOCK:
            return sorted(run for kind, run in _HELD if kind == self.kind)


def missing(run_key: str, what: str, why: str) -> HeldDataMissingError:
    """``what``, held for the run staging in ``run_key``, is not in this process: one message for every kind."""
    return HeldDataMissingError(
        f"{what} of the run staging in {run_key} is not held in this process: {why}, or a worker in another process "
        "held it (use --piece_store spill or inline with such runners)")


def discard_held(run_key: str) -> None:
    """Free everything the run staging in ``run_key`` holds in this process, of every kind (its end, or a failure).

    Spilled files stay for the staging directory's own cleanup.
    """
    with _LOCK:
        kinds = [kind for kind, run in _HELD if run == run_key]
    for kind in kinds:
        HeldRuns(kind, Holding).end(run_key)


def runs_holding() -> list[str]:
    """The runs that hold anything in this process now (none once every build has ended)."""
    with _LOCK:
        return sorted({run for _, run in _HELD})


def spill_path(directory: str, suffix: str) -> str:
    """A new spill file's path under ``directory``: a name no other thread or process of the run picks."""
    return fs.join(directory, f"{uuid.uuid4().hex}{suffix}")


def write_spill_file(path: str, blocks: Iterable, overlap: bool = False) -> None:
    """Write ``blocks`` (buffers) to the new file ``path``. With ``overlap`` one thread writes each block while the next
    is made (``blocks`` may be a generator that frames them; the write releases the GIL): at most two are held. The
    thread starts only for a second block: a file of one (every batch of a budget of 0) would pay ~1 ms for it."""
    with fs.create(path) as handle:
        pending = iter(blocks)
        first = next(pending, None)
        second = next(pending, None) if overlap and first is not None else None
        if second is None:
            for block in (pending if first is None else itertools.chain([first], pending)):
                handle.write(block)
            return
        assert first is not None  # a second block comes after a first
        with concurrent.futures.ThreadPoolExecutor(1, "tfrbeam-spill-run") as writer:
            written = writer.submit(handle.write, first)
            for block in itertools.chain([second], pending):
                written.result()
                written = writer.submit(handle.write, block)
            written.result()


def read_spilled(path: str, offset: int, size: int, what: str) -> bytes:
    """``size`` bytes of the spill file ``path`` from ``offset``, holding ``what``: all of them, or one error naming it."""
    try:
        with fs.open_read(path) as handle:
            handle.seek(offset)
            data = handle.read(size)
    except OSError as error:
        raise HeldDataMissingError(
            f"{path} (bytes {offset:,} to {offset + size:,}): {what} spilled there cannot be read back ({error}); was "
            "the run's staging directory removed or changed while the build ran?") from error
    if len(data) != size:
        raise damaged_spill(path, f"{what} spilled there end {size - len(data):,} bytes early ({len(data):,} of "
                                  f"{size:,} bytes read back from byte {offset:,})")
    return data


def damaged_spill(path: str, detail: str) -> ShuffledDataError:
    """The error for a spill file whose bytes are not the ones written, ``detail`` saying which and how."""
    return ShuffledDataError(
        f"{path}: {detail}: the spill file was changed or damaged on disk while the run used it. Nothing is published; "
        "run the build again, and if it recurs, check the disk under the staging directory")


def delete_spilled(paths: list[str], what: str) -> None:
    """Delete released spill files, warning (never failing) when one cannot be: the staging directory's removal at the
    run's end takes them anyway. Local ones one unlink each (Beam's delete matched a glob and read metadata per file)."""
    if not paths:
        return
    if not fs.is_remote(paths[0]):
        gone = []
        for path in paths:
            try:
                fs.unlink_local(path)
            except FileNotFoundError:
                gone.append(path)
            except OSError as error:
                _LOG.warning("could not delete spilled %s (%s); they go with the run's staging directory", what, error)
                return
        if gone:  # not ours to lose: say so, the read of it would have failed
            _LOG.warning("could not delete spilled %s (%s is already gone); nothing else to release", what, gone[0])
        return
    gone = [path for path in paths if not fs.exists(path)]
    if gone:
        _LOG.warning("could not delete spilled %s (%s is already gone); nothing else to release", what, gone[0])
    try:
        fs.delete_files(paths)
    except OSError as error:  # BeamIOError too
        _LOG.warning("could not delete spilled %s (%s); they go with the run's staging directory", what, error)
