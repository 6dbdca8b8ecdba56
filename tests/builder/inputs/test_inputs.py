"""Reading CSV and Parquet inputs: exact values, physical line numbers, raw text, byte ranges, Beam."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings, strategies as st

import tfrbeam.builder.inputs.ahead as ahead_read
import tfrbeam.builder.inputs.batch as source_batch
import tfrbeam.builder.inputs.csv as csv_read
import tfrbeam.builder.inputs.csv_text as csv_text
import tfrbeam.builder.inputs.parquet as parquet_read
import tfrbeam.builder.inputs.read as beam_read
from tests.helpers import expected_bad, expected_rows, pyarrow_read
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.config.schema import CsvOptions, InputConfig
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.csv import read_csv_file, read_csv_range
from tfrbeam.builder.inputs.csv_text import csv_ranges, scan_csv_range
from tfrbeam.builder.inputs.files import list_inputs
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.builder.inputs.read import ReadTabular
from tfrbeam.builder.inputs.sample import inspect_input
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.errors import ConfigError, InputError, TfrbeamError


def rows_of(sources) -> list[tuple[int, dict]]:
    """(line, row as text) of every good row, in file order."""
    out = []
    for source in sources:
        for line, row in zip(source.lines.tolist(), source.batch.to_pylist()):
            out.append((line, {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in row.items()}))
    return out


def bad_of(sources) -> list[tuple[int, str, str]]:
    return [(bad.line, bad.reason, bad.raw) for source in sources for bad in source.bad_rows]


def write(tmp_path, text: str | bytes, name: str = "in.csv") -> str:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


# ---------------------------------------------------------------------------------- csv-spectrum

# Two upstream files disagree with their own JSON: newlines_crlf.csv was committed with LF line
# ends (its JSON still expects the value's "\r\n"), and location_coordinates.json carries a phone
# number that is not in the CSV. We check the file bytes prove it and compare with the corrected JSON.
SPECTRUM_ERRATA = {
    "newlines_crlf": (lambda raw: b"\r" not in raw, lambda rows: [
        {k: v.replace("\r\n", "\n") for k, v in row.items()} for row in rows]),
    "location_coordinates": (lambda raw: b"1234567890" not in raw and b"2095257564" in raw, lambda rows: [
        {**row, "Contact Phone Number": "2095257564"} for row in rows]),
}


def test_every_csv_spectrum_file_parses_to_its_json(csv_spectrum):
    files = sorted((csv_spectrum / "csvs").glob("*.csv"))
    assert len(files) == 12
    for path in files:
        expected = json.loads((csv_spectrum / "json" / f"{path.stem}.json").read_text(encoding="utf-8"))
        if isinstance(expected, dict):
            expected = [expected]
        if path.stem in SPECTRUM_ERRATA:
            proves, correct = SPECTRUM_ERRATA[path.stem]
            assert proves(path.read_bytes()), f"{path.name} changed upstream; re-check the erratum"
            expected = correct(expected)
        sources = list(read_csv_file(str(path), CsvOptions()))
        assert [row for _, row in rows_of(sources)] == expected, path.name
        assert bad_of(sources) == [], path.name


def test_csv_spectrum_line_numbers_follow_quoted_line_breaks(csv_spectrum):
    assert [line for line, _ in rows_of(read_csv_file(str(csv_spectrum / "csvs" / "newlines.csv"), CsvOptions()))] == [2, 3, 5]
    assert [line for line, _ in rows_of(read_csv_file(str(csv_spectrum / "csvs" / "quotes_and_newlines.csv"), CsvOptions()))] == [
        2,
        5,
    ]


# ----------------------------------------------------------------------------- lines and raw text


def test_bad_rows_after_quoted_newlines_crlf_and_bom_have_their_physical_lines(tmp_path):
    text = ('\ufeffa,b\r\n1,"multi\r\nline"\r\n2\r\n\r\n"x ""q"", y",3\r\n4,5,6\r\n7,"z\r\n\r\nw"\r\n8,9')
    path = write(tmp_path, text)
    sources = list(read_csv_file(path, CsvOptions()))
    assert rows_of(sources) == [(2, {"a": "1", "b": "multi\r\nline"}), (6, {"a": 'x "q", y', "b": "3"}),
                                (8, {"a": "7", "b": "z\r\n\r\nw"}), (11, {"a": "8", "b": "9"})]
    assert bad_of(sources) == [(4, "has 1 field, expected 2", "2"), (7, "has 3 fields, expected 2", "4,5,6")]
    raw = [text for source in sources for text in source.raw_text(range(source.num_rows))]
    assert raw == ['1,"multi\r\nline"', '"x ""q"", y",3', '7,"z\r\n\r\nw"', "8,9"]


def test_conversion_bad_rows_carry_the_raw_csv_line(tmp_path):
    path = write(tmp_path, 'id,v\n1,"a\nb"\nx,"c"\n')
    (source,) = list(read_csv_file(path, CsvOptions()))
    from tfrbeam.builder.features.convert import FeatureSpec

    converted = convert_source_batch(source, [FeatureSpec("id", "int64", "id"), FeatureSpec("v", "bytes", "v")])
    assert converted.batch.to_pylist() == [{"id": 1, "v": b"a\nb"}]
    assert [(bad.line, bad.raw) for bad in converted.bad_rows] == [(4, 'x,"c"')]


def test_batches_read_with_convert_with_are_converted_ahead_on_a_thread_in_order(tmp_path, monkeypatch):
    """ReadTabular(convert_with=...) converts each batch on its own thread, the same as converting it afterwards."""
    import threading

    from tfrbeam.builder.features.convert import FeatureSpec

    monkeypatch.setattr(csv_read, "_CSV_BLOCK_BYTES", 64)  # many small batches
    path = write(tmp_path, "id,v\n" + "".join(f"{i},v{i}\n" if i % 7 else f"x{i},v{i}\n" for i in range(200)))
    specs = [FeatureSpec("id", "int64", "id"), FeatureSpec("v", "bytes", "v")]
    threads = []
    convert = source_batch.convert_source_batch

    def spied(source, given_specs):
        threads.append(threading.current_thread().name)
        return convert(source, given_specs)

    monkeypatch.setattr(source_batch, "convert_source_batch", spied)  # convert_in_slices calls it
    sources = list(beam_read.converted_ahead(read_csv_file(path, CsvOptions()), specs))
    assert len(sources) > 3 and set(threads) == {"tfrbeam-convert"}
    plain = list(read_csv_file(path, CsvOptions()))
    assert [s.first_line for s in sources] == [s.first_line for s in plain]
    for source, reference in zip(sources, plain):
        expected = convert(reference, specs)
        assert source.converted is not None and source.converted.batch.equals(expected.batch)
        assert [(b.line, b.raw) for b in source.converted.bad_rows] == [(b.line, b.raw) for b in expected.bad_rows]
    assert beam_read.converted_ahead(iter(plain), None).__next__() is plain[0]  # no specs: read as before
    early = beam_read.converted_ahead(read_csv_file(path, CsvOptions()), specs)
    next(early)
    early.close()
    assert not [t for t in threading.enumerate() if t.name in ("tfrbeam-convert", "tfrbeam-csv-read")]


def _reference_rows(text: str, columns: int) -> list[tuple[int, str, bool]]:
    """(first line, raw text, has the right field count) per row, by Python's csv module."""
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
    reader = csv.reader(io.StringIO(text, newline=""))
    rows, consumed = [], 0
    for fields in reader:
        start, consumed = consumed + 1, reader.line_num
        if fields:
            raw = "".join(lines[start - 1:consumed])
            raw = raw[:-2] if raw.endswith("\r\n") else raw[:-1] if raw.endswith(("\n", "\r")) else raw
            rows.append((start, raw, len(fields) == columns))
    return rows[1:]


