"""The round-trip property of a build: what TF-free reading gives back is what the input says, or the build
fails in one line. No third outcome (issue 24's proof), over generated CSV and Parquet files.

Each example runs a real build (the FnApiRunner, in this process) with inferred features, then reads
every shard back and checks every cell against the input by the documented rules: integers exact,
floats narrowed to float32, text as its UTF-8 bytes, a null token or null as an absent feature.
"""

from __future__ import annotations

import csv
import glob
import io
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tfrbeam.builder.config import load_config
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.example import decode_example
from tfrbeam.tfrecord.records import read_records

PROPERTY = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_INT64 = st.integers(-(2**63), 2**63 - 1)
_FLOATS = st.floats(-1e30, 1e30, allow_nan=False, allow_infinity=False, width=64)
_TEXT = st.text(st.sampled_from(list("abcXYZ019 ,;|\"'é-_.")), max_size=8)
_CODE = st.integers(0, 99999).map(lambda number: f"{number:05d}")  # ZIP-like: a leading zero is kept as text

_CELL = {
    "int": _INT64.map(str),
    "float": _FLOATS.map(repr),
    "text": _TEXT,
    "code": _CODE,
    "bigint": st.integers(2**63, 2**70).map(str),  # beyond int64: must stay text, never a rounded float
    "word": st.sampled_from(["NA", "na", "N/A", "none", "-", "x"]),
}


@st.composite
def csv_tables(draw) -> tuple[list[str], list[list[str]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(_CELL)), min_size=1, max_size=4))
    rows = draw(st.integers(1, 40))
    columns = []
    for kind in kinds:
        cells = draw(st.lists(_CELL[kind], min_size=rows, max_size=rows))
        holes = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
        columns.append(["" if hole and draw(st.booleans()) else cell for cell, hole in zip(cells, holes)])
    names = [f"{kind}_{index}" for index, kind in enumerate(kinds)]
    return ["row_id", *names], [[str(row), *(column[row] for column in columns)] for row in range(rows)]


def _build(tmp_path, input_path: str, fmt: str) -> tuple[int, str, dict[int, dict]]:
    config = tmp_path / "build.yaml"
    config.write_text(f"input: {{format: {fmt}, path: '{input_path}'}}\n"
                      f"splits: {{train: 1.0}}\n"
                      f"output: {{path: '{tmp_path / 'out'}', num_shards: 2}}\n")
    code = build_main([str(config), "--quiet"])
    records: dict[int, dict] = {}
    for path in sorted(glob.glob(str(tmp_path / "out" / "*" / "*.tfrecord"))):
        for record in read_records(path):
            example = decode_example(record)
            records[example["row_id"][0]] = example
    return code, str(config), records


def _one_line_failure(capsys, code: int) -> None:
    event("the build failed in one line")
    err = capsys.readouterr().err
    assert code in (1, 2), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err


def _float32(value: float) -> float:
    return float(np.float32(value))


def _expected_cell(text: str, spec, null_tokens) -> list | None:
    """What the feature holds for this CSV cell by the documented rules; None for an absent feature."""
    if text in null_tokens:
        if spec.on_null == "omit":
            return None
        assert spec.on_null == "default", spec
        return [spec.default]
    if spec.type == "bytes":
        return [text.encode("utf-8")]
    if spec.type == "int64":
        assert str(int(text)) == text, f"{text!r} read as the number {int(text)} says something else"
        return [int(text)]
    assert spec.type == "float", spec
    if text.lstrip("-").isdigit():
        assert -(2**63) <= int(text) < 2**63, f"{text!r} (an integer beyond int64) read as a rounded float"
    return [_float32(float(text))]


