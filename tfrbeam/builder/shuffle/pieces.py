"""The shuffled unit: a piece of encoded records with their splits and keys (``KeyedRecords``), the same piece
sorted by (split, key) with a reference to where its frames wait (``Piece``, ``PieceRef``), and a slice of it as a
shard writer reads it (``StoredRecords``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from tfrbeam.base.byte_views import windows
from tfrbeam.builder.shuffle.keys import payload_crcs
from tfrbeam.builder.shuffle.packed import PackedFrames
from tfrbeam.tfrecord.frames import frame_ordered
from tfrbeam.tfrecord.records import FOOTER_SIZE, HEADER_SIZE, RECORD_OVERHEAD

__all__ = [
    "INLINE", "MEMORY", "PIECE_STORES", "SPILL", "KeyedRecords", "MovedCopies", "Piece", "PieceRef", "StoredRecords",
    "byte_blocks", "frame_footers", "keyed_pieces", "split_key_order",
]

# The piece stores by name (``tfrbeam.builder.shuffle.stores``): where a piece's frames wait.
INLINE, SPILL, MEMORY = "inline", "spill", "memory"
PIECE_STORES = (INLINE, SPILL, MEMORY)


def split_key_order(split: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Positions sorted by (split, key), stable; a single split (the common case) sorts by key alone, twice as fast."""
    if len(split) and split.min() == split.max():
        return np.argsort(key, kind="stable")
    return np.lexsort((key, split))


@dataclasses.dataclass(frozen=True, eq=False)
class KeyedRecords:
    """Encoded records of one input piece, before the shuffle: payloads with a split, a sort key and a CRC32C each.

    ``offsets`` holds the n + 1 bounds of the payloads in ``data``, starting at 0; ``split``
    (uint16) and ``key`` (uint64) are per record. ``crcs`` optionally carries the payloads'
    CRC32C (uint32), computed while they were hashed, so framing does not read them again.
    """

    split: np.ndarray
    key: np.ndarray
    offsets: np.ndarray
    data: np.ndarray
    crcs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.key)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_bytes(self) -> int:
        return int(self.offsets[-1])

    def sorted_frames(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(split, key, frame offsets, frames): the payloads framed as TFRecords, ordered by (split, key), in one new buffer."""
        order = split_key_order(self.split, self.key)
        crcs = self.crcs if self.crcs is not None else payload_crcs(self.data, self.offsets)
        data, offsets = frame_ordered(self.data, self.offsets, order, crcs)
        return self.split[order], self.key[order], offsets, data


def byte_blocks(framed_lengths: np.ndarray, max_bytes: int, max_records: int) -> list[tuple[int, int]]:
    """Consecutive record ranges of at most ``max_records`` records and ``max_bytes`` bytes (or one record)."""
    blocks, start, count = [], 0, len(framed_lengths)
    ends = np.cumsum(framed_lengths, dtype=np.int64)
    while start < count:
        base = int(ends[start - 1]) if start else 0
        end = int(np.searchsorted(ends, base + max_bytes, side="right"))
        end = min(max(end, start + 1), start + max_records, count)
        blocks.append((start, end))
        start = end
    return blocks


def keyed_pieces(split: np.ndarray, key: np.ndarray, offsets: np.ndarray, data: np.ndarray, crcs: np.ndarray,
                 piece_bytes: int) -> Iterator[KeyedRecords]:
    """Encoded records (bounded by ``offsets`` in ``data``) cut into KeyedRecords of at most ``piece_bytes`` each.

    A record larger than ``piece_bytes`` is a piece of its own.
    """
    start = 0
    while start < len(key):
        end = int(np.searchsorted(offsets, offsets[start] + piece_bytes, side="right")) - 1
        end = min(max(end, start + 1), len(key))
        base = offsets[start]
        yield KeyedRecords(split[start:end], key[start:end], offsets[start:end + 1] - base, data[base:offsets[end]],
                           crcs=crcs[start:end])
        start = end


@dataclasses.dataclass(frozen=True, eq=False)
class PieceRef:
    """Where a piece's records are: frames in the element itself (``data``), or in its store at ``location``.

    ``location`` is a spill file of frames, ``offset`` the byte where the piece's first frame
    starts (store "spill"), or the name of a piece held in this process's memory, ``offset`` the
    index of the piece's first record there (store "memory"). An inline piece carries its frames
    through the runner's GroupByKey, compressed in blocks (``packed``; ``data`` for frames as they are).
    """

    store: str
    data: np.ndarray | None = None
    location: str = ""
    offset: int = 0
    run: str = ""  # a memory store's piece (held or spilled): its run, which holds the piece's keys in this process
    packed: PackedFrames | None = None
    # A spill store's stub: records first:end of a spilled piece of count records, whose keys, frame offsets and splits
    # wait in a file beside its frames (offset is then that piece's first frame), so the runner never holds them.
    keys_on_disk: tuple[int, int, int] | None = None  # (count, first, end)

    def frames(self) -> np.ndarray:
        """The frames the element carries (an inline piece), decompressed if they were packed."""
        if self.packed is not None:
            return self.packed.unpacked()
        if self.data is None:
            raise ValueError(f"a piece of the {self.store} store carries no frames (they are at {self.location!r})")
        return self.data

    def narrowed(self, first_record: int, first_byte: int, end_byte: int) -> PieceRef:
        """The reference to a piece's records from ``first_record`` on (frames ``first_byte:end_byte``)."""
        if self.packed is not None:
            return dataclasses.replace(self, packed=self.packed.narrowed(first_byte, end_byte))
        if self.data is not None:
            return dataclasses.replace(self, data=self.data[first_byte:end_byte])
        if self.store == MEMORY:
            return dataclasses.replace(self, offset=self.offset + first_record)
        return dataclasses.replace(self, offset=self.offset + first_byte)


@dataclasses.dataclass(frozen=True, eq=False)
class Piece:
    """A prepared piece, or its part bound for one shard: records sorted by (split, key), and where their frames are.

    ``offsets`` are the n + 1 bounds of the records' TFRecord frames, from the first one's start
    (whether or not the store keeps them framed). A shard writer reads the records through the
    piece's store (``PieceStore.records``).
    """

    split: np.ndarray
    key: np.ndarray
    offsets: np.ndarray
    ref: PieceRef
    # The records' masked CRC32C ("<u4", their frames' footers) where the store has them at hand: the tally of copies
    # (``tfrbeam.builder.shuffle.copies``) tells records with equal keys apart by them. None once they are not needed.
    footers: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.key)

    @property
    def framed_lengths(self) -> np.ndarray:
        """Each record's size as a TFRecord frame."""
        return np.diff(self.offsets)

    @property
    def num_bytes(self) -> int:
        return int(self.offsets[-1])

    def slice(self, start: int, end: int) -> Piece:
        """Records ``start:end``, without copying frames (a view, or a narrower range of the store's bytes)."""
        first, last = int(self.offsets[start]), int(self.offsets[end])
        ref = self.ref.narrowed(start, first, last)
        footers = self.footers[start:end] if self.footers is not None else None
        return Piece(self.split[start:end], self.key[start:end], self.offsets[start:end + 1] - first, ref, footers)

    def without_footers(self) -> Piece:
        """The piece as it crosses to its shard writers, which read the footers with the frames."""
        return self if self.footers is None else dataclasses.replace(self, footers=None)

    def keys_only(self) -> Piece:
        """Its splits, keys, frame offsets and footers, without the frames or where they are (for the tally of copies)."""
        return Piece(self.split, self.key, self.offsets, PieceRef(self.ref.store, location=self.ref.location),
                     self.footers)

    @property
    def is_stub(self) -> bool:
        """Whether this is a spill store's stub: records named by their range of a spilled piece, keys left on disk."""
        return self.ref.keys_on_disk is not None

    @classmethod
    def stub(cls, ref: PieceRef, count: int, first: int, end: int) -> Piece:
        """Records ``first:end`` of the spilled piece of ``count`` records at ``ref`` (its first frame at ``ref.offset``)."""
        return cls(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(1, np.int64),
                   dataclasses.replace(ref, keys_on_disk=(count, first, end)))

    @classmethod
    def empty(cls) -> Piece:
        return cls(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(1, np.int64), PieceRef(INLINE, np.zeros(0, np.uint8)))


