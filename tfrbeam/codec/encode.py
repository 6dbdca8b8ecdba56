"""Columnar fast path: encode Arrow record batches into tf.train.Example bytes with numpy passes.

Every row's Example is laid out as one fixed-width padded block: each tag, length and varint of
each feature gets a slot as wide as its widest value in the batch, filled column-wise with numpy
(constants from a template row; a feature's whole header, whose lengths all follow from its
payload length, from one lookup table). Row lengths and offsets are computed arithmetically.
The slots form stretches whose real bytes are contiguous; each stretch goes to its place in the
output with one whole-row copy per row, dragging junk padding onto bytes written after it.
Values too uneven in size to pad cheaply (a few very long strings or lists) stay ragged and are
copied segment by segment. No Python loop runs over rows (except one per value of 4 KiB or
more). The bytes equal protobuf's deterministic serialization, keys in UTF-8 order (docs/format.md, "Deterministic bytes").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import overload

import numpy as np
import pyarrow as pa

from tfrbeam.base.byte_views import windows
from tfrbeam.codec.example import encode_varint
from tfrbeam.codec.kinds import BYTES, FLOAT, INT64, WIRE_TAGS, is_list, scalar_kind
from tfrbeam.errors import ArrowConversionError

__all__ = ["EncodedExamples", "encode_record_batch", "record_batch_to_examples"]
# Also used by tfrbeam.codec.sequence_encode (not part of the package's API): Spans, concatenate_parts,
# encode_feature_list_steps, varint_sizes.

# Rows encoded together: bounds the numpy temporaries; larger chunks pay less Python overhead.
_ROWS_PER_CHUNK = 65536
# Rows of the padded block built and placed in one pass: small enough to stay in cache
# between being written and being copied out (wide rows take fewer rows per pass).
_PADDED_BYTES_PER_PASS = 4 << 20
# ... but at least this many rows, so that tables with many columns pay the per-slot Python
# overhead only a few times per chunk.
_MIN_ROWS_PER_PASS = 4096
_MAX_PASS_BYTES = 64 << 20
# Ragged segments at least this long are copied one slice each; shorter ones by byte index in
# groups of at most this many bytes. A slice costs about a microsecond of Python, the byte index
# a few nanoseconds per byte: 256 B is where they meet (a SequenceExample's feature lists are
# segments of a few hundred bytes to kilobytes; at 4096 B they took twice as long).
_LONG_SEGMENT = 256
_SEGMENT_BYTES_PER_GROUP = 1 << 20
# A value wider than this is never padded (copied byte by byte instead).
_MAX_PADDED_WIDTH = 1 << 16
# A ragged value is padded when padding at most this factor over its real bytes (plus slack).
_PAD_WASTE_FACTOR = 4
_PAD_SLACK_PER_ROW = 64

_INT64_MAX = (1 << 63) - 1
_VARINT_THRESHOLDS = [np.uint64(1 << (7 * k)) for k in range(1, 10)]
# Distinct values up to which varints and feature headers come from a lookup table.
_LOOKUP_LIMIT = 4096
# Distinct lengths up to which rows that must be copied exactly are copied group by group.
_EXACT_LENGTH_GROUPS = 32

_BYTES_LIST_TAG = bytes((WIRE_TAGS[BYTES],))
_FLOAT_LIST_TAG = bytes((WIRE_TAGS[FLOAT],))
_INT64_LIST_TAG = bytes((WIRE_TAGS[INT64],))


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedExamples:
    """Serialized Examples of a batch: one contiguous buffer plus row offsets (n + 1 of them).

    Batch consumers (TFRecord framing, sinks, shuffles) use `data` and `offsets` directly;
    single records come out as `bytes` via indexing or `to_list()`.
    """

    data: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> bytes:
        count = len(self)
        position = index + count if index < 0 else index
        if not 0 <= position < count:
            raise IndexError(f"record index {index} out of range for {count} records")
        return self.data[self.offsets[position] : self.offsets[position + 1]].tobytes()

    def to_list(self) -> list[bytes]:
        """Every record as its own `bytes` object, in row order."""
        # Arrow creates the bytes objects in C++, a third faster than slicing in Python.
        buffers = [None, pa.py_buffer(self.offsets), pa.py_buffer(self.data)]
        return pa.Array.from_buffers(pa.large_binary(), len(self), buffers).to_pylist()


def record_batch_to_examples(batch: pa.RecordBatch | pa.Table) -> list[bytes]:
    """Serialized tf.train.Example of every row of `batch`, one `bytes` per row."""
    return encode_record_batch(batch).to_list()


def encode_record_batch(batch: pa.RecordBatch | pa.Table) -> EncodedExamples:
    """Encode every row of `batch` (column name = feature name) as a tf.train.Example."""
    columns = _prepare_columns(batch)
    num_rows = batch.num_rows
    datas: list[np.ndarray] = []
    offsets: list[np.ndarray] = [np.zeros(1, np.int64)]
    written = 0
    for start in range(0, num_rows, _ROWS_PER_CHUNK):
        length = min(_ROWS_PER_CHUNK, num_rows - start)
        sliced = [dataclasses.replace(column, array=column.array.slice(start, length)) for column in columns]
        data, chunk_offsets = _encode_rows(sliced, length, start)
        datas.append(data)
        offsets.append(chunk_offsets[1:] + written)
        written += len(data)
    if len(datas) == 1:
        data = datas[0]
    else:
        data = np.concatenate(datas) if datas else np.zeros(0, np.uint8)
    return EncodedExamples(data=data, offsets=np.concatenate(offsets))


# ---------------------------------------------------------------------------------------------
# Schema: which Arrow types map to which feature kind, and the errors for those that do not.


@dataclasses.dataclass(frozen=True)
class _Column:
    """One column to encode: its feature name, key bytes, value kind and (single-chunk) array."""

    name: str
    key_prefix: bytes  # entry key field (tag, length, UTF-8 name) followed by the value tag
    kind: str  # "int64", "float" or "bytes"
    is_list: bool
    array: pa.Array


def _prepare_columns(batch: pa.RecordBatch | pa.Table) -> list[_Column]:
    names = batch.schema.names
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ArrowConversionError(
            f"column names {duplicates} appear more than once; each column becomes one Example "
            "feature, so names must be unique (rename the columns)"
        )
    columns = [_column(name, batch.column(index)) for index, name in enumerate(names)]
    columns.sort(key=lambda column: column.name.encode("utf-8"))
    return columns


def _column(name: str, array: pa.Array | pa.ChunkedArray) -> _Column:
    kind, is_list = feature_kind(name, array.type)
    encoded_name = name.encode("utf-8")
    key_prefix = b"\x0a" + encode_varint(len(encoded_name)) + encoded_name + b"\x12"
    return _Column(name, key_prefix, kind, is_list, _single_array(array))


def _single_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.Array):
        return column
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    chunks = column.chunks
    if pa.types.is_dictionary(column.type):
        chunks = [chunk.dictionary_decode() for chunk in chunks]
    return pa.concat_arrays(chunks)


def feature_kind(name: str, arrow_type: pa.DataType) -> tuple[str, bool]:
    """The Example kind of column ``name`` and whether it is a list; ArrowConversionError when unmappable."""
    kind = scalar_kind(arrow_type)
    if kind is not None:
        return kind, False
    if is_list(arrow_type):
        kind = scalar_kind(arrow_type.value_type)
        if kind is not None:
            return kind, True
        raise ArrowConversionError(
            f"column {name!r} has Arrow type {arrow_type}, whose list items have no Example "
            f"feature mapping: {_suggested_fix(arrow_type.value_type, inside_list=True)}"
        )
    raise ArrowConversionError(
        f"column {name!r} has Arrow type {arrow_type}, which has no Example feature mapping: "
        f"{_suggested_fix(arrow_type, inside_list=False)}"
    )


def _suggested_fix(arrow_type: pa.DataType, inside_list: bool) -> str:
    """How to turn a column of `arrow_type` into one that maps onto an Example feature."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        return _suggested_fix(arrow_type.value_type, inside_list)
    if types.is_date32(arrow_type) or types.is_time32(arrow_type):
        return "cast with pc.cast(col, pa.int32()) for epoch values, or to pa.string()"
    if types.is_temporal(arrow_type) and not types.is_interval(arrow_type):
        return "cast with pc.cast(col, pa.int64()) for epoch values, or to pa.string()"
    if types.is_decimal(arrow_type):
        return "cast with pc.cast(col, pa.float64()) (rounds) or pc.cast(col, pa.string()) (exact)"
    if types.is_null(arrow_type):
        return "every value is null and the type says nothing; cast to the intended type, e.g. pc.cast(col, pa.int64())"
    if types.is_struct(arrow_type):
        return "flatten it into one column per field with table.flatten()"
    if types.is_map(arrow_type):
        return "split it into two list columns with pc.map_keys(col) and pc.map_values(col)"
    if is_list(arrow_type):
        return "Example lists are flat; flatten one level with pc.list_flatten(col) or serialize the inner lists to bytes"
    where = "list items" if inside_list else "values"
    return f"convert the {where} to integers, floats or strings first (e.g. pc.cast(col, pa.string()))"