def _random_csv(rng: random.Random, columns: int) -> str:
    newline = rng.choice(["\n", "\r\n", "\r"])
    text = ",".join(f"c{i}" for i in range(columns)) + newline
    for _ in range(rng.randint(0, 25)):
        count = rng.choice([columns] * 6 + [columns - 1, columns + 1])
        fields = []
        for _ in range(count):
            kind = rng.random()
            if kind < 0.5:
                fields.append(str(rng.randint(0, 999)))
            elif kind < 0.75:
                fields.append('"' + rng.choice(["a\nb", "x\r\ny", "\n\n", 'q""q', "a,b", "", "z\r\rw", "\r\n\r\n"]) + '"')
            else:
                fields.append(rng.choice(["", "abc", "d e"]))
        text += ",".join(fields) + rng.choice([newline, newline, newline + newline])
    if rng.random() < 0.5:
        text = text.rstrip("\r\n")
    return ("\ufeff" if rng.random() < 0.3 else "") + text


@pytest.mark.parametrize("seed", range(6))
def test_lines_and_raw_text_match_pythons_csv_module(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(csv_text, "_READ_CHUNK_BYTES", rng.choice([1, 2, 7, 64]))
    monkeypatch.setattr(csv_read, "_CSV_BLOCK_BYTES", 1000)
    monkeypatch.setattr(ahead_read, "PREFETCH_BATCHES", seed % 3)  # 0: no read-ahead thread
    for _ in range(25):
        columns = rng.randint(2, 4)
        text = _random_csv(rng, columns)
        path = write(tmp_path, text)
        sources = list(read_csv_file(path, CsvOptions()))
        got = [(line, raw, True) for s in sources for line, raw in zip(s.lines.tolist(), s.raw_text(range(s.num_rows)))]
        got += [(line, raw, False) for line, _, raw in bad_of(sources)]
        assert sorted(got) == _reference_rows(text.lstrip("\ufeff"), columns), repr(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=6).map(lambda b: b.replace(b"x", b"\r")), min_size=1, max_size=6),
       st.data())
def test_chunk_text_slices_and_finds_line_ends_across_chunks(chunks, data):
    text = b"".join(chunks)
    store = csv_text._ChunkText()
    for chunk in chunks:
        store.append(chunk)
    begin = data.draw(st.integers(0, len(text)))
    stop = data.draw(st.integers(begin, len(text)))
    assert store.slice(begin, stop) == text[begin:stop]
    view = bytearray(stop - begin)
    store.copy_into(begin, memoryview(view))
    assert bytes(view) == text[begin:stop]
    for eof in (False, True):
        match = csv_text._first_line_break(bytearray(text[begin:]), eof)
        assert store.line_end(begin, eof) == (None if match is None else begin + match)
    store.forget_before(begin)
    assert store.slice(begin, len(text)) == text[begin:]


