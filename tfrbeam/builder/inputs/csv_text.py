"""CSV text below the parser: bytes to UTF-8, physical lines tracked, the preamble (skipped lines and header),
the quote-aware scan that measures a row too long to parse, and the byte ranges a large file is split in."""

from __future__ import annotations

import bisect
import codecs
import csv
import functools
import io
import itertools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from tfrbeam.builder.config.encodings import MARK_UNDECODABLE, passes_through
from tfrbeam.builder.config.schema import CsvOptions
from tfrbeam.builder.inputs.batch import strip_line_break
from tfrbeam.builder.inputs.files import open_input
from tfrbeam.errors import InputError

__all__ = [
    "LONG_ROW_RAW_BYTES",
    "LineTracker",
    "Preamble",
    "RangeScan",
    "RowCursor",
    "SkippedRow",
    "csv_data_offset",
    "csv_ranges",
    "decoder_for",
    "head_preamble",
    "read_preamble",
    "record_boundary",
    "row_file_offset",
    "scan_csv_range",
    "skip_row",
    "special_bytes",
    "unnamed_column_name",
    "unnamed_columns_named",
    "utf8_chunks",
]

_READ_CHUNK_BYTES = 4 << 20
_CR, _LF = 13, 10
_UTF8_BOM = b"\xef\xbb\xbf"
LONG_ROW_RAW_BYTES = 4096  # the start of a row over input.csv.max_row_bytes kept as its raw text (dead letters)


def utf8_chunks(raw: BinaryIO, encoding: str, at_file_start: bool, limit: int | None) -> Iterator[bytes]:
    """The file's bytes from the current position as UTF-8, BOM removed at the start.

    Other encodings are transcoded; bytes they cannot decode are marked (see _mark_undecodable),
    and the rows holding them become bad rows.
    """
    passthrough = passes_through(encoding)
    decoder = None if passthrough else codecs.getincrementaldecoder(encoding)(MARK_UNDECODABLE)
    remaining = limit
    first = at_file_start
    while remaining is None or remaining > 0:
        size = _READ_CHUNK_BYTES if remaining is None else min(_READ_CHUNK_BYTES, remaining)
        data = raw.read(size)
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        if first and passthrough:
            while len(data) < 3 and _UTF8_BOM.startswith(data):
                more = raw.read(3 - len(data))
                if not more:
                    break
                data += more
            if data.startswith(_UTF8_BOM):
                data = data[3:]
        first = False
        if decoder is not None:
            data = decoder.decode(data).encode("utf-8", "surrogatepass")
        if data:
            yield data
    if decoder is not None:
        tail = decoder.decode(b"", final=True).encode("utf-8", "surrogatepass")  # a cut character is marked
        if tail:
            yield tail