# ---------------------------------------------------------------------------------------------
# Pieces: each row's bytes are the concatenation of pieces; a slot is padded, a ragged is not.


Rows = np.ndarray | None  # (n,) bool: the rows a piece is written in; None = every row


@dataclasses.dataclass(frozen=True, eq=False)
class _PerRow:
    """Per-row content of a slot: row i holds table[index[i]], or table[i] when index is None.

    A small `table` with an `index` is a lookup table (a varint per distinct value, a header
    per distinct length); a sliding-window view of a data buffer with start offsets is a gather.
    """

    table: np.ndarray  # (k, width) uint8 or bool, last axis contiguous
    index: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Slot:
    """A run of `width` bytes reserved in every row's padded block.

    The bytes come from `const` (the same in every row), `content` or `writer` (fills rows
    first..last into a (rows, width) view). `valid` marks the real bytes, always a prefix of the
    slot (None: all of them); `rows` limits the rows the slot is written in.
    """

    width: int
    rows: Rows = None
    const: bytes | None = None
    content: _PerRow | None = None
    writer: Callable[[np.ndarray, int, int], None] | None = None
    valid: _PerRow | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Ragged:
    """Row i's bytes are data[starts[i] : starts[i] + lengths[i]] (lengths 0 for absent rows)."""

    data: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


_Piece = _Slot | _Ragged
_EMPTY = _Slot(width=0)


@overload
def _masked(lengths: np.ndarray, rows: Rows) -> np.ndarray: ...
@overload
def _masked(lengths: int, rows: Rows) -> np.ndarray | int: ...
def _masked(lengths: np.ndarray | int, rows: Rows) -> np.ndarray | int:
    """Per-row lengths with absent rows counted as 0."""
    return lengths if rows is None else rows * lengths


def _const(value: bytes, rows: Rows = None) -> _Slot:
    return _Slot(width=len(value), rows=rows, const=value)


def _fixed(block: np.ndarray, rows: Rows = None) -> _Slot:
    """Bytes of equal width in every row: block (n, width) uint8."""
    return _Slot(width=block.shape[1], rows=rows, content=_PerRow(block))


def _varint_lengths(values: np.ndarray, largest: int) -> np.ndarray:
    """Bytes of the varint of each uint64 value, as uint8 (1..10); `largest` bounds the work."""
    lengths = np.ones(len(values), np.uint8)
    for threshold in _VARINT_THRESHOLDS:
        if int(threshold) > largest:
            break
        lengths += values >= threshold
    return lengths


def _continuation_bits(lengths: range, first_byte: int) -> np.ndarray:
    """Per varint length, the 0x80 bits of bytes first_byte..first_byte + 7 as one uint64."""
    return np.array(
        [sum(0x80 << 8 * (byte - first_byte) for byte in range(first_byte, min(length - 1, first_byte + 8)))
         for length in lengths],
        np.uint64,
    )


_CONTINUATION_LOW = _continuation_bits(range(11), 0)
_CONTINUATION_HIGH = _continuation_bits(range(11), 8)
_U64 = np.uint64


