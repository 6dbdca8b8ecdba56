"""JSON lines input: one JSON object per line, parsed by pyarrow's JSON reader in blocks of whole lines.

A file larger than input.split_bytes (uncompressed) is read in byte ranges in parallel: a JSON
value holds no raw line break, so every \\n ends a row and each range owns the lines that start in
it, numbered from the line breaks counted in the ranges before (count_line_breaks).

Every file of an input is read with one schema, inferred by pyarrow from the first file's first
lines (jsonl_schema), so a field's type never changes between blocks, files or workers. A line
that is not a JSON object, or whose values do not fit that schema, is a bad row naming the file
and its line (found by parsing parts of the failing block until each bad line stands alone; the
other blocks are parsed whole). Blank lines are not rows. Lines are counted by \\n (JSON text holds no raw line
break inside a value). Compressed files are decompressed and checked to their end (files.open_input).

A line is at most input.jsonl.max_row_bytes long (64 MiB by default, as CSV's rows): a longer one is
measured by reading on to its end, holding one read at a time, and becomes a bad row naming its
line, byte offset and the cap (LongLine); the lines after it are read on. Lines are assembled from
a list of reads joined once, so a long line costs linear time.
"""

from __future__ import annotations

import collections
import io
import json
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson

from tfrbeam.builder.config.schema import DEFAULT_MAX_ROW_BYTES
from tfrbeam.builder.features.convert import BadRow
from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch, strip_line_break
from tfrbeam.builder.inputs.csv_text import LONG_ROW_RAW_BYTES
from tfrbeam.builder.inputs.files import is_compressed, open_input
from tfrbeam.errors import InputError

__all__ = [
    "LongLine",
    "count_line_breaks",
    "jsonl_holds_lines",
    "jsonl_schema",
    "parse_jsonl_block",
    "read_jsonl_file",
    "read_jsonl_range",
]

_BLOCK_BYTES = 4 << 20  # whole lines parsed per pyarrow call (a longer line makes a longer block)
_SCHEMA_SAMPLE_LINES = 10_000  # the lines the schema is inferred from (as many as inputs.sample.SAMPLE_ROWS)
_WHITESPACE = b" \t\r\n"
_FANOUT = 16  # parts a run of lines holding a bad one is parsed in, until each bad line stands alone
_VOTE_LINES = 256  # lines parsed together while settling a type the first lines disagree on


