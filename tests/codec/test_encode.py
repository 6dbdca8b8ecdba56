"""The columnar encoder equals encode_example and protobuf, row by row and byte for byte."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.table import make_benchmark_table
from tfrbeam.codec import encode as columnar_encode
from tfrbeam.codec.encode import EncodedExamples, encode_record_batch, record_batch_to_examples
from tfrbeam.codec.example import encode_example
from tfrbeam.codec.kinds import is_list
from tfrbeam.codec.protos import example_pb2
from tfrbeam.errors import ArrowConversionError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# ---------------------------------------------------------------------------------------------
# References: encode_example on the row dict, and protobuf built from the same values.


def _item_type(arrow_type: pa.DataType) -> pa.DataType:
    if is_list(arrow_type):
        arrow_type = arrow_type.value_type
    return arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type


def _kind(arrow_type: pa.DataType) -> str:
    item = _item_type(arrow_type)
    if pa.types.is_integer(item) or pa.types.is_boolean(item):
        return "int64"
    return "float" if pa.types.is_floating(item) else "bytes"


def _protobuf_feature(kind: str, value) -> example_pb2.Feature:
    values = value if isinstance(value, list) else [value]
    feature = example_pb2.Feature()
    if kind == "int64":
        feature.int64_list.SetInParent()
        feature.int64_list.value.extend(int(v) for v in values)
    elif kind == "float":
        feature.float_list.SetInParent()
        feature.float_list.value.extend(float(v) for v in values)
    else:
        feature.bytes_list.SetInParent()
        feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
    return feature


def _varint(value: int) -> bytes:
    return example_pb2.Int64List(value=[value]).SerializeToString()[2:]  # packed: 0a, size, varint


def _protobuf_reference(row: dict, kinds: dict[str, str]) -> tuple[bytes, bytes | None]:
    """(bytes per docs/format.md's canonical order, built from protobuf-serialized Features, protobuf's whole-Example bytes).

    The second is None when some present name is a proper prefix of another: upb (Python
    protobuf) then orders map keys longer-first, unlike C++ protobuf and docs/format.md.
    """
    present = sorted((name for name, value in row.items() if value is not None), key=lambda n: n.encode())
    entries = b""
    example = example_pb2.Example()
    example.features.SetInParent()
    for name in present:
        feature = _protobuf_feature(kinds[name], row[name])
        example.features.feature[name].CopyFrom(feature)
        key, body = name.encode(), feature.SerializeToString(deterministic=True)
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(body)) + body
        entries += b"\x0a" + _varint(len(entry)) + entry
    ours = b"\x0a" + _varint(len(entries)) + entries
    encoded = [name.encode() for name in present]
    prefixed = any(a != b and b.startswith(a) for a in encoded for b in encoded)
    return ours, None if prefixed else example.SerializeToString(deterministic=True)


def assert_matches_references(data: pa.RecordBatch | pa.Table, encoded: list[bytes]) -> None:
    kinds = {field.name: _kind(field.type) for field in data.schema}
    rows = data.to_pylist()
    assert len(encoded) == len(rows)
    for index, (record, row) in enumerate(zip(encoded, rows)):
        assert record == encode_example(row, kinds), f"row {index}: differs from encode_example"
        wire, whole = _protobuf_reference(row, kinds)
        assert record == wire, f"row {index}: differs from protobuf"
        if whole is not None:
            assert record == whole, f"row {index}: differs from protobuf's whole-Example bytes"
        parsed = example_pb2.Example.FromString(record)
        assert set(parsed.features.feature) == {name for name, value in row.items() if value is not None}


# ---------------------------------------------------------------------------------------------
# Random schemas and values.

INT_TYPES = {
    pa.int8(): (-(2**7), 2**7 - 1), pa.int16(): (-(2**15), 2**15 - 1), pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (INT64_MIN, INT64_MAX), pa.uint8(): (0, 2**8 - 1), pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1), pa.uint64(): (0, INT64_MAX),
}  # fmt: skip
FLOAT_TYPES = {pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}
BYTES_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.string_view(), pa.binary_view()]
LIST_TYPES = [pa.list_, pa.large_list, pa.list_view, pa.large_list_view, "fixed"]

# Code points at the edges of UTF-8 and UTF-16 encodings. Names from U+E000 up sort before astral
# names (U+10000 up) by UTF-16 code units but after them by UTF-8 bytes, so drawing both in one
# batch tells the two orders apart; general text alone rarely does.
EDGE_CODE_POINTS = ["", "a", "\x00", "\x7f", "\x80", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uff01", "\ufffd", "\uffff",
                    "\U00010000", "\U0001f600", "\U0010ffff"]
names = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=6),
    st.lists(st.sampled_from(EDGE_CODE_POINTS), max_size=3).map("".join),
)
SPECIAL_FLOATS = [math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 1e300, -1e-300, 65504.0, 3.4028235e38]


def _ints(arrow_type: pa.DataType) -> st.SearchStrategy:
    low, high = INT_TYPES[arrow_type]
    boundaries = [v for v in (low, high, 0, -1, 1, 127, 128, 2**63 - 1) if low <= v <= high]
    return st.one_of(st.sampled_from(boundaries), st.integers(low, high))


def _floats(arrow_type: pa.DataType) -> st.SearchStrategy:
    width = {pa.float16(): 16, pa.float32(): 32, pa.float64(): 64}[arrow_type]
    return st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats(width=width))


def _texts(arrow_type: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
    return st.binary(max_size=20)


@st.composite
def scalar_spec(draw):
    """(Arrow item type, value strategy, how to build the array)."""
    family = draw(st.sampled_from(["int", "bool", "float", "bytes", "fixed_binary", "dictionary"]))
    if family == "int":
        arrow_type = draw(st.sampled_from(list(INT_TYPES)))
        return arrow_type, _ints(arrow_type)
    if family == "bool":
        return pa.bool_(), st.booleans()
    if family == "float":
        arrow_type = draw(st.sampled_from(list(FLOAT_TYPES)))
        return arrow_type, _floats(arrow_type)
    if family == "fixed_binary":
        width = draw(st.integers(0, 5))
        return pa.binary(width), st.binary(min_size=width, max_size=width)
    if family == "dictionary":
        value_type = draw(st.sampled_from([pa.string(), pa.int16(), pa.float32(), pa.binary()]))
        values = _texts(value_type) if value_type in (pa.string(), pa.binary()) else (
            _ints(value_type) if value_type == pa.int16() else _floats(value_type))
        return pa.dictionary(pa.int8(), value_type), st.sampled_from(draw(st.lists(values, min_size=1, max_size=4)))
    arrow_type = draw(st.sampled_from(BYTES_TYPES))
    return arrow_type, _texts(arrow_type)


def build_array(values: list, arrow_type: pa.DataType) -> pa.Array:
    """An Arrow array of `arrow_type` holding `values` (None = null), floats narrowed by numpy."""
    if pa.types.is_dictionary(arrow_type):
        return build_array(values, arrow_type.value_type).dictionary_encode()
    if arrow_type in FLOAT_TYPES:
        mask = np.array([v is None for v in values], bool)
        with np.errstate(over="ignore"):
            numbers = np.array([0.0 if v is None else v for v in values], np.float64).astype(FLOAT_TYPES[arrow_type])
        return pa.array(numbers, type=arrow_type, mask=mask if mask.any() else None)
    if pa.types.is_string_view(arrow_type) or pa.types.is_binary_view(arrow_type):
        plain = pa.string() if pa.types.is_string_view(arrow_type) else pa.binary()
        return pa.array(values, plain).cast(arrow_type)
    return pa.array(values, arrow_type)


@st.composite
def column(draw, num_rows: int):
    item_type, values = draw(scalar_spec())
    nullable = draw(st.booleans())
    if not draw(st.booleans()):
        cells = draw(st.lists(st.one_of(st.none(), values) if nullable else values, min_size=num_rows, max_size=num_rows))
        return build_array(cells, item_type)
    list_type = draw(st.sampled_from(LIST_TYPES))
    size = draw(st.integers(0, 3))
    lengths = draw(st.lists(st.integers(0, 5), min_size=num_rows, max_size=num_rows))
    if list_type == "fixed":
        lengths = [size] * num_rows
    row_nulls = draw(st.lists(st.booleans(), min_size=num_rows, max_size=num_rows)) if nullable else [False] * num_rows
    items = draw(st.lists(values, min_size=sum(lengths), max_size=sum(lengths)))
    item_array = build_array(items, item_type)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    mask = pa.array(row_nulls, pa.bool_())
    if list_type == "fixed" and size == 0:  # from_arrays cannot count rows of zero-size lists
        return pa.array([None if null else [] for null in row_nulls], pa.list_(item_array.type, 0))
    if list_type == "fixed":
        return pa.FixedSizeListArray.from_arrays(item_array, size, mask=mask)
    if list_type in (pa.list_view, pa.large_list_view):
        view_class = pa.ListViewArray if list_type is pa.list_view else pa.LargeListViewArray
        # Views may point anywhere: reverse the order the items are stored in.
        order = np.arange(num_rows)[::-1]
        starts = np.zeros(num_rows, np.int64)
        starts[order] = np.concatenate([[0], np.cumsum(np.array(lengths)[order])])[:-1]
        reordered = pa.concat_arrays([item_array.slice(int(offsets[i]), lengths[i]) for i in order]) if num_rows else item_array
        return view_class.from_arrays(pa.array(starts, pa.int32()), pa.array(lengths, pa.int32()), reordered, mask=mask)
    list_class = pa.ListArray if list_type is pa.list_ else pa.LargeListArray
    return list_class.from_arrays(pa.array(offsets, pa.int32() if list_type is pa.list_ else pa.int64()), item_array, mask=mask)


@st.composite
def record_batches(draw, max_rows: int = 8, max_columns: int = 6):
    num_rows = draw(st.integers(0, max_rows))
    column_names = draw(st.lists(names, max_size=max_columns, unique=True))
    arrays = [draw(column(num_rows)) for _ in column_names]
    return pa.RecordBatch.from_arrays(arrays, names=column_names)


HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYPOTHESIS
@given(record_batches())
def test_random_batches_equal_encode_example_and_protobuf(batch):
    assert_matches_references(batch, record_batch_to_examples(batch))


@HYPOTHESIS
@given(record_batches(max_rows=12), st.data())
def test_slices_and_chunked_tables_encode_like_their_rows(batch, data):
    start = data.draw(st.integers(0, batch.num_rows))
    length = data.draw(st.integers(0, batch.num_rows - start))
    sliced = batch.slice(start, length)
    assert_matches_references(sliced, record_batch_to_examples(sliced))
    # Every column cut into chunks at its own places, so chunks do not line up across columns.
    chunked = {}
    for name, array in zip(sliced.schema.names, sliced.columns):
        cuts = sorted(data.draw(st.lists(st.integers(0, length), max_size=3)))
        bounds = [0, *cuts, length]
        chunked[name] = pa.chunked_array([array.slice(a, b - a) for a, b in itertools.pairwise(bounds)], type=array.type)
    table = pa.table(chunked) if chunked else pa.table({}).append_column("x", pa.array([None] * length)).drop(["x"])
    assert record_batch_to_examples(table) == record_batch_to_examples(sliced)


# ---------------------------------------------------------------------------------------------
# Explicit cases.


def test_extreme_values_and_edge_names():
    batch = pa.record_batch(
        {
            "": pa.array([INT64_MIN, INT64_MAX, 0, -1], pa.int64()),
            "u": pa.array([INT64_MAX, 0, 2**63 - 2, None], pa.uint64()),
            "f": pa.array([math.nan, math.inf, -math.inf, -0.0], pa.float64()),
            "big": pa.array([1e300, -1e300, 3.4028235e38, 3.4028236e38], pa.float64()),
            "名前": pa.array(["", "ключ", "émoji_😀", None]),
            "e": pa.array([[], [], None, [1.0]], pa.list_(pa.float32())),
            "eb": pa.array([[], [b""], None, [b"", b"x"]], pa.list_(pa.binary())),
            "ei": pa.array([[], [INT64_MIN], None, []], pa.list_(pa.int64())),
        }
    )
    assert_matches_references(batch, record_batch_to_examples(batch))


@pytest.mark.parametrize("boundary", [128, 16384])
def test_lengths_crossing_varint_boundaries(boundary):
    """Header lengths of 1 and 2 (or 2 and 3) varint bytes in one batch, scalar and list; with
    more rows than distinct lengths, so that headers come from lookup tables."""
    sizes = [boundary - 30, boundary - 3, boundary - 2, boundary - 1, boundary, boundary + 1, boundary + 40] * 60
    batch = pa.record_batch(
        {
            "s": pa.array(["x" * size for size in sizes]),
            "n": pa.array(["y" * size if index % 3 else None for index, size in enumerate(sizes)]),
            "i": pa.array([list(range(size // 8)) for size in sizes], pa.list_(pa.int64())),
            "f": pa.array([[0.25] * (size // 4) for size in sizes], pa.list_(pa.float32())),
            "b": pa.array([[b"z" * (size // 2), b""] for size in sizes], pa.list_(pa.binary())),
        }
    )
    assert_matches_references(batch, record_batch_to_examples(batch))


@pytest.mark.parametrize("distinct_lengths", [5, 100])
def test_rows_placed_at_exact_lengths(distinct_lengths):
    """A lone string column leaves no room after a row for padding junk: rows are copied at
    their exact lengths, grouped by length or byte by byte when lengths are too varied."""
    strings = ["w" * (row % distinct_lengths) for row in range(300)]
    batch = pa.record_batch({"only": pa.array(strings)})
    assert_matches_references(batch, record_batch_to_examples(batch))


def test_fixed_size_lists_with_and_without_nulls():
    values = pa.array(np.arange(24, dtype=np.float32))
    for mask in (None, pa.array([False, True, False, False, True, False])):
        for items in (values, pa.array(np.arange(24) - 12), pa.array([str(v) for v in range(24)])):
            batch = pa.record_batch({"fixed": pa.FixedSizeListArray.from_arrays(items, 4, mask=mask)})
            assert_matches_references(batch, record_batch_to_examples(batch))


def test_every_varint_length_and_bit_position():
    """Values 2^k - 1, 2^k and -2^k for every k: each varint length, every 7-bit group boundary."""
    values = sorted({v for k in range(64) for v in (2**k - 1, min(2**k, INT64_MAX), -(2**k))})
    lists = pa.array([values[i : i + 3] for i in range(len(values))], pa.list_(pa.int64()))
    batch = pa.record_batch({"v": pa.array(values, pa.int64()), "l": lists})
    assert_matches_references(batch, record_batch_to_examples(batch))


def test_prefix_names_are_ordered_by_utf8_bytes_shorter_first():
    batch = pa.record_batch({"ab": [2], "a": [1], "": [0], "abc": [3], "b": [4]})
    record = record_batch_to_examples(batch)[0]
    keys = []
    position = 2
    while position < len(record):
        entry_length = record[position + 1]
        key_length = record[position + 3]
        keys.append(record[position + 4 : position + 4 + key_length].decode())
        position += 2 + entry_length
    assert keys == ["", "a", "ab", "abc", "b"]
    assert_matches_references(batch, [record])


@pytest.mark.parametrize("row", [
    {"\uff01": [1], "\U0001f600": [2]},
    {"\ue000": [1], "\U00010000": [2], "\uffff": [3], "\U0010ffff": [4], "\ud7ff": [5]},
])
def test_names_above_u_e000_and_astral_names_are_ordered_by_utf8_bytes(row):
    batch = pa.record_batch({name: pa.array(values, pa.int64()) for name, values in row.items()})
    assert record_batch_to_examples(batch) == [encode_example(row)]
    assert_matches_references(batch, record_batch_to_examples(batch))


def test_one_thousand_columns():
    rng = np.random.default_rng(7)
    columns = {}
    for index in range(1000):
        name = f"k{index:04d}"
        kind = index % 4
        if kind == 0:
            columns[name] = pa.array(rng.integers(-(2**40), 2**40, 5))
        elif kind == 1:
            columns[name] = pa.array(rng.normal(size=5))
        elif kind == 2:
            columns[name] = pa.array([f"v{index}-{row}" * (row % 3) for row in range(5)])
        else:
            columns[name] = pa.array([[index, -index][: row % 3] for row in range(5)], pa.list_(pa.int64()))
    table = pa.table(columns)
    assert_matches_references(table, record_batch_to_examples(table))


@pytest.mark.parametrize("group_bytes", [1 << 20, 100])
def test_uneven_sizes_take_the_ragged_path_and_stay_exact(monkeypatch, group_bytes):
    monkeypatch.setattr(columnar_encode, "_SEGMENT_BYTES_PER_GROUP", group_bytes)
    long_value = "x" * 100_000
    strings = ["a", long_value, "", None] * 20
    ints = [[1] * 2000 if row % 9 == 0 else [row] for row in range(80)]
    nested_bytes = [[b"y" * 5000] if row % 7 == 0 else [b"z", b""] for row in range(80)]
    batch = pa.record_batch(
        {
            "s": pa.array(strings),
            "l": pa.array(ints, pa.list_(pa.int64())),
            "b": pa.array(nested_bytes, pa.list_(pa.binary())),
            "f": pa.array([[0.5] * 3000 if row == 3 else [] for row in range(80)], pa.list_(pa.float64())),
        }
    )
    pieces, _ = columnar_encode._feature_entry(columnar_encode._prepare_columns(batch)[2], 0)
    assert any(isinstance(piece, columnar_encode._Ragged) for piece in pieces)
    assert_matches_references(batch, record_batch_to_examples(batch))


@pytest.mark.parametrize("null_length", [3, 100_000])
def test_null_string_slots_that_span_bytes_are_omitted(null_length):
    """Arrow lets a null slot's offsets span bytes; they belong to no row (padded and ragged path)."""
    lengths = np.array([2, null_length] + [3] * 18)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = b"ab" + b"?" * null_length + b"cde" * 18
    validity = np.packbits(np.arange(20) != 1, bitorder="little")
    strings = pa.StringArray.from_buffers(20, pa.py_buffer(offsets), pa.py_buffer(data), pa.py_buffer(validity))
    assert strings.to_pylist() == ["ab", None] + ["cde"] * 18
    batch = pa.record_batch({"s": strings})
    assert_matches_references(batch, record_batch_to_examples(batch))


