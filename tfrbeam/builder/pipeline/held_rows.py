"""A sequence build's bucketed rows held in this process, so only a small reference crosses the GroupByKey.

On runners whose every worker runs in this process (the in-process FnApiRunner, the DirectRunner
in_memory / multi_threading: the runs whose piece store is ``memory``), the converter puts each
Arrow batch of a bucket's rows here and emits a ``HeldRows`` reference instead of the batch. The
runner's GroupByKey still groups the references by bucket (so the graph is the one Dataflow
runs), but it no longer serializes every batch through its data plane, holds a second and a
third copy of them in its grouping buffers, and decodes them again for the encoder.

Memory and lifetime are the spilling store's (``tfrbeam.builder.shuffle.held``), as for the memory store's
pieces: a run keeps at most its budget (``--memory_store_bytes``) of batches in memory. The batch that would take it
past the budget sends every batch held then (and itself) to one run file under the run's staging directory
(``held-rows/``): per bucket one segment, an Arrow IPC stream of its batches with its CRC32C (masked, as TFRecord's).
Encoding a bucket reads its segment of each run once, so the files grow with the bytes spilled (one per budget's
worth), not with source batches times buckets (issue 45).

The encoder takes a bucket's batches and releases them once the bucket is encoded; a run file is deleted when the last
of its batches is released (as every run file holds rows of nearly every bucket, that is about when the last bucket
is encoded). The run's entry goes with its last batch; after a failed run the commit's cleanup
(``held.discard_held``, with the held pieces) frees whatever is left.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Iterable, Iterator

import pyarrow as pa
from apache_beam import coders

from tfrbeam.beam import filesystem as fs
from tfrbeam.builder.shuffle import held
from tfrbeam.errors import HeldDataMissingError
from tfrbeam.layout.names import HELD_ROWS_DIR
from tfrbeam.tfrecord.records import masked_crc32c

__all__ = [
    "HeldRows", "HeldRowsCoder", "discard_held_rows", "held_batches", "held_bytes", "hold_rows",
    "release_rows", "runs_holding_rows",
]

_WHAT = "held rows"


@dataclasses.dataclass(frozen=True)
class HeldRows:
    """What crosses the GroupByKey for one held batch: the run it belongs to, its number there and its row count."""

    run_key: str
    number: int
    rows: int


@dataclasses.dataclass(frozen=True)
class _Segment:
    """One bucket's batches of a run, an Arrow IPC stream at ``offset`` in the run's file, and its masked CRC32C."""

    path: str
    offset: int
    length: int
    crc: int


@dataclasses.dataclass(frozen=True)
class _Spilled:
    """A batch written to a run file: the ``index``-th batch of its segment."""

    segment: _Segment
    index: int


class _Run(held.Holding[int]):
    """One run's held batches: in memory (a RecordBatch) or spilled (where), by number; and its files' live batches."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: dict[int, pa.RecordBatch | _Spilled] = {}
        self.buckets: dict[int, int] = {}  # number -> bucket, while in memory
        self.live: dict[str, int] = {}  # run file -> its batches not released yet

    def is_empty(self) -> bool:
        return not self.batches

    def discarded(self) -> None:
        super().discarded()
        self.batches.clear()
        self.buckets.clear()


# The held batches of every run in this process, by staging directory.
_RUNS = held.HeldRuns("rows", _Run)
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
    number = next(_NUMBERS)
    while True:
        run = _RUNS.open(run_key)
        with run.lock:
            if run.ended:  # its last batch was just released: the run's next holding takes this one
                continue
            run.batches[number] = batch
            run.buckets[number] = bucket
            fits = run.reserve(size, budget, always=True)
            run.keep(number, size)
            break
    if not fits:
        path = held.spill_path(fs.join(run_key, HELD_ROWS_DIR), ".arrows")
        run.spill(lambda numbers: [(run.buckets[number], number, run.batches[number]) for number in numbers],
                  lambda members: _write_run(path, members), lambda _, placed: _placed(run, path, placed))
    return HeldRows(run_key, number, batch.num_rows)


def _placed(run: _Run, path: str, placed: dict[int, _Spilled]) -> None:
    """Record where the batches of a run file went, and free them from memory (under the run's lock)."""
    for number, spilled in placed.items():
        batch = run.batches.get(number)
        if isinstance(batch, pa.RecordBatch):
            run.batches[number] = spilled
            run.free(number)
            del run.buckets[number]
            run.live[path] = run.live.get(path, 0) + 1


