"""Copies of one record spread as a uniform permutation spreads them: the tally of copies, their keys and the counts
the shard plan is made from.

A record's sort key comes from its bytes alone, so all copies of a record would share one key and
sit next to each other. Copies are indistinguishable, so numbering them changes no byte: the k-th
copy (k = 0..n-1) of a record in a split gets ``occurrence_keys(key, k)`` (copy 0 keeps the key),
whichever of the n it is. The tally finds every record's copies across all pieces: each prepared
piece is cut by the top ``range_bits`` bits of its keys (``key_range_bounds``) and each key range
is tallied in one place (``TallyCopies``, a GroupByKey by range). Copies are records with equal
split, key, frame length and CRC32C; each piece gets a disjoint range of their numbers, and the
records whose number is not 0 get their new keys (``MovedCopies``, a side input of the stage that
routes the pieces, which puts those pieces in order again: ``PieceStore.rekeyed``).

What crosses the runner to the tally is a piece's name (memory store), a record range of its
spilled keys file (spill store) or its keys and footers (inline store): never frames. The tally
also counts every record's bucket under its final key, so the shard plan is made from its counts
(``RangeCounts``). A dataset without copies pays one sort of its keys and moves nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from tfrbeam.builder.shuffle.balance import BucketCounts, ShardingSpec, crossing_bytes, histogram_of
from tfrbeam.builder.shuffle.keys import MIN_BUCKET_BITS, key_range_bounds, occurrence_keys
from tfrbeam.builder.shuffle.pieces import MovedCopies, Piece
from tfrbeam.builder.shuffle.stores import PieceStore

__all__ = ["MOVED", "RangeCounts", "TallyCopies", "range_bits_for", "tally_copies"]

MOVED = "moved"
# Key ranges tallied apart: at least 16 (parallel enough on a laptop), about one per shard beyond, at most 256 (each
# piece sends one part per range; at a billion records a range holds some 4M).
_MIN_RANGE_BITS, _MAX_RANGE_BITS = 4, 8


def range_bits_for(spec: ShardingSpec) -> int:
    """The key ranges' bits: the buckets' less 6 (about 64 buckets a shard), within [4, 8]."""
    return min(_MAX_RANGE_BITS, max(_MIN_RANGE_BITS, spec.bucket_bits - 6))


@dataclasses.dataclass(frozen=True, eq=False)
class RangeCounts:
    """One key range's records counted per (split, bucket) under their final keys (``balance.histogram_of``), and the
    bytes its pieces took as they left the stage that prepared them (counted in one range)."""

    histogram: tuple[np.ndarray, ...]
    piece_bytes: int = 0


def tally_copies(parts: Iterable[tuple[str, int, Piece]], bucket_bits: int) -> tuple[RangeCounts, list[MovedCopies]]:
    """The counts and moved copies of one key range from its records: (piece name, first record, part with keys and
    footers) for every part of every piece in the range, each part's records of one split and sorted by key.

    Each group of copies is numbered in the order of (piece name, place in piece): any order gives
    the same bytes (copies are identical), this one is the same however often the range is tallied.
    """
    ordered = sorted(parts, key=lambda part: (part[0], part[1]))
    names = sorted({name for name, _, _ in ordered})
    pieces = [part for _, _, part in ordered]
    if not sum(map(len, pieces)):
        return RangeCounts(_empty_counts()), []
    split = np.concatenate([part.split for part in pieces]).astype(np.uint16, copy=False)
    key = np.concatenate([part.key for part in pieces]).astype(np.uint64, copy=False)
    framed = np.concatenate([part.framed_lengths for part in pieces])
    part_of = np.repeat(np.arange(len(pieces)), [len(part) for part in pieces])
    sorted_key = np.sort(key, kind="stable")  # a merge of the parts' sorted runs
    if not np.any(sorted_key[1:] == sorted_key[:-1]):  # no key twice: nothing to number (the common case)
        return RangeCounts(_sorted_runs_counts(split, key, framed, part_of, bucket_bits)), []
    footers = np.concatenate([_footers(name, part) for name, _, part in ordered])
    moved, occurrence = _numbered_copies(np.argsort(key, kind="stable"), split, key, framed, footers)
    stay = np.ones(len(key), dtype=bool)
    stay[moved] = False
    moved_keys = occurrence_keys(key[moved], occurrence)
    counts = BucketCounts.combined([_sorted_runs_counts(split[stay], key[stay], framed[stay], part_of[stay], bucket_bits),
                               histogram_of(split[moved], moved_keys, framed[moved], bucket_bits)])
    name_index = {name: index for index, name in enumerate(names)}
    unit = np.repeat([name_index[name] for name, _, _ in ordered], [len(part) for part in pieces])[moved]
    position = np.concatenate([first + np.arange(len(part), dtype=np.int64) for _, first, part in ordered])[moved]
    by_unit = np.argsort(unit, kind="stable")
    bounds = np.searchsorted(unit[by_unit], np.arange(len(names) + 1))
    return RangeCounts(counts), [
        MovedCopies.of(names[index], position[by_unit[low:high]], occurrence[by_unit[low:high]])
        for index, (low, high) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())) if high > low
    ]


def _empty_counts() -> tuple[np.ndarray, ...]:
    return histogram_of(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(0, np.int64), MIN_BUCKET_BITS)


def _sorted_runs_counts(split: np.ndarray, key: np.ndarray, framed: np.ndarray, part_of: np.ndarray,
                        bucket_bits: int) -> tuple[np.ndarray, ...]:
    """``histogram_of`` records whose keys are sorted within each part (of one split): per run of one bucket, no sort."""
    if not len(key):
        return _empty_counts()
    bucket = key >> np.uint64(64 - bucket_bits)
    starts = np.flatnonzero(np.r_[True, (bucket[1:] != bucket[:-1]) | (part_of[1:] != part_of[:-1])
                                  | (split[1:] != split[:-1])])
    runs = np.diff(np.r_[starts, len(key)])
    return BucketCounts.combined([(split[starts], bucket[starts], runs, np.add.reduceat(framed, starts),
                              np.maximum.reduceat(framed, starts))])


def _footers(name: str, part: Piece) -> np.ndarray:
    if part.footers is None:
        raise RuntimeError(f"piece {name}: its part for the tally of copies came without its records' CRCs")
    return part.footers


def _numbered_copies(order: np.ndarray, split: np.ndarray, key: np.ndarray, framed: np.ndarray,
                     footers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records that are copy 1 or later of their record (indices) and their copy numbers, from ``order``, the
    records by key (equal keys by index: piece name, then place in the piece).

    Only records whose key another record shares are compared further: a copy has equal split,
    key, frame length and CRC32C. Records that share a key and differ (a digest collision) are
    numbered apart and keep the key as copy 0 (the writers order them by bytes).
    """
    sorted_key = key[order]
    tied = sorted_key[1:] == sorted_key[:-1]
    in_run = np.zeros(len(order), dtype=bool)
    in_run[1:] |= tied
    in_run[:-1] |= tied
    members = order[in_run]  # the runs of equal keys, each in index order
    columns = (key[members], split[members], framed[members], footers[members])
    new_run = np.r_[True, columns[0][1:] != columns[0][:-1]]
    other_record = ~new_run[1:] & _differ(columns[1:])
    run_first = np.maximum.accumulate(np.where(new_run, np.arange(len(members)), 0))
    occurrence = np.arange(len(members)) - run_first
    if other_record.any():  # runs holding different records: number each record's copies apart
        run_id = np.cumsum(new_run) - 1
        mixed = np.isin(run_id, run_id[1:][other_record])
        grouped = members[mixed]
        grouped = grouped[np.lexsort((grouped, footers[grouped], framed[grouped], split[grouped], key[grouped]))]
        starts = np.flatnonzero(np.r_[True, _differ((key[grouped], split[grouped], framed[grouped], footers[grouped]))])
        group_first = np.repeat(starts, np.diff(np.r_[starts, len(grouped)]))
        members = np.r_[members[~mixed], grouped]
        occurrence = np.r_[occurrence[~mixed], np.arange(len(grouped)) - group_first]
    later = occurrence > 0
    return members[later], occurrence[later].astype(np.uint64)


