"""Pieces put in order and stored, then cut by the shards their records' ranks fall in: one slice per (piece, shard)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from tfrbeam.builder.shuffle.balance import ORDERED_BLOCK_ROWS, ShardPlan, record_buckets
from tfrbeam.builder.shuffle.pieces import KeyedRecords, Piece
from tfrbeam.builder.shuffle.stores import PieceStore

__all__ = ["PIECE_GROUPS", "SHARD_KEY_BITS", "GroupPieces", "PreparePieces", "RouteGroupedPieces", "empty_shards",
           "empty_shards_if_no_records", "every_shard_key", "route_piece", "shard_key_of", "shard_ranges",
           "split_and_shard", "with_final_keys"]

SHARD_KEY_BITS = 32

# The pieces reach the routing stage in this many groups at most (keyed by their first sort key):
# enough for a distributed runner to route in parallel, few enough that the empty slices each group
# sends to every shard (so every shard is written) stay negligible.
PIECE_GROUPS = 1024



def shard_key_of(split: int, shard: int) -> int:
    return (split << SHARD_KEY_BITS) | shard



def split_and_shard(shard_key: int) -> tuple[int, int]:
    """The (split index, shard) a shard key stands for."""
    return shard_key >> SHARD_KEY_BITS, shard_key & ((1 << SHARD_KEY_BITS) - 1)


class PreparePieces(beam.DoFn):
    """Puts each piece's records in (split, key) order, so that every shard's part is one range, and stores them.

    For a store with a ``run_bytes``, the pieces of a bundle are gathered and kept as runs of about
    that size: a shard writer then reads one part per run, not one per piece.
    """

    def __init__(self, store: PieceStore):
        self._store = store

    def setup(self) -> None:
        self._store.open()

    def start_bundle(self) -> None:
        self._gathered: list[KeyedRecords] = []
        self._gathered_bytes = 0

    def process(self, records: KeyedRecords) -> Iterator[Piece]:
        if not len(records):
            return
        if not self._store.run_bytes:
            yield self._store.add(records)
            return
        self._gathered.append(records)
        self._gathered_bytes += records.num_bytes
        if self._gathered_bytes >= self._store.run_bytes:
            yield self._run()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._gathered:
            yield GlobalWindows.windowed_value(self._run())
        self._store.flush()

    def _run(self) -> Piece:
        gathered, self._gathered, self._gathered_bytes = self._gathered, [], 0
        return self._store.add(gathered[0]) if len(gathered) == 1 else self._store.add_run(gathered)

    def teardown(self) -> None:
        self._store.close()


def route_piece(piece: Piece, plan: ShardPlan, store: PieceStore) -> list[tuple[int, Piece]]:
    """A sorted piece's records cut by the shard(s) its buckets' rank ranges overlap: one slice per shard.

    Tells the store how many slices there are, so a piece it holds is dropped after the last one is written.
    """
    routed = [(shard_key, store.route_slice(piece, low, high)) for shard_key, low, high in shard_ranges(piece, plan)]
    store.routed(piece, len(routed))
    return routed


def shard_ranges(piece: Piece, plan: ShardPlan) -> list[tuple[int, int, int]]:
    """(shard key, first record, end record) of each shard a sorted piece has records for: the bounds of its slices."""
    if not len(piece):
        return []
    buckets = record_buckets(piece, plan.spec)
    split_bounds = np.searchsorted(piece.split, np.arange(len(plan.splits) + 1))
    routed: list[tuple[int, int, int]] = []
    for index, split_plan in enumerate(plan.splits):
        begin, end = int(split_bounds[index]), int(split_bounds[index + 1])
        if begin == end:
            continue
        positions = split_plan.bucket_positions(buckets[begin:end])
        starts = split_plan.bucket_starts[positions]
        if plan.spec.ordered:
            # A record's rank is its bucket's first rank plus its position within its row block.
            first = last = split_plan.shard_of(starts + np.arange(end - begin, dtype=np.int64) % ORDERED_BLOCK_ROWS)
        else:
            first = split_plan.shard_of(starts)
            last = split_plan.shard_of(starts + split_plan.bucket_counts[positions] - 1)
        # Both are non-decreasing along the sorted records, so each shard's records are one range.
        for shard in range(int(first[0]), int(last[-1]) + 1):
            low = begin + int(np.searchsorted(last, shard, side="left"))
            high = begin + int(np.searchsorted(first, shard, side="right"))
            if high > low:
                routed.append((shard_key_of(index, shard), low, high))
    return routed


class GroupPieces(beam.PTransform):
    """PCollection[Piece] -> PCollection[(group, Iterable[Piece])]: the pieces through a GroupByKey, in PIECE_GROUPS groups.

    Why a GroupByKey and not the plain fusion break the routing stage's side input makes anyway:
    Beam's FnApiRunner (the DirectRunner's engine and the embedded portable job server) sends a
    materialised stage input to an SDK worker process chunk by chunk into a data stream that a
    timer thread flushes every second (``worker_handlers.DATA_BUFFER_TIME_LIMIT_MS``); a chunk
    written between that flush's ``get()`` and ``_clear()`` is dropped (``data_plane.py``,
    ``SizeBasedBufferingClosableOutputStream.flush``). An input that takes over a second to write
    (about 1 GB of pieces, 3M rows) lost records. A grouped input is written in one piece, which
    that race cannot split; on distributed runners the fusion break was a shuffle already. Each piece
    crosses as ``store.crossing`` makes it (a spill store's, without its keys).
    """

    def __init__(self, store: PieceStore):
        super().__init__()
        self._store = store

    def expand(self, pieces):
        return (
            pieces
            | "KeyByGroup" >> beam.Map(_keyed_by_group, self._store).with_output_types(tuple[int, Piece])
            | "Group" >> beam.GroupByKey()
        )


def _keyed_by_group(piece: Piece, store: PieceStore) -> tuple[int, Piece]:
    return int(piece.key[0]) % PIECE_GROUPS, store.crossing(piece)


def with_final_keys(piece: Piece, store: PieceStore, moved, movers: Collection[str]) -> Piece:
    """``piece`` or, if the tally of copies moved some of its records (its name is in ``movers``; ``moved``: their
    ``MovedCopies`` by piece name, a side input), what the store made of it in the order of their new keys
    (``PieceStore.rekeyed``), as the store keeps it (its keys perhaps on disk: ``with_keys`` reads them).

    ``moved`` is asked only for the pieces in ``movers``: on the local runners each question costs milliseconds.
    """
    return store.rekeyed(piece, moved) if piece.ref.location in movers else piece


class RouteGroupedPieces(beam.DoFn):
    """Routes each grouped piece (see route_piece), its moved copies given their keys first, and sends an empty slice
    to every shard the group sent none, so every shard is written."""

    def __init__(self, store: PieceStore):
        self._store = store

    def process(self, group: tuple[int, Iterable[Piece]], plan: ShardPlan, moved=None,
                movers: Iterable[str] = ()) -> Iterator[tuple[int, Piece]]:
        reached: set[int] = set()
        movers = set(movers)
        for piece in group[1]:
            keyed = self._store.with_keys(with_final_keys(piece, self._store, moved, movers))
            for shard_key, part in route_piece(keyed, plan, self._store):
                reached.add(shard_key)
                yield shard_key, part
        for shard_key, empty in empty_shards(plan):
            if shard_key not in reached:
                yield shard_key, empty


def empty_shards_if_no_records(plan: ShardPlan) -> Iterator[tuple[int, list[Piece]]]:
    """Every shard's key with no slices when the plan has no records (no group reaches the routing stage then)."""
    if not any(split.num_examples for split in plan.splits):
        for key in every_shard_key(plan):
            yield key, []


def every_shard_key(plan: ShardPlan) -> Iterator[int]:
    """Every shard's key, so that every shard (even one with no records) is written."""
    for index, split_plan in enumerate(plan.splits):
        for shard in range(split_plan.num_shards):
            yield shard_key_of(index, shard)


def empty_shards(plan: ShardPlan) -> Iterator[tuple[int, Piece]]:
    """One empty element per shard, so every shard (even one with no records) is written."""
    for key in every_shard_key(plan):
        yield key, Piece.empty()
