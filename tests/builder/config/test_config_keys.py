"""Config keys declared once, on the dataclass fields: for every key the fields declare, a value `--set` gives reaches
its field and survives config_to_dict, null is its default, a wrong value is a problem naming exactly its path,
and the docs name it. write_dataset's config has its rows as the input, never a stand-in input section."""

from __future__ import annotations

import dataclasses
import glob
import json
from typing import Any

import pyarrow as pa
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from tests.helpers import config_problems
from tfrbeam.builder.config import (
    INPUT_FORMATS,
    ROWS_FORMAT,
    BuildConfig,
    ConfigError,
    FeatureSpec,
    InputConfig,
    SplitColumn,
    SplitFiles,
    apply_overrides,
    config_to_dict,
    parse_config,
)
from tfrbeam.builder.config.keys import (
    Char,
    Choice,
    Flag,
    Integer,
    Key,
    Names,
    Number,
    Section,
    Size,
    Text,
    Tokens,
    config_keys,
)
from tfrbeam.builder.pipeline.from_rows import dataset_config
from tfrbeam.builder.running.write_table import write_dataset

KEYS = dict(config_keys(BuildConfig))
BASE = {"input": {"path": "data/x.csv"}, "output": {"path": "out"}}
# The input a key of one format is tried on.
FORMAT_PATHS = {"csv": "data/x.csv", "jsonl": "data/x.jsonl", "parquet": "data/x.parquet", "tfrecord": "data/x.tfrecord"}
# What other keys must hold for some values of a key to be allowed (its checks across keys).
NEEDS = {
    "input.csv.header": {"input": {"path": "data/x.csv", "csv": {"column_names": ["a", "b"]}}},
    "sequence.overflow": {"sequence": {"group_by": ["g"], "max_steps": 5}},
}
# Values of keys whose kind takes more than its type (a known encoding), and of the keys with kinds of their own.
VALUES: dict[str, st.SearchStrategy] = {
    "input.csv.encoding": st.sampled_from([("latin-1", "latin-1"), ("cp1252", "cp1252"), ("ascii", "ascii")]),
    "input.format": st.sampled_from([(fmt, fmt) for fmt in INPUT_FORMATS]),
    "input.path": st.sampled_from([(path, path) for path in ("d/*.csv", "gs://b/x.parquet", "a b.jsonl.gz")]),
    "features": st.sampled_from([
        ({"a": {"type": "int64"}}, (FeatureSpec("a", "int64", "a"),)),
        ({"t": {"type": "timestamp", "unit": "ms"}}, (FeatureSpec("t", "int64", "t", time_unit="ms"),)),
        ({"l": {"type": "float", "separator": ";", "length": 2, "on_null": "omit"}},
         (FeatureSpec("l", "float", "l", on_null="omit", separator=";", length=2, is_list=True),)),
    ]),
    "splits": st.sampled_from([({"train": 0.75, "eval": 0.25}, {"train": 0.75, "eval": 0.25}),
                               ({"column": "fold", "names": ["a", "b"]}, {"a": None, "b": None})]),
    "output.num_shards": st.sampled_from([(3, 3), ({"train": 2}, {"train": 2})]),
    "output.tfds.name": st.sampled_from([(name, name) for name in ("flights", "my_data_2", "x")]),
    "output.tfds.version": st.sampled_from([(version, version) for version in ("1.0.0", "2.10.3")]),
}
_CHARS = ";|:^~"
_NAMES = "abcdef"  # never "g", the group_by of sequence configs


