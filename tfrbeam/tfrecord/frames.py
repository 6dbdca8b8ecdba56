"""Many TFRecord frames at once: the framing of ``records.frame_records``, vectorised with numpy.

The build's shard writers frame a shard's records block by block; per record only a slice and a
crc32c call remain in Python (``frame_gathered``), or none at all when records share a few lengths
(``frame_ordered``). The bytes are always those of ``tfrbeam.tfrecord.records.frame_records``.
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np
import pyarrow as pa

from tfrbeam.base.byte_views import le_integers, windows
from tfrbeam.base.gc_pause import gc_paused
from tfrbeam.tfrecord.records import (
    HEADER_SIZE,
    MAX_PAYLOAD_SIZE,
    RECORD_OVERHEAD,
    frame_records,
    mask_crcs,
    masked_crc32c,
)

__all__ = ["frame_gathered", "frame_ordered", "join_frames", "join_frames_in_buffers", "payload_prefixes"]

# frame_ordered copies payloads per group of equal length; beyond this many groups (or 1 per 32
# records) the per-record join of frame_gathered is cheaper.
_MIN_LENGTH_GROUPS = 64
_RECORDS_PER_LENGTH_GROUP = 32

_crc32c = crc32c.crc32c
_pack_length = struct.Struct("<Q").pack


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
    return join_frames(payloads, lengths, mask_crcs(crcs))


def join_frames(payloads: list, lengths: np.ndarray, masked_crcs: np.ndarray) -> bytes:
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


def join_frames_in_buffers(buffers: list, buffer_of: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                           masked_crcs: np.ndarray, prefixes: np.ndarray | None = None) -> bytes | memoryview:
    """The TFRecord frames of the payloads ``buffers[buffer_of[i]][starts[i]:starts[i] + lengths[i]]`` as one buffer.

    The payloads' masked CRCs are given. Where pyarrow can (19 and later), Arrow copies every
    header, payload and footer in one cast of a binary-view array, three views a record (the
    header and footer inline, the payload pointing into its buffer): no Python work per record.
    Otherwise a slice per record and ``join_frames``. ``prefixes`` (``payload_prefixes`` of the
    records, computed once where the same records are framed block by block) saves reading them here.
    """
    if len(lengths) and _BINARY_VIEW_FRAMES and max((len(b) for b in buffers if b is not None), default=0) < 2**31:
        return _join_through_binary_views(buffers, buffer_of, starts, lengths, masked_crcs, prefixes)
    with gc_paused():
        payloads = [buffers[part][start:start + length]
                    for part, start, length in zip(buffer_of.tolist(), starts.tolist(), lengths.tolist())]
        return join_frames(payloads, lengths, masked_crcs)


_INLINE_BYTES = 12  # a binary view of at most this many bytes holds them itself


def payload_prefixes(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each payload's first 4 bytes (as a little-endian uint32) where it is longer than a binary view holds
    inline, 0 elsewhere: what ``join_frames_in_buffers`` puts in a long payload's view."""
    prefixes = np.zeros(len(starts), dtype="<u4")
    long = np.flatnonzero(np.asarray(lengths) > _INLINE_BYTES)
    if long.size:
        prefixes[long] = le_integers(np.asarray(buffer, dtype=np.uint8), 4)[np.asarray(starts)[long]]
    return prefixes


