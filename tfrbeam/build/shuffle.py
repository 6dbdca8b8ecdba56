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

Moving the bytes: each input piece is framed once as TFRecords and sorted by (split, key), so
a shard's part of a piece is one contiguous slice (numpy copies payloads per group of equal
length and writes every header and footer at once; the payload CRCs come with the piece,
computed while its records were hashed). One element per (piece, shard) crosses the
GroupByKey: the frames as one buffer plus numpy arrays of keys and offsets, with a coder that is
a few memcpys; boundary buckets go to both neighbouring shards (about 1/64 of a shard each). A
shard writer merges its slices by (key, frame bytes), keeps its exact rank range and writes the
frames (header and footer bytes made with numpy, one join per block). No element is larger than
one piece and no worker holds more than one shard. With ``spill=True`` (the local runners) the
pieces' bytes go to files under the temp dir and only keys and offsets cross Beam; writers read
their slices back. With ``hold_bytes`` (only when every worker runs in this process) pieces up
to that many bytes stay in this process's memory instead: such a piece is ordered by its keys
alone, its payloads stay where the encoder put them (no copy), the shard writers frame them
from there, and it is dropped once its last shard slice is written. Then no piece carries bytes,
so the writers read them all as a side input and cut their own slices: no routing stage and no
GroupByKey, each a whole stage on the local runners.
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

from tfrbeam.naming import shard_file_name
from tfrbeam.record_index import IndexBuilder, index_path_for
from tfrbeam.byte_views import windows
from tfrbeam.records import (
    FOOTER_SIZE, HEADER_SIZE, MAX_PAYLOAD_SIZE, RECORD_OVERHEAD, RecordWriter, frame_records, mask_crcs, masked_crc32c,
)

