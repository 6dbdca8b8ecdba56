"""The splits section's two data-driven forms: a split column (with or without a map) and file patterns per split."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from tests.helpers import config_problems
from tfrbeam.builder.config import SplitColumn, SplitFiles, config_to_dict, parse_config
from tfrbeam.builder.pipeline.resolve import validate_against_schema
from tfrbeam.errors import ConfigError


def _with(**sections) -> dict:
    raw = {"input": {"path": "data/x.csv"}, "output": {"path": "out"}}
    raw.update(sections)
    return raw


def test_a_split_column_with_a_map_names_its_splits_in_map_order():
    config = parse_config(_with(splits={"column": "fold", "map": {"TRAIN": "train", "VALIDATION": "eval",
                                                                  "TEST": "test", "DEV": "eval"}}))
    assert config.split_by == SplitColumn("fold", (("TRAIN", "train"), ("VALIDATION", "eval"), ("TEST", "test"),
                                                   ("DEV", "eval")))
    assert list(config.splits) == ["train", "eval", "test"]
    assert parse_config(config_to_dict(config)) == config


def test_a_split_column_without_a_map_lists_its_split_names():
    config = parse_config(_with(splits={"column": "fold", "names": ["train", "eval"]},
                                output={"path": "out", "num_shards": {"train": 4, "eval": 1}}))
    assert config.split_by == SplitColumn("fold") and list(config.splits) == ["train", "eval"]
    assert config.output.shards_for("eval") == 1
    assert parse_config(config_to_dict(config)) == config


def test_integer_and_boolean_map_keys_match_the_columns_text():
    config = parse_config(_with(splits={"column": "fold", "map": {0: "train", 1: "eval", 2: "test"}}))
    assert config.split_by == SplitColumn("fold", (("0", "train"), ("1", "eval"), ("2", "test")))
    assert parse_config(config_to_dict(config)) == config
    flags = parse_config(_with(splits={"column": "held_out", "map": {False: "train", True: "test"}}))
    assert flags.split_by == SplitColumn("held_out", (("false", "train"), ("true", "test")))


def test_file_patterns_per_split_need_no_input_path():
    config = parse_config({"splits": {"train": "data/train-*.csv", "eval": "data/eval-*.csv"},
                           "output": {"path": "out"}})
    assert config.split_by == SplitFiles((("train", "data/train-*.csv"), ("eval", "data/eval-*.csv")))
    assert list(config.splits) == ["train", "eval"] and config.input.format == "csv"
    assert parse_config(config_to_dict(config)) == config
    given = parse_config({"input": {"format": "parquet"}, "splits": {"train": "d/t-*", "eval": "d/e-*"},
                          "output": {"path": "out"}})
    assert given.input.format == "parquet"
    mixed = {"splits": {"train": "d/t-*.csv", "eval": "d/e-*.parquet"}, "output": {"path": "out"}}
    assert "splits: the globs name different formats (train: csv, eval: parquet)" in config_problems(mixed)


@pytest.mark.parametrize("splits, message", [
    ({"column": "", "names": ["train"]}, "splits.column: '' is not a non-empty string"),
    ({"column": "fold"}, "splits.names: is required without splits.map"),
    ({"column": "fold", "map": {}}, "splits.map: {} is not a non-empty mapping of column value to split name"),
    ({"column": "fold", "map": {"A": "has space"}}, "splits.map.A: 'has space' is not a valid split name"),
    ({"column": "fold", "map": {"A": "train", "B": "Train"}}, "differs from another split name only in case"),
    ({"column": "fold", "map": {1: "train", "1": "eval"}}, "splits.map: the value '1' is given twice"),
    ({"column": "fold", "map": {1.5: "train"}}, "splits.map.1.5: a map key is a string, integer or boolean"),
    ({"column": "fold", "names": ["train", "9x"]}, "splits.names: '9x' is not a valid split name"),
    ({"column": "fold", "map": {"A": "train"}, "names": ["train", "eval"]},
     "splits.names: ['train', 'eval'] differs from the split names of splits.map (train)"),
    ({"column": "fold", "names": ["train"], "seed": 1}, "splits.seed: unknown key (allowed: column, map, names)"),
    ({"train": 0.8, "eval": "data/eval-*.csv"},
     "splits.eval: 'data/eval-*.csv' is not a fraction greater than 0 and at most 1 (splits mixes fractions and file"),
    ({"train": "", "eval": "data/eval-*.csv"}, "splits.train: '' is not a non-empty glob"),
])
def test_split_source_problems_name_the_key(splits, message):
    assert message in config_problems(_with(splits=splits))


def test_split_sources_do_not_take_a_split_key_or_a_sequence():
    column = {"column": "fold", "names": ["train"]}
    assert "split_key: only fraction splits are hashed" in config_problems(_with(splits=column, split_key=["a"]))
    problems = config_problems(_with(splits=column, sequence={"group_by": "a"}))
    assert "sequence: a SequenceExample build splits by its group key's hash" in problems
    assert "input: is required" in config_problems({"output": {"path": "out"}, "splits": column})
    patterns = {"train": "d/t-*.csv"}
    assert "input.path: not used when splits are file patterns" in config_problems(
        {"input": {"path": "d/*.csv"}, "output": {"path": "out"}, "splits": patterns})


def test_the_split_column_is_checked_against_the_schema_and_read_but_not_a_feature():
    schema = pa.schema([("a", pa.int64()), ("fold", pa.string()), ("score", pa.float64())])
    config = parse_config(_with(input={"path": "x.parquet"}, splits={"column": "fold", "names": ["train", "eval"]}))
    resolved = validate_against_schema(config, schema)
    assert [spec.name for spec in resolved.features or ()] == ["a", "score"]  # TFRecorder drops it too
    assert resolved.input.columns == ("a", "score", "fold")
    listed = parse_config(_with(input={"path": "x.parquet"}, features={"fold": {"type": "bytes"}},
                                splits={"column": "fold", "names": ["train"]}))
    assert [spec.name for spec in validate_against_schema(listed, schema).features or ()] == ["fold"]
    for splits, message in [
        ({"column": "folds", "names": ["train"]}, "splits.column: column 'folds' is not in the input"),
        ({"column": "score", "names": ["train"]}, "splits.column: column 'score' is double"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_against_schema(parse_config(_with(input={"path": "x.parquet"}, splits=splits)), schema)
    projected = parse_config(_with(input={"path": "x.parquet", "columns": ["a"]},
                                   splits={"column": "fold", "names": ["train"]}))
    with pytest.raises(ConfigError, match=r"splits\.column: 'fold' is left out of input\.columns"):
        validate_against_schema(projected, schema)
