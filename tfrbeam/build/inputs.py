"""Read Parquet and CSV inputs as Arrow RecordBatches that carry their file and line numbers.

Parquet is read by row group (one Beam element per row group, column projection) with the
Arrow types of the file. CSV is parsed by pyarrow.csv in blocks, every column as binary, so that
typing and bad-row detection are ours (tfrbeam.build.features); each row keeps the physical line
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

import bisect
import codecs
import collections
import concurrent.futures
import contextlib
import csv
import functools
import io
import itertools
import logging
import os
import pickle
import queue
import re
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import BinaryIO

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfrbeam.base.handoff import put_until_stopped
from tfrbeam.build.compressed_inputs import open_checked
from tfrbeam.build.features import BadRow, ConvertedBatch, FeatureSpec, convert_batch, rows_as_json
from tfrbeam.build.progress import ProgressCounter, progress_dir
from tfrbeam.errors import ConfigError, InputError, ParquetSchemaError

__all__ = [
    "CsvOptions",
    "InputConfig",
    "InputFile",
    "InputSample",
    "ParquetOptions",
    "RangeScan",
    "ReadTabular",
    "SourceBatch",
    "convert_source_batch",
    "csv_data_offset",
    "csv_ranges",
    "encoding_problem",
    "inspect_input",
    "list_inputs",
    "parquet_columns_without_checksums",
    "parquet_input_schema",
    "parquet_row_groups",
    "read_csv_file",
    "read_csv_range",
    "read_parquet_file",
    "read_parquet_row_group",
    "scan_csv_range",
    "widened_type",
]

_LOG = logging.getLogger(__name__)

DEFAULT_SPLIT_BYTES = 64 << 20
SAMPLE_ROWS = 10_000
_CSV_BLOCK_BYTES = 4 << 20  # pyarrow's block; grown (x4 per retry) up to max_row_bytes for longer rows
DEFAULT_MAX_ROW_BYTES = 64 << 20
_READ_CHUNK_BYTES = 4 << 20
# Small enough that all but a row group's first batch decode while the caller converts the one
# before (see _ahead): 16384 built the 1M-row benchmark ~5 % faster than 65536, and peaked lower.
_PARQUET_BATCH_ROWS = 16384
_CR, _LF = 13, 10
_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class CsvOptions:
    """The CSV dialect. quote_char None disables quoting; only null_values are ever null."""

    delimiter: str = ","
    quote_char: str | None = '"'
    escape_char: str | None = None
    header: bool = True
    column_names: tuple[str, ...] | None = None
    null_values: tuple[str, ...] | None = None  # None: not given (none, unless inferred with the features)
    true_values: tuple[str, ...] | None = None  # read as 1 by int64 and float features (pyarrow's name)
    false_values: tuple[str, ...] | None = None  # read as 0
    skip_rows: int = 0
    encoding: str = "utf-8"
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES  # the longest row (in bytes) that can be read
    # Not a config key: the tokens features' own null_values name, derived from the features (None: no feature
    # has its own). The reader then nulls these and null_values, and keeps each null cell's token (null_text).
    feature_null_values: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ParquetOptions:
    """require_checksums: refuse files whose pages carry no CRC (pyarrow writes none unless write_page_checksum=True)."""

    require_checksums: bool = False


@dataclass(frozen=True)
class InputConfig:
    """Where the rows come from: a glob of CSV or Parquet files and how to read them."""

    format: str
    path: str
    csv: CsvOptions = field(default_factory=CsvOptions)
    parquet: ParquetOptions = field(default_factory=ParquetOptions)
    columns: tuple[str, ...] | None = None
    split_bytes: int = DEFAULT_SPLIT_BYTES


@dataclass(frozen=True)
class InputFile:
    """One input file and its fingerprint for the manifest."""

    path: str
    size: int
    mtime: float | None


@dataclass(frozen=True, eq=False)
class SourceBatch:
    """Rows of one input file with their provenance.

    lines: per row, the 1-based physical line it starts on (CSV) or its 1-based row number in
    the file (Parquet). bad_rows: rows the reader itself rejected (CSV: wrong number of fields).
    For CSV, raw holds the UTF-8 text of the batch's lines, starting at line raw_first_line, with
    raw_line_starts the offset of each of those lines in raw (plus the end), and spans the number
    of physical lines of each row; raw_text() slices a row's exact text from them. converted holds
    the batch's feature columns when ReadTabular converted it as it read (``convert_with``).
    """

    path: str
    lines: np.ndarray
    batch: pa.RecordBatch
    bad_rows: tuple[BadRow, ...] = ()
    raw: bytes | None = None
    raw_first_line: int = 0
    raw_line_starts: np.ndarray | None = None
    spans: np.ndarray | None = None
    true_values: tuple[str, ...] = ()  # the CSV dialect's boolean tokens, for the conversion
    false_values: tuple[str, ...] = ()
    converted: ConvertedBatch | None = None
    null_text: dict[str, pa.Array] | None = None  # per column with nulls: each null cell's token (per-feature nulls)
    null_values: tuple[str, ...] = ()  # the file-wide null tokens, when null_text is set

    @property
    def first_line(self) -> int:
        return int(self.lines[0]) if len(self.lines) else 0

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def raw_text(self, rows: Iterable[int]) -> list[str]:
        """The raw text of the given rows: the CSV lines as in the file, or the Parquet row as JSON."""
        if self.raw is None:
            return rows_as_json(self.batch, rows)
        assert self.raw_line_starts is not None and self.spans is not None  # CSV batches carry them with raw
        texts = []
        for row in rows:
            first = int(self.lines[row]) - self.raw_first_line
            last = first + int(self.spans[row])
            chunk = self.raw[self.raw_line_starts[first]:self.raw_line_starts[last]]
            texts.append(_strip_line_break(chunk).decode("utf-8", "replace"))
        return texts


class SourceBatchCoder(beam.coders.Coder):
    """Pickles a SourceBatch, but sizes it from its buffers: Beam's element counters would
    otherwise pickle a sample of the batches (~9 MB each) just to measure them."""

    def encode(self, value: SourceBatch) -> bytes:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> SourceBatch:
        return pickle.loads(encoded)

    def estimate_size(self, value: SourceBatch) -> int:
        arrays = (value.lines, value.raw_line_starts, value.spans)
        return (value.batch.get_total_buffer_size() + len(value.raw or b"") + len(value.path)
                + sum(array.nbytes for array in arrays if array is not None))

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return SourceBatch


beam.coders.registry.register_coder(SourceBatch, SourceBatchCoder)


def convert_source_batch(source: SourceBatch, specs: Sequence[FeatureSpec]) -> ConvertedBatch:
    """convert_batch on a SourceBatch; the reader's own bad rows come first in the result's bad_rows."""
    converted = convert_batch(source.batch, specs, source, source.true_values, source.false_values,
                              source.null_text, source.null_values)
    if source.bad_rows:
        return ConvertedBatch(batch=converted.batch, bad_rows=list(source.bad_rows) + converted.bad_rows,
                              kept_rows=converted.kept_rows)
    return converted


def _strip_line_break(chunk: bytes) -> bytes:
    if chunk.endswith(b"\r\n"):
        return chunk[:-2]
    if chunk.endswith((b"\n", b"\r")):
        return chunk[:-1]
    return chunk


# --------------------------------------------------------------------------------------- listing


def list_inputs(pattern: str) -> list[InputFile]:
    """The files matching a glob (any Beam filesystem), sorted by path, with size and mtime."""
    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # Beam raises BeamIOError and friends, with the cause inside
        raise ConfigError(f"input.path: cannot list {pattern!r}: {error}") from error
    files = sorted((InputFile(m.path, int(m.size_in_bytes), getattr(m, "last_updated_in_seconds", None))
                    for m in matches), key=lambda f: f.path)
    if not files:
        raise ConfigError(f"input.path: {pattern!r} matches no files")
    return files


def _open(path: str) -> BinaryIO:
    """The input file's bytes; a compressed one decompressed and checked to its end (see compressed_inputs)."""
    try:
        return open_checked(path)  # type: ignore[return-value]  # file-like: read, seek, tell, close
    except Exception as error:
        raise InputError(f"{path}: cannot open: {error}") from error


