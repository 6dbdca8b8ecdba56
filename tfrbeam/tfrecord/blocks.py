"""TFRecord records read a block at a time: one buffer holding the payloads, plus their spans and offsets.

Batch readers (the dataset reader, the Beam source's Example reads) hand a block straight to the
columnar decoder as ``(block.data, block.starts, block.ends)``, with no Python object per record.

Uncompressed files take a fast path: a tight walk over record headers in a large read buffer,
then every CRC of the block checked with two calls into the hardware CRC (see
``_block_crcs_match``) and the block's bytes copied once into a buffer of their own. At the
first sign of trouble (a CRC mismatch, a truncated record, an absurd length) it hands the rest
of the file, from the first record of the block it could not hand out, to
``tfrbeam.tfrecord.records.RecordReader``, which raises or skips exactly as it always does: the records,
errors (type, check, offset) and skips are those of ``RecordReader``. Compressed files,
``skip_corrupt`` and ``skip_records`` go through ``RecordReader`` throughout.
"""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import os
import struct
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import BinaryIO, NamedTuple, Union

import crc32c
import numpy as np
import pyarrow as pa

from tfrbeam.base.byte_views import byte_rows, le_integers
from tfrbeam.errors import RecordError
from tfrbeam.tfrecord.records import (
    HEADER_SIZE,
    MAX_PAYLOAD_SIZE,
    RECORD_OVERHEAD,
    RecordReader,
    SkippedRegion,
    normalize_compression,
    sound_header,
    unmask_crcs,
)

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]

# Bytes read at a time (at least; a block larger than this is read whole). Large reads keep the
# per-read cost negligible; the buffer holds about two blocks.
READ_CHUNK = 4 << 20
# The largest read buffer a thread keeps for its next read (blocks of large records need larger
# buffers; those are freed with their read).
SPARE_BUFFER_MAX = 64 << 20
# Zero bytes after the last record of a fast-path block's buffer: vectorised readers (the
# columnar decoder) read 8-byte windows and may look a few hundred bytes past a record's end.
TRAILING_SLACK = 512
_SLACK = bytes(TRAILING_SLACK)

_unpack_length = struct.Struct("<Q").unpack_from
_crc = crc32c.crc32c
_NO_STOP = sys.maxsize


