"""The build config: every documented key, defaults, overrides and each validation message."""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pytest

from tests.helpers import config_problems
from tfrbeam.builder.config import (
    DEFAULT_MAX_BYTES_PER_SHARD,
    BuildConfig,
    ConfigError,
    CsvOptions,
    FeatureSpec,
    ShuffleConfig,
    apply_overrides,
    config_to_dict,
    load_config,
    parse_config,
    parse_size,
    parse_yaml,
)
from tfrbeam.builder.pipeline.resolve import resolve_config, validate_against_schema

ISSUE_EXAMPLE = textwrap.dedent(
    """
    input:
      format: csv
      path: data/flights-*.csv
      csv:
        delimiter: ","
        quote_char: '"'
        escape_char: null
        header: true
        column_names: null
        null_values: ["", "NA"]
        skip_rows: 0
        encoding: utf-8
      columns: null
    features:
      distance: {type: float}
      dep_delay: {type: float, on_null: default, default: 0.0}
      tailnum: {type: bytes, source: tailnum, on_null: omit}
      embedding: {type: float, separator: ";", length: 16}
    shuffle:
      enabled: true
      seed: 42
    splits:
      train: 0.8
      eval: 0.2
    split_key: [tailnum]
    output:
      path: out/flights
      num_shards: 8
      max_bytes_per_shard: null
      compression: none
    errors:
      on_bad_record: fail
      max_bad_fraction: 0.0
    """
)

MINIMAL = {"input": {"path": "data/x.csv"}, "output": {"path": "out"}}


def _with(**sections) -> dict:
    raw = {"input": {"path": "data/x.csv"}, "output": {"path": "out"}}
    raw.update(sections)
    return raw


_problems = config_problems


def test_the_issue_example_parses_to_the_documented_values():
    config = parse_config(parse_yaml(ISSUE_EXAMPLE))
    assert config.input.format == "csv" and config.input.path == "data/flights-*.csv"
    assert config.input.csv == CsvOptions(null_values=("", "NA"))
    assert config.features == (
        FeatureSpec("distance", "float", "distance"),
        FeatureSpec("dep_delay", "float", "dep_delay", on_null="default", default=0.0),
        FeatureSpec("tailnum", "bytes", "tailnum", on_null="omit"),
        FeatureSpec("embedding", "float", "embedding", separator=";", length=16, is_list=True),
    )
    assert config.feature("embedding").shape == (16,)
    assert config.feature("distance").shape == ()
    assert config.feature("tailnum").always_present is False
    assert (config.shuffle.enabled, config.shuffle.seed) == (True, 42)
    assert list(config.splits.items()) == [("train", 0.8), ("eval", 0.2)]
    assert config.split_key == ("tailnum",)
    assert config.output.num_shards == 8 and config.output.max_bytes_per_shard is None
    assert config.output.compression is None and config.output.shards_for("eval") == 8
    assert (config.errors.on_bad_record, config.errors.max_bad_fraction) == ("fail", 0.0)


def test_defaults_of_a_minimal_config():
    config = parse_config(MINIMAL)
    assert config == BuildConfig(input=config.input, output=config.output)
    assert config.input.format == "csv"  # from the .csv extension
    assert config.input.csv == CsvOptions()
    assert config.input.csv.null_values is None  # not given: none, or inferred when features are left out too
    assert config.features is None  # every input column, types inferred
    assert config.splits == {"train": 1.0} and config.split_key is None
    assert (config.shuffle.enabled, config.shuffle.seed) == (True, 0)
    assert config.output.num_shards is None
    assert config.output.max_bytes_per_shard == DEFAULT_MAX_BYTES_PER_SHARD == 256 << 20
    assert config.output.shards_for("train") is None


