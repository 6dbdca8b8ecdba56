"""The one table of tf.train.Example feature kinds, and of the Arrow types that map to them.

The kinds: their names ("int64", "float", "bytes", as specs and manifests spell them), their
wire codes (the Feature oneof field numbers the decoders use), their Feature field tags, their
Arrow value types and TensorFlow dtypes. Every module that needs one of these imports it from here
(tests/codec/test_kinds.py fails on a copy of the kind -> Arrow type mapping elsewhere in tfrbeam).

The columnar encoder, the build's feature conversion and the columnar decoder (for the types a
schema may ask for) all decide "is this text, bytes, a number, a list?" here, so they accept the
same types: tests/codec/test_kinds.py runs each type of ``EXAMPLE_TYPES`` through all of them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = [
    "ARROW_TYPES", "BYTES", "EXAMPLE_TYPES", "FEATURE_TYPES", "FLOAT", "INT64", "KIND_ARROW_TYPES", "KIND_BYTES",
    "KIND_FLOAT", "KIND_INT64", "KIND_NAMES", "KIND_NONE", "KIND_OF_TYPE", "TF_DTYPES", "WIRE_TAGS",
    "is_binary", "is_bytes", "is_list", "is_list_view", "is_temporal", "is_text", "plain_list", "scalar_kind",
]

types = pa.types

# Feature type names, as feature specs, manifests and ``kinds=`` arguments spell them.
INT64, FLOAT, BYTES = "int64", "float", "bytes"
FEATURE_TYPES: tuple[str, ...] = (INT64, FLOAT, BYTES)

# Wire kinds: the Feature oneof field numbers (bytes_list = 1, float_list = 2, int64_list = 3; 0: no kind set).
KIND_NONE, KIND_BYTES, KIND_FLOAT, KIND_INT64 = 0, 1, 2, 3
KIND_NAMES = {KIND_NONE: "no kind", KIND_BYTES: "bytes_list", KIND_FLOAT: "float_list", KIND_INT64: "int64_list"}
KIND_OF_TYPE: dict[str, int] = {INT64: KIND_INT64, FLOAT: KIND_FLOAT, BYTES: KIND_BYTES}

# Each kind's Arrow value type: what the decoders give and the writers take for its values.
ARROW_TYPES: dict[str, pa.DataType] = {INT64: pa.int64(), FLOAT: pa.float32(), BYTES: pa.binary()}
KIND_ARROW_TYPES: dict[int, pa.DataType] = {KIND_OF_TYPE[name]: ARROW_TYPES[name] for name in FEATURE_TYPES}

# The Feature field tag of each kind's list (field number << 3 | wire type 2, length-delimited).
WIRE_TAGS: dict[str, int] = {name: KIND_OF_TYPE[name] << 3 | 2 for name in FEATURE_TYPES}

# The TensorFlow dtype of each kind, as the manifest and ``tfrbeam`` file tools write it.
TF_DTYPES: dict[str, str] = {INT64: "tf.int64", FLOAT: "tf.float32", BYTES: "tf.string"}


def is_text(arrow_type: pa.DataType) -> bool:
    return types.is_string(arrow_type) or types.is_large_string(arrow_type) or types.is_string_view(arrow_type)


def is_binary(arrow_type: pa.DataType) -> bool:
    return (types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or types.is_binary_view(arrow_type)
            or types.is_fixed_size_binary(arrow_type))


def is_bytes(arrow_type: pa.DataType) -> bool:
    """Text or binary: a ``bytes_list`` feature."""
    return is_text(arrow_type) or is_binary(arrow_type)


def is_list_view(arrow_type: pa.DataType) -> bool:
    return types.is_list_view(arrow_type) or types.is_large_list_view(arrow_type)


def is_list(arrow_type: pa.DataType) -> bool:
    """Any Arrow list layout: list, large_list, fixed_size_list, list_view, large_list_view."""
    return (types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type)
            or is_list_view(arrow_type))


def is_temporal(arrow_type: pa.DataType) -> bool:
    return (types.is_timestamp(arrow_type) or types.is_date(arrow_type) or types.is_time(arrow_type)
            or types.is_duration(arrow_type))


def scalar_kind(arrow_type: pa.DataType) -> str | None:
    """The Example kind ("int64", "float", "bytes") of a scalar Arrow type, or None when it has none."""
    if types.is_dictionary(arrow_type):
        return scalar_kind(arrow_type.value_type)
    if types.is_integer(arrow_type) or types.is_boolean(arrow_type):
        return INT64
    if types.is_floating(arrow_type):
        return FLOAT
    if is_bytes(arrow_type):
        return BYTES
    return None


def plain_list(array: pa.Array) -> pa.Array:
    """A list_view array as the list (or large_list) array with the same rows; any other array as it is.

    (pyarrow 25's own cast from list_view to list builds an invalid array.)
    """
    if not is_list_view(array.type):
        return array
    valid = np.asarray(array.is_valid(), dtype=bool)
    starts = np.asarray(array.offsets, dtype=np.int64)
    counts = np.where(valid, np.asarray(array.sizes, dtype=np.int64), 0)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    index = np.repeat(starts - offsets[:-1], counts) + np.arange(int(offsets[-1]), dtype=np.int64)
    values = array.values.take(pa.array(index, pa.int64()))
    large = types.is_large_list_view(array.type)
    list_class = pa.LargeListArray if large else pa.ListArray
    offset_array = pa.array(offsets, pa.int64() if large else pa.int32())
    return list_class.from_arrays(offset_array, values, mask=pa.array(~valid) if not valid.all() else None)


# Representative Arrow types every converting path accepts (the test runs each one through all of them).
EXAMPLE_TYPES: tuple[pa.DataType, ...] = (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.bool_(),
    pa.float32(), pa.float64(),
    pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(), pa.binary_view(),
    pa.binary(3), pa.dictionary(pa.int32(), pa.string()),
    pa.list_(pa.int64()), pa.large_list(pa.float32()), pa.list_(pa.string(), 2), pa.list_view(pa.int64()),
    pa.large_list_view(pa.string()),
)
