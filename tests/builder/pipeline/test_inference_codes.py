"""CSV inference of codes and exactness (issue 24): ZIP codes and ids beyond int64 stay text, NA is decided per
column, and floats float32 cannot hold are named."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
import yaml

from tfrbeam.builder.config import config_to_dict, load_config, parse_config
from tfrbeam.builder.features.convert import infer_text_type
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.csv import read_csv_file
from tfrbeam.builder.pipeline.infer_config import _sniff_csv, infer_config
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.example import decode_example
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import read_records


def load(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(str(path))


def built_features(tmp_path, data) -> dict:
    """The features a build that leaves features out infers, by name."""
    config = resolve_config(load(tmp_path, f"input: {{path: '{data}'}}\noutput: {{path: '{tmp_path / 'out'}'}}\n"))
    return {spec.name: spec for spec in config.features}


def inferred_features(tmp_path, data) -> tuple[str, dict]:
    """The YAML infer-config writes and the features of that config once resolved."""
    text = infer_config(str(data))
    config = resolve_config(load(tmp_path, text))
    return text, {spec.name: spec for spec in config.features}


def converted(config_features, config, path) -> dict:
    """Every converted column of a CSV file under resolved features, as Python lists."""
    columns: dict[str, list] = {}
    for source in read_csv_file(str(path), config.input.csv, config.input.columns):
        result = convert_source_batch(source, config_features)
        assert not result.bad_rows, result.bad_rows
        for name in result.batch.schema.names:
            columns.setdefault(name, []).extend(result.batch.column(name).to_pylist())
    return columns


# --------------------------------------------------------------------------------- (a) leading zeros


def test_zip_codes_with_a_leading_zero_are_text_in_the_build_and_in_infer_config(tmp_path):
    data = tmp_path / "places.csv"
    data.write_text("zip,count,ratio,delta\n02134,0,0.5,-0.5\n10001,7,1.5,2\n94105,12,0,-1\n")
    built = built_features(tmp_path, data)
    assert built["zip"].type == "bytes"
    assert (built["count"].type, built["ratio"].type, built["delta"].type) == ("int64", "float", "float")
    text, inferred = inferred_features(tmp_path, data)
    assert "  zip: {type: bytes, on_null: error}" in text
    assert inferred == built
    config = resolve_config(load(tmp_path, text))
    assert converted(config.features, config, data)["zip"] == [b"02134", b"10001", b"94105"]


def test_the_leading_zero_rule_is_a_zero_before_a_digit():
    as_type = lambda *values: infer_text_type(pa.array(list(values)))
    assert as_type("007", "12") == "bytes"
    assert as_type("-007", "12") == "bytes"
    assert as_type("00.5", "1") == "bytes"
    assert as_type("0", "-0", "12") == "int64"
    assert as_type("0.5", "-0.5", "0e3") == "float"


def test_a_header_row_over_a_leading_zero_column_is_still_a_header(tmp_path):
    with_header = tmp_path / "with_header.csv"
    with_header.write_text("zip,city\n02134,Boston\n10001,New York\n")
    options, _, _ = _sniff_csv(str(with_header))
    assert options.header is True
    without_header = tmp_path / "without_header.csv"
    without_header.write_text("02134,Boston\n10001,New York\n")
    options, notes, _ = _sniff_csv(str(without_header))
    assert options.header is False and options.column_names == ("column_0", "column_1")
    assert any("No header line was detected" in note for note in notes)


# ------------------------------------------------------------------------------ (b) beyond int64


def test_an_integer_beyond_int64_makes_the_column_text_not_a_rounded_float(tmp_path):
    data = tmp_path / "ids.csv"
    data.write_text("id,small\n12345678901234567890,1\n42,2\n")
    built = built_features(tmp_path, data)
    assert built["id"].type == "bytes" and built["small"].type == "int64"
    text, inferred = inferred_features(tmp_path, data)
    assert "  id: {type: bytes, on_null: error}" in text
    assert inferred == built
    config = resolve_config(load(tmp_path, text))
    assert converted(config.features, config, data)["id"] == [b"12345678901234567890", b"42"]
    assert infer_text_type(pa.array(["-9223372036854775808", "9223372036854775807"])) == "int64"
    assert infer_text_type(pa.array(["-9223372036854775809"])) == "bytes"
    assert infer_text_type(pa.array(["1.5", "99999999999999999999"])) == "bytes"


# ------------------------------------------------------------------------ (d) float32 exactness


def test_whole_floats_float32_cannot_hold_are_named_in_infer_config_and_the_build_log(tmp_path, caplog):
    data = tmp_path / "dates.csv"
    data.write_text("day,ratio\n16777217.0,0.5\n20120101.0,1.25\n3.0,2\n")
    text = infer_config(str(data))
    day_line = next(line for line in text.splitlines() if line.startswith("  day:"))
    assert day_line.startswith("  day: {type: float, on_null: error}   # ")
    assert "float32 rounds 16777217.0 to 16777216" in day_line and "type: bytes" in day_line
    ratio_line = next(line for line in text.splitlines() if line.startswith("  ratio:"))
    assert ratio_line == "  ratio: {type: float, on_null: error}"
    assert yaml.safe_load(text)["features"]["day"] == {"type": "float", "on_null": "error"}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfrbeam.builder.pipeline.resolve"):
        built = built_features(tmp_path, data)
    assert built["day"].type == "float"
    lines = [record.getMessage() for record in caplog.records if "float32" in record.getMessage()]
    assert len(lines) == 1 and "'day'" in lines[0] and "16777217.0" in lines[0] and "16777216" in lines[0]


def test_a_declared_float_feature_with_such_values_is_named_in_the_build_log_too(tmp_path, caplog):
    data = tmp_path / "ids.csv"
    data.write_text("id\n123456789\n5\n")
    with caplog.at_level(logging.WARNING, logger="tfrbeam.builder.pipeline.resolve"):
        resolve_config(load(tmp_path, f"input: {{path: '{data}'}}\nfeatures: {{id: {{type: float}}}}\n"
                                      f"output: {{path: '{tmp_path / 'out'}'}}\n"))
    lines = [record.getMessage() for record in caplog.records if "float32" in record.getMessage()]
    assert len(lines) == 1 and "'id'" in lines[0] and "123456792" in lines[0]


# ------------------------------------------------------------------------- (c) null tokens per column

COUNTRIES = "code,population,name\nUS,331,United States\nNA,2.5,Namibia\nDE,NA,Germany\nFR,68,France\n"


def test_na_is_a_value_in_a_text_column_and_null_in_a_number_column(tmp_path):
    data = tmp_path / "countries.csv"
    data.write_text(COUNTRIES)
    text, inferred = inferred_features(tmp_path, data)
    raw = yaml.safe_load(text)
    assert raw["input"]["csv"]["null_values"] == ["NA"]
    assert raw["features"]["code"] == {"type": "bytes", "on_null": "error", "null_values": []}
    assert raw["features"]["population"] == {"type": "float", "on_null": "omit"}
    assert "null_values" not in raw["features"]["name"]  # it holds no NA: the file-wide tokens apply
    built = built_features(tmp_path, data)
    assert built == inferred  # one inference path
    config = resolve_config(load(tmp_path, text))
    columns = converted(config.features, config, data)
    assert columns["code"] == [b"US", b"NA", b"DE", b"FR"]
    assert columns["population"] == [331.0, 2.5, None, 68.0]


def test_a_per_feature_null_values_overrides_the_file_wide_list_in_the_build(tmp_path):
    data = tmp_path / "countries.csv"
    data.write_text(COUNTRIES + ",,\n")
    config = resolve_config(load(tmp_path, f"""