def test_batches_longer_than_one_chunk(monkeypatch):
    monkeypatch.setattr(columnar_encode, "_ROWS_PER_CHUNK", 1000)
    table = make_benchmark_table(2500, seed=3)
    assert_matches_references(table, record_batch_to_examples(table))


def test_benchmark_table_is_deterministic_and_encodes_like_protobuf():
    table = make_benchmark_table(300, seed=0)
    assert table.equals(make_benchmark_table(300, seed=0))
    assert not table.equals(make_benchmark_table(300, seed=1))
    assert table.schema.names == [*(f"i{i}" for i in range(8)), *(f"f{i}" for i in range(8)), "s0", "s1", "emb", "n0"]
    assert 0 < table.column("n0").null_count < 300
    assert all(5 <= len(word) <= 12 for word in table.column("s0").to_pylist())
    assert_matches_references(table, record_batch_to_examples(table))


def test_encoded_examples_buffer_and_offsets():
    batch = pa.record_batch({"x": [1, None, 300], "s": ["a", "bb", None]})
    encoded = encode_record_batch(batch)
    records = record_batch_to_examples(batch)
    assert isinstance(encoded, EncodedExamples)
    assert len(encoded) == 3
    assert encoded.offsets.dtype == np.int64 and encoded.offsets.tolist()[0] == 0
    assert encoded.data.dtype == np.uint8 and encoded.data.tobytes() == b"".join(records)
    assert [encoded[i] for i in range(3)] == records == encoded.to_list()
    assert encoded[-1] == records[2]
    with pytest.raises(IndexError, match="out of range for 3 records"):
        encoded[3]


