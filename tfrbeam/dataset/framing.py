"""Blocks of consecutive TFRecord payloads, as one buffer plus bounds: the reader's input to the decoder.

Uncompressed files take a fast path: a tight walk over record headers in a large read buffer,
the length CRCs of the whole block checked at once with numpy, one hardware CRC call per payload,
and the payloads joined into the decoder's buffer. At the first sign of trouble (a CRC mismatch,
a truncated record, an absurd length) it hands the rest of the file, from the start of that
block, to ``tfrbeam.records.RecordReader``, which raises or skips exactly as it always does.
Compressed files go through ``RecordReader`` throughout.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Callable, Iterator

import crc32c
import numpy as np

from tfrbeam.records import HEADER_SIZE, MAX_PAYLOAD_SIZE, RECORD_OVERHEAD, RecordReader, SkippedRegion

READ_CHUNK = 4 << 20

_unpack_length = struct.Struct("<Q").unpack_from
_crc = crc32c.crc32c


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table[byte] = crc
    return table


_TABLE = _crc32c_table()


def masked_crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """Masked CRC32C of each row of a 2-D uint8 array (used for the 8-byte length fields)."""
    crc = np.full(len(rows), 0xFFFFFFFF, dtype=np.uint32)
    for column in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    rotated = ((crc >> np.uint32(15)) | (crc << np.uint32(17))).astype(np.uint64)
    return ((rotated + 0xA282EAD8) & 0xFFFFFFFF).astype(np.uint32)


RecordBlock = tuple  # (payloads joined: bytes | None, bounds: int64[n + 1], record offsets: int64[n])


def record_blocks(
    path: str,
    compression: str | None,
    start_offset: int,
    block_length: int,
    limit: int | None,
    *,
    verify: bool = True,
    skip_corrupt: bool = False,
    on_skip: Callable[[SkippedRegion], None] | None = None,
    skip_records: int = 0,
) -> Iterator[RecordBlock]:
    """Blocks of up to ``block_length`` records (``limit`` in all) from ``start_offset`` (after ``skip_records`` records).

    ``verify=False`` checks nothing and leaves the payloads out (a fast walk over headers).
    """
    if compression is not None or skip_corrupt or skip_records:
        yield from _reader_blocks(path, compression, start_offset, block_length, limit, verify, skip_corrupt, on_skip, skip_records)
    else:
        yield from _fast_blocks(path, start_offset, block_length, limit, verify)


def _reader_blocks(
    path: str,
    compression: str | None,
    start_offset: int,
    block_length: int,
    limit: int | None,
    verify: bool,
    skip_corrupt: bool = False,
    on_skip: Callable[[SkippedRegion], None] | None = None,
    skip_records: int = 0,
) -> Iterator[RecordBlock]:
    """The same blocks through ``RecordReader``: any compression, skipping, and every error as it reports it."""
    reader = RecordReader(path, compression, verify=verify, skip_corrupt=skip_corrupt, on_skip=on_skip, start_offset=start_offset)
    with reader:
        records = reader.records_with_offsets()
        for _ in itertools.islice(records, skip_records):
            pass
        yield from _blocks_from_reader(records, block_length, limit, keep_payloads=verify)


def _blocks_from_reader(records: Iterator[tuple[int, bytes]], block_length: int, limit: int | None, keep_payloads: bool) -> Iterator[RecordBlock]:
    remaining = limit
    while remaining is None or remaining > 0:
        want = block_length if remaining is None else min(block_length, remaining)
        chunk = list(itertools.islice(records, want))
        if not chunk:
            return
        offsets, payloads = zip(*chunk)
        lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        bounds = np.zeros(len(payloads) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        yield (b"".join(payloads) if keep_payloads else None), bounds, np.asarray(offsets, dtype=np.int64)
        if remaining is not None:
            remaining -= len(chunk)
        if len(chunk) < want:
            return


def _fast_blocks(path: str, start_offset: int, block_length: int, limit: int | None, verify: bool) -> Iterator[RecordBlock]:
    remaining = limit
    with open(path, "rb") as handle:
        handle.seek(start_offset)
        buffer = handle.read(READ_CHUNK)
        base, pos = start_offset, 0  # file offset of buffer[0]; next record in buffer
        eof = len(buffer) < READ_CHUNK
        while remaining is None or remaining > 0:
            want = block_length if remaining is None else min(block_length, remaining)
            starts, pos, trouble = _walk(buffer, pos, want)
            if trouble or (not starts and eof and pos < len(buffer)):
                pos = starts[0] if starts else pos
                break  # a bad header or a partial record at the end: RecordReader reports it
            if not starts:
                if eof:
                    return
                need = _record_size(buffer, pos)
                buffer = buffer[pos:] + handle.read(max(READ_CHUNK, need - (len(buffer) - pos)))
                base, pos = base + pos, 0
                eof = handle.tell() >= _file_size(handle)
                continue
            block = _check_block(buffer, starts, verify)
            if block is None:
                pos = starts[0]
                break
            data, bounds = block
            yield data, bounds, np.asarray(starts, dtype=np.int64) + base
            if remaining is not None:
                remaining -= len(starts)
            if len(buffer) - pos < READ_CHUNK // 2 and not eof:
                buffer = buffer[pos:] + handle.read(READ_CHUNK)
                base, pos = base + pos, 0
                eof = handle.tell() >= _file_size(handle)
        else:
            return
    # Slow path from the first record not handed out: it raises (or skips) with the exact offset.
    yield from _reader_blocks(path, None, base + pos, block_length, remaining, verify)


def _file_size(handle) -> int:
    return os.fstat(handle.fileno()).st_size


def _walk(buffer: bytes, pos: int, want: int) -> tuple[list[int], int, bool]:
    """Record starts from ``pos`` (at most ``want``) whose whole record is in ``buffer``; trouble on an absurd length."""
    starts: list[int] = []
    append = starts.append
    size = len(buffer)
    last_header = size - HEADER_SIZE
    unpack = _unpack_length
    for _ in range(want):
        if pos > last_header:
            break
        end = pos + unpack(buffer, pos)[0] + RECORD_OVERHEAD
        if end > size:
            return starts, pos, unpack(buffer, pos)[0] > MAX_PAYLOAD_SIZE
        append(pos)
        pos = end
    return starts, pos, False


def _record_size(buffer: bytes, pos: int) -> int:
    if len(buffer) - pos < HEADER_SIZE:
        return HEADER_SIZE
    return _unpack_length(buffer, pos)[0] + RECORD_OVERHEAD


def _check_block(buffer: bytes, starts: list[int], verify: bool) -> tuple[bytes | None, np.ndarray] | None:
    """(joined payloads, bounds) of the records at ``starts``, or None when a CRC does not match."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    heads = np.asarray(starts, dtype=np.int64)
    lengths = _gather_u64(raw, heads).astype(np.int64)
    bounds = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if not verify:
        return None, bounds
    header_bytes = raw[heads[:, None] + np.arange(8)]
    if (masked_crc32c_rows(header_bytes) != _gather_u32(raw, heads + 8)).any():
        return None
    first = heads + HEADER_SIZE
    payloads = [buffer[begin:end] for begin, end in zip(first.tolist(), (first + lengths).tolist())]
    computed = np.fromiter(map(_crc, payloads), dtype=np.uint64, count=len(payloads))
    rotated = ((computed >> 15) | (computed << 17)) & 0xFFFFFFFF
    if (((rotated + 0xA282EAD8) & 0xFFFFFFFF) != _gather_u32(raw, heads + HEADER_SIZE + lengths)).any():
        return None
    return b"".join(payloads), bounds


def _gather_u64(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    return raw[at[:, None] + np.arange(8)].copy().view("<u8").reshape(-1)


def _gather_u32(raw: np.ndarray, at: np.ndarray) -> np.ndarray:
    return raw[at[:, None] + np.arange(4)].copy().view("<u4").reshape(-1)


def offset_of_record(path: str, start_offset: int, count: int) -> int:
    """The offset just after ``count`` records from ``start_offset`` of an uncompressed file (headers only)."""
    offset = start_offset
    for _, bounds, offsets in _fast_blocks(path, start_offset, max(count, 1), count, verify=False):
        offset = int(offsets[-1]) + int(bounds[-1] - bounds[-2]) + RECORD_OVERHEAD
    return offset
