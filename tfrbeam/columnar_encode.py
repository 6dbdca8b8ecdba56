"""Columnar fast path: encode Arrow record batches into tf.train.Example bytes with numpy passes.

Every row's Example is laid out as one fixed-width padded block: each tag, length and varint of
each feature gets a slot as wide as its widest value in the batch, filled column-wise with numpy,
and a boolean mask marks which bytes of each slot are real. One mask compaction then yields all
rows concatenated in row-major order, and the row offsets come from a cumulative sum of lengths
computed arithmetically. Values too uneven in size to pad cheaply (a few very long strings or
lists) are kept ragged and spliced in by one gather over segments. No Python loop runs over rows.
The bytes equal protobuf's deterministic serialization (see notes/WIRE.md).
"""

from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np
import pyarrow as pa

from tfrbeam.errors import ArrowConversionError
from tfrbeam.example import encode_varint

__all__ = ["EncodedExamples", "encode_record_batch", "record_batch_to_examples"]

# Rows encoded together; bounds the numpy temporaries and keeps them mostly in cache.
_ROWS_PER_CHUNK = 16384
# Upper bound on the padded block (bytes) compacted in one pass.
_PADDED_BYTES_PER_PASS = 8 << 20
# A ragged value is padded when padding at most this factor over its real bytes (plus slack).
_PAD_WASTE_FACTOR = 4
_PAD_SLACK_PER_ROW = 64

_INT64_MAX = (1 << 63) - 1
_VARINT_THRESHOLDS = [np.uint64(1 << (7 * k)) for k in range(1, 10)]
_SHIFTS = (np.arange(10, dtype=np.uint64) * np.uint64(7))[:, None]
_BYTE_INDEX = np.arange(10)[:, None]

_BYTES_LIST_TAG = b"\x0a"
_FLOAT_LIST_TAG = b"\x12"
_INT64_LIST_TAG = b"\x1a"


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
        raw = self.data.tobytes()
        bounds = self.offsets.tolist()
        return [raw[start:end] for start, end in zip(bounds, bounds[1:])]


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
    columns = []
    for index, name in enumerate(names):
        field = batch.schema.field(index)
        kind, is_list = _feature_kind(name, field.type)
        encoded_name = name.encode("utf-8")
        key_prefix = b"\x0a" + encode_varint(len(encoded_name)) + encoded_name + b"\x12"
        columns.append(_Column(name, key_prefix, kind, is_list, _single_array(batch.column(index))))
    columns.sort(key=lambda column: column.name.encode("utf-8"))
    return columns


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


def _scalar_kind(arrow_type: pa.DataType) -> str | None:
    if pa.types.is_dictionary(arrow_type):
        return _scalar_kind(arrow_type.value_type)
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return "int64"
    if pa.types.is_floating(arrow_type):
        return "float"
    if _is_bytes_type(arrow_type):
        return "bytes"
    return None


