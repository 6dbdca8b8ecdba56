"""Seeded global shuffle, hash splits and exactly balanced shards, written to a temp location.

How a record finds its place (the same on every runner, worker count, input order and batching):

- Content digest: XXH3-128 (xxHash >= 0.8, seed 0, canonical big-endian digest) of the
  serialized Example, read as two little-endian 64-bit words. XXH3 passes SMHasher, so its bits
  are well mixed for any content; it is not cryptographic (nobody crafts collisions against their
  own dataset, and equal keys are still ordered by bytes). Per ~400-byte record it costs a
  quarter of blake2b, which the build used before. The digest's first 64 bits place the record
  in a split; its second 64 bits, passed through a bijective 64-bit mixer
  keyed by the seed (four rounds of xor-with-a-seed-derived-key then the splitmix64 finaliser), are
  the sort key. The output order is sorted by (sort key, record bytes): a uniformly random
  permutation for each seed. Identical records get identical keys, so duplicates are kept and sit
  next to each other (and always fall in the same split: no train/eval leakage).
- Splits: the split hash (of ``split_key``'s values, or of the whole record) is compared with the
  cumulative fractions scaled to 2**64. It does not depend on the seed: changing the seed
  reorders examples within splits but never moves one between splits.
- Without shuffling the sort key is ``input file index << 40 | row number`` (file index = position
  of the path in the sorted input list), so examples keep input file order, then row order.

Exact balance: every split's records are counted per bucket (hash mode: the top ``bucket_bits``
bits of the sort key, about 64 buckets per shard; ordered mode: blocks of 4096 consecutive rows
of one piece) by a combine that carries only counts. From those counts the plan gives each
bucket its first global rank; shard s of k receives global ranks ``[ceil(s*n/k),
ceil((s+1)*n/k))``, so shard sizes differ by at most one record. With ``max_bytes_per_shard``
the plan picks the smallest k for which every shard provably fits.

Moving the bytes: each input piece is put in (split, key) order, so a shard's part of a piece is
one contiguous slice, and waits in a piece store (``PieceStore``: ``add`` a piece, get it back as
a ``Piece`` of keys, frame offsets and a reference; ``records`` of a slice read it back), chosen
once when the build is planned:

- ``inline``: the piece is framed once as TFRecords into a new buffer in key order (numpy copies
  payloads per group of equal length and writes every header and footer at once; the payload
  CRCs come with the piece, computed while its records were hashed), and the frames travel in
  the elements. One element per (piece, shard) crosses the GroupByKey: the frames as one buffer
  plus numpy arrays of keys and offsets, with a coder that is a few memcpys; boundary buckets go
  to both neighbouring shards (about 1/64 of a shard each).
- ``spill``: framed the same way, the frames go to files under the temp dir; only keys and
  offsets cross Beam, and writers read their slices back. Same graph as inline
  (``WriteShardsThroughGroupByKey``).
- ``memory``: the payloads stay in this process's memory where the encoder put them (only when
  every worker runs in it), up to a byte budget per run, beyond which pieces are spilled. Such a
  piece is ordered by moving its keys only (no copy); the writers frame its records from there.
  No piece carries bytes, so the writers read them all as a side input and cut their own slices:
  no routing stage and no GroupByKey, each a whole stage on the local runners
  (``WriteShardsFromPieceList``). A piece is dropped once its last shard slice is written, the
  run's holding once its last shard is written (or by ``discard_pieces`` after a failure):
  nothing outlives the run.

A shard writer merges its slices by (key, frame bytes), keeps its exact rank range and writes the
frames (header and footer bytes made with numpy, one join per block). No element is larger than
one piece and no worker holds more than one shard.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import hashlib
import logging
import math
import struct
import threading
import time
import typing
import uuid
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
import crc32c
import numpy as np
import xxhash
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfrbeam.base.byte_views import windows
from tfrbeam.beam import filesystem as fs
from tfrbeam.build.progress import WRITTEN, ProgressCounter, progress_dir
from tfrbeam.layout.names import shard_file_name
from tfrbeam.tfrecord.offset_index import OffsetIndexBuilder, offset_index_path_for
from tfrbeam.tfrecord.record_index import IndexBuilder, index_path_for
from tfrbeam.tfrecord.records import (
    FOOTER_SIZE,
    HEADER_SIZE,
    MAX_PAYLOAD_SIZE,
    RECORD_OVERHEAD,
    RecordWriter,
    frame_records,
    mask_crcs,
    masked_crc32c,
)

__all__ = [
    "INLINE",
    "MEMORY",
    "PIECE_STORES",
    "SPILL",
    "InlineStore",
    "KeyedRecords",
    "KeyedRecordsCoder",
    "MemoryStore",
    "Piece",
    "PieceCoder",
    "PieceRef",
    "PieceStore",
    "ShardFile",
    "ShardPlan",
    "ShardingSpec",
    "SpillStore",
    "SplitPlan",
    "StoredRecords",
    "WriteShardsFromPieceList",
    "WriteShardsThroughGroupByKey",
    "WriteShuffledShards",
    "bucket_bits_for",
    "content_digests",
    "discard_pieces",
    "frame_ordered",
    "input_order_keys",
    "keyed_pieces",
    "make_piece_store",
    "record_checksums",
    "runs_holding_pieces",
    "seeded_sort_keys",
    "shard_file_name",
    "split_indices",
]

_LOG = logging.getLogger(__name__)

_SHUFFLE_PERSON = b"tfrbeam-shuffle"
# Ordered mode: one histogram bucket per this many consecutive rows of a piece and split.
ORDERED_BLOCK_ROWS = 4096
FILE_INDEX_BITS = 24
ROW_NUMBER_BITS = 64 - FILE_INDEX_BITS
MIN_BUCKET_BITS = 10
MAX_BUCKET_BITS = 24
# Frame and write at most this many records, and about this many bytes, at a time.
WRITE_BLOCK_RECORDS = 8192
WRITE_BLOCK_BYTES = 8 << 20
# A shard writer reads the spilled parts of its shard this many bytes at a time in all (a window
# per part), so its memory does not grow with the shard.
SHARD_READ_BYTES = 32 << 20
_FRAMED_SHARD_KEY_BITS = 32
SPILL_DIR_NAME = "spill"
# frame_ordered copies payloads per group of equal length; beyond this many groups (or 1 per 32
# records) the per-record join of frame_gathered is cheaper.
_MIN_LENGTH_GROUPS = 64
_RECORDS_PER_LENGTH_GROUP = 32

_crc32c = crc32c.crc32c
_pack_length = struct.Struct("<Q").pack


# ------------------------------------------------------------------------------ keys (no Beam)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Suspend the cyclic garbage collector around a per-record loop.

    Such a loop creates a million short-lived memoryviews, each one counted towards the next
    collection; inside a Beam worker every collection then walks Beam's large heap too. The loops
    create no reference cycles. It lives here, not in the command-line entry point, because
    workers in other processes never run that entry point. Measured again on the 1M-row Parquet
    benchmark build (two runs each): 3.65–3.73 s of user CPU with it, 4.78–4.97 s without.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()



def _record_slices(data: np.ndarray | bytes, offsets: np.ndarray) -> list[memoryview]:
    """One memoryview per record of ``data`` (bounded by ``offsets``), for the per-record hash and CRC calls."""
    buffer = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    view = memoryview(np.ascontiguousarray(buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
    bounds = np.asarray(offsets, dtype=np.int64).tolist()
    return [view[start:end] for start, end in zip(bounds, bounds[1:])]


def _digest_array(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype="<u8").reshape(-1, 2).astype(np.uint64, copy=False)


def content_digests(data: np.ndarray | bytes, offsets: np.ndarray) -> np.ndarray:
    """XXH3-128 of every record in ``data`` (bounded by ``offsets``) as an (n, 2) uint64 array."""
    with gc_paused():
        return _digest_array(b"".join(map(xxhash.xxh3_128_digest, _record_slices(data, offsets))))


def payload_crcs(data: np.ndarray | bytes, offsets: np.ndarray) -> np.ndarray:
    """CRC32C (unmasked, uint32) of every record in ``data`` (bounded by ``offsets``)."""
    with gc_paused():
        payloads = _record_slices(data, offsets)
        return np.fromiter(map(_crc32c, payloads), dtype=np.uint32, count=len(payloads))


def record_checksums(data: np.ndarray | bytes, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``content_digests`` and ``payload_crcs`` together, slicing the records once and reading them in input order."""
    with gc_paused():
        payloads = _record_slices(data, offsets)
        digests = _digest_array(b"".join(map(xxhash.xxh3_128_digest, payloads)))
        return digests, np.fromiter(map(_crc32c, payloads), dtype=np.uint32, count=len(payloads))