def test_read_ahead_keeps_order_raises_errors_and_stops_when_closed():
    import threading
    import time

    closed = threading.Event()

    def numbers(fail_at=None):
        try:
            for number in range(10):
                if number == fail_at:
                    raise InputError(f"broken at {number}")
                yield number
        finally:
            closed.set()

    assert list(ahead_read.read_ahead(numbers())) == list(range(10))
    got = []
    with pytest.raises(InputError, match="broken at 4"):
        for number in ahead_read.read_ahead(numbers(fail_at=4)):
            got.append(number)
    assert got == [0, 1, 2, 3]
    closed.clear()
    early = ahead_read.read_ahead(numbers())
    assert next(early) == 0
    time.sleep(0.05)  # the thread fills its queue and waits
    early.close()
    assert closed.is_set()  # the iterator was closed (its cleanup ran) before close() returned
    assert not [t for t in threading.enumerate() if t.name == "tfrbeam-csv-read"]


# --------------------------------------------------------------------------------------- dialects


@pytest.mark.parametrize(
    "options, text, expected",
    [
        (CsvOptions(delimiter=";"), "a;b\n1,5;x\n", [{"a": "1,5", "b": "x"}]),
        (CsvOptions(delimiter="\t"), "a\tb\n1\t\"t\tab\"\n", [{"a": "1", "b": "t\tab"}]),
        (CsvOptions(quote_char="'"), "a,b\n'x,y','it''s'\n", [{"a": "x,y", "b": "it's"}]),
        (CsvOptions(quote_char=None), 'a,b\n"x",y\n', [{"a": '"x"', "b": "y"}]),
        (CsvOptions(escape_char="\\"), 'a,b\n"x\\"y",z\\,w\n', [{"a": 'x"y', "b": "z,w"}]),
        (CsvOptions(header=False, column_names=("p", "q")), "1,2\n3,4", [{"p": "1", "q": "2"}, {"p": "3", "q": "4"}]),
        (CsvOptions(column_names=("p", "q")), "a,b\n1,2\n", [{"p": "1", "q": "2"}]),
        (CsvOptions(skip_rows=2), "junk\nmore, junk, here\na,b\n1,2\n", [{"a": "1", "b": "2"}]),
        (CsvOptions(null_values=("", "NA")), 'a,b\nNA,""\n,"NA"\n', [{"a": None, "b": ""}, {"a": None, "b": "NA"}]),
        (CsvOptions(), "\n\na,b\n\n1,2\n\n\n", [{"a": "1", "b": "2"}]),
    ],
)
def test_dialect_options(tmp_path, options, text, expected):
    sources = list(read_csv_file(write(tmp_path, text), options))
    assert [row for _, row in rows_of(sources)] == expected
    assert bad_of(sources) == []


def test_skip_rows_and_blank_lines_keep_physical_line_numbers(tmp_path):
    path = write(tmp_path, "# generated\n\na,b\n\n1,2\n3,4\n")
    assert [line for line, _ in rows_of(read_csv_file(path, CsvOptions(skip_rows=1)))] == [5, 6]


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "cp1252"])
def test_encodings(tmp_path, encoding):
    text = "name,city\nJosé,Zürich\r\nÅsa,\"Malmö\nSkåne\"\n"
    path = write(tmp_path, text.encode(encoding))
    sources = list(read_csv_file(path, CsvOptions(encoding=encoding)))
    assert rows_of(sources) == [(2, {"name": "José", "city": "Zürich"}), (3, {"name": "Åsa", "city": "Malmö\nSkåne"})]


def test_invalid_utf8_bytes_are_a_bad_row_and_latin1_reads_them_as_text(tmp_path):
    (source,) = list(read_csv_file(write(tmp_path, b"a\n\xff\xfe\n"), CsvOptions()))
    assert source.num_rows == 0 and [bad.line for bad in source.bad_rows] == [2]
    (source,) = list(read_csv_file(write(tmp_path, b"a\n\xff\xfe\n"), CsvOptions(encoding="latin-1")))
    assert source.batch.column("a").to_pylist() == ["\u00ff\u00fe".encode("utf-8")]


@pytest.mark.parametrize(
    "text, options, message",
    [
        ("", CsvOptions(), "no header line (the file is empty after 0 skipped lines)"),
        ("a,a\n1,2\n", CsvOptions(), "column names 'a' appear more than once in the header"),
        (
            "a,b,c\n1,2,3\n",
            CsvOptions(column_names=("x", "y")),
            "the header has 3 columns (a, b, c) but input.csv.column_names lists 2",
        ),
        ('a,b\n1,"never closed\n2,3\n', CsvOptions(), 'a quote (") opened in the row on line 2 is never closed'),
    ],
)
def test_unreadable_csv_raises_input_error_naming_the_file(tmp_path, text, options, message):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as caught:
        list(read_csv_file(path, options))
    assert str(caught.value).startswith(path) and message in str(caught.value)


def test_header_only_and_blank_files(tmp_path):
    assert list(read_csv_file(write(tmp_path, "a,b\n\n\n"), CsvOptions())) == []
    sample = inspect_input(InputConfig("csv", write(tmp_path, "a,b\n")))
    assert sample.schema.names == ["a", "b"] and sample.sample.num_rows == 0


def test_projection_drops_columns_and_refuses_unknown_ones(tmp_path):
    path = write(tmp_path, "a,b,c\n1,2,3\n")
    assert rows_of(read_csv_file(path, CsvOptions(), columns=["c", "a"])) == [(2, {"a": "1", "c": "3"})]
    with pytest.raises(InputError, match=r"has no column 'z' \(columns: a, b, c\)"):
        list(read_csv_file(path, CsvOptions(), columns=["z"]))