input: {{path: '{data}', csv: {{null_values: ["", "NA"]}}}}
features:
  code: {{type: bytes, on_null: omit, null_values: [""]}}
  code_text: {{type: bytes, source: code, null_values: []}}
  population: {{type: float, on_null: omit}}
  name: {{type: bytes, on_null: omit, null_values: ["Germany"]}}
output: {{path: '{tmp_path / "out"}'}}
"""))
    assert config.feature("code").null_values == ("",) and config.feature("population").null_values is None
    columns = converted(config.features, config, data)
    assert columns["code"] == [b"US", b"NA", b"DE", b"FR", None]
    assert columns["code_text"] == [b"US", b"NA", b"DE", b"FR", b""]  # nothing is null for it, "" is a value
    assert columns["population"] == [331.0, 2.5, None, 68.0, None]
    assert columns["name"] == [b"United States", b"Namibia", None, b"France", b""]


def test_a_quoted_token_stays_a_value_under_per_feature_null_values(tmp_path):
    data = tmp_path / "quoted.csv"
    data.write_text('code,n\n"NA",1\nNA,2\n,3\n')
    config = resolve_config(load(tmp_path, f"""
input: {{path: '{data}', csv: {{null_values: []}}}}
features:
  code: {{type: bytes, on_null: omit, null_values: ["NA"]}}
  n: {{type: int64}}
output: {{path: '{tmp_path / "out"}'}}
"""))
    assert converted(config.features, config, data)["code"] == [b"NA", None, b""]


def test_na_in_a_text_column_whose_strings_are_quoted_stays_null(tmp_path):
    """R's write.csv quotes every string and writes a missing one as a bare NA: there the file tells them apart."""
    data = tmp_path / "penguins.csv"
    data.write_text('"species","sex","mass"\n"Adelie","male",3750\n"Adelie",NA,NA\n"Gentoo","female",4500\n')
    text, inferred = inferred_features(tmp_path, data)
    assert "null_values" not in yaml.safe_load(text)["features"]["sex"]
    assert inferred["sex"].on_null == "omit"


def test_per_feature_null_values_are_refused_where_they_cannot_apply():
    with pytest.raises(ConfigError, match=r"features.f.null_values: .*only for CSV inputs"):
        parse_config({"input": {"path": "x.parquet"}, "output": {"path": "o"}, "features": {"f": {"null_values": []}}})
    with pytest.raises(ConfigError, match=r"features.f.null_values: 'NA' is not a list of strings"):
        parse_config({"input": {"path": "x.csv"}, "output": {"path": "o"}, "features": {"f": {"null_values": "NA"}}})


def test_a_build_with_features_left_out_keeps_namibia_and_nulls_the_missing_population(tmp_path):
    data = tmp_path / "countries.csv"
    data.write_text(COUNTRIES)
    config = {"input": {"path": str(data)}, "splits": {"train": 1.0},
              "output": {"path": str(tmp_path / "out"), "num_shards": 1}}
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(config))
    assert build_main([str(path), "--quiet"]) == 0  # errors.on_bad_record is fail: no row may be bad
    shards = sorted((tmp_path / "out" / "train").glob("*.tfrecord*"))
    rows = [decode_example(payload) for shard in shards for payload in read_records(str(shard))]
    by_name = {row["name"][0]: row for row in rows}
    assert by_name[b"Namibia"]["code"] == [b"NA"]
    assert "population" not in by_name[b"Germany"]
    manifest_config = resolve_config(load(tmp_path, yaml.safe_dump(config)))
    assert parse_config(config_to_dict(manifest_config)) == manifest_config  # per-feature null_values round-trip