__all__ = [
    "KeyedRecords",
    "KeyedRecordsCoder",
    "ShardFile",
    "ShardPlan",
    "ShardingSpec",
    "SplitPlan",
    "WriteShuffledShards",
    "bucket_bits_for",
    "content_digests",
    "frame_ordered",
    "input_order_keys",
    "record_checksums",
    "release_held_pieces",
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
# Frame and write this many records at a time, so a writer holds one shard plus one block.
_WRITE_BLOCK_RECORDS = 8192
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
    collection; inside a Beam worker every collection then walks Beam's large heap too, which
    cost more than a third of the build's CPU. The loops create no reference cycles.
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
    view = memoryview(np.ascontiguousarray(buffer, dtype=np.uint8))
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
        framed = frame_gathered(memoryview(np.ascontiguousarray(data, dtype=np.uint8)), starts, starts + lengths)
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
    """Serialized records of one input piece (or its part bound for one shard) with split and sort key.

    ``offsets`` holds the n + 1 bounds of the records, starting at 0; ``split`` (uint16) and
    ``key`` (uint64) are per record. Records are Example payloads, or once prepared for the
    shuffle (``framed``) whole TFRecord frames, so shard writers only concatenate. The bytes are
    in memory (``data``) or spilled: ``[spill_offset, spill_offset + offsets[-1])`` of ``spill_path``.
    ``crcs`` optionally carries the payloads' CRC32C (uint32), computed while they were hashed,
    so framing does not read them again. ``sources`` (pieces held in memory, see _HeldPieces)
    says where each record starts in the held buffer: such a piece is put in order by moving its
    keys only, so its records are not contiguous there (``offsets`` then only give their lengths).
    """

    split: np.ndarray
    key: np.ndarray
    offsets: np.ndarray
    data: np.ndarray | None
    spill_path: str = ""
    spill_offset: int = 0
    framed: bool = False
    crcs: np.ndarray | None = None
    sources: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.key)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_bytes(self) -> int:
        return int(self.offsets[-1])

    def slice(self, start: int, end: int) -> KeyedRecords:
        """Records ``start:end`` without copying payloads (a view, or a narrower range of the spill file)."""
        first, last = int(self.offsets[start]), int(self.offsets[end])
        sliced = dataclasses.replace(
            self, split=self.split[start:end], key=self.key[start:end], offsets=self.offsets[start:end + 1] - first,
            crcs=None if self.crcs is None else self.crcs[start:end],
        )
        if self.sources is not None:
            return dataclasses.replace(sliced, sources=self.sources[start:end])
        if self.data is None:
            return dataclasses.replace(sliced, spill_offset=self.spill_offset + first)
        return dataclasses.replace(sliced, data=self.data[first:last])

    @property
    def framed_lengths(self) -> np.ndarray:
        """Each record's size as a TFRecord frame."""
        return self.lengths if self.framed else self.lengths + RECORD_OVERHEAD

    def sorted_and_framed(self) -> KeyedRecords:
        """The payloads framed as TFRecords, ordered by (split, key), in one new buffer."""
        if self.framed:
            raise ValueError("these records are framed already")
        order = _split_key_order(self.split, self.key)
        payloads = self.payloads()
        crcs = self.crcs if self.crcs is not None else payload_crcs(payloads, self.offsets)
        data, offsets = frame_ordered(payloads, self.offsets, order, crcs)
        return KeyedRecords(self.split[order], self.key[order], offsets, data, framed=True)

    def sorted_in_place(self) -> KeyedRecords:
        """The records ordered by (split, key) without moving their bytes (see ``sources``); CRCs computed if missing."""
        if self.framed or self.sources is not None or self.data is None:
            raise ValueError("sorted_in_place takes in-memory payloads in their own order")
        order = _split_key_order(self.split, self.key)
        lengths = np.diff(self.offsets)[order]
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        crcs = self.crcs if self.crcs is not None else payload_crcs(self.data, self.offsets)
        return KeyedRecords(
            self.split[order], self.key[order], offsets, self.data, crcs=crcs[order], sources=self.offsets[:-1][order]
        )

    def buffer_and_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """A buffer holding the records and where each one starts in it."""
        if self.sources is None:
            return self.payloads(), self.offsets[:-1]
        return (self.data if self.data is not None else _HELD.get(self.spill_path)), self.sources

    def payloads(self) -> np.ndarray:
        """The payload bytes, read from the spill file when spilled (a view when held in this process's memory)."""
        if self.sources is not None:
            raise ValueError("records held out of order have no contiguous payloads (see buffer_and_starts)")
        if self.data is not None:
            return self.data
        if _HeldPieces.holds(self.spill_path):
            return _HELD.get(self.spill_path)[self.spill_offset:self.spill_offset + self.num_bytes]
        with FileSystems.open(self.spill_path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(self.spill_offset)
            data = handle.read(self.num_bytes)
        if len(data) != self.num_bytes:
            raise RuntimeError(f"{self.spill_path}: spill file ends {self.num_bytes - len(data)} bytes early (was it deleted?)")
        return np.frombuffer(data, dtype=np.uint8)

    def spill(self, path: str) -> KeyedRecords:
        """The records as they will be once spilled to ``path`` (no bytes in memory); ``write_spill`` writes them."""
        return dataclasses.replace(self, data=None, spill_path=path, spill_offset=0)

    def write_spill(self, path: str) -> None:
        """Write the payloads to ``path`` (see ``spill``)."""
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.write(memoryview(np.ascontiguousarray(self.data)))

    @classmethod
    def empty(cls) -> KeyedRecords:
        return cls(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.uint8))


