"""An atomic, size-aware, sharded TFRecord sink for Apache Beam, a drop-in for Beam's ``WriteToTFRecord``.

How a write works:

1. **Framing.** Records are framed in large batches inside each bundle (one ``bytes`` blob plus
   the payload lengths per ~4 MiB), so Beam's per-element cost is paid per batch, not per record.
2. **Temporary files.** Batches are written to files in the run's hidden staging directory beside
   the output, ``<dir>/.<basename>.tfrbeam-<run id>/`` (``layout.names.staging_path``), whose run id is
   fixed when the pipeline is built
   (so a replayed or retried bundle never creates a second directory). With ``num_shards=N`` the
   batches cross one GroupByKey keyed by shard number and each shard is written by one worker;
   otherwise every bundle writes its own files, starting a new one whenever the next record
   would exceed ``max_records_per_shard`` / ``max_bytes_per_shard``. Only the file names and
   sizes of *committed* bundles reach the next step: a failed or replayed bundle's files are
   never renamed and are removed with the directory.
3. **Finalize** (one step that runs after every shard is complete) names the shards, checks the
   output prefix, renames the temporary files (and each uncompressed shard's read index, built as
   it was written) to their final names, and deletes the temporary directory. It is idempotent: a shard
   whose final file exists and whose temporary file is gone was renamed by an earlier attempt
   and is left alone, so running it twice (as Beam may on a retry) gives the same result.
4. **Reruns.** Files that match this sink's naming pattern (any shard count) but are not this
   run's shards belong to an earlier run. By default (``overwrite=True``, Beam's behaviour) the
   commit deletes them and their index files together with renaming the new shards in, so a
   ``-of-00003`` set is never mixed with a ``-of-00002`` one; ``overwrite=False`` refuses them with
   ``OutputExistsError`` when the pipeline is built (when the prefix is known then) and again at finalize.

A failed pipeline renames nothing, so it leaves no final shard; its hidden temporary directory
stays (Beam has no failure hook), is never matched by shard globs, is reported by the next run
into the same prefix and removed by one with ``overwrite=True``.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeAlias

import apache_beam as beam
import numpy as np
from apache_beam import coders
from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.metrics import Metrics
from apache_beam.options.value_provider import ValueProvider
from apache_beam.pvalue import AsList, AsSingleton
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from tfrbeam.base.object_store import S3Settings, configure_s3
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.publish import (
    CommitJournal,
    StagingDir,
    abandon,
    delete_staging,
    held_or_taken,
    recover,
    staging_path,
    this_run,
)
from tfrbeam.beam.runner_support import refuse_lossy_runner
from tfrbeam.beam.source import resolve_compression
from tfrbeam.errors import (
    CommitError,
    ConfigError,
    OutputExistsError,
    OutputLockedError,
    RecordIndexError,
    ShortWriteError,
    TfrbeamError,
)
from tfrbeam.layout.names import ABANDONED_NAME, JOURNAL_NAME, OWNER_NAME, ShardNaming
from tfrbeam.tfrecord.read_index import (
    ReadIndexBuilder,
    index_path_for,
    index_paths_for,
    offsets_from_headers,
    read_index_bytes,
    stamp_read_index,
)
from tfrbeam.tfrecord.records import AUTO_COMPRESSION, RECORD_OVERHEAD, RecordWriter, frame_records, normalize_compression

__all__ = ["FrameRecordsFn", "FramedBatch", "WriteFramedBatches", "WriteToTFRecord", "frame_batch", "make_sink_spec"]

_LOG = logging.getLogger(__name__)

METRICS_NAMESPACE = "tfrbeam"
DEFAULT_SHARD_NAME_TEMPLATE = "-SSSSS-of-NNNNN"
# Records buffered per bundle before they are framed into one batch.
_FRAME_BATCH_BYTES = 4 << 20
# With num_shards=N, bytes buffered per bundle (all shards together) before batches are emitted.
_SHARD_BUFFER_BYTES = 64 << 20
_LENGTH_DTYPE = np.dtype("<u4")

StrOrProvider: TypeAlias = str | ValueProvider

# A batch of framed records: (framed bytes, payload lengths as little-endian uint32 bytes).
# A plain tuple of bytes crosses Beam's coders natively, with no pickling.
FramedBatch = tuple[bytes, bytes]


def frame_batch(payloads: Sequence[bytes | bytearray | memoryview]) -> FramedBatch:
    """Frame records into one ``FramedBatch``."""
    lengths = np.fromiter(map(len, payloads), dtype=_LENGTH_DTYPE, count=len(payloads))
    return frame_records(payloads), lengths.tobytes()


def _lengths_of(batch: FramedBatch) -> np.ndarray:
    return np.frombuffer(batch[1], dtype=_LENGTH_DTYPE)


def _record_ends(lengths: np.ndarray) -> np.ndarray:
    """Offset just past each framed record of a batch, relative to the batch start."""
    return np.cumsum(lengths.astype(np.int64) + RECORD_OVERHEAD)


def _resolve(value: StrOrProvider) -> str:
    return value.get() if isinstance(value, ValueProvider) else value


# --------------------------------------------------------------------------------------------
# Naming


# --------------------------------------------------------------------------------------------
# The sink's configuration


@dataclasses.dataclass(frozen=True)
class TempShard:
    """A finished temporary shard file, as a writer hands it to finalize."""

    path: str
    shard: int | None  # the shard number when num_shards is fixed; None when the count follows the data
    records: int
    framed_bytes: int
    index_path: str | None  # its read index (uncompressed output), staged beside it


@dataclasses.dataclass(frozen=True)
class SinkSpec:
    """Everything the writers and finalize need; pickled into the pipeline's DoFns."""

    file_path_prefix: StrOrProvider
    file_name_suffix: StrOrProvider
    shard_name_template: str
    num_shards: int
    compression_type: str
    compression: str | None
    max_records_per_shard: int | None
    max_bytes_per_shard: int | None
    overwrite: bool
    run_id: str
    # The pipeline's S3 options, for the lock's own requests on a worker.
    storage: S3Settings = dataclasses.field(default_factory=S3Settings)

    def naming(self) -> ShardNaming:
        return ShardNaming(_resolve(self.file_path_prefix), _resolve(self.file_name_suffix), self.shard_name_template)

    def codec(self) -> str | None:
        """None, "gzip" or "zlib" for this output; refuses codecs TensorFlow cannot read."""
        final_name = self.naming().name(0, max(self.num_shards, 1))
        requested = AUTO_COMPRESSION if self.compression is None else self.compression
        # A file about to be written: its name decides, never what an earlier run left at that path.
        return normalize_compression(resolve_compression(self.compression_type, requested), final_name, reading=False)

    def target(self) -> str:
        """What the commit protocol locks and stages beside: the file prefix."""
        return _resolve(self.file_path_prefix)

    def temp_dir(self) -> str:
        return staging_path(self.target(), self.run_id)

    def existing_outputs(self) -> dict[str, FileMetadata]:
        """Files that match this sink's naming pattern now, by path."""
        naming = self.naming()
        found = _match(naming.glob())
        return {path: meta for path, meta in found.items() if naming.matches(path)}