def _strategy(path: str, declared: Key) -> st.SearchStrategy:
    """(value as written, value in the config) pairs a key allows, drawn from what its kind declares."""
    if path in VALUES:
        return VALUES[path]
    kind = declared.kind
    if isinstance(kind, Flag):
        return st.booleans().map(lambda flag: (flag, flag))
    if isinstance(kind, Integer):
        return st.integers(kind.minimum, kind.maximum).map(lambda number: (number, number))
    if isinstance(kind, Number):
        return st.sampled_from([kind.low, kind.high, (kind.low + kind.high) / 2]).map(lambda x: (x, float(x)))
    if isinstance(kind, Size):  # at least 1 MiB: the floor of the row bounds
        return st.one_of(st.integers(1 << 20, 1 << 40).map(lambda size: (size, size)),
                         st.integers(1, 4096).map(lambda mib: (f"{mib}MiB", mib << 20)))
    if isinstance(kind, Text):
        return st.text("abc/._-", min_size=1, max_size=8).map(lambda text: (text, text))
    if isinstance(kind, Char):
        return st.sampled_from([*_CHARS, *([None] if kind.nullable else [])]).map(lambda char: (char, char))
    if isinstance(kind, Choice):
        return st.sampled_from(kind.allowed).map(lambda choice: (choice, None if choice == kind.none else choice))
    if isinstance(kind, Names):
        lists = st.lists(st.sampled_from(_NAMES), min_size=0 if kind.allow_empty else 1, unique=True)
        pairs = lists.map(lambda names: (names, tuple(names)))
        return st.one_of(pairs, st.sampled_from(_NAMES).map(lambda name: (name, (name,)))) if kind.allow_single else pairs
    if isinstance(kind, Tokens):
        return st.lists(st.text("NA/-. 0é", max_size=3), max_size=3).map(lambda tokens: (tokens, tuple(tokens)))
    raise AssertionError(f"{path}: a key of kind {type(kind).__name__} needs its values in VALUES")


def _base(path: str) -> dict:
    """A config the key belongs in: an input of its format, a sequence section for sequence keys."""
    raw = json.loads(json.dumps(BASE))
    parts = path.split(".")
    formats = [KEYS[".".join(parts[:end])].for_format for end in range(1, len(parts) + 1)]
    fmt = next((fmt for fmt in formats if fmt is not None), None)  # its own, or its section's
    if fmt is not None:
        raw["input"]["path"] = FORMAT_PATHS[fmt]
    if path.startswith("sequence."):
        raw["sequence"] = {"group_by": ["g"]}
    if path.startswith("output.tfds."):
        raw["output"]["tfds"] = {"name": "flights"}
    raw.update(json.loads(json.dumps(NEEDS.get(path, {}))))
    return raw


def _field(config: Any, path: str) -> Any:
    """The config's value of a key path, through sections whose keys are flattened into their parent (input.splits)."""
    value = config
    for name in path.split("."):
        if not any(item.name == name for item in dataclasses.fields(value)):
            value = next(getattr(value, item.name) for item in dataclasses.fields(value)
                         if dataclasses.is_dataclass(getattr(value, item.name))
                         and any(inner.name == name for inner in dataclasses.fields(getattr(value, item.name))))
        value = getattr(value, name)
    return value


LEAVES = sorted(path for path, declared in KEYS.items() if not isinstance(declared.kind, Section))


def test_every_config_field_is_declared_a_key_or_internal():
    """config_keys walks every section: a field made with neither key() nor internal() is refused there."""
    assert {"input.csv.delimiter", "input.splits", "input.compression", "output.schema_pbtxt", "sequence.max_group_bytes",
            "split_key", "stats", "features", "splits"} <= set(KEYS)
    assert "split_by" not in KEYS and "input.csv.feature_null_values" not in KEYS and "input.tfrecord" not in KEYS


@pytest.mark.parametrize("path", LEAVES)
@settings(max_examples=15)
@given(data=st.data())
def test_a_value_set_with_set_reaches_its_field_and_round_trips(path, data):
    declared = KEYS[path]
    written, expected = data.draw(_strategy(path, declared))
    config = parse_config(apply_overrides(_base(path), [f"{path}={json.dumps(written, ensure_ascii=False)}"]))
    assert _field(config, path) == expected
    assert parse_config(config_to_dict(config)) == config
    assert parse_config(yaml.safe_load(yaml.safe_dump(config_to_dict(config), sort_keys=False))) == config


@pytest.mark.parametrize("path", sorted(path for path, declared in KEYS.items() if not isinstance(declared.kind, Char)))
def test_null_is_the_default_or_is_required(path):
    """Left out or null, a key holds its default. (A character key's null is a value: no quoting, no escape char.)"""
    declared = KEYS[path]
    base = _base(path)
    section, _, name = path.rpartition(".")
    left_out = apply_overrides(base, [])
    parent = left_out
    for part in section.split(".") if section else ():
        parent = parent.setdefault(part, {})
    parent.pop(name, None)
    nulled = apply_overrides(base, [f"{path}="])
    if declared.required is True or path in ("input", "input.path"):
        assert config_problems(nulled).endswith(f"\n  {path}: is required")
    else:
        assert parse_config(nulled) == parse_config(left_out)