def _write_varints(values: np.ndarray, lengths: np.ndarray, destination: np.ndarray, first: int, last: int) -> None:
    """Varint bytes of uint64 values first..last into destination (rows, width <= 10).

    The 7-bit groups of the low 56 bits are spread into 8 bytes with three shift-and-mask
    steps on whole uint64s, then the continuation bits of each length are OR-ed in; bytes
    past a value's length are junk that no stretch copies.
    """
    values = values[first:last]
    lengths = lengths[first:last]
    spread = values & _U64(0x00FFFFFFFFFFFFFF)
    spread = (spread & _U64(0x000000000FFFFFFF)) | ((spread & _U64(0x00FFFFFFF0000000)) << _U64(4))
    spread = (spread & _U64(0x00003FFF00003FFF)) | ((spread & _U64(0x0FFFC0000FFFC000)) << _U64(2))
    spread = (spread & _U64(0x007F007F007F007F)) | ((spread & _U64(0x3F803F803F803F80)) << _U64(1))
    spread |= _CONTINUATION_LOW[lengths]
    words = np.empty((len(values), 2), np.uint64)
    words[:, 0] = spread
    width = destination.shape[1]
    if width > 8:  # bytes 8 and 9: bits 56..62, then bit 63
        top = values >> _U64(56)
        words[:, 1] = (top & _U64(0x7F)) | ((top >> _U64(7)) << _U64(8)) | _CONTINUATION_HIGH[lengths]
    rows = words.view(np.uint8)[:, :width]
    destination.view(f"V{width}")[:, 0] = rows.view(f"V{width}")[:, 0]


def _prefix_valid(width: int, lengths: np.ndarray) -> np.ndarray:
    """(len(lengths), width) bool: the first lengths[i] bytes of row i."""
    return np.arange(width) < lengths[:, None]


_VALID_BY_LENGTH = _prefix_valid(10, np.arange(11))


@dataclasses.dataclass(frozen=True, eq=False)
class _Keyed:
    """Rows keyed into a lookup table: row i is entry index[i], whose length is lengths[...]."""

    index: np.ndarray  # (n,) intp
    lengths: np.ndarray  # (k,) int64


def _varint_lookup(values: np.ndarray) -> tuple[_Slot, _Keyed] | None:
    """Varints of int64 (or uint64) values from a table of their distinct range, when small."""
    signed = values.view(np.int64)
    smallest, largest = int(signed.min()), int(signed.max())
    if largest - smallest >= min(_LOOKUP_LIMIT, len(values)):
        return None
    table_values = np.arange(smallest, largest + 1, dtype=np.int64).view(np.uint64)
    lengths = _varint_lengths(table_values, int(table_values.max()))
    width = int(lengths.max())
    table = np.empty((len(table_values), width), np.uint8)
    _write_varints(table_values, lengths, table, 0, len(table_values))
    index = (signed - smallest).astype(np.intp)
    valid = None if lengths.min() == width else _PerRow(_prefix_valid(width, lengths), index)
    return _Slot(width=width, content=_PerRow(table, index), valid=valid), _Keyed(index, lengths.astype(np.int64))


def _varint(values: np.ndarray, rows: Rows = None) -> _Slot:
    """Varints of int64 or uint64 `values` (n,), one per row (int64 bits, negatives as 10 bytes)."""
    if len(values) == 0:
        return _EMPTY
    signed = values.view(np.int64)
    smallest, largest = int(signed.min()), int(signed.max())
    if smallest == largest:
        return _const(encode_varint(smallest), rows)
    if smallest >= 0 and largest < 0x80:
        return _fixed(values.astype(np.uint8)[:, None], rows)
    looked_up = _varint_lookup(values)
    if looked_up is not None:
        return dataclasses.replace(looked_up[0], rows=rows)
    unsigned = values.view(np.uint64)
    lengths = _varint_lengths(unsigned, int(unsigned.max()))
    width = int(lengths.max())
    return _Slot(
        width=width,
        rows=rows,
        writer=functools.partial(_write_varints, unsigned, lengths),
        valid=_PerRow(_VALID_BY_LENGTH[:, :width], lengths),
    )


