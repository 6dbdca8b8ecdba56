"""JSON lines have a line cap, input.jsonl.max_row_bytes (64 MiB, as CSV's), and long lines cost linear time
(issue 43, item 3).

Measured before: a 100 MB line took 14 s and 842 MB (each 4 MiB read copied the line so far), a 500 KB .jsonl.gz
holding one 500 MB line was killed at 150 s and 2.7 GB. A line over the cap is now a bad row naming the file, its
line, its byte offset, the cap and the key that raises it; the lines after it are read on.
"""

from __future__ import annotations

import gzip
import json
import pathlib

import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import tfrbeam.builder.inputs.jsonl as jsonl_read
from tests.builder.inputs.bounded import run_bounded
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.config.parse import config_to_dict
from tfrbeam.builder.inputs.jsonl import jsonl_holds_lines, jsonl_schema, read_jsonl_file, read_jsonl_range
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import ConfigError

_X_MEMBER = gzip.compress(b"x" * (16 << 20), compresslevel=9)  # ~16 KB: 16 MiB of "x"


def _gzip_with_a_long_line(path: pathlib.Path, value_mib: int) -> None:
    """A .jsonl.gz (concatenated gzip members, as gzip reads them) of one line whose value is value_mib MiB of "x",
    then two short lines; built from one compressed member repeated, never the whole line in memory."""
    with open(path, "wb") as handle:
        handle.write(gzip.compress(b'{"a": "'))
        for _ in range(value_mib // 16):
            handle.write(_X_MEMBER)
        handle.write(gzip.compress(b'"}\n{"a": "ok"}\n{"a": "fine"}\n'))


_READ = """
rows, bad = [], []
for source in read_jsonl_file({path!r}, pa.schema([("a", pa.string())]){options}):
    rows += [(line, len(row["a"])) for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
    bad += [(row.line, row.reason, len(row.raw)) for row in source.bad_rows]
raise SystemExit(json.dumps([rows, bad]))
"""
_SETUP = "import json\nimport pyarrow as pa\nfrom tfrbeam.builder.inputs.jsonl import read_jsonl_file\n"


def test_a_500_mb_line_in_a_small_gzip_is_a_bad_row_in_bounded_time_and_memory(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    _gzip_with_a_long_line(path, 512)
    assert path.stat().st_size < 1 << 20
    outcome = run_bounded(_READ.format(path=str(path), options=""), setup=_SETUP, timeout=90)
    assert outcome.type == "SystemExit", outcome
    rows, bad = json.loads(outcome.error)
    assert rows == [[2, 2], [3, 4]]
    size = 512 * 2**20 + len('{"a": "') + len('"}')
    assert bad == [[1, f"line longer than input.jsonl.max_row_bytes={64 << 20} ({size} bytes from byte 0 of the "
                        "decompressed text); raise it to read it", 4096]]
    assert outcome.seconds < 30, outcome
    assert outcome.rss_growth < 400 << 20, outcome


def test_a_100_mb_line_under_a_raised_cap_is_read_in_linear_time(tmp_path):
    path = tmp_path / "long.jsonl.gz"
    _gzip_with_a_long_line(path, 96)
    outcome = run_bounded(_READ.format(path=str(path), options=", max_row_bytes=128 << 20"), setup=_SETUP,
                          timeout=90)
    assert outcome.type == "SystemExit", outcome
    assert json.loads(outcome.error) == [[[1, 96 << 20], [2, 2], [3, 4]], []]
    assert outcome.seconds < 10, outcome  # was 14 s for a 100 MB line


def _rows_and_bad(path: pathlib.Path, cap: int) -> tuple[list, list]:
    rows, bad = [], []
    for source in read_jsonl_file(str(path), pa.schema([("v", pa.string())]), max_row_bytes=cap):
        rows += list(zip(source.lines.tolist(), source.batch.column(0).to_pylist()))
        bad += [(row.line, row.reason) for row in source.bad_rows]
    return rows, bad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 200), min_size=1, max_size=30), block=st.integers(16, 96),
       cap=st.integers(40, 160), final_break=st.booleans(), ranged=st.booleans())