def test_format_from_extension_and_tsv_delimiter():
    assert parse_config(_with(input={"path": "gs://b/part-*.parquet"})).input.format == "parquet"
    for path, expected in [("d/*.csv.gz", "csv"), ("d/x.CSV.bz2", "csv"), ("d/*.jsonl", "jsonl"),
                           ("d/*.ndjson.gz", "jsonl"), ("d/*.json", "jsonl"), ("d/*.json.zst", "jsonl"),
                           ("gs://b/*.orc", "orc"), ("d/part-0.avro", "avro"), ("d/*.pq", "parquet")]:
        assert parse_config(_with(input={"path": path})).input.format == expected, path
    assert parse_config(_with(input={"path": "d/*.json", "format": "csv"})).input.format == "csv"  # given wins
    tsv = parse_config(_with(input={"path": "x/data.tsv"}))
    assert tsv.input.format == "csv" and tsv.input.csv.delimiter == "\t"
    assert parse_config(_with(input={"path": "x/data.tsv.gz"})).input.csv.delimiter == "\t"


def test_round_trip_through_config_to_dict_and_yaml():
    import yaml

    config = parse_config(parse_yaml(ISSUE_EXAMPLE))
    resolved = config_to_dict(config)
    assert parse_config(resolved) == config
    assert parse_config(parse_yaml(yaml.safe_dump(resolved, sort_keys=False))) == config
    minimal = parse_config(MINIMAL)
    assert parse_config(config_to_dict(minimal)) == minimal
    assert config_to_dict(minimal)["output"]["max_bytes_per_shard"] == 256 << 20


def test_load_config_with_overrides(tmp_path):
    path = tmp_path / "build.yaml"
    path.write_text(ISSUE_EXAMPLE)
    config = load_config(
        str(path),
        ["shuffle.seed=7", "splits.train=0.7", "splits.test=0.1", "output.num_shards={train: 4, eval: 1, test: 1}",
         "features.dep_delay.on_null=omit", "features.dep_delay.default=", "input.csv.null_values=[NA]",
         "output.compression=gzip", "split_key=carrier"],
    )
    assert config.shuffle.seed == 7
    assert config.splits == {"train": 0.7, "eval": 0.2, "test": 0.1}
    assert config.output.num_shards == {"train": 4, "eval": 1, "test": 1}
    assert config.feature("dep_delay").on_null == "omit" and config.feature("dep_delay").default is None
    assert config.input.csv.null_values == ("NA",)
    assert config.output.compression == "gzip"
    assert config.split_key == ("carrier",)


def test_override_values_are_yaml_scalars():
    raw = apply_overrides(MINIMAL, ["a.b=1", "a.c=1.5", "a.d=true", "a.e='007'", "a.f=null", "a.g=text"])
    assert raw["a"] == {"b": 1, "c": 1.5, "d": True, "e": "007", "f": None, "g": "text"}
    assert MINIMAL == {"input": {"path": "data/x.csv"}, "output": {"path": "out"}}  # not mutated