class _HeldPieces:
    """Prepared pieces kept in this process's memory for shard writers running in the same process.

    The in-process local runners (DirectRunner in_memory / multi_threading) need no spill file:
    a piece's bytes stay here, up to a byte budget for the whole process, and only their name
    crosses the GroupByKey, like a spill path. A piece is dropped when the last shard slice routed
    from it has been written.
    """

    PREFIX = "tfrbeam-held://"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: dict[str, np.ndarray] = {}
        self._pending: dict[str, int] = {}
        self._expected: set[str] = set()
        self._released: dict[str, set[int]] = {}  # per piece, the shards whose slice was written
        self._done: set[str] = set()  # pieces dropped after their last slice
        self._bytes = 0

    @classmethod
    def holds(cls, path: str) -> bool:
        return path.startswith(cls.PREFIX)

    def hold(self, data: np.ndarray, budget: int, owner: str) -> str | None:
        """Keep ``data`` for the shuffle writing to ``owner`` (its temp dir); its name, or None when that
        would pass ``budget`` bytes held in this process."""
        with self._lock:
            if self._bytes + data.nbytes > budget:
                return None
            name = f"{self.PREFIX}{owner}/{uuid.uuid4().hex}"
            self._pieces[name] = data
            self._pending[name] = 0
            self._bytes += data.nbytes
            return name

    def expect(self, name: str, uses: int) -> None:
        """``uses`` shard slices of piece ``name`` will be read (and released) by shard writers.

        Routing a piece always gives the same slices, so only the first call counts: a piece may be
        routed again (a retried bundle, or each writer bundle routing every piece itself).
        """
        with self._lock:
            if name not in self._expected and name not in self._done:
                self._expected.add(name)
                self._pending[name] += uses

    def get(self, name: str) -> np.ndarray:
        try:
            return self._pieces[name]
        except KeyError:
            raise RuntimeError(
                f"piece {name} is not held in this process: it was prepared by a worker in another process "
                "(hold pieces in memory only when every worker runs in this process)"
            ) from None

    def release(self, name: str, shard_key: int) -> None:
        """The slice of piece ``name`` for shard ``shard_key`` was written; drop the piece after its last one.

        A retried shard write releases its slices again: each shard counts once.
        """
        with self._lock:
            if name in self._done:
                return
            released = self._released.setdefault(name, set())
            if shard_key in released:
                return
            released.add(shard_key)
            self._pending[name] -= 1
            if self._pending[name] <= 0:
                self._drop(name)
                self._done.add(name)

    def release_all(self, owner: str) -> None:
        """Drop every piece of the shuffle writing to ``owner`` (after a failed run)."""
        prefix = f"{self.PREFIX}{owner}/"
        with self._lock:
            for name in [name for name in self._pieces if name.startswith(prefix)]:
                self._drop(name)
            self._done = {name for name in self._done if not name.startswith(prefix)}

    def _drop(self, name: str) -> None:
        del self._pending[name]
        self._expected.discard(name)
        self._released.pop(name, None)
        self._bytes -= self._pieces.pop(name).nbytes

    @property
    def held_bytes(self) -> int:
        return self._bytes


_HELD = _HeldPieces()


def release_held_pieces(temp_dir: str) -> None:
    """Free the pieces a failed WriteShuffledShards into ``temp_dir`` still holds in this process's memory."""
    _HELD.release_all(temp_dir)


_KEYED_HEADER = struct.Struct("<QQQI????")


def _raw(array: np.ndarray, dtype: str) -> np.ndarray:
    """An array's bytes in a fixed layout, as a uint8 view (no copy when it already has that layout)."""
    return np.ascontiguousarray(array, dtype=dtype).view(np.uint8)


class KeyedRecordsCoder(beam.coders.Coder):
    """Encodes KeyedRecords as a header and raw arrays: one copy per element, not a coder call per record."""

    def encode(self, value: KeyedRecords) -> bytes:
        count = len(value.key)
        spilled = value.data is None
        data = np.zeros(0, np.uint8) if spilled else _raw(value.data, "u1")
        path = value.spill_path.encode("utf-8")
        has_crcs, has_sources = value.crcs is not None, value.sources is not None
        return b"".join((
            _KEYED_HEADER.pack(count, len(data), value.spill_offset, len(path), spilled, value.framed, has_crcs, has_sources),
            path,
            _raw(value.split, "<u2"),
            _raw(value.key, "<u8"),
            _raw(value.offsets, "<i8"),
            _raw(value.crcs, "<u4") if has_crcs else b"",
            _raw(value.sources, "<i8") if has_sources else b"",
            data,
        ))

    def estimate_size(self, value: KeyedRecords) -> int:
        """The encoded size, computed: Beam samples element sizes, and the default encodes a whole piece to measure it."""
        count = len(value.key)
        data = 0 if value.data is None else np.asarray(value.data).nbytes
        optional = (0 if value.crcs is None else 4 * count) + (0 if value.sources is None else 8 * count)
        return _KEYED_HEADER.size + len(value.spill_path.encode("utf-8")) + 18 * count + 8 + optional + data

    def decode(self, encoded: bytes) -> KeyedRecords:
        count, size, spill_offset, path_size, spilled, framed, has_crcs, has_sources = _KEYED_HEADER.unpack_from(encoded)
        position = _KEYED_HEADER.size
        path = bytes(encoded[position:position + path_size]).decode("utf-8")
        position += path_size
        split = np.frombuffer(encoded, dtype="<u2", count=count, offset=position)
        position += 2 * count
        key = np.frombuffer(encoded, dtype="<u8", count=count, offset=position)
        position += 8 * count
        offsets = np.frombuffer(encoded, dtype="<i8", count=count + 1, offset=position)
        position += 8 * (count + 1)
        crcs = sources = None
        if has_crcs:
            crcs = np.frombuffer(encoded, dtype="<u4", count=count, offset=position)
            position += 4 * count
        if has_sources:
            sources = np.frombuffer(encoded, dtype="<i8", count=count, offset=position)
            position += 8 * count
        data = None if spilled else np.frombuffer(encoded, dtype=np.uint8, count=size, offset=position)
        return KeyedRecords(split, key, offsets, data, path, spill_offset, framed, crcs, sources)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return KeyedRecords