def jsonl_schema(paths: Sequence[str], sample_lines: int = _SCHEMA_SAMPLE_LINES, sampled_nulls: bool = False,
                 max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> pa.Schema:
    """The schema every file of a JSON lines input is read as: pyarrow's inference on the first lines of the first
    file (in path order) that holds any.

    Malformed lines of the sample are left out (the build reports them as bad rows); where lines
    disagree on a field's type, the type most of them give it wins (_most_common_types) and the
    others are bad rows; fields whose sampled values are all null are read as null (no feature can
    be inferred from them). Every field is nullable (a line may leave it out); with sampled_nulls,
    only those null or missing in some sampled line are, as CSV's inference decides on_null. Lines over
    max_row_bytes are left out of the sample (they are bad rows).
    """
    data = b""
    for path in paths:
        data = _sample_text(path, sample_lines, max_row_bytes)
        if data.strip(_WHITESPACE):
            break
    if not data:
        return pa.schema([])
    starts, ends = _line_bounds(data)
    lines = [data[start:end] for start, end in zip(starts[:sample_lines].tolist(), ends[:sample_lines].tolist())]
    good = [line for line in lines if line.strip(_WHITESPACE) and _object_problem(line) is None]
    try:
        table = _parse(b"\n".join(good), None)
    except pa.ArrowInvalid:  # lines disagree on a field's type: each field takes the type most lines give it
        return _most_common_types(good)
    if not sampled_nulls:
        return table.schema
    return pa.schema([field_.with_nullable(column.null_count > 0) for field_, column in zip(table.schema, table.columns)])


def _sample_text(path: str, sample_lines: int, max_row_bytes: int) -> bytes:
    """The first blocks of a file's lines holding at least sample_lines lines (or all of them), long lines left out."""
    blocks, breaks = [], 0
    with open_input(path) as raw:
        for block, _ in _line_blocks(raw, max_row_bytes):
            if isinstance(block, LongLine):
                continue
            blocks.append(block if block.endswith(b"\n") else block + b"\n")
            breaks += block.count(b"\n")
            if breaks >= sample_lines:
                break
    return b"".join(blocks)


def _most_common_types(lines: Sequence[bytes]) -> pa.Schema:
    """Each field (in the order first seen) with the type most of the lines give it (ties: the first seen); integers
    and floats together are double, as pyarrow infers them in one block. The other lines become bad rows.

    Lines are parsed in groups of _VOTE_LINES, a group's types counting once per line; only the
    lines of a group that does not parse (it holds a conflict) are parsed one by one.
    """
    votes: dict[str, list[pa.DataType]] = {}
    for first in range(0, len(lines), _VOTE_LINES):
        group = lines[first:first + _VOTE_LINES]
        try:
            schemas = [(_parse(b"\n".join(group), None).schema, len(group))]
        except pa.ArrowInvalid:  # a bad line in the group: vote with the schemas of the lines that parse alone
            schemas = [(schema, 1) for schema in map(_schema_or_none, group) if schema is not None]
        for schema, weight in schemas:
            for field_ in schema:
                votes.setdefault(field_.name, [])
                if not pa.types.is_null(field_.type):
                    votes[field_.name] += [field_.type] * weight
    fields = []
    for name, types in votes.items():
        if types and all(type_ in (pa.int64(), pa.float64()) for type_ in types):
            type_ = pa.float64() if pa.float64() in types else pa.int64()
        else:
            counts = collections.Counter(types)
            type_ = max(counts, key=lambda each: (counts[each], -types.index(each))) if types else pa.null()
        fields.append(pa.field(name, type_))
    return pa.schema(fields)


def _schema_or_none(line: bytes) -> pa.Schema | None:
    try:
        return _parse(line, None).schema
    except pa.ArrowInvalid:
        return None


def jsonl_holds_lines(path: str, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> bool:
    """Whether a JSON lines file holds a line that is not blank (a row, or a bad row)."""
    with open_input(path) as raw:
        return any(isinstance(block, LongLine) or block.strip(_WHITESPACE)
                   for block, _ in _line_blocks(raw, max_row_bytes))


def read_jsonl_file(path: str, schema: pa.Schema, columns: Sequence[str] | None = None, *,
                    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[SourceBatch]:
    """Every row of a JSON lines file as batches of the given schema (projected to columns); lines are 1-based.
    A line over max_row_bytes is a bad row."""
    projected = _projected(schema, columns, path)
    return read_ahead(_jsonl_batches(path, projected, max_row_bytes), "tfrbeam-jsonl-read")


def _jsonl_batches(path: str, schema: pa.Schema, max_row_bytes: int) -> Generator[SourceBatch, None, None]:
    with open_input(path) as raw:
        for block, first_line in _line_blocks(raw, max_row_bytes):
            yield _block_batch(path, block, first_line, schema, max_row_bytes)


def _block_batch(path: str, block: bytes | LongLine, first_line: int, schema: pa.Schema,
                 max_row_bytes: int) -> SourceBatch:
    """A block's rows, or a line over max_row_bytes as a batch of no rows and its bad row."""
    if not isinstance(block, LongLine):
        return parse_jsonl_block(path, block, first_line, schema)
    where = f"byte {block.offset}" + (" of the decompressed text" if is_compressed(path) else "")
    reason = f"line longer than input.jsonl.max_row_bytes={max_row_bytes} ({block.size} bytes from {where}); " \
             "raise it to read it"
    head = block.head.decode("utf-8", "replace")
    return SourceBatch(path=path, lines=np.zeros(0, np.int64), batch=_one_batch(schema.empty_table(), schema),
                       bad_rows=(BadRow(path, first_line, reason, head),), records=1)


def count_line_breaks(path: str, start: int, end: int) -> int:
    """The \\n bytes in [start, end) of an (uncompressed) file: what numbers the lines of the ranges after it."""
    breaks = 0
    with open_input(path) as raw:
        raw.seek(start)
        left = end - start
        while left > 0:
            data = raw.read(min(_BLOCK_BYTES, left))
            if not data:
                break
            breaks += data.count(b"\n")
            left -= len(data)
    return breaks


def read_jsonl_range(path: str, start: int, end: int, line_breaks_before: int, schema: pa.Schema,
                     columns: Sequence[str] | None = None, *,
                     max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[SourceBatch]:
    """The rows of the lines that start in bytes [start, end) of an uncompressed file; line_breaks_before (the \\n
    bytes before start, see count_line_breaks) numbers them. A line over max_row_bytes is a bad row."""
    projected = _projected(schema, columns, path)
    return read_ahead(_range_batches(path, start, end, line_breaks_before, projected, max_row_bytes),
                      "tfrbeam-jsonl-read")


def _range_batches(path: str, start: int, end: int, line_breaks_before: int,
                   schema: pa.Schema, max_row_bytes: int) -> Generator[SourceBatch, None, None]:
    with open_input(path) as raw:
        own_start, own_end = _line_start_at(raw, start), _line_start_at(raw, end)
        if own_start >= own_end:
            return
        raw.seek(own_start)
        first_line = 1 + line_breaks_before + (1 if own_start > start else 0)
        for block, line in _line_blocks(raw, max_row_bytes, own_end - own_start, first_line, own_start):
            yield _block_batch(path, block, line, schema, max_row_bytes)


def _line_start_at(raw, position: int) -> int:
    """The first line start at or after position: just after the first \\n at position - 1 or later (or the end)."""
    if position == 0:
        return 0
    raw.seek(position - 1)
    offset = position - 1
    while True:
        data = raw.read(1 << 16)
        if not data:
            return offset
        found = data.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(data)


def _projected(schema: pa.Schema, columns: Sequence[str] | None, path: str) -> pa.Schema:
    if columns is None:
        return schema
    missing = [name for name in columns if name not in schema.names]
    if missing:
        raise InputError(f"{path}: has no field {', '.join(map(repr, missing))} (fields: {', '.join(schema.names)})")
    return pa.schema([schema.field(name) for name in dict.fromkeys(columns)])


@dataclass(frozen=True)
class LongLine:
    """A line longer than max_row_bytes, read past: its first bytes (its bad row's raw text), its size in bytes
    (without the \\n) and the offset it starts at in the (decompressed) file."""

    head: bytes
    size: int
    offset: int


class _Reads:
    """A file's reads of at most size bytes (up to limit in all, None: to its end), with a read handed back."""

    def __init__(self, raw, size: int, limit: int | None):
        self._raw, self._size, self._limit = raw, size, limit
        self._back = b""

    def __iter__(self) -> _Reads:
        return self

    def __next__(self) -> bytes:
        if self._back:
            data, self._back = self._back, b""
            return data
        data = self._raw.read(self._size if self._limit is None else min(self._size, self._limit))
        if not data:
            raise StopIteration
        if self._limit is not None:
            self._limit -= len(data)
        return data

    def hand_back(self, data: bytes) -> None:
        self._back = data


def _line_blocks(raw, max_row_bytes: int, limit: int | None = None, line: int = 1,
                 offset: int = 0) -> Iterator[tuple[bytes | LongLine, int]]:
    """(block of whole lines, 1-based line it starts on) of a file from where it is (offset, up to limit bytes),
    about _BLOCK_BYTES each; the last may lack its \\n. A line over max_row_bytes comes as a LongLine instead.

    Reads are at most max_row_bytes, so a line over it spans reads: the part of a line held across reads is
    checked before each read is added to it, and never holds more than max_row_bytes.
    """
    reads = _Reads(raw, min(_BLOCK_BYTES, max_row_bytes), limit)
    pieces: list[bytes] = []  # the start of the line no \\n has ended yet, one piece per read
    held = 0
    for data in reads:
        first_break = data.find(b"\n")
        if held + (len(data) if first_break < 0 else first_break) > max_row_bytes:
            long_line = _read_past(pieces, data, reads, offset)
            yield long_line, line
            line, offset = line + 1, offset + long_line.size + 1
            pieces, held = [], 0
        elif first_break < 0:  # no line ends in it yet: read on
            pieces.append(data)
            held += len(data)
        else:
            cut = data.rfind(b"\n") + 1
            block = b"".join([*pieces, data[:cut]]) if pieces or cut < len(data) else data
            yield block, line
            line, offset = line + block.count(b"\n"), offset + len(block)
            rest = data[cut:]
            pieces, held = ([rest], len(rest)) if rest else ([], 0)
    if pieces:
        yield b"".join(pieces), line


def _read_past(pieces: list[bytes], data: bytes, reads: _Reads, offset: int) -> LongLine:
    """The line held in pieces and going on in data, read to its \\n (handing back what follows it) or the end;
    only its first LONG_ROW_RAW_BYTES are kept."""
    head, size = b"", 0
    for piece in pieces:
        head += piece[:max(0, LONG_ROW_RAW_BYTES - len(head))]
        size += len(piece)
    while True:
        found = data.find(b"\n")
        end = len(data) if found < 0 else found
        head += data[:min(end, max(0, LONG_ROW_RAW_BYTES - len(head)))]
        size += end
        if found >= 0:
            reads.hand_back(data[found + 1:])
            return LongLine(head, size, offset)
        data = next(reads, b"")
        if not data:
            return LongLine(head, size, offset)


def _line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The start and end (without its \\n) of each line of a block."""
    breaks = np.flatnonzero(np.frombuffer(data, np.uint8) == 0x0A)
    starts = np.concatenate([[0], breaks + 1]).astype(np.int64)
    ends = breaks.astype(np.int64)
    if len(data) and data[-1:] != b"\n":
        ends = np.concatenate([ends, [len(data)]]).astype(np.int64)
    return starts[:len(ends)], ends


def _first_bytes(data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Each line's first byte that is not whitespace (0 for a blank line); only lines starting with whitespace are
    looked at one by one."""
    view = np.frombuffer(data, np.uint8)
    first = np.zeros(len(starts), np.uint8)
    filled = ends > starts
    first[filled] = view[starts[filled]]
    for line in np.flatnonzero(np.isin(first, list(_WHITESPACE))).tolist():
        stripped = data[starts[line]:ends[line]].lstrip(_WHITESPACE)
        first[line] = stripped[0] if stripped else 0
    return first


def parse_jsonl_block(path: str, data: bytes, first_line: int, schema: pa.Schema) -> SourceBatch:
    """The rows of a block of whole lines starting on first_line, with the lines that do not parse as bad rows.

    Only lines starting with ``{`` reach pyarrow: it reads a ``null`` line as a row of nulls (and
    crashes on one that comes first), so other lines are bad rows before it parses.
    """
    starts, ends = _line_bounds(data)
    first = _first_bytes(data, starts, ends)
    rows = np.flatnonzero(first)
    line_starts = np.concatenate([starts, [len(data)]]).astype(np.int64)
    if (first[rows] == ord("{")).all():
        try:
            table = _parse(data, schema)
            if table.num_rows == len(rows):
                return SourceBatch(path=path, lines=rows + first_line, batch=_one_batch(table, schema), raw=data,
                                   raw_first_line=first_line, raw_line_starts=line_starts,
                                   spans=np.ones(len(rows), np.int64), records=len(rows))
        except pa.ArrowInvalid:  # a bad line in the block: fall through to the bisection below, which names it
            pass
    texts = {row: data[starts[row]:ends[row]] for row in rows.tolist()}
    problems = {row: _object_problem(texts[row]) or "not a JSON object" for row in rows[first[rows] != ord("{")].tolist()}
    problems.update(_misfits([row for row in texts if row not in problems], texts, schema))
    good = [row for row in texts if row not in problems]
    bad_rows = tuple(BadRow(path, row + first_line, problems[row], strip_line_break(texts[row]).decode("utf-8", "replace"))
                     for row in sorted(problems))
    table = _parse(b"\n".join(texts[row] for row in good), schema) if good else schema.empty_table()
    return SourceBatch(path=path, lines=np.array(good, np.int64) + first_line, batch=_one_batch(table, schema),
                       bad_rows=bad_rows, raw=data, raw_first_line=first_line, raw_line_starts=line_starts,
                       spans=np.ones(len(good), np.int64), records=len(rows))


def _misfits(rows: list[int], texts: dict[int, bytes], schema: pa.Schema) -> dict[int, str]:
    """The lines that are not one row of the schema each, and why: parts (_FANOUT of them) of a failing run are
    parsed until each failing line stands alone, so a block with a few bad lines costs about two parses of it, not
    one per line."""
    if not rows:
        return {}
    error: pa.ArrowInvalid | None = None
    try:
        if _parse(b"\n".join(texts[row] for row in rows), schema).num_rows == len(rows):
            return {}
    except pa.ArrowInvalid as raised:
        error = raised
    if len(rows) == 1:
        problem = _object_problem(texts[rows[0]])
        if problem is None:
            problem = ("does not fit the schema read from the input's first file: "
                       + (_pyarrow_reason(error) if error is not None else "it holds more than one row"))
        return {rows[0]: problem}
    step = -(-len(rows) // _FANOUT)
    found: dict[int, str] = {}
    for first in range(0, len(rows), step):
        found.update(_misfits(rows[first:first + step], texts, schema))
    return found


def _parse(data: bytes, schema: pa.Schema | None) -> pa.Table:
    read = pjson.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1 << 20))
    if schema is None:
        return pjson.read_json(io.BytesIO(data), read_options=read)
    parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pjson.read_json(io.BytesIO(data), read_options=read, parse_options=parse)


def _one_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    batches = table.select(schema.names).to_batches()
    return pa.concat_batches(batches) if batches else pa.RecordBatch.from_pylist([], schema=schema)


def _object_problem(text: bytes) -> str | None:
    """Why a non-blank line is not a JSON object, or None."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return f"not valid JSON: {error}"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__ if value is not None else 'null'}, not an object (one object per line)"
    return None


def _pyarrow_reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = text.removeprefix("JSON parse error: ").rsplit(" in row ", 1)[0]
    return re.sub(r"Column\(/([^)]*)\)", lambda match: f"field {match.group(1).replace('/', '.')!r}", text)