def _splitmix_finalize(values: np.ndarray) -> np.ndarray:
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def seeded_sort_keys(content_hashes: np.ndarray, seed: int) -> np.ndarray:
    """Sort keys from 64-bit content hashes: a bijection keyed by ``seed`` (vectorised, no per-row Python)."""
    round_keys = np.frombuffer(
        hashlib.blake2b(int(seed).to_bytes(8, "little"), digest_size=32, person=_SHUFFLE_PERSON).digest(), dtype="<u8"
    ).astype(np.uint64)
    values = np.asarray(content_hashes, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for round_key in round_keys:
            values = _splitmix_finalize(values ^ round_key)
    return values


def input_order_keys(file_index: int, row_numbers: np.ndarray) -> np.ndarray:
    """Sort keys that keep input order: the file's index in the sorted input list, then the row number."""
    rows = np.asarray(row_numbers, dtype=np.int64)
    if not 0 <= file_index < 1 << FILE_INDEX_BITS:
        raise ValueError(f"input file index {file_index} needs more than {FILE_INDEX_BITS} bits (too many input files)")
    if rows.size and (rows.min() < 0 or rows.max() >= 1 << ROW_NUMBER_BITS):
        raise ValueError(f"row numbers must be in [0, 2**{ROW_NUMBER_BITS}), got {rows.min()}..{rows.max()}")
    return (np.uint64(file_index) << np.uint64(ROW_NUMBER_BITS)) | rows.astype(np.uint64)


def split_indices(split_hashes: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    """The split of each record: hash / 2**64 falls into the cumulative fraction intervals."""
    cumulative = [math.fsum(fractions[: i + 1]) for i in range(len(fractions) - 1)]
    thresholds = np.array([min(int(round(c * 2**64)), 2**64 - 1) for c in cumulative], dtype=np.uint64)
    return np.searchsorted(thresholds, np.asarray(split_hashes, dtype=np.uint64), side="right").astype(np.uint16)


def bucket_bits_for(max_shards: int) -> int:
    """Hash buckets for a split written in up to ``max_shards`` shards: about 64 buckets per shard."""
    wanted = math.ceil(math.log2(max(1, max_shards) * 64))
    return min(MAX_BUCKET_BITS, max(MIN_BUCKET_BITS, wanted))


def frame_gathered(view: memoryview, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """TFRecord frames of the payloads ``view[starts[i]:ends[i]]``, in that order, as one buffer.

    The same bytes as ``records.frame_records``, faster: the bytes between two payloads (one
    record's CRC footer and the next one's header) are built for all records at once with numpy,
    leaving one slice and one crc32c call per record in Python.
    """
    with gc_paused():
        return _frame_gathered(view, starts, ends)


def _frame_gathered(view: memoryview, starts: np.ndarray, ends: np.ndarray) -> bytes:
    payloads = [view[start:end] for start, end in zip(starts.tolist(), ends.tolist())]
    lengths = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    if len(payloads) and int(lengths.max()) > MAX_PAYLOAD_SIZE:
        return frame_records(payloads)  # raises its RecordTooLargeError
    crcs = np.fromiter(map(_crc32c, payloads), dtype=np.uint64, count=len(payloads))
    return _join_frames(payloads, lengths, mask_crcs(crcs))


def _join_frames(payloads: list, lengths: np.ndarray, masked_crcs: np.ndarray) -> bytes:
    """The TFRecord frames of ``payloads`` (their ``lengths`` and masked CRCs given) joined into one buffer.

    The bytes between two payloads (one record's footer and the next one's header) are built for
    all records at once with numpy; only the join touches each record.
    """
    count = len(payloads)
    if count == 0:
        return b""
    unique_lengths, which = np.unique(lengths, return_inverse=True)
    length_crcs = np.array([masked_crc32c(_pack_length(int(length))) for length in unique_lengths], dtype="<u4")
    # Row i holds record i-1's footer and record i's header: 4 + 8 + 4 bytes.
    between = np.zeros((count + 1, 16), dtype=np.uint8)
    between[1:, 0:4] = np.asarray(masked_crcs).astype("<u4").view(np.uint8).reshape(count, 4)
    between[:-1, 4:12] = np.asarray(lengths).astype("<u8").view(np.uint8).reshape(count, 8)
    between[:-1, 12:16] = length_crcs[which.ravel()].view(np.uint8).reshape(count, 4)
    separators = between.view("V16").ravel().tolist()
    parts: list = [None] * (2 * count + 1)
    parts[0] = separators[0][4:]
    parts[2:-1:2] = separators[1:-1]
    parts[-1] = separators[-1][:4]
    parts[1::2] = payloads
    return b"".join(parts)


def frame_ordered(data: np.ndarray, offsets: np.ndarray, order: np.ndarray, crcs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFRecord frames of records ``order`` of ``data`` (bounded by ``offsets``, CRC32C ``crcs``) in one new buffer.

    Returns the buffer and the frames' n + 1 offsets; the bytes are those of
    ``records.frame_records``. No Python work per record: payloads are copied with numpy, one
    gather per group of equal-length records, and headers and footers are written for all records
    at once. Many distinct lengths (few records each) go through ``frame_gathered`` instead.
    """
    order = np.asarray(order, dtype=np.int64)
    bounds = np.asarray(offsets, dtype=np.int64)
    starts = bounds[:-1][order]
    lengths = bounds[1:][order] - starts
    count = len(order)
    framed_offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths + RECORD_OVERHEAD, out=framed_offsets[1:])
    if count == 0:
        return np.zeros(0, np.uint8), framed_offsets
    unique_lengths, which = np.unique(lengths, return_inverse=True)
    which = which.ravel()
    if int(unique_lengths[-1]) > MAX_PAYLOAD_SIZE or len(unique_lengths) > max(
        _MIN_LENGTH_GROUPS, count // _RECORDS_PER_LENGTH_GROUP
    ):
        framed = frame_gathered(memoryview(np.ascontiguousarray(data, dtype=np.uint8)), starts, starts + lengths)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
        return np.frombuffer(framed, dtype=np.uint8), framed_offsets
    out = np.empty(int(framed_offsets[-1]), dtype=np.uint8)
    payload_starts = framed_offsets[:-1] + HEADER_SIZE
    by_length = np.argsort(which, kind="stable")
    group_bounds = np.zeros(len(unique_lengths) + 1, dtype=np.int64)
    np.cumsum(np.bincount(which, minlength=len(unique_lengths)), out=group_bounds[1:])
    for width, low, high in zip(unique_lengths.tolist(), group_bounds[:-1].tolist(), group_bounds[1:].tolist()):
        if width:
            members = by_length[low:high]
            windows(out, width)[payload_starts[members]] = windows(data, width)[starts[members]]
    length_crcs = np.array([masked_crc32c(_pack_length(length)) for length in unique_lengths.tolist()], dtype="<u4")
    windows(out, 8)[framed_offsets[:-1]] = lengths.astype("<u8").view("V8")
    windows(out, 4)[framed_offsets[:-1] + 8] = length_crcs[which].view("V4")
    windows(out, 4)[payload_starts + lengths] = mask_crcs(np.asarray(crcs)[order]).view("V4")
    return out, framed_offsets


# ---------------------------------------------------------------------------- the shuffled unit


def _split_key_order(split: np.ndarray, key: np.ndarray) -> np.ndarray:
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
        order = _split_key_order(self.split, self.key)
        crcs = self.crcs if self.crcs is not None else payload_crcs(self.data, self.offsets)
        data, offsets = frame_ordered(self.data, self.offsets, order, crcs)
        return self.split[order], self.key[order], offsets, data


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
    through the runner's GroupByKey.
    """

    store: str
    data: np.ndarray | None = None
    location: str = ""
    offset: int = 0
    run: str = ""  # a memory store's piece (held or spilled): its run, which holds the piece's keys in this process

    def narrowed(self, first_record: int, first_byte: int, end_byte: int) -> PieceRef:
        """The reference to a piece's records from ``first_record`` on (frames ``first_byte:end_byte``)."""
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
        return Piece(self.split[start:end], self.key[start:end], self.offsets[start:end + 1] - first, ref)

    @classmethod
    def empty(cls) -> Piece:
        return cls(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(1, np.int64), PieceRef(INLINE, np.zeros(0, np.uint8)))


# ------------------------------------------------------------------------------ piece stores

INLINE, SPILL, MEMORY = "inline", "spill", "memory"
PIECE_STORES = (INLINE, SPILL, MEMORY)


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
        footers = windows(frames, 4)[frame_starts + sizes - FOOTER_SIZE].view("<u4")
        return cls(frames, frame_starts + HEADER_SIZE, sizes - RECORD_OVERHEAD, footers)


class PieceStore:
    """Where prepared pieces wait for the shard writers, behind ``add`` and ``records`` (as TFDS's Shuffler).

    A store is chosen once, when the build is planned (``tfrbeam.build.runners.choose_piece_store``),
    and is pickled into the DoFns that prepare pieces and write shards; ``open`` / ``flush`` /
    ``close`` bracket its use inside one worker (DoFn setup, finish_bundle, teardown).
    """

    name: typing.ClassVar[str]
    # Pieces carry no bytes and every worker sees the store: writers may take all pieces as a side input.
    pieces_as_side_input: typing.ClassVar[bool] = False

    def open(self) -> None:
        """Prepare to ``add`` in this worker."""

    def add(self, records: KeyedRecords) -> Piece:
        """Keep a piece's records, ordered by (split, key); the piece that finds them again.

        The default frames them into one new buffer (``KeyedRecords.sorted_frames``) and keeps that.
        """
        split, key, offsets, frames = records.sorted_frames()
        return Piece(split, key, offsets, self._keep(frames))

    def _keep(self, frames: np.ndarray) -> PieceRef:
        """Keep one piece's framed bytes; the stores that keep frames (inline, spill) implement it.

        The memory store keeps payloads where the encoder put them and overrides ``add`` instead.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no framed bytes: it overrides add()")

    def flush(self) -> None:
        """Every piece added so far can be read by other workers (end of a bundle)."""

    def close(self) -> None:
        """This worker adds no more."""

    def records(self, piece: Piece) -> StoredRecords:
        """The records of ``piece`` (a slice of an added piece), in order."""
        return StoredRecords.of_frames(piece, self._frames(piece))

    def _frames(self, piece: Piece) -> np.ndarray:
        """The framed bytes ``_keep`` kept for ``piece``; the memory store overrides ``records`` instead."""
        raise NotImplementedError(f"{type(self).__name__} keeps no framed bytes: it overrides records()")

    def read_in_windows(self, piece: Piece) -> bool:
        """Whether a writer should read ``piece``'s records a window at a time (they are in a file), not all at once."""
        return False

    def routed(self, piece: Piece, slices: int) -> None:
        """``piece`` was cut into ``slices`` shard slices (a piece may be routed again: only the first call counts)."""

    def written(self, piece: Piece, shard_key: int) -> None:
        """The slice ``piece`` of shard ``shard_key`` was written."""

    def shard_written(self, shard_key: int, num_shards: int) -> None:
        """Shard ``shard_key``, one of the plan's ``num_shards``, is written."""


class InlineStore(PieceStore):
    """The frames travel in the elements, through the runner's GroupByKey (distributed runners shuffle them well)."""

    name = INLINE

    def _keep(self, frames: np.ndarray) -> PieceRef:
        return PieceRef(INLINE, data=frames)

    def _frames(self, piece: Piece) -> np.ndarray:
        assert piece.ref.data is not None  # an inline piece carries its frames
        return piece.ref.data


class SpillStore(PieceStore):
    """The frames go to files under ``directory``; only keys and offsets cross the runner.

    Files are written by one background thread (the write releases the GIL and overlaps with
    preparing the next piece; at most one more piece waits) and are complete when the bundle
    finishes. Writers read them after a GroupByKey or as a side input, so always in a later stage.
    """

    name = SPILL

    def __init__(self, directory: str):
        self.directory = directory
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future] = []

    def __getstate__(self) -> dict:
        return {"directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])  # type: ignore[misc]  # unpickling rebuilds the fresh, unpicklable state

    def open(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrbeam-spill")

    def _keep(self, frames: np.ndarray) -> PieceRef:
        if self._executor is None:
            self.open()
        assert self._executor is not None  # open() made it
        path = FileSystems.join(self.directory, f"{uuid.uuid4().hex}.bin")
        self._wait(keep=1)
        self._pending.append(self._executor.submit(_write_file, path, frames))
        return PieceRef(SPILL, location=path)

    def flush(self) -> None:
        self._wait(keep=0)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _wait(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.pop(0).result()

    def read_in_windows(self, piece: Piece) -> bool:
        return True

    def _frames(self, piece: Piece) -> np.ndarray:
        ref, size = piece.ref, piece.num_bytes
        with FileSystems.open(ref.location, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(ref.offset)
            data = handle.read(size)
        if len(data) != size:
            raise RuntimeError(f"{ref.location}: spill file ends {size - len(data)} bytes early (was it deleted?)")
        return np.frombuffer(data, dtype=np.uint8)


def _write_file(path: str, data: np.ndarray) -> None:
    with fs.create(path) as handle:
        handle.write(memoryview(np.ascontiguousarray(data)))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


class _HeldPieces:
    """The pieces one run holds in this process's memory, each dropped after its last shard slice is written.

    A held piece is its payloads where the encoder put them, with each record's start and masked
    CRC in (split, key) order: it was put in order by moving its keys only, never its bytes.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffers: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # payloads, starts, footers
        self.pending: dict[str, int] = {}  # per piece, shard slices not yet written
        self.released: dict[str, set[int]] = {}  # per piece, the shards whose slice was written
        self.shards_written: set[int] = set()
        self.bytes = 0
        # Every piece the run's store made (held or spilled), by location: it crosses the runner as its name.
        self.pieces: dict[str, Piece] = {}

    def drop(self, name: str) -> None:
        self.bytes -= self.buffers.pop(name)[0].nbytes
        self.pending.pop(name, None)
        self.released.pop(name, None)


# The runs whose pieces are held in this process, by staging directory: an entry lives from the
# first piece a run holds until its last shard is written or ``discard_pieces`` ends the run.
_RUNS_HOLDING: dict[str, _HeldPieces] = {}
_RUNS_LOCK = threading.Lock()


class MemoryStore(PieceStore):
    """The payloads stay in this process's memory, up to ``budget`` bytes per run; beyond it pieces are spilled.

    Only for runs whose every worker runs in this process (the in-process local runners): the
    pieces carry no bytes, so the shard writers take them as a side input, without a routing
    stage and a GroupByKey. A piece is dropped once its last shard slice is written; the run's
    whole holding once its last shard is written, or by ``discard_pieces`` after a failure.
    """

    name = MEMORY
    pieces_as_side_input = True

    def __init__(self, run_key: str, budget: int, spill_directory: str):
        self.run_key = run_key
        self.budget = budget
        self.overflow = SpillStore(spill_directory)

    def _holding(self, create: bool = False) -> _HeldPieces | None:
        with _RUNS_LOCK:
            held = _RUNS_HOLDING.get(self.run_key)
            if held is None and create:
                held = _RUNS_HOLDING[self.run_key] = _HeldPieces()
            return held

    def _held(self, create: bool = False) -> _HeldPieces:
        held = self._holding(create)
        if held is None:
            raise RuntimeError(
                f"the pieces of the run staging in {self.run_key} are not held in this process: they were prepared by "
                "a worker in another process, or the run ended (use piece store spill or inline with such runners)"
            )
        return held

    def add(self, records: KeyedRecords) -> Piece:
        """Hold the piece's payloads as they are, ordered by moving its keys only; spill it past the budget.

        Either way the piece's keys stay in this process too, so the piece crosses the runner as its
        name (``PieceCoder``): its keys are not copied into the runner's buffers and side inputs.
        """
        held = self._held(create=True)
        with held.lock:
            fits = held.bytes + records.data.nbytes <= self.budget
            if fits:
                held.bytes += records.data.nbytes
        piece = self._hold(held, records) if fits else self.overflow.add(records)
        piece = dataclasses.replace(piece, ref=dataclasses.replace(piece.ref, run=self.run_key))
        with held.lock:
            held.pieces[piece.ref.location] = piece
        return piece

    @staticmethod
    def _hold(held: _HeldPieces, records: KeyedRecords) -> Piece:
        order = _split_key_order(records.split, records.key)
        crcs = records.crcs if records.crcs is not None else payload_crcs(records.data, records.offsets)
        frame_offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(records.lengths[order] + RECORD_OVERHEAD, out=frame_offsets[1:])
        name = uuid.uuid4().hex
        with held.lock:
            held.buffers[name] = (records.data, records.offsets[:-1][order], mask_crcs(crcs[order]).astype("<u4"))
            held.pending[name] = 0
        return Piece(records.split[order], records.key[order], frame_offsets, PieceRef(MEMORY, location=name))

    def flush(self) -> None:
        self.overflow.flush()

    def close(self) -> None:
        self.overflow.close()

    def records(self, piece: Piece) -> StoredRecords:
        if piece.ref.store == SPILL:
            return self.overflow.records(piece)
        if piece.ref.store != MEMORY:
            assert piece.ref.data is not None  # an inline piece carries its frames
            return StoredRecords.of_frames(piece, piece.ref.data)
        held = self._held().buffers.get(piece.ref.location)
        if held is None:
            raise RuntimeError(f"piece {piece.ref.location} of the run staging in {self.run_key} was already dropped")
        payloads, starts, footers = held
        first, count = piece.ref.offset, len(piece)
        return StoredRecords(payloads, starts[first:first + count], piece.framed_lengths - RECORD_OVERHEAD,
                             footers[first:first + count])

    def read_in_windows(self, piece: Piece) -> bool:
        return piece.ref.store == SPILL

    def routed(self, piece: Piece, slices: int) -> None:
        if piece.ref.store != MEMORY:
            return
        held = self._holding()
        if held is None:
            return  # the run ended; reading the piece's frames says so
        with held.lock:
            name = piece.ref.location
            if name in held.buffers and name not in held.released:
                held.released[name] = set()
                held.pending[name] += slices

    def written(self, piece: Piece, shard_key: int) -> None:
        """Drop the piece after its last slice was written (a retried shard counts once)."""
        held = self._holding() if piece.ref.store == MEMORY else None
        if held is None:
            return
        with held.lock:
            name = piece.ref.location
            released = held.released.get(name)
            if released is not None and shard_key not in released:
                released.add(shard_key)
                held.pending[name] -= 1
                if held.pending[name] <= 0:
                    held.drop(name)

    def shard_written(self, shard_key: int, num_shards: int) -> None:
        """After the run's last shard (of ``num_shards``) the run holds nothing: its entry goes."""
        held = self._holding()
        if held is None:
            return
        with held.lock:
            held.shards_written.add(shard_key)
            finished = len(held.shards_written) >= num_shards
        if finished:
            discard_pieces(self.run_key)


def discard_pieces(run_key: str) -> None:
    """Free every piece the run staging in ``run_key`` holds in this process's memory (its end, or after a failure)."""
    with _RUNS_LOCK:
        held = _RUNS_HOLDING.pop(run_key, None)
    if held is not None:
        with held.lock:
            for name in list(held.buffers):
                held.drop(name)


def runs_holding_pieces() -> list[str]:
    """The runs that hold pieces in this process's memory now (none once every build has ended)."""
    with _RUNS_LOCK:
        return sorted(_RUNS_HOLDING)


def registered_piece(run_key: str, location: str) -> Piece:
    """The piece a memory store of run ``run_key`` made at ``location``, as it is in this process's memory."""
    with _RUNS_LOCK:
        held = _RUNS_HOLDING.get(run_key)
    piece = held.pieces.get(location) if held is not None else None
    if piece is None:
        raise RuntimeError(
            f"piece {location} of the run staging in {run_key} is not held in this process: it was prepared by a "
            "worker in another process, or the run ended (use piece store spill or inline with such runners)"
        )
    return piece


def _is_registered(piece: Piece) -> bool:
    with _RUNS_LOCK:
        held = _RUNS_HOLDING.get(piece.ref.run)
    return held is not None and held.pieces.get(piece.ref.location) is piece


def make_piece_store(name: str, temp_dir: str, budget: int = 0) -> PieceStore:
    """The store ``name`` (one of PIECE_STORES) for the run staging in ``temp_dir``; ``budget`` bounds a memory store."""
    spill_dir = FileSystems.join(temp_dir, SPILL_DIR_NAME)
    if name == INLINE:
        return InlineStore()
    if name == SPILL:
        return SpillStore(spill_dir)
    if name == MEMORY:
        return MemoryStore(temp_dir, budget, spill_dir)
    raise ValueError(f"unknown piece store {name!r}; choose one of {', '.join(PIECE_STORES)}")


# ----------------------------------------------------------------------------------- coders

_KEYED_HEADER = struct.Struct("<QQ?")
_PIECE_HEADER = struct.Struct("<QQQI?")
_WHOLE, _REGISTERED = b"\x00", b"\x01"
_NAME_SIZES = struct.Struct("<II")
_STORE_CODES = {name: code for code, name in enumerate(PIECE_STORES)}


def _raw(array: np.ndarray, dtype: str) -> np.ndarray:
    """An array's bytes in a fixed layout, as a uint8 view (no copy when it already has that layout)."""
    return np.ascontiguousarray(array, dtype=dtype).view(np.uint8)


class _ArrayReader:
    """Reads consecutive fixed-layout arrays out of one encoded element (views, no copies)."""

    def __init__(self, encoded: bytes, position: int):
        self.encoded, self.position = encoded, position

    def take(self, dtype: str, count: int) -> np.ndarray:
        array = np.frombuffer(self.encoded, dtype=dtype, count=count, offset=self.position)
        self.position += array.nbytes
        return array


class KeyedRecordsCoder(beam.coders.Coder):
    """Encodes KeyedRecords as a header and raw arrays: one copy per element, not a coder call per record."""

    def encode(self, value: KeyedRecords) -> bytes:
        count, data, has_crcs = len(value.key), _raw(value.data, "u1"), value.crcs is not None
        return b"".join((  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
            _KEYED_HEADER.pack(count, len(data), has_crcs), _raw(value.split, "<u2"), _raw(value.key, "<u8"),
            _raw(value.offsets, "<i8"), _raw(value.crcs, "<u4") if value.crcs is not None else b"", data,
        ))

    def estimate_size(self, value: KeyedRecords) -> int:
        """The encoded size, computed: Beam samples element sizes, and the default encodes a whole piece to measure it."""
        count = len(value.key)
        return _KEYED_HEADER.size + 18 * count + 8 + (0 if value.crcs is None else 4 * count) + np.asarray(value.data).nbytes

    def decode(self, encoded: bytes) -> KeyedRecords:
        count, size, has_crcs = _KEYED_HEADER.unpack_from(encoded)
        reader = _ArrayReader(encoded, _KEYED_HEADER.size)
        split, key, offsets = reader.take("<u2", count), reader.take("<u8", count), reader.take("<i8", count + 1)
        crcs = reader.take("<u4", count) if has_crcs else None
        return KeyedRecords(split, key, offsets, reader.take("u1", size), crcs)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return KeyedRecords


class PieceCoder(beam.coders.Coder):
    """Encodes a Piece as a header, its reference and raw arrays (its frames too when it carries them).

    A piece a memory store made (held or spilled) is encoded as its run and location only: its
    keys are in this process's memory, where decoding finds the same piece again.
    """

    def encode(self, value: Piece) -> bytes:
        ref = value.ref
        if ref.run and _is_registered(value):
            run, location = ref.run.encode("utf-8"), ref.location.encode("utf-8")
            return b"".join((_REGISTERED, _NAME_SIZES.pack(len(run), len(location)), run, location))
        count, location = len(value.key), ref.location.encode("utf-8")
        data = _raw(ref.data, "u1") if ref.data is not None else np.zeros(0, np.uint8)
        header = _PIECE_HEADER.pack(count, len(data), ref.offset, len(location), ref.data is not None)
        return b"".join((  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
            _WHOLE, header, bytes([_STORE_CODES[ref.store]]), location, _raw(value.split, "<u2"),
            _raw(value.key, "<u8"), _raw(value.offsets, "<i8"), data,
        ))

    def estimate_size(self, value: Piece) -> int:
        if value.ref.run and _is_registered(value):
            return 1 + _NAME_SIZES.size + len(value.ref.run) + len(value.ref.location)
        data = 0 if value.ref.data is None else np.asarray(value.ref.data).nbytes
        return 1 + _PIECE_HEADER.size + 1 + len(value.ref.location.encode("utf-8")) + 18 * len(value.key) + 8 + data

    def decode(self, encoded: bytes) -> Piece:
        if encoded[:1] == _REGISTERED:
            run_size, location_size = _NAME_SIZES.unpack_from(encoded, 1)
            position = 1 + _NAME_SIZES.size
            run = bytes(encoded[position:position + run_size]).decode("utf-8")
            location = bytes(encoded[position + run_size:position + run_size + location_size]).decode("utf-8")
            return registered_piece(run, location)
        count, size, offset, location_size, has_data = _PIECE_HEADER.unpack_from(encoded, 1)
        position = 1 + _PIECE_HEADER.size
        store = PIECE_STORES[encoded[position]]
        location = bytes(encoded[position + 1:position + 1 + location_size]).decode("utf-8")
        reader = _ArrayReader(encoded, position + 1 + location_size)
        split, key, offsets = reader.take("<u2", count), reader.take("<u8", count), reader.take("<i8", count + 1)
        data = reader.take("u1", size) if has_data else None
        return Piece(split, key, offsets, PieceRef(store, data, location, offset))

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return Piece


beam.coders.registry.register_coder(KeyedRecords, KeyedRecordsCoder)
beam.coders.registry.register_coder(Piece, PieceCoder)


# ----------------------------------------------------------------------------------- the plan


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


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """One written shard, still in the temp location; commit moves it to ``relative_path``."""

    split: str
    shard: int
    num_shards: int
    relative_path: str
    temp_path: str
    temp_index_path: str | None
    temp_offsets_path: str | None
    num_examples: int
    num_bytes: int
    sha256: str


# -------------------------------------------------------------------------------- bucket counts


def _record_buckets(records: Piece, spec: ShardingSpec) -> np.ndarray:
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
    buckets = _record_buckets(records, spec)
    framed = records.framed_lengths
    return _reduce(records.split.astype(np.uint16), buckets, np.ones(len(records), np.int64), framed, framed)


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


class _BucketCounts(beam.CombineFn):
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
        columns = [np.concatenate([part[i] for part in accumulator]) for i in range(5)]
        return [_reduce(*columns)]


class _PlanShards(_BucketCounts):
    """The bucket counts, then the plan made from them, in one combine (a Map after it would be one more stage)."""

    def extract_output(self, accumulator) -> ShardPlan:
        return make_plan(super().extract_output(accumulator), self._spec)


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
        _LOG.info("split %s: %d examples, %d bytes, %d shards", name, total, total_bytes, num_shards)
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


# ------------------------------------------------------------------------------------ routing


def _shard_key(split: int, shard: int) -> int:
    return (split << _FRAMED_SHARD_KEY_BITS) | shard


class _PreparePieces(beam.DoFn):
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


def _route(piece: Piece, plan: ShardPlan, store: PieceStore) -> list[tuple[int, Piece]]:
    """A sorted piece's records cut by the shard(s) its buckets' rank ranges overlap: one slice per shard.

    Tells the store how many slices there are, so a piece it holds is dropped after the last one is written.
    """
    if not len(piece):
        return []
    buckets = _record_buckets(piece, plan.spec)
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
                routed.append((_shard_key(index, shard), piece.slice(low, high)))
    store.routed(piece, len(routed))
    return routed


class _RouteToShards(beam.DoFn):
    """Sends each sorted piece's records to the shard(s) they belong to, one slice per shard (see _route)."""

    def __init__(self, store: PieceStore):
        self._store = store

    def process(self, piece: Piece, plan: ShardPlan) -> Iterator[tuple[int, Piece]]:
        yield from _route(piece, plan, self._store)


def _shard_keys(plan: ShardPlan) -> Iterator[int]:
    """Every shard's key, so that every shard (even one with no records) is written."""
    for index, split_plan in enumerate(plan.splits):
        for shard in range(split_plan.num_shards):
            yield _shard_key(index, shard)


def _empty_shards(plan: ShardPlan) -> Iterator[tuple[int, Piece]]:
    """One empty element per shard, so every shard (even one with no records) is written."""
    for key in _shard_keys(plan):
        yield key, Piece.empty()


# ------------------------------------------------------------------------------------ writing


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


def _sorted_positions(keys: np.ndarray, record_bytes: typing.Callable[[int], bytes]) -> np.ndarray:
    """Positions sorted by (key, record bytes); only runs of equal keys (duplicates) are compared by bytes."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    ties = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if ties.size:
        run_starts = ties[np.r_[True, ties[1:] != ties[:-1] + 1]]
        for run_start in run_starts.tolist():
            run_end = run_start + 1
            while run_end < len(order) and sorted_keys[run_end] == sorted_keys[run_start]:
                run_end += 1
            order[run_start:run_end] = sorted(order[run_start:run_end].tolist(), key=record_bytes)
    return order


def write_blocks(framed_lengths: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive record ranges of at most WRITE_BLOCK_RECORDS records and WRITE_BLOCK_BYTES bytes (or one record).

    A shard is framed and written block by block, so a writer's buffers do not grow with its shard
    or with the records' sizes.
    """
    blocks, start, count = [], 0, len(framed_lengths)
    ends = np.cumsum(framed_lengths, dtype=np.int64)
    while start < count:
        base = int(ends[start - 1]) if start else 0
        end = int(np.searchsorted(ends, base + WRITE_BLOCK_BYTES, side="right"))
        end = min(max(end, start + 1), start + WRITE_BLOCK_RECORDS, count)
        blocks.append((start, end))
        start = end
    return blocks


class _PartWindows:
    """One spilled part of a shard's records, read ``window_bytes`` at a time.

    So a writer holds one window per spilled part, not the whole shard, whatever the dataset's
    size. The writer reads forward: its blocks take each part's records in key order.
    """

    def __init__(self, part: Piece, store: PieceStore, window_bytes: int):
        self._part, self._store, self._window_bytes = part, store, window_bytes
        self._first = self._end = 0
        self._records: StoredRecords | None = None

    def records(self, first: int, end: int) -> StoredRecords:
        """The part's records ``first:end`` (``starts`` index the returned ``buffer``)."""
        if self._records is None or not (self._first <= first and end <= self._end):
            self._read(first, end)
        assert self._records is not None  # _read set it
        low, high = first - self._first, end - self._first
        held = self._records
        return StoredRecords(held.buffer, held.starts[low:high], held.lengths[low:high], held.footers[low:high])

    def _read(self, first: int, end: int) -> None:
        part = self._part
        wanted = int(part.offsets[first]) + self._window_bytes
        end = max(end, min(len(part), int(np.searchsorted(part.offsets, wanted, side="right")) - 1))
        self._records = None  # the old window goes before the new one is read
        self._records = self._store.records(part.slice(first, end))
        self._first, self._end = first, end


class _Received:
    """The records one shard writer received, addressed by a flat position across all parts, framed as they are written.

    Every part is a slice of a sorted piece, its records read through the piece store: a record
    is a payload slice, its length and its masked CRC (the frame's footer). A part its store
    holds in memory is addressed whole; a part in a file (spilled) is read a window at a time
    (``_PartWindows``), the windows of all parts sharing ``read_bytes``.
    """

    def __init__(self, parts: list[Piece], store: PieceStore, read_bytes: int | None = None):
        read_bytes = SHARD_READ_BYTES if read_bytes is None else read_bytes
        window_bytes = max(1, read_bytes // max(1, len(parts)))
        self._in_windows = np.array([store.read_in_windows(part) for part in parts], dtype=bool)
        self._windows = {index: _PartWindows(part, store, window_bytes)
                         for index, part in enumerate(parts) if self._in_windows[index]}
        counts = np.array([len(part) for part in parts], dtype=np.int64)
        self._part_first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.views: list[memoryview | None] = [None] * len(parts)
        total = int(counts.sum())
        self.keys = np.concatenate([part.key for part in parts]) if parts else np.zeros(0, np.uint64)
        self.part_of = np.repeat(np.arange(len(parts)), counts) if parts else np.zeros(0, np.int64)
        self.lengths = np.zeros(total, np.int64)
        self.starts = np.zeros(total, np.int64)  # of whole parts; of windowed ones, set block by block
        self.footers = np.zeros(total, "<u4")
        for index, part in enumerate(parts):
            first, end = int(self._part_first[index]), int(self._part_first[index + 1])
            self.lengths[first:end] = part.framed_lengths - RECORD_OVERHEAD
            if not self._in_windows[index]:
                stored = store.records(part)
                self.views[index] = memoryview(np.ascontiguousarray(stored.buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
                self.starts[first:end] = stored.starts
                self.footers[first:end] = stored.footers

    def frame(self, position: int) -> bytes:
        """One record's whole frame (to order records with equal keys by their bytes)."""
        return self.frames(np.array([position], dtype=np.int64))

    def payload_lengths(self, positions: np.ndarray) -> np.ndarray:
        return self.lengths[positions]

    def frames(self, positions: np.ndarray) -> bytes:
        """The frames of the records at ``positions``, in that order, as one buffer."""
        part_of = self.part_of[positions]
        if self._in_windows.any():
            self._read_windows(positions, part_of)
        views = self.views
        starts = self.starts[positions]
        lengths = self.lengths[positions]
        with gc_paused():
            payloads = [
                views[part][start:end]  # every part's view is set (whole, or by _read_windows)
                for part, start, end in zip(part_of.tolist(), starts.tolist(), (starts + lengths).tolist())
            ]
            return _join_frames(payloads, lengths, self.footers[positions])

    def _read_windows(self, positions: np.ndarray, part_of: np.ndarray) -> None:
        """Read the windows of the spilled parts that ``positions`` need; point their views, starts and footers there."""
        windowed = np.flatnonzero(self._in_windows[part_of])
        if not windowed.size:
            return
        by_part = windowed[np.argsort(part_of[windowed], kind="stable")]
        for group in np.split(by_part, np.flatnonzero(np.diff(part_of[by_part])) + 1):
            part = int(part_of[group[0]])
            wanted = positions[group]
            local = wanted - self._part_first[part]
            first = int(local.min())
            stored = self._windows[part].records(first, int(local.max()) + 1)
            self.starts[wanted] = stored.starts[local - first]
            self.footers[wanted] = stored.footers[local - first]
            self.views[part] = memoryview(np.ascontiguousarray(stored.buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


class _WriteShard(beam.DoFn):
    """Sorts one shard's records by (key, bytes), keeps its exact rank range and writes it to the temp dir."""

    def __init__(self, temp_dir: str, store: PieceStore, progress: str | None = None):
        self._temp_dir = temp_dir
        self._store = store
        self._progress = progress

    def process(self, element: tuple[int, Iterable[Piece]], plan: ShardPlan) -> Iterator[ShardFile]:
        shard_key, parts = element
        split_index, shard = shard_key >> _FRAMED_SHARD_KEY_BITS, shard_key & ((1 << _FRAMED_SHARD_KEY_BITS) - 1)
        split_plan = plan.splits[split_index]
        parts = [part for part in parts if len(part)]
        low, high = split_plan.shard_start(shard), split_plan.shard_start(shard + 1)
        try:
            received = _Received(parts, self._store)
            order = _sorted_positions(received.keys, received.frame)
            first_rank = self._first_rank_received(split_plan, low, high, plan.spec.ordered)
            if len(order) < high - first_rank or (plan.spec.ordered and len(order) != high - low):
                raise RuntimeError(
                    f"split {split_plan.name} shard {shard}: received {len(order)} records for ranks {low}..{high} "
                    f"(first received rank {first_rank}); the input changed during the run"
                )
            written = self._write(split_plan, shard, plan.spec, received, order[low - first_rank:high - first_rank])
        finally:
            for part in parts:
                self._store.written(part, shard_key)
        self._store.shard_written(shard_key, sum(split.num_shards for split in plan.splits))
        yield written

    @staticmethod
    def _first_rank_received(split_plan: SplitPlan, low: int, high: int, ordered: bool) -> int:
        """Global rank of the smallest record this shard receives: whole buckets arrive in hash mode."""
        if ordered or high <= low:
            return low
        bucket = int(np.searchsorted(split_plan.bucket_starts, low, side="right")) - 1
        return int(split_plan.bucket_starts[bucket])

    def _write(self, split_plan: SplitPlan, shard: int, spec: ShardingSpec, received: _Received, kept: np.ndarray) -> ShardFile:
        started = time.monotonic()
        name = shard_file_name(split_plan.name, shard, split_plan.num_shards, spec.compression)
        relative_path = f"{split_plan.name}/{name}"
        temp_path = FileSystems.join(self._temp_dir, split_plan.name, name)
        try:
            return self._write_file(split_plan, shard, spec, received, kept, temp_path, relative_path, started)
        except OSError as error:  # a full disk and the like: name the file (the OSError of a write names none)
            raise OSError(error.errno, f"{error.strerror or error} (writing shard {temp_path})", temp_path) from error

    def _write_file(self, split_plan: SplitPlan, shard: int, spec: ShardingSpec, received: _Received, kept: np.ndarray,
                    temp_path: str, relative_path: str, started: float) -> ShardFile:
        index = IndexBuilder() if spec.write_index and spec.compression is None else None
        offsets = OffsetIndexBuilder() if index is not None else None
        handle = _HashingFile(fs.create(temp_path))
        try:
            writer = RecordWriter(handle, spec.compression)
            kept_lengths = received.payload_lengths(kept)
            for start, end in write_blocks(kept_lengths + RECORD_OVERHEAD):
                positions = kept[start:end]
                if index is not None and offsets is not None:
                    lengths = kept_lengths[start:end]
                    index.add_batch(writer.bytes_written, writer.records_written, lengths)
                    offsets.add_batch(writer.bytes_written, writer.records_written, lengths)
                writer.write_framed(received.frames(positions), len(positions))
            writer.close()
        finally:
            handle.close()
        temp_index_path = temp_offsets_path = None
        if index is not None and offsets is not None:
            # mtime None here: the commit stamps the file's own mtime once the shard is in its final directory.
            temp_index_path = index_path_for(temp_path)
            with fs.create(temp_index_path) as index_file:
                index_file.write(index.to_bytes(handle.size, None, len(kept)))
            temp_offsets_path = offset_index_path_for(temp_path)
            with fs.create(temp_offsets_path) as offsets_file:
                offsets_file.write(offsets.to_bytes(handle.size, None))
        beam.metrics.Metrics.counter("tfrbeam", "examples_written").inc(len(kept))
        if self._progress is not None:
            ProgressCounter(self._progress, WRITTEN).add(len(kept), handle.size)
        _LOG.info(
            "wrote %s: %d examples, %d bytes in %.1f s", relative_path, len(kept), handle.size, time.monotonic() - started
        )
        return ShardFile(
            split=split_plan.name, shard=shard, num_shards=split_plan.num_shards, relative_path=relative_path,
            temp_path=temp_path, temp_index_path=temp_index_path, temp_offsets_path=temp_offsets_path,
            num_examples=len(kept), num_bytes=handle.size,
            sha256=handle.sha256_hex,
        )


class _WriteShardOfPieces(_WriteShard):
    """Writes the shard of each key it gets, routing the pieces (a side input, no bytes in them) itself.

    The pieces are routed once per bundle; each shard's slices are dropped once written.
    """

    def start_bundle(self) -> None:
        self._parts: dict[int, list[Piece]] | None = None

    # Another element type than the base's (a shard key, pieces as a side input): a different DoFn signature.
    def process(self, shard_key: int, plan: ShardPlan, pieces: list[Piece]) -> Iterator[ShardFile]:  # type: ignore[override]
        if self._parts is None:
            self._parts = collections.defaultdict(list)
            for piece in pieces:
                for key, part in _route(piece, plan, self._store):
                    self._parts[key].append(part)
        yield from super().process((shard_key, self._parts.pop(shard_key, [])), plan)


class _WriteShardsOfPlan(beam.PTransform):
    """PCollection[Piece] -> PCollection[ShardFile], one per shard of ``plan`` (a one-element PCollection[ShardPlan])."""

    def __init__(self, temp_dir: str, store: PieceStore, plan: beam.PCollection, progress: str | None = None):
        super().__init__()
        self._temp_dir, self._store, self._plan, self._progress = temp_dir, store, plan, progress


class WriteShardsFromPieceList(_WriteShardsOfPlan):
    """Shard writers that take every piece as a side input and route them themselves: no routing stage, no GroupByKey.

    For stores whose pieces carry no bytes and whose workers all share this process (``MemoryStore``):
    on the local runners the GroupByKey and the routing stage would each cost a whole stage.
    """

    def expand(self, pieces):
        writer = _WriteShardOfPieces(self._temp_dir, self._store, self._progress)
        return (
            self._plan
            | "EveryShard" >> beam.FlatMap(_shard_keys).with_output_types(int)
            | "WriteShards" >> beam.ParDo(writer, beam.pvalue.AsSingleton(self._plan), beam.pvalue.AsList(pieces))
        )


class WriteShardsThroughGroupByKey(_WriteShardsOfPlan):
    """Pieces routed to their shards, one slice per (piece, shard), grouped by shard through the runner's GroupByKey.

    For every runner: the slices carry their frames (``InlineStore``) or only keys and offsets
    (``SpillStore``, writers read the frames back); no worker holds more than one shard.
    """

    def expand(self, pieces):
        plan_side = beam.pvalue.AsSingleton(self._plan)
        routed = (
            pieces
            | "RouteToShards" >> beam.ParDo(_RouteToShards(self._store), plan_side)
            .with_output_types(tuple[int, Piece])
        )
        every_shard = self._plan | "EveryShard" >> beam.FlatMap(_empty_shards).with_output_types(tuple[int, Piece])
        return (
            (routed, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(self._temp_dir, self._store, self._progress), plan_side)
        )


class WriteShuffledShards(beam.PTransform):
    """PCollection[KeyedRecords] -> shuffled, split, exactly balanced shard files in ``temp_dir``.

    The pieces' frames wait in ``store`` (a ``PieceStore``, default inline) between preparing and
    writing. Returns a dict: ``files`` (PCollection[ShardFile], one per shard, empty shards
    included) and ``plan`` (a one-element PCollection[ShardPlan]). ``progress_under`` (a run's local
    staging directory) makes the writers count the examples they write there, for the progress display.
    """

    def __init__(self, spec: ShardingSpec, temp_dir: str, store: PieceStore | None = None,
                 progress_under: str | None = None):
        super().__init__()
        self._spec = spec
        self._temp_dir = temp_dir
        self._store = store or InlineStore()
        self._progress = progress_dir(progress_under) if progress_under is not None else None

    def expand(self, records):
        pieces = records | "SortPieces" >> beam.ParDo(_PreparePieces(self._store)).with_output_types(Piece)
        plan = pieces | "PlanShards" >> beam.CombineGlobally(_PlanShards(self._spec))
        if self._store.pieces_as_side_input:
            writers = WriteShardsFromPieceList(self._temp_dir, self._store, plan, self._progress)
            files = pieces | "WriteShardsFromPieceList" >> writers
        else:
            routed = WriteShardsThroughGroupByKey(self._temp_dir, self._store, plan, self._progress)
            files = pieces | "WriteShardsThroughGroupByKey" >> routed
        return {"files": files, "plan": plan}