# ------------------------------------------------------------------------------------ byte ranges


def _ranged(path: str, options: CsvOptions, split: int):
    size = len(open(path, "rb").read())
    offset = csv_text.csv_data_offset(path, options)
    sources, before = [], 0
    for start, end in csv_ranges(size, split):
        scan = scan_csv_range(path, start, end, options, offset)
        assert not scan.has_special
        sources += list(read_csv_range(path, start, end, before, options))
        before += scan.line_breaks
    return sources


def _everything(sources):
    sources = list(sources)
    return sorted(rows_of(sources), key=repr), sorted(bad_of(sources)), sorted(
        text for s in sources for text in s.raw_text(range(s.num_rows)))


@pytest.mark.parametrize("seed", range(4))
def test_byte_ranges_give_exactly_the_whole_files_rows(tmp_path, seed):
    rng = random.Random(seed)
    newline = ["\n", "\r\n", "\r", "\n"][seed]
    skip = rng.randint(0, 2)
    text = ("\ufeff" if seed % 2 else "") + "".join(f"junk{i}{newline}" for i in range(skip)) + "a,b,c" + newline
    for _ in range(100):
        fields = [str(rng.randint(0, 99999)) for _ in range(rng.choice([3, 3, 3, 3, 2, 4]))]
        text += ",".join(fields) + rng.choice([newline, newline, newline * 2])
    path = write(tmp_path, text.rstrip("\r\n") if seed % 2 else text)
    options = CsvOptions(skip_rows=skip, quote_char=None if seed == 3 else '"')
    whole = _everything(read_csv_file(path, options))
    assert len(whole[0]) > 50 and len(whole[1]) > 5
    for split in (3, 11, 64, 1 << 20):
        assert _everything(_ranged(path, options, split)) == whole, split


def test_scan_counts_line_breaks_and_sees_quotes(tmp_path):
    text = b"a\r\nb\rc\n\"d\"\r\n"  # the \r\n at 1-2 and 10-11 straddle range ends
    path = write(tmp_path, text)
    for split in (1, 2, 3, 5):
        ranges = csv_ranges(len(text), split)
        scans = [scan_csv_range(path, start, end, CsvOptions(quote_char=None)) for start, end in ranges]
        assert sum(scan.line_breaks for scan in scans) == 4 and not any(scan.has_special for scan in scans)
        scans = [scan_csv_range(path, start, end, CsvOptions()) for start, end in ranges]
        assert [scan.has_special for scan in scans] == [start <= 7 < end or start <= 9 < end for start, end in ranges]
        # A range with a quote stops counting (the file is read whole); the others count the
        # line breaks ending in them (a \r\n ends at its \n).
        assert [scan.line_breaks for scan in scans] == [
            None if scan.has_special else sum(scan.start <= end < scan.end for end in (2, 4, 6, 11)) for scan in scans]
    size = len(text)
    assert not scan_csv_range(path, 0, size, CsvOptions(), data_offset=10).has_special
    assert scan_csv_range(path, 0, size, CsvOptions(), data_offset=10).line_breaks == 4
    assert scan_csv_range(path, 0, size, CsvOptions(), data_offset=9) == csv_text.RangeScan(path, 0, size, None, True)


def test_quotes_in_the_header_do_not_stop_splitting(tmp_path):
    path = write(tmp_path, '# note "x"\n"a","b,c"\n1,2\n3,4\n')
    options = CsvOptions(skip_rows=1)
    offset = csv_text.csv_data_offset(path, options)
    assert offset == len('# note "x"\n"a","b,c"\n')
    scans = [scan_csv_range(path, start, end, options, offset) for start, end in csv_ranges(30, 4)]
    assert not any(scan.has_special for scan in scans)
    assert rows_of(_ranged(path, options, 4)) == [(3, {"a": "1", "b,c": "2"}), (4, {"a": "3", "b,c": "4"})]


def _beam_rows(source):
    name = source.path.rsplit("/", 1)[-1]
    rows = [(name, line, tuple(v for v in row.values())) for line, row in zip(source.lines.tolist(), source.batch.to_pylist())]
    return rows + [(name, bad.line, ("BAD", bad.raw)) for bad in source.bad_rows]


def test_read_tabular_pipeline_splits_safe_files_and_reads_quoted_ones_whole(tmp_path):
    plain = "a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(3000)) + "1,2,3\n" + "".join(f"{i},x\n" for i in range(2000))
    quoted = 'a,b\n' + "".join(f'{i},"v\n{i}"\n' for i in range(1500))
    write(tmp_path, plain, "plain.csv")
    write(tmp_path, quoted, "quoted.csv")
    expected = [("plain.csv", i + 2, (str(i).encode(), str(2 * i).encode())) for i in range(3000)]
    expected += [("plain.csv", 3002, ("BAD", "1,2,3"))]
    expected += [("plain.csv", 3003 + i, (str(i).encode(), b"x")) for i in range(2000)]
    expected += [("quoted.csv", 2 + 2 * i, (str(i).encode(), f"v\n{i}".encode())) for i in range(1500)]
    config = InputConfig("csv", str(tmp_path / "*.csv"), split_bytes=4096)
    ranges = [
        piece for file in list_inputs(config.path) for piece in beam_read._ranges_of((file.path, file.size), 4096, config.csv)
    ]
    assert len(ranges) > 10
    with beam.Pipeline() as pipeline:
        assert_that(pipeline | ReadTabular(config) | beam.FlatMap(_beam_rows), equal_to(expected))


