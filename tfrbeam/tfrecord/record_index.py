"""The read index: a sparse list of record start offsets that lets readers split a TFRecord file exactly.

An uncompressed TFRecord file has no marker a reader dropped at a byte offset can trust to find
the next record: a payload may contain bytes that look like a valid record. tfrbeam's writers
therefore store, next to each uncompressed file they write, one ``(offset, record number)`` entry
for the first record that starts at or after every ``INDEX_INTERVAL_BYTES`` boundary. A reader
given a byte range starts at the entry at or before the range start and walks record headers
forward, so split points land exactly on record starts.

Location: ``<dir>/.tfrbeam-index/<file name>.idx`` for ``<dir>/<file name>``. The hidden sibling
directory is not matched by the globs people use for shards (``<prefix>-*``, ``*.tfrecord*``,
``<dir>/*`` on object stores, where ``*`` does not cross ``/``), and TensorFlow never opens it.

Format (little-endian), version 1::

    magic        8 bytes  b"TFRBIDX1"
    version      uint32   1
    interval     uint32   bytes between index boundaries when written (informational)
    file_size    uint64   size of the data file the index describes
    mtime        float64  data file modification time in seconds, NaN when unknown
    num_records  uint64   records in the data file
    num_entries  uint64
    entries      num_entries x (offset uint64, record_number uint64), both strictly increasing
    crc          uint32   masked CRC32C of every byte before it

An index whose size or mtime does not match its data file is stale; a malformed one raises
``RecordIndexError`` from ``parse_index``. ``load_index`` logs and ignores both: readers then treat
the file as unindexed. This module has no Beam imports (the TF-free dataset reader uses it too).

Before the dataset reader seeks with an entry it checks the data too (``seek_position``): a
valid length CRC at the entry's offset, and a header walk from the entry that reaches the next
entry (the last one: the end of the file, after exactly the records the index counts). The first
entry must be record 0 at offset 0, and the record count must be the manifest's. An index that
records no mtime cannot show that the file is unchanged since it was written, so it is trusted
only after a walk of the whole file confirms every entry (once per process). Writers record the
mtime of the file as finally named with ``stamp_index`` (or ``stamped_index_bytes``).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import os
import posixpath
import struct
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tfrbeam.base import fileops
from tfrbeam.base.bounded_read import open_regular, read_regular
from tfrbeam.errors import RecordError, RecordIndexError, RefusedFileError
from tfrbeam.tfrecord.blocks import record_blocks
from tfrbeam.tfrecord.records import HEADER_SIZE, MAX_PAYLOAD_SIZE, RECORD_OVERHEAD, masked_crc32c

_LOG = logging.getLogger(__name__)

INDEX_DIR_NAME = ".tfrbeam-index"  # read indexes of a split's shards, inside the split directory
INDEX_INTERVAL_BYTES = 1 << 20
INDEX_SUFFIX = ".idx"
INDEX_MAGIC = b"TFRBIDX1"
INDEX_VERSION = 1
# Readers and writers may see the same mtime through different float conversions.
MTIME_TOLERANCE_SECONDS = 1e-3

_HEADER = struct.Struct("<8sIIQdQQ")
_CRC = struct.Struct("<I")
_ENTRY_DTYPE = np.dtype("<u8")
_ENTRY_BYTES = 2 * _ENTRY_DTYPE.itemsize  # (offset, record number)


def index_path_for(data_path: str) -> str:
    """Where the read index of ``data_path`` lives: ``<dir>/.tfrbeam-index/<name>.idx``."""
    path = os.fspath(data_path)
    pathmod = posixpath if "://" in path else os.path
    directory, name = pathmod.split(path)
    if not name:
        raise ValueError(f"{path!r} names a directory, not a data file")
    return pathmod.join(directory, INDEX_DIR_NAME, name + INDEX_SUFFIX)


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """A parsed read index: sparse record start offsets of one data file, and what that file was."""

    file_size: int
    mtime: float | None
    num_records: int
    offsets: tuple[int, ...]
    record_numbers: tuple[int, ...]
    interval: int = INDEX_INTERVAL_BYTES

    def is_current(self, file_size: int, mtime: float | None) -> bool:
        """Whether this index still describes a file of this size and mtime (an unknown mtime is not compared)."""
        if file_size != self.file_size:
            return False
        if mtime is None or self.mtime is None:
            return True
        return abs(float(mtime) - self.mtime) <= MTIME_TOLERANCE_SECONDS

    def entry_at_or_before(self, offset: int) -> tuple[int, int]:
        """The indexed ``(offset, record_number)`` closest at or before ``offset``; (0, 0), the first record, if none."""
        position = bisect.bisect_right(self.offsets, offset) - 1
        if position < 0:
            return 0, 0
        return self.offsets[position], self.record_numbers[position]

    def restricted_to(self, start: int, stop: int) -> RecordIndex:
        """The entries a reader of byte range [start, stop) can use: the one at or before start and those inside."""
        first = max(bisect.bisect_right(self.offsets, start) - 1, 0)
        last = bisect.bisect_left(self.offsets, stop)
        return dataclasses.replace(
            self, offsets=self.offsets[first:last], record_numbers=self.record_numbers[first:last]
        )


class IndexBuilder:
    """Collects record starts while a file is written and keeps one per ``interval`` bytes.

    Feed it every record start with ``add`` (or whole framed batches with ``add_batch``); it keeps
    the first record that starts at or after each multiple of ``interval``.
    """

    def __init__(self, interval: int = INDEX_INTERVAL_BYTES):
        if not 0 < interval < 2**32:
            raise ValueError(f"index interval must be between 1 and 2**32 - 1 bytes, got {interval}")
        self.interval = interval
        self._offsets: list[int] = []
        self._record_numbers: list[int] = []
        self._next_boundary = 0

    def add(self, offset: int, record_number: int) -> None:
        """Offer the record starting at ``offset``; kept when it is the first at or past the next boundary."""
        if offset < self._next_boundary:
            return
        self._keep(int(offset), int(record_number))

    def add_batch(self, start_offset: int, first_record_number: int, payload_lengths: Sequence[int] | np.ndarray) -> None:
        """Offer a batch of consecutive records framed in one piece, starting at ``start_offset``."""
        lengths = np.asarray(payload_lengths, dtype=np.int64)
        if lengths.size == 0:
            return
        ends = np.cumsum(lengths + RECORD_OVERHEAD) + int(start_offset)
        starts = np.empty_like(ends)
        starts[0] = start_offset
        starts[1:] = ends[:-1]
        last_start = int(starts[-1])
        if last_start < self._next_boundary:
            return
        boundaries = np.arange(self._next_boundary, last_start + 1, self.interval, dtype=np.int64)
        positions = np.unique(np.searchsorted(starts, boundaries, side="left"))
        for position in positions.tolist():
            self.add(int(starts[position]), int(first_record_number) + position)

    def _keep(self, offset: int, record_number: int) -> None:
        if self._offsets and (offset <= self._offsets[-1] or record_number <= self._record_numbers[-1]):
            raise ValueError(
                f"record starts must be added in increasing order: got offset {offset} (record {record_number}) "
                f"after offset {self._offsets[-1]} (record {self._record_numbers[-1]})"
            )
        self._offsets.append(offset)
        self._record_numbers.append(record_number)
        self._next_boundary = (offset // self.interval + 1) * self.interval

    def to_bytes(self, file_size: int, mtime: float | None, num_records: int) -> bytes:
        """Serialise the index of a finished file of ``file_size`` bytes and ``num_records`` records."""
        if self._offsets and (self._offsets[-1] >= file_size or self._record_numbers[-1] >= num_records):
            raise ValueError(
                f"the last indexed record (offset {self._offsets[-1]}, record {self._record_numbers[-1]}) lies "
                f"outside a file of {file_size} bytes and {num_records} records"
            )
        entries = np.empty((len(self._offsets), 2), dtype=_ENTRY_DTYPE)
        entries[:, 0] = self._offsets
        entries[:, 1] = self._record_numbers
        stored_mtime = math.nan if mtime is None else float(mtime)
        body = _HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, self.interval, file_size, stored_mtime, num_records, len(self._offsets)
        ) + entries.tobytes()
        return body + _CRC.pack(masked_crc32c(body))


def parse_index(data: bytes, index_path: str) -> RecordIndex:
    """Parse and check an index file's bytes; raise ``RecordIndexError`` naming ``index_path`` on anything wrong."""

    def fail(reason: str) -> RecordIndexError:
        return RecordIndexError(f"{index_path}: not a valid tfrbeam read index: {reason}; delete it to silence this")

    if len(data) < _HEADER.size + _CRC.size:
        raise fail(f"{len(data)} bytes is shorter than the {_HEADER.size + _CRC.size}-byte minimum")
    magic, version, interval, file_size, mtime, num_records, num_entries = _HEADER.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise fail(f"magic {magic!r} is not {INDEX_MAGIC!r}")
    if version != INDEX_VERSION:
        raise fail(f"format version {version} is not the supported version {INDEX_VERSION}")
    if interval == 0:
        raise fail("its interval is 0 bytes (tfrbeam writes 1 to 2**32 - 1)")
    expected_size = _HEADER.size + 16 * num_entries + _CRC.size
    if len(data) != expected_size:
        raise fail(f"{num_entries} entries need {expected_size} bytes, the file has {len(data)}")
    stored_crc = _CRC.unpack_from(data, len(data) - _CRC.size)[0]
    if masked_crc32c(memoryview(data)[: len(data) - _CRC.size]) != stored_crc:
        raise fail("checksum mismatch (the file is damaged)")
    entries = np.frombuffer(data, dtype=_ENTRY_DTYPE, count=2 * num_entries, offset=_HEADER.size).reshape(-1, 2)
    offsets = tuple(entries[:, 0].tolist())
    record_numbers = tuple(entries[:, 1].tolist())
    _check_entries(offsets, record_numbers, file_size, num_records, fail)
    return RecordIndex(
        file_size=file_size,
        mtime=None if math.isnan(mtime) else mtime,
        num_records=num_records,
        offsets=offsets,
        record_numbers=record_numbers,
        interval=interval,
    )


