"""Feature conversion: strict number parsing, nulls, lists, casts, inference and bad-row reasons."""

from __future__ import annotations

import datetime
import decimal
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.builder.features.convert import (
    BatchProvenance,
    FeatureSpec,
    convert_batch,
    infer_spec,
    infer_text_type,
    output_type,
    resolve_spec,
    source_column,
    source_type,
)
from tfrbeam.errors import ArrowConversionError


def convert(columns: dict, *specs: FeatureSpec, first_line: int = 2):
    batch = pa.record_batch(columns)
    return convert_batch(batch, specs, BatchProvenance("in.csv", batch, first_line=first_line))


def text(values) -> pa.Array:
    return pa.array(values, pa.binary())  # CSV columns arrive as binary


def spec(name, type_, **kwargs) -> FeatureSpec:
    kwargs.setdefault("is_list", kwargs.get("separator") is not None)
    return FeatureSpec(name, type_, kwargs.pop("source", name), **kwargs)


def test_zeros_empty_strings_and_false_are_values():
    result = convert(
        {"i": text([b"0", b"-0", b"00"]), "f": text([b"0", b"0.0", b"-0.0"]), "s": text([b"", b"0", b"false"]),
         "b": pa.array([False, True, False]), "n": pa.array([0, 0, 0])},
        spec("i", "int64"), spec("f", "float"), spec("s", "bytes"), spec("b", "int64"), spec("n", "float"),
    )
    assert not result.bad_rows
    assert result.batch.to_pydict() == {"i": [0, 0, 0], "f": [0.0, 0.0, -0.0], "s": [b"", b"0", b"false"],
                                        "b": [0, 1, 0], "n": [0.0, 0.0, 0.0]}
    assert result.batch.column("s").null_count == 0 and result.batch.column("i").null_count == 0
    assert result.batch.schema.types == [pa.int64(), pa.float32(), pa.binary(), pa.int64(), pa.float32()]


@pytest.mark.parametrize(
    "value, reason",
    [
        ("1.5", "'1.5' is not an int64 (a float value in an int64 feature is never rounded; declare type: float)"),
        ("1.0", "'1.0' is not an int64 (a float value in an int64 feature is never rounded"),
        ("1e3", "'1e3' is not an int64 (a float value in an int64 feature is never rounded"),
        ("9223372036854775808", "'9223372036854775808' is not an int64 (out of the int64 range -2**63 .. 2**63-1)"),
        ("-9223372036854775809", "is not an int64 (out of the int64 range"),
        ("99999999999999999999999", "is not an int64 (out of the int64 range"),
        ("0x10", "'0x10' is not an int64 (expected an optional sign and decimal digits)"),
        (" 1", "' 1' is not an int64 (expected an optional sign and decimal digits)"),
        ("1_000", "'1_000' is not an int64"),
        (
            "",
            "'' is not an int64 (expected an optional sign and decimal digits; an empty field is a value, add \"\" to "
            "input.csv.null_values to read it as null)",
        ),
        ("abc", "'abc' is not an int64"),
    ],
)
def test_int64_text_that_is_not_an_integer_is_a_bad_row(value, reason):
    result = convert({"x": text([b"7", value.encode(), b"8"])}, spec("x", "int64"))
    assert result.batch.column("x").to_pylist() == [7, 8]
    assert result.kept_rows.tolist() == [0, 2]
    (bad,) = result.bad_rows
    assert (bad.path, bad.line) == ("in.csv", 3)
    assert bad.reason.startswith(f"feature 'x': {value!r} is not an int64 (")
    assert reason in bad.reason
    assert json.loads(bad.raw) == {"x": value}


def test_int64_edges_and_signs():
    values = [b"9223372036854775807", b"-9223372036854775808", b"+5", b"-0", b"0009223372036854775807"]
    result = convert({"x": text(values)}, spec("x", "int64"))
    assert not result.bad_rows
    assert result.batch.column("x").to_pylist() == [2**63 - 1, -(2**63), 5, 0, 2**63 - 1]


