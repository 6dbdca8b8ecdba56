"""Wire-level primitives of the columnar decoders: the records' bytes in one buffer and numpy reads of them.

Varints, length prefixes, byte spans and the canonical packed / bytes lists, read for many
positions at once; shared by the Example decoder (``decode``) and the SequenceExample decoder
(``sequence_decode``), which own what the fields mean.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from tfrbeam.base.byte_views import byte_rows, le_integers
from tfrbeam.errors import ExampleDecodeError

__all__ = [
    "PAD", "RecordBuffer", "both_ok", "bytes_list_values", "decode_bytes", "decode_floats", "decode_varints",
    "exclusive_cumsum", "gather", "packed_payloads", "ranges", "read_lengths", "take", "unaligned_u64", "words_at",
]

# Zero bytes after the last record, so that the 8-byte windows the walk reads (at most 4 + 255
# bytes past a position inside a record) stay inside the buffer. Bounds are always checked
# against the record end.
PAD = 320


@dataclasses.dataclass(frozen=True)
class RecordBuffer:
    """All records of a batch in one zero-padded uint8 array, with each record's [start, end)."""

    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @property
    def num_records(self) -> int:
        return len(self.starts)

    @classmethod
    def from_input(cls, records: Any) -> RecordBuffer:
        """Records as ``examples_to_record_batch`` takes them: a sequence, (buffer, offsets), spans or Arrow binary."""
        if isinstance(records, (pa.BinaryArray, pa.LargeBinaryArray)):
            return cls.from_arrow(records)
        if hasattr(records, "data") and hasattr(records, "offsets"):
            return cls.from_buffer(records.data, records.offsets)
        if isinstance(records, tuple) and len(records) == 2 and not isinstance(records[1], (bytes, bytearray, memoryview)):
            return cls.from_buffer(records[0], records[1])
        if isinstance(records, tuple) and len(records) == 3 and isinstance(records[1], np.ndarray):
            return cls.from_spans(*records)
        if isinstance(records, (bytes, bytearray, memoryview, str)):
            raise TypeError(
                "records must be a sequence of serialized Examples (or a (buffer, offsets) pair), "
                f"not one {type(records).__name__}"
            )
        return cls.from_sequence(records)

    @classmethod
    def from_sequence(cls, records: Iterable[Any]) -> RecordBuffer:
        records = records if isinstance(records, (list, tuple)) else list(records)
        lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        joined = b"".join(itertools.chain(records, (bytes(PAD),)))
        ends = np.cumsum(lengths)
        return cls(np.frombuffer(joined, dtype=np.uint8), ends - lengths, ends)

    @classmethod
    def from_buffer(cls, data: Any, offsets: Any) -> RecordBuffer:
        raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if offsets.size == 0:
            raise ExampleDecodeError(
                "record offsets are empty: n records need n + 1 offsets (the first is the start of record 0)"
            )
        if offsets[0] < 0 or offsets[-1] > raw.size or (offsets.size > 1 and (np.diff(offsets) < 0).any()):
            raise ExampleDecodeError(
                f"record offsets must be non-decreasing and within the {raw.size}-byte buffer "
                f"(got first {int(offsets[0])}, last {int(offsets[-1])})"
            )
        buf = np.empty(raw.size + PAD, dtype=np.uint8)
        buf[: raw.size] = raw
        buf[raw.size :] = 0
        return cls(buf, offsets[:-1].copy(), offsets[1:].copy())

    @classmethod
    def from_spans(cls, data: Any, starts: np.ndarray, ends: np.ndarray) -> RecordBuffer:
        """Records at ``data[starts[i]:ends[i]]``; read in place when ``PAD`` bytes follow the last one."""
        raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        ends = np.asarray(ends, dtype=np.int64).reshape(-1)
        if starts.shape != ends.shape:
            raise ExampleDecodeError(f"record starts and ends differ in number ({starts.size} and {ends.size})")
        last_end = int(ends.max()) if ends.size else 0
        if ends.size and (int(starts.min()) < 0 or last_end > raw.size or (ends < starts).any()):
            raise ExampleDecodeError(
                f"record spans must lie within the {raw.size}-byte buffer with start <= end "
                f"(got starts from {int(starts.min())}, ends up to {last_end})"
            )
        if raw.size - last_end < PAD:
            buf = np.zeros(last_end + PAD, dtype=np.uint8)
            buf[:last_end] = raw[:last_end]
            raw = buf
        return cls(raw, starts, ends)

    @classmethod
    def from_arrow(cls, array: pa.Array) -> RecordBuffer:
        """Records held in a binary Arrow array (no nulls), without copying them one by one."""
        if array.null_count:
            raise ExampleDecodeError(f"record {int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])} is null")
        _, offsets_buffer, data_buffer = array.buffers()
        offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[array.offset : array.offset + len(array) + 1]
        data = data_buffer if data_buffer is not None else b""
        return cls.from_buffer(data, offsets.astype(np.int64))

    def chunk(self, start: int, stop: int) -> RecordBuffer:
        """Records [start, stop) of the batch (the same buffer)."""
        return RecordBuffer(self.buf, self.starts[start:stop], self.ends[start:stop])

    def record_bytes(self, index: int) -> bytes:
        return self.buf[self.starts[index] : self.ends[index]].tobytes()