def _length_of_varint(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each non-negative int64 value."""
    return _varint_lengths(values.view(np.uint64), int(values.max(initial=0))).astype(np.int64)


def _ragged(
    data: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    rows: Rows,
    keyed_valid: Callable[[int], _PerRow | None] | None = None,
) -> _Piece:
    """Variable-length bytes per row; padded into a slot unless that would waste too much.

    `keyed_valid(width)` may give the padded slot's validity keyed like the feature header.
    """
    lengths = _masked(lengths, rows)
    count = len(lengths)
    width = int(lengths.max()) if count else 0
    if width == 0:
        return _EMPTY
    padded = count * width
    real = int(lengths.sum())
    if padded > _PAD_WASTE_FACTOR * real + _PAD_SLACK_PER_ROW * count or width > _MAX_PADDED_WIDTH:
        return _Ragged(data=data, starts=starts, lengths=lengths)
    valid = None if keyed_valid is None else keyed_valid(width)
    if valid is None and real != padded:
        valid = _PerRow(_prefix_valid(width, lengths))
    return _Slot(width=width, rows=rows, content=_padded_rows(data, starts, lengths, width), valid=valid)


def _padded_rows(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> _PerRow:
    """Rows data[starts[i] : starts[i] + width] (junk past lengths[i]) as a gather or a view."""
    count = len(starts)
    first = int(starts[0])
    if first + count * width <= len(data) and bool((lengths == width).all()):
        if count == 1 or bool((np.diff(starts) == width).all()):
            return _PerRow(data[first : first + count * width].reshape(count, width))
    # Copy the span the rows use, plus room so that every row's window fits.
    present = lengths > 0
    low = int(starts[present].min())
    high = int((starts + lengths)[present].max())
    span = np.zeros(high - low + width, np.uint8)
    span[: high - low] = data[low:high]
    row_windows = np.lib.stride_tricks.sliding_window_view(span, width)
    return _PerRow(row_windows, np.where(present, starts - low, 0))


def _assemble(count: int, pieces: Sequence[_Piece], offsets: np.ndarray) -> np.ndarray:
    """Concatenate, for each of `count` rows in order, its bytes of every piece in order.

    Slots are laid out side by side in a padded block (constants from a template row, the rest
    copied in column-wise). The slots then form stretches whose real bytes are contiguous (a
    run of always-full slots ended by one of varying length), and each stretch is copied to
    its place in the output with one whole-row copy per row. The junk padding it drags along
    lands on bytes placed later: the rest of its row, or the next row's first stretch, which
    holds only full slots (no junk) and is placed last. Rows without that much room are copied
    at their exact lengths. `offsets` (count + 1) are the row boundaries computed from the
    lengths; the pieces must add up to them.
    """
    total = int(offsets[-1])
    slots = [piece for piece in pieces if isinstance(piece, _Slot) and piece.width]
    stretches = _stretches(pieces)
    lengths = [np.broadcast_to(stretch.lengths, (count,)) for stretch in stretches]
    if sum(int(length.sum()) for length in lengths) != total:
        raise AssertionError(f"columnar encoder pieces add up to the wrong size, expected {total} bytes")
    slack = max(stretch.stop - stretch.start for stretch in stretches)  # the last row's junk lands here
    out = _record_bytes(total + slack)
    if count == 0 or total == 0:
        return out[:total]
    starts = list(itertools.accumulate(lengths[:-1], initial=offsets[:-1]))
    first_length = int(lengths[0][0])
    room = [offsets[1:] - start - length + first_length for start, length in zip(starts, lengths)]
    for spare in room:
        spare[-1] += slack - first_length
    width = sum(slot.width for slot in slots)
    step = max(1, _PADDED_BYTES_PER_PASS // max(width, 1), min(_MIN_ROWS_PER_PASS, _MAX_PASS_BYTES // max(width, 1)))
    order = [*range(1, len(stretches)), 0]
    for first in range(0, count, step):
        last = min(count, first + step)
        part = slice(first, last)
        padded = _padded_block(slots, width, first, last)
        for index in order:
            stretch, start, length = stretches[index], starts[index][part], lengths[index][part]
            if stretch.ragged is not None:
                _copy_segments(out, start, stretch.ragged.data, stretch.ragged.starts[part], length)
            elif stretch.stop > stretch.start:
                _place(out, start, padded[:, stretch.start : stretch.stop], length, room[index][part])
    return out[:total]


def _record_bytes(size: int) -> np.ndarray:
    """An uninitialised byte array from malloc through Arrow's system pool, not numpy's allocator or Arrow's default pool.

    A build frees and allocates hundreds of MB of batches and records, and pages it keeps in its
    heap need no new page faults. pyarrow's default pool (mimalloc) returns freed pages to the
    system within milliseconds, and numpy marks large arrays for huge pages, whose faults may
    first compact memory. Against them the 1M-row SequenceExample build took ~0.87x the wall clock;
    Example builds ran about as fast, with lower 5M-row peaks.
    """
    return np.frombuffer(pa.allocate_buffer(size, memory_pool=pa.system_memory_pool()), np.uint8)


@dataclasses.dataclass
class _Stretch:
    """A part of every row whose real bytes are contiguous: padded block columns start..stop
    (real bytes: the first `lengths` of them), or a ragged piece."""

    start: int = 0
    stop: int = 0
    lengths: np.ndarray | int = 0
    rows: Rows = None
    closed: bool = False
    ragged: _Ragged | None = None


def _stretches(pieces: Sequence[_Piece]) -> list[_Stretch]:
    """Group pieces into stretches: full slots, then at most one slot of varying length.

    A stretch may go on from slots present in every row to slots limited to some rows (an
    absent row then ends after the first part), but not back. The first stretch takes only
    slots full in every row (possibly none), so it has one length everywhere and no junk.
    """
    stretches: list[_Stretch] = [_Stretch()]
    column = 0
    for piece in pieces:
        if isinstance(piece, _Ragged):
            stretches.append(_Stretch(start=column, stop=column, lengths=piece.lengths, closed=True, ragged=piece))
            continue
        if not piece.width:
            continue
        current = stretches[-1]
        if len(stretches) == 1:
            joins = piece.valid is None and piece.rows is None
        else:
            joins = not current.closed and (current.rows is None or piece.rows is current.rows)
        if not joins:
            current = _Stretch(start=column, stop=column)
            stretches.append(current)
        current.rows = piece.rows if piece.rows is not None else current.rows
        current.stop += piece.width
        current.lengths = current.lengths + _slot_lengths(piece)
        current.closed = piece.valid is not None
        column += piece.width
    return stretches


def _slot_lengths(slot: _Slot) -> np.ndarray | int:
    """Real bytes of the slot in each row (0 in absent rows)."""
    if slot.valid is None:
        return _masked(slot.width, slot.rows)
    per_entry = slot.valid.table.sum(axis=1, dtype=np.int64)
    return _masked(per_entry if slot.valid.index is None else per_entry[slot.valid.index], slot.rows)


def _padded_block(slots: list[_Slot], width: int, first: int, last: int) -> np.ndarray:
    """Rows first..last of all slots side by side, junk where a slot's bytes are not real."""
    template = np.zeros(width, np.uint8)
    position = 0
    for slot in slots:
        if slot.const is not None:
            template[position : position + slot.width] = np.frombuffer(slot.const, np.uint8)
        position += slot.width
    padded = _scratch("padded", (last - first, width), np.uint8)
    padded[...] = template
    bounds = list(itertools.pairwise(itertools.accumulate((slot.width for slot in slots), initial=0)))
    for content, start, stop in _merged_by_index([(slot.content, a, b) for slot, (a, b) in zip(slots, bounds)]):
        _write_rows(padded[:, start:stop], content, first, last)
    for slot, (start, stop) in zip(slots, bounds):
        if slot.writer is not None:
            slot.writer(padded[:, start:stop], first, last)
    return padded


def _place(out: np.ndarray, starts: np.ndarray, source: np.ndarray, lengths: np.ndarray, room: np.ndarray) -> None:
    """Copy row i's first lengths[i] bytes of source (rows, width) to out[starts[i]:].

    Rows whose junk (width - lengths[i]) fits in the `room` after them that is placed later
    are copied whole; the others at their exact lengths, grouped by length.
    """
    width = source.shape[1]
    rows = source.view(f"V{width}")[:, 0]
    whole = width - lengths <= room
    if whole.all():
        windows(out, width)[starts] = rows
        return
    picked = np.flatnonzero(whole)
    if len(picked):
        windows(out, width)[starts[picked]] = rows[picked]
    exact = np.flatnonzero(~whole & (lengths > 0))
    sizes = lengths[exact]
    distinct = np.flatnonzero(np.bincount(sizes))
    if len(distinct) > _EXACT_LENGTH_GROUPS:
        flat = np.ascontiguousarray(source).reshape(-1)
        _copy_segments(out, starts[exact], flat, exact * width, sizes)
        return
    for size in distinct.tolist():
        group = exact[sizes == size]
        windows(out, size)[starts[group]] = source[:, :size].view(f"V{size}")[group, 0]


def _copy_segments(out: np.ndarray, destinations: np.ndarray, data: np.ndarray, sources: np.ndarray, lengths: np.ndarray) -> None:
    """out[destinations[i]:][:lengths[i]] = data[sources[i]:][:lengths[i]].

    Long segments are copied one slice each; short ones by byte index (16 bytes of index per
    byte), in groups of at most _SEGMENT_BYTES_PER_GROUP bytes to bound that memory.
    """
    long = lengths >= _LONG_SEGMENT
    if long.any():
        for destination, source, length in zip(*(part[long].tolist() for part in (destinations, sources, lengths))):
            out[destination : destination + length] = data[source : source + length]
        destinations, sources, lengths = destinations[~long], sources[~long], lengths[~long]
    ends = np.cumsum(lengths)
    first = 0
    while first < len(lengths):
        base = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + _SEGMENT_BYTES_PER_GROUP, side="right")))
        group = slice(first, last)
        total = int(ends[last - 1]) - base
        within = np.arange(total, dtype=np.int64) - np.repeat(ends[group] - lengths[group] - base, lengths[group])
        out[np.repeat(destinations[group], lengths[group]) + within] = data[np.repeat(sources[group], lengths[group]) + within]
        first = last