class RecordBlock(NamedTuple):
    """Consecutive records of one file: record i is ``data[starts[i]:ends[i]]`` and starts at byte ``offsets[i]``.

    ``data`` is None when the block was read with ``verify=False`` (headers only; ``starts`` and
    ``ends`` then only give the lengths). ``(data, starts, ends)`` is what
    ``tfrbeam.codec.decode.examples_to_record_batch`` takes. Bytes between and after the
    payloads are not record bytes (fast-path blocks keep the framing's place, rewritten, plus
    ``TRAILING_SLACK`` zero bytes at the end so vectorised readers may read past a record end).
    """

    data: bytes | np.ndarray | None
    starts: np.ndarray  # int64[n], where each payload starts in data
    ends: np.ndarray  # int64[n], where each payload ends in data
    offsets: np.ndarray  # int64[n], absolute (uncompressed) offsets of the record headers

    @classmethod
    def from_payloads(cls, payloads: Sequence[bytes | bytearray | memoryview], offsets: Iterable[int]) -> RecordBlock:
        """A block of the given payloads (joined, then ``TRAILING_SLACK`` zero bytes) starting at the given offsets."""
        bounds = _bounds(np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads)))
        offsets = np.fromiter(offsets, dtype=np.int64, count=len(payloads))
        return cls(b"".join(itertools.chain(payloads, (_SLACK,))), bounds[:-1], bounds[1:], offsets)

    @property
    def num_records(self) -> int:
        return len(self.offsets)

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    @property
    def payload_bytes(self) -> int:
        return int(self.lengths.sum())

    @property
    def end_offset(self) -> int:
        """The offset just after the block's last record (0 when it is empty)."""
        if not len(self.offsets):
            return 0
        return int(self.offsets[-1]) + int(self.ends[-1] - self.starts[-1]) + RECORD_OVERHEAD

    def payload(self, index: int) -> bytes:
        """Record ``index``'s payload as bytes (for error reports and record-by-record fallbacks)."""
        assert self.data is not None, "a block read with verify=False holds no payloads"
        return bytes(self.data[int(self.starts[index]):int(self.ends[index])])

    def joined(self) -> tuple[bytes | memoryview, np.ndarray]:
        """(the payloads back to back, their n + 1 bounds): for readers that need them contiguous.

        One copy by Arrow's take: the payloads and the framing between them are alternate values
        of one binary array over ``data``, and the payloads are every other one (a slice per
        record in Python cost 7x more).
        """
        assert self.data is not None, "a block read with verify=False holds no payloads"
        bounds = _bounds(self.lengths)
        count = len(self.starts)
        if not bounds[-1]:
            return b"", bounds
        edges = np.empty(2 * count, dtype=np.int64)
        edges[0::2], edges[1::2] = self.starts, self.ends
        spans = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), 2 * count - 1, [None, pa.py_buffer(edges), pa.py_buffer(self.data)]
        )
        payloads = spans.take(pa.array(np.arange(0, 2 * count - 1, 2, dtype=np.int64)))
        return memoryview(payloads.buffers()[2]).cast("B")[:int(bounds[-1])], bounds

    def payload_objects(self) -> np.ndarray:
        """Each record's payload as a ``bytes`` object, in a numpy object array: one copy of each payload.

        Arrow makes the objects in one call from a binary view array over ``data`` (a view per record
        names its span), so the payloads are not joined into a buffer of their own first.
        """
        assert self.data is not None, "a block read with verify=False holds no payloads"
        data = np.frombuffer(self.data, dtype=np.uint8)
        count = len(self.starts)
        if not count:
            return np.empty(0, dtype=object)
        if len(data) >= 2**31 or int(self.starts[-1]) + _INLINE_BYTES > len(data):
            joined, bounds = self.joined()
            values = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(joined)])
            return values.to_numpy(zero_copy_only=False)
        views = _payload_views(data, self.starts, self.lengths)
        values = pa.Array.from_buffers(pa.binary_view(), count, [None, pa.py_buffer(views), pa.py_buffer(data)])
        return values.to_numpy(zero_copy_only=False)

    def prefix(self, count: int) -> RecordBlock:
        """The block's first ``count`` records, sharing its buffer."""
        if count >= len(self.offsets):
            return self
        return RecordBlock(self.data, self.starts[:count], self.ends[:count], self.offsets[:count])


_INLINE_BYTES = 12  # a binary view holds a value this short itself, a longer one's first 4 bytes and its place
_INLINE_COLUMNS = np.arange(_INLINE_BYTES)