@PROPERTY
@given(table=csv_tables())
def test_a_generated_csv_reads_back_as_it_says_or_fails_in_one_line(tmp_path_factory, capsys, table):
    tmp_path = tmp_path_factory.mktemp("csv")
    header, rows = table
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([header, *rows])
    data = tmp_path / "data.csv"
    data.write_text(text.getvalue(), encoding="utf-8")
    code, config_path, records = _build(tmp_path, str(data), "csv")
    if code != 0:
        _one_line_failure(capsys, code)
        assert not os.path.exists(tmp_path / "out" / "tfrbeam_dataset.json")
        return
    config = resolve_config(load_config(config_path))
    assert sorted(records) == list(range(len(rows)))  # records in = records out
    for spec in config.features:
        if spec.name == "row_id":
            continue
        column = header.index(spec.source)
        tokens = spec.null_values if spec.null_values is not None else config.input.csv.null_values
        for row in rows:
            expected = _expected_cell(row[column], spec, tokens)
            got = records[int(row[0])].get(spec.name)
            assert got == expected, (spec, row[column], got)


_PARQUET_COLUMNS = {
    "int": (pa.int64(), _INT64),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "double": (pa.float64(), _FLOATS),
    "text": (pa.string(), _TEXT),
    "ints": (pa.list_(pa.int64()), st.lists(_INT64, max_size=3)),
    "words": (pa.list_(pa.string()), st.lists(_TEXT, max_size=3)),
}


@st.composite
def parquet_tables(draw) -> pa.Table:
    kinds = draw(st.lists(st.sampled_from(sorted(_PARQUET_COLUMNS)), min_size=1, max_size=4))
    rows = draw(st.integers(1, 40))
    columns = {"row_id": pa.array(range(rows), pa.int64())}
    for index, kind in enumerate(kinds):
        arrow_type, values = _PARQUET_COLUMNS[kind]
        cells = draw(st.lists(st.one_of(st.none(), values), min_size=rows, max_size=rows))
        columns[f"{kind}_{index}"] = pa.array(cells, arrow_type)
    return pa.table(columns)


def _expected_value(value, arrow_type: pa.DataType) -> list | None:
    if value is None:
        return None
    if pa.types.is_list(arrow_type):
        return [item for cell in value for item in _expected_value(cell, arrow_type.value_type) or []]
    if pa.types.is_string(arrow_type):
        return [value.encode("utf-8")]
    if pa.types.is_floating(arrow_type):
        return [_float32(value)]
    return [value]


@PROPERTY
@given(table=parquet_tables())
def test_a_generated_parquet_file_reads_back_as_it_says_or_fails_in_one_line(tmp_path_factory, capsys, table):
    tmp_path = tmp_path_factory.mktemp("parquet")
    pq.write_table(table, tmp_path / "data.parquet")
    code, _, records = _build(tmp_path, str(tmp_path / "data.parquet"), "parquet")
    if code != 0:
        _one_line_failure(capsys, code)
        return
    assert sorted(records) == list(range(table.num_rows))
    for name in table.column_names[1:]:
        arrow_type = table.schema.field(name).type
        for row_id, value in enumerate(table.column(name).to_pylist()):
            expected = _expected_value(value, arrow_type)
            got = records[row_id].get(name)
            if expected is None or (pa.types.is_list(arrow_type) and expected == [] and got is None):
                assert got is None or got == [], (name, value, got)  # a null (or an empty list): no values
            else:
                assert got == expected, (name, value, got)
                assert all(not isinstance(item, float) or not math.isnan(item) for item in got)


def test_the_oracle_itself_catches_a_changed_value(tmp_path):
    """A check that cannot fail is no check: a ZIP code read as a number is caught by _expected_cell."""
    from tfrbeam.builder.features.convert import FeatureSpec

    assert _expected_cell("02134", FeatureSpec("z", "bytes", "z"), ("",)) == [b"02134"]
    with pytest.raises(AssertionError, match="says something else"):
        _expected_cell("02134", FeatureSpec("z", "int64", "z"), ("",))
    with pytest.raises(AssertionError, match="beyond int64"):
        _expected_cell("12345678901234567890", FeatureSpec("z", "float", "z"), ("",))
    assert _expected_cell("16777217", FeatureSpec("f", "float", "f"), ("",)) == [16777216.0]