@pytest.mark.parametrize(
    "value, expected",
    [("1.5", 1.5), ("-2", -2.0), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("1E-2", 0.01), ("+3", 3.0),
     ("inf", float("inf")), ("-Infinity", float("-inf")), ("3.4e38", 3.4e38)],
)
def test_float_text(value, expected):
    result = convert({"x": text([value.encode()])}, spec("x", "float"))
    assert not result.bad_rows
    assert result.batch.column("x").to_pylist() == [pytest.approx(expected, rel=1e-6)]


def test_nan_is_a_float_value():
    result = convert({"x": text([b"nan", b"NaN"])}, spec("x", "float"))
    assert not result.bad_rows and all(np.isnan(result.batch.column("x").to_numpy()))


@pytest.mark.parametrize(
    "value, reason",
    [("1,5", "'1,5' is not a number"), ("abc", "'abc' is not a number"), (" 1", "' 1' is not a number"),
     ("", "'' is not a number; an empty field is a value"),
     ("1e39", "'1e39' is beyond the float32 range (Example floats are 32-bit)"),
     ("1e400", "'1e400' is beyond the float32 range")],
)
def test_float_text_that_is_not_a_number_is_a_bad_row(value, reason):
    result = convert({"x": text([value.encode(), b"2"])}, spec("x", "float"))
    assert result.batch.column("x").to_pylist() == [2.0]
    assert result.bad_rows[0].reason.split(" (add")[0].startswith(f"feature 'x': {reason}")
    assert result.bad_rows[0].line == 2


def test_all_problems_of_a_row_are_reported_together():
    result = convert({"a": text([b"x"]), "b": text([b"y"]), "c": pa.array([None], pa.binary())},
                     spec("a", "int64"), spec("b", "float"), spec("c", "bytes", on_null="error"))
    (bad,) = result.bad_rows
    assert bad.reason == ("feature 'a': 'x' is not an int64 (expected an optional sign and decimal digits); "
                          "feature 'b': 'y' is not a number; "
                          "feature 'c': is null (on_null: error; use omit or default to accept nulls)")
    assert result.batch.num_rows == 0 and result.batch.schema.names == ["a", "b", "c"]


def test_on_null_omit_default_and_error():
    column = text([b"1", None, b"3"])
    omit = convert({"x": column}, spec("x", "int64", on_null="omit"))
    assert omit.batch.column("x").to_pylist() == [1, None, 3] and not omit.bad_rows
    default = convert({"x": column}, spec("x", "int64", on_null="default", default=-1))
    assert default.batch.column("x").to_pylist() == [1, -1, 3]
    error = convert({"x": column}, spec("x", "int64", on_null="error"))
    assert error.batch.column("x").to_pylist() == [1, 3]
    assert [(bad.line, bad.reason) for bad in error.bad_rows] == [
        (3, "feature 'x': is null (on_null: error; use omit or default to accept nulls)")]
    bytes_default = convert({"x": text([None])}, spec("x", "bytes", on_null="default", default=b""))
    assert bytes_default.batch.column("x").to_pylist() == [b""]


def test_a_failed_parse_is_not_also_reported_as_null():
    result = convert({"x": text([b"oops"])}, spec("x", "int64", on_null="error"))
    assert [bad.reason for bad in result.bad_rows] == [
        "feature 'x': 'oops' is not an int64 (expected an optional sign and decimal digits)"]