_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, int], dtype: type) -> np.ndarray:
    """A reusable per-thread work array: fresh large arrays would pay page faults every pass."""
    size = shape[0] * shape[1] * np.dtype(dtype).itemsize
    buffer = getattr(_SCRATCH, name, None)
    if buffer is None or len(buffer) < size:
        buffer = np.empty(size, np.uint8)
        setattr(_SCRATCH, name, buffer)
    return buffer[:size].view(dtype).reshape(shape)


def _write_rows(destination: np.ndarray, content: _PerRow, first: int, last: int) -> None:
    """Copy content rows first..last into destination (rows, width), a whole row per element."""
    width = destination.shape[1]
    table = content.table.view(np.uint8) if content.table.dtype == bool else content.table
    if table.strides[-1] != 1:  # a transposed block: no whole-row view, copy element-wise
        destination[...] = table[first:last] if content.index is None else table[content.index[first:last]]
        return
    target = destination.view(f"V{width}")[:, 0]
    if content.index is None:
        # Rows as single opaque width-byte elements: one copy per row instead of one per byte.
        target[...] = table[first:last].view(f"V{width}")[:, 0]
    elif table.flags.c_contiguous:
        # np.take copies whole rows (one memmove each), far faster than fancy indexing.
        target[...] = np.take(table, content.index[first:last], axis=0).view(f"V{width}")[:, 0]
    else:  # overlapping windows of a buffer: np.take would copy them all first
        target[...] = table.view(f"V{width}")[content.index[first:last], 0]


def _merged_by_index(entries: list[tuple[_PerRow | None, int, int]]) -> list[tuple[_PerRow, int, int]]:
    """Drop empty entries; neighbours keyed by the same index merge into one wider table."""
    merged: list[tuple[_PerRow, int, int]] = []
    for content, start, stop in entries:
        if content is None:
            continue
        if merged and content.index is not None and merged[-1][0].index is content.index and merged[-1][2] == start:
            previous = merged[-1][0]
            table = np.concatenate([previous.table, content.table], axis=1)
            merged[-1] = (_PerRow(table, content.index), merged[-1][1], stop)
        else:
            merged.append((content, start, stop))
    return merged


# ---------------------------------------------------------------------------------------------
# Columns: the pieces of each feature entry, computed column-wise.


def _encode_rows(columns: list[_Column], count: int, row_base: int) -> tuple[np.ndarray, np.ndarray]:
    """Example bytes of `count` rows and their offsets (count + 1)."""
    pieces: list[_Piece] = []
    features_length = np.zeros(count, np.int64)
    for column in columns:
        column_pieces, entry_lengths = _feature_entry(column, row_base)
        pieces.extend(column_pieces)
        features_length += entry_lengths
    header: list[_Piece] = [_const(b"\x0a"), _varint(features_length)]
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(1 + _length_of_varint(features_length) + features_length, out=offsets[1:])
    return _assemble(count, header + pieces, offsets), offsets


# How a feature's list message starts, before its payload (the values proper):
_PACKED = "packed"  # int64/float lists: 0a, payload length, payload; nothing when empty
_BYTES_VALUE = "bytes_value"  # a single bytes value: 0a, its length, its bytes (even when empty)
_ITEMS = "items"  # a bytes list: the payload is the encoded items themselves


@dataclasses.dataclass(frozen=True, eq=False)
class _Payload:
    """A feature's values as written, minus the list message's own tag, length and prefix.

    `lengths` is the payload byte count per row (an int when constant; anything for absent
    rows), or `keyed` gives it through a lookup index shared with the payload's own table.
    `build(valid)` makes the pieces; `valid(width)` may supply a padded payload's validity
    keyed like the header (None when the header has no table).
    """

    kind_tag: bytes
    framing: str
    lengths: np.ndarray | int | None
    build: Callable[[Callable[[int], _PerRow | None]], list[_Piece]]
    keyed: _Keyed | None = None


def _feature_entry(column: _Column, row_base: int) -> tuple[list[_Piece], np.ndarray | int]:
    """Pieces of one Features map entry per row, and each row's entry length (0 if omitted)."""
    array = _decoded(column.array)
    rows = _present_rows(array)
    payload = _payload(column, array, rows, row_base)
    header_slots, entry_lengths, payload_valid = _entry_header(column.key_prefix, payload, rows)
    return [*header_slots, *payload.build(payload_valid)], entry_lengths


def _payload(column: _Column, array: pa.Array, rows: Rows, row_base: int) -> _Payload:
    if column.is_list:
        return _list_payload(column, array, rows, row_base)
    if column.kind == "int64":
        return _int64_payload(column, array, rows, row_base)
    if column.kind == "float":
        return _float_payload(array, rows)
    return _bytes_payload(array, rows)


# A FeatureList step of no values (0a 02, then the empty list of the kind): a null row's step.
_EMPTY_STEP = {kind: bytes((0x0A, 0x02, tag, 0x00)) for kind, tag in WIRE_TAGS.items()}


