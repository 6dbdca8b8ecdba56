"""The shard writer: one shard's records sorted by (key, bytes), cut to its exact rank range, framed block by block
and written (with its read index) to the run's temp location.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from tfrbeam.base.wording import counted
from tfrbeam.beam import filesystem as fs
from tfrbeam.builder.inputs.progress import WRITTEN, ProgressCounter
from tfrbeam.builder.shuffle.balance import ShardingSpec, ShardPlan, SplitPlan
from tfrbeam.builder.shuffle.coders import PieceCoder
from tfrbeam.builder.shuffle.order import KeptOrder, TieCheck, TiedRecordsDiffer, kept_order, shard_order
from tfrbeam.builder.shuffle.pieces import Piece, byte_blocks
from tfrbeam.builder.shuffle.received import Received
from tfrbeam.builder.shuffle.route import shard_ranges, split_and_shard, with_final_keys
from tfrbeam.builder.shuffle.stores import PieceStore
from tfrbeam.errors import ShuffledDataError
from tfrbeam.layout.names import shard_file_name
from tfrbeam.tfrecord.read_index import ReadIndexBuilder, index_path_for
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordWriter

__all__ = ["WRITE_BLOCK_BYTES", "WRITE_BLOCK_RECORDS", "WrittenShard", "WriteShard", "WriteShardOfPieces", "write_blocks"]

_LOG = logging.getLogger(__name__)

# Frame and write at most this many records, and about this many bytes, at a time.
WRITE_BLOCK_RECORDS = 8192
WRITE_BLOCK_BYTES = 8 << 20



@dataclasses.dataclass(frozen=True)
class WrittenShard:
    """One written shard, still in the temp location; commit moves it to ``relative_path``."""

    split: str
    shard: int
    num_shards: int
    relative_path: str
    temp_path: str
    temp_index_path: str | None
    num_examples: int
    num_bytes: int
    sha256: str
    received_bytes: int = 0  # what reached this writer through the runner: its pieces as PieceCoder encodes them


class _HashingFile:
    """Counts and sha256-hashes every byte written; two background threads hash and write each block at once.

    Both release the GIL, so they overlap with each other and with gathering the next block (on
    one thread, hashing then writing was the shard writers' critical path); at most one block
    waits. Callers must not change a buffer after passing it to ``write``.
    """

    def __init__(self, handle):
        self._handle = handle
        self._sha256 = hashlib.sha256()
        self.size = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tfrbeam-shard-writer")
        self._pending: list[concurrent.futures.Future] = []

    def write(self, data) -> int:
        size = len(data)
        self._wait()
        self._pending = [self._executor.submit(self._sha256.update, data), self._executor.submit(self._handle.write, data)]
        self.size += size
        return size

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    @property
    def sha256_hex(self) -> str:
        self._wait()
        return self._sha256.hexdigest()

    def flush(self) -> None:
        self._wait()
        self._handle.flush()

    def close(self) -> None:
        try:
            self._wait()
        finally:
            self._executor.shutdown(wait=True)
            self._handle.close()


def write_blocks(framed_lengths: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive record ranges of at most WRITE_BLOCK_RECORDS records and WRITE_BLOCK_BYTES bytes (or one record).

    A shard is framed and written block by block, so a writer's buffers do not grow with its shard
    or with the records' sizes.
    """
    return byte_blocks(framed_lengths, WRITE_BLOCK_BYTES, WRITE_BLOCK_RECORDS)


class WriteShard(beam.DoFn):
    """Sorts one shard's records by (key, bytes), keeps its exact rank range and writes it to the temp dir."""

    def __init__(self, temp_dir: str, store: PieceStore, progress: str | None = None):
        self._temp_dir = temp_dir
        self._store = store
        self._progress = progress

    def process(self, element: tuple[int, Iterable[Piece]], plan: ShardPlan) -> Iterator[WrittenShard]:
        shard_key, parts = element
        split_index, shard = split_and_shard(shard_key)
        split_plan = plan.splits[split_index]
        parts = [part for part in parts if len(part) or part.is_stub]
        coder = PieceCoder()
        received_bytes = sum(coder.estimate_size(part) for part in parts)  # the encoded size, computed
        parts = [self._store.with_keys(part) for part in parts]  # a spill store's stubs: their keys read back
        low, high = split_plan.shard_start(shard), split_plan.shard_start(shard + 1)
        try:
            received = Received(parts, self._store)
            count = len(received.keys)
            first_rank = self._first_rank_received(split_plan, low, high, plan.spec.ordered)
            if count < high - first_rank or (plan.spec.ordered and count != high - low):
                raise RuntimeError(
                    f"split {split_plan.name} shard {shard}: received {count} records for ranks {low}..{high} "
                    f"(first received rank {first_rank}): the input changed during the run, or the runner lost elements "
                    "on their way to this writer (see docs/runners.md); nothing is published"
                )
            start, end = low - first_rank, high - first_rank
            try:
                written = self._write(split_plan, shard, plan.spec, received, kept_order(received, start, end))
            except TiedRecordsDiffer as error:
                _LOG.info("split %s shard %d: %s (a digest collision); writing it again, equal keys ordered by bytes",
                          split_plan.name, shard, error)
                written = self._write(split_plan, shard, plan.spec, received, KeptOrder(shard_order(received)[start:end]))
        except ShuffledDataError as error:
            raise ShuffledDataError(f"split {split_plan.name} shard {shard}: {error}") from error
        finally:
            for part in parts:
                self._store.written(part, shard_key)
        self._store.shard_written(shard_key, sum(split.num_shards for split in plan.splits))
        yield dataclasses.replace(written, received_bytes=received_bytes)

    @staticmethod
    def _first_rank_received(split_plan: SplitPlan, low: int, high: int, ordered: bool) -> int:
        """Global rank of the smallest record this shard receives: whole buckets arrive in hash mode."""
        if ordered or high <= low:
            return low
        bucket = int(np.searchsorted(split_plan.bucket_starts, low, side="right")) - 1
        return int(split_plan.bucket_starts[bucket])

    def _write(self, split_plan: SplitPlan, shard: int, spec: ShardingSpec, received: Received, kept: KeptOrder) -> WrittenShard:
        started = time.monotonic()
        name = shard_file_name(split_plan.name, shard, split_plan.num_shards, spec.compression)
        relative_path = f"{split_plan.name}/{name}"
        temp_path = fs.join(self._temp_dir, split_plan.name, name)
        try:
            return self._write_file(split_plan, shard, spec, received, kept, temp_path, relative_path, started)
        except OSError as error:  # a full disk and the like: name the file (the OSError of a write names none)
            raise OSError(error.errno, f"{error.strerror or error} (writing shard {temp_path})", temp_path) from error

    def _write_file(self, split_plan: SplitPlan, shard: int, spec: ShardingSpec, received: Received, order: KeptOrder,
                    temp_path: str, relative_path: str, started: float) -> WrittenShard:
        kept, ties = order.positions, TieCheck(order)
        index = ReadIndexBuilder() if spec.write_index and spec.compression is None else None
        handle = _HashingFile(fs.create(temp_path))
        try:
            writer = RecordWriter(handle, spec.compression)
            kept_lengths = received.payload_lengths(kept)
            for start, end in write_blocks(kept_lengths + RECORD_OVERHEAD):
                positions = kept[start:end]
                if index is not None:
                    index.add_batch(writer.bytes_written, writer.records_written, kept_lengths[start:end])
                frames = received.frames(positions)
                ties.block(frames, kept_lengths[start:end] + RECORD_OVERHEAD, start)  # raises TiedRecordsDiffer
                writer.write_framed(frames, len(positions))
            writer.close()
        finally:
            handle.close()
        temp_index_path = None
        if index is not None:
            # mtime None here: the commit stamps the file's own mtime once the shard is in its final directory.
            temp_index_path = index_path_for(temp_path)
            with fs.create(temp_index_path) as index_file:
                index_file.write(index.to_bytes(handle.size, None))
        beam.metrics.Metrics.counter("tfrbeam", "examples_written").inc(len(kept))
        if self._progress is not None:
            ProgressCounter(self._progress, WRITTEN).add(len(kept), handle.size)
        _LOG.info(
            "wrote %s: %s, %d bytes in %.1f s", relative_path, counted(len(kept), "example"), handle.size,
            time.monotonic() - started,
        )
        return WrittenShard(
            split=split_plan.name, shard=shard, num_shards=split_plan.num_shards, relative_path=relative_path,
            temp_path=temp_path, temp_index_path=temp_index_path,
            num_examples=len(kept), num_bytes=handle.size,
            sha256=handle.sha256_hex,
        )


class WriteShardOfPieces(WriteShard):
    """Writes the shard of each key it gets, routing the pieces (a side input, no bytes in them) itself.

    The pieces are routed once per bundle, as record ranges: a shard's slices are cut when it is written
    and dropped after, so the writers hold no slice per record of the shards still to come.
    """

    def start_bundle(self) -> None:
        self._ranges: dict[int, list[tuple[Piece, int, int]]] | None = None

    # Another element type than the base's (a shard key, pieces as a side input): a different DoFn signature.
    def process(self, shard_key: int, plan: ShardPlan, pieces: list[Piece],  # type: ignore[override]
                moved=None, movers: Iterable[str] = ()) -> Iterator[WrittenShard]:
        if self._ranges is None:
            self._ranges = collections.defaultdict(list)
            movers = set(movers)
            for piece in self._store.runs_of(pieces):
                # The store rekeys each piece once, for every writer.
                piece = with_final_keys(piece, self._store, moved, movers)
                ranges = shard_ranges(self._store.with_keys(piece), plan)
                self._store.routed(piece, len(ranges))
                for key, low, high in ranges:
                    self._ranges[key].append((piece, low, high))
        parts = [self._store.slice_of(piece, low, high) for piece, low, high in self._ranges.pop(shard_key, [])]
        yield from super().process((shard_key, parts), plan)
