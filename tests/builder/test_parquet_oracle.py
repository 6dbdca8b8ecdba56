"""Apache's parquet-testing files, checked against pyarrow's own read of each file (the oracle).

- Reading: our rows are pyarrow's rows (``pq.read_table`` with page checksums verified); where
  pyarrow refuses a file, we refuse it with our InputError naming the file.
- Converting (with the features the build infers when the config leaves them out: casts for
  timestamps and decimals, one feature per struct field): every row is either converted, with
  the values pyarrow's cast to the feature's type gives, or a bad row because it holds a null
  where an Example cannot (a null list item, or a null in an ``on_null: error`` feature).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pyarrow as pa
import pytest

from tests.helpers import expected_bad, expected_rows, pyarrow_read, same_values
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.errors import ConfigError, InputError

ROOT = pathlib.Path(__file__).resolve().parents[1] / "data" / "parquet-testing"
DATA_FILES = sorted(path.name for path in (ROOT / "data").glob("*.parquet"))
BAD_FILES = sorted(path.name for path in (ROOT / "bad_data").glob("*.parquet"))


def test_the_files_are_all_here(parquet_testing):
    assert len(DATA_FILES) == 28 and len(BAD_FILES) == 8
    assert (parquet_testing / "data").resolve() == (ROOT / "data").resolve()


@pytest.mark.parametrize("name", DATA_FILES)
def test_our_read_is_pyarrows_read(name):
    path = ROOT / "data" / name
    oracle = pyarrow_read(path)
    if isinstance(oracle, Exception):
        with pytest.raises(InputError, match=str(path)):
            list(read_parquet_file(str(path)))
        return
    sources = list(read_parquet_file(str(path)))
    ours = pa.Table.from_batches([source.batch for source in sources], schema=oracle.schema) if sources else oracle.slice(0, 0)
    assert ours.schema.equals(oracle.schema, check_metadata=False)
    # Arrow's own comparison first (it converts no values to Python; int96 dates overflow datetime);
    # only a NaN, which Arrow calls unequal to itself, needs the value-by-value comparison.
    assert ours.equals(oracle) or same_values(ours.to_pylist(), oracle.to_pylist())
    lines = [int(line) for source in sources for line in source.lines]
    assert lines == list(range(1, oracle.num_rows + 1))


@pytest.mark.parametrize("name", DATA_FILES)
def test_converted_rows_are_pyarrows_values_and_bad_rows_are_the_unrepresentable_ones(name):
    path = ROOT / "data" / name
    oracle = pyarrow_read(path)
    try:
        config = resolve_config(parse_config({"input": {"path": str(path)}, "output": {"path": "o"}}))
    except ConfigError as error:  # no column maps to a feature
        assert str(path) in str(error) and "features" in str(error)
        return
    if isinstance(oracle, Exception):
        return  # refused when read: test_our_read_is_pyarrows_read
    rows = expected_rows(oracle, config.features)
    kept_rows: list[dict] = []
    kept_lines: list[int] = []
    bad_lines: list[int] = []
    for source in read_parquet_file(str(path), config.input.columns):
        converted = convert_source_batch(source, config.features)
        kept_rows += converted.batch.to_pylist()
        kept_lines += [int(source.lines[index]) for index in converted.kept_rows]
        bad_lines += [row.line for row in converted.bad_rows]
    assert sorted(kept_lines + bad_lines) == list(range(1, len(rows) + 1))
    assert bad_lines == [line for line in range(1, len(rows) + 1) if expected_bad(rows[line - 1], config.features)]
    for line, ours in zip(kept_lines, kept_rows):
        for spec in config.features:
            value = rows[line - 1][spec.name]
            if value is None and spec.on_null == "omit":
                assert ours.get(spec.name) is None, (name, line, spec.name)
                continue
            assert same_values(ours[spec.name], value), (name, line, spec.name, ours[spec.name], value)


_BAD_FILE_PROBE = """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.errors import TfrbeamError
path = sys.argv[1]
try:
    table = pq.read_table(path, page_checksum_verification=True)
    oracle = {"outcome": "ok", "rows": table.num_rows}
except (OSError, pa.ArrowException) as error:
    oracle = {"outcome": "error", "message": str(error)}
try:
    rows = sum(source.batch.num_rows for source in read_parquet_file(path))
    ours = {"outcome": "ok", "rows": rows}
except TfrbeamError as error:
    ours = {"outcome": type(error).__name__, "message": str(error)}
print(json.dumps({"oracle": oracle, "ours": ours}))
"""


@pytest.mark.parametrize("name", BAD_FILES)
def test_malformed_files_fail_exactly_where_pyarrow_fails(name):
    """In a subprocess: a malformed file must not crash the interpreter (pyarrow's or ours)."""
    path = str(ROOT / "bad_data" / name)
    done = subprocess.run([sys.executable, "-c", _BAD_FILE_PROBE, path], capture_output=True, text=True, timeout=120,
                          cwd=ROOT.parents[2])
    assert done.returncode == 0, f"{name} crashed the reader (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    oracle, ours = result["oracle"], result["ours"]
    if oracle["outcome"] == "ok":
        assert ours == oracle
    else:
        assert ours["outcome"] == "InputError" and path in ours["message"], ours
