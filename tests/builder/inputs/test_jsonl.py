"""JSON lines inputs: rows and their lines, bad lines as bad rows, the schema from the first file, checked gzip."""

from __future__ import annotations

import gzip
import json
import pathlib

import apache_beam as beam
import pyarrow as pa
import pytest
import yaml
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings, strategies as st

import tfrbeam.builder.inputs.jsonl as jsonl_read
from tfrbeam.builder.config.schema import InputConfig
from tfrbeam.builder.inputs.jsonl import jsonl_schema, read_jsonl_file
from tfrbeam.builder.inputs.read import ReadTabular
from tfrbeam.cli.build import main as build_main

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def rows_and_bad(path: pathlib.Path, schema: pa.Schema = SCHEMA) -> tuple[list, list]:
    rows, bad = [], []
    for source in read_jsonl_file(str(path), schema):
        rows += [(line, row) for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
        bad += [(row.path, row.line, row.reason, row.raw) for row in source.bad_rows]
    return rows, bad


def test_rows_keep_their_physical_lines_and_blank_lines_are_not_rows(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1, "name": "x"}\n\n   \n{"id": 2}\r\n{"name": "z", "id": 3, "extra": [1]}')
    rows, bad = rows_and_bad(path)
    assert rows == [(1, {"id": 1, "name": "x"}), (4, {"id": 2, "name": None}), (5, {"id": 3, "name": "z"})]
    assert bad == []


def test_malformed_lines_are_bad_rows_naming_file_line_and_why(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n{"id": 2,\n[1, 2]\n{"id": "three"}\nnull\n{"id": 6}\n')
    rows, bad = rows_and_bad(path)
    assert rows == [(1, {"id": 1, "name": None}), (6, {"id": 6, "name": None})]
    assert [(line, raw) for _, line, _, raw in bad] == [(2, '{"id": 2,'), (3, "[1, 2]"), (4, '{"id": "three"}'),
                                                         (5, "null")]
    assert all(where == str(path) for where, *_ in bad)
    reasons = [reason for _, _, reason, _ in bad]
    assert reasons[0].startswith("not valid JSON: ")
    assert reasons[1] == "a JSON list, not an object (one object per line)"
    assert reasons[2].startswith("does not fit the schema read from the input's first file: ")
    assert reasons[3] == "a JSON null, not an object (one object per line)"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.just(""), st.just("{broken"), st.integers(-5, 5).map(lambda n: json.dumps({"id": n}))),
                      max_size=60),
       block=st.integers(8, 64))
def test_lines_are_numbered_the_same_across_any_block_size(tmp_path, monkeypatch, lines, block):
    """Blocks cut at any line (and lines longer than a block) give every row and bad row its own line."""
    monkeypatch.setattr(jsonl_read, "_BLOCK_BYTES", block)
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows, bad = rows_and_bad(path)
    assert [(line, row["id"]) for line, row in rows] == [
        (number, json.loads(text)["id"]) for number, text in enumerate(lines, 1) if text.startswith("{\"")]
    assert [line for _, line, _, _ in bad] == [number for number, text in enumerate(lines, 1) if text == "{broken"]


def test_the_schema_is_inferred_from_the_first_lines_and_most_lines_settle_a_conflict(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1, "v": 1.5, "when": "2024-01-02T03:04:05", "tags": ["a"], "nothing": null}\n{oops\n')
    schema = jsonl_schema([str(path)])
    assert schema == pa.schema([("id", pa.int64()), ("v", pa.float64()), ("when", pa.timestamp("s")),
                                ("tags", pa.list_(pa.string())), ("nothing", pa.null())])
    assert jsonl_schema([str(path)], sampled_nulls=True) == pa.schema([
        pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.float64(), nullable=False),
        pa.field("when", pa.timestamp("s"), nullable=False), pa.field("tags", pa.list_(pa.string()), nullable=False),
        ("nothing", pa.null())])
    path.write_text('{"id": 1, "s": "a"}\n{"id": "x", "s": 2}\n{"id": 3, "f": 1}\n{"s": "b", "f": 2.5}\n')
    assert jsonl_schema([str(path)]) == pa.schema([("id", pa.int64()), ("s", pa.string()), ("f", pa.float64())])
    rows, bad = rows_and_bad(path, jsonl_schema([str(path)]))
    assert [line for line, _ in rows] == [1, 3, 4] and [line for _, line, _, _ in bad] == [2]


def _config(tmp_path, input_path, **errors) -> pathlib.Path:
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": str(input_path)}, "output": {"path": str(tmp_path / "out"), "num_shards": 1},
        "features": {"id": {"type": "int64"}}, "errors": errors or {"on_bad_record": "fail"}}))
    return config


