"""Feature sources (issue 24 e): a top-level column named "a.b" and the field b of a struct a are told apart.

A source given as a list is a path ([a, b]: field b of column a; ["a.b"]: the column "a.b"); a dotted
string is a column name or a struct path, and is refused when it names both.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tfrbeam.builder.config import config_to_dict, load_config, parse_config
from tfrbeam.builder.features.convert import FeatureSpec, source_column, source_type
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.builder.pipeline.resolve import resolve_config, validate_against_schema
from tfrbeam.errors import ConfigError

CLASH = pa.schema([("a.b", pa.int64()), ("a", pa.struct([("b", pa.int64())]))])


def clash_file(tmp_path) -> str:
    path = tmp_path / "clash.parquet"
    pq.write_table(pa.table({"a.b": [1, 2, 3], "a": [{"b": 10}, {"b": 20}, {"b": 30}]}, schema=CLASH), path)
    return str(path)


def load(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(str(path))


def values(config) -> dict:
    """Every converted feature of the (one) input file under a resolved config."""
    columns: dict[str, list] = {}
    for source in read_parquet_file(config.input.path, config.input.columns):
        result = convert_source_batch(source, config.features)
        for name in result.batch.schema.names:
            columns.setdefault(name, []).extend(result.batch.column(name).to_pylist())
    return columns


def test_infer_config_writes_list_sources_for_a_clash_and_each_feature_reads_its_own_values(tmp_path):
    data = clash_file(tmp_path)
    text = infer_config(data)
    features = yaml.safe_load(text)["features"]
    assert features["a.b"]["source"] == ["a.b"]
    assert features["a_b"]["source"] == ["a", "b"]
    config = resolve_config(load(tmp_path, text))
    assert values(config) == {"a.b": [1, 2, 3], "a_b": [10, 20, 30]}
    built = resolve_config(load(tmp_path, f"input: {{path: '{data}'}}\noutput: {{path: '{tmp_path / 'out'}'}}\n"))
    assert built.features == config.features  # the build without features infers the same


def test_a_dotted_string_naming_both_a_column_and_a_struct_field_is_refused_in_one_line(tmp_path):
    data = clash_file(tmp_path)
    config = load(tmp_path, f"input: {{path: '{data}'}}\nfeatures: {{x: {{source: a.b}}}}\n"
                            f"output: {{path: '{tmp_path / 'out'}'}}\n")
    with pytest.raises(ConfigError) as caught:
        resolve_config(config)
    problem = str(caught.value).splitlines()[1].strip()
    assert problem.startswith("features.x.source: 'a.b' names both the column 'a.b' and field b of struct column a")
    assert 'source: ["a.b"]' in problem and "source: [a, b]" in problem


def test_list_sources_read_exactly_the_path_they_name(tmp_path):
    data = clash_file(tmp_path)
    config = resolve_config(load(tmp_path, f"input: {{path: '{data}'}}\n"
                                           "features: {col: {source: [\"a.b\"]}, field: {source: [a, b]}}\n"
                                           f"output: {{path: '{tmp_path / 'out'}'}}\n"))
    assert values(config) == {"col": [1, 2, 3], "field": [10, 20, 30]}
    assert config.input.columns == ("a.b", "a")
    assert parse_config(config_to_dict(config)) == config  # the list form round-trips


def test_a_dotted_string_is_a_struct_path_only_when_no_column_has_that_name():
    schema = pa.schema([("a", pa.struct([("b", pa.int64())])), ("x.y", pa.string())])
    assert source_type(schema, "a.b") == pa.int64() and source_column(schema, "a.b") == "a"
    assert source_type(schema, "x.y") == pa.string() and source_column(schema, "x.y") == "x.y"
    assert source_type(schema, ("a", "b")) == pa.int64() and source_type(schema, ("a.b",)) is None
    assert source_type(CLASH, ("a.b",)) == pa.int64() and source_column(CLASH, ("a", "b")) == "a"
    config = parse_config({"input": {"path": "x.parquet"}, "output": {"path": "o"},
                           "features": {"ab": {"source": "a.b"}, "xy": {"source": "x.y"}}})
    resolved = validate_against_schema(config, schema)
    assert [(spec.name, spec.type) for spec in resolved.features] == [("ab", "int64"), ("xy", "bytes")]


def test_bad_list_sources_are_refused_naming_the_key():
    for source, message in (([], "is not a non-empty list of non-empty names"),
                            (["a", ""], "is not a non-empty list of non-empty names"),
                            (["a", 1], "is not a non-empty list of non-empty names")):
        with pytest.raises(ConfigError, match=f"features.f.source: .*{message}"):
            parse_config({"input": {"path": "x.parquet"}, "output": {"path": "o"}, "features": {"f": {"source": source}}})
    assert FeatureSpec("f", "int64", "a.b", source_path=("a", "b")).source_ref == ("a", "b")


def test_infer_config_never_gives_two_features_one_name(tmp_path):
    path = tmp_path / "names.parquet"
    pq.write_table(pa.table({"a_b": [1, 2], "a": [{"b": 10}, {"b": 20}]}), path)
    text = infer_config(str(path))
    features = yaml.safe_load(text)["features"]
    assert set(features) == {"a_b", "a_b_2"}
    assert features["a_b_2"]["source"] == "a.b"
    config = resolve_config(load(tmp_path, text))
    assert values(config) == {"a_b": [1, 2], "a_b_2": [10, 20]}
