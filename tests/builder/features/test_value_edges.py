"""Values at the edges of what a feature type holds: float32's largest value, timestamps with zero fractions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tfrbeam.builder.config import parse_config
from tfrbeam.builder.features.convert import BatchProvenance, FeatureSpec, convert_batch
from tfrbeam.errors import ConfigError


def convert(values: list[str], spec: FeatureSpec):
    batch = pa.record_batch({spec.source: pa.array(values, pa.binary())})
    return convert_batch(batch, [spec], BatchProvenance("in.csv", batch, first_line=2))


def test_float32_max_as_numpy_prints_it_is_float32_max_and_one_step_beyond_is_refused():
    spec = FeatureSpec("f", "float", "f")
    shortest = str(np.finfo(np.float32).max)  # "3.4028235e+38"
    result = convert([shortest, "3.4028235e38", "-3.4028235e38", "3.4028236e38", "inf"], spec)
    values = result.batch.column("f").to_pylist()
    big = float(np.finfo(np.float32).max)
    assert values == [big, big, -big, float("inf")]  # the bad row is left out; a spelled-out infinity is a value
    assert [(bad.line, bad.reason) for bad in result.bad_rows] == [
        (5, "feature 'f': '3.4028236e38' is beyond the float32 range (Example floats are 32-bit)")]


@pytest.mark.parametrize(("unit", "text", "expected"), [
    ("s", "2020-01-01T00:00:00.000", 1577836800),
    ("s", "2020-01-01T00:00:01.000Z", 1577836801),
    ("s", "2020-01-01 00:00:00.0+01:00", 1577833200),
    ("ms", "2020-01-01T00:00:00.123000", 1577836800123),
    ("us", "2020-01-01T00:00:00.000001000Z", 1577836800000001),
])
def test_zero_fraction_digits_finer_than_the_unit_are_whole_units(unit, text, expected):
    result = convert([text], FeatureSpec("t", "int64", "t", time_unit=unit))
    assert result.bad_rows == []
    assert result.batch.column("t").to_pylist() == [expected]


def test_a_nonzero_fraction_finer_than_the_unit_is_still_a_bad_row():
    result = convert(["2020-01-01T00:00:00.500"], FeatureSpec("t", "int64", "t", time_unit="s"))
    assert [bad.reason for bad in result.bad_rows] == [
        "feature 't': '2020-01-01T00:00:00.500' is not an ISO 8601 timestamp in whole s (use a finer unit: ms, us or ns)"]


@pytest.mark.parametrize(("written", "suggestion"), [
    ("byte", "did you mean 'bytes'?"), ("int46", "did you mean 'int64'?"), ("floats", "did you mean 'float'?"),
    ("timestmp", "did you mean 'timestamp'?"), ("string", "use bytes"),
])
def test_a_mistyped_feature_type_gets_a_suggestion(written, suggestion):
    raw = {"input": {"format": "csv", "path": "x.csv"}, "output": {"path": "out"}, "features": {"a": {"type": written}}}
    with pytest.raises(ConfigError) as refused:
        parse_config(raw)
    assert f"features.a.type: {written!r} is not one of int64, float, bytes, timestamp; {suggestion}" in str(refused.value)
