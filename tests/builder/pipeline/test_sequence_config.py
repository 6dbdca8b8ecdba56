"""The ``sequence:`` section of a build config: its defaults, its round trip, and every problem it can have."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from tests.helpers import config_problems
from tfrbeam.builder.config import (
    DEFAULT_MAX_GROUP_BYTES,
    ConfigError,
    SequenceConfig,
    config_to_dict,
    parse_config,
    parse_yaml,
)
from tfrbeam.builder.pipeline.resolve import validate_against_schema

SCHEMA = pa.schema([("tailnum", pa.string()), ("carrier", pa.string()), ("t", pa.int64()), ("delay", pa.float64()),
                    ("tags", pa.list_(pa.string()))])


def _config(sequence, **sections) -> dict:
    raw = {"input": {"path": "data/x.parquet"}, "output": {"path": "out"}, "sequence": sequence}
    raw.update(sections)
    return raw


_problems = config_problems


def _schema_problems(raw) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_against_schema(parse_config(raw), SCHEMA)
    return str(caught.value)


def test_defaults_and_split_key_from_group_by():
    config = parse_config(_config({"group_by": ["tailnum"]}))
    assert config.sequence == SequenceConfig(group_by=("tailnum",), order_by=(), context=(), max_steps=None,
                                             overflow="split", min_steps=1, max_group_bytes=DEFAULT_MAX_GROUP_BYTES)
    assert config.split_key == ("tailnum",)  # a group never straddles splits
    assert parse_config(_config(None)).sequence is None


def test_every_key_parses_and_round_trips():
    raw = _config({"group_by": "tailnum", "order_by": ["t"], "context": ["carrier"], "max_steps": 50,
                   "overflow": "truncate", "min_steps": 2, "max_group_bytes": "1MiB"})
    config = parse_config(raw)
    assert config.sequence == SequenceConfig(("tailnum",), ("t",), ("carrier",), 50, "truncate", 2, 1 << 20)
    assert parse_config(config_to_dict(config)) == config
    assert parse_config(parse_yaml(yaml.safe_dump(config_to_dict(config)))) == config
    assert config_to_dict(config)["sequence"] == {
        "group_by": ["tailnum"], "order_by": ["t"], "context": ["carrier"], "max_steps": 50, "overflow": "truncate",
        "min_steps": 2, "max_group_bytes": 1 << 20}


def test_context_and_sequence_features_of_a_resolved_config():
    config = validate_against_schema(parse_config(_config({"group_by": ["tailnum"], "order_by": ["t"],
                                                           "context": ["carrier"]})), SCHEMA)
    assert config.sequence is not None
    assert config.sequence.context_features == ("tailnum", "carrier")
    assert config.sequence.sequence_features(config.features) == ("t", "delay", "tags")


@pytest.mark.parametrize("sequence, message", [
    ({}, "sequence.group_by: is required"),
    ({"group_by": []}, "sequence.group_by: [] is not a non-empty list of non-empty strings"),
    ({"group_by": ["a", "a"]}, "sequence.group_by: ['a', 'a'] names 'a' more than once"),
    ({"group_by": ["a"], "order_by": "b"}, "sequence.order_by: 'b' is not a list of non-empty strings"),
    ({"group_by": ["a"], "context": [1]}, "sequence.context: [1] is not a list of non-empty strings"),
    ({"group_by": ["a"], "order_by": ["a"]}, "sequence.order_by: 'a' is in group_by"),
    ({"group_by": ["a"], "context": ["a"]}, "sequence.context: 'a' is in group_by (group_by features are context"),
    ({"group_by": ["a"], "order_by": ["b"], "context": ["b"]}, "sequence.context: 'b' is in order_by too"),
    ({"group_by": ["a"], "max_steps": 0}, "sequence.max_steps: 0 is out of range (allowed: 1 to"),
    ({"group_by": ["a"], "max_steps": "ten"}, "sequence.max_steps: 'ten' is not an integer"),
    ({"group_by": ["a"], "min_steps": 0}, "sequence.min_steps: 0 is out of range (allowed: 1 to"),
    ({"group_by": ["a"], "overflow": "drop"}, "sequence.overflow: 'drop' is not one of split, truncate, error"),
    ({"group_by": ["a"], "overflow": "truncate"}, "sequence.overflow: truncate needs max_steps"),
    ({"group_by": ["a"], "max_steps": 3, "min_steps": 4}, "sequence.min_steps: 4 is more than max_steps 3"),
    ({"group_by": ["a"], "max_group_bytes": "lots"}, "sequence.max_group_bytes: 'lots' is not a positive size"),
    ({"group_by": ["a"], "window": 3}, "sequence.window: unknown key (allowed: group_by, order_by, context"),
    (["a"], "sequence: expected a mapping with keys group_by, order_by"),
])
def test_each_sequence_problem_names_the_key_and_what_is_allowed(sequence, message):
    assert message in _problems(_config(sequence))


def test_split_key_must_be_part_of_group_by():
    problems = _problems(_config({"group_by": ["tailnum", "carrier"]}, split_key=["t"]))
    assert "split_key: ['t'] is not part of sequence.group_by ['tailnum', 'carrier']" in problems
    assert "a group's rows would straddle splits" in problems
    config = parse_config(_config({"group_by": ["tailnum", "carrier"]}, split_key=["carrier"]))
    assert config.split_key == ("carrier",)


def test_stats_are_refused_for_sequence_builds():
    assert "stats: statistics of SequenceExample datasets are not computed" in _problems(
        _config({"group_by": ["a"]}, stats=True))


def test_all_problems_of_the_section_are_reported_at_once():
    problems = _problems(_config({"group_by": ["a"], "order_by": ["a"], "min_steps": 0, "overflow": "x"}))
    assert problems.count("\n  ") == 3 and "3 problems" in problems


@pytest.mark.parametrize("sequence, message", [
    ({"group_by": ["tail"]}, "sequence.group_by: 'tail' is not a feature (features: tailnum, carrier, t, delay, tags); "
                             "did you mean 'tailnum'?"),
    ({"group_by": ["tailnum"], "order_by": ["time"]}, "sequence.order_by: 'time' is not a feature"),
    ({"group_by": ["tailnum"], "context": ["airline"]}, "sequence.context: 'airline' is not a feature"),
    ({"group_by": ["tailnum"], "order_by": ["tags"]}, "sequence.order_by: 'tags' is a list feature; steps are ordered "
                                                      "by scalar features"),
    ({"group_by": ["tailnum"], "context": ["carrier", "t", "delay", "tags"]},
     "sequence.context: every feature is context or group_by; a SequenceExample needs at least one sequence feature"),
])
def test_names_must_be_features_of_the_build(sequence, message):
    assert message in _schema_problems(_config(sequence))


def test_names_are_checked_against_declared_features_and_their_names_not_sources():
    raw = _config({"group_by": ["aircraft"], "order_by": ["t"]},
                  features={"aircraft": {"source": "tailnum"}, "t": {}, "delay": {}})
    config = validate_against_schema(parse_config(raw), SCHEMA)
    assert config.sequence is not None and config.split_key == ("aircraft",)
    assert "sequence.group_by: 'tailnum' is not a feature" in _schema_problems(
        _config({"group_by": ["tailnum"]}, features={"aircraft": {"source": "tailnum"}, "t": {}}))
