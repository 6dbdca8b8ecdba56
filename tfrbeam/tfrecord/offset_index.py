"""The offset index: where every record of an uncompressed TFRecord file starts, for reading any record in one seek.

The sparse read index (``record_index``) keeps one entry per MiB, enough to split a file; random
access needs every record. Location: ``<dir>/.tfrbeam-index/<file name>.offsets``, beside the
read index. Format (little-endian), version 1::

    magic        8 bytes  b"TFRBOFS1"
    version      uint32   1
    reserved     uint32   0
    file_size    uint64   size of the data file the index describes
    mtime        float64  data file modification time in seconds, NaN when unknown
    num_records  uint64
    offsets      (num_records + 1) x uint64: each record's first byte, then file_size
    crc          uint32   masked CRC32C of every byte before it

Writers feed ``OffsetIndexBuilder`` while they write (the same ``add_batch`` call as the read
index's builder) and stamp the final mtime with ``stamp_offset_index`` once the file is renamed.
Readers (``load_offsets``) trust an index only when its size and mtime match and every offset is a
record start whose header (length and length CRC) leads exactly to the next: a check of all
headers at once through a memory map, far cheaper than walking them. Otherwise they warn once,
walk the headers and write a fresh index (or keep it in memory when the directory is read-only).

``dali_index_text`` writes the same offsets in NVIDIA DALI's ``tfrecord2idx`` format.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from crc32c import crc32c

from tfrbeam.base.bounded_read import open_regular
from tfrbeam.base.file_access import read_found
from tfrbeam.base.object_store import is_object_store, read_small_object
from tfrbeam.errors import RecordIndexError, RefusedFileError
from tfrbeam.tfrecord.blocks import length_crcs_match, record_blocks
from tfrbeam.tfrecord.record_index import INDEX_SUFFIX, MTIME_TOLERANCE_SECONDS, index_path_for, write_file_atomically
from tfrbeam.tfrecord.records import MAX_PAYLOAD_SIZE, RECORD_OVERHEAD, mask_crc, masked_crc32c

_LOG = logging.getLogger(__name__)

OFFSETS_SUFFIX = ".offsets"
OFFSETS_MAGIC = b"TFRBOFS1"
OFFSETS_VERSION = 1
_HEADER = struct.Struct("<8sIIQdQ")
_CRC = struct.Struct("<I")
_MTIME_OFFSET = 8 + 4 + 4 + 8
_OFFSET_BYTES = 8
_CHECK_CHUNK = 1 << 16  # records whose headers are gathered at once while checking


def offset_index_path_for(data_path: str) -> str:
    """Where the offset index of ``data_path`` lives: ``<dir>/.tfrbeam-index/<name>.offsets`` (beside the read index)."""
    return index_path_for(data_path)[: -len(INDEX_SUFFIX)] + OFFSETS_SUFFIX


class OffsetIndexBuilder:
    """Collects every record start while a file is written (feed it like ``record_index.IndexBuilder``)."""

    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []
        self._records = 0
        self._next_offset = 0

    @property
    def num_records(self) -> int:
        return self._records

    def add(self, offset: int, record_number: int) -> None:
        """The record ``record_number`` starts at ``offset`` (records must come in order, none left out)."""
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
                f"the offset index needs every record in order: got record {record_number} at offset {offset}, "
                f"expected record {self._records}" + (f" at offset {self._next_offset}" if self._next_offset >= 0 else "")
            )

    def offsets(self, file_size: int) -> np.ndarray:
        """Every record start, then ``file_size``."""
        return np.concatenate(self._pieces + [np.array([file_size], dtype=np.int64)])

    def to_bytes(self, file_size: int, mtime: float | None) -> bytes:
        """Serialise the index of the finished file of ``file_size`` bytes."""
        return offset_index_bytes(self.offsets(file_size), mtime)


def offset_index_bytes(offsets: np.ndarray, mtime: float | None) -> bytes:
    """The index file for these offsets (every record start, then the file size)."""
    offsets = np.asarray(offsets, dtype="<u8")
    if offsets.size < 1 or (offsets.size > 1 and np.any(np.diff(offsets.astype(np.int64)) < RECORD_OVERHEAD)):
        raise ValueError("offsets must end with the file size and leave at least 16 bytes per record")
    header = _HEADER.pack(
        OFFSETS_MAGIC, OFFSETS_VERSION, 0, int(offsets[-1]), math.nan if mtime is None else float(mtime), offsets.size - 1
    )
    body = header + offsets.tobytes()
    return body + _CRC.pack(masked_crc32c(body))


@dataclasses.dataclass(frozen=True)
class OffsetIndex:
    """A parsed offset index: ``offsets`` has every record start and then the file size."""

    file_size: int
    mtime: float | None
    offsets: np.ndarray

    @property
    def num_records(self) -> int:
        return len(self.offsets) - 1


def parse_offset_index(data: bytes, index_path: str) -> OffsetIndex:
    """Parse an offset index file's bytes; ``RecordIndexError`` naming ``index_path`` on anything wrong."""
    file_size, mtime, num_records = _checked(data, index_path)
    offsets = np.frombuffer(data, dtype="<u8", count=num_records + 1, offset=_HEADER.size).astype(np.int64)
    return OffsetIndex(file_size, None if math.isnan(mtime) else mtime, offsets)