# --------------------------------------------------------------------------------------------
# Filesystem helpers (the operations themselves live in tfrbeam.beam.filesystem)


def _match(pattern: str) -> dict[str, FileMetadata]:
    return fs.match(pattern)


def _empty_shard_bytes(compression: str | None) -> bytes:
    buffer = io.BytesIO()
    RecordWriter(buffer, compression).close()
    return buffer.getvalue()


def _describe(paths: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _output_exists_error(spec: SinkSpec, paths: Sequence[str]) -> OutputExistsError:
    return OutputExistsError(
        f"{len(paths)} file(s) of an earlier run match this sink's output pattern {spec.naming().glob()}: "
        f"{_describe(paths)}. Writing now would leave a mix of two runs' shards. Pass overwrite=True to "
        "remove them (with their read-index files) once this run's shards are complete, or write to "
        "another file_path_prefix."
    )


# --------------------------------------------------------------------------------------------
# Writing temporary shards


class _TempShardWriter:
    """Writes framed batches to one temporary shard file and builds its read index as it goes."""

    def __init__(self, spec: SinkSpec, compression: str | None, shard: int | None):
        name = f"shard-{shard:05d}-" if shard is not None else ""
        self.path = fs.join(spec.temp_dir(), f"{name}{uuid.uuid4().hex}.tfrecord")
        self.shard = shard
        self._handle = fs.create(self.path)
        self._writer = RecordWriter(self._handle, compression)
        self._index = ReadIndexBuilder() if compression is None else None

    @property
    def records(self) -> int:
        return self._writer.records_written

    @property
    def framed_bytes(self) -> int:
        return self._writer.bytes_written

    def write(self, framed: bytes | memoryview, lengths: np.ndarray) -> None:
        if self._index is not None:
            self._index.add_batch(self._writer.bytes_written, self._writer.records_written, lengths)
        self._writer.write_framed(framed, len(lengths))

    def close(self) -> TempShard:
        self._writer.close()
        self._handle.close()
        index_path = None
        if self._index is not None:  # mtime None: finalize stamps a local shard's own once it has its final name
            index_path = index_path_for(self.path)
            fs.write_bytes(index_path, self._index.to_bytes(self.framed_bytes, None))
        return TempShard(self.path, self.shard, self.records, self.framed_bytes, index_path)

    def discard(self) -> None:
        """Close and delete a file that will never be committed (the bundle failed)."""
        try:
            self._handle.close()
            fs.delete_files([self.path, index_path_for(self.path)])
        except Exception:  # cleanup of a failing bundle must not hide the bundle's own error
            _LOG.warning("could not delete the temporary file %s of a failed bundle", self.path, exc_info=True)


class FrameRecordsFn(beam.DoFn):
    """Buffers a bundle's records and emits them framed, ~4 MiB per ``FramedBatch``.

    ``encode`` turns an element into its record bytes (None: elements are bytes already).
    """

    def __init__(self, encode: Callable[[Any], bytes] | None = None):
        self._encode = encode

    def start_bundle(self) -> None:
        self._payloads: list[bytes] = []
        self._size = 0

    def process(self, element: Any) -> Iterator[FramedBatch]:
        payload = element if self._encode is None else self._encode(element)
        self._payloads.append(payload)
        self._size += len(payload)
        if self._size >= _FRAME_BATCH_BYTES:
            yield self.take()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._payloads:
            yield in_global_window(self.take())

    def take(self) -> FramedBatch:
        """The buffered records as one framed batch; the buffer is emptied."""
        payloads, self._payloads, self._size = self._payloads, [], 0
        try:
            return frame_batch(payloads)
        except TypeError as exc:
            bad = next((p for p in payloads if not isinstance(p, (bytes, bytearray, memoryview))), None)
            raise TypeError(
                f"WriteToTFRecord writes bytes records, got a {type(bad).__name__}: {bad!r:.80}. Encode elements "
                "to bytes first, or pass a coder= that does (e.g. coders.ProtoCoder for protos)"
            ) from exc


def in_global_window(value: Any) -> WindowedValue:
    """``value`` as an element of the global window, for output from ``finish_bundle``."""
    return WindowedValue(value, window.GlobalWindow().max_timestamp(), [window.GlobalWindow()])


class _WriteBundleShardsFn(beam.DoFn):
    """Writes a bundle's batches to temporary shards, starting a new one before a size limit is exceeded."""

    def __init__(self, spec: SinkSpec):
        self._spec = spec

    def setup(self) -> None:
        self._compression = self._spec.codec()
        self._max_records = self._spec.max_records_per_shard or 0
        self._max_bytes = self._spec.max_bytes_per_shard or 0

    def start_bundle(self) -> None:
        # A bundle that failed left its temp shard open: this instance may be reused for the retry.
        leftover = getattr(self, "_writer", None)
        if leftover is not None:
            leftover.discard()
        self._writer: _TempShardWriter | None = None

    def process(self, batch: FramedBatch) -> Iterator[TempShard]:
        data, lengths = memoryview(batch[0]), _lengths_of(batch)
        if not (self._max_records or self._max_bytes):
            self._current().write(data, lengths)
            return
        ends = _record_ends(lengths)
        first, consumed = 0, 0
        while first < len(lengths):
            writer = self._current()
            take = self._records_that_fit(writer, ends, first, consumed)
            if take == 0:
                if writer.records == 0:
                    raise ConfigError(
                        f"max_bytes_per_shard={self._max_bytes} is smaller than one record of "
                        f"{int(lengths[first]) + RECORD_OVERHEAD} framed bytes ({int(lengths[first])}-byte payload "
                        f"+ {RECORD_OVERHEAD} bytes of framing); raise the limit so every shard can hold a record"
                    )
                yield self._close()
                continue
            end = int(ends[first + take - 1])
            writer.write(data[consumed:end], lengths[first:first + take])
            first, consumed = first + take, end

    def _records_that_fit(self, writer: _TempShardWriter, ends: np.ndarray, first: int, consumed: int) -> int:
        take = len(ends) - first
        if self._max_records:
            take = min(take, self._max_records - writer.records)
        if self._max_bytes:
            room = self._max_bytes - writer.framed_bytes
            fits = int(np.searchsorted(ends[first:first + take], consumed + room, side="right"))
            take = min(take, fits)
        return max(take, 0)

    def _current(self) -> _TempShardWriter:
        if self._writer is None:
            self._writer = _TempShardWriter(self._spec, self._compression, None)
        return self._writer

    def _close(self) -> TempShard:
        writer, self._writer = self._writer, None
        return writer.close()  # type: ignore[union-attr]  # called only while a shard is open

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._writer is not None:
            yield in_global_window(self._close())

    def teardown(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            self._writer = None
            writer.discard()


class _SplitByShardFn(beam.DoFn):
    """Splits each batch into ``num_shards`` contiguous slices and buffers them per shard.

    Slice sizes differ by at most one record and the remainder rotates, so shards stay balanced
    to within a record per batch. What crosses the GroupByKey is one batch per shard per ~64 MiB
    of a bundle's data, never one element per record.
    """

    def __init__(self, num_shards: int):
        self._num_shards = num_shards

    def start_bundle(self) -> None:
        self._pieces: dict[int, list[tuple[memoryview, np.ndarray]]] = {}
        self._buffered = 0
        self._next_shard = int.from_bytes(uuid.uuid4().bytes[:4], "little") % self._num_shards

    def process(self, batch: FramedBatch) -> Iterator[tuple[int, FramedBatch]]:
        data, lengths = memoryview(batch[0]), _lengths_of(batch)
        ends = np.concatenate(([0], _record_ends(lengths)))
        count, shards = len(lengths), self._num_shards
        base, extra = divmod(count, shards)
        first = 0
        for step in range(min(count, shards)):
            take = base + (1 if step < extra else 0)
            shard = (self._next_shard + step) % shards
            self._pieces.setdefault(shard, []).append(
                (data[int(ends[first]):int(ends[first + take])], lengths[first:first + take])
            )
            first += take
        self._next_shard = (self._next_shard + extra) % shards
        self._buffered += len(data)
        if self._buffered >= _SHARD_BUFFER_BYTES:
            yield from self._drain()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        for element in self._drain():
            yield in_global_window(element)

    def _drain(self) -> Iterator[tuple[int, FramedBatch]]:
        pieces, self._pieces, self._buffered = self._pieces, {}, 0
        for shard, parts in pieces.items():
            framed = b"".join(part for part, _ in parts)
            lengths = np.concatenate([part_lengths for _, part_lengths in parts])
            yield shard, (framed, lengths.astype(_LENGTH_DTYPE, copy=False).tobytes())


class _WriteGroupedShardFn(beam.DoFn):
    """Writes all batches of one shard number to one temporary file."""

    def __init__(self, spec: SinkSpec):
        self._spec = spec

    def setup(self) -> None:
        self._compression = self._spec.codec()

    def process(self, element: tuple[int, Iterable[FramedBatch]]) -> Iterator[TempShard]:
        shard, batches = element
        writer = _TempShardWriter(self._spec, self._compression, shard)
        try:
            for batch in batches:
                writer.write(batch[0], _lengths_of(batch))
        except BaseException:
            writer.discard()
            raise
        yield writer.close()


# --------------------------------------------------------------------------------------------
# Finalize


@dataclasses.dataclass(frozen=True)
class _Move:
    """One final shard: its temporary file (None for an empty shard finalize creates) and final name."""

    dst: str
    shard: TempShard | None


class Finalizer:
    """Names, checks and renames the temporary shards of one write; safe to run more than once.

    It runs in whichever worker runs the Finalize step (a transform has no hook after
    ``pipeline.run()``) and takes the prefix's lock there itself: a lock file naming this write is
    no proof that anyone holds it (see docs/commit.md).
    """

    def __init__(self, spec: SinkSpec):
        self.spec = spec
        self.naming = spec.naming()
        self.compression = spec.codec()
        self.temp_dir = spec.temp_dir()

    def plan(self, temp_shards: Iterable[TempShard]) -> list[_Move]:
        """Final names in shard order; the same committed shards always give the same plan."""
        shards = sorted(temp_shards, key=lambda s: (-1 if s.shard is None else s.shard, s.path))
        if self.spec.num_shards:
            by_number: dict[int, TempShard] = {}
            for shard in shards:
                if shard.shard in by_number:
                    raise TfrbeamError(
                        f"two temporary files claim shard {shard.shard}: {by_number[shard.shard].path} and "
                        f"{shard.path}; the runner committed a shard twice, refusing to duplicate records"
                    )
                by_number[shard.shard] = shard  # type: ignore[index]  # with num_shards every shard has its number
            count = self.spec.num_shards
            return [_Move(self.naming.name(i, count), by_number.get(i)) for i in range(count)]
        count = max(len(shards), 1)
        if not shards:
            return [_Move(self.naming.name(0, 1), None)]
        return [_Move(self.naming.name(i, count), shard) for i, shard in enumerate(shards)]

    def run(self, temp_shards: Iterable[TempShard], expected_records: int | None = None) -> list[str]:
        """Finalize the write under the prefix's lock; returns the final file names in shard order."""
        temp_shards = list(temp_shards)
        try:
            return self._run(temp_shards, expected_records)
        except OutputLockedError:
            # Another run is committing into this prefix: this one fails for good (a retry must not
            # publish after it), and nothing it wrote is kept.
            delete_staging(self.temp_dir)
            raise
        except BaseException:
            abandon(self.temp_dir)  # the next run into the prefix completes or removes what this one left
            raise

    def _run(self, temp_shards: list[TempShard], expected_records: int | None) -> list[str]:
        with held_or_taken(self.spec.target(), this_run(self.spec.run_id)):
            recover(self.spec.target(), keep=self.temp_dir, prefix_output=True)
            journal = CommitJournal.read(self.temp_dir)
            if journal is None:  # else a retried finalize: that attempt's journal is the plan
                journal = self._journal(temp_shards, expected_records)
                journal.write(self.temp_dir)
            journal.apply()
            moves = self.plan(temp_shards)
            finals = _match(self.naming.glob())
            if not fs.is_remote(self.temp_dir):
                missing = [move.dst for move in moves if move.dst not in finals]
                if missing:
                    raise CommitError(
                        f"{missing[0]}: missing right after the commit renamed it; the output changed under the write"
                    )
            self._finish_indexes(moves)
            delete_staging(self.temp_dir)
        self._count(moves, finals)
        _LOG.info("wrote %d shard(s) to %s", len(moves), self.naming.glob())
        return [move.dst for move in moves]

    def _journal(self, temp_shards: list[TempShard], expected_records: int | None) -> CommitJournal:
        """Check the write is whole, then list the commit's deletions and renames (written before any runs)."""
        moves = self.plan(temp_shards)
        existing = self.spec.existing_outputs()
        temp_files = set(_match(fs.join(self.temp_dir, "*")))
        self._check_accounted(temp_shards, temp_files, expected_records)
        pending, replace = self._classify(moves, existing, temp_files)
        ours = {move.dst for move in moves}
        stale = sorted(path for path in existing if path not in ours)
        in_the_way = sorted(stale + [move.dst for move in replace])
        if in_the_way and not self.spec.overwrite:
            raise _output_exists_error(self.spec, in_the_way)
        if in_the_way:
            _LOG.warning("overwrite=True: replacing %d file(s) of an earlier run: %s", len(in_the_way), _describe(in_the_way))
        renames = self._staged_sources(pending + replace)
        doomed = stale + [index for path in in_the_way for index in index_paths_for(path)]
        return CommitJournal(self.spec.run_id, self.spec.target(), tuple(doomed), tuple(renames))

    def _check_accounted(self, temp_shards: list[TempShard], temp_files: set[str], expected: int | None) -> None:
        """Records in = records out: every record the pipeline framed is in a reported shard of the reported size.

        Temporary files no writer reported are not an error: a replayed or retried bundle leaves them,
        and only committed bundles' shards count.
        """
        written = sum(shard.records for shard in temp_shards)
        if expected is not None and written != expected:
            raise ShortWriteError(
                f"{self.naming.glob()}: the shard writers reported {written} records, but {expected} were written to "
                "the sink; the runner lost or duplicated elements, so nothing was published"
            )
        short = [shard for shard in temp_shards
                 if shard.path in temp_files and self.compression is None
                 and _size_of(shard.path) != shard.framed_bytes]
        if short:
            raise ShortWriteError(
                f"{short[0].path}: {_size_of(short[0].path)} bytes on disk, its writer reported {short[0].framed_bytes}; "
                "nothing was published"
            )

    def _staged_sources(self, moves: list[_Move]) -> list[tuple[str, str]]:
        """(staged file, final name) pairs, each shard's read index after it; an empty shard gets an empty staged file now."""
        pairs = []
        for move in moves:
            source = move.shard.path if move.shard is not None else self._empty_source(move)
            pairs.append((source, move.dst))
            if move.shard is not None and move.shard.index_path is not None:
                pairs.append((move.shard.index_path, index_path_for(move.dst)))
        return pairs

    def _classify(
        self, moves: list[_Move], existing: dict[str, FileMetadata], temp_files: set[str]
    ) -> tuple[list[_Move], list[_Move]]:
        """Split moves into (to rename, to rename over a different file in the way); drop those already done."""
        pending: list[_Move] = []
        replace: list[_Move] = []
        empty = _empty_shard_bytes(self.compression)
        for move in moves:
            if move.dst not in existing:
                if move.shard is not None and move.shard.path not in temp_files:
                    raise TfrbeamError(
                        f"neither the temporary file {move.shard.path} nor the final file {move.dst} exists: "
                        "the temporary directory was removed while the pipeline ran (another run into the same "
                        "prefix with overwrite=True?); rerun the pipeline"
                    )
                pending.append(move)
            elif move.shard is None:
                # An empty shard: an identical file in place is as good as ours.
                if existing[move.dst].size_in_bytes != len(empty) or fs.read_bytes(move.dst) != empty:
                    replace.append(move)
            elif move.shard.path in temp_files:
                if fs.same_content(move.shard.path, move.dst):
                    fs.delete_files([move.shard.path])  # an interrupted copy-then-delete rename
                else:
                    replace.append(move)
            elif self.compression is None and existing[move.dst].size_in_bytes != move.shard.framed_bytes:
                raise TfrbeamError(
                    f"the temporary file {move.shard.path} is gone and {move.dst} holds "
                    f"{existing[move.dst].size_in_bytes} bytes, not this run's {move.shard.framed_bytes}: another "
                    "run wrote into the same prefix at the same time; rerun the pipeline"
                )
            # else: renamed by an earlier attempt of this finalize.
        return pending, replace

    def _empty_source(self, move: _Move) -> str:
        path = fs.join(self.temp_dir, f"empty-{uuid.uuid4().hex}.tfrecord")
        fs.write_bytes(path, _empty_shard_bytes(self.compression))
        return path

    def _finish_indexes(self, moves: list[_Move]) -> None:
        """Uncompressed shards: stamp each local shard's read index with its mtime, and give an empty shard its index
        (the journal moved the others' beside them). Compressed ones have none: drop what an earlier run left."""
        if self.compression is not None:
            fs.delete_files([index for move in moves for index in index_paths_for(move.dst)])
            return
        if fs.is_remote(self.temp_dir):  # unstamped (mtime NaN): readers of objects compare sizes only
            fs.in_threads(_write_empty_index, [move.dst for move in moves if move.shard is None])
            return
        fs.in_threads(self._finish_local_index, moves)

    def _finish_local_index(self, move: _Move) -> None:
        """Stamp the read index the writer staged (the journal moved it) with its shard's mtime."""
        if move.shard is None or move.shard.index_path is None:
            _write_empty_index(move.dst, os.path.getmtime(move.dst))
            return
        try:
            stamp_read_index(move.dst)
        except (OSError, RecordIndexError):  # an earlier, interrupted finalize moved the shard but not its index
            mtime = os.path.getmtime(move.dst)
            fs.write_bytes(index_path_for(move.dst), read_index_bytes(offsets_from_headers(move.dst), mtime))

    def _count(self, moves: list[_Move], finals: dict[str, FileMetadata]) -> None:
        Metrics.counter(METRICS_NAMESPACE, "shards_written").inc(len(moves))
        Metrics.counter(METRICS_NAMESPACE, "records_written").inc(
            sum(move.shard.records for move in moves if move.shard is not None)
        )
        Metrics.counter(METRICS_NAMESPACE, "bytes_written").inc(sum(finals[move.dst].size_in_bytes for move in moves))


def _write_empty_index(shard: str, mtime: float | None = None) -> None:
    """The read index of an empty shard: no record, its one record start the file size 0."""
    fs.write_bytes(index_path_for(shard), read_index_bytes(np.zeros(1, np.int64), mtime))


def _is_protocol_file(path: str) -> bool:
    return fs.split(path)[1] in (OWNER_NAME, ABANDONED_NAME, JOURNAL_NAME, JOURNAL_NAME + ".tmp")


def _size_of(path: str) -> int | None:
    found = _match(path)
    return next(iter(found.values())).size_in_bytes if found else None


def _finalize(_: Any, spec: SinkSpec, temp_shards: list[TempShard], expected_records: int) -> list[str]:
    configure_s3(spec.storage)
    return Finalizer(spec).run(temp_shards, expected_records)


def _records_in(batch: FramedBatch) -> int:
    return len(batch[1]) // _LENGTH_DTYPE.itemsize


# --------------------------------------------------------------------------------------------
# Transforms


class WriteFramedBatches(beam.PTransform):
    """Writes a PCollection of ``FramedBatch`` (already framed records) as shards; see ``WriteToTFRecord``.

    The batch-level entry point: ``WriteExamples`` frames whole Arrow record batches at once and
    hands them here, so no per-record element ever exists in the pipeline.
    """

    def __init__(self, spec: SinkSpec):
        super().__init__()
        self._spec = spec

    def expand(self, batches: beam.PCollection) -> beam.PCollection:
        fs.use_pipeline_options(batches.pipeline.options)
        spec = dataclasses.replace(self._spec, storage=fs.storage_settings(batches.pipeline.options))
        refuse_lossy_runner(batches.pipeline, "tfrbeam's TFRecord sink")
        if not batches.is_bounded:
            raise ValueError(
                "tfrbeam's sinks write bounded PCollections only; use apache_beam.io.WriteToTFRecord with "
                "triggering_frequency for streaming input"
            )
        if _is_static(spec) and _is_local(spec):
            check_no_earlier_output(spec)  # before the pipeline runs
            # Staged beside the prefix, owned by this (launching) process: while it lives, no other
            # run's recovery removes the directory.
            StagingDir(spec.temp_dir(), this_run(spec.run_id), spec.target()).create()
        # Remote prefixes are checked as the pipeline starts (listing gs:// while the pipeline is
        # built would need credentials there): writers wait for the check through a side input.
        checked = batches.pipeline | "Start" >> beam.Create([None]) | "CheckOutput" >> beam.Map(_check_before_writing, spec)
        batches = (
            batches
            | "AfterOutputCheck" >> beam.Map(lambda batch, _: batch, AsSingleton(checked))
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        )
        if spec.num_shards:
            temp_shards = (
                batches
                | "SplitByShard" >> beam.ParDo(_SplitByShardFn(spec.num_shards))
                | "GroupByShard" >> beam.GroupByKey()
                | "WriteShards" >> beam.ParDo(_WriteGroupedShardFn(spec))
            )
        else:
            temp_shards = batches | "WriteBundleShards" >> beam.ParDo(_WriteBundleShardsFn(spec))
        # Records in: counted from the framed batches, checked against the writers' reports at finalize.
        records_in = batches | "CountRecords" >> beam.Map(_records_in) | "SumRecords" >> beam.CombineGlobally(sum)
        return (
            batches.pipeline
            | "Once" >> beam.Create([None])
            | "Finalize" >> beam.FlatMap(_finalize, spec, AsList(temp_shards), AsSingleton(records_in))
            .with_output_types(str)
        )


def make_sink_spec(
    file_path_prefix: StrOrProvider,
    file_name_suffix: StrOrProvider = "",
    num_shards: int = 0,
    shard_name_template: str | None = None,
    compression_type: str = CompressionTypes.AUTO,
    compression: str | None = None,
    max_records_per_shard: int | None = None,
    max_bytes_per_shard: int | None = None,
    overwrite: bool = True,
) -> SinkSpec:
    """Check the sink arguments (as Beam does, plus ours) and build the spec; errors name the argument."""
    if not isinstance(file_path_prefix, (str, ValueProvider)):
        raise TypeError(f"file_path_prefix must be a string or ValueProvider; got {file_path_prefix!r} instead")
    if not isinstance(file_name_suffix, (str, ValueProvider)):
        raise TypeError(f"file_name_suffix must be a string or ValueProvider; got {file_name_suffix!r} instead")
    if not CompressionTypes.is_valid_compression_type(compression_type):
        raise TypeError(f"compression_type must be CompressionType object but was {type(compression_type)}")
    resolve_compression(compression_type, AUTO_COMPRESSION if compression is None else compression)  # refuse bad codecs now
    if num_shards is None or int(num_shards) < 0:
        raise ValueError(f"num_shards must be 0 (let the sink decide) or a positive count, got {num_shards!r}")
    for name, limit in (("max_records_per_shard", max_records_per_shard), ("max_bytes_per_shard", max_bytes_per_shard)):
        if limit is not None and int(limit) <= 0:
            raise ValueError(f"{name} must be a positive number, got {limit!r}")
    template = DEFAULT_SHARD_NAME_TEMPLATE if shard_name_template is None else shard_name_template
    limited = max_records_per_shard is not None or max_bytes_per_shard is not None
    if template == "":
        if limited:
            raise ConfigError(
                "shard_name_template='' writes exactly one unsharded file, so max_records_per_shard / "
                "max_bytes_per_shard cannot split it; use a template with S (shard number) or drop the limits"
            )
        num_shards = 1  # as Beam: an unsharded name means one file
    elif limited and num_shards:
        raise ConfigError(
            f"num_shards={num_shards} fixes the shard count while max_records_per_shard / max_bytes_per_shard let "
            "the data decide it; pass one or the other"
        )
    spec = SinkSpec(
        file_path_prefix=file_path_prefix,
        file_name_suffix=file_name_suffix,
        shard_name_template=template,
        num_shards=int(num_shards),
        compression_type=compression_type,
        compression=compression,
        max_records_per_shard=None if max_records_per_shard is None else int(max_records_per_shard),
        max_bytes_per_shard=None if max_bytes_per_shard is None else int(max_bytes_per_shard),
        overwrite=bool(overwrite),
        run_id=uuid.uuid4().hex,
    )
    spec.naming()  # validates the template
    if _is_static(spec):
        spec.codec()  # refuses unsupported codecs when the pipeline is built
    return spec


def _is_static(spec: SinkSpec) -> bool:
    return all(
        not isinstance(value, ValueProvider) or value.is_accessible()
        for value in (spec.file_path_prefix, spec.file_name_suffix)
    )


def check_no_earlier_output(spec: SinkSpec) -> None:
    """Refuse an output prefix that holds shards of an earlier run (raises OutputExistsError)."""
    if spec.overwrite:
        return
    existing = sorted(spec.existing_outputs())
    if existing:
        raise _output_exists_error(spec, existing)


def _is_local(spec: SinkSpec) -> bool:
    return fs.is_local(_resolve(spec.file_path_prefix))


def _check_before_writing(_: Any, spec: SinkSpec) -> bool:
    check_no_earlier_output(spec)
    StagingDir(spec.temp_dir(), this_run(spec.run_id), spec.target()).create()
    return True


class WriteToTFRecord(beam.PTransform):
    """Writes bytes records (or ``coder``-encoded elements) as sharded TFRecord files, atomically.

    Takes the arguments of ``apache_beam.io.tfrecordio.WriteToTFRecord`` with the same meaning, so
    switching is a change of import, and returns a PCollection of the final file names. Beyond it:

    - ``compression``: None, "gzip" or "zlib" (tfrbeam's spelling; or use ``compression_type``).
      Codecs TensorFlow cannot read (bzip2, zstd, lzma) raise ``UnsupportedCompressionError``.
    - ``max_records_per_shard`` / ``max_bytes_per_shard``: no shard exceeds them (bytes count the
      framed, uncompressed record bytes: payload + 16 per record). Not combinable with
      ``num_shards``, which fixes the count: exactly that many files, empty ones included.
    - ``overwrite`` (default True, as Beam): an earlier run's shards under this prefix (any shard
      count) are replaced in the same commit, so a ``-of-00003`` set never mixes with a
      ``-of-00002`` one (Beam deletes only files with the *new* shard count). ``overwrite=False``
      refuses them with ``OutputExistsError`` instead.

    Uncompressed shards get a read index in ``<dir>/.tfrbeam-index/``, so tfrbeam's reader splits
    them exactly. Unbounded (streaming) input is not supported. See the module docstring for how
    temporary files and finalize make the write atomic and idempotent.
    """

    def __init__(
        self,
        file_path_prefix: StrOrProvider,
        coder: coders.Coder = coders.BytesCoder(),
        file_name_suffix: StrOrProvider = "",
        num_shards: int = 0,
        shard_name_template: str | None = None,
        compression_type: str = CompressionTypes.AUTO,
        triggering_frequency: int | None = None,
        *,
        compression: str | None = None,
        max_records_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        overwrite: bool = True,
    ):
        super().__init__()
        if triggering_frequency is not None:
            raise ValueError(
                "triggering_frequency is for Beam's streaming writes; tfrbeam's WriteToTFRecord writes bounded "
                "PCollections only. Use apache_beam.io.WriteToTFRecord for unbounded input."
            )
        self._coder = coder
        self._spec = make_sink_spec(
            file_path_prefix, file_name_suffix, num_shards, shard_name_template, compression_type,
            compression, max_records_per_shard, max_bytes_per_shard, overwrite,
        )

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        encode = None if isinstance(self._coder, coders.BytesCoder) else self._coder.encode
        return pcoll | "FrameRecords" >> beam.ParDo(FrameRecordsFn(encode)) | "Write" >> WriteFramedBatches(self._spec)

    def display_data(self) -> dict[str, Any]:
        spec = self._spec
        return {
            "file_pattern": beam.transforms.display.DisplayDataItem(
                str(spec.file_path_prefix) + spec.shard_name_template + str(spec.file_name_suffix), label="File Pattern"
            ),
            "shards": beam.transforms.display.DisplayDataItem(spec.num_shards, label="Number of Shards"),
            "compression": beam.transforms.display.DisplayDataItem(str(spec.compression or spec.compression_type)),
        }