def _join_through_binary_views(buffers: list, buffer_of: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                               masked_crcs: np.ndarray, prefixes: np.ndarray | None = None) -> memoryview:
    count = len(lengths)
    lengths = np.asarray(lengths, dtype=np.int64)
    views = np.zeros((count, 3, 16), dtype=np.uint8)  # per record: header, payload, footer
    unique_lengths, which = np.unique(lengths, return_inverse=True)
    length_crcs = np.array([masked_crc32c(_pack_length(length)) for length in unique_lengths.tolist()], dtype="<u4")
    views[:, 0, 0:4] = np.frombuffer(np.int32(HEADER_SIZE).tobytes(), np.uint8)
    views[:, 0, 4:12] = lengths.astype("<u8").view(np.uint8).reshape(count, 8)
    views[:, 0, 12:16] = length_crcs[which.ravel()].view(np.uint8).reshape(count, 4)
    views[:, 2, 0:4] = np.frombuffer(np.int32(RECORD_OVERHEAD - HEADER_SIZE).tobytes(), np.uint8)
    views[:, 2, 4:8] = np.asarray(masked_crcs).astype("<u4").view(np.uint8).reshape(count, 4)
    payload = views[:, 1, :]
    payload[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(count, 4)
    payload[:, 8:12] = np.asarray(buffer_of).astype("<i4").view(np.uint8).reshape(count, 4)
    payload[:, 12:16] = np.asarray(starts).astype("<i4").view(np.uint8).reshape(count, 4)
    arrays = [np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, np.uint8)
              for buffer in buffers]
    long = lengths > _INLINE_BYTES
    if prefixes is None:
        prefixes = _prefixes_by_buffer(arrays, np.asarray(buffer_of), np.asarray(starts), lengths)
    payload[:, 4:8] = np.asarray(prefixes).astype("<u4", copy=False).view(np.uint8).reshape(count, 4)
    for index in np.flatnonzero(~long).tolist():  # short payloads are held in the view itself
        start, length = int(starts[index]), int(lengths[index])
        payload[index, 4:12] = 0
        payload[index, 4:4 + length] = arrays[int(buffer_of[index])][start:start + length]
    framed = pa.Array.from_buffers(pa.binary_view(), 3 * count, [None, pa.py_buffer(views),
                                                                  *(pa.py_buffer(array) for array in arrays)])
    joined = framed.cast(pa.large_binary())
    # unsigned bytes, as bytes are: Arrow's buffers show as signed chars, which compare differently
    return memoryview(joined.buffers()[2]).cast("B")[:int(lengths.sum()) + RECORD_OVERHEAD * count]


def _prefixes_by_buffer(arrays: list[np.ndarray], buffer_of: np.ndarray, starts: np.ndarray,
                        lengths: np.ndarray) -> np.ndarray:
    """``payload_prefixes`` of records in several buffers: the records grouped by buffer once, one gather per
    buffer (a scan of every record per buffer made a block cost records x buffers)."""
    prefixes = np.zeros(len(starts), dtype="<u4")
    by_buffer = np.argsort(buffer_of, kind="stable")
    owners = buffer_of[by_buffer]
    bounds = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1], True]) if len(owners) else np.zeros(1, np.int64)
    for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        group = by_buffer[low:high]
        prefixes[group] = payload_prefixes(arrays[int(owners[low])], starts[group], lengths[group])
    return prefixes


def _binary_view_frames_work() -> bool:
    """Whether this pyarrow builds a binary-view array over several buffers and casts it to large_binary (19+)."""
    try:
        data = np.frombuffer(b"0123456789abcdefXY", dtype=np.uint8)
        framed = _join_through_binary_views([data, data], np.array([1, 0]), np.array([2, 16]), np.array([14, 2]),
                                            np.array([7, 9], dtype="<u4"))
        return bytes(framed) == join_frames([data[2:16].tobytes(), data[16:18].tobytes()], np.array([14, 2]),
                                            np.array([7, 9], dtype="<u4"))
    except (AttributeError, ValueError, pa.ArrowException):
        # pyarrow 14 and 15 have no pa.binary_view (AttributeError); 16 to 18 build binary views over no
        # more than one buffer ("Type's expected number of buffers (2) did not match the passed number (3)",
        # a ValueError); were the cast to large_binary missing, Arrow would raise ArrowNotImplementedError (an
        # ArrowException: no released pyarrow seen here lacks it; the test simulates it)
        return False


_BINARY_VIEW_FRAMES = _binary_view_frames_work()