def test_separator_lists_variable_and_fixed_length():
    column = text([b"1;2;3", b"", b"4", None, b"5;6"])
    variable = convert({"x": column}, spec("x", "int64", separator=";", on_null="omit"))
    assert variable.batch.column("x").to_pylist() == [[1, 2, 3], [], [4], None, [5, 6]]
    assert variable.batch.schema.field("x").type == pa.list_(pa.int64())
    fixed = convert({"x": column}, spec("x", "float", separator=";", length=2, on_null="default", default=(0.0, 0.0)))
    assert fixed.batch.column("x").to_pylist() == [[0.0, 0.0], [5.0, 6.0]]
    assert [(bad.line, bad.reason) for bad in fixed.bad_rows] == [
        (2, "feature 'x': has 3 values, but length is 2"),
        (3, "feature 'x': has 0 values, but length is 2"),
        (4, "feature 'x': has 1 values, but length is 2"),
    ]


def test_separator_list_items_are_parsed_strictly_and_bytes_items_kept():
    bad = convert({"x": text([b"1;x;3", b"1;;2"])}, spec("x", "int64", separator=";"))
    assert [b.reason for b in bad.bad_rows] == [
        "feature 'x': item 1 'x' is not an int64 (expected an optional sign and decimal digits)",
        "feature 'x': item 1 '' is not an int64 (expected an optional sign and decimal digits; an empty field is a "
        "value, add \"\" to input.csv.null_values to read it as null)",
    ]
    words = convert({"x": text([b"a|b", b"a||", b"|"])}, spec("x", "bytes", separator="|"))
    assert words.batch.column("x").to_pylist() == [[b"a", b"b"], [b"a", b"", b""], [b"", b""]]
    multi = convert({"x": text([b"1::2", b"3"])}, spec("x", "int64", separator="::"))
    assert multi.batch.column("x").to_pylist() == [[1, 2], [3]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.text(alphabet="ab;é", max_size=4), max_size=4).map(";".join)),
                max_size=12), st.integers(0, 3))
def test_separator_split_matches_python(values, offset):
    column = pa.array([None] * offset + values, pa.string()).slice(offset)
    result = convert({"x": column}, spec("x", "bytes", separator=";", on_null="omit"))
    expected = [None if v is None else ([] if v == "" else [p.encode() for p in v.split(";")]) for v in values]
    assert result.batch.column("x").to_pylist() == expected


def test_separator_split_of_a_null_that_covers_bytes():
    # Arrow allows a null slot whose offsets still span bytes; the buffer split does not apply,
    # the general split does, and the null stays a null list.
    offsets = pa.py_buffer(np.array([0, 3, 6, 9], np.int32).tobytes())
    validity = pa.array([True, False, True]).buffers()[1]
    column = pa.Array.from_buffers(pa.binary(), 3, [validity, offsets, pa.py_buffer(b"1;2x;y3;4")])
    result = convert({"x": column}, spec("x", "int64", separator=";", on_null="omit"))
    assert not result.bad_rows
    assert result.batch.column("x").to_pylist() == [[1, 2], None, [3, 4]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20))
def test_int64_text_round_trips_exactly(numbers):
    result = convert({"x": text([str(n).encode() for n in numbers])}, spec("x", "int64"))
    assert result.batch.column("x").to_pylist() == numbers


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=20))
def test_float_text_round_trips_to_the_same_float32(numbers):
    result = convert({"x": text([repr(n).encode() for n in numbers])}, spec("x", "float"))
    assert result.batch.column("x").to_numpy().tolist() == [float(np.float32(n)) for n in numbers]


