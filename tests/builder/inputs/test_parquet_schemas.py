"""Parquet inputs whose files disagree: lossless widening is noted, anything else (and duplicate names) fails at plan time."""

from __future__ import annotations

import logging
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tfrbeam.builder.config.schema import InputConfig
from tfrbeam.builder.inputs.files import list_inputs
from tfrbeam.builder.inputs.parquet import widened_type
from tfrbeam.builder.inputs.sample import inspect_input
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.main import main as tfrbeam_main
from tfrbeam.errors import ParquetSchemaError


def write_config(tmp_path: pathlib.Path, glob: str) -> str:
    config = tmp_path / "build.yaml"
    config.write_text(f'input: {{format: parquet, path: "{glob}"}}\n'
                      f'output: {{path: "{tmp_path / "out"}"}}\nshuffle: {{enabled: false}}\n'
                      "splits: {train: 1.0}\n")
    return str(config)


@pytest.fixture
def no_data_reads(monkeypatch):
    """Fail any read of row data: the schema checks read footers only."""
    def refuse(*args, **kwargs):
        raise AssertionError("row data was read")
    for name in ("iter_batches", "read", "read_row_group", "read_row_groups"):
        monkeypatch.setattr(pq.ParquetFile, name, refuse)


def the_measured_pair(tmp_path: pathlib.Path) -> tuple[str, str]:
    """The files of the issue: a holds int32, double, string; b holds int64 in all three columns."""
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "v": [1.5, 2.5], "s": ["x", "y"]}), a)
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "v": pa.array([4]), "s": pa.array([7])}), b)
    return a, b


def test_a_type_change_across_files_fails_the_build_in_one_line_before_the_pipeline(tmp_path, capsys, no_data_reads):
    a, b = the_measured_pair(tmp_path)
    code = build_main([write_config(tmp_path, str(tmp_path / "*.parquet")), "--quiet"])
    error = capsys.readouterr().err
    assert code == 1
    lines = error.strip().splitlines()
    assert len(lines) == 1, error
    # v is the first column that cannot widen (id int32 -> int64 can): both files, the column, both types.
    assert f"{b}: column 'v' is int64 but {a} has it as double" in lines[0]
    assert not (tmp_path / "out").exists()


def test_infer_config_on_the_glob_fails_in_the_same_line(tmp_path, capsys, no_data_reads):
    a, b = the_measured_pair(tmp_path)
    assert tfrbeam_main(["infer-config", str(tmp_path / "*.parquet")]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert f"{b}: column 'v' is int64 but {a} has it as double" in error


def test_input_columns_leave_a_conflicting_column_out_of_the_check(tmp_path):
    a, b = the_measured_pair(tmp_path)
    config = InputConfig(format="parquet", path=str(tmp_path / "*.parquet"), columns=("id",))
    assert [item.path for item in list_inputs(config.path)] == [a, b]
    assert inspect_input(config).schema.field("id").type == pa.int64()
    with pytest.raises(ParquetSchemaError, match=r"column 's' is int64 but .*a\.parquet has it as string"):
        inspect_input(InputConfig(format="parquet", path=str(tmp_path / "*.parquet"), columns=("id", "s")))


def test_a_listed_column_missing_from_one_file_fails_at_plan_time(tmp_path, no_data_reads):
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [1], "s": ["x"]}), a)
    pq.write_table(pa.table({"id": [2]}), b)
    config = InputConfig(format="parquet", path=str(tmp_path / "*.parquet"), columns=("id", "s"))
    with pytest.raises(ParquetSchemaError, match=rf"{b}: has no column 's' \({a} has it as string\)"):
        inspect_input(config)


WIDENED = {  # column: (type in a.parquet, type in b.parquet, values of a, values of b)
    "i": (pa.int32(), pa.int64(), [1, -2], [2**40]),
    "u": (pa.uint32(), pa.int64(), [4_000_000_000, 0], [-5]),
    "f": (pa.float32(), pa.float64(), [0.5, 1.5], [2.25]),
    "s": (pa.string(), pa.large_string(), ["x", "y"], ["z"]),
    "b": (pa.large_binary(), pa.binary(), [b"\x00", b"\x01"], [b"\x02"]),
    "d": (pa.dictionary(pa.int32(), pa.string()), pa.string(), ["p", "q"], ["r"]),
    "l": (pa.list_(pa.int32()), pa.large_list(pa.int64()), [[1, 2], []], [[3]]),
}