def _checked(data: bytes | bytearray, index_path: str) -> tuple[int, float, int]:
    """An offset index's (file size, mtime, number of records), after checking its header, size, CRC and last offset."""
    view = memoryview(data)
    return _checked_parts(lambda start, stop: view[start:stop], len(data), index_path)


def _checked_parts(read: Callable[[int, int], bytes | memoryview], length: int, index_path: str,
                   chunk: int | None = None) -> tuple[int, float, int]:
    """``_checked`` of an index of ``length`` bytes read through ``read(start, stop)``; ``chunk`` bounds each read."""

    def fail(reason: str) -> RecordIndexError:
        return RecordIndexError(f"{index_path}: not a valid tfrbeam offset index: {reason}; delete it to have it rebuilt")

    if length < _HEADER.size + 8 + _CRC.size:
        raise fail(f"{length} bytes is too short")
    magic, version, _, file_size, mtime, num_records = _HEADER.unpack(read(0, _HEADER.size))
    if magic != OFFSETS_MAGIC or version != OFFSETS_VERSION:
        raise fail(f"magic {magic!r} version {version} is not {OFFSETS_MAGIC!r} version {OFFSETS_VERSION}")
    if length != _HEADER.size + 8 * (num_records + 1) + _CRC.size:
        raise fail(
            f"{num_records} records need {_HEADER.size + 8 * (num_records + 1) + _CRC.size} bytes, the file has {length}"
        )
    body_end = length - _CRC.size
    if mask_crc(_crc_of(read, 0, body_end, chunk or body_end)) != _CRC.unpack(read(body_end, length))[0]:
        raise fail("checksum mismatch (the file is damaged)")
    last_offset = struct.unpack("<Q", read(_HEADER.size + 8 * num_records, _HEADER.size + 8 * (num_records + 1)))[0]
    if last_offset != file_size:
        raise fail(f"its last offset {last_offset} is not the file size {file_size}")
    return file_size, mtime, num_records


def _crc_of(read: Callable[[int, int], bytes | memoryview], start: int, stop: int, chunk: int, crc: int = 0) -> int:
    """The unmasked CRC32C of bytes start..stop, read ``chunk`` bytes at a time, continuing from ``crc``."""
    for begin in range(start, stop, max(1, chunk)):
        crc = crc32c(read(begin, min(stop, begin + chunk)), crc)
    return crc


# Stamping streams an index this many bytes at a time: every shard of a build is stamped at once,
# and whole indexes (8 bytes a record, twice: read and patched) made a 5M-row build's last step
# its memory peak.
_STAMP_CHUNK_BYTES = 1 << 20


