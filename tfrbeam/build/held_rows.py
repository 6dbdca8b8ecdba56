"""A sequence build's bucketed rows held in this process, so only a small reference crosses the GroupByKey.

On runners whose every worker runs in this process (the in-process FnApiRunner, the DirectRunner
in_memory / multi_threading: the runs whose piece store is ``memory``), the converter puts each
Arrow batch of a bucket's rows here and emits a ``HeldRows`` reference instead of the batch. The
runner's GroupByKey still groups the references by bucket (so the graph is the one Dataflow
runs), but it no longer serializes every batch through its data plane, holds a second and a
third copy of them in its grouping buffers, and decodes them again for the encoder.

Memory: a run keeps at most its budget (``--memory_store_bytes``, as for the memory store's
pieces) of batches in memory; a batch past it is written as an Arrow IPC stream under the run's
staging directory (``held-rows/``) and read back when its bucket is encoded, so a sequence build
of any size holds a bounded share of its input here.

Lifetime: a run's batches live under its staging directory's name. The encoder takes a bucket's
batches and releases them once the bucket is encoded (a spilled batch's file is deleted then);
the run's entry goes with its last batch. After a failed run ``discard_held_rows`` (called by the
commit's cleanup, with the held pieces) frees whatever is left, so nothing outlives a build
(``runs_holding_rows()`` is empty after it); spilled files go with the staging directory.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import struct
import threading
from collections.abc import Iterable

import crc32c
import pyarrow as pa
from apache_beam import coders

from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.arrow_coder import RecordBatchCoder
from tfrbeam.errors import HeldDataMissingError, ShuffledDataError

__all__ = [
    "HELD_ROWS_DIR", "HeldRows", "HeldRowsCoder", "discard_held_rows", "held_batches", "held_bytes", "hold_rows",
    "release_rows", "runs_holding_rows",
]

_LOG = logging.getLogger(__name__)
HELD_ROWS_DIR = "held-rows"  # under the run's staging directory: the batches past the run's budget
_BATCH_CODER = RecordBatchCoder()


@dataclasses.dataclass(frozen=True)
class HeldRows:
    """What crosses the GroupByKey for one held batch: the run it belongs to, its number there and its row count."""

    run_key: str
    number: int
    rows: int


@dataclasses.dataclass(frozen=True)
class _Spilled:
    """A batch written to a file, with the CRC32C of its bytes: read back, they must be the ones written."""

    path: str
    crc: int


@dataclasses.dataclass
class _Run:
    """One run's held batches: in memory (a RecordBatch) or spilled (its file), by number."""

    batches: dict[int, pa.RecordBatch | _Spilled] = dataclasses.field(default_factory=dict)
    in_memory: int = 0  # bytes of the batches held in memory


# The held batches of every run in this process, by staging directory.
_RUNS: dict[str, _Run] = {}
_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def hold_rows(run_key: str, batch: pa.RecordBatch, budget: int | None = None) -> HeldRows:
    """Keep ``batch`` for the run staging in ``run_key``; the reference to send instead.

    With a ``budget``, a batch that would take the run's batches in memory past it is spilled to
    a file under ``run_key`` instead (``HELD_ROWS_DIR``).
    """
    size = batch.get_total_buffer_size()
    with _LOCK:
        number = next(_NUMBERS)
        held = _RUNS[run_key].in_memory if run_key in _RUNS else 0
        fits = budget is None or held + size <= budget
        if fits:
            run = _RUNS.setdefault(run_key, _Run())
            run.in_memory += size
            run.batches[number] = batch
    if not fits:
        spilled = _write_batch(fs.join(run_key, HELD_ROWS_DIR, f"{number}.arrows"), batch)
        with _LOCK:
            _RUNS.setdefault(run_key, _Run()).batches[number] = spilled
    return HeldRows(run_key, number, batch.num_rows)


def held_batches(refs: Iterable[HeldRows]) -> list[pa.RecordBatch]:
    """The batches ``refs`` point to (still held until ``release_rows``), or HeldDataMissingError naming the run."""
    found: list[pa.RecordBatch | _Spilled] = []
    with _LOCK:
        for ref in refs:
            run = _RUNS.get(ref.run_key)
            batch = run.batches.get(ref.number) if run is not None else None
            if batch is None:
                raise HeldDataMissingError(
                    f"rows held for the run staging in {ref.run_key} (batch {ref.number}) are not in this process: the "
                    "run ended or failed, the bucket was already encoded (a retried bundle), or a worker in another "
                    "process held them (use --piece_store spill or inline with such runners)")
            found.append(batch)
    return [_read_batch(batch) if isinstance(batch, _Spilled) else batch for batch in found]


