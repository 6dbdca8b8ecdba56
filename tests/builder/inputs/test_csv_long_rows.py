"""A CSV row longer than input.csv.max_row_bytes is a bad row; the rows after it are read with their lines.

The row's end is found by a quote-aware scan (quotes at a field start, doubled quotes, the
escape character, line breaks inside quotes) that must agree with pyarrow's own parser: a
hypothesis test compares the two on random dialect soup. Reader tests use a small limit
(CsvOptions is not bound by the config's 1 MiB minimum); the build tests use the real one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import tracemalloc

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
import yaml
from hypothesis import given, settings, strategies as st

import tfrbeam.builder.inputs.csv as csv_read
import tfrbeam.builder.inputs.csv_text as csv_text
from tfrbeam.builder.config.schema import CsvOptions
from tfrbeam.builder.inputs.csv import read_csv_file, read_csv_range
from tfrbeam.builder.inputs.csv_text import csv_ranges
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import InputError

LIMIT = 4096
RAW_BYTES = csv_text.LONG_ROW_RAW_BYTES


def _long_value(size: int, escape: bool = False) -> str:
    """A quoted value of about size bytes holding delimiters, doubled quotes, CRLF, LF and (with escape) \\" and \\\\n."""
    piece = 'ab,"" c\r\nd,e\n' + ('\\"x\\\\\n' if escape else "")
    return '"' + piece * (size // len(piece) + 1) + '"'


def _layout(rows: list[str]) -> tuple[bytes, list[tuple[int, int]]]:
    """The file (header and rows, one line break each) and (line, byte offset) of every row."""
    header = "id,text\n"
    out, placed, line, offset = [header], [], 2, len(header.encode())
    for row in rows:
        placed.append((line, offset))
        text = row + "\n"
        out.append(text)
        line += text.count("\n") + text.count("\r") - text.count("\r\n")
        offset += len(text.encode())
    return "".join(out).encode(), placed


def _read(path: str, options: CsvOptions) -> tuple[list[tuple[int, str]], list]:
    good, bad = [], []
    for source in read_csv_file(path, options):
        good += [(line, row["id"].decode()) for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
        bad += list(source.bad_rows)
    return good, bad


def _reason(size: int, offset: int, limit: int = LIMIT) -> str:
    return (f"row longer than input.csv.max_row_bytes={limit} ({size} bytes from byte {offset}); "
            "raise it to read it")


@pytest.mark.parametrize("where", ["start", "middle", "end", "end-without-newline", "several"])
def test_a_row_over_max_row_bytes_is_a_bad_row_and_the_rows_after_it_keep_their_lines(tmp_path, where):
    short = [f'{i},"short {i}\nsecond line, with a comma"' for i in range(40)]
    long_row = f"L,{_long_value(5 * LIMIT)}"
    rows = {"start": [long_row] + short, "middle": short[:20] + [long_row] + short[20:],
            "end": short + [long_row], "end-without-newline": short + [long_row],
            "several": [long_row, *short[:10], long_row, long_row, *short[10:], long_row]}[where]
    data, placed = _layout(rows)
    if where == "end-without-newline":
        data = data[:-1]
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    good, bad = _read(str(path), CsvOptions(max_row_bytes=LIMIT))
    expected_good = [(line, row.split(",")[0]) for row, (line, _) in zip(rows, placed) if row is not long_row]
    assert good == expected_good
    long_places = [place for row, place in zip(rows, placed) if row is long_row]
    size = len(long_row.encode())
    assert [(b.line, b.reason) for b in bad] == [(line, _reason(size, offset)) for line, offset in long_places]
    assert [b.raw for b in bad] == [long_row[:RAW_BYTES]] * len(long_places)
    assert data[long_places[0][1]:].startswith(b"L,")  # the byte offset is the row's first byte in the file


def test_escape_characters_inside_and_outside_quotes_are_followed(tmp_path):
    options = CsvOptions(max_row_bytes=LIMIT, escape_char="\\")
    long_row = f"L,{_long_value(4 * LIMIT, escape=True)}"
    escaped_break = "L2," + "x\\\n" * (2 * LIMIT)  # an escaped line break continues an unquoted value
    rows = ["1,a", long_row, "2,b", escaped_break, '3,"c\\"\nd"']
    data, placed = _layout(rows)
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    good, bad = _read(str(path), options)
    assert good == [(placed[0][0], "1"), (placed[2][0], "2"), (placed[4][0], "3")]
    assert [b.line for b in bad] == [placed[1][0], placed[3][0]]


def test_blank_lines_before_a_long_row_and_crlf_files(tmp_path):
    long_row = f"L,{_long_value(4 * LIMIT)}"
    data = f"id,text\r\n1,a\r\n\r\n\r\n{long_row}\r\n\r\n2,b\r\n".encode()
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    good, bad = _read(str(path), CsvOptions(max_row_bytes=LIMIT))
    long_line = 5
    after = long_line + long_row.count("\n") + 2
    assert good == [(2, "1"), (after, "2")]
    assert [(b.line, b.reason) for b in bad] == [(long_line, _reason(len(long_row), data.index(b"L,")))]


def test_a_never_closed_quote_still_fails_the_file(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,text\n1,a\n2,"' + b"x\n" * (3 * LIMIT))
    with pytest.raises(InputError, match=r'in.csv: a quote \(\"\) opened in the row on line 3 is never closed'):
        _read(str(path), CsvOptions(max_row_bytes=LIMIT))


def test_long_lines_of_a_split_file_are_bad_rows_of_the_range_they_start_in(tmp_path):
    rows = [f"{i},{'v' * 50}" for i in range(400)]
    for at in (5, 150, 151, 399):
        rows[at] = f"L{at}," + "w" * (3 * LIMIT)
    data, placed = _layout(rows)
    path = tmp_path / "plain.csv"
    path.write_bytes(data)
    options = CsvOptions(max_row_bytes=LIMIT)
    good, bad = [], []
    for start, end in csv_ranges(len(data), 8192):
        for source in read_csv_range(str(path), start, end, data[:start].count(b"\n"), options):
            good += [(line, row["id"].decode()) for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
            bad += list(source.bad_rows)
    assert good == [(line, row.split(",")[0]) for row, (line, _) in zip(rows, placed) if not row.startswith("L")]
    assert [(b.line, b.reason) for b in bad] == [
        (placed[at][0], _reason(len(rows[at]), placed[at][1])) for at in (5, 150, 151, 399)]


@pytest.mark.parametrize("encoding", ["cp1252", "utf-16"])
def test_long_rows_in_transcoded_encodings(tmp_path, encoding):
    long_row = "L," + '"' + "é,\n" * (2 * LIMIT) + '"'
    text = f"id,text\n1,é\n{long_row}\n2,ü\n"
    path = tmp_path / "in.csv"
    path.write_bytes(text.encode(encoding))
    good, bad = _read(str(path), CsvOptions(max_row_bytes=LIMIT, encoding=encoding))
    assert good == [(2, "1"), (3 + 2 * LIMIT + 1, "2")]
    assert [b.line for b in bad] == [3]
    if encoding == "cp1252":  # line breaks are ASCII bytes: the offset is a file offset
        assert f"from byte {text.encode(encoding).index(b'L,')})" in bad[0].reason
    else:
        assert "from byte" not in bad[0].reason and "row longer than input.csv.max_row_bytes=4096" in bad[0].reason


def test_the_scan_does_not_hold_the_long_row():
    def chunks():
        yield b'2,"'
        for _ in range(48):  # a 48 MiB quoted value, made one 1 MiB chunk at a time
            yield (b"x" * 1023 + b"\n") * 1024
        yield b'"\n3,c\n'

    tracemalloc.start()
    try:
        cursor = csv_text.RowCursor(chunks())
        skipped = csv_text.skip_row(cursor, CsvOptions(), True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (skipped.start, skipped.size, skipped.line_breaks) == (0, 3 + (48 << 20) + 1, 48 * 1024 + 1)
    assert b"".join(cursor.rest()) == b"3,c\n" and not skipped.quote_open
    assert peak < 4 << 20, f"the scan held {peak / 2**20:.0f} MiB for a 48 MiB row"


# ------------------------------------------------------------------- the scan agrees with pyarrow


def _pyarrow_rows(data: bytes, options: CsvOptions) -> int:
    """How many rows pyarrow parses from data (rows with any number of fields)."""
    count = 0

    def count_invalid(row) -> str:
        nonlocal count
        count += 1
        return "skip"

    parse = csv_read._parse_options(options, True, count_invalid)
    try:
        table = pcsv.read_csv(io.BytesIO(data), parse_options=parse, read_options=pcsv.ReadOptions(column_names=["c"]))
    except pa.ArrowInvalid as error:
        assert "Empty CSV" in str(error)
        return 0
    return table.num_rows + count


def _scanned_rows(data: bytes, options: CsvOptions, chunk: int) -> tuple[int, int]:
    """Rows the long-row scan finds in data fed in chunks of the given size, and the lines they span."""
    cursor = csv_text.RowCursor(iter([data[i:i + chunk] for i in range(0, len(data), chunk)]))
    rows = lines = 0
    while True:
        skipped = csv_text.skip_row(cursor, options, True)
        lines += skipped.blank_lines
        if skipped.start == skipped.end:
            return rows, lines
        rows += 1
        lines += skipped.line_breaks


@settings(max_examples=300)
@given(st.lists(st.sampled_from(['a', ',', '"', '\\', '\n', '\r', '\r\n', '""', ',"']), max_size=40),
       st.booleans(), st.integers(1, 7))
def test_the_row_scan_finds_the_rows_pyarrow_finds(pieces, escape, chunk):
    data = "".join(pieces).encode()
    options = CsvOptions(escape_char="\\" if escape else None)
    rows, lines = _scanned_rows(data, options, chunk)
    assert rows == _pyarrow_rows(data, options)
    assert lines == data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def test_the_row_scan_agrees_with_pythons_csv_module_on_quoted_values():
    text = 'a,"b\nc,""d""",e\n"x",y\n'
    cursor = csv_text.RowCursor(iter([text.encode()]))
    first = csv_text.skip_row(cursor, CsvOptions(), True)
    assert text.encode()[first.start:first.end] == b'a,"b\nc,""d""",e\n'
    assert next(csv.reader(io.StringIO(text))) == ["a", 'b\nc,"d"', "e"]


# ---------------------------------------------------------------------------- through the build


@pytest.fixture(scope="module")
def long_row_input(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("long-rows")
    (root / "in").mkdir()
    big = '"' + ("text, with a comma\nand a line break " * 100_000) + '"'  # 3.6 MB: over 1 MiB x 2
    rows = ["1,a", f"2,{big}", "3,c", f"4,{big}", "5,e"]
    (root / "in" / "rows.csv").write_text("id,text\n" + "\n".join(rows) + "\n")
    return root


def _build(root: pathlib.Path, name: str, **errors) -> int:
    config = {"input": {"format": "csv", "path": str(root / "in" / "*.csv"), "csv": {"max_row_bytes": "1MiB"}},
              "features": {"id": {"type": "int64"}, "text": {"type": "bytes"}},
              "splits": {"train": 1.0}, "output": {"path": str(root / name), "num_shards": 1}, "errors": errors}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return build_main([str(path), "--quiet"])


def test_build_skips_or_dead_letters_long_rows_and_fail_names_them(long_row_input, capsys):
    root = long_row_input
    breaks = 100_000
    long_lines = [3, 3 + breaks + 2]
    assert _build(root, "dl", on_bad_record="dead_letter", max_bad_fraction=0.5) == 0
    manifest = json.loads((root / "dl" / "tfrbeam_dataset.json").read_text())
    assert manifest["bad_records"]["count"] == 2 and manifest["splits"]["train"]["num_examples"] == 3
    letters = [json.loads(line) for path in sorted((root / "dl" / "_errors").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sorted(entry["line"] for entry in letters) == long_lines
    assert all(len(entry["raw"].encode()) <= RAW_BYTES and "max_row_bytes=1048576" in entry["reason"]
               for entry in letters)
    assert _build(root, "skip", on_bad_record="skip", max_bad_fraction=0.5) == 0
    assert json.loads((root / "skip" / "tfrbeam_dataset.json").read_text())["splits"]["train"]["num_examples"] == 3
    capsys.readouterr()
    assert _build(root, "fail") == 1
    err = capsys.readouterr().err
    assert f"rows.csv:{long_lines[0]}: row longer than input.csv.max_row_bytes=1048576" in err
    assert "from byte 12)" in err and not (root / "fail").exists()
    assert os.path.getsize(root / "in" / "rows.csv") > 7_000_000