def _payload_views(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Arrow's binary views (16 bytes each: the length, then the value itself up to 12 bytes, else its first 4 bytes,
    buffer 0 and its offset) of the spans ``data[starts[i]:starts[i] + lengths[i]]``; ``data`` holds at least 12
    bytes from each start. Built as two integers a view, then the short values put in whole."""
    views = np.empty((len(starts), 2), dtype="<u8")
    views[:, 0] = lengths.astype("<u8") | (le_integers(data, 4)[starts].astype("<u8") << np.uint64(32))
    views[:, 1] = starts.astype("<u8") << np.uint64(32)
    short = np.flatnonzero(lengths <= _INLINE_BYTES)
    if len(short):
        head = byte_rows(data, _INLINE_BYTES)[starts[short]]
        head[_INLINE_COLUMNS >= lengths[short, None]] = 0
        views.view(np.uint8).reshape(-1, 16)[short, 4:] = head
    return views


def _bounds(lengths: np.ndarray) -> np.ndarray:
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return bounds


def record_blocks(
    source: PathOrFile,
    compression: str | None = "auto",
    start_offset: int = 0,
    block_length: int = 4096,
    limit: int | None = None,
    *,
    stop_offset: int | None = None,
    verify: bool = True,
    skip_corrupt: bool = False,
    on_skip: Callable[[SkippedRegion], None] | None = None,
    skip_records: int = 0,
    name: str | None = None,
    record_starts: np.ndarray | None = None,
) -> Generator[RecordBlock, None, None]:
    """Blocks of up to ``block_length`` records from ``start_offset`` (a record start), ``limit`` records in all.

    ``source`` is a path or a seekable binary file (not closed here). Records starting at or
    after ``stop_offset`` are neither read nor returned (a byte range's reader stops there).
    The first ``skip_records`` records are read and dropped. ``compression``, ``verify``,
    ``skip_corrupt``, ``on_skip`` and ``name`` mean what they mean for ``RecordReader``;
    ``verify=False`` checks nothing and leaves the payloads out (a fast walk over headers).
    Blocks are full (``block_length`` records) except at the end of the file, the range or the limit.
    ``record_starts`` (an uncompressed file's every record start, then its size: its read index) spares
    the walk over the headers where they agree with it; it changes nothing that is read (see ``_walk_by_starts``).
    """
    if block_length <= 0:
        raise ValueError(f"block_length must be positive, got {block_length}")
    label = name or (os.fspath(source) if isinstance(source, (str, os.PathLike)) else getattr(source, "name", "<stream>"))
    compression = normalize_compression(compression, str(label))
    with _opened(source) as handle:
        if compression is not None or skip_corrupt or skip_records:
            if compression is None:
                handle.seek(start_offset)  # RecordReader seeks only to a non-zero start
            reader = RecordReader(
                handle, compression, verify=verify, skip_corrupt=skip_corrupt, on_skip=on_skip,
                start_offset=start_offset, name=str(label),
            )
            yield from _reader_blocks(reader, block_length, limit, stop_offset, skip_records)
        elif verify and record_starts is not None:
            yield from _spanned_blocks(handle, str(label), start_offset, block_length, limit, stop_offset, record_starts)
        else:
            yield from _fast_blocks(handle, str(label), start_offset, block_length, limit, stop_offset, verify,
                                    record_starts)


def offset_of_record(source: PathOrFile, start_offset: int, count: int, *, name: str | None = None) -> int:
    """The offset just after ``count`` records from ``start_offset`` of an uncompressed file (headers only)."""
    offset = start_offset
    if count > 0:
        for block in record_blocks(source, None, start_offset, count, count, verify=False, name=name):
            offset = block.end_offset
    return offset


@contextlib.contextmanager
def _opened(source: PathOrFile) -> Iterator[BinaryIO]:
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            yield handle
    else:
        yield source


# --------------------------------------------------------------------------- RecordReader path


def _reader_blocks(
    reader: RecordReader, block_length: int, limit: int | None, stop_offset: int | None, skip_records: int = 0
) -> Iterator[RecordBlock]:
    """The same blocks through ``RecordReader``: any compression, skipping, and every error as it reports it."""
    records = reader.records_with_offsets()
    next(itertools.islice(records, skip_records, skip_records), None)  # consume the first skip_records
    if stop_offset is not None:
        records = _records_before(reader, records, stop_offset)
    keep_payloads = reader.verify
    remaining = limit
    while remaining is None or remaining > 0:
        want = block_length if remaining is None else min(block_length, remaining)
        chunk = list(itertools.islice(records, want))
        if not chunk:
            return
        offsets, payloads = zip(*chunk)
        if keep_payloads:
            yield RecordBlock.from_payloads(payloads, offsets)
        else:  # headers only: lengths, no joined copy of the payloads
            bounds = _bounds(np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads)))
            yield RecordBlock(None, bounds[:-1], bounds[1:], np.asarray(offsets, dtype=np.int64))
        if remaining is not None:
            remaining -= len(chunk)
        if len(chunk) < want:
            return


def _records_before(reader: RecordReader, records: Iterator[tuple[int, bytes]], stop: int) -> Iterator[tuple[int, bytes]]:
    """The reader's records that start before ``stop``; none at or after it is read (a resync may land past it)."""
    while reader.offset < stop:
        item = next(records, None)
        if item is None or item[0] >= stop:
            return
        yield item


# --------------------------------------------------------------------------------- fast path


_spare = threading.local()
_NO_BUFFER = np.empty(0, dtype=np.uint8)


class _Window:
    """A read buffer: ``buffer[:end]`` holds the file's bytes from offset ``base``; ``eof`` once the file is read."""

    def __init__(self, handle: BinaryIO, offset: int):
        self.handle = handle
        self.size = handle.seek(0, os.SEEK_END)  # no record may claim more: a buffer is never sized past it
        handle.seek(offset)
        # Fresh memory costs a page fault per 4 KiB: a thread's reads reuse its last buffer. A buffer is a
        # numpy array, not a bytearray: bytearray(n) zero-fills it holding the GIL (a quarter of the
        # GIL-holding samples of a raw epoch on threads); numpy leaves the pages to the read, which releases it.
        spare = getattr(_spare, "buffer", None)
        self.buffer: np.ndarray = _NO_BUFFER if spare is None else spare
        _spare.buffer = None
        self.base = offset
        self.end = 0
        self.eof = False

    def __enter__(self) -> _Window:
        return self

    def __exit__(self, *exc_info) -> None:
        """Leave the buffer for the thread's next read (no block refers to it: blocks hold copies)."""
        spare = getattr(_spare, "buffer", None)
        if (0 if spare is None else len(spare)) < len(self.buffer) <= SPARE_BUFFER_MAX:
            _spare.buffer = self.buffer
        self.buffer = _NO_BUFFER

    def refill(self, keep_from: int, size: int) -> int:
        """Drop the bytes before ``keep_from`` and read until ``size`` bytes are held (or the file ends).

        Returns how far positions moved (subtract it from positions in the old buffer).
        """
        kept = self.end - keep_from
        size = max(size, kept)
        if len(self.buffer) < size:
            grown = np.empty(size, dtype=np.uint8)
            grown[:kept] = self.buffer[keep_from:self.end]
            self.buffer = grown
        elif keep_from:
            self.buffer[:kept] = self.buffer[keep_from:self.end]  # numpy copies overlapping 1-D ranges in a safe direction
        self.base += keep_from
        self.end = kept
        while self.end < size:
            count = self._read_into(self.end)
            if not count:
                self.eof = True
                break
            self.end += count
        return keep_from

    def _read_into(self, at: int) -> int:
        """Read into ``buffer[at:]``; how many bytes came (0 at the end of the file)."""
        if hasattr(self.handle, "readinto"):
            with memoryview(self.buffer) as view:  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
                return self.handle.readinto(view[at:]) or 0
        data = self.handle.read(len(self.buffer) - at) or b""
        self.buffer[at:at + len(data)] = np.frombuffer(data, dtype=np.uint8)
        return len(data)


def _fast_blocks(
    handle: BinaryIO, name: str, start_offset: int, block_length: int, limit: int | None, stop_offset: int | None, verify: bool,
    record_starts: np.ndarray | None = None,
) -> Iterator[RecordBlock]:
    with _Window(handle, start_offset) as window:
        stop = _NO_STOP if stop_offset is None else stop_offset
        pos = 0  # next record, as a position in window.buffer
        remaining = limit
        block_bytes = 0  # framed bytes of the last full block: how much to have in the buffer before the next
        while remaining is None or remaining > 0:
            want = block_length if remaining is None else min(block_length, remaining)
            if window.end - pos < block_bytes and not window.eof:
                # Room for several blocks (the unread tail moved to the front is at most one),
                # but no more than two when blocks are large.
                pos -= window.refill(pos, max(READ_CHUNK, 2 * block_bytes, min(4 * block_bytes, SPARE_BUFFER_MAX)))
            starts, after = _walk_here(window, pos, want, stop, record_starts)
            while len(starts) < want and after < stop - window.base and not window.eof:
                # The buffer ends inside the block: read more (unless the next header is already bad) and walk again.
                need = _bytes_needed(window.buffer, after, window.end)
                if need is None or window.base + after < window.size < window.base + after + need:
                    break  # RecordReader reports the bad header, or the record cut off by the end of the file
                pos -= window.refill(pos, max(READ_CHUNK, 2 * (window.end - pos), after - pos + need))
                starts, after = _walk_here(window, pos, want, stop, record_starts)
            if not len(starts):
                if after >= stop - window.base or (window.eof and after == window.end):
                    return  # the range or the file ends here
                break  # a bad header, or a record cut off by the end of the file
            block = _check_block(window.buffer, starts, verify)
            if block is None:
                break  # a CRC mismatch in this block
            yield block._replace(offsets=block.offsets + window.base)
            pos = after
            if len(starts) == want:
                block_bytes = max(block_bytes, after - starts[0])
            if remaining is not None:
                remaining -= len(starts)
            if len(starts) < want and (after >= stop - window.base or (window.eof and after == window.end)):
                return
        else:
            return
        # From the first record not handed out, RecordReader raises (or reads on) with the exact offset.
        handle.seek(window.base + pos)  # RecordReader seeks only to a non-zero start
        reader = RecordReader(handle, None, verify=verify, start_offset=window.base + pos, name=name)
    yield from _reader_blocks(reader, block_length, remaining, stop_offset)


# Bytes a span request of ``_spanned_blocks`` gathers whole blocks into (up to one block more), as an object's
# sequential range reads take 8 MiB at a time: a request's latency is small beside its transfer.
SPAN_BYTES = 8 << 20


def _spanned_blocks(handle: BinaryIO, name: str, start_offset: int, block_length: int, limit: int | None,
                    stop_offset: int | None, starts: np.ndarray) -> Iterator[RecordBlock]:
    """``_fast_blocks`` cut by the file's record starts: its byte spans of whole blocks are read into buffers of their
    own (an object's ``RangedFile.read_spans`` requests them ahead), and a block is checked where its span's read
    put it, with no copy into a read window and none out of it.

    A block whose headers disagree with ``starts``, or whose CRCs do not match, and every block after it, are left to
    ``_fast_blocks`` from that block's first record (read again by it): blocks and errors are the walk's.
    """
    records = len(starts) - 1
    first = int(np.searchsorted(starts[:records], start_offset))
    size = handle.seek(0, os.SEEK_END)
    end = records if first < records and int(starts[first]) == start_offset and int(starts[-1]) == size else first
    if stop_offset is not None:
        end = min(end, int(np.searchsorted(starts[:records], stop_offset)))
    if limit is not None:
        end = min(end, first + limit)
    if end > first and np.any(np.diff(starts[first:end + 1]) < RECORD_OVERHEAD):
        end = first  # not record starts: no span can be planned on them
    done = first
    if end > first:
        bounds = [*range(first, end, block_length), end]
        spans, groups = _spans_of(starts, bounds)
        read_spans = getattr(handle, "read_spans", None)
        reads = read_spans(spans, slack=TRAILING_SLACK) if read_spans else _read_spans(handle, spans, TRAILING_SLACK)
        try:
            for (span_start, _), blocks, buffer in zip(spans, groups, reads):
                for begin, stop in blocks:
                    block = _block_in_span(buffer, span_start, starts, begin, stop)
                    if block is None:
                        break
                    yield block
                    done = stop
                else:
                    continue
                break
        finally:
            reads.close()
    if done < end or end == first:
        remaining = None if limit is None else limit - (done - first)
        yield from _fast_blocks(handle, name, int(starts[done]) if done > first else start_offset, block_length,
                                remaining, stop_offset, True, starts)


def _read_spans(handle: BinaryIO, spans: list[tuple[int, int]], slack: int) -> Generator[np.ndarray, None, None]:
    """Each span's bytes in a buffer of its own, then ``slack`` zero bytes (``RangedFile.read_spans`` of a file)."""
    for offset, length in spans:
        buffer = np.empty(length + slack, dtype=np.uint8)
        buffer[length:] = 0
        handle.seek(offset)
        with memoryview(buffer) as view:  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so for 3.12+
            done = 0
            while done < length:
                count = handle.readinto(view[done:length]) or 0  # type: ignore[attr-defined]  # binary files have it
                if not count:
                    break
                done += count
        if done < length:  # shorter than its index says: read by the walk, which names what is missing
            return
        yield buffer


def _spans_of(starts: np.ndarray, bounds: list[int]) -> tuple[list[tuple[int, int]], list[list[tuple[int, int]]]]:
    """(byte spans ``(offset, length)``, the record ranges of the blocks each holds) for blocks between ``bounds``."""
    spans: list[tuple[int, int]] = []
    groups: list[list[tuple[int, int]]] = []
    for begin, stop in zip(bounds[:-1], bounds[1:]):
        low, high = int(starts[begin]), int(starts[stop])
        if groups and spans[-1][1] < SPAN_BYTES:
            spans[-1] = (spans[-1][0], high - spans[-1][0])
            groups[-1].append((begin, stop))
        else:
            spans.append((low, high - low))
            groups.append([(begin, stop)])
    return spans, groups


def _block_in_span(buffer: np.ndarray, span_start: int, starts: np.ndarray, begin: int, stop: int) -> RecordBlock | None:
    """Records ``begin:stop`` as a block over ``buffer`` (the file from ``span_start``, then zero slack), when every
    header leads to the next start and every CRC matches (the framing is rewritten in place); else None."""
    heads = starts[begin:stop] - span_start
    low, high = int(heads[0]), int(starts[stop]) - span_start
    lengths = le_integers(buffer[:high], 8)[heads].astype(np.int64)
    if np.any(lengths > MAX_PAYLOAD_SIZE) or not np.array_equal(heads[1:], (heads + lengths + RECORD_OVERHEAD)[:-1]):
        return None
    if heads[-1] + lengths[-1] + RECORD_OVERHEAD != high:
        return None
    data = buffer[low:high + TRAILING_SLACK]  # what follows the block is the next one's bytes, or the span's zero slack
    heads = heads - low
    payload_ends = heads + HEADER_SIZE + lengths
    if not _block_crcs_match(data, heads, lengths, payload_ends, high - low):
        return None
    return RecordBlock(data, heads + HEADER_SIZE, payload_ends, starts[begin:stop])


def _walk(buffer: np.ndarray, pos: int, want: int, end: int, stop: int) -> tuple[list[int], int]:
    """Up to ``want`` record starts from ``pos``, before ``stop``, whose whole record lies before ``end``.

    Returns them and the position after the last one (where the walk stopped).
    """
    starts: list[int] = []
    append = starts.append
    unpack = _unpack_length
    view = memoryview(buffer)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy types it so for 3.12+); struct reads a view faster
    last = min(end - HEADER_SIZE, stop - 1)
    for _ in range(want):
        if pos > last:
            break
        append(pos)
        pos += unpack(view, pos)[0] + RECORD_OVERHEAD
    # Only the last record can overrun the buffer: the walk stops right after it.
    if pos > end:
        pos = starts.pop()
    return starts, pos


_walked_lock = threading.Lock()
_walked = 0


def records_walked() -> int:
    """Records this process's reads have found by walking their headers one at a time in Python, since it started.

    For profiling a read: one given its read index's record starts (``record_starts``) walks none where they agree
    with the headers (the walk was a fifth of a raw epoch's CPU), so a count that grows says the index went unused.
    Counted once a block, not once a record.
    """
    return _walked


def _walk_here(window: _Window, pos: int, want: int, stop: int,
               record_starts: np.ndarray | None) -> tuple[list[int] | np.ndarray, int]:
    """``_walk`` in the window's buffer: from ``record_starts`` where they agree with the headers, else record by record."""
    global _walked
    if record_starts is not None:
        found = _walk_by_starts(window.buffer, pos, want, window.end, stop - window.base, record_starts, window.base)
        if found is not None:
            return found
    starts, after = _walk(window.buffer, pos, want, window.end, stop - window.base)
    with _walked_lock:
        _walked += len(starts)
    return starts, after


def _walk_by_starts(buffer: np.ndarray, pos: int, want: int, end: int, stop: int, starts: np.ndarray,
                    base: int) -> tuple[np.ndarray, int] | None:
    """What ``_walk`` returns, read off ``starts`` (every record start of the file, then its size; ``buffer`` holds
    the file from byte ``base``) with a vectorised check of the headers the walk would read: each record's length
    field must lead to the next start. None when ``pos`` is not among them or a header disagrees: the walk then
    goes record by record. The walk goes from ``pos`` by the length fields, so where every length it would read
    agrees, its starts are these.
    """
    first = int(np.searchsorted(starts, base + pos))
    if first >= len(starts) - 1 or starts[first] != base + pos:
        return None
    chain = starts[first:first + want + 1] - base
    last = min(end - HEADER_SIZE, stop - 1)
    count = int(np.searchsorted(chain[:want], last, side="right"))  # the walk appends while a start is <= last
    if count < len(chain) - 1 and count < want and chain[count] <= last:
        return None  # not increasing: no record starts
    heads = chain[:count]
    if not count:
        return heads, pos
    lengths = le_integers(np.frombuffer(buffer, dtype=np.uint8)[:end], 8)[heads].astype(np.int64)
    if np.any(lengths > MAX_PAYLOAD_SIZE) or not np.array_equal(heads + lengths + RECORD_OVERHEAD, chain[1:count + 1]):
        return None
    after = int(chain[count])
    if after > end:  # only the last record can overrun the buffer: the walk stops right before it
        heads, after = heads[:-1], int(heads[-1])
    return heads, after


def _bytes_needed(buffer: np.ndarray, pos: int, end: int) -> int | None:
    """Bytes of the record at ``pos`` (a header's worth when it is cut off); None when its header is bad."""
    if end - pos < HEADER_SIZE:
        return HEADER_SIZE
    header = buffer[pos:pos + HEADER_SIZE].tobytes()
    if not sound_header(header):
        return None
    return _unpack_length(header)[0] + RECORD_OVERHEAD


def _check_block(buffer: np.ndarray, starts: list[int] | np.ndarray, verify: bool) -> RecordBlock | None:
    """The records at ``starts`` (offsets relative to ``buffer``) as a block, or None when a CRC does not match."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    heads = np.asarray(starts, dtype=np.int64)
    lengths = le_integers(raw, 8)[heads].astype(np.int64)
    if not verify:
        bounds = _bounds(lengths)
        return RecordBlock(None, bounds[:-1], bounds[1:], heads)
    first, end = int(heads[0]), int(heads[-1] + lengths[-1] + RECORD_OVERHEAD)
    # The block's own copy (the read buffer is reused), with zero slack after it.
    data = np.empty(end - first + TRAILING_SLACK, dtype=np.uint8)
    data[: end - first] = raw[first:end]
    data[end - first:] = 0
    heads = heads - first  # not in place: ``starts`` may be the caller's array
    payload_ends = heads + HEADER_SIZE + lengths
    if not _block_crcs_match(data, heads, lengths, payload_ends, end - first):
        return None
    return RecordBlock(data, heads + HEADER_SIZE, payload_ends, heads + first)


# Four bytes that take a CRC-32C register from 0 to 0xFFFFFFFF (CRC-32C's initial value).
_INIT_FROM_ZERO = np.frombuffer(bytes.fromhex("54641f64"), dtype=np.uint8)


def _block_crcs_match(data: np.ndarray, heads: np.ndarray, lengths: np.ndarray, payload_ends: np.ndarray, size: int) -> bool:
    """Do the length and data CRCs of every record framed in ``data[:size]`` match? Two CRC calls in all.

    A CRC-32C register run from 0 over ``init ‖ message ‖ ~crc32c(message)`` (4 little-endian
    bytes) ends at 0, where ``init`` is the 4 bytes that take it from 0 to CRC-32C's initial
    value. So each record's framing is rewritten in place: its 12-byte header becomes 8 zero
    bytes (which leave a zero register at 0) and ``init``, its data CRC ``~unmasked CRC``; one
    CRC call over the whole block ends at 0 when every data CRC matches. A record whose CRC does
    not match leaves a non-zero register, which the following bytes map one-to-one (an
    invertible linear map), so the block fails; several bad records in one block could cancel
    out only with probability 2**-32, the odds of one bad record passing its own CRC. The length
    fields are checked the same way in a small buffer of their own. On a mismatch the caller
    hands the block to RecordReader, which finds the exact record. ``lengths`` are the records'
    length fields as read from ``data``.
    """
    words = le_integers(data, 4)
    if not length_crcs_match(lengths, words[heads + 8]):
        return False
    byte_rows(data, HEADER_SIZE)[heads] = _HEADER_STAND_IN
    words[payload_ends] = ~unmask_crcs(words[payload_ends])
    return _crc(memoryview(data)[:size], 0xFFFFFFFF) == 0xFFFFFFFF  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


def first_damaged_record(frames: np.ndarray, offsets: np.ndarray) -> tuple[int, str] | None:
    """The first record of ``frames`` (framed TFRecords at ``offsets``, n + 1 of them from 0) whose length field is not
    the one ``offsets`` gives or whose length or data CRC fails, as (index, "length" / "length_crc" / "data_crc");
    None when every record is whole.

    For frames read back from a file (a spill file the run wrote): two CRC calls over a copy when all is well
    (``_block_crcs_match``), a look at each record only when something is not.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    size = int(offsets[-1])
    if size > len(frames):
        raise ValueError(f"offsets reach byte {size}, past the {len(frames)} bytes of frames")
    if len(offsets) < 2:
        return None
    heads, lengths = offsets[:-1], np.diff(offsets) - RECORD_OVERHEAD
    data = np.array(frames[:size], dtype=np.uint8)  # a copy: the check rewrites the framing in place
    stored_lengths = le_integers(data, 8)[heads].astype(np.int64)
    if np.array_equal(stored_lengths, lengths) and _block_crcs_match(data, heads, lengths, heads + HEADER_SIZE + lengths, size):
        return None
    # Which record: the first whose length is not the piece's, or the first RecordReader refuses, whichever is earlier.
    wrong_length = np.flatnonzero(stored_lengths != lengths)
    found = (int(wrong_length[0]), "length") if wrong_length.size else None
    try:  # read every record, keeping none: RecordReader raises at the first one it refuses
        collections.deque(RecordReader(io.BytesIO(memoryview(np.ascontiguousarray(frames[:size]))), None), maxlen=0)  # type: ignore[arg-type]  # an ndarray is a buffer
    except RecordError as error:
        refused = int(np.searchsorted(heads, error.offset, side="right")) - 1
        if found is None or refused < found[0]:
            found = refused, error.check
    if found is None:
        raise AssertionError("the block check failed, yet RecordReader reads every record")  # the checks agree
    return found


def length_crcs_match(lengths: np.ndarray, masked_crcs: np.ndarray) -> bool:
    """Does every record's masked length CRC match its 8-byte length field? One CRC call for all (see above)."""
    count = len(lengths)
    header_stream = np.empty((count, 4), dtype="<u4")  # init, the length (8 bytes), ~unmasked length CRC
    header_stream[:, 0] = _INIT_FROM_ZERO.view("<u4")[0]
    header_stream[:, 1:3] = np.asarray(lengths).astype("<u8").view("<u4").reshape(count, 2)
    header_stream[:, 3] = ~unmask_crcs(np.asarray(masked_crcs, dtype="<u4"))
    return _crc(header_stream, 0xFFFFFFFF) == 0xFFFFFFFF  # value=0xFFFFFFFF: the register starts (and must end) at 0


_HEADER_STAND_IN = np.concatenate((np.zeros(8, np.uint8), _INIT_FROM_ZERO))
