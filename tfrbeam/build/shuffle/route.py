"""Pieces put in order and stored, then cut by the shards their records' ranks fall in: one slice per (piece, shard)."""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from tfrbeam.build.shuffle.balance import ORDERED_BLOCK_ROWS, ShardPlan, record_buckets
from tfrbeam.build.shuffle.pieces import KeyedRecords, Piece
from tfrbeam.build.shuffle.stores import PieceStore

__all__ = ["SHARD_KEY_BITS", "PreparePieces", "RouteToShards", "empty_shards", "every_shard_key", "route_piece",
           "shard_key_of", "split_and_shard"]

SHARD_KEY_BITS = 32



def shard_key_of(split: int, shard: int) -> int:
    return (split << SHARD_KEY_BITS) | shard



def split_and_shard(shard_key: int) -> tuple[int, int]:
    """The (split index, shard) a shard key stands for."""
    return shard_key >> SHARD_KEY_BITS, shard_key & ((1 << SHARD_KEY_BITS) - 1)


class PreparePieces(beam.DoFn):
    """Puts each piece's records in (split, key) order, so that every shard's part is one range, and stores them."""

    def __init__(self, store: PieceStore):
        self._store = store

    def setup(self) -> None:
        self._store.open()

    def process(self, records: KeyedRecords) -> Iterator[Piece]:
        if not len(records):
            return
        yield self._store.add(records)

    def finish_bundle(self) -> None:
        self._store.flush()

    def teardown(self) -> None:
        self._store.close()


def route_piece(piece: Piece, plan: ShardPlan, store: PieceStore) -> list[tuple[int, Piece]]:
    """A sorted piece's records cut by the shard(s) its buckets' rank ranges overlap: one slice per shard.

    Tells the store how many slices there are, so a piece it holds is dropped after the last one is written.
    """
    if not len(piece):
        return []
    buckets = record_buckets(piece, plan.spec)
    split_bounds = np.searchsorted(piece.split, np.arange(len(plan.splits) + 1))
    routed: list[tuple[int, Piece]] = []
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
                routed.append((shard_key_of(index, shard), piece.slice(low, high)))
    store.routed(piece, len(routed))
    return routed


class RouteToShards(beam.DoFn):
    """Sends each sorted piece's records to the shard(s) they belong to, one slice per shard (see route_piece)."""

    def __init__(self, store: PieceStore):
        self._store = store

    def process(self, piece: Piece, plan: ShardPlan) -> Iterator[tuple[int, Piece]]:
        yield from route_piece(piece, plan, self._store)


def every_shard_key(plan: ShardPlan) -> Iterator[int]:
    """Every shard's key, so that every shard (even one with no records) is written."""
    for index, split_plan in enumerate(plan.splits):
        for shard in range(split_plan.num_shards):
            yield shard_key_of(index, shard)


def empty_shards(plan: ShardPlan) -> Iterator[tuple[int, Piece]]:
    """One empty element per shard, so every shard (even one with no records) is written."""
    for key in every_shard_key(plan):
        yield key, Piece.empty()