def encode_feature_list_steps(name: str, array: pa.Array | pa.ChunkedArray, row_base: int = 0) -> EncodedExamples:
    """Each row of column `name` as one FeatureList step (0a, length, Feature), for SequenceExamples.

    A null row is a step holding an empty list of the column's kind (a step cannot be absent).
    Consecutive rows' steps are adjacent, so a run of rows is one contiguous FeatureList body.
    `row_base` is the first row's number in error messages.
    """
    column = _column(name, array)
    count = len(column.array)
    decoded = _decoded(column.array)
    rows = _present_rows(decoded)
    payload = _payload(column, decoded, rows, row_base)
    header_slots, lengths, payload_valid = _entry_header(None, payload, rows)
    pieces = [*header_slots, *payload.build(payload_valid)]
    if rows is not None:
        absent = ~rows
        pieces.append(_const(_EMPTY_STEP[column.kind], absent))
        lengths = lengths + absent * len(_EMPTY_STEP[column.kind])
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(np.broadcast_to(lengths, (count,)), out=offsets[1:])
    return EncodedExamples(data=_assemble(count, pieces, offsets), offsets=offsets)


@dataclasses.dataclass(frozen=True, eq=False)
class Spans:
    """Bytes per record for concatenate_parts: record i's are data[starts[i] : starts[i] + lengths[i]]."""

    data: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


def concatenate_parts(count: int, parts: Sequence[bytes | np.ndarray | Spans]) -> EncodedExamples:
    """`count` records, each its parts side by side: bytes (the same in every record), an int64
    array (one non-negative varint per record) or Spans; assembled as the Example rows are."""
    pieces: list[_Piece] = []
    lengths = np.zeros(count, np.int64)
    for part in parts:
        if isinstance(part, bytes):
            pieces.append(_const(part))
            lengths += len(part)
        elif isinstance(part, Spans):
            pieces.append(_ragged(part.data, part.starts, part.lengths, None))
            lengths += part.lengths
        else:
            pieces.append(_varint(part))
            lengths += _length_of_varint(part)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return EncodedExamples(data=_assemble(count, pieces, offsets), offsets=offsets)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each non-negative int64 value (int64)."""
    return _length_of_varint(values)


def _no_valid(width: int) -> None:
    return None


def _entry_header(key_prefix: bytes | None, payload: _Payload, rows: Rows):
    """Slots of a map entry's bytes before the payload, each row's entry length, and how to key
    the payload's validity.

    Entry = 0a len(E) [key, 12 len(F) [kind len(L) [list prefix, payload]]], where each length
    covers what follows. All of them are functions of the payload length P, so when P takes
    few distinct values the header is one lookup table indexed by P (and so is the validity
    of a padded payload: its first P bytes); otherwise it is built from per-row varints.
    With no `key_prefix`, the entry is a FeatureList step instead: 0a len(F) [kind ...].
    """
    lengths = payload.lengths
    if isinstance(lengths, (int, np.integer)):
        fields, entry_length = _header_fields(key_prefix, payload.kind_tag, payload.framing, int(lengths))
        return [_const(b"".join(fields), rows)], _masked(entry_length, rows), _no_valid
    if payload.keyed is not None:
        index, key_lengths = payload.keyed.index, payload.keyed.lengths
        smallest, largest = int(key_lengths.min()), int(key_lengths.max())
    else:
        assert lengths is not None  # no keyed index: the lengths are given
        present = lengths if rows is None else lengths[rows]
        if len(present) == 0:
            return [], 0, _no_valid
        smallest, largest = int(present.min()), int(present.max())
        if smallest == largest:  # one length in every present row: a constant header
            fields, entry_length = _header_fields(key_prefix, payload.kind_tag, payload.framing, smallest)
            return [_const(b"".join(fields), rows)], _masked(entry_length, rows), _no_valid
        if largest - smallest >= min(_LOOKUP_LIMIT, len(lengths)):
            slots, entry_lengths = _header_varints(key_prefix, payload, rows)
            return slots, _masked(entry_lengths, rows), _no_valid
        index = lengths - smallest
        if rows is not None:
            index[~rows] = 0
        index = index.astype(np.intp, copy=False)
        key_lengths = np.arange(smallest, largest + 1)
    table, table_valid, table_entry_lengths = _header_table(key_prefix, payload.kind_tag, payload.framing, smallest, largest)
    if payload.keyed is not None:
        table, table_valid, table_entry_lengths = (
            part[key_lengths - smallest] for part in (table, table_valid, table_entry_lengths)
        )
    valid = None if table_valid.all() else _PerRow(table_valid, index)
    header = _Slot(width=table.shape[1], rows=rows, content=_PerRow(table, index), valid=valid)

    def payload_valid(width: int) -> _PerRow | None:
        return None if int(key_lengths.min()) >= width else _PerRow(_prefix_valid(width, key_lengths), index)

    return [header], _masked(table_entry_lengths[index], rows), payload_valid


def _header_fields(
    key_prefix: bytes | None, kind_tag: bytes, framing: str, payload_length: int
) -> tuple[tuple[bytes, ...], int]:
    """The header's fields for one payload length, and the whole entry's length.

    With no `key_prefix` the entry is a FeatureList step: 0a len(F) [Feature], no map key.
    """
    if framing == _ITEMS or (framing == _PACKED and payload_length == 0):
        list_prefix = b""
    else:
        list_prefix = b"\x0a" + encode_varint(payload_length)
    list_length = len(list_prefix) + payload_length
    feature_length = 1 + len(encode_varint(list_length)) + list_length
    if key_prefix is None:
        step_fields = (b"\x0a", encode_varint(feature_length), kind_tag, encode_varint(list_length), list_prefix)
        return step_fields, 1 + len(encode_varint(feature_length)) + feature_length
    entry_length = len(key_prefix) + len(encode_varint(feature_length)) + feature_length
    fields = (b"\x0a", encode_varint(entry_length), key_prefix, encode_varint(feature_length), kind_tag,
              encode_varint(list_length), list_prefix)  # fmt: skip
    return fields, 1 + len(encode_varint(entry_length)) + entry_length


@functools.lru_cache(maxsize=1024)
def _header_table(key_prefix: bytes | None, kind_tag: bytes, framing: str, smallest: int, largest: int):
    """Headers of payload lengths smallest..largest: bytes (k, width), validity, entry lengths.

    Each header's bytes come first in its row (the real bytes of a slot are always a prefix);
    the arrays are shared between calls (cached), so they are read-only.
    """
    headers = [_header_fields(key_prefix, kind_tag, framing, length) for length in range(smallest, largest + 1)]
    rows = [b"".join(fields) for fields, _ in headers]
    width = max(len(row) for row in rows)
    table = b"".join(row.ljust(width, b"\0") for row in rows)
    valid = b"".join(b"\1" * len(row) + b"\0" * (width - len(row)) for row in rows)
    entry_lengths = np.array([entry for _, entry in headers], np.int64)
    shape = (len(rows), width)
    return np.frombuffer(table, np.uint8).reshape(shape), np.frombuffer(valid, bool).reshape(shape), entry_lengths


def _header_varints(key_prefix: bytes | None, payload: _Payload, rows: Rows) -> tuple[list[_Slot], np.ndarray]:
    """Header slots built from per-row varints (payload lengths too varied for a table)."""
    lengths = payload.lengths
    assert isinstance(lengths, np.ndarray)  # per-row lengths: constant ones take the lookup table
    if payload.framing == _ITEMS:
        prefix: list[_Slot] = []
        list_length = lengths
    else:
        prefix_rows = rows
        prefix_length = 1 + _length_of_varint(lengths)
        if payload.framing == _PACKED:
            nonempty = lengths > 0
            prefix_length = prefix_length * nonempty
            if not _all_rows(nonempty, rows):
                prefix_rows = nonempty if rows is None else np.logical_and(nonempty, rows)
        prefix = [_const(b"\x0a", prefix_rows), _varint(lengths, prefix_rows)]
        list_length = prefix_length + lengths
    feature_length = 1 + _length_of_varint(list_length) + list_length
    kind_slots = [_const(payload.kind_tag, rows), _varint(list_length, rows), *prefix]
    if key_prefix is None:  # a FeatureList step
        return [_const(b"\x0a", rows), _varint(feature_length, rows), *kind_slots], (
            1 + _length_of_varint(feature_length) + feature_length)
    entry_length = len(key_prefix) + _length_of_varint(feature_length) + feature_length
    slots = [
        _const(b"\x0a", rows),
        _varint(entry_length, rows),
        _const(key_prefix, rows),
        _varint(feature_length, rows),
        *kind_slots,
    ]
    return slots, 1 + _length_of_varint(entry_length) + entry_length


def _all_rows(flags: np.ndarray, rows: Rows) -> bool:
    """Whether `flags` holds in every row present (every row when `rows` is None)."""
    return bool(flags.all()) if rows is None else bool(flags[rows].all())


def _present_rows(array: pa.Array) -> Rows:
    """(n,) bool of non-null rows, or None when no row is null."""
    if array.null_count == 0:
        return None
    return _bits(array.buffers()[0], array.offset, len(array))


def _bits(buffer: pa.Buffer, offset: int, count: int) -> np.ndarray:
    """Arrow's little-endian bitmap bits offset .. offset + count as a bool array."""
    first_byte = offset // 8
    last_byte = (offset + count + 7) // 8
    raw = np.frombuffer(buffer, np.uint8, count=last_byte - first_byte, offset=first_byte)
    skip = offset - 8 * first_byte
    return np.unpackbits(raw, bitorder="little")[skip : skip + count].view(bool)