@dataclasses.dataclass(frozen=True, eq=False)
class MovedCopies:
    """Some records of one prepared piece (or run) that are copies of a record another copy keeps the key of, with
    their copy numbers (``tfrbeam.builder.shuffle.copies``): their new keys are ``occurrence_keys(key, number)``.

    ``location`` names the piece (``PieceRef.location``), ``positions`` are the records' places in it and
    ``occurrences`` their copy numbers (unsigned, as narrow as they fit: 8 bytes a record in the side input).
    """

    location: str
    positions: np.ndarray
    occurrences: np.ndarray

    def __len__(self) -> int:
        return len(self.positions)

    @classmethod
    def of(cls, location: str, positions: np.ndarray, occurrences: np.ndarray) -> MovedCopies:
        return cls(location, _narrow(positions), _narrow(occurrences))


def _narrow(values: np.ndarray) -> np.ndarray:
    """Non-negative integers as uint32 when they fit (they nearly always do), else uint64."""
    fits = not len(values) or int(np.max(values)) < 1 << 32
    return np.asarray(values).astype(np.uint32 if fits else np.uint64)


@dataclasses.dataclass(frozen=True, eq=False)
class StoredRecords:
    """A piece slice's records as a shard writer reads them: payloads ``buffer[starts[i]:][:lengths[i]]`` and their masked
    CRCs."""

    buffer: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    footers: np.ndarray  # masked CRC32C of each payload, "<u4": the frame's footer

    @classmethod
    def of_frames(cls, piece: Piece, frames: np.ndarray) -> StoredRecords:
        """The records of ``piece`` whose frames are ``frames`` (the stored footer is the masked CRC)."""
        frame_starts, sizes = piece.offsets[:-1], piece.framed_lengths
        return cls(frames, frame_starts + HEADER_SIZE, sizes - RECORD_OVERHEAD, frame_footers(frames, piece.offsets))


def frame_footers(frames: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The footers (masked CRC32C, "<u4") of the TFRecord frames bounded by ``offsets`` in ``frames``."""
    return windows(frames, 4)[np.asarray(offsets[1:], dtype=np.int64) - FOOTER_SIZE].view("<u4")