def _is_compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


# -------------------------------------------------------------------------------------- CSV text


def _splittable_encoding(encoding: str) -> bool:
    """Whether every line break and ASCII character is the same single byte as in ASCII."""
    name = codecs.lookup(encoding).name
    return name in ("utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-1") or name.startswith(("iso8859-", "cp125"))


_MARK_UNDECODABLE = "tfrbeam-mark-undecodable"


def _mark_undecodable(error: UnicodeError) -> tuple[str, int]:
    """Decode each undecodable byte b as the lone surrogate U+DC00 + b.

    Valid text never decodes to a lone surrogate in the encodings read (encoding_problem refuses
    those that can), and its UTF-8 form (surrogatepass) is not valid UTF-8, so the row holding it
    is found when its batch is checked, and the byte can be named.
    """
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "".join(chr(0xDC00 + byte) for byte in error.object[error.start:error.end]), error.end


codecs.register_error(_MARK_UNDECODABLE, _mark_undecodable)

# Codecs Python knows that decode valid input to lone surrogates (or decode nothing), so their
# rows cannot be checked: refused in the config.
_UNCHECKABLE_CODECS = ("utf-7", "unicode-escape", "raw-unicode-escape", "undefined")


def encoding_problem(encoding: str) -> str | None:
    """Why CSV text in this encoding cannot be read with every row checked, or None when it can."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        return f"{encoding!r} is not an encoding Python knows (e.g. utf-8, latin-1, cp1252)"
    if not getattr(info, "_is_text_encoding", True):
        return f"{encoding!r} is not a text encoding (it maps bytes to bytes, or text to text)"
    if info.name in _UNCHECKABLE_CODECS:
        return (f"{encoding!r} can decode to lone surrogates, which UTF-8 cannot hold, so its rows cannot be "
                "checked; convert the file to UTF-8 first")
    return None


def _utf8_chunks(raw: BinaryIO, encoding: str, at_file_start: bool, limit: int | None) -> Iterator[bytes]:
    """The file's bytes from the current position as UTF-8, BOM removed at the start.

    Other encodings are transcoded; bytes they cannot decode are marked (see _mark_undecodable),
    and the rows holding them become bad rows.
    """
    passthrough = _passes_through(encoding)
    decoder = None if passthrough else codecs.getincrementaldecoder(encoding)(_MARK_UNDECODABLE)
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


class _LineTracker(io.RawIOBase):
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

    def readline_bytes(self) -> bytes:
        """One physical line with its line break (used for the preamble before pyarrow starts)."""
        with self._lock:
            return self._readline()

    def _readline(self) -> bytes:
        while True:
            end = self._text.line_end(self._handed, self._eof)
            if end is not None or self._eof:
                end = end if end is not None else self._pulled
                line = self._text.slice(self._handed, end)
                self._handed = end
                return line
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


# ------------------------------------------------------------------------------------ CSV header


@dataclass(frozen=True)
class _Preamble:
    """What comes before the data rows: column names, and the line and (raw) offset where data starts."""

    names: tuple[str, ...]
    data_line: int  # 1-based physical line of the first data byte
    data_offset: int  # byte offset in the tracked stream where data starts


def _read_preamble(tracker: _LineTracker, options: CsvOptions, path: str, decode: Callable[[bytes], str]) -> _Preamble:
    """Consume skip_rows lines, blank lines and the header record; the names come from the header or the config."""
    line = 1
    for _ in range(options.skip_rows):
        if not tracker.readline_bytes():
            break
        line += 1
    names: tuple[str, ...] | None = options.column_names
    if options.header:
        header_lines: list[bytes] = []
        while True:
            first = tracker.readline_bytes()
            if not first:
                raise InputError(f"{path}: no header line (the file is empty after {options.skip_rows} skipped lines); "
                                 "set input.csv.header: false and column_names if it has none")
            if _strip_line_break(first):
                header_lines.append(first)
                break
            line += 1
        parsed = _parse_header(header_lines, tracker, options, path, decode)
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
    return _Preamble(names=tuple(names), data_line=line, data_offset=tracker.position)


def unnamed_column_name(index: int) -> str:
    """The name a column gets when the header gives it none (R's write.csv leaves the row-name column "")."""
    return f"column_{index}"


def unnamed_columns_named(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(name if name else unnamed_column_name(index) for index, name in enumerate(names))


def _parse_header(lines: list[bytes], tracker: _LineTracker, options: CsvOptions, path: str,
                  decode: Callable[[bytes], str]) -> tuple[str, ...]:
    """Parse the header record with the csv module, pulling more lines while a quoted name is open."""

    def more_lines() -> Iterator[str]:
        for index, line in enumerate(lines):
            text = decode(line)
            yield text[1:] if index == 0 and text.startswith("\ufeff") else text
        while True:
            line = tracker.readline_bytes()
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


def _decoder_for(encoding: str) -> Callable[[bytes], str]:
    def decode(line: bytes) -> str:
        return line.decode(encoding, "replace")

    return decode


# -------------------------------------------------------------------------------------- CSV rows


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


def _read_rows(path: str, tracker: _LineTracker, preamble: _Preamble, options: CsvOptions, first_file_line: int,
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
        produced = _ahead(batches) if _PREFETCH_BATCHES else batches
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
    pieces = [_strip_line_break(source.raw[source.raw_line_starts[first]:
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
# decoding (~0.7 s from Parquet) off the caller's path when a core is free, and costs a little
# when none is.
_PREFETCH_BATCHES = 2
_DONE = object()


def _ahead(items: Generator[SourceBatch, None, None], thread_name: str = "tfrbeam-csv-read") -> Iterator[SourceBatch]:
    """The items of an iterator, produced by a thread up to _PREFETCH_BATCHES ahead of the caller.

    pyarrow parses the next block (without the GIL) while the caller converts this one; the
    order and every row's numbering are the iterator's own. Errors reach the caller as raised.
    Closing early stops the thread after the item it is making and closes the iterator there.
    """
    handoff: queue.Queue = queue.Queue(maxsize=_PREFETCH_BATCHES)
    stop = threading.Event()

    def put(item) -> bool:
        return put_until_stopped(handoff, item, stop)

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as error:  # handed to the caller, who raises it
            put((_DONE, error))
        finally:
            items.close()  # a generator's cleanup (closing pyarrow's reader) runs in the thread that ran it

    thread = threading.Thread(target=produce, name=thread_name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


def _passes_through(encoding: str) -> bool:
    return codecs.lookup(encoding).name in ("utf-8", "utf-8-sig", "ascii")


def _without_undecodable_rows(source: SourceBatch, codec: str) -> SourceBatch:
    """The batch without rows whose text is not valid in the declared encoding; they become bad rows.

    UTF-8 and ASCII text is checked as it is; text of other encodings was transcoded with every
    undecodable byte marked (see _mark_undecodable), and the marks are not valid UTF-8. The whole
    batch's text is decoded once (fast when valid, the usual case); only a batch that fails is
    looked at row by row.
    """
    check = codec if _passes_through(codec) else "utf-8"
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
                                   _shown_text(_strip_line_break(text), codec)))
    if not bad_rows:
        return source
    mask = pa.array(keep)
    merged = sorted([*source.bad_rows, *bad_rows], key=lambda bad: bad.line)
    return replace(source, lines=source.lines[keep], batch=source.batch.filter(mask), spans=source.spans[keep],
                   bad_rows=tuple(merged))


def _undecodable_reason(text: bytes, error: UnicodeDecodeError, codec: str) -> str:
    """Where a row stops being valid text: the byte in the row as the file holds it, and why."""
    name = codec.replace("-sig", "")
    if _passes_through(codec):
        return f"byte {error.start} of the row is not valid {name} text ({error.reason}); set input.csv.encoding"
    before = text[:error.start].decode("utf-8")
    byte = len(before.encode(codec, "replace")) - len("".encode(codec))  # without the BOM some codecs write
    marks = itertools.takewhile(lambda char: 0xDC00 <= ord(char) <= 0xDCFF,
                                text[error.start:].decode("utf-8", "surrogatepass"))
    shown = " ".join(f"0x{ord(char) - 0xDC00:02x}" for char in marks)
    return f"byte {byte} of the row is not valid {name} text ({shown} cannot be decoded); set input.csv.encoding"


def _shown_text(text: bytes, codec: str) -> str:
    """A row's text for the dead letters: an undecodable byte (or its mark) shows as U+FFFD."""
    if _passes_through(codec):
        return text.decode(codec, "replace")
    return re.sub("[\udc00-\udcff]", "\ufffd", text.decode("utf-8", "surrogatepass"))


def _numbered_batches(path: str, tracker: _LineTracker, reader, invalid: dict, invalid_lock: threading.Lock,
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
                    yield _assemble(path, tracker, _empty_batch(keep), record, numbers, known, ordinal,
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
            yield _assemble(path, tracker, _empty_batch(keep), record, numbers, known, ordinal, first_file_line, None)
        raise _RowTooLong(path, where) from error


class _RowTooLong(InputError):
    """A row longer than pyarrow's block: the rows from it on are read again with a bigger block, or it
    becomes a bad row (see _rows_with_long_rows)."""

    def __init__(self, path: str, where: str):
        super().__init__(f"{path}: a row {where} is longer than the CSV block")
        self.where = where


LONG_ROW_RAW_BYTES = 4096  # the start of a row over input.csv.max_row_bytes kept as its raw text (dead letters)


def _rows_with_long_rows(path: str, tracker: _LineTracker, preamble: _Preamble, options: CsvOptions,
                         first_file_line: int, quoting: bool, columns: Sequence[str] | None,
                         file_offset: Callable[[int, int], int | None]) -> Generator[SourceBatch, None, None]:
    """_read_rows, going on past rows longer than pyarrow's block.

    Such a row makes the rows from it on read again from where they start (the tracker still holds
    their text; nothing before is read twice) with a block four times larger, up to
    input.csv.max_row_bytes. A row longer than that is measured by a quote-aware scan (_skip_row)
    that holds one chunk at a time, becomes a bad row, and the rows after it are read on with the
    first block size. Rows that long are rare: the common case reads once with 4 MiB blocks.
    file_offset maps (offset in the stream, file line) of a row start to its byte offset in the file.
    """
    names, keep = preamble.names, _kept_columns(preamble.names, columns)
    special = _special_bytes(options) if quoting else b""
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
                cursor = _Cursor(chunks)
                skipped = _skip_row(cursor, options, quoting)
                row_line = first_file_line + skipped.blank_lines
                if skipped.quote_open:
                    raise _unclosed_quote(path, options.quote_char, row_line) from error
                yield _long_row(path, row_line, skipped, file_offset(base + skipped.start, row_line),
                                options.max_row_bytes, keep)
                base, first_file_line = base + skipped.end, row_line + skipped.line_breaks
                chunks, block = cursor.rest(), first_block
        tracker = _LineTracker(chunks, special)
        preamble = _Preamble(names=names, data_line=first_file_line, data_offset=0)


def _kept_columns(names: Sequence[str], columns: Sequence[str] | None) -> list[str]:
    return [name for name in names if columns is None or name in set(columns)]


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def _long_row(path: str, line: int, skipped: _SkippedRow, offset: int | None, limit: int,
              keep: Sequence[str]) -> SourceBatch:
    """A batch of no rows holding the bad row for a row over max_row_bytes; its raw text is its first bytes."""
    where = f" from byte {offset}" if offset is not None else ""
    reason = f"row longer than input.csv.max_row_bytes={limit} ({skipped.size} bytes{where}); raise it to read it"
    head = codecs.getincrementaldecoder("utf-8")("replace").decode(skipped.head[:skipped.size])  # a cut character is left out
    return SourceBatch(path=path, lines=np.zeros(0, np.int64), batch=_empty_batch(keep),
                       bad_rows=(BadRow(path, line, reason, head),))


# ----------------------------------------------------------------------------- CSV long-row scan


@dataclass(frozen=True)
class _SkippedRow:
    """Where _skip_row found a row, in stream offsets; start == end when the stream had no row left."""

    blank_lines: int  # blank lines before the row
    start: int  # the row's first byte
    end: int  # just past its line break, or the end of the stream
    line_breaks: int  # in [start, end), its own line break included
    size: int  # its bytes, without its line break
    head: bytes  # its first LONG_ROW_RAW_BYTES bytes
    quote_open: bool  # the stream ended inside a quoted value


class _Cursor:
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


def _skip_row(cursor: _Cursor, options: CsvOptions, quoting: bool) -> _SkippedRow:
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
    return _SkippedRow(blank_lines=blank_lines, start=start, end=end, line_breaks=cursor.line_breaks,
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


def _take_blank_lines(cursor: _Cursor) -> int:
    """Take the empty lines at the cursor (pyarrow skips them: they are not rows); returns how many."""
    lines = 0
    while (found := cursor.byte()) in (_LF, _CR):
        cursor.take(2 if found == _CR and cursor.byte(1) == _LF else 1)
        lines += 1
    return lines


def _row_file_offset(path: str, encoding: str, stream_start: int, offset: int, line: int) -> int | None:
    """The byte offset in the file of a row that starts at offset in a stream read from file offset stream_start.

    UTF-8 and ASCII pass through (a BOM at the file start is not in the stream); for other
    encodings the row's line is found by counting line breaks in the file, which works where they
    are the ASCII bytes (every ASCII-compatible encoding); for UTF-16 and UTF-32 it is None.
    """
    if _passes_through(encoding):
        return stream_start + offset + (_bom_length(path) if stream_start == 0 else 0)
    if "\r\n".encode(encoding) != b"\r\n":
        return None
    return _line_start_offset(path, line)


def _bom_length(path: str) -> int:
    with _open(path) as raw:
        return len(_UTF8_BOM) if raw.read(len(_UTF8_BOM)) == _UTF8_BOM else 0


def _line_start_offset(path: str, line: int) -> int:
    """The byte offset where physical line `line` (1-based; \n, \r\n and a lone \r end lines) starts."""
    remaining, offset = line - 1, 0
    with _open(path) as raw:
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


def _check_closed_quotes(path: str, last_row: tuple[int, int, str] | None, quote: str | None) -> None:
    """pyarrow ends a value whose quote never closes at the end of the file; we refuse that file.

    The sign: the last row spans lines and holds an odd number of quote characters (complete
    quoted fields hold an even number; a stray quote inside an unquoted field stays on its line).
    """
    if last_row is None or quote is None:
        return
    line, span, raw = last_row
    if span > 1 and raw.count(quote) % 2:
        raise _unclosed_quote(path, quote, line)


def _unclosed_quote(path: str, quote: str | None, line: int) -> InputError:
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


def _assemble(path: str, tracker: _LineTracker, batch: pa.RecordBatch, record: int, inside: list[int],
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
        text = _strip_line_break(raw[starts[local]:starts[local + int(lines[position])]]).decode("utf-8", "replace")
        bad_rows.append(BadRow(path, first_file_line + int(stream_lines[position]),
                               f"has {actual} field{'s' if actual != 1 else ''}, expected {expected}", text))
    return SourceBatch(path=path, lines=(stream_lines[~is_invalid] + first_file_line).astype(np.int64), batch=batch,
                       bad_rows=tuple(bad_rows), raw=raw, raw_first_line=first + first_file_line,
                       raw_line_starts=starts, spans=lines[~is_invalid])


def read_csv_file(path: str, options: CsvOptions,
                  columns: Sequence[str] | None = None) -> Generator[SourceBatch, None, None]:
    """Every row of a CSV file, streamed block by block from the start (quoted line breaks are fine)."""
    with _open(path) as raw:
        tracker = _LineTracker(_utf8_chunks(raw, options.encoding, True, None), _special_bytes(options))
        preamble = _read_preamble(tracker, options, path, _decoder_for("utf-8"))
        yield from _rows_with_long_rows(path, tracker, preamble, options, 1, True, columns,
                                        functools.partial(_row_file_offset, path, options.encoding, 0))


def _special_bytes(options: CsvOptions) -> bytes:
    return "".join(char for char in (options.quote_char, options.escape_char) if char).encode("utf-8")


# ------------------------------------------------------------------------------- CSV byte ranges


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
    special = _special_bytes(options)
    breaks = 0
    with _open(path) as raw:
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
    with _open(path) as raw:
        return _head_preamble(raw, options, path).data_offset


def _head_preamble(raw: BinaryIO, options: CsvOptions, path: str) -> _Preamble:
    """The preamble parsed from the raw bytes, so its data_offset is a byte offset in the file."""
    return _read_preamble(_LineTracker(_raw_chunks(raw)), options, path, _decoder_for(options.encoding))


def _record_boundary(raw: BinaryIO, position: int) -> int:
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


def read_csv_range(path: str, start: int, end: int, line_breaks_before: int, options: CsvOptions,
                   columns: Sequence[str] | None = None) -> Generator[SourceBatch, None, None]:
    """The rows starting in bytes [start, end) of a CSV file without quoted line breaks.

    line_breaks_before is the number of line breaks ending before `start` (from scan_csv_range
    of the earlier ranges); it makes the line numbers. Only safe when no quote or escape
    character occurs in the file: then every line break ends a row.
    """
    with _open(path) as raw:
        preamble = _head_preamble(raw, options, path)
        data_offset = preamble.data_offset
        own_start = max(_record_boundary(raw, start), data_offset)
        own_end = max(_record_boundary(raw, end), own_start) if end > own_start else own_start
        if own_start >= own_end:
            return
        if own_start == data_offset:
            first_line = preamble.data_line
        else:
            first_line = 1 + line_breaks_before + (1 if own_start > start else 0)
        raw.seek(own_start)
        tracker = _LineTracker(_utf8_chunks(raw, options.encoding, own_start == 0, own_end - own_start))
        inline = _Preamble(names=preamble.names, data_line=first_line, data_offset=0)
        yield from _rows_with_long_rows(path, tracker, inline, options, first_line, False, columns,
                                        functools.partial(_row_file_offset, path, options.encoding, own_start))


def _raw_chunks(raw: BinaryIO) -> Iterator[bytes]:
    raw.seek(0)
    while True:
        data = raw.read(1 << 16)
        if not data:
            return
        yield data


# ---------------------------------------------------------------------------------------- Parquet


def _parquet_file(path: str, raw: BinaryIO) -> pq.ParquetFile:
    try:
        # Page CRCs are checked where the writer stored them: a damaged page fails instead of
        # turning into wrong values.
        return pq.ParquetFile(raw, page_checksum_verification=True)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... on malformed files
        raise InputError(f"{path}: not a readable Parquet file: {error}") from error


def parquet_row_groups(path: str, require_checksums: bool = False) -> list[tuple[int, int]]:
    """(row group index, number of rows before it) for each row group of a Parquet file.

    require_checksums: raise InputError when a column chunk's pages carry no CRC.
    """
    return _row_group_listing(path, require_checksums)[0]


def _row_group_listing(path: str, require_checksums: bool) -> tuple[list[tuple[int, int]], int]:
    """parquet_row_groups, and the file's number of rows."""
    with _open(path) as raw:
        metadata = _parquet_file(path, raw).metadata
        if require_checksums:
            _require_checksums(path, raw, metadata)
        groups, before = [], 0
        for index in range(metadata.num_row_groups):
            groups.append((index, before))
            before += metadata.row_group(index).num_rows
        return groups, before


def parquet_columns_without_checksums(path: str) -> list[tuple[int, str]]:
    """(row group, column path) of every column chunk whose first page header holds no CRC.

    pyarrow's metadata does not say whether pages carry checksums, so the first page header of
    each column chunk (Thrift compact PageHeader: field 4 is the optional crc) is read directly;
    a writer stores CRCs on all pages of a file or none.
    """
    with _open(path) as raw:
        return _chunks_without_checksums(raw, _parquet_file(path, raw).metadata)


def _require_checksums(path: str, raw: BinaryIO, metadata: pq.FileMetaData) -> None:
    missing = _chunks_without_checksums(raw, metadata)
    if missing:
        group, column = missing[0]
        raise InputError(
            f"{path}: column {column!r} of row group {group} has no page checksums (the writer stored none; pyarrow "
            "stores them with write_page_checksum=True), and input.parquet.require_checksums refuses such files: "
            "without them a damaged page reads as wrong values")


def _chunks_without_checksums(raw: BinaryIO, metadata: pq.FileMetaData) -> list[tuple[int, str]]:
    missing = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            raw.seek(offset)
            if not _page_header_has_crc(raw.read(_PAGE_HEADER_PREFIX_BYTES)):
                missing.append((group, chunk.path_in_schema))
    return missing


_PAGE_HEADER_PREFIX_BYTES = 64  # type, two sizes and the crc: at most 1 + 4 * (1 + 10) bytes
_COMPACT_I32 = 5


def _page_header_has_crc(header: bytes) -> bool:
    """Whether a Thrift-compact PageHeader holds field 4 (crc); fields 1-3 (type, sizes) are i32 varints before it."""
    position, field_id = 0, 0
    while position < len(header):
        byte = header[position]
        position += 1
        delta, kind = byte >> 4, byte & 0x0F
        if byte == 0 or delta == 0:  # the end of the struct, or a long-form field id: not the layout writers use
            return False
        field_id += delta
        if field_id == 4:
            return kind == _COMPACT_I32
        if field_id > 4 or kind != _COMPACT_I32:
            return False
        while position < len(header) and header[position] & 0x80:  # skip the varint
            position += 1
        position += 1
    return False


def read_parquet_row_group(path: str, group: int, rows_before: int,
                           columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """The rows of one row group as batches; lines are 1-based row numbers in the file."""
    batches = _parquet_row_group_batches(path, group, rows_before, columns)
    return _ahead(batches, "tfrbeam-parquet-read") if _PREFETCH_BATCHES else batches


def _parquet_row_group_batches(path: str, group: int, rows_before: int,
                               columns: Sequence[str] | None) -> Generator[SourceBatch, None, None]:
    with _open(path) as raw:
        parquet = _parquet_file(path, raw)
        projection = _parquet_projection(parquet.schema_arrow, columns, path)
        declared = parquet.metadata.row_group(group).num_rows
        row = rows_before + 1
        try:
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=[group], columns=projection,
                                              use_threads=False):
                yield SourceBatch(path=path, lines=np.arange(row, row + batch.num_rows, dtype=np.int64), batch=batch)
                row += batch.num_rows
        except Exception as error:  # pyarrow raises OSError, ArrowInvalid, ... on damaged pages
            raise InputError(f"{path}: cannot read row group {group} (rows {rows_before + 1} on): {error}") from error
        if row - rows_before - 1 != declared:
            raise InputError(f"{path}: row group {group} declares {declared} rows but its columns hold "
                             f"{row - rows_before - 1}; the file is damaged")


def read_parquet_file(path: str, columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """Every row of a Parquet file, row group by row group."""
    for group, before in parquet_row_groups(path):
        yield from read_parquet_row_group(path, group, before, columns)


def _parquet_projection(schema: pa.Schema, columns: Sequence[str] | None, path: str) -> list[str] | None:
    if columns is None:
        return None
    missing = [name for name in columns if name not in schema.names]
    if missing:
        raise InputError(f"{path}: has no column {', '.join(map(repr, missing))} (columns: {', '.join(schema.names)})")
    return list(dict.fromkeys(columns))


# ------------------------------------------------------------------------------ Parquet schemas

_FOOTER_THREADS = 16  # footers are read in parallel: on an object store each one is a round trip
_LOGGED_WIDENINGS = 20  # widenings logged at INFO; the rest at DEBUG, counted in one INFO line


def widened_type(left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
    """The type that holds every value of both ``left`` and ``right`` unchanged (lossless widening), or None.

    Allowed: equal types; an integer into a wider one of the same sign, unsigned into a wider
    signed; float16 -> float -> double; string <-> large_string and binary <-> large_binary (the
    large one); a dictionary as its value type; list <-> large_list and structs with the same
    field names, of such pairs. Nothing else: no sign change, no int <-> float, no string <-> binary.
    """
    if left.equals(right):
        return left
    if pa.types.is_dictionary(left) or pa.types.is_dictionary(right):
        return widened_type(_undictionaried(left), _undictionaried(right))
    if pa.types.is_integer(left) and pa.types.is_integer(right):
        return right if _holds_integers(right, left) else left if _holds_integers(left, right) else None
    if pa.types.is_floating(left) and pa.types.is_floating(right):
        return left if left.bit_width > right.bit_width else right
    for pair in ((pa.string(), pa.large_string()), (pa.binary(), pa.large_binary())):
        if left in pair and right in pair:
            return pair[1]
    if _is_variable_list(left) and _is_variable_list(right):
        return _widened_list(left, right)
    if pa.types.is_struct(left) and pa.types.is_struct(right):
        return _widened_struct(left, right)
    return None


def _undictionaried(type_: pa.DataType) -> pa.DataType:
    return type_.value_type if pa.types.is_dictionary(type_) else type_


def _holds_integers(wide: pa.DataType, narrow: pa.DataType) -> bool:
    """Whether every value of integer type ``narrow`` is a value of integer type ``wide``."""
    if pa.types.is_signed_integer(wide) == pa.types.is_signed_integer(narrow):
        return wide.bit_width >= narrow.bit_width
    return pa.types.is_signed_integer(wide) and wide.bit_width > narrow.bit_width


def _is_variable_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_)


def _widened_list(left: pa.DataType, right: pa.DataType) -> pa.DataType | None:
    value = widened_type(left.value_type, right.value_type)
    if value is None:
        return None
    item = left.value_field.with_type(value).with_nullable(left.value_field.nullable or right.value_field.nullable)
    return pa.large_list(item) if pa.types.is_large_list(left) or pa.types.is_large_list(right) else pa.list_(item)


def _widened_struct(left: pa.StructType, right: pa.StructType) -> pa.DataType | None:
    if [field_.name for field_ in left] != [field_.name for field_ in right]:
        return None
    fields = []
    for ours, theirs in zip(left, right):
        type_ = widened_type(ours.type, theirs.type)
        if type_ is None:
            return None
        fields.append(pa.field(ours.name, type_, ours.nullable or theirs.nullable))
    return pa.struct(fields)


def parquet_input_schema(files: Sequence[InputFile], columns: Sequence[str] | None = None) -> pa.Schema:
    """The schema all files of a Parquet input are read as: the first file's, with columns widened where files differ.

    Reads only the footers. Checks the given ``columns`` (default: every column of the first
    file): a file that repeats a column name, a type that only a lossy conversion joins with
    another file's (``widened_type``), or a listed column a later file lacks raises
    ParquetSchemaError naming both files, the column and both types. Each widening is logged.
    """
    paths = [item.path for item in files]
    schemas = _footer_schemas(paths)
    for path, schema in zip(paths, schemas):
        _refuse_repeated_names(path, schema)
    first = schemas[0]
    names = [name for name in dict.fromkeys(columns if columns is not None else first.names) if name in first.names]
    notes: list[str] = []
    widened = first
    for name in names:
        field_ = _widened_field(name, paths, schemas, columns is not None, notes)
        widened = widened.set(widened.get_field_index(name), field_)
    _log_widenings(notes)
    return widened


def _footer_schemas(paths: Sequence[str]) -> list[pa.Schema]:
    if len(paths) == 1:
        return [_footer_schema(paths[0])]
    with concurrent.futures.ThreadPoolExecutor(min(_FOOTER_THREADS, len(paths)), "tfrbeam-footer") as pool:
        return list(pool.map(_footer_schema, paths))


def _footer_schema(path: str) -> pa.Schema:
    with _open(path) as raw:
        return _parquet_file(path, raw).schema_arrow


def _refuse_repeated_names(path: str, schema: pa.Schema) -> None:
    counts = collections.Counter(schema.names)
    repeated = [name for name, count in counts.items() if count > 1]
    if repeated:
        name = repeated[0]
        raise ParquetSchemaError(
            f"{path}: column {name!r} appears {counts[name]} times in the schema (columns: {', '.join(schema.names)}); "
            "columns are read by name, so rename or drop the repeated ones (pyarrow: table.rename_columns) and "
            "write the file again")


def _widened_field(name: str, paths: Sequence[str], schemas: Sequence[pa.Schema], listed: bool,
                   notes: list[str]) -> pa.Field:
    """Column ``name`` widened over every file; appends a note per file read as a wider type than its own."""
    current, owner = schemas[0].field(name), paths[0]
    for path, schema in zip(paths[1:], schemas[1:]):
        index = schema.get_field_index(name)
        if index < 0:
            if listed:
                raise ParquetSchemaError(f"{path}: has no column {name!r} ({owner} has it as {current.type}); "
                                         "every file of a Parquet input must hold the columns of input.columns")
            continue
        theirs = schema.field(index)
        type_ = widened_type(current.type, theirs.type)
        if type_ is None:
            raise ParquetSchemaError(
                f"{path}: column {name!r} is {theirs.type} but {owner} has it as {current.type}; the files of one "
                "input may differ only by lossless widening (int32 -> int64, float -> double, string -> large_string, "
                "dictionary -> its values, ...): write them with one type, or list only the columns the build reads "
                "in input.columns")
        if not type_.equals(current.type):
            owner = path
        current = pa.field(name, type_, current.nullable or theirs.nullable)
    for path, schema in zip(paths, schemas):
        index = schema.get_field_index(name)
        if index >= 0 and not schema.field(index).type.equals(current.type):
            source = next((other for other, theirs in zip(paths, schemas)
                           if theirs.get_field_index(name) >= 0 and theirs.field(name).type.equals(current.type)), None)
            notes.append(f"{path}: column {name!r} is {schema.field(index).type}, read as {current.type}"
                         f"{f' as in {source}' if source else ''} (lossless widening)")
    return current


def _log_widenings(notes: Sequence[str]) -> None:
    for index, note in enumerate(notes):
        _LOG.log(logging.INFO if index < _LOGGED_WIDENINGS else logging.DEBUG, note)
    if len(notes) > _LOGGED_WIDENINGS:
        _LOG.info("... and %d more lossless widenings (logged at DEBUG)", len(notes) - _LOGGED_WIDENINGS)


# ------------------------------------------------------------------------------------ inspection


@dataclass(frozen=True, eq=False)
class InputSample:
    """The schema of the first input file, and for CSV a sample of its rows (all binary) to infer types from."""

    path: str
    schema: pa.Schema
    sample: pa.RecordBatch | None


def inspect_input(input_config: InputConfig, sample_rows: int = SAMPLE_ROWS,
                  files: Sequence[InputFile] | None = None) -> InputSample:
    """Read the first input file's schema (Parquet: every footer, see parquet_input_schema; CSV: header and sample)."""
    files = list(files) if files is not None else list_inputs(input_config.path)
    path = files[0].path
    if input_config.format == "parquet":
        if input_config.parquet.require_checksums:
            with _open(path) as raw:
                _require_checksums(path, raw, _parquet_file(path, raw).metadata)
        return InputSample(path, parquet_input_schema(files, input_config.columns), None)
    batches, count = [], 0
    with contextlib.closing(read_csv_file(path, input_config.csv)) as sources:
        for source in sources:
            batches.append(source.batch)
            count += source.num_rows
            if count >= sample_rows:
                break
    if not batches:  # a header and no rows (read_csv_file yields nothing): the names are still known
        with _open(path) as raw:
            tracker = _LineTracker(_utf8_chunks(raw, input_config.csv.encoding, True, None))
            names = _read_preamble(tracker, input_config.csv, path, _decoder_for("utf-8")).names
        batches = [_empty_batch(names)]
    table = pa.Table.from_batches(batches).slice(0, sample_rows)
    sample = pa.concat_batches(table.to_batches()) if table.num_rows else _empty_batch(table.schema.names)
    return InputSample(path, table.schema, sample)


def check_inputs_hold_rows(input_config: InputConfig, files: Sequence[InputFile], allow_empty: bool) -> None:
    """Warn (or, when not allow_empty, raise InputError) when no input file holds a single row.

    Files are looked at in order until one holds a row: the first one usually does, so this costs
    one Parquet footer or one CSV block.
    """
    if any(_holds_rows(input_config, item.path) for item in files):
        return
    kind = "only header lines" if input_config.format == "csv" and input_config.csv.header else "no rows"
    message = f"the input files hold no rows ({len(files)} file{'s' if len(files) != 1 else ''}, {kind}: {files[0].path}"
    message += ", ...)" if len(files) > 1 else ")"
    if not allow_empty:
        raise InputError(f"{message}; errors.allow_empty is false, so the build fails")
    _LOG.warning("%s: the dataset will be empty; set errors.allow_empty: false to fail such a build", message)


def _holds_rows(input_config: InputConfig, path: str) -> bool:
    if input_config.format == "parquet":
        with _open(path) as raw:
            return _parquet_file(path, raw).metadata.num_rows > 0
    with contextlib.closing(read_csv_file(path, input_config.csv)) as sources:
        return any(source.num_rows or source.bad_rows for source in sources)


def _empty_batch(names: Sequence[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], pa.binary()) for _ in names], names=list(names))


@dataclass(frozen=True)
class _CsvPiece:
    path: str
    start: int
    end: int
    line_breaks_before: int
    whole: bool


def _counted(sources: Iterable[SourceBatch], counter: ProgressCounter | None,
             bytes_per_row: float | None = None) -> Iterator[SourceBatch]:
    for source in sources:
        if counter is not None:
            rows = source.num_rows + len(source.bad_rows)
            size = len(source.raw) if source.raw is not None else int(rows * (bytes_per_row or 0))
            counter.add(rows, size)
        yield source


def _row_groups_with_row_size(item: tuple[str, int], required: bool) -> list[tuple[str, int, int, float]]:
    """(path, row group, rows before it, file bytes per row) for each row group of a listed Parquet file."""
    path, size = item
    groups, rows = _row_group_listing(path, required)
    per_row = size / rows if rows else 0.0
    return [(path, group, before, per_row) for group, before in groups]


# ------------------------------------------------------------------------------------------- Beam


class ReadTabular(beam.PTransform):
    """Read the inputs of a build as SourceBatch elements (Parquet by row group, CSV by range or whole file).

    columns limits what is read (Parquet projection; CSV columns dropped after parsing); None
    means input_config.columns, and None there means every column. The input files are listed
    when the transform is built (see .inputs, for the manifest). progress_under (a run's local
    staging directory) makes the readers count rows and bytes read there, for the progress display.

    Relative local paths are opened from the directory the transform was built in, since workers
    (a worker pool, a cluster) may run elsewhere; batches and bad rows still name them as given.

    convert_with (feature specs) converts every batch as it is read, on a thread of its own
    (``SourceBatch.converted``): pyarrow's casts run without the GIL while the caller encodes the
    batch before.
    """

    def __init__(self, input_config: InputConfig, columns: Sequence[str] | None = None,
                 inputs: Sequence[InputFile] | None = None, progress_under: str | None = None,
                 convert_with: Sequence[FeatureSpec] | None = None):
        super().__init__()
        self.convert_with = tuple(convert_with) if convert_with is not None else None
        self.input_config = input_config
        self.columns = tuple(columns) if columns is not None else input_config.columns
        self.inputs = list(inputs) if inputs is not None else list_inputs(input_config.path)
        self.progress_dir = progress_dir(progress_under) if progress_under is not None else None
        self.opened_as = {item.path: _openable(item.path) for item in self.inputs}

    def expand(self, pbegin):
        opened = self.opened_as
        files = pbegin | "ListFiles" >> beam.Create([(opened[f.path], f.size) for f in self.inputs], reshuffle=False)
        columns = self.columns
        counts = self.progress_dir
        specs = self.convert_with
        given = {where: path for path, where in opened.items() if where != path}
        if self.input_config.format == "parquet":
            required = self.input_config.parquet.require_checksums
            return (files
                    | "RowGroups" >> beam.FlatMap(_row_groups_with_row_size, required)
                    | "SpreadRowGroups" >> beam.Reshuffle()
                    | "ReadRowGroup" >> beam.FlatMap(lambda item: _converted_ahead(_counted(
                        _as_given(read_parquet_row_group(item[0], item[1], item[2], columns=columns), given),
                        _counter(counts), item[3]), specs))
                    .with_output_types(SourceBatch))
        options = self.input_config.csv
        split_bytes = self.input_config.split_bytes
        return (files
                | "Ranges" >> beam.FlatMap(_ranges_of, split_bytes, options)
                | "SpreadRanges" >> beam.Reshuffle()
                | "ScanRanges" >> beam.Map(_scan_if_split, options)
                | "ByFile" >> beam.GroupByKey()
                | "PlanPieces" >> beam.FlatMap(_plan_pieces)
                | "SpreadPieces" >> beam.Reshuffle()
                | "ReadPiece" >> beam.FlatMap(lambda piece: _converted_ahead(_counted(
                    _as_given(_read_piece(piece, options, columns), given), _counter(counts)), specs))
                .with_output_types(SourceBatch))


def _converted_ahead(sources: Iterator[SourceBatch], specs: Sequence[FeatureSpec] | None) -> Iterator[SourceBatch]:
    """The batches, each with its feature columns (``converted``) when specs are given, converted by a thread ahead."""
    if specs is None:
        return sources

    def convert() -> Generator[SourceBatch, None, None]:
        try:
            for source in sources:
                yield replace(source, converted=convert_source_batch(source, specs))
        finally:
            close = getattr(sources, "close", None)
            if close is not None:
                close()  # the readers' own threads and files, from the thread that read them

    return _ahead(convert(), "tfrbeam-convert") if _PREFETCH_BATCHES else convert()


def _openable(path: str) -> str:
    """A local path that opens from any working directory; other filesystems' paths as they are."""
    return path if FileSystems.get_scheme(path) is not None else os.path.abspath(path)


def _as_given(sources: Iterable[SourceBatch], given: dict[str, str]) -> Iterator[SourceBatch]:
    """The batches, naming their file (and their bad rows') as the listing gave it, not as it was opened."""
    for source in sources:
        shown = given.get(source.path)
        if shown is not None:
            bad_rows = tuple(replace(row, path=shown) if row.path == source.path else row
                             for row in source.bad_rows)
            source = replace(source, path=shown, bad_rows=bad_rows)
        yield source


def _counter(directory: str | None) -> ProgressCounter | None:
    return ProgressCounter(directory) if directory is not None else None


def _ranges_of(item: tuple[str, int], split_bytes: int, options: CsvOptions) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(path, (start, end, number of ranges, data offset)) for each range a file is scanned in."""
    path, size = item
    if size <= split_bytes or _is_compressed(path) or not _splittable_encoding(options.encoding):
        return [(path, (0, size, 1, 0))]
    ranges = csv_ranges(size, split_bytes)
    data_offset = csv_data_offset(path, options)
    return [(path, (start, end, len(ranges), data_offset)) for start, end in ranges]


def _scan_if_split(item, options: CsvOptions) -> tuple[str, RangeScan | None]:
    path, (start, end, count, data_offset) = item
    if count == 1:
        return path, None
    return path, scan_csv_range(path, start, end, options, data_offset)


def _plan_pieces(item) -> list[_CsvPiece]:
    path, scans = item
    scans = [scan for scan in scans if scan is not None]
    if not scans:
        return [_CsvPiece(path, 0, -1, 0, True)]
    scans.sort(key=lambda scan: scan.start)
    if any(scan.has_special for scan in scans):
        _LOG.info("%s: quote or escape characters occur, so it is read whole by one worker", path)
        return [_CsvPiece(path, 0, -1, 0, True)]
    pieces, before = [], 0
    for scan in scans:
        pieces.append(_CsvPiece(path, scan.start, scan.end, before, False))
        before += scan.line_breaks
    return pieces


def _read_piece(piece: _CsvPiece, options: CsvOptions, columns) -> Iterator[SourceBatch]:
    if piece.whole:
        return read_csv_file(piece.path, options, columns)
    return read_csv_range(piece.path, piece.start, piece.end, piece.line_breaks_before, options, columns)