@pytest.mark.parametrize(
    "override, message",
    [
        ("shuffle.seed", "--set 'shuffle.seed': expected key.path=value, e.g. --set shuffle.seed=7"),
        ("=3", "expected key.path=value"),
        ("input.path.x=1", "--set 'input.path.x=1': input.path is 'data/x.csv', not a mapping, so it has no key 'x'"),
        ("a=[1", "--set 'a=[1': not valid YAML"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError) as caught:
        apply_overrides(MINIMAL, [override])
    assert message in str(caught.value)


def test_override_error_is_reported_by_load_config_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(ISSUE_EXAMPLE)
    with pytest.raises(ConfigError, match=r"features\.dep_delay\.on_null: 'zero' is not one of omit, default, error"):
        load_config(str(path), ["features.dep_delay.on_null=zero"])


def test_load_config_reports_missing_file_and_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the config file .*nope\.yaml"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: {path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(str(bad))
    duplicate = tmp_path / "dup.yaml"
    duplicate.write_text("input: {path: a.csv}\noutput: {path: o}\nsplits:\n  train: 0.5\n  train: 0.5\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'train' \(each key may appear once\)[\s\S]*line 5"):
        load_config(str(duplicate))


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"output": {"path": "o"}}, "input: is required"),
        ({"input": {"path": "a.csv"}}, "output: is required"),
        (_with(input={"format": "csv"}), "input.path: is required"),
        (_with(output={"num_shards": 2}), "output.path: is required"),
        (
            _with(inputs={}),
            "inputs: unknown key (allowed: input, features, features_from, shuffle, splits, split_key, output, errors, stats, "
            "sequence); "
            "did you mean 'input'?",
        ),
        (
            _with(input={"path": "a.csv", "csv": {"delimeter": ";"}}),
            "input.csv.delimeter: unknown key (allowed: delimiter, quote_char, escape_char, header, column_names, "
            "null_values, true_values, false_values, skip_rows, encoding, max_row_bytes); did you mean 'delimiter'?",
        ),
        (
            _with(input={"path": "gs://b/x/*"}),
            "input.format: is required: 'gs://b/x/*' does not end in an extension that names a format (.csv, .tsv, "
            ".txt, .parquet, .pq, .parq, .jsonl, .ndjson, .json, .orc, .avro, .tfrecord; each also with .gz, .bz2, .xz, "
            ".zst or .deflate), nor is it a tfrbeam dataset directory (allowed: csv, parquet, jsonl, orc, avro, tfrecord)",
        ),
        (
            _with(input={"path": "a", "format": "json"}),
            "input.format: 'json' is not one of csv, parquet, jsonl, orc, avro, tfrecord; did you mean 'jsonl'?",
        ),
        (
            _with(input={"path": "a.jsonl", "parquet": {"require_checksums": True}}),
            "input.parquet: Parquet options are only for input.format parquet, but the format is jsonl",
        ),
        (
            _with(input={"path": "a.parquet", "csv": {"delimiter": ";"}}),
            "input.csv: CSV options are only for input.format csv, but the format is parquet",
        ),
        (
            _with(input={"path": "a.csv", "csv": {"delimiter": ";;"}}),
            "input.csv.delimiter: ';;' is not a single character other than a line break",
        ),
        (
            _with(input={"path": "a.csv", "csv": {"delimiter": None}}),
            "input.csv.delimiter: null is not a single character other than a line break",
        ),
        (_with(input={"path": "a.csv", "csv": {"delimiter": "\n"}}), "input.csv.delimiter: '\\n' is not a single character"),
        (
            _with(input={"path": "a.csv", "csv": {"quote_char": 5}}),
            "input.csv.quote_char: 5 is not a single character other than a line break, or null for none",
        ),
        (
            _with(input={"path": "a.csv", "csv": {"delimiter": '"'}}),
            "input.csv.quote_char: '\"' is also the delimiter; they must differ",
        ),
        (_with(input={"path": "a.csv", "csv": {"header": "yes"}}), "input.csv.header: 'yes' is not a boolean (true or false)"),
        (
            _with(input={"path": "a.csv", "csv": {"header": False}}),
            "input.csv.column_names: is required when header is false (list the column names in file order)",
        ),
        (
            _with(input={"path": "a.csv", "csv": {"column_names": ["a", "a"]}}),
            "input.csv.column_names: ['a', 'a'] names 'a' more than once",
        ),
        (_with(input={"path": "a.csv", "csv": {"null_values": "NA"}}), "input.csv.null_values: 'NA' is not a list of strings"),
        (
            _with(input={"path": "a.csv", "csv": {"null_values": ["NA", None]}}),
            "input.csv.null_values: ['NA', None] is not a list of strings",
        ),
        (_with(input={"path": "a.csv", "csv": {"skip_rows": -1}}), "input.csv.skip_rows: -1 is out of range (allowed: 0 to"),
        (_with(input={"path": "a.csv", "csv": {"skip_rows": 1.5}}), "input.csv.skip_rows: 1.5 is not an integer"),
        (
            _with(input={"path": "a.csv", "csv": {"encoding": "utf-9"}}),
            "input.csv.encoding: 'utf-9' is not an encoding Python knows",
        ),
        (_with(input={"path": "a.csv", "columns": "a"}), "input.columns: 'a' is not a non-empty list of non-empty strings"),
        (_with(input={"path": "a.csv", "split_bytes": "lots"}), "input.split_bytes: 'lots' is not a positive size"),
        (_with(features=[]), "features: expected a mapping of feature name to its settings"),
        (
            _with(features={"a": {"type": "string"}}),
            "features.a.type: 'string' is not one of int64, float, bytes, timestamp; use bytes",
        ),
        (
            _with(features={"a": {"type": "float64"}}),
            "features.a.type: 'float64' is not one of int64, float, bytes, timestamp; use float",
        ),
        (
            _with(features={"a": {"type": "int64", "typo": 1}}),
            "features.a.typo: unknown key (allowed: type, source, on_null, default, separator, length, shape, format, unit, "
            "null_values, from_file, max_file_bytes, file_root, image)",
        ),
        (
            _with(features={"a": "int64"}),
            "features.a: expected a mapping with keys type, source, on_null, default, separator, length, shape, format, unit, "
            "null_values, from_file, max_file_bytes, file_root, image, got 'int64'",
        ),
        (
            _with(features={"dep_delay": {"type": "float", "on_null": "zero"}}),
            "features.dep_delay.on_null: 'zero' is not one of omit, default, error",
        ),
        (
            _with(features={"a": {"type": "float", "on_null": "default"}}),
            "features.a.default: is required when on_null is default (a value of type float)",
        ),
        (
            _with(features={"a": {"type": "int64", "on_null": "default", "default": 1.5}}),
            "features.a.default: 1.5 is not a int64 value (an integer from -2**63 to 2**63-1)",
        ),
        (
            _with(features={"a": {"type": "int64", "on_null": "default", "default": 2**63}}),
            "features.a.default: 9223372036854775808 is not a int64 value",
        ),
        (
            _with(features={"a": {"type": "int64", "on_null": "default", "default": True}}),
            "features.a.default: true is not a int64 value",
        ),
        (
            _with(features={"a": {"type": "float", "on_null": "default", "default": "x"}}),
            "features.a.default: 'x' is not a float value (a number)",
        ),
        (
            _with(features={"a": {"type": "bytes", "on_null": "default", "default": 0}}),
            "features.a.default: 0 is not a bytes value (a string)",
        ),
        (
            _with(features={"a": {"type": "float", "default": 0.0}}),
            "features.a.default: is only used with on_null: default, but on_null is error",
        ),
        (_with(features={"a": {"type": "float", "length": 3}}), "features.a.length: is only allowed with separator"),
        (
            _with(features={"a": {"type": "float", "separator": ";", "length": 0}}),
            "features.a.length: 0 is out of range (allowed: 1 to",
        ),
        (_with(features={"a": {"type": "float", "separator": ""}}), "features.a.separator: '' is not a non-empty string"),
        (
            _with(features={"a": {"type": "float", "separator": ";", "on_null": "default", "default": 1.0}}),
            "features.a.default: 1.0 is not a list of float values (the feature is a list)",
        ),
        (
            _with(features={"a": {"type": "float", "separator": ";", "length": 2, "on_null": "default", "default": [1.0]}}),
            "features.a.default: [1.0] has 1 values but length is 2",
        ),
        (
            _with(features={"a": {"type": "int64", "separator": ";", "on_null": "default", "default": [1, "x"]}}),
            "features.a.default: [1, 'x'] is not a list of int64 values",
        ),
        (_with(features={"a": {"source": ""}}), "features.a.source: '' is not a non-empty string"),
        (_with(shuffle={"enabled": 1}), "shuffle.enabled: 1 is not a boolean (true or false)"),
        (_with(shuffle={"seed": -3}), "shuffle.seed: -3 is out of range (allowed: 0 to 18446744073709551615)"),
        (_with(shuffle={"seed": "42"}), "shuffle.seed: '42' is not an integer"),
        (_with(splits={"train": 0.8, "eval": 0.1}), "splits: fractions train: 0.8, eval: 0.1 sum to 0.9, not 1"),
        (_with(splits={"train": 0.8, "eval": 0.3}), "sum to 1.1, not 1"),
        (_with(splits={"train": 1.0, "eval": 0}), "splits.eval: 0 is not a fraction greater than 0 and at most 1"),
        (_with(splits={"train": 0.5, "eval": "half"}), "splits.eval: 'half' is not a fraction greater than 0 and at most 1"),
        (
            _with(splits={"tr ain": 1.0}),
            "splits.tr ain: 'tr ain' is not a valid split name (a letter, then letters, digits, _ or -",
        ),
        (_with(splits={"../x": 1.0}), "splits.../x: '../x' is not a valid split name"),
        (_with(splits={"_errors": 1.0}), "splits._errors: '_errors' is not a valid split name"),
        (_with(splits={"Train": 0.5, "train": 0.5}), "splits.Train: differs from another split name only in case"),
        (_with(splits=[0.8, 0.2]), "splits: expected a mapping of split name to fraction"),
        (_with(split_key=[]), "split_key: [] is not a non-empty list of non-empty strings"),
        (_with(split_key=["a", "a"]), "split_key: ['a', 'a'] names 'a' more than once"),
        (_with(output={"path": "o", "num_shards": 0}), "output.num_shards: 0 is out of range (allowed: 1 to 1000000)"),
        (_with(output={"path": "o", "num_shards": "8"}), "output.num_shards: '8' is not an integer"),
        (
            _with(output={"path": "o", "num_shards": {"train": 2, "test": 1}}),
            "output.num_shards.test: is not a split name (splits: train)",
        ),
        (
            _with(splits={"train": 0.5, "eval": 0.5}, output={"path": "o", "num_shards": {"train": 2}}),
            "output.num_shards: gives no shard count for split eval (give every split a count, or one integer for all)",
        ),
        (_with(output={"path": "o", "num_shards": {"train": -1}}), "output.num_shards.train: -1 is not a positive integer"),
        (
            _with(output={"path": "o", "num_shards": 2, "max_bytes_per_shard": "1GB"}),
            "output.max_bytes_per_shard: cannot be set together with num_shards (set one of them)",
        ),
        (
            _with(output={"path": "o", "max_bytes_per_shard": "256 MB/s"}),
            "output.max_bytes_per_shard: '256 MB/s' is not a positive size (an integer number of bytes, or a string like "
            "\"256MiB\"",
        ),
        (_with(output={"path": "o", "max_bytes_per_shard": 0}), "output.max_bytes_per_shard: 0 is not a positive size"),
        (_with(output={"path": "o", "compression": "snappy"}), "output.compression: 'snappy' is not one of none, gzip, zlib"),
        (
            _with(output={"path": "o", "compression": "gzp"}),
            "output.compression: 'gzp' is not one of none, gzip, zlib; did you mean 'gzip'?",
        ),
        (_with(errors={"on_bad_record": "ignore"}), "errors.on_bad_record: 'ignore' is not one of fail, skip, dead_letter"),
        (_with(errors={"max_bad_fraction": 1.5}), "errors.max_bad_fraction: 1.5 is not a number from 0.0 to 1.0"),
        ([], "(top level): expected a mapping with keys input, features"),
    ],
)
def test_each_problem_names_key_value_and_what_is_allowed(raw, message):
    assert message in _problems(raw)