beam.coders.registry.register_coder(KeyedRecords, KeyedRecordsCoder)


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
    num_examples: int
    num_bytes: int
    sha256: str


# -------------------------------------------------------------------------------- bucket counts


def _record_buckets(records: KeyedRecords, spec: ShardingSpec) -> np.ndarray:
    """The bucket id of each record of a sorted piece: top key bits (hash mode) or its row block's first key (ordered)."""
    if not spec.ordered:
        return records.key >> np.uint64(64 - spec.bucket_bits)
    position = np.arange(len(records))
    within = position - np.searchsorted(records.split, records.split, side="left")
    return records.key[position - within % ORDERED_BLOCK_ROWS]


def _histogram(records: KeyedRecords, spec: ShardingSpec) -> tuple[np.ndarray, ...]:
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

    def add_input(self, accumulator, records: KeyedRecords):
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
    """Orders each piece's records by (split, key), so that every shard's part is one range.

    A piece kept in this process's memory (within ``hold_bytes``, see _HeldPieces) is ordered by
    its keys only (``sorted_in_place``); shard writers frame its records. Any other piece is
    framed and sorted into a new buffer, then spilled to a file if asked, or passed on whole
    through the GroupByKey. Spill files are written by a background
    thread (the write releases the GIL and overlaps with preparing the next piece; at most one
    more piece waits) and are complete when the bundle finishes. Only shard writers read them,
    after a GroupByKey, so always in a later bundle.
    """

    def __init__(self, temp_dir: str, spill: bool, hold_bytes: int = 0):
        self._temp_dir = temp_dir
        self._spill_dir = FileSystems.join(temp_dir, SPILL_DIR_NAME) if spill else None
        self._hold_bytes = hold_bytes

    def setup(self) -> None:
        self._executor = None
        if self._spill_dir is not None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrbeam-spill")
        self._pending: list[concurrent.futures.Future] = []

    def start_bundle(self) -> None:
        self._pending = []

    def process(self, records: KeyedRecords) -> Iterator[KeyedRecords]:
        if not len(records):
            return
        held = None
        if self._hold_bytes and records.data is not None and not records.framed:
            held = _HELD.hold(records.data, self._hold_bytes, self._temp_dir)
        if held is not None:
            yield dataclasses.replace(records.sorted_in_place(), data=None, spill_path=held)
            return
        prepared = records.sorted_and_framed()
        if self._executor is None:
            yield prepared
            return
        path = FileSystems.join(self._spill_dir, f"{uuid.uuid4().hex}.bin")
        self._wait_for_spills(keep=1)
        self._pending.append(self._executor.submit(prepared.write_spill, path))
        yield prepared.spill(path)

    def finish_bundle(self) -> None:
        self._wait_for_spills(keep=0)

    def teardown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def _wait_for_spills(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.pop(0).result()


def _route(records: KeyedRecords, plan: ShardPlan) -> list[tuple[int, KeyedRecords]]:
    """A sorted piece's records cut by the shard(s) its buckets' rank ranges overlap: one slice per shard.

    Registers the slices of a piece held in memory, so it is dropped after the last one is written.
    """
    if not len(records):
        return []
    buckets = _record_buckets(records, plan.spec)
    split_bounds = np.searchsorted(records.split, np.arange(len(plan.splits) + 1))
    routed: list[tuple[int, KeyedRecords]] = []
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
                routed.append((_shard_key(index, shard), records.slice(low, high)))
    if _HeldPieces.holds(records.spill_path):
        _HELD.expect(records.spill_path, len(routed))
    return routed


class _RouteToShards(beam.DoFn):
    """Sends each sorted piece's records to the shard(s) they belong to, one slice per shard (see _route)."""

    def process(self, records: KeyedRecords, plan: ShardPlan) -> Iterator[tuple[int, KeyedRecords]]:
        yield from _route(records, plan)


def _shard_keys(plan: ShardPlan) -> Iterator[int]:
    """Every shard's key, so that every shard (even one with no records) is written."""
    for index, split_plan in enumerate(plan.splits):
        for shard in range(split_plan.num_shards):
            yield _shard_key(index, shard)


def _empty_shards(plan: ShardPlan) -> Iterator[tuple[int, KeyedRecords]]:
    """One empty element per shard, so every shard (even one with no records) is written."""
    for key in _shard_keys(plan):
        yield key, KeyedRecords.empty()


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


class _Received:
    """The records one shard writer received, addressed by a flat position across all parts, framed as they are written.

    Parts are framed records (sorted pieces) or payloads with their CRCs (held pieces); either
    way a record is a payload slice, its length and its masked CRC.
    """

    def __init__(self, parts: list[KeyedRecords]):
        self.views: list[memoryview] = []
        starts, lengths, footers = [], [], []
        for part in parts:
            buffer, record_starts = part.buffer_and_starts()
            sizes = part.lengths
            if part.framed:
                # The stored footer is the masked CRC; re-framing writes the same header and footer.
                footers.append(windows(buffer, 4)[record_starts + sizes - FOOTER_SIZE].view("<u4"))
                record_starts, sizes = record_starts + HEADER_SIZE, sizes - RECORD_OVERHEAD
            else:
                crcs = part.crcs if part.crcs is not None else payload_crcs(buffer, part.offsets)
                footers.append(mask_crcs(crcs))
            self.views.append(memoryview(np.ascontiguousarray(buffer, dtype=np.uint8)))
            starts.append(record_starts)
            lengths.append(sizes)
        if parts:
            self.keys = np.concatenate([part.key for part in parts])
            self.part_of = np.repeat(np.arange(len(parts)), [len(part) for part in parts])
            self.starts = np.concatenate(starts).astype(np.int64, copy=False)
            self.lengths = np.concatenate(lengths).astype(np.int64, copy=False)
            self.footers = np.concatenate(footers)
        else:
            self.keys = np.zeros(0, np.uint64)
            self.part_of = self.starts = self.lengths = np.zeros(0, np.int64)
            self.footers = np.zeros(0, "<u4")

    def frame(self, position: int) -> bytes:
        """One record's whole frame (to order records with equal keys by their bytes)."""
        return _join_frames([self._payload(position)], self.lengths[position:position + 1], self.footers[position:position + 1])

    def _payload(self, position: int) -> memoryview:
        start = int(self.starts[position])
        return self.views[self.part_of[position]][start:start + int(self.lengths[position])]

    def payload_lengths(self, positions: np.ndarray) -> np.ndarray:
        return self.lengths[positions]

    def frames(self, positions: np.ndarray) -> bytes:
        """The frames of the records at ``positions``, in that order, as one buffer."""
        views = self.views
        starts = self.starts[positions]
        with gc_paused():
            payloads = [
                views[part][start:end]
                for part, start, end in zip(
                    self.part_of[positions].tolist(), starts.tolist(), (starts + self.lengths[positions]).tolist()
                )
            ]
            return _join_frames(payloads, self.lengths[positions], self.footers[positions])


class _WriteShard(beam.DoFn):
    """Sorts one shard's records by (key, bytes), keeps its exact rank range and writes it to the temp dir."""

    def __init__(self, temp_dir: str):
        self._temp_dir = temp_dir

    def process(self, element: tuple[int, Iterable[KeyedRecords]], plan: ShardPlan) -> Iterator[ShardFile]:
        shard_key, parts = element
        split_index, shard = shard_key >> _FRAMED_SHARD_KEY_BITS, shard_key & ((1 << _FRAMED_SHARD_KEY_BITS) - 1)
        split_plan = plan.splits[split_index]
        parts = [part for part in parts if len(part)]
        low, high = split_plan.shard_start(shard), split_plan.shard_start(shard + 1)
        try:
            received = _Received(parts)
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
                if _HeldPieces.holds(part.spill_path):
                    _HELD.release(part.spill_path, shard_key)
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
        index = IndexBuilder() if spec.write_index and spec.compression is None else None
        handle = _HashingFile(FileSystems.create(temp_path, compression_type=CompressionTypes.UNCOMPRESSED))
        try:
            writer = RecordWriter(handle, spec.compression)
            for start in range(0, len(kept), _WRITE_BLOCK_RECORDS):
                positions = kept[start:start + _WRITE_BLOCK_RECORDS]
                if index is not None:
                    index.add_batch(writer.bytes_written, writer.records_written, received.payload_lengths(positions))
                writer.write_framed(received.frames(positions), len(positions))
            writer.close()
        finally:
            handle.close()
        temp_index_path = None
        if index is not None:
            temp_index_path = index_path_for(temp_path)
            with FileSystems.create(temp_index_path, compression_type=CompressionTypes.UNCOMPRESSED) as index_file:
                # mtime None: a rename (a copy on object stores) changes it, and reruns stay byte-identical.
                index_file.write(index.to_bytes(handle.size, None, len(kept)))
        beam.metrics.Metrics.counter("tfrbeam", "examples_written").inc(len(kept))
        _LOG.info(
            "wrote %s: %d examples, %d bytes in %.1f s", relative_path, len(kept), handle.size, time.monotonic() - started
        )
        return ShardFile(
            split=split_plan.name, shard=shard, num_shards=split_plan.num_shards, relative_path=relative_path,
            temp_path=temp_path, temp_index_path=temp_index_path, num_examples=len(kept), num_bytes=handle.size,
            sha256=handle.sha256_hex,
        )


class _WriteShardOfPieces(_WriteShard):
    """Writes the shard of each key it gets, routing the pieces (a side input, no bytes in them) itself.

    The pieces are routed once per bundle; each shard's slices are dropped once written.
    """

    def start_bundle(self) -> None:
        self._parts: dict[int, list[KeyedRecords]] | None = None

    def process(self, shard_key: int, plan: ShardPlan, pieces: list[KeyedRecords]) -> Iterator[ShardFile]:
        if self._parts is None:
            self._parts = collections.defaultdict(list)
            for piece in pieces:
                for key, part in _route(piece, plan):
                    self._parts[key].append(part)
        yield from super().process((shard_key, self._parts.pop(shard_key, [])), plan)


class WriteShuffledShards(beam.PTransform):
    """PCollection[KeyedRecords] -> shuffled, split, exactly balanced shard files in ``temp_dir``.

    Returns a dict: ``files`` (PCollection[ShardFile], one per shard, empty shards included) and
    ``plan`` (a one-element PCollection[ShardPlan]).
    """

    def __init__(self, spec: ShardingSpec, temp_dir: str, spill: bool = False, hold_bytes: int = 0):
        super().__init__()
        self._spec = spec
        self._temp_dir = temp_dir
        self._spill = spill
        self._hold_bytes = hold_bytes

    def expand(self, pieces):
        prepare = _PreparePieces(self._temp_dir, self._spill, self._hold_bytes)
        pieces = pieces | "SortPieces" >> beam.ParDo(prepare).with_output_types(KeyedRecords)
        plan = pieces | "PlanShards" >> beam.CombineGlobally(_PlanShards(self._spec))
        plan_side = beam.pvalue.AsSingleton(plan)
        if self._hold_bytes:
            # Every worker runs in this process and pieces carry no bytes (held, or spilled past the
            # budget): the writers take them as a side input, without a routing stage and a GroupByKey.
            files = (
                plan
                | "EveryShard" >> beam.FlatMap(_shard_keys).with_output_types(int)
                | "WriteShards" >> beam.ParDo(_WriteShardOfPieces(self._temp_dir), plan_side, beam.pvalue.AsList(pieces))
            )
            return {"files": files, "plan": plan}
        routed = (
            pieces
            | "RouteToShards" >> beam.ParDo(_RouteToShards(), plan_side)
            .with_output_types(typing.Tuple[int, KeyedRecords])
        )
        every_shard = plan | "EveryShard" >> beam.FlatMap(_empty_shards).with_output_types(typing.Tuple[int, KeyedRecords])
        files = (
            (routed, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(self._temp_dir), plan_side)
        )
        return {"files": files, "plan": plan}
