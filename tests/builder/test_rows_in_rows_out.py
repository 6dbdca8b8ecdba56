"""Rows in = rows out: every row a build is given comes out as an Example (or a bad row), with its values exact.

Issue 42's measured case first: ``write_dataset`` of a chunked table (as ``pyarrow.csv.read_csv``,
Polars and DuckDB give) kept only its first chunk. Then the boundary's own check: each input
announces its rows where the format can say, and a reader that loses rows fails the build in one
line naming the input, with nothing published.
"""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import tfrbeam
from tfrbeam.codec.example import decode_example
from tfrbeam.tfrecord.records import read_records

SPLITS = {"train": 0.8, "eval": 0.2}
CHUNK_ROWS = (11_453, 11_379, 7_168)  # the chunks pyarrow.csv.read_csv gave the 30,000 rows of flight data


def flights(count: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table({"id": ids, "carrier": [f"C{i % 13}" for i in ids], "delay": (ids % 97) * 1.5})


def written(dataset: pathlib.Path) -> list[dict]:
    """Every Example of a dataset, decoded, over its shards in manifest order."""
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return [decode_example(record) for split in manifest["splits"].values() for shard in split["shards"]
            for record in read_records(str(dataset / shard["path"]))]


def shard_files(dataset: pathlib.Path) -> dict[str, bytes]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {shard["path"]: (dataset / shard["path"]).read_bytes()
            for split in manifest["splits"].values() for shard in split["shards"]}


def ids_of(examples: list[dict]) -> list[int]:
    return sorted(int(example["id"][0]) for example in examples)


def test_a_chunked_table_is_written_whole_with_the_shards_of_its_combined_chunks(tmp_path):
    """The issue's measurement: 3 chunks (11,453 / 11,379 / 7,168 rows) wrote 11,453 examples before the fix."""
    starts = np.cumsum((0, *CHUNK_ROWS[:-1]))
    table = pa.concat_tables([flights(count, int(start)) for count, start in zip(CHUNK_ROWS, starts)])
    assert [len(chunk) for chunk in table.column("id").chunks] == list(CHUNK_ROWS)
    result = tfrbeam.write_dataset(table, tmp_path / "chunked", splits=SPLITS, num_shards=2, seed=7, progress=False)
    assert result is not None
    assert result.manifest["rows_read"] == sum(CHUNK_ROWS) == 30_000
    assert sum(result.num_examples.values()) == 30_000
    assert ids_of(written(tmp_path / "chunked")) == list(range(30_000))
    tfrbeam.write_dataset(table.combine_chunks(), tmp_path / "combined", splits=SPLITS, num_shards=2, seed=7,
                          progress=False)
    assert shard_files(tmp_path / "chunked") == shard_files(tmp_path / "combined")


def test_a_table_read_from_csv_in_small_blocks_is_written_whole(tmp_path):
    table = flights(5000)
    text = io.BytesIO()
    pacsv.write_csv(table, text)
    read = pacsv.read_csv(io.BytesIO(text.getvalue()), read_options=pacsv.ReadOptions(block_size=16 << 10))
    assert read.column("id").num_chunks > 3
    result = tfrbeam.write_dataset(read, tmp_path / "csv", splits=SPLITS, num_shards=2, seed=7, progress=False)
    assert result is not None and sum(result.num_examples.values()) == 5000
    assert ids_of(written(tmp_path / "csv")) == list(range(5000))
    tfrbeam.write_dataset(read.combine_chunks(), tmp_path / "combined", splits=SPLITS, num_shards=2, seed=7,
                          progress=False)
    assert shard_files(tmp_path / "csv") == shard_files(tmp_path / "combined")


# ---------------------------------------------------------------------------------- WriteDataset over dicts


def _dicts_build(output: pathlib.Path, rows: list[dict], **settings) -> dict:
    """WriteDataset of dicts on the FnApiRunner (dead letters kept, up to every row bad); returns the manifest."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam import WriteDataset

    options = {"splits": {"train": 1.0}, "num_shards": 1, "seed": 1,
               "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 1.0}, **settings}
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        _ = pipeline | beam.Create(rows, reshuffle=False) | WriteDataset(output, **options)
    return json.loads((output / "tfrbeam_dataset.json").read_text())


def _dead_letters(output: pathlib.Path) -> dict[int, str]:
    letters = [json.loads(line) for path in sorted((output / "_errors").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    return {letter["line"]: letter["reason"] for letter in letters}


def test_a_dict_value_that_does_not_fit_its_type_is_a_bad_row_never_cast(tmp_path):
    """The issue's 5.7 into an int64 feature became 5; every lossy conversion pyarrow's from_pylist makes is a bad row."""
    import datetime

    schema = pa.schema([("id", pa.int64()), ("count", pa.int64()), ("tags", pa.list_(pa.int64())),
                        ("score", pa.float32()), ("when", pa.timestamp("s"))])
    features = {"id": "int64", "count": "int64", "tags": {"type": "int64"}, "score": "float",
                "when": {"type": "int64", "on_null": "omit"}}
    good = {"id": 0, "count": 5, "tags": [1, 2], "score": 0.5, "when": None}
    rows = [good,
            {**good, "id": 1, "count": 5.7},  # a fraction into int64
            {**good, "id": 2, "count": 5.0},  # a whole float: exact, kept
            {**good, "id": 3, "tags": [1.5, 2]},  # a fraction inside a list
            {**good, "id": 4, "score": 1e300},  # beyond float32: would be inf
            {**good, "id": 5, "when": datetime.datetime(2020, 1, 1, 0, 0, 0, 500000)},  # sub-second into seconds
            {**good, "id": 6, "count": True}]  # a bool is not a number (pyarrow refused it already)
    manifest = _dicts_build(tmp_path / "ds", rows, features=features, schema=schema)
    assert manifest["rows_read"] == 7 and manifest["splits"]["train"]["num_examples"] == 2
    reasons = _dead_letters(tmp_path / "ds")
    assert sorted(reasons) == [2, 4, 5, 6, 7]
    assert "'count'" in reasons[2] and "5.7" in reasons[2] and "int64" in reasons[2]
    assert "'tags'" in reasons[4] and "1.5" in reasons[4]
    assert "'score'" in reasons[5] and "float" in reasons[5]
    assert "'when'" in reasons[6]
    counts = sorted(int(example["count"][0]) for example in written(tmp_path / "ds"))
    assert counts == [5, 5]


def test_a_dict_with_a_key_no_feature_names_is_a_bad_row_and_a_missing_key_is_a_null(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("note", pa.string()), ("unused", pa.int64())])
    features = {"id": "int64", "name": "bytes", "note": {"type": "bytes", "on_null": "omit"}}
    rows = [{"id": 1, "name": "a", "note": "x", "unused": 3},  # a key of the schema no feature reads: declared, fine
            {"id": 2, "name": "b", "note": "y", "nmae": "typo"},  # a key the schema does not declare
            {"id": 3, "name": "c"},  # no note: a null, which note omits
            {"id": 4, "note": "z"}]  # no name: a null, which name refuses
    manifest = _dicts_build(tmp_path / "ds", rows, features=features, schema=schema)
    assert manifest["rows_read"] == 4 and manifest["splits"]["train"]["num_examples"] == 2
    reasons = _dead_letters(tmp_path / "ds")
    assert sorted(reasons) == [2, 4]
    assert "'nmae'" in reasons[2] and "not in the schema" in reasons[2]
    examples = {int(example["id"][0]): example for example in written(tmp_path / "ds")}
    assert sorted(examples) == [1, 3] and "note" not in examples[3] and examples[1]["note"] == [b"x"]


# ------------------------------------------------------------------------------------------ pandas index


def test_a_filtered_pandas_frame_leaves_its_index_out_unless_asked(tmp_path):

    frame = flights(40).to_pandas()
    kept_ids = [i for i in range(40) if i % 3 == 0 or i % 7 == 0]
    filtered = frame[(frame["id"] % 3 == 0) | (frame["id"] % 7 == 0)]  # a non-range index: pandas exports it as a column
    assert "__index_level_0__" in pa.Table.from_pandas(filtered).column_names
    for name, data in (("frame", filtered), ("table", pa.Table.from_pandas(filtered))):
        result = tfrbeam.write_dataset(data, tmp_path / name, splits={"train": 1.0}, seed=3, progress=False)
        assert result is not None
        assert sorted(result.manifest["features"]) == ["carrier", "delay", "id"], name
        examples = written(tmp_path / name)
        assert len(examples) == len(kept_ids) and all(sorted(example) == ["carrier", "delay", "id"] for example in examples)
    kept = tfrbeam.write_dataset(filtered, tmp_path / "kept", splits={"train": 1.0}, seed=3, keep_index=True,
                                 progress=False)
    assert kept is not None and "__index_level_0__" in kept.manifest["features"]
    assert sorted(int(example["__index_level_0__"][0]) for example in written(tmp_path / "kept")) == kept_ids


# ------------------------------------------------------------------------- the boundary's own check, under a fault


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def _build(tmp_path: pathlib.Path, path: pathlib.Path, fmt: str, **input_settings):
    from tfrbeam.builder.running.launch import run

    config = {"input": {"path": str(path), "format": fmt, **input_settings}, "output": {"path": str(tmp_path / "out")},
              "splits": {"train": 1.0}}
    return run(config, progress=False)


def _losing(reader, lost: int = 1):
    """A reader that gives every batch it reads but the last ``lost`` rows of its first one: the fault the check is for."""
    def read(*args, **kwargs):
        for number, source in enumerate(reader(*args, **kwargs)):
            yield source.rows(0, source.num_rows - lost) if number == 0 else source
    return read


def test_a_parquet_reader_that_loses_rows_fails_the_build_in_one_line_and_publishes_nothing(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from tfrbeam.builder.inputs import read
    from tfrbeam.errors import RowCountError

    pq.write_table(flights(3000), tmp_path / "rows.parquet", row_group_size=1000)
    monkeypatch.setattr(read, "read_parquet_row_group", _losing(read.read_parquet_row_group))
    with pytest.raises(RowCountError) as caught:  # before the fix the build published 2999 rows
        _build(tmp_path, tmp_path / "rows.parquet", "parquet")
    text = _one_line(caught.value)
    assert text.startswith(f"{tmp_path / 'rows.parquet'}: row group ") and "announces 1000 rows" in text, text
    assert "gave 999" in text and "nothing was published" in text, text
    assert not (tmp_path / "out" / "tfrbeam_dataset.json").exists()


def test_a_csv_reader_that_loses_rows_fails_the_build_in_one_line_and_publishes_nothing(tmp_path, monkeypatch):
    from tfrbeam.builder.inputs import read
    from tfrbeam.errors import RowCountError

    pacsv.write_csv(flights(500), tmp_path / "rows.csv")
    monkeypatch.setattr(read, "read_csv_file", _losing(read.read_csv_file, 2))
    with pytest.raises(RowCountError) as caught:
        _build(tmp_path, tmp_path / "rows.csv", "csv")
    expected = f"{tmp_path / 'rows.csv'}: the parser found 500 rows from line 2 on, but its reader gave 498"
    assert _one_line(caught.value).startswith(expected)
    assert not (tmp_path / "out" / "tfrbeam_dataset.json").exists()


def test_the_commit_checks_each_input_against_the_rows_it_announced():
    """The runner's side: batches of a file that never reach the commit (or arrive twice) fail it, naming the file."""
    from tfrbeam.builder.pipeline.commit import check_rows_announced
    from tfrbeam.errors import RowCountError

    counts = [(600, 2, (), "a.parquet", 1000), (400, 0, (), "a.parquet", 1000), (7, 1, (), "b.csv", None)]
    assert check_rows_announced(counts, "out") == {"a.parquet": 1000, "b.csv": 7}
    with pytest.raises(RowCountError) as caught:
        check_rows_announced(counts[1:], "out")
    assert _one_line(caught.value).startswith("a.parquet: the input announces 1000 rows, but 400 were read")


def test_the_manifest_records_the_rows_read_of_each_input(tmp_path):
    import pyarrow.parquet as pq

    from tfrbeam.layout.manifest import read_manifest

    (tmp_path / "in").mkdir()
    pq.write_table(flights(300), tmp_path / "in" / "a.parquet", row_group_size=100)
    pq.write_table(flights(120, 300), tmp_path / "in" / "b.parquet")
    result = _build(tmp_path, tmp_path / "in" / "*.parquet", "parquet")
    manifest = read_manifest(str(tmp_path / "out")).to_dict()
    assert [(entry["path"], entry["rows_read"]) for entry in manifest["inputs"]] == [
        (str(tmp_path / "in" / "a.parquet"), 300), (str(tmp_path / "in" / "b.parquet"), 120)]
    assert result is not None and manifest["rows_read"] == 420 == sum(result.num_examples.values())