def test_empty_batches_and_batches_without_columns():
    empty = pa.record_batch({"x": pa.array([], pa.int64())})
    encoded = encode_record_batch(empty)
    assert len(encoded) == 0 and encoded.offsets.tolist() == [0] and encoded.to_list() == []
    no_chunks = pa.table({"x": pa.chunked_array([], pa.string()), "y": pa.chunked_array([], pa.int8())})
    assert record_batch_to_examples(no_chunks) == []
    no_columns = pa.table({"x": [1, 2, 3]}).drop(["x"])
    assert record_batch_to_examples(no_columns) == [b"\x0a\x00"] * 3
    all_null = pa.record_batch({"x": pa.array([None, None], pa.int64()), "y": pa.array([None, None], pa.string())})
    assert record_batch_to_examples(all_null) == [b"\x0a\x00"] * 2


# ---------------------------------------------------------------------------------------------
# Errors: each names the column, the row or type, and what to do.


def test_uint64_above_int64_max_names_column_and_row():
    values = pa.array([1, None, 2**63, 5], pa.uint64())
    with pytest.raises(ArrowConversionError, match=r"column 'big', row 2: uint64 value 9223372036854775808 exceeds"):
        record_batch_to_examples(pa.record_batch({"ok": [1, 2, 3, 4], "big": values}))
    # Under a null the value does not count; a later row in a later chunk is named by table row.
    hidden = pa.array([2**64 - 1, 3], pa.uint64()).to_numpy()
    assert record_batch_to_examples(pa.record_batch({"big": pa.array(hidden, mask=np.array([True, False]))}))
    with pytest.raises(ArrowConversionError, match=r"row 4: uint64 value 18446744073709551615 at list position 1"):
        lists = pa.array([[1], [], None, [2], [3, 2**64 - 1]], pa.list_(pa.uint64()))
        record_batch_to_examples(pa.record_batch({"l": lists}))
    # Items under a null list row belong to no row.
    items = pa.array([1, 2**64 - 1, 3], pa.uint64())
    hidden_items = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()), items, mask=pa.array([False, True, False]))
    assert len(record_batch_to_examples(pa.record_batch({"l": hidden_items}))) == 3


