"""``open_dataset`` and ``Dataset``: batches of a TFRecord dataset, interleaved, shuffled, prefetched, resumable.

One epoch, in order: the dataset's segments (files, or record ranges of files) are shuffled with
a generator seeded by (seed, epoch); slot ``s`` of the interleave reads segments ``s, s + C,
s + 2C, ...`` of that order in blocks of ``block_length`` records; the consumer takes one block
from each live slot in turn, pushes it into the shuffle buffer (or a FIFO), and cuts batches.
Every choice is a function of (seed, epoch) and the record counts, never of timing, so a
position (epoch, batches delivered) can be replayed exactly: resuming fast-forwards through the
epoch reading record headers only, then decodes just the records the buffer held.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Literal

import numpy as np

from tfrbeam.dataset.columns import Block, Column, RowQueue, ShufflePool, block_rows, concat_blocks, take_block
from tfrbeam.dataset.output import to_arrow, to_numpy
from tfrbeam.dataset.reader import ID_KEY, RAW_KEY, BlockDecoder, Segment, count_records, dense_layout, read_segment, split_ids
from tfrbeam.dataset.spec import FixedLenFeature, PathSpec, Source, VarLenFeature, resolve_source
from tfrbeam.dataset.workers import DONE, END, ERROR, Cancelled, Job, ProcessWorkers, ReadPlan, SlotStart, ThreadWorkers, produce
from tfrbeam.errors import ConfigError
from tfrbeam.records import SkippedRegion

_LOG = logging.getLogger(__name__)

STATE_VERSION = 1
DEFAULT_CYCLE_LENGTH = 8
DEFAULT_BLOCK_LENGTH = 4096
MAX_PREFETCH = 64
AUTO_PROCESSES_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that shapes the batches (and, for the fields in ``order_fields``, their order)."""

    batch_size: int
    output: str
    cycle_length: int
    block_length: int
    shuffle_files: bool
    shuffle_buffer: int
    seed: int
    drop_remainder: bool
    prefetch: int
    autotune: bool
    deterministic: bool
    skip_corrupt: bool
    padded: Mapping[str, int | None]
    executor: str
    num_workers: int
    raw: bool = False

    order_fields = ("batch_size", "cycle_length", "block_length", "shuffle_files", "shuffle_buffer", "seed", "drop_remainder")