@pytest.mark.parametrize("path", sorted(KEYS))
def test_a_wrong_value_is_a_problem_naming_exactly_its_key(path):
    problems = config_problems(apply_overrides(_base(path), [f"{path}=[[]]"]))
    first = problems.split("\n")[1].strip()
    assert first.startswith(f"{path}: ") and "[[]]" in first, problems


def test_split_key_problems_name_the_key_once():
    assert config_problems({**BASE, "split_key": []}).endswith(
        "\n  split_key: [] is not a non-empty list of non-empty strings")
    assert config_problems({**BASE, "split_key": ["a", "a"]}).endswith("\n  split_key: ['a', 'a'] names 'a' more than once")


def test_a_required_key_left_out_is_one_problem():
    assert config_problems({"input": {"format": "csv"}, "output": {"path": "o"}}) == (
        "<config>: 1 problem in the build config:\n  input.path: is required")
    assert config_problems({"input": {"path": "a.csv"}, "output": {"num_shards": 2}}) == (
        "<config>: 1 problem in the build config:\n  output.path: is required")


@pytest.mark.parametrize("path", sorted(path for path, declared in KEYS.items() if declared.excludes is not None))
def test_set_of_one_of_two_exclusive_keys_replaces_the_other(path):
    section, _, name = path.rpartition(".")
    other = KEYS[path].excludes
    both = {f"{section}.{name}": "64MiB", f"{section}.{other}": "4"}
    for chosen, replaced in ((name, other), (other, name)):
        raw = apply_overrides(BASE, [f"{section}.{replaced}={both[f'{section}.{replaced}']}"])
        config = parse_config(apply_overrides(raw, [f"{section}.{chosen}={both[f'{section}.{chosen}']}"]))
        assert _field(config, f"{section}.{replaced}") is None and _field(config, f"{section}.{chosen}") is not None
    message = config_problems(apply_overrides(BASE, [f"{section}.{name}=64MiB", f"{section}.{other}=4"])
                              | {section: {"path": "out", name: "64MiB", other: 4}})
    assert f"{path}: cannot be set together with {other} (set one of them)" in message


def test_every_key_is_in_the_docs():
    docs = "".join(open(page, encoding="utf-8").read() for page in sorted(glob.glob("docs/*.md")))
    names = [*KEYS, *(extra for declared in KEYS.values() for extra in declared.kind.extra_keys)]
    missing = [path for path in names if path not in docs and f"{path.rpartition('.')[2]}:" not in docs]
    assert not missing, f"config keys no docs page names: {missing}"


# ----------------------------------------------------------------------- write_dataset's config


def test_write_dataset_config_is_built_on_its_rows_not_a_stand_in_input():
    config = dataset_config("out", "rows", features={"a": "int64"}, splits={"train": 0.5, "eval": 0.5},
                            num_shards={"train": 1, "eval": 2}, errors="skip")
    assert config.input == InputConfig(format=ROWS_FORMAT, path="rows")
    assert config.features == (FeatureSpec("a", "int64", "a"),)
    assert (config.errors.max_bad_fraction, config.output.shards_for("eval")) == (0.1, 2)
    given = {"input": config.input}
    assert parse_config({k: v for k, v in config_to_dict(config).items() if k != "input"}, given=given) == config
    with pytest.raises(ConfigError, match=r"input: unknown key \(allowed: features, features_from, shuffle, splits"):
        parse_config({"input": {"format": "parquet", "path": "rows"}, "output": {"path": "out"}}, given=given)


def test_write_dataset_problems_speak_of_rows_not_of_a_parquet_input(tmp_path):
    table = pa.table({"a": ["x", None]})
    with pytest.raises(ConfigError) as caught:
        write_dataset(table, tmp_path / "out", features={"a": {"type": "bytes", "null_values": [""]}})
    message = str(caught.value)
    assert "features.a.null_values: is only for CSV inputs (the rows' nulls are Arrow nulls)" in message
    assert "Parquet" not in message and "\n" not in message


def test_split_by_comes_with_its_splits():
    column = parse_config({**BASE, "splits": {"column": "fold", "map": {"x": "train"}}})
    files = parse_config({"output": {"path": "out"}, "splits": {"train": "t-*.csv"}})
    assert column.split_by == SplitColumn("fold", (("x", "train"),))
    assert files.split_by == SplitFiles((("train", "t-*.csv"),)) and "path" not in config_to_dict(files)["input"]