def test_uint64_error_row_counts_across_chunks(monkeypatch):
    monkeypatch.setattr(columnar_encode, "_ROWS_PER_CHUNK", 4)
    values = pa.array([0] * 9 + [2**63] + [0] * 3, pa.uint64())
    with pytest.raises(ArrowConversionError, match=r"column 'u', row 9:"):
        record_batch_to_examples(pa.table({"u": values}))


def test_null_inside_a_list_names_column_row_and_position():
    lists = pa.array([[1.0], [2.0, 3.0, None], None], pa.list_(pa.float64()))
    with pytest.raises(ArrowConversionError, match=r"column 'v', row 1: the list holds a null at position 2.*fill_null"):
        record_batch_to_examples(pa.record_batch({"v": lists}))
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, None, None, 5, None]), 2, mask=pa.array([False, True, False]))
    with pytest.raises(ArrowConversionError, match=r"column 'w', row 2: the list holds a null at position 1"):
        record_batch_to_examples(pa.record_batch({"w": fixed}))
    # Nulls under a null list row are not the row's items.
    assert len(record_batch_to_examples(pa.record_batch({"w": fixed.slice(0, 2)}))) == 2


@pytest.mark.parametrize(
    ("arrow_type", "advice"),
    [
        (pa.date32(), "pc.cast(col, pa.int32()) for epoch values, or to pa.string()"),
        (pa.time32("s"), "pc.cast(col, pa.int32()) for epoch values"),
        (pa.date64(), "pc.cast(col, pa.int64()) for epoch values, or to pa.string()"),
        (pa.timestamp("us", tz="UTC"), "pc.cast(col, pa.int64()) for epoch values, or to pa.string()"),
        (pa.duration("ms"), "pc.cast(col, pa.int64())"),
        (pa.time64("ns"), "pc.cast(col, pa.int64())"),
        (pa.decimal128(10, 2), "pc.cast(col, pa.float64()) (rounds) or pc.cast(col, pa.string()) (exact)"),
        (pa.struct([("a", pa.int64())]), "table.flatten()"),
        (pa.map_(pa.string(), pa.int64()), "pc.map_keys(col) and pc.map_values(col)"),
        (pa.list_(pa.list_(pa.int64())), "Example lists are flat; flatten one level with pc.list_flatten(col)"),
        (pa.null(), "cast to the intended type, e.g. pc.cast(col, pa.int64())"),
        (pa.month_day_nano_interval(), "convert the values to integers, floats or strings first"),
    ],
)
def test_unsupported_types_name_column_type_and_cast(arrow_type, advice):
    batch = pa.record_batch({"when": pa.array([None, None], arrow_type)})
    with pytest.raises(ArrowConversionError) as raised:
        record_batch_to_examples(batch)
    message = str(raised.value)
    assert f"column 'when' has Arrow type {arrow_type}" in message
    assert advice in message