def open_dataset(
    path_or_pattern: PathSpec,
    split: str | None = None,
    *,
    columns: Sequence[str] | None = None,
    batch_size: int = 1024,
    output: Literal["numpy", "arrow"] = "numpy",
    num_parallel_reads: int | None = None,
    shuffle_files: bool = False,
    shuffle_buffer: int = 0,
    seed: int | None = None,
    prefetch: int | None = None,
    autotune: bool = True,
    deterministic: bool = True,
    skip_corrupt: bool = False,
    padded: bool | Mapping[str, int | None] | Sequence[str] = False,
    drop_remainder: bool = False,
    feature_spec: Mapping[str, Any] | None = None,
    compression: str | None = "auto",
    executor: Literal["auto", "threads", "processes"] = "auto",
    num_workers: int | None = None,
    block_length: int = DEFAULT_BLOCK_LENGTH,
    raw: bool = False,
) -> Dataset:
    """Open a TFRecord dataset of tf.train.Examples for training: a ``tfrbeam build`` directory or a glob.

    - ``path_or_pattern``: a build directory (its ``dataset_info.json`` gives splits, shards,
      record counts and the feature spec; ``split`` picks one), or a glob / file / list of files.
    - ``feature_spec``: {name: FixedLenFeature | VarLenFeature | manifest-style dict}; default:
      the manifest's, else inferred from the first 1000 records. ``columns`` decodes only those.
    - Batches: ``batch_size`` records (the last one of an epoch smaller unless ``drop_remainder``),
      as ``{name: numpy array | Ragged}`` (``output="numpy"``; ``padded`` pads variable-length
      features: True, a list of names, or {name: length}) or ``pyarrow.RecordBatch`` (``"arrow"``).
    - Order: ``num_parallel_reads`` files interleaved (default 8), ``block_length`` records from
      each in turn, ``shuffle_files`` and a ``shuffle_buffer`` of records, all seeded by ``seed``
      (random if None, but recorded in ``state_dict``). ``deterministic=False`` takes blocks in
      the order workers finish them (not resumable).
    - Work: ``executor`` "threads" or "processes" ("auto": processes for data over 64 MiB),
      ``num_workers`` (default: CPU count), ``prefetch`` batches ahead (default 2), ``autotune``.
    - ``skip_corrupt`` skips damaged records (see ``Dataset.skipped``) instead of raising;
      ``raw=True`` yields each record's bytes as feature "record" (any payload, not just Examples).
    """
    if raw:
        feature_spec = {RAW_KEY: FixedLenFeature((), "bytes")}
    source = resolve_source(path_or_pattern, split, feature_spec, compression, skip_corrupt)
    features = _select(source.features, columns)
    padding = _padding(padded, features)
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    if output not in ("numpy", "arrow"):
        raise ConfigError(f"output={output!r} is not one of 'numpy', 'arrow'")
    if executor not in ("auto", "threads", "processes"):
        raise ConfigError(f"executor={executor!r} is not one of 'auto', 'threads', 'processes'")
    if shuffle_buffer < 0 or block_length < 1:
        raise ConfigError(f"shuffle_buffer must be >= 0 and block_length >= 1 (got {shuffle_buffer}, {block_length})")
    cpus = os.cpu_count() or 1
    workers = num_workers or (cpus if autotune or num_parallel_reads is None else min(cpus, num_parallel_reads))
    options = Options(
        batch_size=batch_size,
        output=output,
        cycle_length=num_parallel_reads or DEFAULT_CYCLE_LENGTH,
        block_length=block_length,
        shuffle_files=shuffle_files,
        shuffle_buffer=shuffle_buffer,
        seed=secrets.randbits(63) if seed is None else int(seed),
        drop_remainder=drop_remainder,
        prefetch=prefetch if prefetch is not None else 2,
        autotune=autotune,
        deterministic=deterministic,
        skip_corrupt=skip_corrupt,
        padded=padding,
        executor=executor,
        num_workers=max(1, workers),
        raw=raw,
    )
    segments = tuple(Segment(shard.path, shard.compression) for shard in source.files)
    counts = tuple(shard.num_records for shard in source.files)
    return Dataset(source, features, options, segments, counts)


def _select(features: Mapping[str, Any], columns: Sequence[str] | None) -> dict[str, Any]:
    if columns is None:
        return dict(features)
    missing = [name for name in columns if name not in features]
    if missing:
        raise ConfigError(f"columns {missing} are not features of this dataset; it has {sorted(features)}")
    return {name: features[name] for name in columns}


def _padding(padded: bool | Mapping[str, int | None] | Sequence[str], features: Mapping[str, Any]) -> dict[str, int | None]:
    varlen = [name for name, feature in features.items() if isinstance(feature, VarLenFeature)]
    if padded is True:
        return {name: None for name in varlen}
    if not padded:
        return {}
    chosen = dict(padded) if isinstance(padded, Mapping) else {name: None for name in padded}
    wrong = [name for name in chosen if name not in varlen]
    if wrong:
        raise ConfigError(f"padded names {wrong} that are not variable-length features being read; those are {varlen}")
    return chosen