def _check_entries(
    offsets: tuple[int, ...],
    record_numbers: tuple[int, ...],
    file_size: int,
    num_records: int,
    fail: Callable[[str], RecordIndexError],
) -> None:
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


def load_index(
    data_path: str,
    file_size: int,
    mtime: float | None,
    read_bytes: Callable[[str], bytes | None] | None = None,
) -> RecordIndex | None:
    """The current index of ``data_path``, or None when it is missing, malformed or stale (the last two are logged).

    ``read_bytes(path)`` returns a file's bytes or None when it does not exist; the default reads a
    local file. A reader of remote files passes its own (``tfrbeam.beam.source`` passes one reading
    through ``tfrbeam.beam.filesystem``), so this framing module never imports Beam.
    """
    index_path = index_path_for(data_path)
    try:
        data = read_bytes(index_path) if read_bytes is not None else _read_local(index_path, file_size)
        if data is None:
            return None
        index = parse_index(data, index_path)
    except RecordIndexError as exc:
        _LOG.warning("ignoring the read index of %s: %s", data_path, exc)
        return None
    if not index.is_current(file_size, mtime):
        _LOG.warning(
            "ignoring the stale read index %s: it describes a file of %d bytes (mtime %s), %s is %d bytes (mtime %s); "
            "the file was changed after the index was written",
            index_path, index.file_size, index.mtime, data_path, file_size, mtime,
        )
        return None
    return index


