"""Parquet input: row groups read as SourceBatches (page checksums verified, required on request), and the
schema every file of an input is read as (lossless widening, checked at plan time from the footers).

Parquet is read by row group (one Beam element per row group, column projection) with the
Arrow types of the file.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from collections.abc import Generator, Iterator, Sequence
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.files import InputFile, open_input
from tfrbeam.errors import InputError, ParquetSchemaError

__all__ = [
    "parquet_columns_without_checksums",
    "joined_schema",
    "parquet_file",
    "parquet_input_schema",
    "parquet_row_groups",
    "read_parquet_file",
    "read_parquet_row_group",
    "refuse_missing_checksums",
    "row_group_listing",
    "widened_type",
]

_LOG = logging.getLogger(__name__)

# Small enough that all but a row group's first batch decode while the caller converts the one
# before (see ahead.read_ahead): 16384 built the 1M-row benchmark ~5 % faster than 65536, and peaked lower.
_PARQUET_BATCH_ROWS = 16384


def parquet_file(path: str, raw: BinaryIO) -> pq.ParquetFile:
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
    return row_group_listing(path, require_checksums)[0]


def row_group_listing(path: str, require_checksums: bool) -> tuple[list[tuple[int, int]], int]:
    """parquet_row_groups, and the file's number of rows."""
    with open_input(path) as raw:
        metadata = parquet_file(path, raw).metadata
        if require_checksums:
            refuse_missing_checksums(path, raw, metadata)
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
    with open_input(path) as raw:
        return _chunks_without_checksums(raw, parquet_file(path, raw).metadata)


def refuse_missing_checksums(path: str, raw: BinaryIO, metadata: pq.FileMetaData) -> None:
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
    return read_ahead(batches, "tfrbeam-parquet-read")


def _parquet_row_group_batches(path: str, group: int, rows_before: int,
                               columns: Sequence[str] | None) -> Generator[SourceBatch, None, None]:
    with open_input(path) as raw:
        parquet = parquet_file(path, raw)
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


def parquet_input_schema(files: Sequence[InputFile], columns: Sequence[str] | None = None,
                         require_checksums: bool = False) -> pa.Schema:
    """The schema all files of a Parquet input are read as: the first file's, with columns widened where files differ.

    Reads only the footers. Checks the given ``columns`` (default: every column of the first
    file): a file that repeats a column name, a type that only a lossy conversion joins with
    another file's (``widened_type``), or a listed column a later file lacks raises
    ParquetSchemaError naming both files, the column and both types. Each widening is logged.
    require_checksums: the first file's pages must carry CRCs (refuse_missing_checksums), checked as its
    footer is read.
    """
    paths = [item.path for item in files]
    return joined_schema(paths, _footer_schemas(paths, require_checksums), columns)


def joined_schema(paths: Sequence[str], schemas: Sequence[pa.Schema], columns: Sequence[str] | None = None,
                  kind: str = "Parquet") -> pa.Schema:
    """The schema files of one typed input (``kind``: Parquet, ORC) are read as, from each file's schema; see
    parquet_input_schema for the rules and the errors."""
    for path, schema in zip(paths, schemas):
        _refuse_repeated_names(path, schema)
    first = schemas[0]
    names = [name for name in dict.fromkeys(columns if columns is not None else first.names) if name in first.names]
    notes: list[str] = []
    widened = first
    for name in names:
        field_ = _widened_field(name, paths, schemas, columns is not None, notes, kind)
        widened = widened.set(widened.get_field_index(name), field_)
    _log_widenings(notes)
    return widened


def _footer_schemas(paths: Sequence[str], require_checksums: bool) -> list[pa.Schema]:
    checks = [require_checksums] + [False] * (len(paths) - 1)
    if len(paths) == 1:
        return [_footer_schema(paths[0], checks[0])]
    with concurrent.futures.ThreadPoolExecutor(min(_FOOTER_THREADS, len(paths)), "tfrbeam-footer") as pool:
        return list(pool.map(_footer_schema, paths, checks))


def _footer_schema(path: str, require_checksums: bool = False) -> pa.Schema:
    with open_input(path) as raw:
        parquet = parquet_file(path, raw)
        if require_checksums:
            refuse_missing_checksums(path, raw, parquet.metadata)
        return parquet.schema_arrow


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
                   notes: list[str], kind: str) -> pa.Field:
    """Column ``name`` widened over every file; appends a note per file read as a wider type than its own."""
    current, owner = schemas[0].field(name), paths[0]
    for path, schema in zip(paths[1:], schemas[1:]):
        index = schema.get_field_index(name)
        if index < 0:
            if listed:
                raise ParquetSchemaError(f"{path}: has no column {name!r} ({owner} has it as {current.type}); "
                                         f"every file of a {kind} input must hold the columns of input.columns")
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
