"""CSV rows as SourceBatches: pyarrow parses the text (every column binary), every row gets its physical line,
its raw text and its bad rows (wrong field count, undecodable text, longer than max_row_bytes).

CSV is parsed by pyarrow.csv in blocks, every column as binary, so that
typing and bad-row detection are ours (tfrbeam.builder.features.convert); each row keeps the physical line
it starts on and its raw text, and rows with the wrong number of fields become bad rows. A
thread parses the next blocks while the caller converts this one (serially, in order: pyarrow's
own threaded parsing does not number invalid rows).

CSV splitting rule: a file larger than input.split_bytes is scanned in parallel, one range per
split_bytes. If no range holds the quote character or the escape character after the header
(and the encoding is ASCII-compatible and the file uncompressed), no value can hold a line
break, so every line break ends a row: the ranges are read in parallel with quoting off, each
owning the rows that start inside it, with line numbers from the scan's line-break counts.
Otherwise the file is read whole by one worker, streamed block by block (a quote anywhere could
open a value spanning lines, and only reading from the start tells). Files up to split_bytes
are always read whole. A quote still open at the end of a file fails it (pyarrow would make
the rest of the file one value).

Line numbers are physical lines (counting \\n, \\r\\n and a lone \\r) of the row's first line;
skip_rows counts physical lines; blank lines are not rows. A row longer than pyarrow's 4 MiB
block makes the rows from it on read again with a 4x block, up to input.csv.max_row_bytes (64 MiB
by default); a longer row is a bad row, found and measured by a quote-aware scan that follows
pyarrow's parser, and the rows after it are read on.
"""

from __future__ import annotations

import codecs
import functools
import io
import itertools
import logging
import re
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tfrbeam.builder.config.encodings import passes_through
from tfrbeam.builder.config.schema import CsvOptions
from tfrbeam.builder.features.convert import BadRow
from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch, empty_batch, strip_line_break
from tfrbeam.builder.inputs.csv_text import (
    LineTracker,
    Preamble,
    RowCursor,
    SkippedRow,
    decoder_for,
    head_preamble,
    read_preamble,
    record_boundary,
    row_file_offset,
    skip_row,
    special_bytes,
    utf8_chunks,
)
from tfrbeam.builder.inputs.files import open_input
from tfrbeam.errors import InputError

__all__ = ["parse_row_texts", "read_csv_file", "read_csv_range", "row_texts"]

_LOG = logging.getLogger(__name__)

_CSV_BLOCK_BYTES = 4 << 20  # pyarrow's block; grown (x4 per retry) up to max_row_bytes for longer rows


def _parse_options(options: CsvOptions, quoting: bool, on_invalid) -> pcsv.ParseOptions:
    return pcsv.ParseOptions(
        delimiter=options.delimiter,
        quote_char=options.quote_char if (quoting and options.quote_char) else False,
        double_quote=True,
        escape_char=options.escape_char if (quoting and options.escape_char) else False,
        newlines_in_values=quoting,
        ignore_empty_lines=True,
        invalid_row_handler=on_invalid,
    )


