"""Resolving a config against its input (tfrbeam.builder.pipeline.resolve): the input is sampled once, the result is unchanged."""

from __future__ import annotations

import collections
import random

import pytest
from apache_beam.io.filesystems import FileSystems

import tfrbeam.builder.inputs.csv as csv_read
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.config.schema import CsvOptions, InputConfig
from tfrbeam.builder.inputs.sample import inspect_input, read_csv_sample
from tfrbeam.builder.pipeline.resolve import resolve_config

# Codes (NA is Namibia) quoted as strings, a bare NA where one is missing, NA in a number column: the
# inference reads the sample as it is, with NA as a null token, and with the codes as probe tokens.
CODES = 'code,population,name\n"US",331,"United States"\n"NA",2.5,"Namibia"\nNA,NA,"Nowhere"\n"FR",68,"France"\n'


@pytest.fixture
def opened(monkeypatch) -> collections.Counter:
    """How many times each input path is opened: a local one proven a regular file (every local input read goes
    there), any other through Beam's FileSystems."""
    from tfrbeam.builder.inputs import compressed

    counts: collections.Counter = collections.Counter()

    def counted(original):
        def counting(path, *args, **kwargs):
            counts[path] += 1
            return original(path, *args, **kwargs)
        return counting

    monkeypatch.setattr(FileSystems, "open", counted(FileSystems.open))
    monkeypatch.setattr(compressed, "open_regular", counted(compressed.open_regular))
    return counts


def _csv_config(tmp_path, pattern: str, **csv) -> dict:
    return {"input": {"path": pattern, **({"csv": csv} if csv else {})}, "output": {"path": str(tmp_path / "out")}}


def test_csv_resolution_with_inferred_tokens_reads_the_first_file_once(tmp_path, opened):
    for index in range(3):
        (tmp_path / f"codes-{index}.csv").write_text(CODES)
    config = resolve_config(parse_config(_csv_config(tmp_path, str(tmp_path / "codes-*.csv"))))
    assert dict(opened) == {str(tmp_path / "codes-0.csv"): 1}  # the sample is read once; later files not at all
    assert config.input.csv.null_values == ("NA",)
    assert config.feature("code").type == "bytes" and config.feature("code").null_values is None  # quoted: NA is null
    assert config.feature("population").type == "float" and config.feature("population").on_null == "omit"


def test_csv_resolution_of_a_header_only_file_reads_it_once(tmp_path, opened):
    path = tmp_path / "empty.csv"
    path.write_text("a,b\n")
    config = resolve_config(parse_config(_csv_config(tmp_path, str(path))))
    assert dict(opened) == {str(path): 1}
    assert [spec.name for spec in config.features] == ["a", "b"]


def test_parquet_resolution_with_required_checksums_reads_each_footer_once(tmp_path, opened):
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = [tmp_path / f"p-{index}.parquet" for index in range(2)]
    for path in paths:
        pq.write_table(pa.table({"x": [1, 2]}), path, write_page_checksum=True)
    raw = {"input": {"path": str(tmp_path / "p-*.parquet"), "parquet": {"require_checksums": True}},
           "output": {"path": str(tmp_path / "out")}}
    config = resolve_config(parse_config(raw))
    assert dict(opened) == {str(path): 1 for path in paths}
    assert [spec.name for spec in config.features] == ["x"]


def _random_csv(rng: random.Random) -> str:
    """Rows with quoted and bare tokens, quoted line breaks, blank lines, CRLF, short rows, empty cells and
    undecodable bytes (marked as U+DC00 + byte, written back as the byte)."""
    tokens = ["NA", "NULL", "", "x", "a,b", "y\nz", "1", "2.5", "-", "N/A", "\udcff"]
    lines = ["c0,c1,c2"]
    for _ in range(rng.randint(0, 40)):
        cells = []
        width = rng.choice([3, 3, 3, 3, 2])
        for _ in range(width):
            value = rng.choice(tokens if width == 3 else tokens[:-1])  # a short row with an undecodable byte fails
            quoted = rng.random() < 0.4 or "," in value or "\n" in value
            cells.append(f'"{value}"' if quoted else value)
        lines.append(",".join(cells))
        if rng.random() < 0.1:
            lines.append("")
    return rng.choice(["\n", "\r\n"]).join(lines) + rng.choice(["", "\n"])


@pytest.mark.parametrize("seed", range(12))
def test_the_sample_parsed_again_with_null_values_equals_reading_the_file_with_them(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(csv_read, "_CSV_BLOCK_BYTES", 64)  # many batches, rows in several of them
    path = tmp_path / "random.csv"
    path.write_bytes(_random_csv(rng).encode("utf-8", "surrogateescape"))
    base = InputConfig(format="csv", path=str(path), csv=CsvOptions(null_values=()))
    sample = read_csv_sample(base, sample_rows=25)
    assert sample.inspected.sample.equals(inspect_input(base, sample_rows=25).sample)
    for null_values in [("NA",), ("NA", "NULL", ""), ("x", "a,b", "y\nz", "-")]:
        read = inspect_input(InputConfig(format="csv", path=str(path), csv=CsvOptions(null_values=null_values)),
                             sample_rows=25)
        again = sample.with_null_values(null_values)
        assert again.path == read.path and again.schema.equals(read.schema)
        assert again.sample.equals(read.sample), null_values
