"""infer-config on CSV files as new users bring them (issue 42): a header of years, a count line above the rows,
ragged lines, R's NA in text columns. The third-party files are in tests/data/new-user-csv/ (see its README)."""

from __future__ import annotations

import pathlib

import pandas as pd
import pytest
import yaml

from tfrbeam.builder.config import load_config
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.csv import read_csv_file
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.cli.main import main as cli_main

NEW_USER_CSV = pathlib.Path(__file__).resolve().parents[2] / "data" / "new-user-csv"
FERTILITY = NEW_USER_CSV / "fertility.csv"
BREAST_CANCER = NEW_USER_CSV / "breast_cancer.csv"
PENGUINS_RAW = NEW_USER_CSV / "penguins-raw.csv"


def load(tmp_path, text: str):
    path = tmp_path / "inferred.yaml"
    path.write_text(text)
    return load_config(str(path))


def built_columns(config) -> tuple[dict[str, list], int]:
    """Every converted column of the config's CSV input (as Python lists), and the count of bad rows."""
    columns: dict[str, list] = {}
    bad = 0
    for source in read_csv_file(config.input.path, config.input.csv, config.input.columns):
        result = convert_source_batch(source, config.features)
        bad += len(result.bad_rows)
        for name in result.batch.schema.names:
            columns.setdefault(name, []).extend(result.batch.column(name).to_pylist())
    return columns, bad


def comments(text: str) -> str:
    """The comment lines of a written config as one text (a sentence may be wrapped over lines)."""
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


# ------------------------------------------------------------------------------- a header of years


def test_a_header_naming_columns_by_year_is_a_header(tmp_path):
    """statsmodels' fertility.csv: `Country Name,...,1960,...,2013` over 219 rows; pandas reads the header, so do we."""
    text = infer_config(str(FERTILITY))
    raw = yaml.safe_load(text)
    assert raw["input"]["csv"]["header"] is True and raw["input"]["csv"]["column_names"] is None
    assert list(raw["features"]) == list(pd.read_csv(FERTILITY).columns)  # 'Country Name', ..., '1960', ..., '2013'
    assert "No header line was detected" not in text
    assert '"1960" over numbers like "4.82"' in comments(text)  # says why it decided
    assert "--no-header" in comments(text)
    config = resolve_config(load(tmp_path, text))
    columns, bad = built_columns(config)
    assert bad == 0
    assert len(columns["Country Name"]) == 219  # one example per data row, the header not among them
    assert "Country Name" not in columns["Country Name"] and b"Country Name" not in columns["Country Name"]
    assert columns["Country Code"][:2] == [b"ABW", b"AND"]
    assert columns["1960"][0] == pytest.approx(4.82)


def test_a_wide_header_of_consecutive_years_over_whole_numbers_is_a_header(tmp_path):
    """Years over counts (a population table): the type alone cannot tell; a run of years no row repeats can."""
    data = tmp_path / "population.csv"
    data.write_text("Country,1960,1961,1962,1963\nAruba,54208,55434,56234,56699\nAndorra,13414,14376,15376,16410\n"
                    "Angola,5454938,5531451,5608499,5679409\n")
    raw = yaml.safe_load(infer_config(str(data)))
    assert raw["input"]["csv"]["header"] is True
    assert list(raw["features"]) == ["Country", "1960", "1961", "1962", "1963"]


@pytest.mark.parametrize("content", [
    "5.1,3.5,1.4,0.2,Iris-setosa\n4.9,3.0,1.4,0.2,Iris-setosa\n6.3,3.3,6.0,2.5,Iris-virginica\n",  # iris, headerless
    "5,3,1\n4.9,3.0,1.4\n4.7,3.2,1.3\n",  # whole numbers first, over decimals: still numbers among numbers
    "1,Alice,30\n2,Bob,25\n3,Carol,41\n",
    "7,8,9,Alice\n4,5,6,Bob\n1,2,3,Carol\n",  # a run of integers that the rows below repeat: not names
])
def test_a_first_line_of_data_is_still_data(tmp_path, content):
    data = tmp_path / "rows.csv"
    data.write_text(content)
    text = infer_config(str(data))
    assert yaml.safe_load(text)["input"]["csv"]["header"] is False
    assert "# No header line was detected: the columns got names; rename them in column_names." in text
    assert "--header" in comments(text)