def _is_bytes_type(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_string_view(arrow_type)
        or pa.types.is_binary_view(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
    )


def _is_list_type(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
        or pa.types.is_list_view(arrow_type)
        or pa.types.is_large_list_view(arrow_type)
    )


def _feature_kind(name: str, arrow_type: pa.DataType) -> tuple[str, bool]:
    kind = _scalar_kind(arrow_type)
    if kind is not None:
        return kind, False
    if _is_list_type(arrow_type):
        kind = _scalar_kind(arrow_type.value_type)
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
    if _is_list_type(arrow_type):
        return "Example lists are flat; flatten one level with pc.list_flatten(col) or serialize the inner lists to bytes"
    where = "list items" if inside_list else "values"
    return f"convert the {where} to integers, floats or strings first (e.g. pc.cast(col, pa.string()))"


# ---------------------------------------------------------------------------------------------
# Pieces: each row's bytes are the concatenation of pieces; a slot is padded, a ragged is not.


Rows = Union[np.ndarray, None]  # (n,) bool: the rows a piece is written in; None = every row


@dataclasses.dataclass(frozen=True, eq=False)
class _Slot:
    """A run of `width` bytes reserved in every row's padded block.

    Either `const` (the same bytes in every row) or `block` (n, width) uint8 holds the bytes;
    `valid` (n, width) bool marks the real ones (None: all of them); `rows` limits the rows.
    `lengths` is the number of real bytes per row (0 outside `rows`), an int when constant.
    """

    width: int
    lengths: np.ndarray | int
    rows: Rows = None
    const: bytes | None = None
    block: np.ndarray | None = None
    valid: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Ragged:
    """Row i's bytes are data[starts[i] : starts[i] + lengths[i]] (lengths 0 for absent rows)."""

    data: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


_Piece = Union[_Slot, _Ragged]


def _row_lengths(rows: Rows, width: int) -> np.ndarray | int:
    return width if rows is None else rows * np.int64(width)


def _const(value: bytes, rows: Rows = None) -> _Slot:
    return _Slot(width=len(value), lengths=_row_lengths(rows, len(value)), rows=rows, const=value)


def _fixed(block: np.ndarray, rows: Rows = None) -> _Slot:
    """Bytes of equal width in every row: block (n, width) uint8."""
    return _Slot(width=block.shape[1], lengths=_row_lengths(rows, block.shape[1]), rows=rows, block=block)


def _varint_lengths(values: np.ndarray, largest: int) -> np.ndarray:
    """Bytes of the varint of each uint64 value, as uint8 (1..10); `largest` bounds the work."""
    lengths = np.ones(len(values), np.uint8)
    for threshold in _VARINT_THRESHOLDS:
        if int(threshold) > largest:
            break
        lengths += values >= threshold
    return lengths


def _varint(values: np.ndarray | int, rows: Rows = None, lengths: np.ndarray | None = None) -> _Slot:
    """Varints of non-negative int64 or uint64 `values` (n,), one per row."""
    if isinstance(values, (int, np.integer)):
        return _const(encode_varint(int(values)), rows)
    values = values.view(np.uint64) if values.dtype == np.int64 else values
    if len(values) == 0:
        return _Slot(width=0, lengths=0)
    smallest, largest = int(values.min()), int(values.max())
    if smallest == largest:  # int64 bits seen as uint64: wrap back for encode_varint
        return _const(encode_varint(largest - (1 << 64) if largest > _INT64_MAX else largest), rows)
    if largest < 0x80:
        return _fixed(values.astype(np.uint8)[:, None], rows)
    if lengths is None:
        lengths = _varint_lengths(values, largest)
    width = int(lengths.max())
    byte_index = _BYTE_INDEX[:width]
    # Computed transposed (width, n) so each pass runs over contiguous rows of n values. A byte
    # below the last one has its top bit forced to 1, so the low 7 bits need no separate mask.
    shifted = (values[None, :] >> _SHIFTS[:width]).astype(np.uint8)
    block = shifted | (byte_index < (lengths.astype(np.int64) - 1)).view(np.uint8) << 7
    valid = byte_index < lengths
    row_lengths = lengths.astype(np.int64) if rows is None else lengths * rows
    return _Slot(width=width, lengths=row_lengths, rows=rows, block=block.T, valid=valid.T)


def _ragged(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: Rows) -> _Piece:
    """Variable-length bytes per row; padded into a slot unless that would waste too much."""
    if rows is not None:
        lengths = lengths * rows
    count = len(lengths)
    width = int(lengths.max()) if count else 0
    if width == 0:
        return _Slot(width=0, lengths=0)
    padded = count * width
    real = int(lengths.sum())
    if padded > _PAD_WASTE_FACTOR * real + _PAD_SLACK_PER_ROW * count or padded > _PADDED_BYTES_PER_PASS * 8:
        return _Ragged(data=data, starts=starts, lengths=lengths)
    return _Slot(
        width=width,
        lengths=lengths,
        rows=rows,
        block=_padded_rows(data, starts, width),
        valid=None if real == padded else np.arange(width) < lengths[:, None],
    )


def _padded_rows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """(n, width) block of data[starts[i] : starts[i] + width], zero past the end of data."""
    count = len(starts)
    first = int(starts[0])
    if int(starts[-1]) == first + (count - 1) * width and first + count * width <= len(data):
        if count == 1 or bool((np.diff(starts) == width).all()):
            return data[first : first + count * width].reshape(count, width)
    last_full = len(data) - width  # windows starting after this would run past the end
    if last_full >= 0:
        windows = np.lib.stride_tricks.sliding_window_view(data, width)
        block = windows[np.minimum(starts, last_full)]
    else:
        block = np.empty((count, width), np.uint8)
    overrun = np.flatnonzero(starts > last_full)
    if len(overrun):
        base = max(last_full, 0)
        tail = np.zeros(2 * width + 1, np.uint8)
        tail[: len(data) - base] = data[base:]
        block[overrun] = np.lib.stride_tricks.sliding_window_view(tail, width)[starts[overrun] - base]
    return block


def _assemble(count: int, pieces: list[_Piece], expected_size: int) -> np.ndarray:
    """Concatenate, for each of `count` rows in order, its bytes of every piece in order.

    `expected_size` is the total computed from the lengths; a mismatch is a bug in this module.
    """
    slots = [piece for piece in pieces if isinstance(piece, _Slot) and piece.width]
    compact = _compact_slots(count, slots)
    if any(isinstance(piece, _Ragged) for piece in pieces):
        compact = _splice_ragged(count, pieces, compact)
    if len(compact) != expected_size:
        raise AssertionError(f"columnar encoder produced {len(compact)} bytes, expected {expected_size}")
    return compact


def _compact_slots(count: int, slots: list[_Slot]) -> np.ndarray:
    """Row-major concatenation of the real bytes of `slots`, via padded blocks and a mask."""
    width = sum(slot.width for slot in slots)
    if width == 0 or count == 0:
        return np.zeros(0, np.uint8)
    template = np.zeros(width, np.uint8)
    template_valid = np.zeros(width, bool)
    bounds = []
    position = 0
    for slot in slots:
        start, position = position, position + slot.width
        bounds.append((start, position))
        if slot.const is not None:
            template[start:position] = np.frombuffer(slot.const, np.uint8)
        template_valid[start:position] = slot.valid is None
    runs = _runs_of_rows(slots, bounds)
    step = max(1, _PADDED_BYTES_PER_PASS // width)
    parts = []
    for first in range(0, count, step):
        last = min(count, first + step)
        padded = np.empty((last - first, width), np.uint8)
        padded[...] = template
        valid = np.empty((last - first, width), bool)
        valid[...] = template_valid
        for slot, (start, stop) in zip(slots, bounds):
            if slot.block is not None:
                padded[:, start:stop] = slot.block[first:last]
            if slot.valid is not None:
                valid[:, start:stop] = slot.valid[first:last]
        for rows, start, stop in runs:
            absent = np.flatnonzero(~rows[first:last])
            if len(absent):
                valid[absent, start:stop] = False
        parts.append(padded[valid])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _runs_of_rows(slots: list[_Slot], bounds: list[tuple[int, int]]) -> list[tuple[np.ndarray, int, int]]:
    """Merge neighbouring slots limited to the same rows, so absent rows are masked once each."""
    runs: list[tuple[np.ndarray, int, int]] = []
    for slot, (start, stop) in zip(slots, bounds):
        if slot.rows is None:
            continue
        if runs and runs[-1][0] is slot.rows and runs[-1][2] == start:
            runs[-1] = (slot.rows, runs[-1][1], stop)
        else:
            runs.append((slot.rows, start, stop))
    return runs


def _splice_ragged(count: int, pieces: list[_Piece], compact: np.ndarray) -> np.ndarray:
    """Insert ragged pieces between the compacted slot bytes with one gather over segments."""
    # Per row the output is: slot run 0, ragged 0, slot run 1, ragged 1, ..., slot run R.
    run_lengths: list[np.ndarray] = [np.zeros(count, np.int64)]
    raggeds: list[_Ragged] = []
    for piece in pieces:
        if isinstance(piece, _Ragged):
            raggeds.append(piece)
            run_lengths.append(np.zeros(count, np.int64))
        elif piece.width:
            run_lengths[-1] = run_lengths[-1] + piece.lengths
    slot_row_lengths = np.sum(run_lengths, axis=0)
    slot_row_starts = np.cumsum(slot_row_lengths) - slot_row_lengths
    sources = [compact]
    segment_starts = np.empty((count, 2 * len(raggeds) + 1), np.int64)
    segment_lengths = np.empty_like(segment_starts)
    source_base = len(compact)
    run_start = slot_row_starts
    for index, run_length in enumerate(run_lengths):
        segment_starts[:, 2 * index] = run_start
        segment_lengths[:, 2 * index] = run_length
        run_start = run_start + run_length
        if index < len(raggeds):
            ragged = raggeds[index]
            present = ragged.lengths > 0
            low = int(ragged.starts[present].min()) if present.any() else 0
            high = int((ragged.starts + ragged.lengths)[present].max()) if present.any() else 0
            sources.append(ragged.data[low:high])
            segment_starts[:, 2 * index + 1] = np.where(present, ragged.starts - low, 0) + source_base
            segment_lengths[:, 2 * index + 1] = ragged.lengths
            source_base += high - low
    segment_starts = segment_starts.ravel()
    segment_lengths = segment_lengths.ravel()
    total = int(segment_lengths.sum())
    destinations = np.cumsum(segment_lengths) - segment_lengths
    gather = np.repeat(segment_starts - destinations, segment_lengths)
    gather += np.arange(total, dtype=np.int64)
    return np.concatenate(sources)[gather]


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
    header = [_const(b"\x0a"), _varint(features_length)]
    row_lengths = 1 + _varint_lengths(features_length.view(np.uint64), int(features_length.max(initial=0))) + features_length
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    return _assemble(count, header + pieces, int(offsets[-1])), offsets


def _feature_entry(column: _Column, row_base: int) -> tuple[list[_Piece], np.ndarray | int]:
    """Pieces of one Features map entry per row, and each row's entry length (0 if omitted)."""
    array = _decoded(column.array)
    rows = _present_rows(array)
    if column.is_list:
        kind_tag, body, body_length = _list_body(column, array, rows, row_base)
    elif column.kind == "int64":
        kind_tag, (body, body_length) = _INT64_LIST_TAG, _int64_scalar_body(column, array, rows, row_base)
    elif column.kind == "float":
        kind_tag, (body, body_length) = _FLOAT_LIST_TAG, _float_scalar_body(array, rows)
    else:
        kind_tag, (body, body_length) = _BYTES_LIST_TAG, _bytes_scalar_body(array, rows)
    # Entry = 0a len(E) [key, 12 len(F) [kind len(L) [body]]]: each length covers what follows.
    feature_length = 1 + _length_of_varint(body_length) + body_length
    entry_length = len(column.key_prefix) + _length_of_varint(feature_length) + feature_length
    pieces = [
        _const(b"\x0a", rows),
        _varint(entry_length, rows),
        _const(column.key_prefix, rows),
        _varint(feature_length, rows),
        _const(kind_tag, rows),
        _varint(body_length, rows),
        *body,
    ]
    total = 1 + _length_of_varint(entry_length) + entry_length
    if rows is not None:
        total = total * rows
    return pieces, total


def _length_of_varint(values: np.ndarray | int) -> np.ndarray | int:
    if isinstance(values, (int, np.integer)):
        return len(encode_varint(int(values)))
    return _varint_lengths(values.view(np.uint64), int(values.max(initial=0))).astype(np.int64)


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
    # Finite float64 beyond float32's range becomes +-inf, as protobuf and TF do (WIRE.md).
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


def _int64_scalar_body(column: _Column, array: pa.Array, rows: Rows, row_base: int):
    values, too_large = _int64_values(array)
    if too_large is not None:
        if rows is not None:
            too_large &= rows
        if too_large.any():
            index = int(np.argmax(too_large))
            raise _out_of_range_error(column, row_base + index, int(values[index]), None)
    lengths = _varint_lengths(values, int(values.max(initial=0)))
    # Int64List = 0a, byte count of the packed varints (one value: 1..10, one byte), the varint.
    body = [_const(b"\x0a", rows), _fixed(lengths[:, None], rows), _varint(values, rows, lengths)]
    return body, 2 + lengths.astype(np.int64)


def _float_scalar_body(array: pa.Array, rows: Rows):
    values = _float32_values(array)
    body = [_const(b"\x0a\x04", rows), _fixed(values.view(np.uint8).reshape(-1, 4), rows)]
    return body, 6


def _bytes_scalar_body(array: pa.Array, rows: Rows):
    data, starts, lengths = _bytes_values(array)
    body = [_const(b"\x0a", rows), _varint(lengths, rows), _ragged(data, starts, lengths, rows)]
    return body, 1 + _length_of_varint(lengths) + lengths


def _list_body(column: _Column, array: pa.Array, rows: Rows, row_base: int):
    """Kind tag, body pieces and body lengths of a list column."""
    starts, counts, items = _list_layout(array, rows)
    items = _decoded(items)
    if items.null_count:
        found = _first_flagged(~_present_rows(items), starts, counts)
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
    if column.kind == "bytes":
        # BytesList is the repeated items themselves; there is no packed wrapper.
        return _BYTES_LIST_TAG, [_ragged(values, body_starts, byte_counts, None)], byte_counts
    # A packed list is 0a, byte count, payload; an empty list is no bytes at all.
    nonempty = counts > 0
    packed_rows = rows if _all_rows(nonempty, rows) else nonempty
    body = [_const(b"\x0a", packed_rows), _varint(byte_counts, packed_rows), _ragged(values, body_starts, byte_counts, None)]
    body_length = nonempty * (1 + _length_of_varint(byte_counts)) + byte_counts
    return (_FLOAT_LIST_TAG if column.kind == "float" else _INT64_LIST_TAG), body, body_length


def _all_rows(flags: np.ndarray, rows: Rows) -> bool:
    """Whether `flags` holds in every row present (every row when `rows` is None)."""
    return bool(flags.all()) if rows is None else bool(flags[rows].all())


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
        item_lengths = _varint_lengths(item_values, int(item_values.max(initial=0)))
        item_pieces = [_varint(item_values, None, item_lengths)]
    else:
        data, item_starts, value_lengths = _bytes_values(items)
        item_pieces = [_const(b"\x0a"), _varint(value_lengths), _ragged(data, item_starts, value_lengths, None)]
        item_lengths = 1 + _length_of_varint(value_lengths) + value_lengths
    item_offsets = np.zeros(len(items) + 1, np.int64)
    np.cumsum(item_lengths, out=item_offsets[1:])
    return _assemble(len(items), item_pieces, item_offsets[-1]), item_offsets


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