def test_plan_reads_a_file_whole_when_any_range_has_a_quote():
    scans = [csv_text.RangeScan("f", 0, 10, 3, False), csv_text.RangeScan("f", 10, 20, 2, True)]
    assert beam_read._plan_pieces(("f", scans)) == [beam_read._CsvPiece("f", 0, -1, 0, True)]
    scans[1] = csv_text.RangeScan("f", 10, 20, 2, False)
    scans.append(csv_text.RangeScan("f", 20, 25, 1, False))
    assert [(p.start, p.end, p.line_breaks_before, p.whole) for p in beam_read._plan_pieces(("f", scans[::-1]))] == [
        (0, 10, 0, False), (10, 20, 3, False), (20, 25, 5, False)]


def test_list_inputs_sorts_and_fingerprints(tmp_path):
    write(tmp_path, "b", "b.csv")
    write(tmp_path, "aa", "a.csv")
    files = list_inputs(str(tmp_path / "*.csv"))
    assert [(f.path.rsplit("/", 1)[-1], f.size) for f in files] == [("a.csv", 2), ("b.csv", 1)]
    assert all(isinstance(f.mtime, float) for f in files)
    with pytest.raises(ConfigError, match=r"input.path: '.*nothing\*.csv' matches no files"):
        list_inputs(str(tmp_path / "nothing*.csv"))


# ---------------------------------------------------------------------------------------- Parquet


def test_parquet_rows_numbered_across_row_groups_with_projection(tmp_path):
    table = pa.table({"a": list(range(10)), "b": [str(i) for i in range(10)], "c": [1.5] * 10})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=3)
    sources = list(read_parquet_file(str(tmp_path / "t.parquet"), columns=["b", "a"]))
    assert len(sources) == 4
    assert np.concatenate([s.lines for s in sources]).tolist() == list(range(1, 11))
    assert sources[0].batch.schema.names == ["b", "a"]
    assert sources[1].raw_text([0]) == ['{"b": "3", "a": 3}']
    with pytest.raises(InputError, match=r"t.parquet: has no column 'z' \(columns: a, b, c\)"):
        list(read_parquet_file(str(tmp_path / "t.parquet"), columns=["z"]))


def _oracle_outcome(path, features) -> str:
    """What pyarrow's own read of the file says the build must do with it: refuse it, or convert every row an
    Example can hold and report the others as bad rows."""
    oracle = pyarrow_read(path)
    if isinstance(oracle, Exception):
        return "InputError"
    rows = expected_rows(oracle, features)
    bad = sum(expected_bad(row, features) for row in rows)
    return f"ok {len(rows) - bad} good, {bad} bad"


def test_every_parquet_testing_data_file_converts_or_fails_clearly(parquet_testing):
    outcomes, expected = {}, {}
    for path in sorted((parquet_testing / "data").glob("*.parquet")):
        config = parse_config({"input": {"path": str(path)}, "output": {"path": "o"}})
        resolved = resolve_config(config)  # every file has a column the build can infer a feature for
        expected[path.name] = _oracle_outcome(path, resolved.features)
        try:
            good = bad = 0
            for source in read_parquet_file(str(path), resolved.input.columns):
                converted = convert_source_batch(source, resolved.features)
                good, bad = good + converted.batch.num_rows, bad + len(converted.bad_rows)
            outcomes[path.name] = f"ok {good} good, {bad} bad"
        except TfrbeamError as error:
            assert str(path) in str(error), error
            outcomes[path.name] = type(error).__name__
    assert outcomes == expected
    assert expected["datapage_v1-corrupt-checksum.parquet"] == "InputError"  # page CRCs are verified
    assert expected["list_columns.parquet"] == "ok 1 good, 2 bad"  # null list items


def test_parquet_columns_without_a_direct_mapping_get_infer_configs_cast_and_unmappable_ones_say_why(
        parquet_testing, caplog):
    path = parquet_testing / "data" / "alltypes_plain.parquet"
    inferred = resolve_config(parse_config({"input": {"path": str(path)}, "output": {"path": "o"}}))
    declared = resolve_config(parse_config({"input": {"path": str(path)}, "output": {"path": "o"},
                                            "features": {"timestamp_col": {"type": "int64", "on_null": "omit"}}}))
    assert inferred.feature("timestamp_col") == declared.feature("timestamp_col")
    batches = [convert_source_batch(s, inferred.features).batch
               for s in read_parquet_file(str(path), inferred.input.columns)]
    values = pa.Table.from_batches(batches).column("timestamp_col").to_pylist()
    assert values[0] == 1235865600000000000  # 2009-03-01 00:00:00 in nanoseconds
    maps = parquet_testing / "data" / "nested_maps.snappy.parquet"
    with caplog.at_level("WARNING"):
        left = resolve_config(parse_config({"input": {"path": str(maps)}, "output": {"path": "o"}}))
    assert "a" not in [spec.name for spec in left.features]
    assert "left out (features was left out): a (map<string, map<int32, bool ('value')> ('a')>): " \
        "no Example feature can hold it" in caplog.text
    with pytest.raises(ConfigError, match=r"features.a: column 'a' has Arrow type map<.*no Example feature mapping"):
        resolve_config(parse_config({"input": {"path": str(maps)}, "output": {"path": "o"}, "features": {"a": {}}}))


