"""One epoch of a dataset: the interleave of its segments, the shuffle buffer and the batches.

Every choice is a function of (seed, epoch) and the record counts, never of timing, so an
epoch can be replayed from record ids alone (``EpochRun.fast_forward``) to resume exactly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from tfrbeam.dataset.columns import Block, Column, RowQueue, ShufflePool, concat_blocks, take_block
from tfrbeam.dataset.options import Options
from tfrbeam.dataset.reader import ID_KEY, Segment, read_segment, split_ids
from tfrbeam.dataset.workers import DONE, END, ERROR, Job, ProcessWorkers, ReadPlan, SlotStart, ThreadWorkers, produce
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import SkippedRegion


def epoch_rng(seed: int, epoch: int, purpose: str) -> np.random.Generator:
    stream = {"files": 0, "buffer": 1}[purpose]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


def record_range_shard(
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


@dataclasses.dataclass(frozen=True)
class EpochSettings:
    """What every epoch of a dataset reads and how: the read plan, the interleave width and the order options.

    The Dataset hands one to each ``EpochRun``, so an epoch never reaches into the Dataset.
    """

    plan: ReadPlan
    options: Options
    cycle: int  # segments read at once (slots of the interleave)

    def order(self, epoch: int) -> list[int]:
        """Segment indices in the order epoch ``epoch`` reads them (shuffled by (seed, epoch) if asked)."""
        count = len(self.plan.segments)
        if not self.options.shuffle_files:
            return list(range(count))
        return epoch_rng(self.options.seed, epoch, "files").permutation(count).tolist()


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


class EpochRun:
    """One epoch's interleave, shuffle buffer and batching, able to fast-forward without decoding."""

    def __init__(self, settings: EpochSettings, epoch: int, skipped: list[SkippedRegion]):
        self.settings = settings
        self.skipped = skipped  # the dataset's list of damaged regions passed over, extended as they are read
        options = settings.options
        self.options = options
        order = settings.order(epoch)
        cycle = settings.cycle
        self.interleave = _Interleave([tuple(order[slot::cycle]) for slot in range(cycle)], list(range(cycle)))
        self.shuffling = options.shuffle_buffer > 1
        self.rng = epoch_rng(options.seed, epoch, "buffer")
        self.buffer: ShufflePool | RowQueue = ShufflePool(options.shuffle_buffer, self.rng) if self.shuffling else RowQueue()
        self.threshold = max(options.shuffle_buffer, options.batch_size) if self.shuffling else options.batch_size
        self.draining = False

    def _consume(self, receive: Callable[[int | None], tuple[int, Any]],
                 limit: int | None = None) -> Generator[Block, None, None]:
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
            self.skipped.extend(message.skipped)
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
        plan = self.settings.plan
        cycle = len(self.interleave.slots)
        workers = min(self.options.num_workers, cycle)
        generators = [
            produce(plan, Job(tuple(start for start in self.interleave.starts() if start.slot % workers == number), False))
            for number in range(workers)
        ]

        def receive(slot: int | None) -> tuple[int, Any]:
            assert slot is not None
            return next(generators[slot % workers])

        skipped_before = len(self.skipped)
        done = sum(1 for _ in self._consume(receive, limit=batches))
        del self.skipped[skipped_before:]  # they are counted again when the records are read for real
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

    def run(self, workers: ThreadWorkers | ProcessWorkers,
            cancel: threading.Event | None = None) -> Generator[Block, None, None]:
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
                assert got is not None  # only DONE messages have no slot
                return got, message

        batches = self._consume(receive)
        try:
            yield from batches
        finally:
            batches.close()
            workers.stop()