def _read_rows(path: str, tracker: LineTracker, preamble: Preamble, options: CsvOptions, first_file_line: int,
               quoting: bool, columns: Sequence[str] | None, block_size: int = _CSV_BLOCK_BYTES) -> Iterator[SourceBatch]:
    """Parse the rows after the preamble with pyarrow and give every row its physical line and raw text.

    Rows are numbered by pyarrow from 1 (invalid ones included); row j starts on the j-th
    non-blank line after the data start, counting only the first non-blank line of each row, so
    a row's line follows from the spans of the rows before it (1 line unless a quoted value
    holds line breaks).
    """
    names = list(preamble.names)
    invalid: dict[int, tuple[int, int, str]] = {}
    invalid_lock = threading.Lock()  # pyarrow parses ahead on another thread

    def on_invalid(row) -> str:
        if row.number is None:
            raise InputError(f"{path}: pyarrow did not number an invalid row; cannot place it")
        with invalid_lock:
            invalid[row.number] = (row.expected_columns, row.actual_columns, row.text)
        return "skip"

    null_values = list(dict.fromkeys((*(options.null_values or ()), *(options.feature_null_values or ()))))
    reader_options = pcsv.ReadOptions(use_threads=False, block_size=block_size, column_names=names)
    convert_options = pcsv.ConvertOptions(
        column_types={name: pa.binary() for name in names}, null_values=null_values,
        strings_can_be_null=bool(null_values), quoted_strings_can_be_null=False, check_utf8=False)
    if columns is not None:
        missing = [name for name in columns if name not in names]
        if missing:
            raise InputError(f"{path}: has no column {', '.join(map(repr, missing))} (columns: {', '.join(names)})")
    keep = _kept_columns(names, columns)
    ordinal = tracker.count_nonblank_before(preamble.data_line - first_file_line)
    try:
        reader = pcsv.open_csv(tracker, read_options=reader_options,
                               parse_options=_parse_options(options, quoting, on_invalid),
                               convert_options=convert_options)
    except pa.ArrowInvalid as error:
        if str(error).startswith("Empty CSV file"):  # nothing but blank lines after the preamble
            return
        if "straddl" in str(error):
            raise _RowTooLong(path, "in its first rows") from error
        raise InputError(f"{path}: cannot parse the CSV in its first rows: {error}") from error
    try:
        quote = options.quote_char if quoting and not options.escape_char else None
        batches = _numbered_batches(path, tracker, reader, invalid, invalid_lock, keep, ordinal, first_file_line, quote)
        produced = read_ahead(batches)
        codec = codecs.lookup(options.encoding).name
        produced = (_without_undecodable_rows(source, codec) for source in produced)
        if options.feature_null_values is not None and null_values:
            produced = (_with_null_text(source, names, options, quoting) for source in produced)
        booleans = (tuple(options.true_values or ()), tuple(options.false_values or ()))
        if any(booleans):
            produced = (replace(source, true_values=booleans[0], false_values=booleans[1]) for source in produced)
        yield from produced
    finally:
        reader.close()  # stop pyarrow's read-ahead thread now, not at garbage collection


def _with_null_text(source: SourceBatch, names: Sequence[str], options: CsvOptions, quoting: bool) -> SourceBatch:
    """The batch with the token each null cell held (features with their own null_values decide on it).

    Only the rows holding a null are parsed again, from their raw text, by pyarrow with the same
    dialect and no null values; a null cell was an unquoted token, so its text is that token.
    """
    nulls = [name for name in source.batch.schema.names if source.batch.column(name).null_count]
    if not nulls or source.raw is None or source.raw_line_starts is None or source.spans is None:
        return replace(source, null_values=tuple(options.null_values or ()))
    mask = np.zeros(source.num_rows, dtype=bool)
    for name in nulls:
        mask |= np.asarray(source.batch.column(name).is_null())
    rows = np.flatnonzero(mask)
    firsts = source.lines[rows] - source.raw_first_line
    pieces = [strip_line_break(source.raw[source.raw_line_starts[first]:
                                           source.raw_line_starts[first + int(source.spans[row])]]) + b"\n"
              for row, first in zip(rows.tolist(), firsts.tolist())]

    def refuse(row) -> str:
        raise InputError(f"{source.path}: a row holding a null did not parse again ({row.text!r})")

    table = pcsv.read_csv(io.BytesIO(b"".join(pieces)),
                          read_options=pcsv.ReadOptions(use_threads=False, column_names=list(names)),
                          parse_options=_parse_options(options, quoting, refuse),
                          convert_options=pcsv.ConvertOptions(column_types={name: pa.binary() for name in nulls},
                                                              include_columns=nulls, strings_can_be_null=False,
                                                              check_utf8=False))
    null_text = {}
    for name in nulls:
        texts = np.full(source.num_rows, None, dtype=object)
        texts[rows] = table.column(name).to_pylist()
        text = pa.array(texts, pa.binary())
        null_text[name] = pc.if_else(source.batch.column(name).is_null(), text, pa.scalar(None, pa.binary()))
    return replace(source, null_text=null_text, null_values=tuple(options.null_values or ()))


# Batches parsed (CSV) or decoded (Parquet) ahead by a thread of their own; 0 reads in the
# caller's thread. The thread takes the parse (~0.9 CPU s per 1M CSV benchmark rows) or the