def test_all_problems_are_reported_together_without_follow_on_noise():
    raw = _with(
        features={"dep_delay": {"type": "float", "on_null": "zero", "default": 0.0}},
        output={"path": "o", "compression": "lz4"},
        errors={"on_bad_record": "ignore"},
    )
    text = _problems(raw)
    assert text.startswith("<config>: 3 problems in the build config:\n")
    assert "features.dep_delay.on_null: 'zero' is not one of omit, default, error\n" in text
    assert "default" not in text.split("\n", 2)[2].split("output")[0].replace(
        "on_null: 'zero' is not one of omit, default, error", ""
    )
    assert "output.compression: 'lz4'" in text and "errors.on_bad_record: 'ignore'" in text


def test_parquet_length_without_separator_is_left_for_the_schema_check():
    config = parse_config(_with(input={"path": "a.parquet"}, features={"emb": {"type": "float", "length": 4}}))
    assert config.feature("emb").shape == (4,)


def test_defaults_are_stored_in_their_typed_form():
    config = parse_config(_with(features={
        "f": {"type": "float", "on_null": "default", "default": 0},
        "b": {"type": "bytes", "on_null": "default", "default": ""},
        "l": {"type": "int64", "separator": "|", "on_null": "default", "default": [0, 0]},
        "t": {"on_null": "default", "default": "x"},
    }))
    assert config.feature("f").default == 0.0 and isinstance(config.feature("f").default, float)
    assert config.feature("b").default == b""
    assert config.feature("l").default == (0, 0)
    assert config.feature("t").type is None and config.feature("t").default == "x"  # checked once the type is inferred