def test_lossless_widenings_build_and_each_is_logged_with_its_file(tmp_path, capsys, caplog):
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    for path, side in ((a, 0), (b, 1)):
        arrays = [pa.array(spec[2 + side], spec[side]) for spec in WIDENED.values()]
        pq.write_table(pa.Table.from_arrays(arrays, names=list(WIDENED)), path)
    with caplog.at_level(logging.INFO, logger="tfrbeam"):
        assert build_main([write_config(tmp_path, str(tmp_path / "*.parquet"))]) == 0
    notes = [record.getMessage() for record in caplog.records if "lossless widening" in record.getMessage()]
    assert f"{a}: column 'i' is int32, read as int64 as in {b} (lossless widening)" in notes
    assert f"{a}: column 'u' is uint32, read as int64 as in {b} (lossless widening)" in notes
    assert f"{a}: column 'f' is float, read as double as in {b} (lossless widening)" in notes
    assert f"{a}: column 's' is string, read as large_string as in {b} (lossless widening)" in notes
    assert f"{b}: column 'b' is binary, read as large_binary as in {a} (lossless widening)" in notes
    assert f"{a}: column 'd' is dictionary<values=string, indices=int32, ordered=0>, read as string as in {b} " \
           "(lossless widening)" in notes
    assert f"{a}: column 'l' is list<element: int32>, read as large_list<element: int64> as in {b} (lossless widening)" in notes
    assert len(notes) == 7
    rows = pa.Table.from_batches(list(tfrbeam.open_dataset(str(tmp_path / "out"), "train", output="arrow"))).to_pylist()
    assert [row["i"] for row in rows] == [1, -2, 2**40]
    assert [row["u"] for row in rows] == [4_000_000_000, 0, -5]
    assert [row["f"] for row in rows] == [0.5, 1.5, 2.25]
    assert [row["s"] for row in rows] == [b"x", b"y", b"z"]
    assert [row["b"] for row in rows] == [b"\x00", b"\x01", b"\x02"]
    assert [row["d"] for row in rows] == [b"p", b"q", b"r"]
    assert [row["l"] for row in rows] == [[1, 2], [], [3]]


@pytest.mark.parametrize(("left", "right", "wider"), [
    (pa.int8(), pa.int64(), pa.int64()),
    (pa.uint8(), pa.uint16(), pa.uint16()),
    (pa.uint16(), pa.int32(), pa.int32()),
    (pa.float16(), pa.float64(), pa.float64()),
    (pa.large_string(), pa.string(), pa.large_string()),
    (pa.dictionary(pa.int8(), pa.binary()), pa.dictionary(pa.int32(), pa.large_binary()), pa.large_binary()),
    (pa.large_list(pa.float32()), pa.list_(pa.float64()), pa.large_list(pa.float64())),
    (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.int64())]), pa.struct([("a", pa.int64())])),
    (pa.int64(), pa.uint64(), None),  # either way loses values
    (pa.int32(), pa.uint32(), None),
    (pa.int64(), pa.float64(), None),
    (pa.string(), pa.binary(), None),
    (pa.list_(pa.int64()), pa.int64(), None),
    (pa.list_(pa.int64()), pa.list_(pa.string()), None),
    (pa.struct([("a", pa.int32())]), pa.struct([("b", pa.int32())]), None),
    (pa.timestamp("ms"), pa.timestamp("us"), None),
])
def test_widened_type_allows_only_lossless_pairs(left, right, wider):
    assert widened_type(left, right) == wider
    assert widened_type(right, left) == wider


def test_duplicate_column_names_fail_the_build_in_one_line_naming_file_and_column(tmp_path, capsys, no_data_reads):
    good, dup = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"x": [1], "y": [2]}), good)
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], names=["x", "y", "x"]), dup)
    assert build_main([write_config(tmp_path, str(tmp_path / "*.parquet")), "--quiet"]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f"{dup}: column 'x' appears 2 times in the schema" in error
    assert "KeyError" not in error
    assert not (tmp_path / "out").exists()


def test_duplicate_column_names_fail_infer_config_and_the_first_file_too(tmp_path, capsys):
    dup = str(tmp_path / "only.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array(["s"])], names=["x", "x"]), dup)
    assert tfrbeam_main(["infer-config", dup]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"{dup}: column 'x' appears 2 times in the schema" in error
    with pytest.raises(ParquetSchemaError, match="appears 2 times"):
        inspect_input(InputConfig(format="parquet", path=dup), files=list_inputs(dup))