def test_lines_straddling_blocks_are_exact_and_those_over_the_cap_are_bad_rows(tmp_path, monkeypatch, lengths, block,
                                                                                cap, final_break, ranged):
    """Random line lengths around the block size: every line at most the cap is its json.loads, every longer one a
    bad row naming its line and byte offset, read whole or in byte ranges."""
    monkeypatch.setattr(jsonl_read, "_BLOCK_BYTES", block)
    lines = [json.dumps({"v": "y" * max(0, length - 10)}) for length in lengths]
    text = "\n".join(lines) + ("\n" if final_break else "")
    path = tmp_path / "a.jsonl"
    path.write_text(text)
    offsets = [sum(len(line) + 1 for line in lines[:index]) for index in range(len(lines))]
    expected_rows = [(number, json.loads(line)["v"]) for number, line in enumerate(lines, 1) if len(line) <= cap]
    expected_bad = [(number, f"line longer than input.jsonl.max_row_bytes={cap} ({len(line)} bytes from byte "
                             f"{offset}); raise it to read it")
                    for number, (line, offset) in enumerate(zip(lines, offsets), 1) if len(line) > cap]
    if not ranged:
        assert _rows_and_bad(path, cap) == (expected_rows, expected_bad)
        return
    rows, bad, size, split = [], [], len(text), max(1, len(text) // 3)
    for start in range(0, size, split):
        before = jsonl_read.count_line_breaks(str(path), 0, start)
        for source in read_jsonl_range(str(path), start, min(start + split, size), before,
                                       pa.schema([("v", pa.string())]), max_row_bytes=cap):
            rows += list(zip(source.lines.tolist(), source.batch.column(0).to_pylist()))
            bad += [(row.line, row.reason) for row in source.bad_rows]
    assert (rows, bad) == (expected_rows, expected_bad)


def test_the_schema_sample_and_the_emptiness_check_pass_over_a_long_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"v": "z" * 300}) + "\n" + json.dumps({"n": 1}) + "\n")
    assert jsonl_schema([str(path)], max_row_bytes=100) == pa.schema([("n", pa.int64())])
    alone = tmp_path / "b.jsonl"
    alone.write_text(json.dumps({"v": "z" * 300}))
    assert jsonl_holds_lines(str(alone), max_row_bytes=100)  # a bad row is a line


def _config(**jsonl) -> dict:
    return {"input": {"path": "x.jsonl", **({"jsonl": jsonl} if jsonl else {})}, "output": {"path": "o"}}


def test_max_row_bytes_is_a_size_in_the_jsonl_section():
    assert parse_config(_config()).input.jsonl.max_row_bytes == 64 << 20
    config = parse_config(_config(max_row_bytes="256MiB"))
    assert config.input.jsonl.max_row_bytes == 256 << 20
    assert parse_config(config_to_dict(config)) == config
    with pytest.raises(ConfigError, match=r"input.jsonl.max_row_bytes: 1000 is below 1 MiB"):
        parse_config(_config(max_row_bytes=1000))
    with pytest.raises(ConfigError, match=r"input.jsonl: JSON lines options are only for input.format jsonl, but "
                                          r"the format is csv"):
        parse_config({"input": {"path": "x.csv", "jsonl": {"max_row_bytes": "1GiB"}}, "output": {"path": "o"}})


def test_a_build_over_a_long_line_fails_in_one_line_naming_file_line_offset_cap_and_key(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    long_line = json.dumps({"id": 2, "pad": "p" * (2 << 20)})
    data.write_text('{"id": 1}\n' + long_line + '\n{"id": 3}\n')
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump({"input": {"path": str(data), "jsonl": {"max_row_bytes": "1MiB"}},
                                      "features": {"id": {"type": "int64"}}, "output": {"path": str(tmp_path / "out")}}))
    assert build_main([str(config), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert (f"rows.jsonl:2: line longer than input.jsonl.max_row_bytes=1048576 ({len(long_line)} bytes from byte 10); "
            "raise it to read it") in err
    assert not (tmp_path / "out").exists()