_BAD_DATA_PROBE = """
import json, sys
sys.path.insert(0, {repo!r})
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.pipeline.resolve import resolve_config
from tfrbeam.builder.inputs.batch import convert_source_batch
from tfrbeam.builder.inputs.parquet import read_parquet_file
from tfrbeam.errors import TfrbeamError
for path in sys.argv[1:]:
    print(json.dumps({{"start": path}}), flush=True)
    try:
        for source in read_parquet_file(path):  # every column, as read
            pass
        config = resolve_config(parse_config({{"input": {{"path": path}}, "output": {{"path": "o"}}}}))
        rows = sum(convert_source_batch(s, config.features).batch.num_rows
                   for s in read_parquet_file(path, config.input.columns))
        print(json.dumps({{"path": path, "outcome": "ok", "rows": rows}}), flush=True)
    except TfrbeamError as error:
        print(json.dumps({{"path": path, "outcome": type(error).__name__, "message": str(error)}}), flush=True)
"""


def test_every_parquet_testing_bad_file_fails_with_our_error_in_a_subprocess(parquet_testing):
    from tests.conftest import REPO_ROOT

    paths = [str(path) for path in sorted((parquet_testing / "bad_data").glob("*.parquet"))]
    assert len(paths) == 8
    probe = _BAD_DATA_PROBE.format(repo=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", probe, *paths], capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    crashed = lines[-1].get("start") if lines else paths[0]
    assert done.returncode == 0, f"{crashed} crashed the reader (exit {done.returncode}): {done.stderr[-2000:]}"
    results = {line["path"].rsplit("/", 1)[-1]: line for line in lines if "outcome" in line}
    assert len(results) == 8
    for name, result in results.items():
        if name == "ARROW-GH-43605.parquet":  # the pyarrow bug it reproduces is fixed: it reads, all rows
            assert result["outcome"] == "ok" and result["rows"] == 21186
            continue
        assert result["outcome"] in ("InputError", "ConfigError"), (name, result)
        assert name in result["message"]
    assert "row group 0 declares 3 rows but its columns hold" in results["ARROW-GH-41317.parquet"]["message"]
    assert "not a readable Parquet file" in results["PARQUET-1481.parquet"]["message"]
    assert "Invalid or corrupted bit_width" in results["ARROW-GH-41321.parquet"]["message"]


def test_gzipped_csv_is_read_whole(tmp_path):
    import gzip

    path = tmp_path / "data.csv.gz"
    path.write_bytes(gzip.compress(b'a,b\n1,"x\ny"\n2,3\n'))
    assert rows_of(read_csv_file(str(path), CsvOptions())) == [(2, {"a": "1", "b": "x\ny"}), (4, {"a": "2", "b": "3"})]
    assert beam_read._ranges_of((str(path), 10**9), 1000, CsvOptions()) == [(str(path), (0, 10**9, 1, 0))]


def test_source_batches_have_a_coder_that_sizes_them_without_pickling(tmp_path, monkeypatch):
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,x\n2,\"y\nz\"\n3,w\n")
    (source,) = list(read_csv_file(str(path), CsvOptions()))
    coder = beam.coders.registry.get_coder(source_batch.SourceBatch)
    assert isinstance(coder, source_batch.SourceBatchCoder)
    decoded = coder.decode(coder.encode(source))
    assert decoded.batch.equals(source.batch) and decoded.lines.tolist() == source.lines.tolist() == [2, 3, 5]
    assert decoded.raw_text([1]) == source.raw_text([1]) == ['2,"y\nz"']
    monkeypatch.setattr(source_batch.pickle, "dumps", lambda *args: pytest.fail("estimate_size pickled the batch"))
    size = coder.get_impl().estimate_size(source)
    assert size >= source.batch.get_total_buffer_size() + len(source.raw) > 0


def test_text_that_is_not_valid_in_the_declared_encoding_is_a_bad_row(tmp_path):
    data = "name,city\nAna,Lisboa\nJos\u00e9,S\u00e3o Paulo\nBo,\"Malm\u00f6\nnorth\"\nEve,Oslo\n"
    path = write(tmp_path, data.encode("latin-1"))  # declared (by default) as utf-8
    sources = list(read_csv_file(path, CsvOptions()))
    assert rows_of(sources) == [(2, {"name": "Ana", "city": "Lisboa"}), (6, {"name": "Eve", "city": "Oslo"})]
    assert [(line, reason) for line, reason, _ in bad_of(sources)] == [
        (3, "byte 3 of the row is not valid utf-8 text (invalid continuation byte); set input.csv.encoding"),
        (4, "byte 8 of the row is not valid utf-8 text (invalid start byte); set input.csv.encoding")]
    assert bad_of(sources)[0][2] == "Jos\ufffd,S\ufffdo Paulo"
    ascii_sources = list(read_csv_file(write(tmp_path, "a\nx\n\u00e9\n", "ascii.csv"), CsvOptions(encoding="ascii")))
    assert [(line, reason) for line, reason, _ in bad_of(ascii_sources)] == [
        (3, "byte 0 of the row is not valid ascii text (ordinal not in range(128)); set input.csv.encoding")]
    # The same rows split into parallel ranges are checked the same way.
    big = "name,city\n" + "Ana,Lisboa\n" * 3000 + "Jos\u00e9,x\n"
    big_path = write(tmp_path, big.encode("latin-1"), "big.csv")
    size = len(big.encode("latin-1"))
    ranged = [source for start, end in csv_ranges(size, 8192)
              for source in read_csv_range(big_path, start, end, big.encode("latin-1")[:start].count(b"\n"),
                                           CsvOptions())]
    assert [line for line, _, _ in bad_of(ranged)] == [3002]