def _decoded(array: pa.Array) -> pa.Array:
    """The array without dictionary encoding or view layout, as offsets + data buffers."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string_view(array.type):
        array = array.cast(pa.large_string())
    elif pa.types.is_binary_view(array.type):
        array = array.cast(pa.large_binary())
    return array


_NUMPY_DTYPES = {
    arrow_type: np.dtype(numpy_type)
    for arrow_type, numpy_type in [
        (pa.int8(), np.int8), (pa.int16(), np.int16), (pa.int32(), np.int32), (pa.int64(), np.int64),
        (pa.uint8(), np.uint8), (pa.uint16(), np.uint16), (pa.uint32(), np.uint32), (pa.uint64(), np.uint64),
        (pa.float16(), np.float16), (pa.float32(), np.float32), (pa.float64(), np.float64),
    ]
}  # fmt: skip


def _fixed_width_values(array: pa.Array) -> np.ndarray:
    """Values of an integer or floating array (slice-aware, zero-copy); null slots hold junk."""
    dtype = _NUMPY_DTYPES[array.type]
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _int64_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """Integer or bool values as int64 bits in a uint64 array (the varint input), and for
    uint64 arrays which values exceed int64's range (None for every other type)."""
    if pa.types.is_boolean(array.type):
        return _bits(array.buffers()[1], array.offset, len(array)).astype(np.uint64), None
    values = _fixed_width_values(array)
    if values.dtype == np.uint64:
        return values, values > _INT64_MAX
    return values.astype(np.int64, copy=False).view(np.uint64), None


def _out_of_range_error(column: _Column, row: int, value: int, position: int | None) -> ArrowConversionError:
    where = "" if position is None else f" at list position {position}"
    return ArrowConversionError(
        f"column {column.name!r}, row {row}: uint64 value {value}{where} exceeds int64's maximum "
        f"{_INT64_MAX}, and Example int64 features cannot hold it; cast the column to pa.float64() "
        "or pa.string() if such values are expected"
    )


def _float32_values(array: pa.Array) -> np.ndarray:
    # Finite float64 beyond float32's range becomes +-inf, as protobuf and TF do (docs/format.md).
    with np.errstate(over="ignore"):
        return _fixed_width_values(array).astype(np.float32, copy=False)


