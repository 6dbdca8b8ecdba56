"""CSV inference of codes and exactness (issue 24): ZIP codes and ids beyond int64 stay text, NA is decided per
column, and floats float32 cannot hold are named."""

from __future__ import annotations

import logging

import pyarrow as pa
import yaml

from tfrbeam.build.config import load_config, resolve_config
from tfrbeam.build.features import infer_text_type
from tfrbeam.build.infer import _sniff_csv, infer_config
from tfrbeam.build.inputs import convert_source_batch, read_csv_file


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
    with caplog.at_level(logging.WARNING, logger="tfrbeam.build.config"):
        built = built_features(tmp_path, data)
    assert built["day"].type == "float"
    lines = [record.getMessage() for record in caplog.records if "float32" in record.getMessage()]
    assert len(lines) == 1 and "'day'" in lines[0] and "16777217.0" in lines[0] and "16777216" in lines[0]


def test_a_declared_float_feature_with_such_values_is_named_in_the_build_log_too(tmp_path, caplog):
    data = tmp_path / "ids.csv"
    data.write_text("id\n123456789\n5\n")
    with caplog.at_level(logging.WARNING, logger="tfrbeam.build.config"):
        resolve_config(load(tmp_path, f"input: {{path: '{data}'}}\nfeatures: {{id: {{type: float}}}}\n"
                                      f"output: {{path: '{tmp_path / 'out'}'}}\n"))
    lines = [record.getMessage() for record in caplog.records if "float32" in record.getMessage()]
    assert len(lines) == 1 and "'id'" in lines[0] and "123456792" in lines[0]