def held_batches(refs: Iterable[HeldRows]) -> list[pa.RecordBatch]:
    """The batches ``refs`` point to (still held until ``release_rows``), or HeldDataMissingError naming the run.

    A spilled batch's segment is read once for all the refs in it.
    """
    found: list[pa.RecordBatch | _Spilled] = []
    for ref in refs:
        run = _RUNS.get(ref.run_key)
        batch = None
        if run is not None:
            with run.lock:
                batch = run.batches.get(ref.number)
        if batch is None:
            raise held.missing(ref.run_key, f"batch {ref.number} of rows", "the run ended or failed, the bucket was "
                               "already encoded (a retried bundle)")
        found.append(batch)
    segments: dict[_Segment, list[pa.RecordBatch]] = {}
    for batch in found:
        if isinstance(batch, _Spilled) and batch.segment not in segments:
            segments[batch.segment] = _read_segment(batch.segment)
    return [segments[batch.segment][batch.index] if isinstance(batch, _Spilled) else batch for batch in found]


def release_rows(refs: Iterable[HeldRows]) -> None:
    """Free the batches of ``refs`` (their bucket is encoded): a run file goes with its last batch, a run's entry too."""
    emptied = []
    for ref in refs:
        run = _RUNS.get(ref.run_key)
        if run is None:
            continue
        with run.lock:
            batch = run.batches.pop(ref.number, None)
            if isinstance(batch, _Spilled):
                path = batch.segment.path
                run.live[path] -= 1
                if not run.live[path]:
                    del run.live[path]
                    emptied.append(path)
            elif batch is not None:
                run.free(ref.number)
                del run.buckets[ref.number]
            empty = not run.batches
        if empty:
            _RUNS.end(ref.run_key, run, if_empty=run.is_empty)
    held.delete_spilled(emptied, _WHAT)


def discard_held_rows(run_key: str) -> None:
    """Free every batch the run staging in ``run_key`` holds in this process (after a failure; a no-op otherwise).

    Spilled batches' files stay for the staging directory's own cleanup.
    """
    _RUNS.end(run_key)


def held_bytes(run_key: str) -> tuple[int, int]:
    """(batches, bytes) the run staging in ``run_key`` holds in memory now: bounded by its budget."""
    run = _RUNS.get(run_key)
    if run is None:
        return 0, 0
    with run.lock:
        return len(run.sizes), run.in_memory


def _write_run(path: str, members: list[tuple[int, int, pa.RecordBatch]]) -> dict[int, _Spilled]:
    """(bucket, number, batch) members to one file at ``path``, where each went: per bucket (and schema) one segment,
    an Arrow IPC stream of its batches as they are (joining them first cost more than the rest of the write)."""
    by_bucket: dict[int, list[tuple[int, pa.RecordBatch]]] = {}
    for bucket, number, batch in members:
        by_bucket.setdefault(bucket, []).append((number, batch))
    placed: dict[int, _Spilled] = {}

    def segments() -> Iterator[memoryview]:
        offset = 0
        for _, batches in sorted(by_bucket.items()):
            for schema, parts in _by_schema(batches):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, schema) as writer:
                    for _, batch in parts:
                        writer.write_batch(batch)
                data = sink.getvalue()
                segment = _Segment(path, offset, data.size, masked_crc32c(data))
                offset += data.size
                placed.update((number, _Spilled(segment, index)) for index, (number, _) in enumerate(parts))
                yield memoryview(data)

    held.write_spill_file(path, segments())
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
    data = held.read_spilled(segment.path, segment.offset, segment.length, _WHAT)
    if masked_crc32c(data) != segment.crc:
        raise held.damaged_spill(segment.path, f"held rows spilled there fail their CRC32C (bytes {segment.offset:,} "
                                 f"to {segment.offset + segment.length:,})")
    try:
        return list(pa.ipc.open_stream(data))
    except pa.ArrowInvalid as error:  # bytes as written that Arrow cannot read: a bug of ours, said as such
        raise HeldDataMissingError(f"{segment.path} (bytes {segment.offset:,} to {segment.offset + segment.length:,}): "
                                   f"held rows spilled there cannot be decoded ({error})") from error


def runs_holding_rows() -> list[str]:
    """The runs that hold rows in this process now (none once every build has ended)."""
    return _RUNS.runs()


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