def test_typed_columns_and_casts():
    columns = {
        "u64": pa.array([1, 2**64 - 1], pa.uint64()),
        "i8": pa.array([-1, 5], pa.int8()),
        "f16": pa.array([np.float16(1.5), np.float16(-2)], pa.float16()),
        "f64": pa.array([1e300, 2.5]),
        "dec0": pa.array([decimal.Decimal("12"), decimal.Decimal("99999999999999999999")], pa.decimal128(20, 0)),
        "dec2": pa.array([decimal.Decimal("1.25"), decimal.Decimal("-3.50")], pa.decimal128(5, 2)),
        "ts": pa.array([datetime.datetime(1970, 1, 1, 0, 0, 1), None], pa.timestamp("ms")),
        "day": pa.array([datetime.date(1970, 1, 11), datetime.date(1969, 12, 31)], pa.date32()),
        "dict": pa.array(["a", "b"]).dictionary_encode(),
        "s": pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]),
    }
    result = convert(
        columns,
        spec("u64", "int64"), spec("i8", "float"), spec("f16", "float"), spec("f64", "bytes"),
        spec("dec0", "int64"), spec("dec2", "float"), spec("dec2_text", "bytes", source="dec2"),
        spec("ts", "int64", on_null="omit"), spec("ts_text", "bytes", source="ts", on_null="omit"),
        spec("day", "int64"), spec("dict", "bytes"), spec("s_a", "int64", source="s.a"), spec("s_b", "bytes", source="s.b"),
        first_line=1,
    )
    assert [(bad.line, bad.reason) for bad in result.bad_rows] == [
        (2, "feature 'u64': 18446744073709551615 is out of the int64 range -2**63 .. 2**63-1; "
            "feature 'dec0': 99999999999999999999 is out of the int64 range -2**63 .. 2**63-1")]
    row = result.batch.to_pylist()[0]
    assert row == {"u64": 1, "i8": -1.0, "f16": 1.5, "f64": b"1e+300", "dec0": 12, "dec2": 1.25, "dec2_text": b"1.25",
                   "ts": 1000, "ts_text": b"1970-01-01 00:00:01.000", "day": 10, "dict": b"a", "s_a": 1, "s_b": b"x"}
    assert result.bad_rows[0].raw.startswith('{"u64": 18446744073709551615, "i8": 5, ')


def test_float64_beyond_float32_is_a_bad_row_and_infinity_is_not():
    result = convert({"x": pa.array([1e300, float("inf"), 1.0])}, spec("x", "float"))
    assert result.batch.column("x").to_pylist() == [float("inf"), 1.0]
    assert [bad.reason for bad in result.bad_rows] == [
        "feature 'x': 1e+300 is beyond the float32 range (Example floats are 32-bit)"
    ]


def test_native_lists_with_null_items_are_bad_rows():
    column = pa.array([[1, 2], [None, 3], [], None], pa.list_(pa.int64()))
    result = convert({"x": column}, spec("x", "int64", is_list=True, on_null="omit"), first_line=1)
    assert result.batch.column("x").to_pylist() == [[1, 2], [], None]
    assert [(bad.line, bad.reason) for bad in result.bad_rows] == [
        (2, "feature 'x': item 0 is null (an Example list cannot hold a null)")]
    fixed = pa.array([[1.5, 2.5], [3.5, 4.5]], pa.list_(pa.float64(), 2))
    done = convert({"x": fixed}, spec("x", "float", is_list=True, length=2))
    assert done.batch.column("x").to_pylist() == [[1.5, 2.5], [3.5, 4.5]]


def test_missing_source_column_is_an_error_naming_the_file():
    with pytest.raises(ArrowConversionError, match=r"in.csv: has no column 'y' \(columns: x\)"):
        convert({"x": text([b"1"])}, spec("x", "int64", source="y"))


@pytest.mark.parametrize(
    "values, expected",
    [([b"1", b"-2", None], "int64"), ([b"1", b"2.5"], "float"), ([b"1", b"x"], "bytes"), ([b"1", b""], "bytes"),
     ([b"1e5"], "float"), ([b"9223372036854775808"], "bytes"), ([b"nan", b"1"], "float"), ([None, None], "bytes"),
     ([b"0x1"], "bytes"), ([b"true"], "bytes")],
)
def test_infer_text_type(values, expected):
    assert infer_text_type(pa.array(values, pa.binary())) == expected


def test_inference_and_conversion_use_the_same_parser():
    sample = text([b"1", b"2"])
    resolved = resolve_spec(FeatureSpec("x", None, "x"), pa.binary(), text_sample=sample, infer_from_text=True)
    assert resolved.type == "int64"
    later = convert({"x": text([b"3", b"4.5"])}, resolved)  # a later value of another type: a bad row
    assert later.batch.column("x").to_pylist() == [3]
    assert "is not an int64" in later.bad_rows[0].reason


