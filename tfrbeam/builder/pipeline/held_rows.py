"""A sequence build's bucketed rows held in this process, so only a small reference crosses the GroupByKey.

On runners whose every worker runs in this process (the in-process FnApiRunner, the DirectRunner
in_memory / multi_threading: the runs whose piece store is ``memory``), the converter puts each
Arrow batch of a bucket's rows here and emits a ``HeldRows`` reference instead of the batch. The
runner's GroupByKey still groups the references by bucket (so the graph is the one Dataflow
runs), but it no longer serializes every batch through its data plane, holds a second and a
third copy of them in its grouping buffers, and decodes them again for the encoder.

Memory: a run keeps at most its budget (``--memory_store_bytes``, as for the memory store's
pieces) of batches in memory. The batch that would take it past the budget sends every batch held
then (and itself) to one run file under the run's staging directory (``held-rows/``): per bucket
one segment, an Arrow IPC stream of its batches with its own CRC32C. Encoding a bucket
reads its segment of each run once. So the files grow with the bytes spilled (one per budget's
worth), not with source batches times buckets: one file per (batch, bucket) made a 12M-row build
write, read and delete tens of thousands of small files, its slowest part (issue 45).

Lifetime: a run's batches live under its staging directory's name. The encoder takes a bucket's
batches and releases them once the bucket is encoded; a run file is deleted when the last of its
batches is released (as every run file holds rows of nearly every bucket, that is about when the
last bucket is encoded: the disk holds what was spilled until then). The run's entry goes with its
last batch. After a failed run ``discard_held_rows`` (called by the commit's cleanup, with the
held pieces) frees whatever is left, so nothing outlives a build (``runs_holding_rows()`` is empty
after it); spilled files go with the staging directory.
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
from tfrbeam.errors import HeldDataMissingError, ShuffledDataError
from tfrbeam.layout.names import HELD_ROWS_DIR

__all__ = [
    "HeldRows", "HeldRowsCoder", "discard_held_rows", "held_batches", "held_bytes", "hold_rows",
    "release_rows", "runs_holding_rows",
]

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HeldRows:
    """What crosses the GroupByKey for one held batch: the run it belongs to, its number there and its row count."""

    run_key: str
    number: int
    rows: int


@dataclasses.dataclass(frozen=True)
class _Segment:
    """One bucket's batches of a run, an Arrow IPC stream at ``offset`` in the run's file, and its CRC32C."""

    path: str
    offset: int
    length: int
    crc: int


@dataclasses.dataclass(frozen=True)
class _Spilled:
    """A batch written to a run file: the ``index``-th batch of its segment."""

    segment: _Segment
    index: int


@dataclasses.dataclass
class _Run:
    """One run's held batches: in memory (a RecordBatch) or spilled (where), by number; and its files' live batches."""

    batches: dict[int, pa.RecordBatch | _Spilled] = dataclasses.field(default_factory=dict)
    buckets: dict[int, int] = dataclasses.field(default_factory=dict)  # number -> bucket, while in memory
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)  # number -> bytes counted, while in memory
    in_memory: int = 0  # bytes of the batches held in memory (those being written to a run file too)
    spilling: set[int] = dataclasses.field(default_factory=set)  # numbers being written to a run file now
    live: dict[str, int] = dataclasses.field(default_factory=dict)  # run file -> its batches not released yet


# The held batches of every run in this process, by staging directory.
_RUNS: dict[str, _Run] = {}
_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def hold_rows(run_key: str, batch: pa.RecordBatch, budget: int | None = None, bucket: int = 0,
              size: int | None = None) -> HeldRows:
    """Keep ``batch`` (rows of ``bucket``) for the run staging in ``run_key``; the reference to send instead.

    With a ``budget``, the batch that takes the run's batches in memory past it sends them all,
    itself too, to one run file under ``run_key`` (``HELD_ROWS_DIR``), a segment per bucket.
    ``size``: the bytes the batch stands for, when the caller knows them for less than its
    ``nbytes`` costs (a slice's share of its source batch: ``nbytes`` of a slice takes ~60 us).
    """
    size = batch.nbytes if size is None else size
    with _LOCK:
        number = next(_NUMBERS)
        run = _RUNS.setdefault(run_key, _Run())
        run.batches[number] = batch
        run.buckets[number] = bucket
        run.sizes[number] = size
        run.in_memory += size
        if budget is None or run.in_memory <= budget:
            return HeldRows(run_key, number, batch.num_rows)
        taken = {held: run.batches[held] for held in run.buckets if held not in run.spilling}
        run.spilling.update(taken)
        members = [(run.buckets[held], held, taken[held]) for held in taken]
        path = fs.join(run_key, HELD_ROWS_DIR, f"{next(_NUMBERS)}.arrows")
    try:
        placed = _write_run(path, members)
    finally:
        with _LOCK:
            run.spilling.difference_update(taken)
    with _LOCK:
        if _RUNS.get(run_key) is run:  # else discarded meanwhile (a failed run): its file goes with the staging dir
            _placed(run, path, placed)
    return HeldRows(run_key, number, batch.num_rows)


def _placed(run: _Run, path: str, placed: dict[int, _Spilled]) -> None:
    """Record where the batches of a run file went, and free them from memory (under _LOCK)."""
    for number, spilled in placed.items():
        batch = run.batches.get(number)
        if isinstance(batch, pa.RecordBatch):
            run.batches[number] = spilled
            run.in_memory -= run.sizes.pop(number)
            del run.buckets[number]
            run.live[path] = run.live.get(path, 0) + 1


def held_batches(refs: Iterable[HeldRows]) -> list[pa.RecordBatch]:
    """The batches ``refs`` point to (still held until ``release_rows``), or HeldDataMissingError naming the run.

    A spilled batch's segment is read once for all the refs in it.
    """
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
    segments: dict[_Segment, list[pa.RecordBatch]] = {}
    for batch in found:
        if isinstance(batch, _Spilled) and batch.segment not in segments:
            segments[batch.segment] = _read_segment(batch.segment)
    return [segments[batch.segment][batch.index] if isinstance(batch, _Spilled) else batch for batch in found]


def release_rows(refs: Iterable[HeldRows]) -> None:
    """Free the batches of ``refs`` (their bucket is encoded): a run file goes with its last batch, a run's entry too."""
    emptied = []
    with _LOCK:
        for ref in refs:
            run = _RUNS.get(ref.run_key)
            if run is None:
                continue
            batch = run.batches.pop(ref.number, None)
            if isinstance(batch, _Spilled):
                path = batch.segment.path
                run.live[path] -= 1
                if not run.live[path]:
                    del run.live[path]
                    emptied.append(path)
            elif batch is not None:
                run.in_memory -= run.sizes.pop(ref.number)
                del run.buckets[ref.number]
            if not run.batches:
                del _RUNS[ref.run_key]
    if emptied:
        _delete_spilled(emptied)


def _delete_spilled(paths: list[str]) -> None:
    """Delete released run files: local ones one unlink each (Beam's delete matched a glob and read metadata per
    file), others through Beam."""
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


def _write_run(path: str, members: list[tuple[int, int, pa.RecordBatch]]) -> dict[int, _Spilled]:
    """(bucket, number, batch) members to one file at ``path``, where each went: per bucket (and schema) one segment,
    an Arrow IPC stream of its batches as they are (joining them first cost more than the rest of the write)."""
    by_bucket: dict[int, list[tuple[int, pa.RecordBatch]]] = {}
    for bucket, number, batch in members:
        by_bucket.setdefault(bucket, []).append((number, batch))
    placed: dict[int, _Spilled] = {}
    offset = 0
    with fs.create(path) as handle:
        for _, batches in sorted(by_bucket.items()):
            for schema, parts in _by_schema(batches):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, schema) as writer:
                    for _, batch in parts:
                        writer.write_batch(batch)
                data = sink.getvalue()
                handle.write(memoryview(data))
                segment = _Segment(path, offset, data.size, crc32c.crc32c(data))
                offset += data.size
                placed.update((number, _Spilled(segment, index)) for index, (number, _) in enumerate(parts))
    return placed


