"""Builds whose splits come from the data: a split column (CSV, Parquet, WriteDataset, write_dataset) and file patterns.

Each output record is decoded and compared with the input row it came from: it is in the split its
column (or its file) names, unknown and null values are bad rows naming file, line and value, and
records in = good rows + bad rows.
"""

from __future__ import annotations

import json
import pathlib

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import tfrbeam
from tests.builder.inputs.test_formats_same_bytes import write_all_formats
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.pipeline.plan import plan_build
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.example import decode_example
from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest import verify_dataset
from tfrbeam.tfrecord.records import read_records

MAP = {"TRAIN": "train", "VALIDATION": "eval", "TEST": "test"}
FOLDS = ["TRAIN", "TRAIN", "VALIDATION", "TEST", "TRAIN", "HOLDOUT", "", "TEST", "TRAIN", "VALIDATION"]


def split_records(dataset: pathlib.Path) -> dict[str, list[dict]]:
    """Every split's decoded Examples (all shards), from the manifest."""
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {name: [decode_example(record) for shard in split["shards"]
                   for record in read_records(str(dataset / shard["path"]))]
            for name, split in manifest["splits"].items()}


def split_bytes(dataset: pathlib.Path) -> dict[str, set[bytes]]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {name: {record for shard in split["shards"] for record in read_records(str(dataset / shard["path"]))}
            for name, split in manifest["splits"].items()}


def build(tmp_path: pathlib.Path, name: str, config: dict, *args: str) -> int:
    (tmp_path / f"{name}.yaml").write_text(json.dumps(config))
    return build_main([str(tmp_path / f"{name}.yaml"), "--quiet", *args])