def _without_undecodable_rows(source: SourceBatch, codec: str) -> SourceBatch:
    """The batch without rows whose text is not valid in the declared encoding; they become bad rows.

    UTF-8 and ASCII text is checked as it is; text of other encodings was transcoded with every
    undecodable byte marked (see _mark_undecodable), and the marks are not valid UTF-8. The whole
    batch's text is decoded once (fast when valid, the usual case); only a batch that fails is
    looked at row by row.
    """
    check = codec if passes_through(codec) else "utf-8"
    if source.raw is None or source.num_rows == 0:
        return source
    try:
        source.raw.decode(check)
        return source
    except UnicodeDecodeError:
        pass
    assert source.raw_line_starts is not None and source.spans is not None  # CSV batches carry them with raw
    keep = np.ones(source.num_rows, dtype=bool)
    bad_rows = []
    for row in range(source.num_rows):
        first = int(source.lines[row]) - source.raw_first_line
        text = source.raw[source.raw_line_starts[first]:source.raw_line_starts[first + int(source.spans[row])]]
        try:
            text.decode(check)
        except UnicodeDecodeError as error:
            keep[row] = False
            bad_rows.append(BadRow(source.path, int(source.lines[row]), _undecodable_reason(text, error, codec),
                                   _shown_text(strip_line_break(text), codec)))
    if not bad_rows:
        return source
    mask = pa.array(keep)
    merged = sorted([*source.bad_rows, *bad_rows], key=lambda bad: bad.line)
    return replace(source, lines=source.lines[keep], batch=source.batch.filter(mask), spans=source.spans[keep],
                   bad_rows=tuple(merged))


def _undecodable_reason(text: bytes, error: UnicodeDecodeError, codec: str) -> str:
    """Where a row stops being valid text: the byte in the row as the file holds it, and why."""
    name = codec.replace("-sig", "")
    if passes_through(codec):
        return f"byte {error.start} of the row is not valid {name} text ({error.reason}); set input.csv.encoding"
    before = text[:error.start].decode("utf-8")
    byte = len(before.encode(codec, "replace")) - len("".encode(codec))  # without the BOM some codecs write
    marks = itertools.takewhile(lambda char: 0xDC00 <= ord(char) <= 0xDCFF,
                                text[error.start:].decode("utf-8", "surrogatepass"))
    shown = " ".join(f"0x{ord(char) - 0xDC00:02x}" for char in marks)
    return f"byte {byte} of the row is not valid {name} text ({shown} cannot be decoded); set input.csv.encoding"


def _shown_text(text: bytes, codec: str) -> str:
    """A row's text for the dead letters: an undecodable byte (or its mark) shows as U+FFFD."""
    if passes_through(codec):
        return text.decode(codec, "replace")
    return re.sub("[\udc00-\udcff]", "\ufffd", text.decode("utf-8", "surrogatepass"))


def _numbered_batches(path: str, tracker: LineTracker, reader, invalid: dict, invalid_lock: threading.Lock,
                      keep: list[str], ordinal: int, first_file_line: int, quote: str | None,
                      ) -> Generator[SourceBatch, None, None]:
    """The batches of a pyarrow CSV reader with every row's line, and the invalid rows placed between them."""
    record = 1
    last_line = 0
    last_row: tuple[int, int, str] | None = None  # (line, span, raw text) of the latest row
    try:
        batches: Iterator[pa.RecordBatch] = iter(reader)
        while True:
            batch = next(batches, None)
            with invalid_lock:
                numbers = sorted(number for number in invalid if number >= record)
                known = {number: invalid[number] for number in numbers}
            if batch is None:
                if numbers:
                    yield _assemble(path, tracker, empty_batch(keep), record, numbers, known, ordinal,
                                    first_file_line, None)
                _check_closed_quotes(path, last_row, quote)
                return
            rows = batch.num_rows
            if rows == 0:
                continue
            last = record + rows - 1
            inside = []
            for number in numbers:
                if number > last:
                    break
                inside.append(number)
                last += 1
            spans = _row_spans(batch) if tracker.special_seen else None
            source = _assemble(path, tracker, batch.select(keep), record, inside, known, ordinal, first_file_line, spans)
            ordinal += _count_nonblank(record, last, inside, known, spans)
            if len(source.lines):
                last_line = int(source.lines[-1])
                if quote:
                    assert source.spans is not None  # _assemble gives every CSV batch its spans
                    last_row = (last_line, int(source.spans[-1]), source.raw_text([source.num_rows - 1])[0])
            with invalid_lock:
                for number in inside:
                    del invalid[number]
            record = last + 1
            yield source
    except pa.ArrowInvalid as error:
        where = f"after line {last_line}" if last_line else "in its first rows"
        if "straddl" not in str(error):
            raise InputError(f"{path}: cannot parse the CSV {where}: {error}") from error
        # A row longer than the block: the invalid rows before it are given first, so that the
        # rows not yet given start with it (see _rows_with_long_rows).
        with invalid_lock:
            numbers = sorted(number for number in invalid if number >= record)
            known = {number: invalid[number] for number in numbers}
        if numbers:
            yield _assemble(path, tracker, empty_batch(keep), record, numbers, known, ordinal, first_file_line, None)
        raise _RowTooLong(path, where) from error