class Dataset:
    """Batches of a TFRecord dataset; iterate it for one pass (``repeat`` epochs, at most ``take`` batches).

    Iterating again continues with the next epoch (a new shuffle). ``state_dict()`` is the
    position after the last batch handed out; ``load_state_dict`` makes the next iteration
    continue from such a position, exactly.
    """

    def __init__(
        self,
        source: Source,
        features: Mapping[str, Any],
        options: Options,
        segments: tuple[Segment, ...],
        counts: tuple[int | None, ...],
        shard_key: tuple = (),
        epochs: int | None = 1,
        limit: int | None = None,
    ):
        self.source = source
        self.features = dict(features)
        self.options = options
        self.segments = segments
        self._counts = counts
        self._shard_key = shard_key
        self._epochs = epochs
        self._limit = limit
        self._position = {"epoch": 0, "batch": 0, "pass_start": 0, "taken": 0}
        self._resume_pending = False
        self._iterator: weakref.ref | None = None
        self._workers: ThreadWorkers | ProcessWorkers | None = None
        self._lock = threading.Lock()
        self.skipped: list[SkippedRegion] = []
        self.stats = {"workers": options.num_workers, "prefetch": options.prefetch, "executor": None}

    # ------------------------------------------------------------------ derived datasets

    def _derive(self, **changes: Any) -> Dataset:
        fields = dict(
            source=self.source, features=self.features, options=self.options, segments=self.segments,
            counts=self._counts, shard_key=self._shard_key, epochs=self._epochs, limit=self._limit,
        )
        fields.update(changes)
        return Dataset(**fields)

    def shard(self, num_workers: int, index: int, by: Literal["auto", "file", "record"] = "auto") -> Dataset:
        """This worker's part of the data: the union over ``index`` is the whole, with no overlap.

        By file (every ``num_workers``-th segment) when there are at least as many files as workers,
        else by contiguous record ranges (seeking with the read index where one exists).
        """
        if not 0 <= index < num_workers:
            raise ConfigError(f"shard index {index} is not in [0, {num_workers})")
        mode = by if by != "auto" else ("file" if len(self.segments) >= num_workers else "record")
        if mode == "file":
            picked = range(index, len(self.segments), num_workers)
            return self._derive(
                segments=tuple(self.segments[i] for i in picked), counts=tuple(self._counts[i] for i in picked),
                shard_key=self._shard_key + (("file", num_workers, index),),
            )
        if mode != "record":
            raise ConfigError(f"shard by={by!r} is not one of 'auto', 'file', 'record'")
        segments, counts = _record_range_shard(self.segments, self._segment_counts(), num_workers, index)
        return self._derive(segments=segments, counts=counts, shard_key=self._shard_key + (("record", num_workers, index),))

    def repeat(self, count: int | None = None) -> Dataset:
        """Each pass reads ``count`` epochs (None: forever), each with its own shuffle."""
        if count is not None and count < 0:
            raise ConfigError(f"repeat count must be >= 0 or None, got {count}")
        return self._derive(epochs=count)

    def take(self, count: int) -> Dataset:
        """Each pass stops after ``count`` batches."""
        if count < 0:
            raise ConfigError(f"take count must be >= 0, got {count}")
        return self._derive(limit=count)

    def _segment_counts(self) -> list[int]:
        counts = []
        for segment, count in zip(self.segments, self._counts):
            if count is None:
                total = count_records(segment.path, segment.compression)
                end = total if segment.stop is None else min(segment.stop, total)
                count = max(end - segment.start, 0)
            counts.append(count)
        return counts

    # ------------------------------------------------------------------ sizes

    @property
    def num_records(self) -> int | None:
        """Records per epoch when known (from the manifest, a shard's record range or a count)."""
        if any(count is None for count in self._counts):
            return None
        return sum(self._counts)  # type: ignore[arg-type]

    def batches_per_epoch(self) -> int | None:
        records = self.num_records
        if records is None:
            return None
        size = self.options.batch_size
        return records // size if self.options.drop_remainder else math.ceil(records / size)

    def __len__(self) -> int:
        per_epoch = self.batches_per_epoch()
        if per_epoch is None:
            raise TypeError("the number of batches is unknown: the files' record counts are not in a manifest")
        if self._epochs is None:
            if self._limit is None:
                raise TypeError("the dataset repeats forever")
            return self._limit
        total = per_epoch * self._epochs
        return total if self._limit is None else min(total, self._limit)

    # ------------------------------------------------------------------ position

    def _fingerprint(self) -> str:
        description = {
            "segments": [dataclasses.astuple(segment) for segment in self.segments],
            "features": sorted(self.features),
            "options": {name: getattr(self.options, name) for name in Options.order_fields + ("raw",)},
            "cycle": min(self.options.cycle_length, max(len(self.segments), 1)),
            "shard": self._shard_key,
        }
        return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered: pass it to ``load_state_dict`` to continue there."""
        if not self.options.deterministic:
            raise ConfigError(
                "state_dict() needs deterministic=True: with deterministic=False the order depends on timing "
                "and cannot be replayed"
            )
        with self._lock:
            return {"version": STATE_VERSION, "fingerprint": self._fingerprint(), "seed": self.options.seed, **self._position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a position saved by ``state_dict`` (same files, seed and order options)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"dataset state version {state.get('version')!r} is not {STATE_VERSION}")
        if state.get("fingerprint") != self._fingerprint() or state.get("seed") != self.options.seed:
            raise ConfigError(
                "this dataset state was saved by a dataset with other files, shard, seed or order options "
                "(batch_size, num_parallel_reads, block_length, shuffle_files, shuffle_buffer, drop_remainder, "
                "columns); open the dataset with the same arguments (and seed) to resume"
            )
        with self._lock:
            self._position = {key: int(state[key]) for key in ("epoch", "batch", "pass_start", "taken")}
            self._resume_pending = True

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            position = self._position
            if not self._resume_pending and (position["batch"] or position["taken"] or position["epoch"] != position["pass_start"]):
                fresh = position["epoch"] + (1 if position["batch"] else 0)
                self._position = {"epoch": fresh, "batch": 0, "pass_start": fresh, "taken": 0}
            self._resume_pending = False
            previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.close()  # one pass at a time: the workers serve a single consumer
        iterator = _PassIterator(self)
        self._iterator = weakref.ref(iterator)
        return iterator

    def close(self) -> None:
        """Stop the current pass and the reader workers (processes are reused between epochs until then)."""
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.close()
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _executor(self) -> str:
        if self.options.executor != "auto":
            return self.options.executor
        # Measured on the 1M-record table (see the README): processes win once there is enough data
        # to pay for their start-up (~1 s); they need POSIX file descriptor passing.
        big = _total_bytes(self.segments) > AUTO_PROCESSES_BYTES
        return "processes" if os.name == "posix" and self.options.num_workers > 1 and big else "threads"

    def _get_workers(self) -> ThreadWorkers | ProcessWorkers:
        if self._workers is None:
            plan = self._plan()
            kind = self._executor()
            count = min(self.options.num_workers, self._cycle())
            readahead = 2
            self._workers = (ProcessWorkers if kind == "processes" else ThreadWorkers)(plan, count, readahead)
            self.stats["executor"] = kind
            self.stats["workers"] = count
        return self._workers

    def _plan(self) -> ReadPlan:
        decoder = BlockDecoder(self.features, raw=self.options.raw)
        return ReadPlan(self.segments, decoder, self.options.block_length, self.options.skip_corrupt)

    def _cycle(self) -> int:
        return max(1, min(self.options.cycle_length, len(self.segments)))

    def _epoch_order(self, epoch: int) -> list[int]:
        """Segment indices in the order epoch ``epoch`` reads them (shuffled by (seed, epoch) if asked)."""
        if not self.options.shuffle_files:
            return list(range(len(self.segments)))
        return _rng(self.options.seed, epoch, "files").permutation(len(self.segments)).tolist()

    def _epoch_batches(self, epoch: int, skip: int = 0, cancel: threading.Event | None = None) -> Iterator[Block]:
        """The batches (with their record ids under ``__id__``) of epoch ``epoch``, from batch ``skip`` on."""
        if not self.segments:
            return
        run = _EpochRun(self, epoch)
        if skip:
            run.fast_forward(skip)
        batches = run.run(self._get_workers(), cancel)
        try:
            yield from batches
        finally:
            batches.close()


def _total_bytes(segments: Sequence[Segment]) -> int:
    total = 0
    for segment in {segment.path for segment in segments}:
        try:
            total += os.path.getsize(segment)
        except OSError:
            pass
    return total


def _rng(seed: int, epoch: int, purpose: str) -> np.random.Generator:
    stream = {"files": 0, "buffer": 1}[purpose]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


def _record_range_shard(
    segments: tuple[Segment, ...], counts: list[int], num_workers: int, index: int
) -> tuple[tuple[Segment, ...], tuple[int | None, ...]]:
    """Worker ``index``'s contiguous share of all records, as record ranges of the segments."""
    total = sum(counts)
    low, high = index * total // num_workers, (index + 1) * total // num_workers
    out: list[Segment] = []
    out_counts: list[int | None] = []
    base = 0
    for position, (segment, count) in enumerate(zip(segments, counts)):
        begin, end = max(low, base), min(high, base + count)
        last = index == num_workers - 1 and position == len(segments) - 1
        if begin < end or (last and segment.stop is None):
            start = segment.start + begin - base
            # The very last range stays open-ended, so records a count missed are still read once.
            stop = None if last and segment.stop is None else segment.start + end - base
            out.append(dataclasses.replace(segment, start=start, stop=stop))
            out_counts.append(max(end - begin, 0))
        base += count
    return tuple(out), tuple(out_counts)