# ------------------------------------------------------------------------------- spans and bytes


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """Start of each item's run when runs of ``counts`` lie back to back (0, c0, c0 + c1, ...), as int64."""
    out = np.empty(len(counts), dtype=np.int64)
    if len(counts):
        out[0] = 0
        np.cumsum(counts[:-1], out=out[1:])
    return out


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], starts[i] + lengths[i]) over i, vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - exclusive_cumsum(lengths), lengths)
    shift += np.arange(total, dtype=np.int64)
    return shift


def gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes of all spans [starts[i], starts[i] + lengths[i]) back to back.

    Spans of one length are copied as rows of a strided view of the buffer (one numpy row copy
    each; 1, 2, 4 or 8 bytes as one unaligned integer); spans of similar lengths as rows of their
    longest rounded up to 8 bytes, then cut to size; very uneven ones byte by byte.
    """
    count = len(lengths)
    if count == 0:
        return np.zeros(0, dtype=np.uint8)
    longest = int(lengths.max())
    total = int(lengths.sum())
    words = (longest + 7) // 8
    if words * 8 * count > 2 * total + 16 * count:
        return buf[ranges(starts, lengths)]
    uniform = total == longest * count
    if uniform and longest in (1, 2, 4, 8):
        return le_integers(buf, longest)[starts].view(np.uint8)
    width = longest if uniform else 8 * words
    if int(starts.max()) + width <= buf.size:
        rows = byte_rows(buf, width)[starts]
    else:  # windows near the end would run past the buffer: read them 8 bytes at a time, clamped
        u64 = unaligned_u64(buf)
        rows = (
            words_at(u64, starts[:, None] + np.arange(0, 8 * words, 8, dtype=np.int64)).view(np.uint8).reshape(count, 8 * words)
        )
    if uniform:
        return np.ascontiguousarray(rows[:, :longest]).reshape(-1)
    return rows[np.arange(rows.shape[1]) < lengths[:, None]]


# ------------------------------------------------------------------------------- value decoders


def decode_floats(buf: np.ndarray, owner: np.ndarray, starts: np.ndarray, lengths: np.ndarray, num_owners: int):
    """(counts per owner, float32 values) of packed-float byte runs owned by ascending owners."""
    values = gather(buf, starts, lengths).view("<f4")
    counts = np.bincount(owner, weights=lengths, minlength=num_owners).astype(np.int64) // 4
    return counts, values


def decode_bytes(buf: np.ndarray, owner: np.ndarray, starts: np.ndarray, lengths: np.ndarray, num_owners: int):
    """(counts per owner, value lengths, value bytes) of bytes values owned by ascending owners."""
    counts = np.bincount(owner, minlength=num_owners).astype(np.int64)
    return counts, lengths.astype(np.int64), gather(buf, starts, lengths)


def decode_varints(buf: np.ndarray, owner: np.ndarray, starts: np.ndarray, lengths: np.ndarray, num_owners: int):
    """(counts per owner, int64 values, owners whose bytes are not whole varints) of varint runs.

    Each run must be a sequence of complete varints of at most 10 bytes; protobuf keeps the low
    64 bits of a 10-byte varint, so do we.
    """
    raw = gather(buf, starts, lengths)
    total = raw.size
    if total == 0:
        return np.zeros(num_owners, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    terminal = raw < 0x80
    run_ends = np.cumsum(lengths)
    nonempty = lengths > 0
    bad_runs = nonempty & ~terminal[np.maximum(run_ends - 1, 0)]
    value_ends = np.flatnonzero(terminal)
    value_starts = np.empty(len(value_ends), dtype=np.int64)
    value_starts[:1] = 0
    value_starts[1:] = value_ends[:-1] + 1
    too_long = np.flatnonzero(value_ends - value_starts >= 10)
    if too_long.size:
        bad_runs[np.searchsorted(run_ends, value_ends[too_long], side="right")] = True
    terminals_before = np.concatenate(([0], np.cumsum(terminal)))
    counts = np.bincount(
        owner, weights=terminals_before[run_ends] - terminals_before[run_ends - lengths], minlength=num_owners
    ).astype(np.int64)
    if not value_ends.size:
        return counts, np.zeros(0, dtype=np.int64), np.unique(owner[bad_runs])
    covered = int(value_ends[-1]) + 1  # bytes after the last terminal belong to a broken run
    value_of_byte = terminals_before[:covered] if covered else terminals_before[:0]
    position = np.arange(covered, dtype=np.int64) - value_starts[value_of_byte]
    shift = (7 * np.minimum(position, 9)).astype(np.uint64)
    contributions = (raw[:covered] & 0x7F).astype(np.uint64) << shift
    values = np.bitwise_or.reduceat(contributions, value_starts).view(np.int64)
    return counts, values, np.unique(owner[bad_runs])


# --------------------------------------------------------------------- windows, lengths, lists


def words_at(u64: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """8-byte windows at ``positions``, for reads that may run past a short span's end into
    others' bytes: positions beyond the buffer read its last window (those bytes are masked)."""
    return u64[np.minimum(positions, len(u64) - 1)]