def test_a_bad_line_fails_the_build_in_one_line_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3\n')
    assert build_main([str(_config(tmp_path, path)), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:3: not valid JSON" in err, err


def test_dead_letters_hold_the_bad_lines_as_written(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1}\n{"id": true, "x": 2}\n{"id": 3}\n{"id": 4.5}\n')
    config = _config(tmp_path, path, on_bad_record="dead_letter", max_bad_fraction=0.9)
    assert build_main([str(config), "--quiet"]) == 0
    letters = [json.loads(line) for file in sorted((tmp_path / "out" / "_errors").rglob("*")) if file.is_file()
               for line in file.read_text().splitlines()]
    assert sorted((letter["line"], letter["raw"]) for letter in letters) == [(2, '{"id": true, "x": 2}'),
                                                                             (4, '{"id": 4.5}')]
    assert all(letter["file"] == str(path) for letter in letters)
    assert letters[0]["reason"] == ("does not fit the schema read from the input's first file: field 'id' changed "
                                    "from number to boolean")


def test_a_cut_jsonl_gz_is_a_one_line_error_never_a_short_dataset(tmp_path, capsys):
    path = tmp_path / "rows.jsonl.gz"
    data = gzip.compress("".join(json.dumps({"id": n}) + "\n" for n in range(2000)).encode())
    path.write_bytes(data[:len(data) * 2 // 3])
    assert build_main([str(_config(tmp_path, path)), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "the gzip stream ends at compressed byte" in err, err
    assert not (tmp_path / "out").exists()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.just(""), st.just("{broken"), st.integers(-5, 5).map(lambda n: json.dumps({"id": n}))),
                      min_size=1, max_size=40),
       split=st.integers(1, 40), final_break=st.booleans())
def test_byte_ranges_own_the_lines_that_start_in_them(tmp_path, lines, split, final_break):
    """Read range by range (line breaks counted in the ranges before), a file gives what reading it whole gives."""
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + ("\n" if final_break else ""))
    size = path.stat().st_size
    ranged = []
    for start in range(0, size, split):
        before = jsonl_read.count_line_breaks(str(path), 0, start)
        ranged += list(jsonl_read.read_jsonl_range(str(path), start, min(start + split, size), before, SCHEMA))
    whole = list(read_jsonl_file(str(path), SCHEMA))
    flat = [(line, row) for source in ranged for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
    assert flat == [(line, row) for source in whole for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
    assert [(bad.line, bad.raw) for source in ranged for bad in source.bad_rows] == [
        (bad.line, bad.raw) for source in whole for bad in source.bad_rows]


def test_read_tabular_reads_a_large_file_in_ranges_with_its_own_line_numbers(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": n, "name": f"n{n}"}) if n % 50 else "" for n in range(2000)]
    path.write_text("\n".join(lines) + "\n")
    config = InputConfig(format="jsonl", path=str(path), split_bytes=4096)
    read = ReadTabular(config, ["id"])
    with beam.Pipeline() as pipeline:
        batches = pipeline | read
        assert_that(batches | beam.combiners.Count.Globally(), equal_to([len(range(0, path.stat().st_size, 4096))]),
                    label="one batch per range")
        assert_that(batches | beam.FlatMap(lambda source: zip(source.lines.tolist(), source.batch.column("id").to_pylist())),
                    equal_to([(n + 1, n) for n in range(2000) if n % 50]), label="rows")


@pytest.mark.parametrize("text", ["null", "  null", "5", '"text"', "true", "[]"])
def test_a_line_that_is_not_an_object_is_a_bad_row_even_alone_or_first(tmp_path, text):
    """pyarrow reads a null line as a row of nulls (and crashes on one that comes first): none reaches it."""
    for lines in ([text], [text, '{"id": 2}'], ['{"id": 1}', text, '{"id": 3}']):
        path = tmp_path / "a.jsonl"
        path.write_text("\n".join(lines) + "\n")
        rows, bad = rows_and_bad(path)
        assert [line for line, _ in rows] == [number for number, line in enumerate(lines, 1) if line != text]
        assert [(line, raw) for _, line, _, raw in bad] == [(lines.index(text) + 1, text)]
        assert "not an object" in bad[0][2]


def test_the_schema_comes_from_the_first_file_holding_lines(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n  \n")
    (tmp_path / "b.jsonl").write_text('{"id": 7}\n')
    assert jsonl_schema([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == pa.schema([("id", pa.int64())])
    assert jsonl_schema([str(tmp_path / "a.jsonl")]) == pa.schema([])
    config = _config(tmp_path, tmp_path / "*.jsonl")
    assert build_main([str(config), "--quiet"]) == 0