@dataclasses.dataclass
class _Interleave:
    """The consumer's view of the interleave: live slots in turn order, whose turn it is, and how far each got."""

    slots: list[tuple[int, ...]]
    alive: list[int]
    pointer: int = 0
    progress: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def starts(self) -> list[SlotStart]:
        """Where each live slot continues, in turn order from the slot whose turn it is."""
        order = self.alive[self.pointer:] + self.alive[:self.pointer]
        out = []
        for slot in order:
            segments = self.slots[slot]
            if slot in self.progress:
                segment, record = self.progress[slot]
                position = segments.index(segment)
                out.append(SlotStart(slot, segments[position:], record))
            else:
                out.append(SlotStart(slot, segments, None))
        return out


class _EpochRun:
    """One epoch's interleave, shuffle buffer and batching, able to fast-forward without decoding."""

    def __init__(self, dataset: Dataset, epoch: int):
        self.dataset = dataset
        options = dataset.options
        self.options = options
        order = dataset._epoch_order(epoch)
        cycle = dataset._cycle()
        self.interleave = _Interleave([tuple(order[slot::cycle]) for slot in range(cycle)], list(range(cycle)))
        self.shuffling = options.shuffle_buffer > 1
        self.rng = _rng(options.seed, epoch, "buffer")
        self.buffer: ShufflePool | RowQueue = ShufflePool(options.shuffle_buffer, self.rng) if self.shuffling else RowQueue()
        self.threshold = max(options.shuffle_buffer, options.batch_size) if self.shuffling else options.batch_size
        self.draining = False

    def _consume(self, receive: Callable[[int | None], tuple[int, Any]], limit: int | None = None) -> Iterator[Block]:
        """Feed blocks into the buffer in interleave order and cut batches; stop after ``limit`` batches."""
        state = self.interleave
        size = self.options.batch_size
        emitted = 0
        ordered = self.options.deterministic
        while True:
            while self.buffer.size >= self.threshold and not self.draining:
                if limit is not None and emitted >= limit:
                    return
                yield self.buffer.pop(size)
                emitted += 1
            if not state.alive or self.draining:
                break
            wanted = state.alive[state.pointer]
            slot, message = receive(wanted if ordered else None)
            if message == END:
                position = state.alive.index(slot)
                state.alive.pop(position)
                if position < state.pointer:
                    state.pointer -= 1
                if state.pointer >= len(state.alive):
                    state.pointer = 0
                continue
            if ordered and slot != wanted:
                raise RuntimeError(f"interleave out of order: expected slot {wanted}, got {slot}")
            self.dataset.skipped.extend(message.skipped)
            if not len(message.ids):
                continue  # only news of skipped records: not a turn
            if not ordered:
                state.pointer = state.alive.index(slot)
            state.pointer = (state.pointer + 1) % len(state.alive)
            segment, record = split_ids(message.ids[-1:])
            state.progress[slot] = (int(segment[0]), int(record[0]) + 1)
            self.buffer.add(message.block if message.block is not None else {ID_KEY: Column(message.ids)})
        self.draining = True
        while self.buffer.size:
            if limit is not None and emitted >= limit:
                return
            if self.options.drop_remainder and self.buffer.size < size:
                return
            yield self.buffer.pop(size)
            emitted += 1

    def fast_forward(self, batches: int) -> None:
        """Replay the first ``batches`` batches from record ids only, then load the buffer's records."""
        plan = self.dataset._plan()
        cycle = len(self.interleave.slots)
        workers = min(self.options.num_workers, cycle)
        generators = [
            produce(plan, Job(tuple(start for start in self.interleave.starts() if start.slot % workers == number), False))
            for number in range(workers)
        ]

        def receive(slot: int | None) -> tuple[int, Any]:
            assert slot is not None
            return next(generators[slot % workers])

        skipped_before = len(self.dataset.skipped)
        done = sum(1 for _ in self._consume(receive, limit=batches))
        del self.dataset.skipped[skipped_before:]  # they are counted again when the records are read for real
        if done < batches:
            raise ConfigError(f"the saved position is {batches} batches into the epoch, but the epoch has only {done}")
        self._load_buffer(plan)

    def _load_buffer(self, plan: ReadPlan) -> None:
        """Swap the id-only buffer for one holding the same records decoded, in the same slots."""
        if not self.buffer.size:
            return
        ids = self.buffer.snapshot()[ID_KEY].leaf  # the id-only buffer holds nothing else
        segments, records = split_ids(ids)
        pieces: list[Block] = []
        positions: list[np.ndarray] = []
        for segment_index in np.unique(segments).tolist():
            where = np.flatnonzero(segments == segment_index)
            wanted = records[where]
            first, last = int(wanted.min()), int(wanted.max())
            blocks: list[Block] = []
            for item in read_segment(
                plan.segments[segment_index], segment_index, plan.block_length, plan.decoder,
                skip_corrupt=plan.skip_corrupt, first=first,
            ):
                if item.block is not None:
                    blocks.append(item.block)
                if len(item.ids) and int(split_ids(item.ids[-1:])[1][0]) >= last:
                    break
            pieces.append(take_block(concat_blocks(blocks), wanted - first))
            positions.append(where)
        order = np.argsort(np.concatenate(positions), kind="stable")
        restored = take_block(concat_blocks(pieces), order)
        self.buffer = ShufflePool(self.options.shuffle_buffer, self.rng) if self.shuffling else RowQueue()
        self.buffer.add(restored)

    def run(self, workers: ThreadWorkers | ProcessWorkers, cancel: threading.Event | None = None) -> Iterator[Block]:
        """The rest of the epoch, read and decoded by ``workers``."""
        count = workers.num_workers
        starts = self.interleave.starts()
        jobs = [Job(tuple(start for start in starts if start.slot % count == number), True) for number in range(count)]
        ordered = self.options.deterministic
        workers.start(jobs, ordered)

        def receive(slot: int | None) -> tuple[int, Any]:
            while True:
                _, (got, message) = workers.get(None if slot is None else slot % count, cancel)
                if isinstance(message, tuple) and message[0] == ERROR:
                    raise message[1]
                if message == DONE:
                    continue
                return got, message

        batches = self._consume(receive)
        try:
            yield from batches
        finally:
            batches.close()
            workers.stop()