def max_index_bytes(file_size: int) -> int:
    """The most bytes a read index of a data file of ``file_size`` bytes can hold: one entry per 16 bytes at most."""
    return _HEADER.size + _ENTRY_BYTES * (file_size // RECORD_OVERHEAD + 1) + _CRC.size


def _read_local(path: str, file_size: int) -> bytes | None:
    """A local index's bytes, None when there is none; ``RecordIndexError`` when it is not a regular file, or larger
    than an index of a data file of ``file_size`` bytes can be (``read_regular``: refused at once, never a hang)."""
    try:
        return read_regular(path, max_index_bytes(file_size), "read index")
    except FileNotFoundError:
        return None
    except RefusedFileError as error:
        raise RecordIndexError(str(error)) from error


# ------------------------------------------------------------------------------ stamping


def stamped_index_bytes(data: bytes, file_size: int, mtime: float, index_path: str = "<index>") -> bytes:
    """``data`` (an index file's bytes) with the finished data file's size and mtime in its header, CRC renewed.

    For writers that only know the final mtime after closing or renaming the data file.
    """
    index = parse_index(data, index_path)
    if index.file_size != file_size:
        raise RecordIndexError(
            f"{index_path}: the index describes a file of {index.file_size} bytes, the data file has {file_size}; "
            "it was built for another file"
        )
    body = bytearray(data[: len(data) - _CRC.size])
    struct.pack_into("<d", body, _MTIME_OFFSET, float(mtime))
    return bytes(body) + _CRC.pack(masked_crc32c(body))


def stamp_index(data_path: str, index_path: str | None = None) -> None:
    """Record the local data file's current size and mtime in its index (call after the file is closed and renamed).

    Rewrites the index through a temporary file and a rename, so a reader never sees half of it.
    """
    index_path = index_path or index_path_for(data_path)
    stat = os.stat(data_path)
    with open(index_path, "rb") as handle:
        data = handle.read()
    write_file_atomically(index_path, stamped_index_bytes(data, stat.st_size, stat.st_mtime, index_path))


def write_file_atomically(path: str, data: bytes | bytearray = b"", chunks: Iterable[bytes] = ()) -> None:
    """Write ``data`` (or ``chunks``, one after the other) to a local ``path`` atomically (``fileops.write_atomically``).

    The directory is made. A failure, in a chunk's making too, leaves ``path`` as it was.
    """
    fileops.write_atomically(path, data, chunks)


_MTIME_OFFSET = 8 + 4 + 4 + 8  # magic, version, interval, file_size


# ------------------------------------------------------------------------ checks against the data


def metadata_problem(index: RecordIndex, file_size: int, mtime: float | None) -> str | None:
    """Why the index does not describe a file of this size and mtime (None when it does)."""
    if index.file_size != file_size:
        return f"it describes a file of {index.file_size} bytes, the file has {file_size}"
    if index.mtime is not None and mtime is not None and abs(float(mtime) - index.mtime) > MTIME_TOLERANCE_SECONDS:
        return f"it describes a file last modified at {index.mtime}, the file's mtime is {mtime}"
    return None


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
            length, stored = struct.unpack("<QI", header)
            if length > MAX_PAYLOAD_SIZE or masked_crc32c(header[:8]) != stored:
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


def entry_problem(data_path: str, index: RecordIndex, position: int) -> str | None:
    """Why entry ``position`` cannot be used (None when it checks out): its length CRC and the walk to the next entry."""
    offset, number = index.offsets[position], index.record_numbers[position]
    if position + 1 < len(index.offsets):
        next_offset, next_number = index.offsets[position + 1], index.record_numbers[position + 1]
    else:
        next_offset, next_number = index.file_size, index.num_records
    problem = walk_problem(data_path, offset, next_number - number, next_offset, index.file_size)
    if problem is None:
        return None
    return f"entry {position} (record {number} at offset {offset}): {problem}"


def content_problem(
    data_path: str, index: RecordIndex, positions: Sequence[int], expected_records: int | None = None
) -> str | None:
    """Why the index does not match the data at ``positions`` (plus its first and last entries); None when it does."""
    if expected_records is not None and index.num_records != expected_records:
        return f"it counts {index.num_records} records, the manifest {expected_records}"
    if not index.offsets:
        return None if index.num_records == 0 else f"it counts {index.num_records} records but has no entries"
    if (index.offsets[0], index.record_numbers[0]) != (0, 0):
        return f"its first entry is record {index.record_numbers[0]} at offset {index.offsets[0]}, not record 0 at offset 0"
    if index.mtime is None:
        positions = range(len(index.offsets))  # nothing shows the file is unchanged: check every entry
    else:
        positions = sorted({0, len(index.offsets) - 1, *positions})
    for position in positions:
        problem = entry_problem(data_path, index, position)
        if problem is not None:
            return problem
    return None


_checked: dict[tuple, str | None] = {}
_warned: set[str] = set()
_check_lock = threading.Lock()


def _warn_once(data_path: str, reason: str) -> None:
    index_path = index_path_for(data_path)
    with _check_lock:
        if index_path in _warned:
            return
        _warned.add(index_path)
    _LOG.warning(
        "ignoring the read index %s of %s: %s; reading walks the record headers instead "
        "(delete the index, or rebuild it with `tfrbeam index`, to silence this)", index_path, data_path, reason,
    )


def trusted_index(
    data_path: str, expected_records: int | None = None, positions_for: Callable[[RecordIndex], Sequence[int]] = lambda index: ()
) -> RecordIndex | None:
    """The index of a local uncompressed ``data_path`` when it matches the file; else None (warned once per index).

    ``positions_for(index)`` names the entries about to be used; they are checked against the data
    (results are cached per process for the file's size and mtime).
    """
    try:
        stat = os.stat(data_path)
    except OSError:
        return None
    try:
        data = _read_local(index_path_for(data_path), stat.st_size)
        if data is None:
            return None
        index = parse_index(data, index_path_for(data_path))
    except RecordIndexError as exc:
        _warn_once(data_path, str(exc))
        return None
    problem = metadata_problem(index, stat.st_size, stat.st_mtime)
    if problem is None:
        positions = tuple(positions_for(index))
        key = (
            data_path,
            stat.st_size,
            stat.st_mtime_ns,
            masked_crc32c(data),
            expected_records,
            positions if index.mtime is not None else None,
        )
        with _check_lock:
            known = key in _checked
            problem = _checked.get(key)
        if not known:
            problem = content_problem(data_path, index, positions, expected_records)
            with _check_lock:
                _checked[key] = problem
        elif problem is None and index.offsets:
            # A rewrite of the same size within one mtime tick keeps the key: the last entry's walk
            # (to the end of the file, after the index's count) is redone on every use.
            problem = entry_problem(data_path, index, len(index.offsets) - 1)
            if problem is not None:
                with _check_lock:
                    _checked[key] = problem
    if problem is not None:
        _warn_once(data_path, problem)
        return None
    return index


def seek_position(data_path: str, record: int, expected_records: int | None = None) -> tuple[int, int]:
    """(byte offset, record number) of the checked index entry closest at or before ``record``; (0, 0) without one."""

    def entry_for(index: RecordIndex) -> list[int]:
        position = bisect.bisect_right(index.record_numbers, record) - 1
        return [position] if position >= 0 else []

    index = trusted_index(data_path, expected_records, entry_for)
    if index is None:
        return 0, 0
    used = entry_for(index)
    if not used:
        return 0, 0
    return index.offsets[used[0]], index.record_numbers[used[0]]


def index_is_current(data_path: str, index_path: str | None = None) -> tuple[bool, str]:
    """Whether a local file's read index matches it entirely (every entry walked), and why not; for ``tfrbeam verify``."""
    index_path = index_path or index_path_for(data_path)
    try:
        stat = os.stat(data_path)
        data = _read_local(index_path, stat.st_size)
        if data is None:
            return False, f"{index_path} does not exist"
        index = parse_index(data, index_path)
    except (RecordIndexError, OSError) as exc:
        return False, str(exc)
    if index.mtime is None:
        return False, f"{index_path} records no mtime, so it cannot show that {data_path} is unchanged; rebuild it"
    problem = metadata_problem(index, stat.st_size, stat.st_mtime) or content_problem(
        data_path, dataclasses.replace(index, mtime=None), ()
    )
    if problem is not None:
        return False, f"{index_path} does not match {data_path}: {problem}"
    return True, f"{index_path} matches {data_path} ({index.num_records} records, {len(index.offsets)} entries)"