def _by_schema(batches: list[tuple[int, pa.RecordBatch]]) -> list[tuple[pa.Schema, list[tuple[int, pa.RecordBatch]]]]:
    """The batches by schema (one in a build: its batches have the plan's features), in order of first appearance."""
    groups: list[tuple[pa.Schema, list[tuple[int, pa.RecordBatch]]]] = []
    for number, batch in batches:
        group = next((parts for schema, parts in groups if schema.equals(batch.schema)), None)
        if group is None:
            groups.append((batch.schema, group := []))
        group.append((number, batch))
    return groups


def _read_segment(segment: _Segment) -> list[pa.RecordBatch]:
    """A bucket's batches of a run read back, if their bytes are the ones written (Arrow IPC has no checksum: a changed
    value decodes)."""
    where = f"{segment.path} (bytes {segment.offset:,} to {segment.offset + segment.length:,})"
    try:
        with fs.open_read(segment.path) as handle:
            handle.seek(segment.offset)
            data = handle.read(segment.length)
    except OSError as error:
        raise HeldDataMissingError(
            f"{where}: held rows spilled there cannot be read back ({error}); was the run's staging directory "
            "removed or changed while the build ran?") from error
    if len(data) != segment.length or crc32c.crc32c(data) != segment.crc:
        raise ShuffledDataError(
            f"{segment.path}: held rows spilled there fail their CRC32C ({len(data):,} of {segment.length:,} bytes read "
            f"back at offset {segment.offset:,}): the file was changed or damaged on disk while the run used it. Nothing "
            "is published; run the build again, and if it recurs, check the disk under the staging directory")
    try:
        return list(pa.ipc.open_stream(data))
    except pa.ArrowInvalid as error:  # bytes as written that Arrow cannot read: a bug of ours, said as such
        raise HeldDataMissingError(f"{where}: held rows spilled there cannot be decoded ({error})") from error


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