def test_unsupported_list_items_and_dictionary_values():
    with pytest.raises(ArrowConversionError, match=r"column 'd' has Arrow type list<item: date32\[day\]>, whose list items"):
        record_batch_to_examples(pa.record_batch({"d": pa.array([[None]], pa.list_(pa.date32()))}))
    dates = pa.array([0, 1], pa.date32()).dictionary_encode()
    with pytest.raises(ArrowConversionError, match=r"column 'c' has Arrow type dictionary<values=date32\[day\].*pa.int32\(\)"):
        record_batch_to_examples(pa.record_batch({"c": dates}))


def test_duplicate_column_names_are_refused():
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    with pytest.raises(ArrowConversionError, match=r"column names \['x'\] appear more than once"):
        record_batch_to_examples(table)


def test_examples_are_allocated_from_arrows_system_pool():
    """Records come from malloc through Arrow's system pool, which keeps freed heap for the next batch's
    records: not numpy's allocator (huge-page faults) nor pyarrow's default pool (gives pages back)."""
    rows = 20_000
    batch = pa.record_batch({"v": pa.array(np.arange(rows, dtype=np.float32)),
                             "w": pa.array([f"word-{index}" for index in range(rows)])})
    system = pa.system_memory_pool()
    before, before_default = system.bytes_allocated(), pa.total_allocated_bytes()
    encoded = encode_record_batch(batch)
    assert encoded.data.nbytes > 200_000
    assert system.bytes_allocated() - before >= encoded.data.nbytes
    if pa.default_memory_pool().backend_name != "system":
        assert pa.total_allocated_bytes() - before_default < encoded.data.nbytes // 10