def _bytes_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, starts, lengths) of a string/binary array: value i is data[starts[i]:][:lengths[i]]."""
    count = len(array)
    buffers = array.buffers()
    if pa.types.is_fixed_size_binary(array.type):
        width = array.type.byte_width
        starts = (np.arange(count, dtype=np.int64) + array.offset) * width
        return _buffer_bytes(buffers[1]), starts, np.full(count, width, np.int64)
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offset_type = np.dtype(np.int64 if large else np.int32)
    offsets = np.frombuffer(buffers[1], offset_type, count=count + 1, offset=array.offset * offset_type.itemsize)
    offsets = offsets.astype(np.int64)
    return _buffer_bytes(buffers[2]), offsets[:-1], np.diff(offsets)


def _buffer_bytes(buffer: pa.Buffer | None) -> np.ndarray:
    return np.zeros(0, np.uint8) if buffer is None else np.frombuffer(buffer, np.uint8)


def _list_items(column: _Column, items: pa.Array, starts: np.ndarray, counts: np.ndarray, row_base: int):
    """Encoded items of an int64 or bytes list column (each a varint, or 0a len bytes) and the
    offsets of each item's encoding within them."""
    if column.kind == "int64":
        item_values, too_large = _int64_values(items)
        if too_large is not None and too_large.any():
            found = _first_flagged(too_large, starts, counts)
            if found is not None:
                row, position = found
                value = int(item_values[starts[row] + position])
                raise _out_of_range_error(column, row_base + row, value, position)
        item_pieces: list[_Piece] = [_varint(item_values)]
        item_lengths = _varint_lengths(item_values, int(item_values.max(initial=0)))
    else:
        data, item_starts, value_lengths = _bytes_values(items)
        item_pieces = [_const(b"\x0a"), _varint(value_lengths), _ragged(data, item_starts, value_lengths, None)]
        item_lengths = 1 + _length_of_varint(value_lengths) + value_lengths
    item_offsets = np.zeros(len(items) + 1, np.int64)
    np.cumsum(item_lengths, out=item_offsets[1:])
    return _assemble(len(items), item_pieces, item_offsets), item_offsets


def _first_flagged(flags: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[int, int] | None:
    """First row whose items starts[i] .. starts[i] + counts[i] hold a flagged one, and its position."""
    before = np.zeros(len(flags) + 1, np.int64)
    np.cumsum(flags, out=before[1:])
    per_row = before[starts + counts] - before[starts]
    if not per_row.any():
        return None
    row = int(np.argmax(per_row > 0))
    return row, int(np.argmax(flags[starts[row] : starts[row] + counts[row]]))


def _list_layout(array: pa.Array, rows: Rows) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Per row, the first item index and item count (0 for null rows) within the returned items."""
    count = len(array)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        starts = (np.arange(count, dtype=np.int64) + array.offset) * size
        counts = np.full(count, size, np.int64)
    elif pa.types.is_list_view(array.type) or pa.types.is_large_list_view(array.type):
        starts = array.offsets.to_numpy().astype(np.int64)
        counts = array.sizes.to_numpy().astype(np.int64)
    else:
        offsets = array.offsets.to_numpy().astype(np.int64)
        starts, counts = offsets[:-1], np.diff(offsets)
    items = array.values
    if rows is not None:
        counts = np.where(rows, counts, 0)
    present = counts > 0
    if not present.any():
        return np.zeros(count, np.int64), counts, items.slice(0, 0)
    low = int(starts[present].min())
    high = int((starts + counts)[present].max())
    return np.where(present, starts - low, 0), counts, items.slice(low, high - low)


def _int64_payload(column: _Column, array: pa.Array, rows: Rows, row_base: int) -> _Payload:
    values, too_large = _int64_values(array)
    if too_large is not None:
        if rows is not None:
            too_large &= rows
        if too_large.any():
            index = int(np.argmax(too_large))
            raise _out_of_range_error(column, row_base + index, int(values[index]), None)
    looked_up = _varint_lookup(values) if len(values) else None
    if looked_up is not None:
        # Values and headers share one index: the whole entry is one table lookup per row.
        slot, keyed = looked_up
        slot = dataclasses.replace(slot, rows=rows)
        return _Payload(_INT64_LIST_TAG, _PACKED, None, lambda valid: [_with_valid(slot, valid)], keyed)
    lengths = _varint_lengths(values, int(values.max(initial=0))).astype(np.int64)
    return _Payload(_INT64_LIST_TAG, _PACKED, lengths, lambda valid: [_with_valid(_varint(values, rows), valid)])


def _with_valid(slot: _Slot, valid: Callable[[int], _PerRow | None]) -> _Slot:
    """The slot with its validity taken from the feature header's lookup table, when it has one."""
    keyed = valid(slot.width) if slot.width else None
    return slot if keyed is None else dataclasses.replace(slot, valid=keyed)


def _float_payload(array: pa.Array, rows: Rows) -> _Payload:
    values = _float32_values(array).view(np.uint8).reshape(-1, 4)
    return _Payload(_FLOAT_LIST_TAG, _PACKED, 4, lambda valid: [_fixed(values, rows)])


def _bytes_payload(array: pa.Array, rows: Rows) -> _Payload:
    data, starts, lengths = _bytes_values(array)
    return _Payload(_BYTES_LIST_TAG, _BYTES_VALUE, lengths, lambda valid: [_ragged(data, starts, lengths, rows, valid)])


def _list_payload(column: _Column, array: pa.Array, rows: Rows, row_base: int) -> _Payload:
    """The payload of a list column: packed float32s or varints, or the encoded bytes items."""
    starts, counts, items = _list_layout(array, rows)
    items = _decoded(items)
    if items.null_count:
        present = _present_rows(items)
        assert present is not None  # items.null_count > 0
        found = _first_flagged(~present, starts, counts)
        if found is not None:
            raise ArrowConversionError(
                f"column {column.name!r}, row {row_base + found[0]}: the list holds a null at position "
                f"{found[1]}; Example lists cannot hold nulls, so fill them first (pc.fill_null) or drop the row"
            )
    if column.kind == "float":
        values = _float32_values(items).view(np.uint8)
        body_starts, byte_counts = 4 * starts, 4 * counts
    else:
        values, item_offsets = _list_items(column, items, starts, counts, row_base)
        body_starts = item_offsets[starts]
        byte_counts = item_offsets[starts + counts] - body_starts
    if column.kind == "float" and isinstance(array.type, pa.FixedSizeListType) and rows is None:
        byte_counts = 4 * array.type.list_size  # the same in every row: a constant header
    tag, framing = {"float": (_FLOAT_LIST_TAG, _PACKED), "int64": (_INT64_LIST_TAG, _PACKED)}.get(
        column.kind, (_BYTES_LIST_TAG, _ITEMS)
    )
    body_counts = np.broadcast_to(byte_counts, starts.shape)
    return _Payload(tag, framing, byte_counts, lambda valid: [_ragged(values, body_starts, body_counts, rows, valid)])