def release_rows(refs: Iterable[HeldRows]) -> None:
    """Free the batches of ``refs`` (their bucket is encoded); a run's entry goes with its last batch."""
    spilled = []
    with _LOCK:
        for ref in refs:
            run = _RUNS.get(ref.run_key)
            if run is None:
                continue
            batch = run.batches.pop(ref.number, None)
            if isinstance(batch, _Spilled):
                spilled.append(batch.path)
            elif batch is not None:
                run.in_memory -= batch.get_total_buffer_size()
            if not run.batches:
                del _RUNS[ref.run_key]
    if spilled:
        _delete_spilled(spilled)


def _delete_spilled(paths: list[str]) -> None:
    """Delete released spill files: local ones one unlink each (Beam's delete matched a glob and read metadata per
    file, a few ms each, and a 12M-row sequence build released tens of thousands), others through Beam."""
    if not fs.is_remote(paths[0]):
        gone = []
        for path in paths:
            try:
                fs.unlink_local(path)
            except FileNotFoundError:
                gone.append(path)
            except OSError as error:  # the staging directory's removal at the run's end takes them anyway
                _LOG.warning("could not delete spilled held rows (%s); they go with the run's staging directory", error)
                return
        if gone:  # not ours to lose: say so, the read of it would have failed
            _LOG.warning("could not delete spilled held rows (%s is already gone); nothing else to release", gone[0])
        return
    gone = [path for path in paths if not fs.exists(path)]
    if gone:
        _LOG.warning("could not delete spilled held rows (%s is already gone); nothing else to release", gone[0])
    try:
        fs.delete_files(paths)
    except OSError as error:  # BeamIOError too; the staging directory's removal at the run's end takes them anyway
        _LOG.warning("could not delete spilled held rows (%s); they go with the run's staging directory", error)


def discard_held_rows(run_key: str) -> None:
    """Free every batch the run staging in ``run_key`` holds in this process (after a failure; a no-op otherwise).

    Spilled batches' files stay for the staging directory's own cleanup.
    """
    with _LOCK:
        _RUNS.pop(run_key, None)


def held_bytes(run_key: str) -> tuple[int, int]:
    """(batches, bytes) the run staging in ``run_key`` holds in memory now: bounded by its budget."""
    with _LOCK:
        run = _RUNS.get(run_key)
        if run is None:
            return 0, 0
        return sum(not isinstance(batch, _Spilled) for batch in run.batches.values()), run.in_memory


def _write_batch(path: str, batch: pa.RecordBatch) -> _Spilled:
    """The batch as the runner would carry it (``RecordBatchCoder``'s Arrow IPC stream), in its own file."""
    data = _BATCH_CODER.encode(batch)
    with fs.create(path) as handle:
        handle.write(data)
    return _Spilled(path, crc32c.crc32c(data))


def _read_batch(spilled: _Spilled) -> pa.RecordBatch:
    """The batch read back, if its bytes are the ones written (Arrow IPC has no checksum: a changed value decodes)."""
    try:
        data = fs.read_bytes(spilled.path)
    except OSError as error:
        raise HeldDataMissingError(
            f"{spilled.path}: held rows spilled there cannot be read back ({error}); was the run's staging directory "
            "removed or changed while the build ran?") from error
    if crc32c.crc32c(data) != spilled.crc:
        raise ShuffledDataError(
            f"{spilled.path}: held rows spilled there fail their CRC32C ({len(data)} bytes read back): the file was "
            "changed or damaged on disk while the run used it. Nothing is published; run the build again, and if it "
            "recurs, check the disk under the staging directory")
    try:
        return _BATCH_CODER.decode(data)
    except pa.ArrowInvalid as error:  # bytes as written that Arrow cannot read: a bug of ours, said as such
        raise HeldDataMissingError(f"{spilled.path}: held rows spilled there cannot be decoded ({error})") from error


def runs_holding_rows() -> list[str]:
    """The runs that hold rows in this process now (none once every build has ended)."""
    with _LOCK:
        return sorted(_RUNS)


_HEADER = struct.Struct("<QQ")


class HeldRowsCoder(coders.Coder):
    """A HeldRows as its number, row count and run key: a few dozen bytes, whatever the batch's size."""

    def encode(self, ref: HeldRows) -> bytes:
        return _HEADER.pack(ref.number, ref.rows) + ref.run_key.encode("utf-8")

    def decode(self, encoded: bytes) -> HeldRows:
        number, rows = _HEADER.unpack_from(encoded)
        return HeldRows(encoded[_HEADER.size:].decode("utf-8"), number, rows)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return HeldRows


coders.registry.register_coder(HeldRows, HeldRowsCoder)