@pytest.mark.parametrize("encoding, bad, shown", [
    ("cp1252", b"\x81", "0x81"),  # a byte cp1252 leaves undefined
    ("shift_jis", b"\x81\x20", "0x81"),  # a lead byte without its trail byte
    ("utf-16", b"\x00\xd8", "0x00 0xd8"),  # a lone surrogate
])
def test_invalid_text_in_any_declared_encoding_is_a_bad_row(tmp_path, encoding, bad, shown):
    plain = "utf-16-le" if encoding == "utf-16" else encoding  # the rest of the file, without a second BOM
    data = "name,city\nAna,Lisboa\nJo".encode(encoding) + bad + ",x\nEve,Oslo\n".encode(plain)
    sources = list(read_csv_file(write(tmp_path, data), CsvOptions(encoding=encoding)))
    assert rows_of(sources) == [(2, {"name": "Ana", "city": "Lisboa"}), (4, {"name": "Eve", "city": "Oslo"})]
    byte = len("Jo".encode(plain))
    assert [(line, reason) for line, reason, _ in bad_of(sources)] == [
        (3, f"byte {byte} of the row is not valid {encoding} text ({shown} cannot be decoded); "
            "set input.csv.encoding")]
    assert bad_of(sources)[0][2].startswith("Jo\ufffd")


def test_a_utf16_file_cut_inside_a_character_makes_its_last_row_bad(tmp_path):
    data = "a,b\n1,2\n3,4".encode("utf-16")[:-1]
    sources = list(read_csv_file(write(tmp_path, data), CsvOptions(encoding="utf-16")))
    assert rows_of(sources) == [(2, {"a": "1", "b": "2"})]
    assert [(line, reason) for line, reason, _ in bad_of(sources)] == [
        (3, "byte 4 of the row is not valid utf-16 text (0x34 cannot be decoded); set input.csv.encoding")]


def test_invalid_cp1252_text_in_a_split_file_is_a_bad_row_of_its_range(tmp_path):
    big = b"name,city\n" + b"Ana,Lisboa\n" * 3000 + b"Jo\x81,x\n" + b"Eve,Oslo\n" * 10
    path = write(tmp_path, big, "big.csv")
    ranged = [source for start, end in csv_ranges(len(big), 8192)
              for source in read_csv_range(path, start, end, big[:start].count(b"\n"), CsvOptions(encoding="cp1252"))]
    assert [(line, reason) for line, reason, _ in bad_of(ranged)] == [
        (3002, "byte 2 of the row is not valid cp1252 text (0x81 cannot be decoded); set input.csv.encoding")]
    assert len(rows_of(ranged)) == 3010


@pytest.mark.parametrize("encoding, reason", [
    ("base64", "'base64' is not a text encoding"),
    ("rot13", "'rot13' is not a text encoding"),
    ("utf-7", "'utf-7' can decode to lone surrogates"),
    ("unicode_escape", "'unicode_escape' can decode to lone surrogates"),
])
def test_encodings_whose_rows_cannot_be_checked_are_refused_in_the_config(encoding, reason):
    with pytest.raises(ConfigError, match=rf"input.csv.encoding: {re.escape(reason)}"):
        parse_config({"input": {"path": "x.csv", "csv": {"encoding": encoding}}, "output": {"path": "o"}})


def _checksum_table() -> pa.Table:
    return pa.table({"a": list(range(3000)), "s": [f"v{i % 5}" for i in range(3000)],
                     "l": [[i, i + 1] for i in range(3000)], "f": [i * 0.5 for i in range(3000)]})


@pytest.mark.parametrize("dictionary", [True, False])
def test_page_checksums_are_detected_from_the_page_headers(tmp_path, dictionary):
    with_crc, without = str(tmp_path / "crc.parquet"), str(tmp_path / "none.parquet")
    pq.write_table(_checksum_table(), with_crc, write_page_checksum=True, row_group_size=1000, use_dictionary=dictionary)
    pq.write_table(_checksum_table(), without, row_group_size=1000, use_dictionary=dictionary)
    assert parquet_read.parquet_columns_without_checksums(with_crc) == []
    assert parquet_read.parquet_columns_without_checksums(without)[:2] == [(0, "a"), (0, "s")]


def test_require_checksums_refuses_files_without_them(tmp_path):
    without = str(tmp_path / "none.parquet")
    pq.write_table(_checksum_table(), without, row_group_size=1000)
    config = parse_config({"input": {"path": without, "parquet": {"require_checksums": True}}, "output": {"path": "o"}})
    assert config.input.parquet.require_checksums
    with pytest.raises(InputError, match=r"none.parquet: column 'a' of row group 0 has no page checksums .*"
                       r"write_page_checksum=True.*input.parquet.require_checksums"):
        resolve_config(config)
    with pytest.raises(InputError, match="has no page checksums"):
        parquet_read.parquet_row_groups(without, require_checksums=True)
    assert len(parquet_read.parquet_row_groups(without)) == 3  # not required: read as before
    with_crc = str(tmp_path / "crc.parquet")
    pq.write_table(_checksum_table(), with_crc, write_page_checksum=True, row_group_size=1000)
    assert len(parquet_read.parquet_row_groups(with_crc, require_checksums=True)) == 3
    with pytest.raises(ConfigError, match=r"input\.parquet: Parquet options are only for input\.format parquet"):
        parse_config({"input": {"path": "x.csv", "parquet": {"require_checksums": True}}, "output": {"path": "o"}})