def unaligned_u64(buf: np.ndarray) -> np.ndarray:
    """A uint64 (little-endian) view of ``buf`` starting at every byte offset."""
    return le_integers(buf, 8)


def take(buf: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The bytes at ``positions``; a position past the buffer reads its last byte (bounds are checked by callers)."""
    return buf.take(positions, mode="clip")


def read_lengths(buf: np.ndarray, positions: np.ndarray):
    """Varints at ``positions`` (vectorised), for lengths: (value, next position, ok or None).

    Varints longer than 4 bytes (values of 256 MiB and up, or non-minimal encodings) are not
    ok here; those records go to the exact walker.
    """
    first = take(buf, positions)
    value = first.astype(np.int64)
    after = positions + 1
    multi = np.flatnonzero(first >= 0x80)
    if not multi.size:
        return value, after, None
    partial = value[multi] & 0x7F
    cursor = after[multi]
    done = np.zeros(multi.size, dtype=bool)
    for shift in (7, 14, 21):
        live = ~done
        byte = take(buf, cursor).astype(np.int64)
        partial = np.where(live, partial | ((byte & 0x7F) << shift), partial)
        cursor = np.where(live, cursor + 1, cursor)
        done |= live & (byte < 0x80)
    value[multi] = partial
    after[multi] = cursor
    ok = np.ones(positions.size, dtype=bool)
    ok[multi] = done
    return value, after, ok


def both_ok(ok: np.ndarray, more: np.ndarray | None) -> np.ndarray:
    """``ok & more``, where ``more`` None (as ``read_lengths`` gives when every varint is one byte) is all true."""
    return ok if more is None else ok & more


def packed_payloads(buf: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Payload spans of canonical FloatList/Int64List messages: empty, or one packed field 1."""
    nonempty = start < end
    length, payload_start, ok_len = read_lengths(buf, start + 1)
    ok = ~nonempty | ((take(buf, start) == 0x0A) & (payload_start + length == end))
    if ok_len is not None:
        ok &= ~nonempty | ok_len
    return np.where(nonempty, payload_start, end), np.where(nonempty & ok, length, 0), ok


def bytes_list_values(buf: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Values of canonical BytesList messages (a run of field-1 values), walked in lockstep.

    Returns (owner, value start, value length, owners not canonical), owners ascending.
    """
    owners, starts, lengths, bad = [], [], [], []
    active = np.flatnonzero(start < end)
    pos, stop = start[active], end[active]
    steps = 0
    while active.size:
        steps += 1
        length, value_start, ok_len = read_lengths(buf, pos + 1)
        value_end = value_start + length
        ok = both_ok((take(buf, pos) == 0x0A) & (value_end <= stop), ok_len)
        if not ok.all():
            bad.append(active[~ok])
            active, value_start, length, value_end, stop = active[ok], value_start[ok], length[ok], value_end[ok], stop[ok]
        owners.append(active)
        starts.append(value_start)
        lengths.append(length)
        more = value_end < stop
        active, pos, stop = active[more], value_end[more], stop[more]
    if not owners:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    owner, value_start, value_len = np.concatenate(owners), np.concatenate(starts), np.concatenate(lengths)
    bad_owners = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)
    if steps > 1:
        order = np.argsort(owner, kind="stable")
        owner, value_start, value_len = owner[order], value_start[order], value_len[order]
    return owner, value_start, value_len, bad_owners