def test_max_bad_fraction_default_depends_on_the_action():
    assert parse_config(MINIMAL).errors.max_bad_fraction == 0.0
    assert parse_config(_with(errors={"on_bad_record": "skip"})).errors.max_bad_fraction == 0.1
    assert parse_config(_with(errors={"on_bad_record": "dead_letter", "max_bad_fraction": 1})).errors.max_bad_fraction == 1.0


@pytest.mark.parametrize(
    "text, size",
    [(1024, 1024), ("256MiB", 256 << 20), ("1GB", 10**9), ("1 GiB", 1 << 30), ("512kb", 512_000),
     ("1.5KiB", 1536), ("100", 100), ("100B", 100), ("2TiB", 2 << 40)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size
    assert parse_config(_with(output={"path": "o", "max_bytes_per_shard": text})).output.max_bytes_per_shard == size


@pytest.mark.parametrize("text", ["", "MiB", "1.5B", "-1MiB", "1 XB", True, 1.5])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_quote_char_null_disables_quoting_and_escape_char_is_kept():
    config = parse_config(_with(input={"path": "a.csv", "csv": {"quote_char": None, "escape_char": "\\", "delimiter": "|"}}))
    assert config.input.csv.quote_char is None and config.input.csv.escape_char == "\\"
    assert config.input.csv.delimiter == "|"


# ------------------------------------------------------------------------- checks against the input

CSV_SCHEMA = pa.schema([(name, pa.binary()) for name in ("id", "delay", "tailnum", "emb")])
CSV_SAMPLE = pa.record_batch(
    [pa.array(values, pa.binary()) for values in (
        [b"1", b"2"], [b"1.5", None], [b"N1", b""], [b"1;2", b"3;4"])], schema=CSV_SCHEMA)


def _csv_config(**sections):
    raw = {"input": {"path": "x.csv", "csv": {"null_values": ["NA"]}}, "output": {"path": "o"}}
    raw.update(sections)
    return parse_config(raw)


def test_features_left_out_become_every_column_with_inferred_types():
    resolved = validate_against_schema(_csv_config(), CSV_SCHEMA, CSV_SAMPLE)
    # The sample decides, as infer-config does: nulls in the sample -> omit, none -> a later null is a bad row.
    assert [(s.name, s.type, s.shape, s.on_null) for s in resolved.features] == [
        ("id", "int64", (), "error"), ("delay", "float", (), "omit"), ("tailnum", "bytes", (), "error"),
        ("emb", "int64", (2,), "error")]
    assert resolved.feature("emb").separator == ";"
    assert resolved.input.columns == ("id", "delay", "tailnum", "emb")


def test_listed_features_get_types_lists_and_the_projection():
    config = _csv_config(features={"emb": {"separator": ";"}, "d": {"source": "delay", "on_null": "default", "default": 0},
                                   "tailnum": {}}, split_key=["tailnum"])
    resolved = validate_against_schema(config, CSV_SCHEMA, CSV_SAMPLE)
    assert resolved.feature("emb") == FeatureSpec("emb", "int64", "emb", separator=";", is_list=True)
    assert resolved.feature("d") == FeatureSpec("d", "float", "delay", on_null="default", default=0.0)
    assert resolved.input.columns == ("emb", "delay", "tailnum")


@pytest.mark.parametrize(
    "sections, message",
    [
        (
            {"features": {"delay": {"source": "dealy"}}},
            "features.delay.source: column 'dealy' is not in the input (columns: id, delay, tailnum, emb); did you mean 'delay'?",
        ),
        (
            {"features": {"tailnmu": {"type": "bytes"}}},
            "features.tailnmu: column 'tailnmu' is not in the input (columns: id, delay, tailnum, emb); did you mean 'tailnum'?",
        ),
        (
            {"split_key": ["carrier"]},
            "split_key: 'carrier' is not a feature (features: id, delay, tailnum, emb); the split key is hashed from the "
            "converted values of the features it names",
        ),
        ({"features": {"d": {"source": "delay"}}, "split_key": ["delay"]}, "split_key: 'delay' is not a feature (features: d)"),
        ({"input": {"path": "x.csv", "columns": ["id", "nope"]}}, "input.columns: 'nope' is not a column of the input"),
        (
            {"input": {"path": "x.csv", "columns": ["id"]}, "features": {"delay": {"type": "float"}}},
            "features.delay: reads column 'delay', which input.columns leaves out",
        ),
        (
            {"features": {"id": {"on_null": "default", "default": "x"}}},
            "features.id.default: 'x' is not a int64 value (an integer from -2**63 to 2**63-1)",
        ),
        ({"features": {"id": {"type": "int64", "separator": ";", "length": 2}}}, None),
    ],
)
def test_schema_problems_name_the_key(sections, message):
    config = _csv_config(**sections)
    if message is None:
        assert validate_against_schema(config, CSV_SCHEMA, CSV_SAMPLE).feature("id").shape == (2,)
        return
    with pytest.raises(ConfigError) as caught:
        validate_against_schema(config, CSV_SCHEMA, CSV_SAMPLE)
    assert message in str(caught.value)


def test_parquet_schema_checks():
    schema = pa.schema([pa.field("f", pa.float64()), pa.field("ts", pa.timestamp("ms")),
                        pa.field("s", pa.struct([("a", pa.int32())])), pa.field("req", pa.int64(), nullable=False)])
    config = parse_config({"input": {"path": "x.parquet"}, "output": {"path": "o"},
                           "features": {"f": {"type": "int64"}, "ts": {}, "s_a": {"source": "s.a"}}})
    with pytest.raises(ConfigError) as caught:
        validate_against_schema(config, schema, where="x.parquet")
    text = str(caught.value)
    assert text.startswith("2 problems with the config on x.parquet:")
    assert "features.f: type int64 does not fit column 'f' of Arrow type double: a float column is never cast" in text
    assert "features.ts: column 'ts' has Arrow type timestamp[ms], which has no Example feature mapping" in text
    fixed = parse_config({"input": {"path": "x.parquet"}, "output": {"path": "o"},
                          "features": {"f": {"type": "float"}, "ts": {"type": "int64"}, "s_a": {"source": "s.a"}}})
    resolved = validate_against_schema(fixed, schema)
    assert [(s.name, s.type) for s in resolved.features] == [("f", "float"), ("ts", "int64"), ("s_a", "int64")]
    assert resolved.input.columns == ("f", "ts", "s")
    inferred = validate_against_schema(parse_config({"input": {"path": "x.parquet", "columns": ["f", "req"]},
                                                     "output": {"path": "o"}}), schema)
    assert [(s.name, s.on_null) for s in inferred.features] == [("f", "omit"), ("req", "error")]


def test_resolve_config_reads_the_first_input_file(tmp_path):
    (tmp_path / "b.csv").write_text("id,v\n1,x\n")
    (tmp_path / "a.csv").write_text("id,w\n1,2.5\n")
    resolved = resolve_config(parse_config({"input": {"path": str(tmp_path / "*.csv")}, "output": {"path": "o"}}))
    assert [(s.name, s.type) for s in resolved.features] == [("id", "int64"), ("w", "float")]  # from a.csv
    with pytest.raises(ConfigError, match="matches no files"):
        resolve_config(parse_config({"input": {"path": str(tmp_path / "*.tsv")}, "output": {"path": "o"}}))


def test_a_data_file_given_as_the_config_is_named_as_such_in_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_file = tmp_path / "flights.csv"
    csv_file.write_text("year,month,carrier\n" + "2013,1,UA\n" * 50_000)
    with pytest.raises(ConfigError) as caught:
        load_config(str(csv_file))
    message = str(caught.value)
    assert "not a YAML build config" in message and "year,month,carrier" in message
    assert len(message) < 400 and "\n" not in message and "2013,1,UA" not in message
    parquet_file = tmp_path / "flights.parquet"
    pq.write_table(pa.table({"year": [2013] * 10}), parquet_file)
    with pytest.raises(ConfigError) as caught:
        load_config(str(parquet_file))
    message = str(caught.value)
    assert "not a YAML build config" in message and "Parquet" in message and "infer-config" in message
    assert len(message) < 400 and "\n" not in message
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(b"\xff\xfe\x00junk" * 100)
    with pytest.raises(ConfigError, match="not a YAML build config") as caught:
        load_config(str(binary))
    assert len(str(caught.value)) < 400


def test_timestamp_features_and_boolean_tokens_parse_and_round_trip():
    config = parse_config({
        "input": {"path": "x.csv", "csv": {"true_values": ["TRUE", "yes"], "false_values": ["FALSE"]}},
        "output": {"path": "o"},
        "features": {"dep": {"type": "timestamp", "unit": "ms", "format": "%Y-%m-%d %H:%M"},
                     "arr": {"type": "timestamp"}, "late": {"type": "int64"}},
    })
    assert config.input.csv.true_values == ("TRUE", "yes") and config.input.csv.false_values == ("FALSE",)
    assert config.feature("dep") == FeatureSpec("dep", "int64", "dep", time_unit="ms", time_format="%Y-%m-%d %H:%M")
    assert config.feature("arr") == FeatureSpec("arr", "int64", "arr", time_unit="s")
    assert parse_config(config_to_dict(config)) == config
    assert config_to_dict(config)["features"]["dep"]["type"] == "timestamp"


@pytest.mark.parametrize("feature, message", [
    ({"type": "timestamp", "unit": "hours"}, "features.t.unit: 'hours' is not one of s, ms, us, ns"),
    ({"type": "int64", "format": "%Y"}, "features.t.format: is only used with type: timestamp"),
    ({"type": "timestamp", "separator": ";"}, "features.t.separator: a timestamp feature is one value"),
    ({"type": "timestamp", "format": ""}, "features.t.format: '' is not a non-empty string"),
])
def test_timestamp_feature_problems(feature, message):
    with pytest.raises(ConfigError) as caught:
        parse_config({"input": {"path": "x.csv"}, "output": {"path": "o"}, "features": {"t": feature}})
    assert message in str(caught.value)


def test_boolean_tokens_must_be_lists_of_strings_and_not_both():
    with pytest.raises(ConfigError, match=r"input.csv.true_values: 'yes' is not a list of strings"):
        parse_config({"input": {"path": "x.csv", "csv": {"true_values": "yes"}}, "output": {"path": "o"}})
    with pytest.raises(ConfigError, match=r"input.csv.false_values: 'T' is also in true_values"):
        parse_config({"input": {"path": "x.csv", "csv": {"true_values": ["T"], "false_values": ["T"]}},
                      "output": {"path": "o"}})


def test_avro_without_fastavro_is_one_config_line_saying_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastavro" else real(name, *a))
    assert _problems(_with(input={"path": "d/*.avro"})).endswith(
        "\n  input.format: avro needs the fastavro package, which is not installed: pip install 'tfrbeam[avro]'")
    monkeypatch.undo()
    assert parse_config(_with(input={"path": "d/*.avro"})).input.format == "avro"


def test_an_orc_avro_or_json_lines_file_given_as_the_config_is_one_line_naming_it(tmp_path):
    import fastavro
    import pyarrow as pa
    import pyarrow.orc as porc

    porc.write_table(pa.table({"id": [1, 2]}), tmp_path / "rows.orc")
    with open(tmp_path / "rows.avro", "wb") as out:
        fastavro.writer(out, {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}, [{"id": 1}])
    (tmp_path / "rows.jsonl").write_text('{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n')
    for name, kind in (("rows.orc", "an ORC"), ("rows.avro", "an Avro"), ("rows.jsonl", "a JSON lines")):
        with pytest.raises(ConfigError) as caught:
            load_config(str(tmp_path / name))
        message = str(caught.value)
        assert message == (f"{tmp_path / name}: not a YAML build config but {kind} data file; write one with: "
                           "tfrbeam infer-config DATA_FILE > build.yaml"), message


def test_the_effective_seed_is_the_seed_only_when_the_rows_are_shuffled():
    """One home for "which seed orders this build": the manifest, the shard graph and the sequence build ask it."""
    assert ShuffleConfig(enabled=True, seed=7).effective_seed == 7
    assert ShuffleConfig(enabled=False, seed=7).effective_seed is None