def test_csv_rows_land_in_the_split_their_column_names_and_unknown_values_are_bad_rows(tmp_path):
    lines = ["id,fold,score"] + [f"{i},{fold},{i * 0.5}" for i, fold in enumerate(FOLDS * 30)]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    config = {"input": {"path": str(tmp_path / "rows.csv"), "csv": {"null_values": [""]}},
              "splits": {"column": "fold", "map": MAP}, "output": {"path": str(tmp_path / "out"),
                                                                  "num_shards": {"train": 2, "eval": 1, "test": 1}},
              "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}}
    assert build(tmp_path, "csv", config) == 0
    records = split_records(tmp_path / "out")
    folds = FOLDS * 30
    expected = {split: sorted(i for i, fold in enumerate(folds) if MAP.get(fold) == split) for split in MAP.values()}
    assert {split: sorted(example["id"][0] for example in examples) for split, examples in records.items()} == expected
    assert all(set(example) == {"id", "score"} for examples in records.values() for example in examples)  # not written
    manifest = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    bad = [json.loads(line) for path in (tmp_path / "out" / "_errors").glob("*.jsonl")
           for line in path.read_text().splitlines()]
    assert sorted(row["line"] for row in bad) == [i + 2 for i, fold in enumerate(folds) if fold not in MAP]
    assert {row["file"] for row in bad} == {str(tmp_path / "rows.csv")}
    holdout = next(row for row in bad if row["line"] == 7)
    assert "'HOLDOUT', which is not a key of splits.map" in holdout["reason"] and holdout["raw"] == "5,HOLDOUT,2.5"
    assert "split column 'fold' is null" in next(row for row in bad if row["line"] == 8)["reason"]
    assert manifest["rows_read"] == len(folds) == sum(len(examples) for examples in records.values()) + len(bad)
    assert manifest["bad_records"]["count"] == len(bad)
    assert manifest["split_assignment"].startswith("the value of column 'fold' mapped by splits.map (TRAIN -> train")
    assert [len(split["shards"]) for split in manifest["splits"].values()] == [2, 1, 1]
    assert verify_dataset(str(tmp_path / "out")) == []


def test_an_unknown_value_fails_the_build_by_default_naming_file_line_and_value(tmp_path, capsys):
    (tmp_path / "rows.csv").write_text("id,fold\n1,TRAIN\n2,HOLDOUT\n")
    config = {"input": {"path": str(tmp_path / "rows.csv")}, "splits": {"column": "fold", "map": MAP},
              "output": {"path": str(tmp_path / "out")}}
    assert build(tmp_path, "fail", config) != 0
    assert f"{tmp_path / 'rows.csv'}:3: split column 'fold' holds 'HOLDOUT'" in capsys.readouterr().err


def test_parquet_split_names_from_the_column_and_the_column_written_when_it_is_a_feature(tmp_path):
    folds = ["train", "eval", "train", "test", "train"] * 40
    pq.write_table(pa.table({"id": list(range(len(folds))), "fold": pa.array(folds).dictionary_encode()}),
                   tmp_path / "rows.parquet")
    config = {"input": {"path": str(tmp_path / "rows.parquet")},
              "features": {"id": {"type": "int64"}, "fold": {"type": "bytes"}},
              "splits": {"column": "fold", "names": ["train", "eval", "test"]}, "output": {"path": str(tmp_path / "out")}}
    assert build(tmp_path, "parquet", config) == 0
    records = split_records(tmp_path / "out")
    assert {split: sorted(example["id"][0] for example in examples) for split, examples in records.items()} == {
        split: [i for i, fold in enumerate(folds) if fold == split] for split in ("train", "eval", "test")}
    assert all(example["fold"] == [split.encode()] for split, examples in records.items() for example in examples)


def test_integer_split_column_of_json_lines(tmp_path):
    rows = [{"id": i, "fold": i % 3} for i in range(60)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"input": {"path": str(tmp_path / "rows.jsonl")},
              "splits": {"column": "fold", "map": {0: "train", 1: "train", 2: "eval"}},
              "output": {"path": str(tmp_path / "out")}}
    assert build(tmp_path, "jsonl", config) == 0
    records = split_records(tmp_path / "out")
    assert sorted(example["id"][0] for example in records["eval"]) == list(range(2, 60, 3))
    assert len(records["train"]) == 40


def _write_csv(path: pathlib.Path, first: int, count: int) -> None:
    path.write_text("id,label\n" + "".join(f"{i},row-{i}\n" for i in range(first, first + count)))


def test_file_pattern_splits_put_each_files_rows_in_its_split_as_separate_builds_would(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    _write_csv(data / "train-0.csv", 0, 50)
    _write_csv(data / "train-1.csv", 50, 70)
    _write_csv(data / "eval-0.csv", 1000, 30)
    features = {"id": {"type": "int64"}, "label": {"type": "bytes"}}
    config = {"features": features, "shuffle": {"seed": 3},
              "splits": {"train": str(data / "train-*.csv"), "eval": str(data / "eval-*.csv")},
              "output": {"path": str(tmp_path / "out"), "num_shards": 2}}
    assert build(tmp_path, "patterns", config, "--dry-run") == 0
    dry = capsys.readouterr().out
    assert f"splits:      train, eval by the input file: train from {data / 'train-*.csv'} (2 files), eval from" in dry
    assert build(tmp_path, "patterns", config) == 0
    records = split_records(tmp_path / "out")
    assert sorted(example["id"][0] for example in records["train"]) == list(range(120))
    assert sorted(example["id"][0] for example in records["eval"]) == list(range(1000, 1030))
    manifest = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    assert [(pathlib.Path(item["path"]).name, item["split"]) for item in manifest["inputs"]] == [
        ("eval-0.csv", "eval"), ("train-0.csv", "train"), ("train-1.csv", "train")]
    assert manifest["split_assignment"].startswith("the input file: train from")
    for split in ("train", "eval"):  # the same records as a build of that split's files alone
        alone = {"input": {"path": str(data / f"{split}-*.csv")}, "features": features, "shuffle": {"seed": 3},
                 "splits": {split: 1.0}, "output": {"path": str(tmp_path / f"alone-{split}"), "num_shards": 2}}
        assert build(tmp_path, f"alone-{split}", alone) == 0
        assert split_bytes(tmp_path / f"alone-{split}")[split] == split_bytes(tmp_path / "out")[split]


def test_file_pattern_problems_are_config_errors_naming_the_split_before_the_pipeline(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write_csv(data / "train-0.csv", 0, 5)
    output = {"path": str(tmp_path / "out")}
    nothing = parse_config({"splits": {"train": str(data / "train-*.csv"), "eval": str(data / "eval-*.csv")},
                            "output": output})
    with pytest.raises(ConfigError, match=r"splits\.eval: .* matches no files"):
        plan_build(nothing)
    twice = parse_config({"splits": {"train": str(data / "train-*.csv"), "all": str(data / "*.csv")}, "output": output})
    with pytest.raises(ConfigError, match=r"splits\.all: .*train-0\.csv is matched by splits\.train too"):
        plan_build(twice)
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_the_split_column(tmp_path, capsys):
    (tmp_path / "rows.csv").write_text("id,fold\n1,TRAIN\n2,TEST\n")
    config = {"input": {"path": str(tmp_path / "rows.csv")}, "splits": {"column": "fold", "map": MAP},
              "output": {"path": str(tmp_path / "out")}}
    assert build(tmp_path, "dry", config, "--dry-run") == 0
    out = capsys.readouterr().out
    assert ("splits:      train, eval, test by the value of column 'fold' mapped by splits.map (TRAIN -> train, "
            "VALIDATION -> eval, TEST -> test); a null or unknown value is a bad row") in out
    assert "  fold " not in out  # read to split, not a feature


def _table() -> pa.Table:
    folds = FOLDS * 20
    return pa.table({"id": list(range(len(folds))), "fold": [fold or None for fold in folds]})


def test_write_dataset_in_a_pipeline_with_a_split_column_on_the_fnapi_runner(tmp_path):
    table = _table()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        _ = (pipeline | beam.Create(table.to_batches(max_chunksize=50), reshuffle=False)
             | tfrbeam.WriteDataset(tmp_path / "beam", schema=table.schema, splits={"column": "fold", "map": MAP},
                                         errors={"on_bad_record": "skip", "max_bad_fraction": 0.5}))
    records = split_records(tmp_path / "beam")
    folds = table.column("fold").to_pylist()
    assert {split: sorted(example["id"][0] for example in examples) for split, examples in records.items()} == {
        split: [i for i, fold in enumerate(folds) if MAP.get(fold) == split] for split in MAP.values()}
    manifest = json.loads((tmp_path / "beam" / "tfrbeam_dataset.json").read_text())
    assert manifest["bad_records"]["count"] == sum(fold not in MAP for fold in folds)
    in_memory = tfrbeam.write_dataset(table, tmp_path / "table", splits={"column": "fold", "map": MAP},
                                      errors={"on_bad_record": "skip", "max_bad_fraction": 0.5}, progress=False)
    assert in_memory is not None and split_bytes(tmp_path / "table") == split_bytes(tmp_path / "beam")


def test_write_dataset_refuses_file_pattern_splits(tmp_path):
    with pytest.raises(ConfigError, match="file patterns split input files"):
        tfrbeam.write_dataset(_table(), tmp_path / "x", splits={"train": "data/*.csv"}, progress=False)


def test_every_input_format_splits_by_its_column_into_the_same_bytes(tmp_path):
    """The same rows as CSV, Parquet, JSON lines (plain and gzip), ORC and Avro: one split column, one dataset."""
    paths = write_all_formats(tmp_path)
    group_map = {"a": "train", "b": "train", "c": "eval"}  # "d" is a bad row
    built = {}
    for fmt, path in paths.items():
        config = {"input": {"path": str(path)}, "splits": {"column": "group", "map": group_map},
                  "shuffle": {"seed": 7}, "output": {"path": str(tmp_path / fmt), "num_shards": 2},
                  "errors": {"on_bad_record": "skip", "max_bad_fraction": 0.5}}
        assert build(tmp_path, fmt, config) == 0, fmt
        built[fmt] = split_bytes(tmp_path / fmt)
    assert all(shards == built["csv"] for shards in built.values())
    records = split_records(tmp_path / "parquet")
    assert sorted(example["id"][0] for example in records["eval"]) == list(range(2, 300, 4))
    assert sorted(example["id"][0] for example in records["train"]) == sorted(
        [*range(0, 300, 4), *range(1, 300, 4)])
    assert all("group" not in example for examples in records.values() for example in examples)


def test_an_unshuffled_build_keeps_input_order_within_each_split(tmp_path):
    (tmp_path / "rows.csv").write_text("id,fold\n" + "".join(f"{i},{FOLDS[i % 5]}\n" for i in range(200)))
    config = {"input": {"path": str(tmp_path / "rows.csv")}, "features": {"id": {"type": "int64"}},
              "splits": {"column": "fold", "map": MAP}, "shuffle": {"enabled": False},
              "output": {"path": str(tmp_path / "out"), "num_shards": 1}}
    assert build(tmp_path, "ordered", config) == 0
    records = split_records(tmp_path / "out")
    assert all(set(example) == {"id"} for examples in records.values() for example in examples)  # fold only read
    assert [example["id"][0] for example in records["train"]] == [i for i in range(200) if FOLDS[i % 5] == "TRAIN"]
    assert [example["id"][0] for example in records["test"]] == [i for i in range(200) if FOLDS[i % 5] == "TEST"]


def test_relative_globs_are_listed_from_the_working_directory_and_named_as_given(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    _write_csv(tmp_path / "data" / "train-0.csv", 0, 20)
    _write_csv(tmp_path / "data" / "test-0.csv", 20, 5)
    monkeypatch.chdir(tmp_path)
    config = {"splits": {"train": "data/train-*.csv", "test": "data/test-*.csv"}, "output": {"path": "out"}}
    assert build(tmp_path, "relative", config) == 0
    manifest = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    assert [(item["path"], item["split"]) for item in manifest["inputs"]] == [
        ("data/test-0.csv", "test"), ("data/train-0.csv", "train")]
    assert {name: split["num_examples"] for name, split in manifest["splits"].items()} == {"train": 20, "test": 5}