class _ChunkText:
    """The bytes of a stream from some offset on, kept as the chunks they arrived in.

    Appending and forgetting never copy the kept text (a bytearray trimmed at the front and
    grown at the back copies all it holds on every append); only slices are copied out.
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._offsets: list[int] = []  # stream offset of each chunk's first byte
        self.end = 0  # stream offset just past the last byte

    def append(self, data: bytes) -> None:
        self._chunks.append(data)
        self._offsets.append(self.end)
        self.end += len(data)

    def forget_before(self, offset: int) -> None:
        """Drop the chunks that end at or before offset."""
        keep = bisect.bisect_right(self._offsets, offset) - 1
        if keep > 0:
            del self._chunks[:keep], self._offsets[:keep]

    def take_from(self, offset: int) -> list[bytes]:
        """The chunks from stream offset offset on (the first one cut there), and forget them all."""
        self.forget_before(offset)
        chunks = self._chunks
        if chunks:
            chunks[0] = chunks[0][offset - self._offsets[0]:]
        self._chunks, self._offsets = [], []
        return chunks

    def _pieces(self, begin: int, stop: int) -> Iterator[memoryview]:
        index = bisect.bisect_right(self._offsets, begin) - 1
        while begin < stop:
            chunk, offset = self._chunks[index], self._offsets[index]
            piece_end = min(stop, offset + len(chunk))
            yield memoryview(chunk)[begin - offset:piece_end - offset]
            begin = piece_end
            index += 1

    def slice(self, begin: int, stop: int) -> bytes:
        """The bytes at stream offsets [begin, stop)."""
        return b"".join(self._pieces(begin, stop))

    def copy_into(self, begin: int, view: memoryview) -> None:
        """Fill view with the bytes from stream offset begin on."""
        position = 0
        for piece in self._pieces(begin, begin + len(view)):
            view[position:position + len(piece)] = piece
            position += len(piece)

    def line_end(self, begin: int, eof: bool) -> int | None:
        """The stream offset just past the first line break at or after begin; None when more bytes must tell."""
        index = bisect.bisect_right(self._offsets, begin) - 1 if begin < self.end else len(self._chunks)
        while index < len(self._chunks):
            chunk, offset = self._chunks[index], self._offsets[index]
            start = max(begin - offset, 0)
            lf, cr = chunk.find(b"\n", start), chunk.find(b"\r", start)
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 < len(chunk):
                    return offset + cr + (2 if chunk[cr + 1] == _LF else 1)
                following = self._chunks[index + 1][:1] if index + 1 < len(self._chunks) else b""
                if following or eof:
                    return offset + cr + (2 if following == b"\n" else 1)
                return None
            if lf >= 0:
                return offset + lf + 1
            index += 1
        return None


class PreambleLineTooLong(Exception):
    """A preamble or header line runs past its cap with no line break (``offset``: where it starts)."""

    def __init__(self, offset: int, max_bytes: int):
        super().__init__(offset, max_bytes)
        self.offset, self.max_bytes = offset, max_bytes


class LineTracker(io.RawIOBase):
    """A read-only stream of UTF-8 CSV text that records where each physical line starts.

    pyarrow reads it (from its own read-ahead thread, hence the lock); the reader asks it where
    the n-th non-blank line is, and for the text of lines not yet released. A trailing \\r of a
    chunk is held back until the next byte tells whether it is a \\r\\n.
    """

    def __init__(self, chunks: Iterable[bytes], special: bytes = b""):
        super().__init__()
        self._lock = threading.RLock()
        self._chunks = iter(chunks)
        self._special = list(special)
        self.special_seen = False
        self._held_cr = False
        self._eof = False
        self._pulled = 0  # stream offset just past the pulled bytes
        self._handed = 0  # stream offset just past the bytes handed out
        self._text = _ChunkText()  # the pulled bytes, from the first line not yet released on
        self._starts = [np.zeros(1, np.int64)]  # stream offset of each line start from line _line_base on
        self._line_base = 0
        # Stream line index of each non-blank line, in order; until the first blank line the
        # n-th non-blank line is simply line n and nothing is stored.
        self._blank_seen = False
        self._nonblank = [np.zeros(0, np.int64)]
        self._nonblank_base = 0
        self._last_start = 0
        self._last_start_blank_candidate = True

    # -- stream interface used by pyarrow
    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with self._lock:
            view = memoryview(buffer).cast("B")
            while self._pulled - self._handed < len(view) and not self._eof:
                self._pull()
            count = min(len(view), self._pulled - self._handed)
            self._text.copy_into(self._handed, view[:count])
            self._handed += count
            return count

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            while not self._eof:
                self._pull()
            size = self._pulled - self._handed
        buffer = bytearray(size)
        count = self.readinto(buffer)
        return bytes(buffer[:count])

    def readline_bytes(self, max_bytes: int | None = None) -> bytes:
        """One physical line with its line break (used for the preamble before pyarrow starts).

        ``PreambleLineTooLong`` once more than ``max_bytes`` are pulled without a line break: a file of
        one endless line (a 5 GB run of NULs) is never held whole.
        """
        with self._lock:
            return self._readline(max_bytes)

    def _readline(self, max_bytes: int | None = None) -> bytes:
        while True:
            end = self._text.line_end(self._handed, self._eof)
            if end is not None or self._eof:
                end = end if end is not None else self._pulled
                line = self._text.slice(self._handed, end)
                self._handed = end
                return line
            if max_bytes is not None and self._pulled - self._handed > max_bytes:
                raise PreambleLineTooLong(self._handed, max_bytes)
            self._pull()

    @property
    def position(self) -> int:
        return self._handed

    # -- scanning
    def _pull(self) -> None:
        data = next(self._chunks, None)
        if data is None:
            self._eof = True
            chunk = b"\r" if self._held_cr else b""
            self._held_cr = False
            if chunk:
                self._scan(chunk)
            self._finish()
            return
        if self._held_cr:
            data = b"\r" + data
            self._held_cr = False
        if data.endswith(b"\r"):
            self._held_cr = True
            data = data[:-1]
        if data:
            self._scan(data)

    def _scan(self, data: bytes) -> None:
        if not self.special_seen and any(data.find(bytes([byte])) >= 0 for byte in self._special):
            self.special_seen = True
        base = self._pulled
        self._text.append(data)
        self._pulled += len(data)
        if data.find(b"\r") < 0:
            ends = _positions(data, b"\n")
        else:
            array = np.frombuffer(data, np.uint8)
            is_lf = array == _LF
            is_cr = array == _CR
            lone_cr = is_cr.copy()
            lone_cr[:-1] &= ~is_lf[1:]
            ends = np.flatnonzero(is_lf | lone_cr)
        if not len(ends):
            return
        ends = ends.astype(np.int64) + base
        starts = np.concatenate([[self._last_start], ends[:-1] + 1])
        content_end = ends.copy()
        crlf = _crlf_mask(data, ends - base)
        content_end[crlf] -= 1
        blank = content_end == starts
        first_index = self._line_base + sum(len(s) for s in self._starts) - 1
        indexes = np.arange(first_index, first_index + len(ends), dtype=np.int64)
        if blank.any() and not self._blank_seen:
            self._blank_seen = True
            self._nonblank = [np.arange(self._line_base, first_index, dtype=np.int64)]
            self._nonblank_base = self._line_base
        if self._blank_seen:
            self._nonblank.append(indexes[~blank])
        self._starts.append(ends + 1)
        self._last_start = int(ends[-1] + 1)

    def _finish(self) -> None:
        """At the end of the stream: a last line without a line break is a line when it has text."""
        if self._pulled > self._last_start:
            line_index = self._line_base + sum(len(s) for s in self._starts) - 1
            if self._blank_seen:
                self._nonblank.append(np.array([line_index], np.int64))
            self._starts.append(np.array([self._pulled], np.int64))
            self._last_start = self._pulled

    # -- queries
    def _all_starts(self) -> np.ndarray:
        if len(self._starts) > 1:
            self._starts = [np.concatenate(self._starts)]
        return self._starts[0]

    def _all_nonblank(self) -> np.ndarray:
        if len(self._nonblank) > 1:
            self._nonblank = [np.concatenate(self._nonblank)]
        return self._nonblank[0]

    def nonblank_lines(self, ordinals: np.ndarray) -> np.ndarray:
        """Stream line index of the given non-blank lines (0 = the first non-blank line of the stream)."""
        with self._lock:
            if not self._blank_seen:
                return np.asarray(ordinals, dtype=np.int64)
            return self._all_nonblank()[ordinals - self._nonblank_base]

    def count_nonblank_before(self, line: int) -> int:
        with self._lock:
            if not self._blank_seen:
                return line
            return self._nonblank_base + int(np.searchsorted(self._all_nonblank(), line))

    def lines_text(self, first_line: int, end_line: int) -> tuple[bytes, np.ndarray]:
        """The text of stream lines [first_line, end_line) and the offset of each line start in it (plus the end)."""
        with self._lock:
            return self._lines_text(first_line, end_line)

    def _lines_text(self, first_line: int, end_line: int) -> tuple[bytes, np.ndarray]:
        starts = self._all_starts()
        local = starts[first_line - self._line_base:end_line - self._line_base + 1]
        if len(local) < end_line - first_line + 1:  # the last line ends at the end of the stream
            local = np.concatenate([local, [self._pulled]])
        begin = int(local[0])
        return self._text.slice(begin, int(local[-1])), local - begin

    def unreleased(self) -> tuple[int, int]:
        """(stream offset, stream line index) of the first line not released: where the rows not yet emitted start."""
        with self._lock:
            return int(self._all_starts()[0]), self._line_base

    def detach(self, offset: int) -> Iterator[bytes]:
        """The stream from offset (not released) on, taken from this tracker: it reads as ended from now on.

        Called once pyarrow is done with the tracker; the rest of the stream is read on by another one.
        """
        with self._lock:
            kept = self._text.take_from(offset) + ([b"\r"] if self._held_cr else [])
            rest, self._chunks = self._chunks, iter(())
            self._held_cr = False
            self._eof = True
        return itertools.chain(_popped(kept), rest)

    def release(self, line: int) -> None:
        """Forget everything before stream line `line` (rows before it have been emitted)."""
        with self._lock:
            self._release(line)

    def _release(self, line: int) -> None:
        starts = self._all_starts()
        drop = line - self._line_base
        if drop <= 0 or drop >= len(starts):
            return
        self._text.forget_before(int(starts[drop]))
        self._starts = [starts[drop:]]
        self._line_base = line
        if not self._blank_seen:
            return
        nonblank = self._all_nonblank()
        gone = int(np.searchsorted(nonblank, line))
        self._nonblank = [nonblank[gone:]]
        self._nonblank_base += gone


def _popped(chunks: list[bytes]) -> Iterator[bytes]:
    """The chunks in order, each let go of as it is handed on (so a reader holds one at a time)."""
    chunks.reverse()
    while chunks:
        yield chunks.pop()


def _crlf_mask(data: bytes, ends: np.ndarray) -> np.ndarray:
    """Which line-break ends (offsets in data of a \\n or lone \\r) are the \\n of a \\r\\n.

    A \\r\\n never straddles two chunks: the tracker holds a chunk's trailing \\r back.
    """
    text = np.frombuffer(data, np.uint8)
    previous = ends - 1
    ok = previous >= 0
    result = np.zeros(len(ends), dtype=bool)
    result[ok] = (text[ends[ok]] == _LF) & (text[previous[ok]] == _CR)
    return result


def _positions(data: bytes, needle: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(data, np.uint8) == needle[0])


def _first_line_break(data: bytearray, eof: bool) -> int | None:
    """The length of the first line including its break, or None when more bytes are needed to tell."""
    lf = data.find(b"\n")
    cr = data.find(b"\r")
    if cr >= 0 and (lf < 0 or cr < lf):
        if cr + 1 < len(data):
            return cr + 2 if data[cr + 1] == _LF else cr + 1
        return cr + 1 if eof else None
    return lf + 1 if lf >= 0 else None


@dataclass(frozen=True)
class Preamble:
    """What comes before the data rows: column names, and the line and (raw) offset where data starts."""

    names: tuple[str, ...]
    data_line: int  # 1-based physical line of the first data byte
    data_offset: int  # byte offset in the tracked stream where data starts


def read_preamble(tracker: LineTracker, options: CsvOptions, path: str, decode: Callable[[bytes], str]) -> Preamble:
    """Consume skip_rows lines, blank lines and the header record; the names come from the header or the config.

    Each line is read to at most input.csv.max_row_bytes: a longer one is refused in one line naming where it starts.
    """
    capped = functools.partial(tracker.readline_bytes, options.max_row_bytes)
    try:
        return _read_preamble(capped, tracker, options, path, decode)
    except PreambleLineTooLong as error:
        raise InputError(
            f"{path}: the line from byte {error.offset} has no line break in its first {error.max_bytes} bytes "
            "(input.csv.max_row_bytes), where a skipped line or the header must end: it is not CSV text; "
            "raise input.csv.max_row_bytes if its header is longer"
        ) from None


def _read_preamble(readline: Callable[[], bytes], tracker: LineTracker, options: CsvOptions, path: str,
                   decode: Callable[[bytes], str]) -> Preamble:
    line = 1
    for _ in range(options.skip_rows):
        if not readline():
            break
        line += 1
    names: tuple[str, ...] | None = options.column_names
    if options.header:
        header_lines: list[bytes] = []
        while True:
            first = readline()
            if not first:
                raise InputError(f"{path}: no header line (the file is empty after {options.skip_rows} skipped lines); "
                                 "set input.csv.header: false and column_names if it has none")
            if strip_line_break(first):
                header_lines.append(first)
                break
            line += 1
        parsed = _parse_header(header_lines, readline, options, path, decode)
        line += len(header_lines)
        if names is not None and len(names) != len(parsed):
            raise InputError(f"{path}: the header has {len(parsed)} columns ({', '.join(parsed)}) but "
                             f"input.csv.column_names lists {len(names)}")
        names = names or unnamed_columns_named(parsed)
    assert names is not None
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputError(f"{path}: column names {', '.join(map(repr, duplicates))} appear more than once in the "
                         "header; set input.csv.column_names to name every column uniquely")
    return Preamble(names=tuple(names), data_line=line, data_offset=tracker.position)


def unnamed_column_name(index: int) -> str:
    """The name a column gets when the header gives it none (R's write.csv leaves the row-name column "")."""
    return f"column_{index}"


def unnamed_columns_named(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(name if name else unnamed_column_name(index) for index, name in enumerate(names))


def _parse_header(lines: list[bytes], readline: Callable[[], bytes], options: CsvOptions, path: str,
                  decode: Callable[[bytes], str]) -> tuple[str, ...]:
    """Parse the header record with the csv module, pulling more lines while a quoted name is open."""

    def more_lines() -> Iterator[str]:
        for index, line in enumerate(lines):
            text = decode(line)
            yield text[1:] if index == 0 and text.startswith("\ufeff") else text
        while True:
            line = readline()
            if not line:
                return
            lines.append(line)
            yield decode(line)

    reader = csv.reader(more_lines(), delimiter=options.delimiter, quotechar=options.quote_char or '"',
                        quoting=csv.QUOTE_MINIMAL if options.quote_char else csv.QUOTE_NONE,
                        escapechar=options.escape_char, doublequote=True, strict=False)
    try:
        record = next(reader)
    except (csv.Error, StopIteration) as error:
        raise InputError(f"{path}: cannot parse the header line: {error}") from error
    return tuple(record)


def decoder_for(encoding: str) -> Callable[[bytes], str]:
    def decode(line: bytes) -> str:
        return line.decode(encoding, "replace")

    return decode


@dataclass(frozen=True)
class SkippedRow:
    """Where skip_row found a row, in stream offsets; start == end when the stream had no row left."""

    blank_lines: int  # blank lines before the row
    start: int  # the row's first byte
    end: int  # just past its line break, or the end of the stream
    line_breaks: int  # in [start, end), its own line break included
    size: int  # its bytes, without its line break
    head: bytes  # its first LONG_ROW_RAW_BYTES bytes
    quote_open: bool  # the stream ended inside a quoted value


class RowCursor:
    """A forward-only reader of a chunk stream holding only the bytes not yet taken (about one chunk).

    Taking bytes counts the line breaks in them (\n, \r\n, a lone \r) and keeps the first
    LONG_ROW_RAW_BYTES taken since the last mark.
    """

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self.data = b""
        self.pos = 0  # the first byte not taken, in data
        self._base = 0  # stream offset of data[0]
        self._eof = False
        self.line_breaks = 0
        self._after_cr = False
        self.head = bytearray()

    @property
    def offset(self) -> int:
        return self._base + self.pos

    def has(self, count: int) -> bool:
        """Whether count bytes from pos on are at hand, pulling chunks (and dropping taken bytes) as needed."""
        while len(self.data) - self.pos < count and not self._eof:
            more = next(self._chunks, None)
            if more is None:
                self._eof = True
            elif more:
                self._base += self.pos
                tail = self.data[self.pos:]
                self.data, self.pos = (tail + more if tail else more), 0
        return len(self.data) - self.pos >= count

    def byte(self, index: int = 0) -> int | None:
        """The byte index places after pos, or None past the end of the stream."""
        return self.data[self.pos + index] if self.has(index + 1) else None

    def take(self, count: int) -> None:
        data, begin = self.data, self.pos
        end = min(begin + count, len(data))
        if begin == end:
            return
        self.pos = end
        if len(self.head) < LONG_ROW_RAW_BYTES:
            self.head += data[begin:min(end, begin + LONG_ROW_RAW_BYTES - len(self.head))]
        returns = data.count(b"\r", begin, end)
        self.line_breaks += data.count(b"\n", begin, end) + returns - (data.count(b"\r\n", begin, end) if returns else 0)
        if self._after_cr and data[begin] == _LF:
            self.line_breaks -= 1  # the \n of a \r\n whose \r was taken before
        self._after_cr = data[end - 1] == _CR

    def mark(self) -> None:
        self.line_breaks, self.head = 0, bytearray()

    def rest(self) -> Iterator[bytes]:
        """The stream from pos on."""
        return itertools.chain((self.data[self.pos:],), self._chunks)


def skip_row(cursor: RowCursor, options: CsvOptions, quoting: bool) -> SkippedRow:
    """Take blank lines and then one row from the cursor, following pyarrow's CSV parser.

    As in pyarrow: a quote opens a quoted value only at the start of a field, a doubled quote
    inside one is a quote, the escape character takes the next byte inside quotes and out, and
    \n, \r\n and a lone \r end a row outside quotes. Quoting and escaping are off for the
    ranges read without quotes (see _parse_options). Only the bytes that can change the state are
    looked at (a regular expression finds the next one), so a long value costs a memchr-like pass.
    """
    quote = ord(options.quote_char) if quoting and options.quote_char else None
    escape = ord(options.escape_char) if quoting and options.escape_char else None
    unquoted, quoted = _row_patterns(options, quoting)
    blank_lines = _take_blank_lines(cursor)
    start = cursor.offset
    cursor.mark()
    in_quotes = quote is not None and cursor.byte() == quote
    if in_quotes:
        cursor.take(1)
    break_bytes = 0
    while cursor.has(1):
        match = (quoted if in_quotes else unquoted).search(cursor.data, cursor.pos)
        if match is None:  # keep the last byte: a delimiter whose quote is in the next chunk
            cursor.take(max(len(cursor.data) - cursor.pos - 1, 0))
            if not cursor.has(2):
                cursor.take(1)
            continue
        cursor.take(match.start() - cursor.pos)
        found, following = cursor.byte(), cursor.byte(1)
        if found == escape:
            cursor.take(2)
        elif in_quotes:  # a quote: doubled, or the end of the quoted part
            in_quotes = following == quote
            cursor.take(2 if in_quotes else 1)
        elif found in (_LF, _CR):
            break_bytes = 2 if found == _CR and following == _LF else 1
            cursor.take(break_bytes)
            break
        else:  # a delimiter and the quote that opens the next field
            cursor.take(2)
            in_quotes = True
    end = cursor.offset
    return SkippedRow(blank_lines=blank_lines, start=start, end=end, line_breaks=cursor.line_breaks,
                       size=end - start - break_bytes, head=bytes(cursor.head), quote_open=in_quotes)


def _row_patterns(options: CsvOptions, quoting: bool) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """What can change the scan's state outside quotes (a line break, the escape, a delimiter opening a
    quoted field) and inside them (a quote, the escape)."""
    escape = [re.escape(options.escape_char.encode())] if quoting and options.escape_char else []
    quote = re.escape(options.quote_char.encode()) if quoting and options.quote_char else None
    unquoted = [rb"[\r\n]", *escape]
    if quote is not None:
        unquoted.append(re.escape(options.delimiter.encode()) + b"(?=" + quote + b")")
    return re.compile(b"|".join(unquoted)), re.compile(b"|".join([quote or rb"(?!)", *escape]))


def _take_blank_lines(cursor: RowCursor) -> int:
    """Take the empty lines at the cursor (pyarrow skips them: they are not rows); returns how many."""
    lines = 0
    while (found := cursor.byte()) in (_LF, _CR):
        cursor.take(2 if found == _CR and cursor.byte(1) == _LF else 1)
        lines += 1
    return lines


def row_file_offset(path: str, encoding: str, stream_start: int, offset: int, line: int) -> int | None:
    """The byte offset in the file of a row that starts at offset in a stream read from file offset stream_start.

    UTF-8 and ASCII pass through (a BOM at the file start is not in the stream); for other
    encodings the row's line is found by counting line breaks in the file, which works where they
    are the ASCII bytes (every ASCII-compatible encoding); for UTF-16 and UTF-32 it is None.
    """
    if passes_through(encoding):
        return stream_start + offset + (_bom_length(path) if stream_start == 0 else 0)
    if "\r\n".encode(encoding) != b"\r\n":
        return None
    return _line_start_offset(path, line)


def _bom_length(path: str) -> int:
    with open_input(path) as raw:
        return len(_UTF8_BOM) if raw.read(len(_UTF8_BOM)) == _UTF8_BOM else 0


def _line_start_offset(path: str, line: int) -> int:
    """The byte offset where physical line `line` (1-based; \n, \r\n and a lone \r end lines) starts."""
    remaining, offset = line - 1, 0
    with open_input(path) as raw:
        while remaining > 0:
            data = raw.read(_READ_CHUNK_BYTES)
            if not data:
                return offset
            size = len(data)
            if data.endswith(b"\r"):  # the next byte tells whether this \r is the first half of a \r\n
                data += raw.read(1)
                raw.seek(offset + size)
            array = np.frombuffer(data, np.uint8)
            lone_cr = array == _CR
            lone_cr[:-1] &= array[1:] != _LF
            ends = np.flatnonzero((array == _LF) | lone_cr)
            ends = ends[ends < size]
            if len(ends) >= remaining:
                return offset + int(ends[remaining - 1]) + 1
            remaining -= len(ends)
            offset += size
    return offset


def special_bytes(options: CsvOptions) -> bytes:
    return "".join(char for char in (options.quote_char, options.escape_char) if char).encode("utf-8")


@dataclass(frozen=True)
class RangeScan:
    """One byte range of a CSV file: its line breaks and whether a quote or escape character occurs in it.

    line_breaks is None when has_special: the file is then read whole, so the scan stops there.
    """

    path: str
    start: int
    end: int
    line_breaks: int | None
    has_special: bool


def csv_ranges(size: int, split_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges a file is scanned (and, when safe, read) in."""
    bounds = list(range(0, size, split_bytes)) + [size]
    return list(zip(bounds, bounds[1:])) or [(0, 0)]


def scan_csv_range(path: str, start: int, end: int, options: CsvOptions, data_offset: int = 0) -> RangeScan:
    """Count the line breaks ending in [start, end) (a \\n, or a \\r not followed by \\n) and look for quotes.

    Quote and escape characters before data_offset (skipped lines, the header) do not count. The
    first one found ends the scan (line_breaks None): a file holding one is read whole anyway.
    """
    special = special_bytes(options)
    breaks = 0
    with open_input(path) as raw:
        raw.seek(start)
        position = start
        while position < end:
            data = raw.read(min(_READ_CHUNK_BYTES, end - position))
            if not data:
                break
            position += len(data)
            data_start = max(0, data_offset - (position - len(data)))
            if any(data.find(bytes([byte]), data_start) >= 0 for byte in special):
                return RangeScan(path, start, end, None, True)
            carriage_returns = data.count(b"\r")  # usually none: then skip the slower two-byte count
            breaks += data.count(b"\n") + carriage_returns - (data.count(b"\r\n") if carriage_returns else 0)
            if data.endswith(b"\r"):
                following = raw.read(1)
                raw.seek(position)
                if following == b"\n":
                    breaks -= 1  # its \n ends the line break, in this range or the next
    return RangeScan(path, start, end, breaks, False)


def csv_data_offset(path: str, options: CsvOptions) -> int:
    """The byte offset where a CSV file's rows start (after skipped lines, blank lines and the header)."""
    with open_input(path) as raw:
        return head_preamble(raw, options, path).data_offset


def head_preamble(raw: BinaryIO, options: CsvOptions, path: str) -> Preamble:
    """The preamble parsed from the raw bytes, so its data_offset is a byte offset in the file."""
    return read_preamble(LineTracker(_raw_chunks(raw)), options, path, decoder_for(options.encoding))


def record_boundary(raw: BinaryIO, position: int) -> int:
    """The first row start at or after position: just after the first line break ending at position - 1 or later."""
    if position == 0:
        return 0
    raw.seek(position - 1)
    offset = position - 1
    pending = b""
    while True:
        data = raw.read(1 << 16)
        if not data:
            return offset + len(pending)
        data = pending + data
        match = _first_line_break(bytearray(data), False)
        if match is not None:
            return offset + match
        if data.endswith(b"\r"):
            pending = b"\r"
            offset += len(data) - 1
        else:
            pending = b""
            offset += len(data)


def _raw_chunks(raw: BinaryIO) -> Iterator[bytes]:
    raw.seek(0)
    while True:
        data = raw.read(1 << 16)
        if not data:
            return
        yield data