def test_infer_spec_from_arrow_types():
    assert infer_spec("a", pa.int32(), nullable=False) == FeatureSpec("a", "int64", "a", on_null="error")
    assert infer_spec("a", pa.bool_()).type == "int64"
    assert infer_spec("a", pa.float16()).type == "float"
    assert infer_spec("a", pa.large_string()).type == "bytes"
    assert infer_spec("a", pa.list_(pa.float32())).shape is None
    assert infer_spec("a", pa.list_(pa.int64(), 4)).shape == (4,)
    assert infer_spec("a", pa.dictionary(pa.int32(), pa.string())).type == "bytes"


@pytest.mark.parametrize(
    "arrow_type, message",
    [
        (
            pa.timestamp("us"),
            "column 'ts' has Arrow type timestamp[us], which has no Example feature mapping without a "
            "declared type: declare it, e.g. features: {ts: {type: int64}} (the stored count of the "
            "type's unit since the epoch) or {type: bytes} (ISO 8601 text)",
        ),
        (pa.date32(), "features: {ts: {type: int64}} (the stored count of days since the epoch)"),
        (
            pa.decimal128(10, 2),
            "declare it, e.g. features: {ts: {type: float}} (rounded to 32-bit float) or {type: bytes} (exact decimal text)",
        ),
        (
            pa.struct([("a", pa.int64()), ("b", pa.string())]),
            "map its fields one by one with a dotted source, e.g. features: {ts_a: {type: ..., source: ts.a}} (fields: a, b)",
        ),
        (pa.map_(pa.string(), pa.int64()), "a map has no Example mapping"),
        (pa.list_(pa.list_(pa.int64())), "a nested list is a tensor feature only with a fixed shape: declare it"),
        (pa.null(), "every value is null; declare its type, e.g. features: {ts: {type: float, on_null: omit}}"),
        (pa.list_(pa.null()), "every list item is null; declare the item type"),
    ],
)
def test_unmappable_types_name_column_type_and_the_config_that_maps_them(arrow_type, message):
    with pytest.raises(ArrowConversionError) as caught:
        resolve_spec(FeatureSpec("ts", None, "ts"), arrow_type)
    assert message in str(caught.value)
    assert f"column 'ts' has Arrow type {arrow_type}" in str(caught.value)


@pytest.mark.parametrize(
    "declared, arrow_type, message",
    [
        (
            "int64",
            pa.float64(),
            "type int64 does not fit column 'x' of Arrow type double: a float column is never cast "
            "to int64 (that would silently drop fractions); declare type: float",
        ),
        (
            "float",
            pa.timestamp("s"),
            "type float does not fit column 'x' of Arrow type timestamp[s]: allowed for it: int64, bytes",
        ),
        ("int64", pa.decimal128(5, 2), "allowed for it: float, bytes"),
    ],
)
def test_declared_types_that_do_not_fit(declared, arrow_type, message):
    with pytest.raises(ArrowConversionError, match="does not fit") as caught:
        resolve_spec(FeatureSpec("x", declared, "x"), arrow_type)
    assert message in str(caught.value)


def test_resolve_spec_checks_separator_and_length_against_the_column():
    with pytest.raises(ArrowConversionError, match="separator needs a string column, but column 'x' has Arrow type int64"):
        resolve_spec(FeatureSpec("x", "int64", "x", separator=";", is_list=True), pa.int64())
    with pytest.raises(ArrowConversionError, match="length needs a separator or a list column"):
        resolve_spec(FeatureSpec("x", "float", "x", length=3, is_list=True), pa.float64())
    resolved = resolve_spec(FeatureSpec("x", None, "x", separator=";", is_list=True), pa.binary(),
                            text_sample=text([b"1.5;2", b""]), infer_from_text=True)
    assert (resolved.type, resolved.shape) == ("float", None)
    assert output_type(resolved) == pa.list_(pa.float32())


