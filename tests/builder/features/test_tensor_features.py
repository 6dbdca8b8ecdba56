"""Tensor features: nested fixed-size lists, fixed_shape_tensor columns and declared shapes become flat values with
their shape; a value whose lists do not have the shape's sizes is a bad row naming the row and feature."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.builder.features.convert import (
    BatchProvenance,
    FeatureSpec,
    convert_batch,
    infer_schema_features,
    resolve_spec,
)
from tfrbeam.errors import ArrowConversionError

IMAGES = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)


def nested_fixed(values: np.ndarray) -> pa.Array:
    return pa.array(values.tolist(), pa.list_(pa.list_(pa.float32(), values.shape[2]), values.shape[1]))


def tensor_column(values: np.ndarray) -> pa.Array:
    return pa.FixedShapeTensorArray.from_numpy_ndarray(values)


def converted(column: pa.Array, spec: FeatureSpec):
    batch = pa.record_batch({spec.source: column})
    resolved = resolve_spec(spec, column.type)
    return resolved, convert_batch(batch, [resolved], BatchProvenance("in.parquet", batch))


@pytest.mark.parametrize("make", [nested_fixed, tensor_column], ids=["nested_fixed_size_list", "fixed_shape_tensor"])
def test_a_fixed_shape_column_is_a_tensor_feature_of_flat_values(make):
    column = make(IMAGES)
    [(spec, _)], notes = infer_schema_features(pa.schema([pa.field("image", column.type)]), ["image"])
    assert not notes
    assert (spec.type, spec.shape, spec.length) == ("float", (2, 3), 6)
    resolved, result = converted(column, FeatureSpec("image", None, "image"))
    assert resolved.shape == (2, 3)
    assert not result.bad_rows
    flat = np.asarray(result.batch.column("image").flatten()).reshape(IMAGES.shape)
    np.testing.assert_array_equal(flat, IMAGES)


def test_a_declared_shape_takes_a_ragged_nested_list_and_makes_a_wrong_sized_value_a_bad_row():
    rows = [[[1, 2, 3], [4, 5, 6]], [[1, 2], [3, 4, 5, 6]], [[1, 2, 3]], [[1, 2, 3], None]]
    column = pa.array(rows, pa.list_(pa.list_(pa.int64())))
    resolved, result = converted(column, FeatureSpec("grid", None, "grid", tensor_shape=(2, 3)))
    assert resolved.shape == (2, 3) and resolved.type == "int64"
    assert result.batch.column("grid").to_pylist() == [[1, 2, 3, 4, 5, 6]]
    reasons = {bad.line: bad.reason for bad in result.bad_rows}
    assert reasons == {
        2: "feature 'grid': a list at depth 2 holds 2 values, but shape [2, 3] needs 3 there",
        3: "feature 'grid': a list at depth 1 holds 1 values, but shape [2, 3] needs 2 there",
        4: "feature 'grid': a list at depth 2 is null (a tensor's lists cannot be)",
    }
    assert all(bad.describe().startswith("in.parquet:") for bad in result.bad_rows)


def test_a_flat_list_with_a_declared_shape_is_never_reshaped_when_its_size_differs():
    column = pa.array([list(range(6)), list(range(5))], pa.list_(pa.int64()))
    _, result = converted(column, FeatureSpec("x", None, "x", tensor_shape=(2, 3)))
    assert [bad.describe() for bad in result.bad_rows] == [
        "in.parquet:2: feature 'x': has 5 values, but shape [2, 3] holds 6 (values are never reshaped)"]


def test_a_nested_list_without_fixed_sizes_needs_a_declared_shape():
    with pytest.raises(ArrowConversionError, match=r"declare it, e.g. features: \{grid: \{shape: \[2, 3\]\}\}"):
        resolve_spec(FeatureSpec("grid", None, "grid"), pa.list_(pa.list_(pa.int64())))


def test_a_declared_shape_must_fit_the_column_type():
    with pytest.raises(ArrowConversionError, match="one size per level"):
        resolve_spec(FeatureSpec("g", None, "g", tensor_shape=(6,)), pa.list_(pa.list_(pa.int64(), 3), 2))
    with pytest.raises(ArrowConversionError, match="one size per level"):
        resolve_spec(FeatureSpec("g", None, "g", tensor_shape=(3, 2)), pa.fixed_shape_tensor(pa.float32(), [2, 3]))
    with pytest.raises(ArrowConversionError, match="holds 4 values, but every value"):
        resolve_spec(FeatureSpec("g", None, "g", tensor_shape=(2, 2)), pa.list_(pa.float32(), 6))
    with pytest.raises(ArrowConversionError, match="shape needs a list"):
        resolve_spec(FeatureSpec("g", None, "g", tensor_shape=(2, 2)), pa.float32())
    with pytest.raises(ArrowConversionError, match="permutation"):
        resolve_spec(FeatureSpec("g", None, "g"), pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0]))


def test_a_tensor_type_made_by_name_has_no_permutation_and_is_row_major(tmp_path):
    """``pa.fixed_shape_tensor(type, shape)`` (as pyarrow reads one back from Parquet) has permutation None: row-major,
    not a TypeError from comparing None."""
    storage = pa.array([[0.5, 1.5, 2.5, 3.5], [4.0, 5.0, 6.0, 7.0]], pa.list_(pa.float32(), 4))
    column = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 2]), storage)
    assert column.type.permutation is None
    tfrbeam.write_dataset(pa.table({"x": column}), str(tmp_path / "ds"), num_shards=1, shuffle=False, progress=False)
    manifest = json.loads((tmp_path / "ds" / "tfrbeam_dataset.json").read_text())
    assert manifest["features"]["x"]["shape"] == [2, 2]