class _RowTooLong(InputError):
    """A row longer than pyarrow's block: the rows from it on are read again with a bigger block, or it
    becomes a bad row (see _rows_with_long_rows)."""

    def __init__(self, path: str, where: str):
        super().__init__(f"{path}: a row {where} is longer than the CSV block")
        self.where = where


def _rows_with_long_rows(path: str, tracker: LineTracker, preamble: Preamble, options: CsvOptions,
                         first_file_line: int, quoting: bool, columns: Sequence[str] | None,
                         file_offset: Callable[[int, int], int | None]) -> Generator[SourceBatch, None, None]:
    """_read_rows, going on past rows longer than pyarrow's block.

    Such a row makes the rows from it on read again from where they start (the tracker still holds
    their text; nothing before is read twice) with a block four times larger, up to
    input.csv.max_row_bytes. A row longer than that is measured by a quote-aware scan (skip_row)
    that holds one chunk at a time, becomes a bad row, and the rows after it are read on with the
    first block size. Rows that long are rare: the common case reads once with 4 MiB blocks.
    file_offset maps (offset in the stream, file line) of a row start to its byte offset in the file.
    """
    names, keep = preamble.names, _kept_columns(preamble.names, columns)
    special = special_bytes(options) if quoting else b""
    block = first_block = min(_CSV_BLOCK_BYTES, options.max_row_bytes)
    base = 0  # the offset in the whole stream of the tracker's first byte
    while True:
        try:
            yield from _read_rows(path, tracker, preamble, options, first_file_line, quoting, columns, block)
            return
        except _RowTooLong as error:
            offset, line = tracker.unreleased()
            if offset < preamble.data_offset:  # no row given yet: they start after the preamble
                offset, line = preamble.data_offset, preamble.data_line - first_file_line
            chunks = tracker.detach(offset)
            base, first_file_line = base + offset, first_file_line + line
            if block < options.max_row_bytes:
                block = min(block * 4, options.max_row_bytes)
                _LOG.info("%s: a row %s is longer than the CSV block; reading on from line %d with %s blocks", path,
                          error.where, first_file_line, _mib(block))
            else:
                cursor = RowCursor(chunks)
                skipped = skip_row(cursor, options, quoting)
                row_line = first_file_line + skipped.blank_lines
                if skipped.quote_open:
                    raise unclosed_quote(path, options.quote_char, row_line) from error
                yield _long_row(path, row_line, skipped, file_offset(base + skipped.start, row_line),
                                options.max_row_bytes, keep)
                base, first_file_line = base + skipped.end, row_line + skipped.line_breaks
                chunks, block = cursor.rest(), first_block
        tracker = LineTracker(chunks, special)
        preamble = Preamble(names=names, data_line=first_file_line, data_offset=0)


def _kept_columns(names: Sequence[str], columns: Sequence[str] | None) -> list[str]:
    return [name for name in names if columns is None or name in set(columns)]


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def _long_row(path: str, line: int, skipped: SkippedRow, offset: int | None, limit: int,
              keep: Sequence[str]) -> SourceBatch:
    """A batch of no rows holding the bad row for a row over max_row_bytes; its raw text is its first bytes."""
    where = f" from byte {offset}" if offset is not None else ""
    reason = f"row longer than input.csv.max_row_bytes={limit} ({skipped.size} bytes{where}); raise it to read it"
    head = codecs.getincrementaldecoder("utf-8")("replace").decode(skipped.head[:skipped.size])  # a cut character is left out
    return SourceBatch(path=path, lines=np.zeros(0, np.int64), batch=empty_batch(keep),
                       bad_rows=(BadRow(path, line, reason, head),))