def test_a_flipped_byte_in_a_checksummed_page_fails_naming_the_file(tmp_path):
    path = tmp_path / "crc.parquet"
    pq.write_table(pa.table({"a": list(range(1000))}), path, write_page_checksum=True, use_dictionary=False,
                   compression="none")
    data = bytearray(path.read_bytes())
    data[200] ^= 0x01  # inside the plain-encoded values of the one data page
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"crc.parquet: cannot read row group 0"):
        list(read_parquet_file(str(path)))


def test_a_row_group_is_decoded_ahead_of_the_caller_in_order_and_its_errors_reach_the_caller(tmp_path, monkeypatch):
    """Parquet decoding (no GIL) overlaps the caller's converting: the next batch is read while the caller holds this one."""
    import threading
    import time

    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"a": list(range(1000))}), path, row_group_size=1000)
    monkeypatch.setattr(parquet_read, "_PARQUET_BATCH_ROWS", 100)
    made = []
    read_ahead = parquet_read.read_ahead  # the public helper the reader hands its decoding generator to

    def counted(items, *rest):
        def decoded():
            for source in items:
                made.append(source.num_rows)
                yield source
        return read_ahead(decoded(), *rest)

    monkeypatch.setattr(parquet_read, "read_ahead", counted)
    sources = parquet_read.read_parquet_row_group(path, 0, 0)
    first = next(sources)
    deadline = time.monotonic() + 5
    while len(made) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(made) >= 2  # batch 2 was read while the caller still held batch 1
    rest = list(sources)
    assert [first.lines[0], *(s.lines[0] for s in rest)] == list(range(1, 1000, 100))
    assert pa.concat_tables(pa.Table.from_batches([s.batch]) for s in [first, *rest]).column("a").to_pylist() == list(
        range(1000))
    early = parquet_read.read_parquet_row_group(path, 0, 0)
    next(early)
    early.close()
    assert not [t for t in threading.enumerate() if t.name == "tfrbeam-parquet-read"]
    monkeypatch.setattr(parquet_read, "read_ahead", read_ahead)
    damaged = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"a": list(range(1000))}), damaged, write_page_checksum=True, use_dictionary=False,
                   compression="none")
    data = bytearray(damaged.read_bytes())
    data[200] ^= 0x01
    damaged.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"damaged.parquet: cannot read row group 0"):
        list(parquet_read.read_parquet_row_group(str(damaged), 0, 0))


def test_demo_parquet_files_are_written_with_page_checksums(tmp_path):
    from tfrbeam.cli.demo_data import write_demo_data

    write_demo_data(str(tmp_path / "demo"), num_rows=300)
    files = sorted((tmp_path / "demo" / "parquet").glob("*.parquet"))
    assert files and all(parquet_read.parquet_columns_without_checksums(str(path)) == [] for path in files)


def test_a_field_over_the_block_size_grows_the_block_up_to_max_row_bytes(tmp_path):
    big = "x" * (10 << 20)
    text = f'id,text\n1,short\n2,"{big}\nsecond line"\n3,after\n'
    path = write(tmp_path, text)
    rows = rows_of(read_csv_file(path, CsvOptions()))
    assert [(line, row["id"]) for line, row in rows] == [(2, "1"), (3, "2"), (5, "3")]
    assert rows[1][1]["text"] == big + "\nsecond line"
    unquoted = write(tmp_path, f"id,text\n1,short\n2,{big}\n3,after\n", "unquoted.csv")
    size = os.path.getsize(unquoted)
    ranged = [source for start, end in csv_ranges(size, 4 << 20)
              for source in read_csv_range(unquoted, start, end, open(unquoted, "rb").read(start).count(b"\n"),
                                           CsvOptions())]
    assert [(line, row["id"]) for line, row in rows_of(ranged)] == [(2, "1"), (3, "2"), (4, "3")]
    sources = list(read_csv_file(path, CsvOptions(max_row_bytes=4 << 20)))  # pyarrow reads rows up to ~2 blocks
    assert [(line, row["id"]) for line, row in rows_of(sources)] == [(2, "1"), (5, "3")]
    assert [(line, reason) for line, reason, _ in bad_of(sources)] == [
        (3, f"row longer than input.csv.max_row_bytes={4 << 20} ({len(big) + 16} bytes from byte 16); "
            "raise it to read it")]


def test_max_row_bytes_is_a_size_in_the_config():
    config = parse_config({"input": {"path": "x.csv", "csv": {"max_row_bytes": "128MiB"}}, "output": {"path": "o"}})
    assert config.input.csv.max_row_bytes == 128 << 20
    assert parse_config({"input": {"path": "x.csv"}, "output": {"path": "o"}}).input.csv.max_row_bytes == 64 << 20
    with pytest.raises(ConfigError, match=r"input.csv.max_row_bytes: 1000 is below 1 MiB"):
        parse_config({"input": {"path": "x.csv", "csv": {"max_row_bytes": 1000}}, "output": {"path": "o"}})