class _PassIterator:
    """One pass over a dataset: batches produced by a background thread, ``prefetch`` of them ahead."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        options = dataset.options
        with dataset._lock:
            position = dict(dataset._position)
        self._queue: queue.Queue = queue.Queue(max(1, options.prefetch))
        self._stop = threading.Event()
        self._finished = False
        self._tuner = _Tuner(dataset, self._queue) if options.autotune else None
        self._layout = dense_layout(dataset.features)
        self._thread = threading.Thread(target=self._produce, args=(position,), daemon=True, name="tfrbeam-dataset")
        self._thread.start()

    def _produce(self, position: dict[str, int]) -> None:
        dataset = self.dataset
        try:
            epoch, batch, taken = position["epoch"], position["batch"], position["taken"]
            epochs, limit = dataset._epochs, dataset._limit
            while (epochs is None or epoch < position["pass_start"] + epochs) and (limit is None or taken < limit):
                for block in dataset._epoch_batches(epoch, skip=batch, cancel=self._stop):
                    if limit is not None and taken >= limit:
                        break
                    output = self._convert(block)
                    batch += 1
                    taken += 1
                    if not self._put(("batch", output, {"epoch": epoch, "batch": batch, "taken": taken})):
                        return
                    if self._stop.is_set():
                        return
                else:
                    epoch, batch = epoch + 1, 0
                    self._put(("epoch", None, {"epoch": epoch, "batch": 0, "taken": taken}))
                    if not dataset.segments:
                        break
                    continue
                break
            self._put(("end", None, None))
        except Cancelled:
            return
        except BaseException as exc:
            self._put(("error", exc, None))

    def _convert(self, block: Block) -> Any:
        features = self.dataset.features
        block = self._layout.unpack(block)
        if self.dataset.options.output == "arrow":
            return to_arrow(block, features)
        return to_numpy(block, features, self.dataset.options.padded)

    def _put(self, item: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> _PassIterator:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        while True:
            started = time.perf_counter()
            kind, payload, position = self._queue.get()
            if self._tuner is not None:
                self._tuner.observe(time.perf_counter() - started)
            if kind == "batch":
                self._advance(position)
                return payload
            if kind == "epoch":
                self._advance(position)
                continue
            self._finish(kind == "end")
            if kind == "error":
                raise payload
            raise StopIteration

    def _advance(self, position: dict[str, int]) -> None:
        with self.dataset._lock:
            self.dataset._position.update(position)

    def _finish(self, completed: bool) -> None:
        self._finished = True
        self.close()
        if completed:
            with self.dataset._lock:
                current = self.dataset._position
                next_epoch = current["epoch"] + (1 if current["batch"] else 0)
                self.dataset._position = {"epoch": next_epoch, "batch": 0, "pass_start": next_epoch, "taken": 0}

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _Tuner:
    """Autotune: grow the prefetch depth while the caller waits for batches; give workers back when it never does.

    Every window of about a second it looks at the share of time the caller spent waiting. Over
    10 %: the readers are the bottleneck, so allow every worker to decode and double the prefetch
    depth (up to 64). Under 1 % with the prefetch queue full: the caller is the bottleneck, so one
    fewer worker decodes at a time (down to 1), leaving a core to the training step.
    """

    WINDOW = 1.0

    def __init__(self, dataset: Dataset, prefetch: queue.Queue, now: float | None = None):
        self.dataset = dataset
        self.prefetch = prefetch
        self.window_start = time.perf_counter() if now is None else now
        self.waited = 0.0

    def observe(self, waited: float, now: float | None = None) -> None:
        """Account ``waited`` seconds the caller spent blocked on the next batch; adjust at each window's end."""
        self.waited += waited
        now = time.perf_counter() if now is None else now
        elapsed = now - self.window_start
        if elapsed < self.WINDOW:
            return
        share = self.waited / elapsed
        self.window_start, self.waited = now, 0.0
        workers = self.dataset._workers
        if workers is None:
            return
        limit = workers.limit
        if share > 0.10:
            if limit.allowed < workers.num_workers:
                limit.set_allowed(limit.allowed + 1)
            elif self.prefetch.maxsize < MAX_PREFETCH:
                with self.prefetch.mutex:
                    self.prefetch.maxsize *= 2
                    self.prefetch.not_full.notify_all()
        elif share < 0.01 and self.prefetch.full() and limit.allowed > 1:
            limit.set_allowed(limit.allowed - 1)
        self.dataset.stats.update(workers_allowed=limit.allowed, prefetch=self.prefetch.maxsize)
        _LOG.debug("autotune: waited %.1f%%, workers allowed %d, prefetch %d", 100 * share, limit.allowed, self.prefetch.maxsize)
