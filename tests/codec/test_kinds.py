"""Every Arrow type of the one type table goes through every path that converts Arrow data the same way."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tfrbeam.build.features import BatchProvenance, convert_batch, infer_spec, resolve_spec
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.encode import encode_record_batch, feature_kind
from tfrbeam.codec.example import decode_example
from tfrbeam.codec.kinds import EXAMPLE_TYPES, plain_list

PLAIN = {"int64": [3, -1], "float": [0.5, 2.0], "bytes": [b"ab", b"cd"]}


def _values(arrow_type: pa.DataType) -> pa.Array:
    """Two rows of ``arrow_type`` (lists: one list of two items, one null row)."""
    if pa.types.is_dictionary(arrow_type):
        return pa.array(["ab", "cd"]).dictionary_encode().cast(arrow_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type) \
            or pa.types.is_list_view(arrow_type) or pa.types.is_large_list_view(arrow_type):
        item = _values(arrow_type.value_type).to_pylist()
        return pa.array([item, None], arrow_type)
    if pa.types.is_fixed_size_binary(arrow_type):
        return pa.array([b"abc", b"def"], arrow_type)
    if pa.types.is_boolean(arrow_type):
        return pa.array([True, False])
    if pa.types.is_integer(arrow_type):
        return pa.array([3, 1], arrow_type)
    if pa.types.is_floating(arrow_type):
        return pa.array([0.5, 2.0], arrow_type)
    return pa.array(["ab", "cd"] if "string" in str(arrow_type) else [b"ab", b"cd"], arrow_type)


@pytest.mark.parametrize("arrow_type", EXAMPLE_TYPES, ids=str)
def test_the_encoder_the_build_and_the_decoder_accept_the_same_types(arrow_type):
    column = _values(arrow_type)
    kind, is_list = feature_kind("x", arrow_type)
    batch = pa.record_batch({"x": column})
    direct = [decode_example(record) for record in encode_record_batch(batch).to_list()]
    spec = resolve_spec(infer_spec("x", arrow_type), arrow_type)
    converted = convert_batch(batch, [spec], BatchProvenance("<test>", batch))
    assert not converted.bad_rows
    built = [decode_example(record) for record in encode_record_batch(converted.batch).to_list()]
    assert built == direct  # the build converts each type to the same Example values the encoder writes
    schema = pa.schema([pa.field("x", arrow_type)])
    decoded = examples_to_record_batch(encode_record_batch(batch).to_list(), schema=schema)
    assert decoded.column(0).type == arrow_type
    expected = plain_list(column) if is_list else column
    assert decoded.column(0).to_pylist() == expected.to_pylist()
    assert kind in PLAIN


def test_plain_list_keeps_rows_of_a_list_view_with_gaps_and_nulls():
    values = pa.array([10, 11, 12, 13, 14])
    view = pa.ListViewArray.from_arrays(pa.array([3, 0, 1], pa.int32()), pa.array([2, 1, 0], pa.int32()), values,
                                        mask=pa.array([False, False, True]))
    plain = plain_list(view)
    assert plain.type == pa.list_(pa.int64()) and plain.to_pylist() == [[13, 14], [10], None]
    plain.validate(full=True)