def test_header_and_no_header_force_the_decision(tmp_path, capsys):
    text = infer_config(str(FERTILITY), header=False)
    raw = yaml.safe_load(text)
    assert raw["input"]["csv"]["header"] is False
    assert raw["input"]["csv"]["column_names"] == [f"column_{index}" for index in range(58)]
    assert "--no-header" in comments(text)
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("1,2\n3,4\n")
    assert cli_main(["infer-config", str(numbers), "--header"]) == 0
    raw = yaml.safe_load(capsys.readouterr().out)
    assert raw["input"]["csv"]["header"] is True and list(raw["features"]) == ["1", "2"]
    assert cli_main(["infer-config", str(FERTILITY), "--no-header"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["input"]["csv"]["header"] is False


# --------------------------------------------------------------------------- title lines, ragged lines


def test_a_count_line_above_the_rows_is_skipped_not_made_the_columns(tmp_path):
    """scikit-learn's breast_cancer.csv: `569,30,malignant,benign` above 569 rows of 31 numbers, no header."""
    text = infer_config(str(BREAST_CANCER))
    raw = yaml.safe_load(text)
    csv = raw["input"]["csv"]
    assert csv["skip_rows"] == 1 and csv["header"] is False
    assert csv["column_names"] == [f"column_{index}" for index in range(31)]
    assert "569,30,malignant,benign" in comments(text)  # names the line it skipped, and why
    config = resolve_config(load(tmp_path, text))
    columns, bad = built_columns(config)
    assert bad == 0 and len(columns["column_0"]) == 569
    assert columns["column_0"][0] == pytest.approx(17.99) and columns["column_30"][:2] == [0, 0]
    frame = pd.read_csv(BREAST_CANCER, skiprows=1, header=None)  # what a pandas user writes for it
    assert frame.shape == (569, 31) and list(frame[30]) == columns["column_30"]


def test_a_count_line_padded_with_empty_fields_is_skipped_too(tmp_path):
    """Other scikit-learn versions pad the count line to the row's width: `569,30,malignant,benign,,,...`."""
    lines = BREAST_CANCER.read_text().splitlines()
    data = tmp_path / "padded.csv"
    data.write_text("\n".join([lines[0] + "," * 27, *lines[1:40]]) + "\n")
    raw = yaml.safe_load(infer_config(str(data)))
    assert raw["input"]["csv"]["skip_rows"] == 1 and raw["input"]["csv"]["header"] is False
    assert len(raw["features"]) == 31


def test_ragged_lines_are_named_in_a_comment(tmp_path):
    data = tmp_path / "ragged.csv"
    rows = ["a,b,c"] + [f"{i},{i + 1},x{i}" for i in range(20)]
    rows[5] = "4,5,x4,extra"
    rows[9] = "8,9"
    data.write_text("\n".join(rows) + "\n")
    text = infer_config(str(data))
    assert yaml.safe_load(text)["input"]["csv"]["header"] is True
    note = comments(text)
    assert "2 of the 20 sampled rows have another number of fields than the header's 3" in note
    assert "line 6: 4 fields" in note and "line 10: 2 fields" in note
    assert "each is a bad row in the build" in note


def test_a_header_one_field_short_names_the_row_name_column(tmp_path):
    """R's write.table: the header leaves out the row-name column; pandas makes it the index, we name it column_0."""
    data = tmp_path / "r_table.csv"
    data.write_text('"mpg","cyl"\n"Mazda RX4",21,6\n"Datsun 710",22.8,4\n"Valiant",18.1,6\n')
    text = infer_config(str(data))
    csv = yaml.safe_load(text)["input"]["csv"]
    assert (csv["skip_rows"], csv["header"], csv["column_names"]) == (1, False, ["column_0", "mpg", "cyl"])
    columns, bad = built_columns(resolve_config(load(tmp_path, text)))
    assert bad == 0 and columns["column_0"] == [b"Mazda RX4", b"Datsun 710", b"Valiant"] and columns["cyl"] == [6, 4, 6]


def test_a_header_one_field_short_of_rows_ending_in_a_delimiter_names_the_empty_last_column(tmp_path):
    data = tmp_path / "trailing.csv"
    data.write_text("a,b\n1,x,\n2,y,\n3,z,\n")
    text = infer_config(str(data))
    csv = yaml.safe_load(text)["input"]["csv"]
    assert (csv["skip_rows"], csv["header"], csv["column_names"]) == (1, False, ["a", "b", "column_2"])
    columns, bad = built_columns(resolve_config(load(tmp_path, text)))
    assert bad == 0 and columns["a"] == [1, 2, 3] and columns["b"] == [b"x", b"y", b"z"]


# ----------------------------------------------------------------------------------- R's NA everywhere


def test_r_written_na_is_null_in_text_columns_too(tmp_path):
    """penguins-raw (readr): NA is missing in Sex and Comments as in the number columns (11 and 290 times)."""
    text = infer_config(str(PENGUINS_RAW))
    raw = yaml.safe_load(text)
    assert raw["input"]["csv"]["null_values"] == ["NA"]
    for name in ("Sex", "Comments"):
        assert raw["features"][name] == {"type": "bytes", "on_null": "omit"}, name
    assert "Sex" in comments(text) and "Comments" in comments(text)  # the decision is said
    config = resolve_config(load(tmp_path, text))
    columns, bad = built_columns(config)
    assert bad == 0
    assert sorted(set(columns["Sex"]) - {None}) == [b"FEMALE", b"MALE"] and columns["Sex"].count(None) == 11
    assert columns["Comments"].count(None) == 290 and b"NA" not in columns["Comments"]
    frame = pd.read_csv(PENGUINS_RAW)
    assert int(frame["Sex"].isna().sum()) == 11 and int(frame["Comments"].isna().sum()) == 290
    built = resolve_config(load(tmp_path, f"input: {{path: '{PENGUINS_RAW}'}}\noutput: {{path: '{tmp_path / 'o'}'}}\n"))
    assert built.features == config.features  # one inference path: the build infers the same


def test_a_code_column_keeps_na_as_namibia_while_the_file_s_other_text_columns_null_it(tmp_path):
    data = tmp_path / "mixed.csv"
    data.write_text("code,sex,mass\nUS,MALE,3750\nNA,FEMALE,NA\nDE,NA,4500\nFR,MALE,3900\n")
    text = infer_config(str(data))
    raw = yaml.safe_load(text)
    assert raw["features"]["code"]["null_values"] == []
    assert raw["features"]["sex"] == {"type": "bytes", "on_null": "omit"}
    assert "code" in comments(text) or "its shape" in text
    columns, bad = built_columns(resolve_config(load(tmp_path, text)))
    assert bad == 0
    assert columns["code"] == [b"US", b"NA", b"DE", b"FR"]
    assert columns["sex"] == [b"MALE", b"FEMALE", None, b"MALE"]