def test_struct_sources_and_dotted_names():
    schema = pa.schema([("s", pa.struct([("a", pa.struct([("b", pa.int32())]))])), ("x.y", pa.string())])
    assert source_type(schema, "s.a.b") == pa.int32()
    assert source_column(schema, "s.a.b") == "s"
    assert source_type(schema, "x.y") == pa.string() and source_column(schema, "x.y") == "x.y"
    assert source_type(schema, "s.zz") is None and source_column(schema, "nope") is None


def test_timestamp_text_becomes_int64_since_the_epoch():
    iso = FeatureSpec("t", "int64", "t", time_unit="s")
    result = convert({"t": text(["2013-01-01 05:00:00", "2013-01-01T00:00:00Z", "2013-01-01T01:00:00+01:00",
                                 "2013-01-02", "01/02/2013", "2013-01-01T00:00:00.5"])}, iso)
    assert result.batch.column("t").to_pylist() == [1357016400, 1356998400, 1356998400, 1357084800]
    assert [(bad.line, bad.reason) for bad in result.bad_rows] == [
        (6, "feature 't': '01/02/2013' is not an ISO 8601 timestamp (set format, e.g. format: \"%d/%m/%Y\")"),
        (7, "feature 't': '2013-01-01T00:00:00.5' is not an ISO 8601 timestamp in whole s (use a finer unit: ms, us or ns)")]
    millis = FeatureSpec("t", "int64", "t", time_unit="ms", time_format="%d/%m/%Y %H:%M")
    result = convert({"t": text(["02/01/2013 10:30", "2013-01-02"])}, millis)
    assert result.batch.column("t").to_pylist() == [1357122600000]
    assert result.bad_rows[0].reason == "feature 't': '2013-01-02' does not match format '%d/%m/%Y %H:%M'"


def test_timestamp_type_on_typed_columns_converts_the_unit():
    spec_ms = FeatureSpec("t", "int64", "t", time_unit="ms", on_null="omit")
    stamps = pa.array([datetime.datetime(2013, 1, 1, 0, 0, 1), None], pa.timestamp("us"))
    result = convert({"t": stamps}, spec_ms)
    assert result.batch.column("t").to_pylist() == [1356998401000, None]
    days = convert({"t": pa.array([datetime.date(1970, 1, 2)], pa.date32())}, FeatureSpec("t", "int64", "t", time_unit="s"))
    assert days.batch.column("t").to_pylist() == [86400]
    with pytest.raises(ArrowConversionError, match="type timestamp needs a text, timestamp or date column"):
        resolve_spec(FeatureSpec("t", "int64", "t", time_unit="s"), pa.float64())


def test_true_and_false_values_are_1_and_0_in_number_features():
    batch = pa.record_batch({"b": text(["TRUE", "FALSE", "1", "yes"]), "s": text(["TRUE", "x", "y", "z"])})
    specs = (FeatureSpec("b", "int64", "b"), FeatureSpec("f", "float", "b"), FeatureSpec("s", "bytes", "s"))
    result = convert_batch(batch, specs, BatchProvenance("in.csv", batch, first_line=2),
                           true_values=("TRUE",), false_values=("FALSE",))
    assert result.batch.column("b").to_pylist() == [1, 0, 1]
    assert result.batch.column("f").to_pylist() == [1.0, 0.0, 1.0]
    assert result.batch.column("s").to_pylist() == [b"TRUE", b"x", b"y"]  # bytes stay text
    assert "'yes' is not an int64" in result.bad_rows[0].reason
    assert infer_text_type(text(["TRUE", "FALSE"]), true_values=("TRUE",), false_values=("FALSE",)) == "int64"
    assert infer_text_type(text(["TRUE", "FALSE"])) == "bytes"