def stamp_offset_index(data_path: str, index_path: str | None = None) -> None:
    """Record the local data file's mtime in its offset index (call once the file is closed and renamed).

    The index is checked and rewritten a chunk at a time (through a temporary file and a rename),
    never held whole.
    """
    index_path = index_path or offset_index_path_for(data_path)
    file_size, mtime = os.path.getsize(data_path), os.path.getmtime(data_path)
    with open(index_path, "rb") as handle:

        def read(start: int, stop: int) -> bytes:
            handle.seek(start)
            return handle.read(stop - start)

        length = os.fstat(handle.fileno()).st_size
        indexed_size, _, _ = _checked_parts(read, length, index_path, _STAMP_CHUNK_BYTES)
        _require_size(indexed_size, file_size, index_path)
        write_file_atomically(index_path, chunks=_stamped_chunks(read, length, float(mtime), index_path))


def _stamped_chunks(read: Callable[[int, int], bytes], length: int, mtime: float, index_path: str) -> Iterator[bytes]:
    """The index's bytes with ``mtime`` in its header and the CRC of the result, a chunk at a time.

    The original's CRC is checked again over the very bytes copied: an index that changed after
    it was checked fails here, before the rename.
    """
    body_end = length - _CRC.size
    original = read(0, _HEADER.size)
    header = bytearray(original)
    struct.pack_into("<d", header, _MTIME_OFFSET, mtime)
    old_crc, new_crc = crc32c(original), crc32c(header)
    yield bytes(header)
    for begin in range(_HEADER.size, body_end, _STAMP_CHUNK_BYTES):
        chunk = read(begin, min(body_end, begin + _STAMP_CHUNK_BYTES))
        old_crc, new_crc = crc32c(chunk, old_crc), crc32c(chunk, new_crc)
        yield chunk
    if mask_crc(old_crc) != _CRC.unpack(read(body_end, length))[0]:
        raise RecordIndexError(f"{index_path}: changed while it was being stamped; nothing was written")
    yield _CRC.pack(mask_crc(new_crc))


def _require_size(indexed_size: int, file_size: int, index_path: str) -> None:
    if indexed_size != file_size:
        raise RecordIndexError(
            f"{index_path}: the index describes a file of {indexed_size} bytes, the data file has {file_size}"
        )


def stamped_offset_index_bytes(data: bytes, file_size: int, mtime: float, index_path: str = "<index>") -> bytearray:
    """``data`` (an offset index's bytes) with the finished file's mtime in its header; its size must match.

    Patched in one copy of ``data`` (the offsets are not parsed): a shard's index is 8 bytes a
    record, and every shard of a build is stamped at once.
    """
    indexed_size, _, _ = _checked(data, index_path)
    _require_size(indexed_size, file_size, index_path)
    stamped = bytearray(data)
    struct.pack_into("<d", stamped, _MTIME_OFFSET, float(mtime))
    body_end = len(stamped) - _CRC.size
    _CRC.pack_into(stamped, body_end, masked_crc32c(memoryview(stamped)[:body_end]))
    return stamped


# ------------------------------------------------------------------------------ checks and loading


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


