"""The read index: where the records of an uncompressed TFRecord file start, in one file beside it.

An uncompressed TFRecord file has no marker a reader dropped at a byte offset can trust to find
the next record (a payload may hold bytes that look like one), and record ``n`` is found only by
walking the records before it. So tfrbeam's writers store, next to each uncompressed file they
write, ``<dir>/.tfrbeam-index/<file name>.index``. The hidden sibling directory is not matched by
the globs people use for shards (``<prefix>-*``, ``*.tfrecord*``, ``<dir>/*`` on object stores,
where ``*`` does not cross ``/``), and TensorFlow never opens it.

The file has two sections, each with its own header and CRC, both describing the same data file:

1. **The split table**: ``(offset, record number)`` of the first record that starts at or after
   every ``INDEX_INTERVAL_BYTES`` (1 MiB) boundary, 16 bytes a MiB. A reader of a byte range starts
   at the entry at or before it and walks record headers forward, so split points land exactly on
   record starts; a seek to a record does the same. It comes first, so a reader that only splits
   or seeks reads the front of the file (``load_split_table``, ``trusted_index``), never the whole.
2. **The record starts**: every record's offset, then the file size, 8 bytes a record. Random
   access reads any record in one seek (``load_offsets``); a sequential read checks a block's
   headers against them at once instead of walking them one by one (``indexed_record_starts``).

Format (little-endian), each section exactly as the file of its own that datasets written before
kept it in (``<name>.idx``, ``<name>.offsets``)::

    split table                                  record starts
    magic        8 bytes  b"TFRBIDX1"            magic        8 bytes  b"TFRBOFS1"
    version      uint32   1                      version      uint32   1
    interval     uint32   bytes between bounds   reserved     uint32   0
    file_size    uint64                          file_size    uint64
    mtime        float64  NaN when unknown       mtime        float64  NaN when unknown
    num_records  uint64                          num_records  uint64
    num_entries  uint64                          offsets      (num_records + 1) x uint64
    entries      num_entries x (offset uint64, record uint64), both strictly increasing
    crc          uint32   masked CRC32C of every byte of the section before it (in both)

Datasets written before keep each section in a file of its own, ``.idx`` and ``.offsets`` (one,
both or neither); readers use them where there is no ``.index``, and nothing writes them any more.

Trust, all of it here: a section whose size or mtime does not match its data file is stale; a
malformed one raises ``RecordIndexError`` (``parse_read_index``); the two sections of one file must
agree. Readers log and ignore both and walk the record headers instead. Before a local seek or
split the entries used are checked against the data (``trusted_index``: a length CRC at the entry,
and a header walk to the next entry); an index that records no mtime is checked whole, once per
process. Record starts are used for random access only when every offset holds a header whose
length leads exactly to the next (``offsets_problem``, vectorised over a memory map). Writers record
the mtime of the file as finally named with ``stamp_read_index``. No Beam imports here.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import mmap
import os
import posixpath
import struct
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from crc32c import crc32c

from tfrbeam.base import fileops
from tfrbeam.base.bounded_read import open_found, open_regular, read_regular
from tfrbeam.base.object_store import is_object_store, read_small_object
from tfrbeam.errors import RecordError, RecordIndexError, RefusedFileError
from tfrbeam.tfrecord.blocks import length_crcs_match, record_blocks
from tfrbeam.tfrecord.records import HEADER_SIZE, MAX_PAYLOAD_SIZE, RECORD_OVERHEAD, mask_crc, masked_crc32c, sound_header

_LOG = logging.getLogger(__name__)

INDEX_DIR_NAME = ".tfrbeam-index"  # read indexes of a directory's files, inside the directory
INDEX_SUFFIX = ".index"
TABLE_SUFFIX = ".idx"  # the split table alone: what datasets written before the .index kept
STARTS_SUFFIX = ".offsets"  # the record starts alone: likewise
INDEX_SUFFIXES = (INDEX_SUFFIX, TABLE_SUFFIX, STARTS_SUFFIX)
INDEX_INTERVAL_BYTES = 1 << 20
# Readers and writers may see the same mtime through different float conversions.
MTIME_TOLERANCE_SECONDS = 1e-3

_TABLE_MAGIC = b"TFRBIDX1"
_STARTS_MAGIC = b"TFRBOFS1"
_VERSION = 1
_TABLE_HEADER = struct.Struct("<8sIIQdQQ")
_STARTS_HEADER = struct.Struct("<8sIIQdQ")
_CRC = struct.Struct("<I")
_MTIME_OFFSET = 8 + 4 + 4 + 8  # in both headers: magic, version, interval or reserved, file_size
_ENTRY_BYTES = 16  # (offset, record number)
_CHECK_CHUNK = 1 << 16  # records whose headers are gathered at once while checking record starts
# Stamping streams an index this many bytes at a time: every shard of a build is stamped at once,
# and whole indexes (8 bytes a record, twice: read and patched) made a 5M-row build's last step its memory peak.
_STAMP_CHUNK_BYTES = 1 << 20


def index_path_for(data_path: str, suffix: str = INDEX_SUFFIX) -> str:
    """Where the read index of ``data_path`` lives: ``<dir>/.tfrbeam-index/<name>.index`` (or another suffix's)."""
    path = os.fspath(data_path)
    pathmod = posixpath if "://" in path else os.path
    directory, name = pathmod.split(path)
    if not name:
        raise ValueError(f"{path!r} names a directory, not a data file")
    return pathmod.join(directory, INDEX_DIR_NAME, name + suffix)


def index_paths_for(data_path: str) -> list[str]:
    """Every name a read index of ``data_path`` may have: its ``.index``, then the ``.idx`` and ``.offsets`` of datasets
    written before (what goes with the file when it is replaced or removed)."""
    return [index_path_for(data_path, suffix) for suffix in INDEX_SUFFIXES]


# ------------------------------------------------------------------------------ what an index says


@dataclasses.dataclass(frozen=True)
class SplitTable:
    """Record starts about every ``interval`` bytes of one data file: enough to split it, or to seek in it."""

    file_size: int
    mtime: float | None
    num_records: int
    offsets: tuple[int, ...]
    record_numbers: tuple[int, ...]
    interval: int = INDEX_INTERVAL_BYTES

    def is_current(self, file_size: int, mtime: float | None) -> bool:
        """Whether this still describes a file of this size and mtime (an unknown mtime is not compared)."""
        return metadata_problem(self.file_size, self.mtime, file_size, mtime) is None

    def entry_at_or_before(self, offset: int) -> tuple[int, int]:
        """The ``(offset, record_number)`` closest at or before ``offset``; (0, 0), the first record, if none."""
        position = bisect.bisect_right(self.offsets, offset) - 1
        if position < 0:
            return 0, 0
        return self.offsets[position], self.record_numbers[position]

    def restricted_to(self, start: int, stop: int) -> SplitTable:
        """The entries a reader of byte range [start, stop) can use: the one at or before start and those inside."""
        first = max(bisect.bisect_right(self.offsets, start) - 1, 0)
        last = bisect.bisect_left(self.offsets, stop)
        return dataclasses.replace(self, offsets=self.offsets[first:last], record_numbers=self.record_numbers[first:last])


@dataclasses.dataclass(frozen=True)
class RecordStarts:
    """Every record start of one data file, then its size (``offsets``)."""

    file_size: int
    mtime: float | None
    offsets: np.ndarray

    @property
    def num_records(self) -> int:
        return len(self.offsets) - 1


@dataclasses.dataclass(frozen=True)
class ReadIndex:
    """What one index file holds: its split table, its record starts, or (every ``.index`` a writer makes) both."""

    path: str
    table: SplitTable | None
    starts: RecordStarts | None

    def split_table(self) -> SplitTable:
        """The split table, made from the record starts where the file has none (an ``.offsets`` of before)."""
        if self.table is not None:
            return self.table
        assert self.starts is not None
        return split_table_of(self.starts.offsets, self.starts.mtime)

    @property
    def file_size(self) -> int:
        return self.table.file_size if self.table is not None else self.starts.file_size  # type: ignore[union-attr]

    @property
    def mtime(self) -> float | None:
        return self.table.mtime if self.table is not None else self.starts.mtime  # type: ignore[union-attr]

    @property
    def num_records(self) -> int:
        return self.table.num_records if self.table is not None else self.starts.num_records  # type: ignore[union-attr]


def metadata_problem(indexed_size: int, indexed_mtime: float | None, file_size: int, mtime: float | None) -> str | None:
    """Why an index of a file of ``indexed_size`` bytes and ``indexed_mtime`` does not describe this one (None: it does)."""
    if indexed_size != file_size:
        return f"it describes a file of {indexed_size} bytes, the file has {file_size}"
    if indexed_mtime is not None and mtime is not None and abs(float(mtime) - indexed_mtime) > MTIME_TOLERANCE_SECONDS:
        return f"it describes a file last modified at {indexed_mtime}, the file's mtime is {mtime}"
    return None


# ------------------------------------------------------------------------------ writing


class ReadIndexBuilder:
    """Collects every record start while a file is written; ``to_bytes`` makes its read index file.

    Feed it every record with ``add``, or whole framed batches with ``add_batch``, in order, none left out.
    """

    def __init__(self, interval: int = INDEX_INTERVAL_BYTES):
        if not 0 < interval < 2**32:
            raise ValueError(f"index interval must be between 1 and 2**32 - 1 bytes, got {interval}")
        self.interval = interval
        self._pieces: list[np.ndarray] = []
        self._records = 0
        self._next_offset = 0

    @property
    def num_records(self) -> int:
        return self._records

    def add(self, offset: int, record_number: int) -> None:
        """The record ``record_number`` starts at ``offset``."""
        self._check_next(offset, record_number)
        self._pieces.append(np.array([offset], dtype=np.int64))
        self._records += 1
        self._next_offset = -1  # one record's length is unknown until the next start or the file size

    def add_batch(self, start_offset: int, first_record_number: int, payload_lengths: Sequence[int] | np.ndarray) -> None:
        """Consecutive records framed in one piece from ``start_offset``, with these payload lengths."""
        lengths = np.asarray(payload_lengths, dtype=np.int64)
        if not lengths.size:
            return
        self._check_next(start_offset, first_record_number)
        starts = np.empty(lengths.size, dtype=np.int64)
        starts[0] = start_offset
        np.cumsum(lengths[:-1] + RECORD_OVERHEAD, out=starts[1:])
        starts[1:] += start_offset
        self._pieces.append(starts)
        self._records += lengths.size
        self._next_offset = int(starts[-1] + lengths[-1] + RECORD_OVERHEAD)

    def _check_next(self, offset: int, record_number: int) -> None:
        if record_number != self._records or (self._next_offset >= 0 and offset != self._next_offset):
            raise ValueError(
                f"the read index needs every record in order: got record {record_number} at offset {offset}, "
                f"expected record {self._records}" + (f" at offset {self._next_offset}" if self._next_offset >= 0 else "")
            )

    def offsets(self, file_size: int) -> np.ndarray:
        """Every record start, then ``file_size``."""
        return np.concatenate(self._pieces + [np.array([file_size], dtype=np.int64)])

    def to_bytes(self, file_size: int, mtime: float | None) -> bytes:
        """The read index file of the finished file of ``file_size`` bytes (mtime None: stamped later)."""
        return read_index_bytes(self.offsets(file_size), mtime, self.interval)


def split_table_of(offsets: np.ndarray, mtime: float | None, interval: int = INDEX_INTERVAL_BYTES) -> SplitTable:
    """The split table of a file whose record starts (then size) are ``offsets``: the first record at or after each
    multiple of ``interval``."""
    offsets = np.asarray(offsets, dtype=np.int64)
    starts = offsets[:-1]
    positions = np.zeros(0, dtype=np.int64)
    if starts.size:
        boundaries = np.arange(0, int(starts[-1]) + 1, interval, dtype=np.int64)
        positions = np.unique(np.searchsorted(starts, boundaries, side="left"))
    return SplitTable(int(offsets[-1]), mtime, int(starts.size), tuple(starts[positions].tolist()),
                      tuple(positions.tolist()), interval)


def table_bytes(table: SplitTable) -> bytes:
    """The split table section (alone, what an ``.idx`` file of before held)."""
    entries = np.empty((len(table.offsets), 2), dtype="<u8")
    entries[:, 0] = table.offsets
    entries[:, 1] = table.record_numbers
    header = _TABLE_HEADER.pack(_TABLE_MAGIC, _VERSION, table.interval, table.file_size,
                                math.nan if table.mtime is None else float(table.mtime), table.num_records,
                                len(table.offsets))
    body = header + entries.tobytes()
    return body + _CRC.pack(masked_crc32c(body))


def starts_bytes(offsets: np.ndarray, mtime: float | None) -> bytes:
    """The record starts section of these offsets (every record start, then the file size; alone, an ``.offsets``)."""
    offsets = np.asarray(offsets, dtype="<u8")
    if offsets.size < 1 or (offsets.size > 1 and np.any(np.diff(offsets.astype(np.int64)) < RECORD_OVERHEAD)):
        raise ValueError("offsets must end with the file size and leave at least 16 bytes per record")
    header = _STARTS_HEADER.pack(
        _STARTS_MAGIC, _VERSION, 0, int(offsets[-1]), math.nan if mtime is None else float(mtime), offsets.size - 1
    )
    body = header + offsets.tobytes()
    return body + _CRC.pack(masked_crc32c(body))


def read_index_bytes(offsets: np.ndarray, mtime: float | None, interval: int = INDEX_INTERVAL_BYTES) -> bytes:
    """The read index file of a file whose record starts (then size) are ``offsets``: its split table, then those."""
    return table_bytes(split_table_of(offsets, mtime, interval)) + starts_bytes(offsets, mtime)


# ------------------------------------------------------------------------------ parsing


def _failure(index_path: str) -> Callable[[str], RecordIndexError]:
    def fail(reason: str) -> RecordIndexError:
        return RecordIndexError(f"{index_path}: not a valid tfrbeam read index: {reason}; delete it (readers then walk "
                                "the record headers, and random access writes a fresh one)")
    return fail


def table_length(data: bytes | memoryview, index_path: str) -> int:
    """The length of the split table section at the front of ``data`` (its header at least), from its header."""
    if len(data) < _TABLE_HEADER.size:
        raise _failure(index_path)(f"{len(data)} bytes is shorter than the {_TABLE_HEADER.size}-byte header")
    magic, version = struct.unpack_from("<8sI", data)
    if magic != _TABLE_MAGIC or version != _VERSION:
        raise _failure(index_path)(f"magic {magic!r} version {version} is not {_TABLE_MAGIC!r} version {_VERSION}")
    num_entries = struct.unpack_from("<Q", data, _TABLE_HEADER.size - 8)[0]
    return _TABLE_HEADER.size + _ENTRY_BYTES * num_entries + _CRC.size


def parse_table(data: bytes | memoryview, index_path: str) -> SplitTable:
    """The split table section that ``data`` starts with (what follows it is not read)."""
    fail = _failure(index_path)
    length = table_length(data, index_path)
    if len(data) < length:
        raise fail(f"its split table needs {length} bytes, the file has {len(data)}")
    _, _, interval, file_size, mtime, num_records, num_entries = _TABLE_HEADER.unpack_from(data)
    if interval == 0:
        raise fail("its interval is 0 bytes (tfrbeam writes 1 to 2**32 - 1)")
    if masked_crc32c(memoryview(data)[: length - _CRC.size]) != _CRC.unpack_from(data, length - _CRC.size)[0]:
        raise fail("checksum mismatch (the file is damaged)")
    entries = np.frombuffer(data, dtype="<u8", count=2 * num_entries, offset=_TABLE_HEADER.size).reshape(-1, 2)
    offsets, record_numbers = tuple(entries[:, 0].tolist()), tuple(entries[:, 1].tolist())
    _check_entries(offsets, record_numbers, file_size, num_records, fail)
    return SplitTable(file_size, None if math.isnan(mtime) else mtime, num_records, offsets, record_numbers, interval)


def _check_entries(offsets: tuple[int, ...], record_numbers: tuple[int, ...], file_size: int, num_records: int,
                   fail: Callable[[str], RecordIndexError]) -> None:
    """Entries must increase, fit the file, and leave at least 16 bytes (an empty record) per record between them."""
    if num_records * RECORD_OVERHEAD > file_size:
        raise fail(f"{num_records} records cannot fit in {file_size} bytes")
    previous_offset, previous_number = -1, -1
    for offset, number in zip(offsets, record_numbers):
        if offset <= previous_offset or number <= previous_number:
            raise fail(f"entries do not increase at offset {offset} (record {number})")
        if offset >= file_size or number >= num_records:
            raise fail(f"entry at offset {offset} (record {number}) lies outside the file")
        if offset < number * RECORD_OVERHEAD or (
            previous_offset >= 0 and offset - previous_offset < (number - previous_number) * RECORD_OVERHEAD
        ):
            raise fail(f"entry at offset {offset} (record {number}) leaves less than 16 bytes per record")
        previous_offset, previous_number = offset, number


def parse_starts(data: bytes | memoryview, index_path: str) -> RecordStarts:
    """The record starts section that is the whole of ``data``."""
    view = memoryview(data)
    file_size, mtime, num_records = _checked_starts(lambda start, stop: view[start:stop], len(view), index_path)
    offsets = np.frombuffer(view, dtype="<u8", count=num_records + 1, offset=_STARTS_HEADER.size).astype(np.int64)
    return RecordStarts(file_size, None if math.isnan(mtime) else mtime, offsets)


def _checked_starts(read: Callable[[int, int], bytes | memoryview], length: int, index_path: str,
                    chunk: int | None = None) -> tuple[int, float, int]:
    """(file size, mtime, records) of a record starts section of ``length`` bytes read through ``read(start, stop)``,
    after checking its header, size, CRC and last offset; ``chunk`` bounds each read."""
    fail = _failure(index_path)
    if length < _STARTS_HEADER.size + 8 + _CRC.size:
        raise fail(f"its record starts are {length} bytes, too short")
    magic, version, _, file_size, mtime, num_records = _STARTS_HEADER.unpack(read(0, _STARTS_HEADER.size))
    if magic != _STARTS_MAGIC or version != _VERSION:
        raise fail(f"magic {magic!r} version {version} is not {_STARTS_MAGIC!r} version {_VERSION}")
    if length != _STARTS_HEADER.size + 8 * (num_records + 1) + _CRC.size:
        raise fail(f"{num_records} record starts need {_STARTS_HEADER.size + 8 * (num_records + 1) + _CRC.size} "
                   f"bytes, the file has {length}")
    body_end = length - _CRC.size
    if mask_crc(_crc_of(read, 0, body_end, chunk or body_end)) != _CRC.unpack(read(body_end, length))[0]:
        raise fail("checksum mismatch (the file is damaged)")
    end = _STARTS_HEADER.size + 8 * num_records
    last_offset = struct.unpack("<Q", read(end, end + 8))[0]
    if last_offset != file_size:
        raise fail(f"its last offset {last_offset} is not the file size {file_size}")
    return file_size, mtime, num_records


def _crc_of(read: Callable[[int, int], bytes | memoryview], start: int, stop: int, chunk: int, crc: int = 0) -> int:
    """The unmasked CRC32C of bytes start..stop, read ``chunk`` bytes at a time, continuing from ``crc``."""
    for begin in range(start, stop, max(1, chunk)):
        crc = crc32c(read(begin, min(stop, begin + chunk)), crc)
    return crc


def parse_read_index(data: bytes | memoryview, index_path: str) -> ReadIndex:
    """Parse and check an index file's bytes (either section alone, or the split table then the record starts)."""
    if bytes(data[:8]) == _STARTS_MAGIC:
        return ReadIndex(index_path, None, parse_starts(data, index_path))
    table = parse_table(data, index_path)
    length = table_length(data, index_path)
    if length == len(data):
        return ReadIndex(index_path, table, None)
    starts = parse_starts(memoryview(data)[length:], index_path)
    problem = _sections_disagree(table, starts)
    if problem is not None:
        raise _failure(index_path)(problem)
    return ReadIndex(index_path, table, starts)


def _sections_disagree(table: SplitTable, starts: RecordStarts) -> str | None:
    if (table.file_size, table.num_records) != (starts.file_size, starts.num_records):
        return (f"its split table describes {table.num_records} records in {table.file_size} bytes, its record starts "
                f"{starts.num_records} in {starts.file_size}")
    if (table.mtime is None) != (starts.mtime is None) or (table.mtime is not None and table.mtime != starts.mtime):
        return f"its split table records mtime {table.mtime}, its record starts {starts.mtime}"
    numbers = np.asarray(table.record_numbers, dtype=np.int64)
    if numbers.size and not np.array_equal(starts.offsets[numbers], np.asarray(table.offsets, dtype=np.int64)):
        return "its split table's entries are not among its record starts"
    return None


def max_table_bytes(file_size: int, interval: int = RECORD_OVERHEAD) -> int:
    """The most bytes a split table of a file of ``file_size`` bytes can hold with entries ``interval`` bytes apart
    (16, the default: an entry per record at most)."""
    return _TABLE_HEADER.size + _ENTRY_BYTES * (file_size // interval + 1) + _CRC.size


def max_starts_bytes(file_size: int) -> int:
    """The most bytes record starts of a file of ``file_size`` bytes can hold: a record per 16 bytes at most."""
    return _STARTS_HEADER.size + 8 * (file_size // RECORD_OVERHEAD + 2) + _CRC.size


def max_index_bytes(file_size: int) -> int:
    """The most bytes any read index file of a data file of ``file_size`` bytes can hold."""
    return max_table_bytes(file_size) + max_starts_bytes(file_size)


# ------------------------------------------------------------------------------ stamping


def stamp_read_index(data_path: str, index_path: str | None = None) -> None:
    """Record the local data file's mtime in its read index (call once the file is closed and renamed).

    Every section's header gets it and a renewed CRC. The index is checked and rewritten a chunk at
    a time (through a temporary file and a rename, so a reader never sees half of it), never held whole.
    """
    index_path = index_path or index_path_for(data_path)
    file_size, mtime = os.path.getsize(data_path), float(os.path.getmtime(data_path))
    with open(index_path, "rb") as handle:

        def read(start: int, stop: int) -> bytes:
            handle.seek(start)
            return handle.read(stop - start)

        length = os.fstat(handle.fileno()).st_size
        table_end = 0
        if read(0, 8) == _TABLE_MAGIC:
            table_end = min(length, table_length(read(0, _TABLE_HEADER.size), index_path))
            _require_size(parse_table(read(0, table_end), index_path).file_size, file_size, index_path)
        starts_read = _shifted(read, table_end)
        if table_end < length:
            indexed_size, _, _ = _checked_starts(starts_read, length - table_end, index_path, _STAMP_CHUNK_BYTES)
            _require_size(indexed_size, file_size, index_path)
        chunks = _stamped_chunks(read, 0, table_end, mtime, index_path)
        if table_end < length:
            chunks = _chained(chunks, _stamped_chunks(starts_read, 0, length - table_end, mtime, index_path))
        fileops.write_atomically(index_path, chunks=chunks)


def _shifted(read: Callable[[int, int], bytes], by: int) -> Callable[[int, int], bytes]:
    return lambda start, stop: read(start + by, stop + by)


def _chained(*parts: Iterator[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield from part


def _stamped_chunks(read: Callable[[int, int], bytes], start: int, stop: int, mtime: float,
                    index_path: str) -> Iterator[bytes]:
    """The section at bytes start..stop with ``mtime`` in its header and the CRC of the result, a chunk at a time.

    The original's CRC is checked again over the very bytes copied: an index that changed after it
    was checked fails here, before the rename.
    """
    if start == stop:
        return
    header_size = _TABLE_HEADER.size if read(start, start + 8) == _TABLE_MAGIC else _STARTS_HEADER.size
    body_end = stop - _CRC.size
    original = read(start, start + header_size)
    header = bytearray(original)
    struct.pack_into("<d", header, _MTIME_OFFSET, mtime)
    old_crc, new_crc = crc32c(original), crc32c(header)
    yield bytes(header)
    for begin in range(start + header_size, body_end, _STAMP_CHUNK_BYTES):
        chunk = read(begin, min(body_end, begin + _STAMP_CHUNK_BYTES))
        old_crc, new_crc = crc32c(chunk, old_crc), crc32c(chunk, new_crc)
        yield chunk
    if mask_crc(old_crc) != _CRC.unpack(read(body_end, stop))[0]:
        raise RecordIndexError(f"{index_path}: changed while it was being stamped; nothing was written")
    yield _CRC.pack(mask_crc(new_crc))


def _require_size(indexed_size: int, file_size: int, index_path: str) -> None:
    if indexed_size != file_size:
        raise RecordIndexError(
            f"{index_path}: the index describes a file of {indexed_size} bytes, the data file has {file_size}"
        )


# ------------------------------------------------------------------------------ finding an index

# read(path, limit): the first ``limit`` bytes of a file (all of a shorter one), None when there is no such file.
ReadFront = Callable[[str, int], bytes | None]


@dataclasses.dataclass(frozen=True)
class IndexReads:
    """How index files are read: ``front(path, limit)`` (``ReadFront``) and ``whole(path, max_bytes)`` (all of one, None
    when there is none; ``RecordIndexError`` when it holds more than ``max_bytes``, found without reading them all)."""

    front: ReadFront
    whole: Callable[[str, int], bytes | None]

    @classmethod
    def through(cls, read: ReadFront) -> IndexReads:
        """Reads through ``read`` alone: a whole file is its first ``max_bytes + 1`` bytes."""
        return cls(read, lambda path, max_bytes: _at_most(read(path, max_bytes + 1), path, max_bytes))


def _at_most(data: bytes | None, path: str, max_bytes: int) -> bytes | None:
    if data is not None and len(data) > max_bytes:
        raise _failure(path)(f"more than {max_bytes} bytes, larger than any read index of this file")
    return data


def read_local_front(path: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes of a local index file; None when there is none. ``RecordIndexError`` for a FIFO, device,
    link or directory (refused at once, never a hang)."""
    try:
        descriptor, _ = open_found(path, "read index", follow_links=False)
    except FileNotFoundError:
        return None
    except RefusedFileError as error:
        raise RecordIndexError(str(error)) from error
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(limit)


def _read_local_whole(path: str, max_bytes: int) -> bytes | None:
    """A whole local index file (``read_regular``: a larger one is refused from its size, before a byte is read)."""
    try:
        return read_regular(path, max_bytes, "read index")
    except FileNotFoundError:
        return None
    except RefusedFileError as error:
        raise RecordIndexError(str(error)) from error


def _read_object_or_local_whole(path: str, max_bytes: int) -> bytes | None:
    """A whole index file in a bucket (one GET of at most ``max_bytes + 1`` bytes, no metadata request), else local."""
    if not is_object_store(path):
        return _read_local_whole(path, max_bytes)
    try:
        return read_small_object(path, max_bytes, "read index")
    except RefusedFileError as error:  # larger than any index of the file can be
        raise RecordIndexError(str(error)) from error


_LOCAL_READS = IndexReads(read_local_front, _read_local_whole)
_TRAINING_READER_READS = IndexReads(read_local_front, _read_object_or_local_whole)  # record starts, local or in a bucket


def find_split_table(data_path: str, file_size: int, reads: IndexReads = _LOCAL_READS) -> tuple[SplitTable, str] | None:
    """The split table of ``data_path`` and the index file it is in (not checked against the data); None: no index.

    The ``.index`` has its front read (16 bytes a MiB of data); in a dataset written before it, the ``.idx``, else
    the ``.offsets`` is read whole. ``RecordIndexError`` for a malformed one.
    """
    path = index_path_for(data_path)
    front = reads.front(path, max_table_bytes(file_size, INDEX_INTERVAL_BYTES))
    if front is not None:
        if len(front) >= _TABLE_HEADER.size and len(front) < table_length(front, path):  # entries closer than 1 MiB
            front = reads.front(path, min(table_length(front, path), max_table_bytes(file_size)))
            if front is None:  # gone between the two reads
                return None
        return parse_table(front, path), path
    path = index_path_for(data_path, TABLE_SUFFIX)
    data = reads.whole(path, max_table_bytes(file_size))
    if data is None:
        path = index_path_for(data_path, STARTS_SUFFIX)
        data = reads.whole(path, max_starts_bytes(file_size))
    return None if data is None else (parse_read_index(data, path).split_table(), path)


def find_record_starts(data_path: str, file_size: int, reads: IndexReads = _LOCAL_READS) -> RecordStarts | None:
    """The record starts of ``data_path`` (not checked against the data): its ``.index``'s, else (a dataset of before)
    its ``.offsets``; None when it has neither. ``RecordIndexError`` for a malformed one."""
    for suffix, max_bytes in ((INDEX_SUFFIX, max_index_bytes(file_size)), (STARTS_SUFFIX, max_starts_bytes(file_size))):
        path = index_path_for(data_path, suffix)
        data = reads.whole(path, max_bytes)
        if data is not None:
            starts = parse_read_index(data, path).starts
            if starts is not None:
                return starts
    return None


def load_split_table(data_path: str, file_size: int, mtime: float | None,
                     read: ReadFront | None = None) -> SplitTable | None:
    """The current split table of ``data_path``, or None when it has no index, or a malformed or stale one (logged).

    ``read`` reads an index file's front (``ReadFront``); a reader of remote files passes its own
    (``tfrbeam.beam.source``: through Beam's file systems, objects in a bucket with a range read), so this module
    never imports Beam.
    """
    try:
        found = find_split_table(data_path, file_size, _LOCAL_READS if read is None else IndexReads.through(read))
    except RecordIndexError as error:
        _LOG.warning("ignoring the read index of %s: %s", data_path, error)
        return None
    if found is None:
        return None
    table, path = found
    problem = metadata_problem(table.file_size, table.mtime, file_size, mtime)
    if problem is not None:
        _LOG.warning("ignoring the stale read index %s of %s: %s; the file was changed after the index was written",
                     path, data_path, problem)
        return None
    return table


# ------------------------------------------------------------------------ checks against the data


def walk_problem(data_path: str, start: int, records: int, end: int, file_size: int) -> str | None:
    """Why ``records`` records from a record start at ``start`` do not end exactly at ``end`` (None when they do).

    Reads headers only (``end`` == ``file_size`` also means that no byte follows the last record).
    """
    try:
        with open_regular(data_path, "TFRecord file") as handle:
            handle.seek(start)
            header = handle.read(HEADER_SIZE)
            if len(header) < HEADER_SIZE:
                return f"offset {start} is past the end of the file"
            if not sound_header(header):
                return f"no record starts at offset {start} (its length CRC does not match)"
            reached, walked = start, 0
            limit = records + 1 if end == file_size else records  # at the end of the file, nothing may follow
            for block in record_blocks(
                handle, None, start, 1 << 16, limit, verify=False, stop_offset=end if end < file_size else None, name=data_path
            ):
                walked += block.num_records
                reached = block.end_offset
    except RecordError as exc:
        return f"walking {records} records from offset {start} failed: {exc}"
    except OSError as exc:
        return f"cannot read {data_path}: {exc}"
    if walked != records or reached != end:
        return f"{records} records from offset {start} should end at offset {end}; {walked} records from there end at {reached}"
    return None


def entry_problem(data_path: str, table: SplitTable, position: int) -> str | None:
    """Why entry ``position`` cannot be used (None when it checks out): its length CRC and the walk to the next entry."""
    offset, number = table.offsets[position], table.record_numbers[position]
    if position + 1 < len(table.offsets):
        next_offset, next_number = table.offsets[position + 1], table.record_numbers[position + 1]
    else:
        next_offset, next_number = table.file_size, table.num_records
    problem = walk_problem(data_path, offset, next_number - number, next_offset, table.file_size)
    if problem is None:
        return None
    return f"entry {position} (record {number} at offset {offset}): {problem}"


def content_problem(data_path: str, table: SplitTable, positions: Sequence[int],
                    expected_records: int | None = None) -> str | None:
    """Why the table does not match the data at ``positions`` (plus its first and last entries); None when it does."""
    if expected_records is not None and table.num_records != expected_records:
        return f"it counts {table.num_records} records, the manifest {expected_records}"
    if not table.offsets:
        return None if table.num_records == 0 else f"it counts {table.num_records} records but has no entries"
    if (table.offsets[0], table.record_numbers[0]) != (0, 0):
        return f"its first entry is record {table.record_numbers[0]} at offset {table.offsets[0]}, not record 0 at offset 0"
    if table.mtime is None:
        positions = range(len(table.offsets))  # nothing shows the file is unchanged: check every entry
    else:
        positions = sorted({0, len(table.offsets) - 1, *positions})
    for position in positions:
        problem = entry_problem(data_path, table, position)
        if problem is not None:
            return problem
    return None


def offsets_problem(raw: np.ndarray | bytes | mmap.mmap, offsets: np.ndarray) -> str | None:
    """Why ``offsets`` are not the record starts of the file whose bytes are ``raw`` (None when they are).

    Every offset must hold a header with a valid length CRC whose record ends exactly at the next
    offset; the first must be 0 and the last the file size. Data CRCs are checked when records are read.
    """
    data = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(data):
        first = int(offsets[0]) if len(offsets) else None
        return f"its offsets run from {first} to {int(offsets[-1]) if len(offsets) else None}, the file from 0 to {len(data)}"
    spans = np.diff(offsets)
    if np.any(spans < RECORD_OVERHEAD):
        bad = int(np.flatnonzero(spans < RECORD_OVERHEAD)[0])
        return f"records {bad} and {bad + 1} start {int(spans[bad])} bytes apart (at least 16 are needed)"
    window = np.arange(12, dtype=np.int64)
    for begin in range(0, len(spans), _CHECK_CHUNK):
        starts = offsets[begin:min(begin + _CHECK_CHUNK, len(spans))]
        headers = data[starts[:, None] + window] if len(starts) else np.zeros((0, 12), np.uint8)
        lengths = np.ascontiguousarray(headers[:, :8]).view("<u8").ravel()
        crcs = np.ascontiguousarray(headers[:, 8:]).view("<u4").ravel()
        wrong = np.flatnonzero(
            (lengths > MAX_PAYLOAD_SIZE) | (lengths.astype(np.int64) + RECORD_OVERHEAD != spans[begin : begin + _CHECK_CHUNK])
        )
        if wrong.size:
            record = begin + int(wrong[0])
            return f"the record at offset {int(offsets[record])} (record {record}) does not end where record {record + 1} starts"
        if len(starts) and not length_crcs_match(lengths, crcs):
            return f"a length CRC does not match among records {begin}..{begin + len(starts) - 1}"
    return None


def _starts_content_problem(data_path: str, raw: np.ndarray | bytes | mmap.mmap | None, offsets: np.ndarray) -> str | None:
    if raw is not None:
        return offsets_problem(raw, offsets)
    if os.path.getsize(data_path) == 0:
        return offsets_problem(b"", offsets)
    with open_regular(data_path, "TFRecord file") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = np.frombuffer(mapped, dtype=np.uint8)
        try:
            return offsets_problem(view, offsets)
        finally:
            del view


# ------------------------------------------------------------------------ trusted for reading

_checked: dict[tuple, str | None] = {}
_warned: set[str] = set()
_check_lock = threading.Lock()


def _warn_once(index_path: str, data_path: str, reason: str, instead: str) -> None:
    with _check_lock:
        if index_path in _warned:
            return
        _warned.add(index_path)
    _LOG.warning("ignoring the read index %s of %s: %s; %s (delete the index to silence this)",
                 index_path, data_path, reason, instead)


def trusted_index(data_path: str, expected_records: int | None = None,
                  positions_for: Callable[[SplitTable], Sequence[int]] = lambda table: ()) -> SplitTable | None:
    """The split table of a local uncompressed ``data_path`` when it matches the file; else None (warned once per index).

    ``positions_for(table)`` names the entries about to be used; they are checked against the data
    (results are cached per process for the file's size and mtime).
    """
    try:
        stat = os.stat(data_path)
    except OSError:
        return None
    try:
        found = find_split_table(data_path, stat.st_size)
    except RecordIndexError as error:
        _warn_once(index_path_for(data_path), data_path, str(error), "reading walks the record headers instead")
        return None
    if found is None:
        return None
    table, path = found
    problem = metadata_problem(table.file_size, table.mtime, stat.st_size, stat.st_mtime)
    if problem is None:
        problem = _checked_content(data_path, stat, table, tuple(positions_for(table)), expected_records)
    if problem is not None:
        _warn_once(path, data_path, problem, "reading walks the record headers instead")
        return None
    return table


def _checked_content(data_path: str, stat: os.stat_result, table: SplitTable, positions: tuple[int, ...],
                     expected_records: int | None) -> str | None:
    """``content_problem``, remembered per process for the file's size and mtime and the table's entries."""
    key = (data_path, stat.st_size, stat.st_mtime_ns, table, expected_records, positions if table.mtime is not None else None)
    with _check_lock:
        known = key in _checked
        problem = _checked.get(key)
    if not known:
        problem = content_problem(data_path, table, positions, expected_records)
        with _check_lock:
            _checked[key] = problem
    elif problem is None and table.offsets:
        # A rewrite of the same size within one mtime tick keeps the key: the last entry's walk
        # (to the end of the file, after the table's count) is redone on every use.
        problem = entry_problem(data_path, table, len(table.offsets) - 1)
        if problem is not None:
            with _check_lock:
                _checked[key] = problem
    return problem


def seek_position(data_path: str, record: int, expected_records: int | None = None) -> tuple[int, int]:
    """(byte offset, record number) of the checked split table entry closest at or before ``record``; (0, 0) without."""

    def entry_for(table: SplitTable) -> list[int]:
        position = bisect.bisect_right(table.record_numbers, record) - 1
        return [position] if position >= 0 else []

    table = trusted_index(data_path, expected_records, entry_for)
    if table is None:
        return 0, 0
    used = entry_for(table)
    if not used:
        return 0, 0
    return table.offsets[used[0]], table.record_numbers[used[0]]


def _starts_for(data_path: str, file_size: int, num_records: int | None) -> tuple[np.ndarray | None, str | None]:
    """(record starts, why not) of the index of ``data_path``, local or in a bucket, for a file of ``file_size`` bytes and
    ``num_records`` records (None: not known), checked but against the data: (None, None) when there is none."""
    try:
        starts = find_record_starts(data_path, file_size, _TRAINING_READER_READS)
    except (RecordIndexError, OSError) as error:
        return None, str(error)
    if starts is None:
        return None, None
    offsets = starts.offsets
    if starts.file_size != file_size or (num_records is not None and starts.num_records != num_records):
        counted = f"{num_records} records in " if num_records is not None else ""
        return None, (f"it describes {starts.num_records} records in {starts.file_size} bytes, the file has "
                      f"{counted}{file_size} bytes")
    if offsets[0] != 0 or not bool(np.all(np.diff(offsets) >= RECORD_OVERHEAD)):
        return None, "its record starts are not 16 bytes apart from 0"
    return offsets, None


def indexed_record_starts(data_path: str, file_size: int, num_records: int) -> np.ndarray | None:
    """The record starts (then the size) that the read index of ``data_path`` (local or in a bucket) gives for a file
    of ``file_size`` bytes and ``num_records`` records; None when there is no such index (logged at debug level only).

    Not checked against the file: a hint for a sequential read (``record_blocks(record_starts=...)``), which
    checks every header it uses against it and walks the headers wherever one disagrees. In a bucket one GET
    (two for a dataset written before the ``.index``, or none at all).
    """
    offsets, problem = _starts_for(data_path, file_size, num_records)
    if problem is not None:
        _LOG.debug("reading %s without its read index: %s", data_path, problem)
    return offsets


def bucket_record_starts(data_path: str, file_size: int, num_records: int | None) -> np.ndarray | None:
    """Random access to an object in a bucket: the record starts of its read index, checked up front but against the
    data (each record's header is checked as it is read); None when there is none, or it is unusable (warned)."""
    offsets, problem = _starts_for(data_path, file_size, num_records)
    if problem is not None:
        _warn_once(index_path_for(data_path), data_path, problem, "walking its record headers instead")
    return offsets


def offsets_from_headers(data_path: str) -> np.ndarray:
    """Every record start of a local uncompressed file, then its size, by walking the record headers."""
    pieces = [block.offsets for block in record_blocks(data_path, None, 0, 1 << 16, None, verify=False)]
    return np.concatenate(pieces + [np.array([os.path.getsize(data_path)], dtype=np.int64)]).astype(np.int64)


def load_offsets(data_path: str, raw: np.ndarray | bytes | mmap.mmap | None = None, *, write: bool = True) -> np.ndarray:
    """Every record start of a local uncompressed file, then its size: from its checked read index, else its headers.

    ``raw`` is the file's bytes (a memory map) when the caller has them. A file without a matching
    index has the headers walked and (``write``) a fresh ``.index`` written beside it (kept in
    memory only when that fails, say on a read-only directory).
    """
    stat = os.stat(data_path)
    problem = None
    try:
        starts = find_record_starts(data_path, stat.st_size)
    except (RecordIndexError, OSError) as error:
        starts, problem = None, str(error)
    if starts is not None:
        problem = (metadata_problem(starts.file_size, starts.mtime, stat.st_size, stat.st_mtime)
                   or _starts_content_problem(data_path, raw, starts.offsets))
        if problem is None:
            return starts.offsets
    if problem is not None:
        _warn_once(index_path_for(data_path), data_path, problem, "rebuilding it from the record headers")
    offsets = offsets_from_headers(data_path)  # a damaged file raises the framing error, naming file and offset
    if write:
        try:
            fileops.write_atomically(index_path_for(data_path), read_index_bytes(offsets, stat.st_mtime))
        except OSError as exc:
            _LOG.info("cannot write the read index of %s (%s); keeping it in memory", data_path, exc)
    return offsets


def index_is_current(data_path: str, index_path: str) -> tuple[bool, str]:
    """Whether a local file's index file (any of ``index_paths_for``) records its mtime and matches it entirely (every
    split table entry walked, every record start checked), and why not; for ``tfrbeam verify``."""
    try:
        stat = os.stat(data_path)
        data = _read_local_whole(index_path, max_index_bytes(stat.st_size))
        if data is None:
            return False, f"{index_path} does not exist"
        index = parse_read_index(data, index_path)
    except (RecordIndexError, OSError) as exc:
        return False, str(exc)
    if index.mtime is None:
        return False, f"{index_path} records no mtime, so it cannot show that {data_path} is unchanged; rebuild it"
    problem = metadata_problem(index.file_size, index.mtime, stat.st_size, stat.st_mtime)
    if problem is None and index.table is not None:
        problem = content_problem(data_path, dataclasses.replace(index.table, mtime=None), ())
    if problem is None and index.starts is not None:
        problem = _starts_content_problem(data_path, None, index.starts.offsets)
    if problem is not None:
        return False, f"{index_path} does not match {data_path}: {problem}"
    return True, f"{index_path} matches {data_path} ({index.num_records} records)"


# ------------------------------------------------------------------------------------- DALI


def dali_index_text(offsets: np.ndarray) -> str:
    """NVIDIA DALI's ``tfrecord2idx`` lines, ``"<offset> <size>\\n"`` per record (size = 8 + 4 + payload + 4)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    starts, sizes = offsets[:-1], np.diff(offsets)
    return "".join(f"{start} {size}\n" for start, size in zip(starts.tolist(), sizes.tolist()))


def write_dali_index(data_path: str, out_path: str) -> int:
    """Write the DALI index of a local uncompressed TFRecord file; returns the record count.

    The offsets come from the file's read index when it checks out, else from its headers.
    """
    offsets = load_offsets(data_path, write=False)
    fileops.write_atomically(out_path, dali_index_text(offsets).encode("ascii"))
    return len(offsets) - 1