def _differ(columns: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each item after the first, whether any of ``columns`` differs from the item before it."""
    differ = np.zeros(max(len(columns[0]) - 1, 0), dtype=bool)
    for column in columns:
        differ |= column[1:] != column[:-1]
    return differ


class _TallyParts(beam.DoFn):
    """A prepared piece's parts, one per key range (and split) it has records in: (range, (first record, bytes, part)).

    ``bytes`` is what the piece takes as it leaves this stage (``crossing_bytes``), given with its first part. A store
    that merges pieces later (``tallies_whole_runs``) gets the whole piece's name in every range instead.
    """

    def __init__(self, store: PieceStore, range_bits: int):
        self._store, self._range_bits = store, range_bits

    def process(self, piece: Piece) -> Iterator[tuple[int, tuple[int, int, Piece]]]:
        crossing = crossing_bytes(piece, self._store)
        if self._store.tallies_whole_runs:
            for index in range(1 << self._range_bits):
                yield index, (-1, crossing if index == 0 else 0, piece)
            return
        bounds = key_range_bounds(piece.split, piece.key, self._range_bits)
        for number, (index, first, end) in enumerate(bounds):
            yield index, (first, crossing if number == 0 else 0, self._store.tally_part(piece, first, end))


class _TallyRange(beam.DoFn):
    """Tallies one key range: its counts (main output) and, per piece with copies to move, their keys (``MOVED``)."""

    def __init__(self, store: PieceStore, range_bits: int, bucket_bits: int):
        self._store, self._range_bits, self._bucket_bits = store, range_bits, bucket_bits

    def process(self, element: tuple[int, Iterable[tuple[int, int, Piece]]]) -> Iterator[object]:
        range_index, received = element
        parts: list[tuple[str, int, Piece]] = []
        whole: dict[str, Piece] = {}
        piece_bytes = 0
        for first, crossing, part in received:
            piece_bytes += crossing
            if first < 0:
                whole.setdefault(part.ref.location, part)
            else:
                parts.append((part.ref.location, first, self._store.with_keys(part)))
        for run in self._store.runs_of(list(whole.values())):
            parts.extend((run.ref.location, first, part)
                         for first, part in self._store.range_parts(run, range_index, self._range_bits))
        counts, moved = tally_copies(parts, self._bucket_bits)
        yield dataclasses.replace(counts, piece_bytes=piece_bytes)
        for copies in moved:
            yield beam.pvalue.TaggedOutput(MOVED, (copies.location, copies))


class TallyCopies(beam.PTransform):
    """PCollection[Piece] -> {"counts": PCollection[RangeCounts], "moved": PCollection[(piece name, MovedCopies)],
    "movers": PCollection[piece name]} (the names of the pieces with moved copies, once per key range)."""

    def __init__(self, spec: ShardingSpec, store: PieceStore):
        super().__init__()
        self._spec, self._store = spec, store

    def expand(self, pieces):
        range_bits = range_bits_for(self._spec)
        tallied = (
            pieces
            | "CutByKeyRange" >> beam.ParDo(_TallyParts(self._store, range_bits))
            .with_output_types(tuple[int, tuple[int, int, Piece]])
            | "GroupByKeyRange" >> beam.GroupByKey()
            | "TallyKeyRange" >> beam.ParDo(_TallyRange(self._store, range_bits, self._spec.bucket_bits))
            .with_outputs(MOVED, main="counts")
        )
        movers = tallied[MOVED] | "NamesOfPiecesWithCopies" >> beam.Keys()
        return {"counts": tallied["counts"], "moved": tallied[MOVED], "movers": movers}
