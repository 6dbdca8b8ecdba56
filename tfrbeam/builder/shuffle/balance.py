"""Exactly balanced shards: per-bucket record counts combined into one histogram, and the plan made from it
(each split's shard count and every bucket's first global rank).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import apache_beam as beam
import numpy as np

from tfrbeam.base.wording import counted
from tfrbeam.builder.shuffle.coders import PieceCoder
from tfrbeam.builder.shuffle.keys import MIN_BUCKET_BITS
from tfrbeam.builder.shuffle.pieces import Piece
from tfrbeam.builder.shuffle.stores import PieceStore

__all__ = ["ORDERED_BLOCK_ROWS", "BucketCounts", "PlanShards", "ShardPlan", "ShardingSpec", "SplitPlan", "crossing_bytes",
           "histogram_of", "make_plan", "record_buckets"]

_LOG = logging.getLogger(__name__)

# Ordered mode: one histogram bucket per this many consecutive rows of a piece and split.
ORDERED_BLOCK_ROWS = 4096



@dataclasses.dataclass(frozen=True)
class ShardingSpec:
    """What the shuffle must produce: splits, shard counts (or a byte cap), bucketing and file format."""

    splits: tuple[str, ...]
    num_shards: tuple[int | None, ...]  # per split; None everywhere when max_bytes_per_shard is set
    max_bytes_per_shard: int | None
    ordered: bool  # shuffle disabled: keys are input positions, buckets are row blocks of a piece
    bucket_bits: int = MIN_BUCKET_BITS
    compression: str | None = None
    write_index: bool = True

    def __post_init__(self) -> None:
        if len(self.num_shards) != len(self.splits):
            raise ValueError("num_shards needs one entry per split")
        if self.max_bytes_per_shard is None and any(count is None for count in self.num_shards):
            raise ValueError("every split needs a shard count when max_bytes_per_shard is not set")


@dataclasses.dataclass(frozen=True, eq=False)
class SplitPlan:
    """One split's layout: its buckets (sorted ids, first global rank, record count) and shard count."""

    name: str
    num_examples: int
    num_bytes: int  # framed, uncompressed
    num_shards: int
    bucket_ids: np.ndarray
    bucket_starts: np.ndarray
    bucket_counts: np.ndarray

    def shard_start(self, shard: int) -> int:
        """First global rank of ``shard``: ceil(shard * n / k)."""
        return -(-shard * self.num_examples // self.num_shards)

    def shard_of(self, ranks: np.ndarray) -> np.ndarray:
        return (np.asarray(ranks, dtype=np.int64) * self.num_shards) // max(self.num_examples, 1)

    def bucket_positions(self, bucket_ids: np.ndarray) -> np.ndarray:
        positions = np.searchsorted(self.bucket_ids, bucket_ids)
        if len(bucket_ids) and (positions.max() >= len(self.bucket_ids) or np.any(self.bucket_ids[positions] != bucket_ids)):
            raise RuntimeError(
                f"split {self.name}: a record's bucket is missing from the counts; the input changed between the "
                "two reads of one pipeline run (recompute gave other records)"
            )
        return positions


@dataclasses.dataclass(frozen=True, eq=False)
class ShardPlan:
    """The whole layout, computed once from the bucket counts and read by routers and writers."""

    spec: ShardingSpec
    splits: tuple[SplitPlan, ...]
    piece_bytes: int = 0  # the prepared pieces as they cross the runner (PieceCoder's size), all pieces together


def record_buckets(records: Piece, spec: ShardingSpec) -> np.ndarray:
    """The bucket id of each record of a sorted piece: top key bits (hash mode) or its row block's first key (ordered)."""
    if not spec.ordered:
        return records.key >> np.uint64(64 - spec.bucket_bits)
    position = np.arange(len(records))
    within = position - np.searchsorted(records.split, records.split, side="left")
    return records.key[position - within % ORDERED_BLOCK_ROWS]


def _histogram(records: Piece, spec: ShardingSpec) -> tuple[np.ndarray, ...]:
    """Per (split, bucket): record count, framed bytes and largest framed record."""
    if not len(records):
        return _empty_histogram()
    buckets = record_buckets(records, spec)
    framed = records.framed_lengths
    return _reduce(records.split.astype(np.uint16), buckets, np.ones(len(records), np.int64), framed, framed)


def histogram_of(split: np.ndarray, key: np.ndarray, framed: np.ndarray, bucket_bits: int) -> tuple[np.ndarray, ...]:
    """``_histogram``'s counts of records in hash mode, given their splits, keys and framed lengths in any order."""
    if not len(key):
        return _empty_histogram()
    # (split, bucket) as one integer (a bucket has at most 24 bits): one argsort, not a lexsort of two keys.
    combined = (np.asarray(split, dtype=np.uint64) << np.uint64(48)) | (np.asarray(key, dtype=np.uint64)
                                                                       >> np.uint64(64 - bucket_bits))
    order = np.argsort(combined)
    combined, framed = combined[order], np.asarray(framed)[order]
    starts = np.flatnonzero(np.r_[True, combined[1:] != combined[:-1]])
    return ((combined[starts] >> np.uint64(48)).astype(np.uint16), combined[starts] & np.uint64((1 << 48) - 1),
            np.diff(np.r_[starts, len(combined)]).astype(np.int64), np.add.reduceat(framed, starts),
            np.maximum.reduceat(framed, starts))


def crossing_bytes(piece: Piece, store: PieceStore | None) -> int:
    """What a prepared piece takes as it leaves the stage that prepared it (``PieceCoder``'s size), for the manifest's
    ``shuffled_bytes``. A memory store's piece stays in this process (it would cross as its run's path and name): not
    counted, so the figure does not depend on where the run stages. Others cross as their store makes them."""
    if piece.ref.run:
        return 0
    return PieceCoder().estimate_size(store.crossing(piece) if store is not None else piece)


def _empty_histogram() -> tuple[np.ndarray, ...]:
    return (np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _reduce(split, bucket, count, size, largest) -> tuple[np.ndarray, ...]:
    if not len(split):
        return _empty_histogram()
    order = np.lexsort((bucket, split))
    split, bucket, count, size, largest = split[order], bucket[order], count[order], size[order], largest[order]
    starts = np.flatnonzero(np.r_[True, (split[1:] != split[:-1]) | (bucket[1:] != bucket[:-1])])
    return (
        split[starts], bucket[starts], np.add.reduceat(count, starts), np.add.reduceat(size, starts),
        np.maximum.reduceat(largest, starts),
    )


class BucketCounts(beam.CombineFn):
    """Combines per-piece histograms into one; the accumulator holds arrays, never records."""

    def __init__(self, spec: ShardingSpec):
        self._spec = spec

    def create_accumulator(self):
        return [_empty_histogram()]

    def add_input(self, accumulator, records: Piece):
        accumulator.append(_histogram(records, self._spec))
        return self._compact(accumulator) if len(accumulator) > 64 else accumulator

    def merge_accumulators(self, accumulators):
        merged = [part for accumulator in accumulators for part in accumulator]
        return self._compact(merged)

    def extract_output(self, accumulator):
        return self._compact(accumulator)[0]

    @staticmethod
    def _compact(accumulator):
        return [BucketCounts.combined(accumulator)]

    @staticmethod
    def combined(histograms: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
        """Histograms added up into one, sorted by (split, bucket)."""
        columns = [np.concatenate([part[i] for part in histograms]) for i in range(5)]
        return _reduce(*columns)


class PlanShards(BucketCounts):
    """The bucket counts, then the plan made from them, in one combine (a Map after it would be one more stage).

    It takes the prepared pieces (ordered builds) or the tally of copies' counts of every key range (shuffled builds,
    ``copies.RangeCounts``: the buckets of the records' final keys). It also sums what the pieces take as they leave
    the stage that prepares them (``crossing_bytes``): the first of the shuffle's two crossings of the runner (inline
    and spill stores), for the manifest's ``run.shuffled_bytes``.
    """

    def __init__(self, spec: ShardingSpec, store: PieceStore | None = None):
        super().__init__(spec)
        self._store = store

    def create_accumulator(self):
        return super().create_accumulator(), 0

    def add_input(self, accumulator, records):
        counts, piece_bytes = accumulator
        if not isinstance(records, Piece):  # a key range's counts (copies.RangeCounts)
            counts.append(records.histogram)
            return (self._compact(counts) if len(counts) > 64 else counts), piece_bytes + records.piece_bytes
        return super().add_input(counts, records), piece_bytes + crossing_bytes(records, self._store)

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return (super().merge_accumulators([counts for counts, _ in accumulators]),
                sum(piece_bytes for _, piece_bytes in accumulators))

    def extract_output(self, accumulator) -> ShardPlan:
        counts, piece_bytes = accumulator
        return dataclasses.replace(make_plan(super().extract_output(counts), self._spec), piece_bytes=piece_bytes)


def make_plan(histogram: tuple[np.ndarray, ...], spec: ShardingSpec) -> ShardPlan:
    """Shard counts and bucket ranks of every split from the combined counts."""
    split_ids, bucket_ids, counts, sizes, largest = histogram
    plans = []
    for index, name in enumerate(spec.splits):
        rows = split_ids == index
        ids, split_counts = bucket_ids[rows], counts[rows]
        starts = np.zeros(len(split_counts), dtype=np.int64)
        np.cumsum(split_counts[:-1], out=starts[1:])
        total = int(split_counts.sum())
        total_bytes = int(sizes[rows].sum())
        num_shards = spec.num_shards[index]
        if num_shards is None:
            num_shards = _shards_for_byte_cap(name, starts, split_counts, sizes[rows], largest[rows], spec.max_bytes_per_shard)
        plans.append(SplitPlan(name, total, total_bytes, int(num_shards), ids, starts, split_counts))
        _LOG.info("split %s: %s, %d bytes, %s", name, counted(total, "example"), total_bytes, counted(num_shards, "shard"))
    return ShardPlan(spec, tuple(plans))


def _shards_for_byte_cap(name, starts, counts, sizes, largest, cap) -> int:
    """The smallest shard count (searched upward) whose every shard provably stays within ``cap`` bytes.

    A shard's bytes are bounded by the bytes of the buckets its rank range touches, and by its
    record count times the largest record in them; shards are balanced by count.
    """
    total = int(counts.sum())
    if total == 0:
        return 1
    if int(largest.max()) > cap:
        raise ValueError(
            f"split {name}: one record is {int(largest.max())} bytes framed, larger than "
            f"output.max_bytes_per_shard={cap}; raise the cap"
        )
    byte_starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=byte_starts[1:])
    shards = max(1, math.ceil(int(sizes.sum()) / cap))
    while shards < total:
        lows = -(-np.arange(shards + 1, dtype=np.int64) * total // shards)
        first = np.searchsorted(starts, lows[:-1], side="right") - 1
        last = np.searchsorted(starts, lows[1:] - 1, side="right") - 1
        bucket_bound = byte_starts[last + 1] - byte_starts[first]
        largest_in = np.array([int(largest[a:b + 1].max()) for a, b in zip(first.tolist(), last.tolist())])
        count_bound = (lows[1:] - lows[:-1]) * largest_in
        if np.all(np.minimum(bucket_bound, count_bound) <= cap):
            return shards
        shards += max(1, shards // 100)
    return total
