"""ORC input: stripes read as SourceBatches by pyarrow.orc (one Beam element per stripe, as Parquet row groups).

Each stripe's row count comes from the file's footer, as pyarrow's reader holds it decompressed
(``serialized_file_tail``, a protobuf FileTail read here field by field), so a stripe's rows are
numbered in the file without reading the stripes before it. A footer that cannot be read so
makes the file one element, its stripes read in order. Every file of an input is read with the
first file's schema (orc_input_schema: the same lossless widening as Parquet, from the footers).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Generator, Iterator, Sequence
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.orc as porc

from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.files import InputFile, open_input
from tfrbeam.builder.inputs.parquet import joined_schema
from tfrbeam.builder.inputs.varints import read_varint
from tfrbeam.errors import InputError

__all__ = [
    "orc_file",
    "orc_file_rows",
    "orc_input_schema",
    "read_orc_file",
    "read_orc_stripes",
    "stripe_listing",
    "stripe_listing_and_rows",
]

_FOOTER_THREADS = 16  # footers are read in parallel: on an object store each one is a round trip
_ORC_BATCH_ROWS = 16384  # as parquet._PARQUET_BATCH_ROWS: a stripe is handed on in slices of this many rows


def orc_file(path: str, raw: BinaryIO) -> porc.ORCFile:
    try:
        return porc.ORCFile(raw)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... on malformed files
        raise InputError(f"{path}: not a readable ORC file: {error}") from error


def orc_input_schema(files: Sequence[InputFile], columns: Sequence[str] | None = None) -> pa.Schema:
    """The schema all files of an ORC input are read as: their footers' schemas joined by lossless widening, as
    Parquet's (parquet.parquet_input_schema)."""
    with concurrent.futures.ThreadPoolExecutor(min(_FOOTER_THREADS, len(files)), "tfrbeam-footer") as pool:
        schemas = list(pool.map(_orc_schema, [item.path for item in files]))
    return joined_schema([item.path for item in files], schemas, columns, kind="ORC")


def _orc_schema(path: str) -> pa.Schema:
    with open_input(path) as raw:
        return orc_file(path, raw).schema


def orc_file_rows(path: str) -> int:
    with open_input(path) as raw:
        return orc_file(path, raw).nrows


def stripe_listing(path: str) -> list[tuple[int, int, int]]:
    """(first stripe, number of stripes, rows before the first) of each element a file is read in: one per stripe."""
    return stripe_listing_and_rows(path)[0]


def stripe_listing_and_rows(path: str) -> tuple[list[tuple[int, int, int]], int]:
    """stripe_listing, and the file's number of rows."""
    with open_input(path) as raw:
        orc = orc_file(path, raw)
        rows = _stripe_rows(orc)
    return _listing(orc, rows), orc.nrows


def _listing(orc: porc.ORCFile, rows: list[int] | None) -> list[tuple[int, int, int]]:
    if rows is None:
        return [(0, orc.nstripes, 0)] if orc.nstripes else []
    before = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64).tolist()
    return [(stripe, 1, before[stripe]) for stripe in range(len(rows))]


def _stripe_rows(orc: porc.ORCFile) -> list[int] | None:
    """Each stripe's numberOfRows from the footer (FileTail field 2, its field 3 per stripe, field 5), or None."""
    try:
        tail = orc.reader.serialized_file_tail()
        footer = next(value for number, value in _fields(tail) if number == 2 and isinstance(value, bytes))
        rows = [next((value for number, value in _fields(stripe) if number == 5), 0)
                for number, stripe in _fields(footer) if number == 3 and isinstance(stripe, bytes)]
    except (AttributeError, StopIteration, IndexError, TypeError, ValueError):
        return None
    if len(rows) != orc.nstripes or sum(rows) != orc.nrows:  # type: ignore[arg-type]
        return None
    return rows  # type: ignore[return-value]


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: varints as ints, length-delimited fields as bytes."""
    position = 0
    while position < len(message):
        key, position = read_varint(message, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = read_varint(message, position)
            yield number, value
        elif wire == 2:
            size, position = read_varint(message, position)
            yield number, message[position:position + size]
            position += size
        elif wire in (1, 5):
            position += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire}")


def read_orc_stripes(path: str, first: int, count: int, rows_before: int,
                     columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """The rows of stripes first..first+count-1 as batches (the file's own types, as Parquet's are read); lines are
    1-based row numbers in the file."""
    return read_ahead(_stripe_batches(path, first, count, rows_before, columns), "tfrbeam-orc-read")


def _stripe_batches(path: str, first: int, count: int, rows_before: int,
                    columns: Sequence[str] | None) -> Generator[SourceBatch, None, None]:
    row = rows_before + 1
    with open_input(path) as raw:
        orc = orc_file(path, raw)
        names = list(dict.fromkeys(columns)) if columns is not None else orc.schema.names
        missing = [name for name in names if name not in orc.schema.names]
        if missing:
            raise InputError(f"{path}: has no column {', '.join(map(repr, missing))} "
                             f"(columns: {', '.join(orc.schema.names)})")
        for stripe in range(first, first + count):
            try:
                read = orc.read_stripe(stripe, columns=names)
            except Exception as error:  # pyarrow raises OSError, ArrowInvalid, ... on damaged stripes
                raise InputError(f"{path}: cannot read stripe {stripe} (rows {row} on): {error}") from error
            table = pa.Table.from_batches([read]) if isinstance(read, pa.RecordBatch) else read
            table = table.select(names)
            for batch in table.to_batches(max_chunksize=_ORC_BATCH_ROWS):
                yield SourceBatch(path=path, lines=np.arange(row, row + batch.num_rows, dtype=np.int64), batch=batch)
                row += batch.num_rows


def read_orc_file(path: str, columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """Every row of an ORC file, stripe by stripe."""
    for first, count, before in stripe_listing(path):
        yield from read_orc_stripes(path, first, count, before, columns)