def max_offset_index_bytes(file_size: int) -> int:
    """The most bytes an offset index of a data file of ``file_size`` bytes can hold: a record per 16 bytes at most."""
    return _HEADER.size + _OFFSET_BYTES * (file_size // RECORD_OVERHEAD + 2) + _CRC.size


def read_offset_index(index_path: str, file_size: int) -> bytes:
    """The bytes of the offset index of a data file of ``file_size`` bytes, local or in a bucket, bounded by what such
    an index can hold; ``RecordIndexError`` for a FIFO, device, link or larger file (refused at once, never a hang)."""
    try:
        return read_found(index_path, max_offset_index_bytes(file_size), "offset index")
    except RefusedFileError as error:
        raise RecordIndexError(str(error)) from error


def indexed_record_starts(data_path: str, file_size: int, num_records: int) -> np.ndarray | None:
    """The record starts (then the size) that the offset index of ``data_path`` (local or in a bucket) gives for a file
    of ``file_size`` bytes and ``num_records`` records; None when there is no such index (nothing is logged).

    Not checked against the file: a hint for a sequential read (``record_blocks(record_starts=...)``), which
    checks every header it uses against it and walks the headers wherever one disagrees.
    """
    index_path = offset_index_path_for(data_path)
    try:
        if is_object_store(index_path):  # one bounded GET on gs:// (no metadata request first): it is checked where used
            found = read_small_object(index_path, max_offset_index_bytes(file_size), "offset index")
            if found is None:
                return None
            data = found
        else:
            data = read_offset_index(index_path, file_size)
        index = parse_offset_index(data, index_path)
    except (RecordIndexError, OSError) as error:  # none (the usual case for files not built by tfrbeam), or unusable
        _LOG.debug("reading %s without its offset index %s: %s", data_path, index_path, error)
        return None
    if index.file_size != file_size or index.num_records != num_records:
        return None
    return index.offsets


def offsets_from_headers(data_path: str) -> np.ndarray:
    """Every record start of a local uncompressed file, then its size, by walking the record headers."""
    pieces = [block.offsets for block in record_blocks(data_path, None, 0, 1 << 16, None, verify=False)]
    return np.concatenate(pieces + [np.array([os.path.getsize(data_path)], dtype=np.int64)]).astype(np.int64)


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(index_path: str, data_path: str, reason: str) -> None:
    with _warn_lock:
        if index_path in _warned:
            return
        _warned.add(index_path)
    _LOG.warning("ignoring the offset index %s of %s: %s; rebuilding it from the record headers", index_path, data_path, reason)


def load_offsets(data_path: str, raw: np.ndarray | bytes | mmap.mmap | None = None, *, write: bool = True) -> np.ndarray:
    """Every record start of a local uncompressed file, then its size: from its checked offset index, else its headers.

    ``raw`` is the file's bytes (a memory map) when the caller has them. A missing or mismatched
    index is rebuilt by walking the headers and written beside the file when ``write`` (kept in
    memory only when that fails, say on a read-only directory).
    """
    index_path = offset_index_path_for(data_path)
    stat = os.stat(data_path)
    problem = None
    try:
        index = parse_offset_index(read_offset_index(index_path, stat.st_size), index_path)
    except FileNotFoundError:
        index, problem = None, None
    except (RecordIndexError, OSError) as exc:
        index, problem = None, str(exc)
    if index is not None:
        problem = _index_mismatch(index, stat) or _content_mismatch(data_path, raw, index.offsets)
        if problem is None:
            return index.offsets
    if problem is not None:
        _warn_once(index_path, data_path, problem)
    offsets = offsets_from_headers(data_path)  # a damaged file raises the framing error, naming file and offset
    if write:
        try:
            write_file_atomically(index_path, offset_index_bytes(offsets, stat.st_mtime))
        except OSError as exc:
            _LOG.info("cannot write the offset index %s (%s); keeping it in memory", index_path, exc)
    return offsets


def _index_mismatch(index: OffsetIndex, stat: os.stat_result) -> str | None:
    if index.file_size != stat.st_size:
        return f"it describes a file of {index.file_size} bytes, the file has {stat.st_size}"
    if index.mtime is not None and abs(index.mtime - stat.st_mtime) > MTIME_TOLERANCE_SECONDS:
        return f"it describes a file last modified at {index.mtime}, the file's mtime is {stat.st_mtime}"
    return None


def _content_mismatch(data_path: str, raw: np.ndarray | bytes | mmap.mmap | None, offsets: np.ndarray) -> str | None:
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


def offset_index_is_current(data_path: str, index_path: str | None = None) -> tuple[bool, str]:
    """Whether a local file's offset index exists, records its mtime and matches every record; and why not."""
    index_path = index_path or offset_index_path_for(data_path)
    try:
        stat = os.stat(data_path)
        index = parse_offset_index(read_offset_index(index_path, stat.st_size), index_path)
    except (RecordIndexError, OSError) as exc:
        return False, str(exc)
    if index.mtime is None:
        return False, f"{index_path} records no mtime, so it cannot show that {data_path} is unchanged; rebuild it"
    problem = _index_mismatch(index, stat) or _content_mismatch(data_path, None, index.offsets)
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

    The offsets come from the file's offset index when it checks out, else from its headers.
    """
    offsets = load_offsets(data_path, write=False)
    write_file_atomically(out_path, dali_index_text(offsets).encode("ascii"))
    return len(offsets) - 1