def _check_closed_quotes(path: str, last_row: tuple[int, int, str] | None, quote: str | None) -> None:
    """pyarrow ends a value whose quote never closes at the end of the file; we refuse that file.

    The sign: the last row spans lines and holds an odd number of quote characters (complete
    quoted fields hold an even number; a stray quote inside an unquoted field stays on its line).
    """
    if last_row is None or quote is None:
        return
    line, span, raw = last_row
    if span > 1 and raw.count(quote) % 2:
        raise unclosed_quote(path, quote, line)


def unclosed_quote(path: str, quote: str | None, line: int) -> InputError:
    return InputError(f"{path}: a quote ({quote}) opened in the row on line {line} is never closed; the rest of "
                      "the file would become one value. Fix the file or set input.csv.quote_char")


def _row_spans(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per row: physical lines it spans, and blank lines inside its quoted values."""
    lines = np.ones(batch.num_rows, dtype=np.int64)
    blanks = np.zeros(batch.num_rows, dtype=np.int64)
    for column in batch.columns:
        if not _has_line_break(column):
            continue
        breaks, blank = _line_breaks(column)
        lines += breaks
        blanks += blank
    return lines, blanks


def _has_line_break(column: pa.Array) -> bool:
    data = column.buffers()[2]
    if data is None or len(column) == 0:
        return False
    bounds = np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1, offset=4 * column.offset)
    text = data.slice(int(bounds[0]), int(bounds[-1] - bounds[0])).to_pybytes()  # a copy, then memchr
    return text.find(b"\n") >= 0 or text.find(b"\r") >= 0


def _line_breaks(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Line breaks in each value (\\r\\n, \\n or \\r), and how many of them end a blank line."""
    normal = pc.replace_substring(pc.replace_substring(values, "\r\n", "\n"), "\r", "\n")
    breaks = np.asarray(pc.fill_null(pc.count_substring(normal, "\n"), 0), dtype=np.int64)
    runs = np.asarray(pc.fill_null(pc.count_substring_regex(normal, "\n+"), 0), dtype=np.int64)
    return breaks, breaks - runs


def _text_spans(text: str) -> tuple[int, int]:
    breaks, blanks = _line_breaks(pa.array([text.encode("utf-8")], pa.binary()))
    return 1 + int(breaks[0]), int(blanks[0])


def _record_layout(record: int, last: int, inside: list[int], invalid: dict, spans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For records record..last: which are invalid, the physical lines each spans, and its non-blank lines."""
    count = last - record + 1
    is_invalid = np.zeros(count, dtype=bool)
    is_invalid[[number - record for number in inside]] = True
    lines = np.ones(count, dtype=np.int64)
    blanks = np.zeros(count, dtype=np.int64)
    if spans is not None:
        lines[~is_invalid], blanks[~is_invalid] = spans
    for number in inside:
        lines[number - record], blanks[number - record] = _text_spans(invalid[number][2])
    return is_invalid, lines, lines - blanks


def _count_nonblank(record: int, last: int, inside: list[int], invalid: dict, spans) -> int:
    return int(_record_layout(record, last, inside, invalid, spans)[2].sum())


def _assemble(path: str, tracker: LineTracker, batch: pa.RecordBatch, record: int, inside: list[int],
              invalid: dict, ordinal: int, first_file_line: int, spans) -> SourceBatch:
    last = record + batch.num_rows + len(inside) - 1
    is_invalid, lines, nonblank = _record_layout(record, last, inside, invalid, spans)
    ordinals = ordinal + np.concatenate([[0], np.cumsum(nonblank)[:-1]]).astype(np.int64)
    stream_lines = tracker.nonblank_lines(ordinals) if len(ordinals) else np.zeros(0, np.int64)
    if not len(stream_lines):
        return SourceBatch(path=path, lines=np.zeros(0, np.int64), batch=batch)
    first, end = int(stream_lines[0]), int(stream_lines[-1] + lines[-1])
    raw, starts = tracker.lines_text(first, end)
    tracker.release(end)
    bad_rows = []
    for position in np.flatnonzero(is_invalid).tolist():
        expected, actual, _ = invalid[record + position]
        local = int(stream_lines[position]) - first
        text = strip_line_break(raw[starts[local]:starts[local + int(lines[position])]]).decode("utf-8", "replace")
        bad_rows.append(BadRow(path, first_file_line + int(stream_lines[position]),
                               f"has {actual} field{'s' if actual != 1 else ''}, expected {expected}", text))
    return SourceBatch(path=path, lines=(stream_lines[~is_invalid] + first_file_line).astype(np.int64), batch=batch,
                       bad_rows=tuple(bad_rows), raw=raw, raw_first_line=first + first_file_line,
                       raw_line_starts=starts, spans=lines[~is_invalid], records=last - record + 1)


def read_csv_file(path: str, options: CsvOptions, columns: Sequence[str] | None = None,
                  names_seen: Callable[[tuple[str, ...]], None] | None = None) -> Generator[SourceBatch, None, None]:
    """Every row of a CSV file, streamed block by block from the start (quoted line breaks are fine).

    names_seen is called with the column names once the preamble is read, before any row (a file of
    no rows still names its columns).
    """
    with open_input(path) as raw:
        tracker = LineTracker(utf8_chunks(raw, options.encoding, True, None), special_bytes(options))
        preamble = read_preamble(tracker, options, path, decoder_for("utf-8"))
        if names_seen is not None:
            names_seen(preamble.names)
        yield from _rows_with_long_rows(path, tracker, preamble, options, 1, True, columns,
                                        functools.partial(row_file_offset, path, options.encoding, 0))


def read_csv_range(path: str, start: int, end: int, line_breaks_before: int, options: CsvOptions,
                   columns: Sequence[str] | None = None) -> Generator[SourceBatch, None, None]:
    """The rows starting in bytes [start, end) of a CSV file without quoted line breaks.

    line_breaks_before is the number of line breaks ending before `start` (from scan_csv_range
    of the earlier ranges); it makes the line numbers. Only safe when no quote or escape
    character occurs in the file: then every line break ends a row.
    """
    with open_input(path) as raw:
        preamble = head_preamble(raw, options, path)
        data_offset = preamble.data_offset
        own_start = max(record_boundary(raw, start), data_offset)
        own_end = max(record_boundary(raw, end), own_start) if end > own_start else own_start
        if own_start >= own_end:
            return
        if own_start == data_offset:
            first_line = preamble.data_line
        else:
            first_line = 1 + line_breaks_before + (1 if own_start > start else 0)
        raw.seek(own_start)
        tracker = LineTracker(utf8_chunks(raw, options.encoding, own_start == 0, own_end - own_start))
        inline = Preamble(names=preamble.names, data_line=first_line, data_offset=0)
        yield from _rows_with_long_rows(path, tracker, inline, options, first_line, False, columns,
                                        functools.partial(row_file_offset, path, options.encoding, own_start))


# ------------------------------------------------------------------------------- rows parsed again


def row_texts(source: SourceBatch, rows: int) -> list[bytes]:
    """The raw text of a CSV batch's first ``rows`` rows, each ended by one \\n (as _with_null_text parses them)."""
    if source.raw is None or source.raw_line_starts is None or source.spans is None:
        return []
    firsts = (source.lines[:rows] - source.raw_first_line).tolist()
    starts, raw = source.raw_line_starts, source.raw
    return [strip_line_break(raw[starts[first]:starts[first + int(span)]]) + b"\n"
            for first, span in zip(firsts, source.spans[:rows].tolist())]


def parse_row_texts(texts: Sequence[bytes], names: Sequence[str], options: CsvOptions) -> pa.Table:
    """Rows read before (row_texts) parsed again as _read_rows parses them, with options' null values.

    Each text is one whole row, so the values are those of the first read; only which unquoted
    cells are null follows options.null_values (and feature_null_values).
    """
    if not texts:
        return pa.table({name: pa.array([], pa.binary()) for name in names})
    data = b"".join(texts)
    null_values = list(dict.fromkeys((*(options.null_values or ()), *(options.feature_null_values or ()))))

    def refuse(row) -> str:
        raise InputError(f"a sampled row did not parse again ({row.text!r})")

    block = min(max(len(data) + 1, 1 << 20), (1 << 31) - 1)
    return pcsv.read_csv(
        io.BytesIO(data), read_options=pcsv.ReadOptions(use_threads=False, block_size=block, column_names=list(names)),
        parse_options=_parse_options(options, True, refuse),
        convert_options=pcsv.ConvertOptions(column_types={name: pa.binary() for name in names}, null_values=null_values,
                                            strings_can_be_null=bool(null_values), quoted_strings_can_be_null=False,
                                            check_utf8=False))
