"""Avro input (fastavro, the optional extra ``tfrbeam[avro]``): object container files read as SourceBatches.

A file larger than input.split_bytes (and not compressed) is split at its sync blocks: its block
headers (record count and size, each block followed by the file's 16-byte sync marker, checked)
are walked without decoding, and runs of consecutive blocks of about split_bytes are read by
workers of their own, each record numbered in its file. Every file is read with the first file's
Avro schema as the reader schema, so fastavro resolves what later files wrote (int -> long,
float -> double, ...) or fails naming the file. Records become Arrow rows of the schema
arrow_schema maps the Avro schema to.
"""

from __future__ import annotations

import concurrent.futures
import importlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from tfrbeam.builder.config.schema import AVRO_INSTALL_HINT
from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.files import InputFile, is_compressed, open_input
from tfrbeam.builder.inputs.parquet import joined_schema
from tfrbeam.builder.inputs.varints import read_zigzag
from tfrbeam.errors import ConfigError, InputError, ParquetSchemaError

__all__ = [
    "arrow_schema",
    "avro_blocks",
    "avro_file_holds_records",
    "avro_input_schema",
    "avro_schema",
    "fastavro_module",
    "read_avro_blocks",
    "read_avro_file",
]

_HEADER_THREADS = 16  # headers are read in parallel at plan time: on an object store each one is a round trip
_BATCH_RECORDS = 16384  # records handed on per batch (a block may hold more or fewer)
_SYNC_BYTES = 16
_HEADER_PROBE_BYTES = 20  # a block's record count and size: two zigzag varints of at most 10 bytes


def fastavro_module() -> Any:
    """fastavro, or a ConfigError saying how to install it."""
    try:
        return importlib.import_module("fastavro")
    except ImportError as error:
        raise ConfigError(f"input.format: {AVRO_INSTALL_HINT}") from error


def avro_input_schema(files: Sequence[InputFile], columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema an Avro input is read as: the first file's, every file's header checked against it.

    Every file is read with the first file's schema as the reader schema, so a later file may hold
    a column in a narrower type fastavro promotes (int in a file read as long) but not a wider or
    other one: that (or a file whose schema joins the first's only lossily, see
    parquet.joined_schema) fails here, before anything runs, naming both files and the column.
    """
    paths = [item.path for item in files]
    with concurrent.futures.ThreadPoolExecutor(min(_HEADER_THREADS, len(paths)), "tfrbeam-avro-header") as pool:
        schemas = list(pool.map(lambda path: arrow_schema(avro_schema(path), path), paths))
    joined = joined_schema(paths, schemas, columns, kind="Avro")
    first = schemas[0]
    for name in columns if columns is not None else first.names:
        if name in first.names and not joined.field(name).type.equals(first.field(name).type):
            wider = next(path for path, schema in zip(paths, schemas)
                         if name in schema.names and schema.field(name).type.equals(joined.field(name).type))
            raise ParquetSchemaError(
                f"{wider}: field {name!r} is {joined.field(name).type} but {paths[0]} has it as {first.field(name).type}; "
                "every file of an Avro input is read with the first file's schema (in path order), which must be the "
                "widest: rename the files so that one comes first, or write them with one schema")
    return first


def avro_schema(path: str) -> dict | str | list:
    """The writer schema of an Avro file (fastavro's parsed form), read from its header."""
    fastavro = fastavro_module()
    with open_input(path) as raw:
        try:
            return fastavro.block_reader(raw).writer_schema
        except Exception as error:  # fastavro raises ValueError, SchemaParseException, ... on other files
            raise InputError(f"{path}: not a readable Avro file: {error}") from error


_PRIMITIVES = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
_LOGICAL = {"timestamp-millis": pa.timestamp("ms", "UTC"), "timestamp-micros": pa.timestamp("us", "UTC"),
            "local-timestamp-millis": pa.timestamp("ms"), "local-timestamp-micros": pa.timestamp("us"),
            "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"), "uuid": pa.string()}


def arrow_schema(schema: Any, path: str) -> pa.Schema:
    """The Arrow schema of a record schema's fields: Avro types as their Arrow equal, [null, X] unions as nullable X."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise InputError(f"{path}: the Avro schema is not a record ({_shown(schema)}); each row must be a record")
    named: dict[str, Any] = {}
    _collect_named(schema, named)
    return pa.schema([_AvroTypes(path, named).field(field_["name"], field_["type"]) for field_ in schema["fields"]])


def _collect_named(avro: Any, named: dict[str, Any]) -> None:
    """Every named type (record, enum, fixed) a schema defines, by the full name fastavro's parsed schema uses."""
    if isinstance(avro, list):
        for kind in avro:
            _collect_named(kind, named)
    elif isinstance(avro, dict):
        if avro.get("type") in ("record", "enum", "fixed") and "name" in avro:
            named[avro["name"]] = avro
        for field_ in avro.get("fields", ()) if avro.get("type") == "record" else ():
            _collect_named(field_["type"], named)
        for key in ("items", "values"):
            if key in avro:
                _collect_named(avro[key], named)


class _AvroTypes:
    """Avro types to Arrow types for one file's schema, named types looked up (a type that holds itself refused)."""

    def __init__(self, path: str, named: dict[str, Any]):
        self.path, self.named = path, named
        self.open: set[str] = set()  # the records being mapped, to refuse one that holds itself

    def field(self, name: str, avro: Any) -> pa.Field:
        if isinstance(avro, list):
            kinds = [kind for kind in avro if kind != "null"]
            if len(kinds) != 1:
                raise InputError(f"{self.path}: field {name!r} is an Avro union of {_shown(avro)}; only a union of one "
                                 "type and null can be read (a column has one type)")
            return pa.field(name, self.type(kinds[0], name), nullable=True)
        return pa.field(name, self.type(avro, name), nullable=avro == "null")

    def type(self, avro: Any, name: str) -> pa.DataType:
        if isinstance(avro, str):
            return self._named(avro, name)
        if isinstance(avro, list):
            return self.field(name, avro).type
        logical, kind = avro.get("logicalType"), avro.get("type")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            return pa.decimal128(int(avro["precision"]), int(avro.get("scale", 0)))
        if logical in _LOGICAL:
            return _LOGICAL[logical]
        if kind == "record":
            self.open.add(avro.get("name"))
            fields = [self.field(field_["name"], field_["type"]) for field_ in avro["fields"]]
            self.open.discard(avro.get("name"))
            return pa.struct(fields)
        if kind == "array":
            return pa.list_(self.field("item", avro["items"]))
        if kind == "map":
            return pa.map_(pa.string(), self.type(avro["values"], name))
        if kind in ("enum", "fixed"):
            return pa.string() if kind == "enum" else pa.binary()
        return self.type(kind, name)

    def _named(self, avro: str, name: str) -> pa.DataType:
        if avro in _PRIMITIVES:
            return _PRIMITIVES[avro]
        if avro in self.open:
            raise InputError(f"{self.path}: field {name!r} is of the Avro record {avro!r} that holds itself; a "
                             "recursive type has no Arrow column")
        if avro in self.named:
            return self.type(self.named[avro], name)
        raise InputError(f"{self.path}: field {name!r} has the Avro type {avro!r}, which cannot be read")


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "..."


def avro_blocks(path: str, size: int, split_bytes: int) -> tuple[list[tuple[int, int, int]], int]:
    """(first block's offset, number of blocks, records before) of each piece a file is read in, and its records.

    The block headers are walked without decoding (each block's end checked against the sync
    marker): a file up to split_bytes, or compressed, is one piece; a larger one is cut at its
    sync blocks into pieces of about split_bytes.
    """
    fastavro = fastavro_module()
    with open_input(path) as raw:
        try:
            fastavro.block_reader(raw)
        except Exception as error:
            raise InputError(f"{path}: not a readable Avro file: {error}") from error
        first = raw.tell()
        raw.seek(first - _SYNC_BYTES)
        sync = raw.read(_SYNC_BYTES)
        pieces: list[tuple[int, int, int]] = []
        offset, records, piece_start, piece_blocks, piece_records = first, 0, first, 0, 0
        whole = size <= split_bytes or is_compressed(path)
        while True:
            header = _block_header(raw, offset, path)
            if header is None:
                break
            count, length, header_bytes = header
            raw.seek(offset + header_bytes + length)
            if raw.read(_SYNC_BYTES) != sync:
                raise InputError(f"{path}: the Avro block at byte {offset} does not end in the file's sync marker "
                                 "(the file is cut short or damaged)")
            piece_blocks += 1
            records += count
            offset += header_bytes + length + _SYNC_BYTES
            if not whole and offset - piece_start >= split_bytes:
                pieces.append((piece_start, piece_blocks, piece_records))
                piece_start, piece_blocks, piece_records = offset, 0, records
        if piece_blocks:
            pieces.append((piece_start, piece_blocks, piece_records))
        return pieces, records


def _block_header(raw: BinaryIO, offset: int, path: str) -> tuple[int, int, int] | None:
    """(record count, byte size, header length) of the block at offset; None at the end of the file."""
    raw.seek(offset)
    probe = raw.read(_HEADER_PROBE_BYTES)
    if not probe:
        return None
    try:
        count, position = read_zigzag(probe, 0)
        length, position = read_zigzag(probe, position)
    except IndexError as error:
        raise InputError(f"{path}: the Avro block at byte {offset} is cut short; the file is damaged") from error
    except ValueError as error:
        raise InputError(f"{path}: the Avro block at byte {offset}: {error}") from error
    if count < 0 or length < 0:
        raise InputError(f"{path}: the Avro block at byte {offset} has a negative count or size; the file is damaged")
    return count, length, position


def read_avro_blocks(path: str, offset: int, blocks: int, records_before: int, reader_schema: Any,
                     schema: pa.Schema, columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """The records of `blocks` blocks (-1: all) from the one at offset, as batches; lines are 1-based record numbers."""
    names = list(dict.fromkeys(columns)) if columns is not None else schema.names
    missing = [name for name in names if name not in schema.names]
    if missing:
        raise InputError(f"{path}: has no field {', '.join(map(repr, missing))} (fields: {', '.join(schema.names)})")
    target = pa.schema([schema.field(name) for name in names])
    return read_ahead(_avro_batches(path, offset, blocks, records_before, reader_schema, target), "tfrbeam-avro-read")


def _projected(reader_schema: Any, names: Sequence[str]) -> Any:
    """The reader schema with only the fields read: fastavro skips the others without building their values."""
    if not isinstance(reader_schema, dict) or not isinstance(reader_schema.get("fields"), list):
        return reader_schema
    kept = [field_ for field_ in reader_schema["fields"] if field_["name"] in set(names)]
    return reader_schema if len(kept) == len(reader_schema["fields"]) else {**reader_schema, "fields": kept}


def _block_reader(fastavro: Any, raw: BinaryIO, reader_schema: Any, names: Sequence[str]) -> Any:
    """fastavro's block reader with the projected reader schema, or the whole one where projecting leaves a named
    type undefined (a kept field using a type a left-out field defines)."""
    try:
        return fastavro.block_reader(raw, reader_schema=_projected(reader_schema, names))
    except Exception:  # fastavro's UnknownType, SchemaParseException, ...
        raw.seek(0)
        return fastavro.block_reader(raw, reader_schema=reader_schema)


def _avro_batches(path: str, offset: int, blocks: int, records_before: int, reader_schema: Any,
                  target: pa.Schema) -> Generator[SourceBatch, None, None]:
    fastavro = fastavro_module()
    record = records_before + 1
    pending: list[dict] = []
    with open_input(path) as raw:
        try:
            reader = _block_reader(fastavro, raw, reader_schema, target.names)
            raw.seek(offset)
            for index, block in enumerate(reader):
                if index == blocks:
                    break
                pending.extend(block)
                while len(pending) >= _BATCH_RECORDS:
                    yield _batch(path, pending[:_BATCH_RECORDS], record, target)
                    record += _BATCH_RECORDS
                    del pending[:_BATCH_RECORDS]
        except InputError:
            raise
        except Exception as error:  # fastavro raises ValueError, EOFError, SchemaResolutionError, ...
            raise InputError(f"{path}: cannot read the Avro records from record {record + len(pending)} on "
                             f"(block from byte {offset}): {_first_line(error)}") from error
    if pending:
        yield _batch(path, pending, record, target)


def _batch(path: str, records: list[dict], first: int, target: pa.Schema) -> SourceBatch:
    try:
        batch = pa.RecordBatch.from_pylist(records, schema=target)
    except (pa.ArrowException, TypeError, ValueError) as error:
        shown = ", ".join(f"{field_.name}: {field_.type}" for field_ in target)
        raise InputError(f"{path}: records {first} to {first + len(records) - 1} do not fit the Arrow schema "
                         f"({shown}) read from the input's first file: {_first_line(error)}") from error
    return SourceBatch(path=path, lines=np.arange(first, first + len(records), dtype=np.int64), batch=batch)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_avro_file(path: str, schema: pa.Schema, reader_schema: Any = None,
                   columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """Every record of an Avro file, from its first block."""
    fastavro = fastavro_module()
    with open_input(path) as raw:
        fastavro.block_reader(raw)
        first = raw.tell()
    return read_avro_blocks(path, first, -1, 0, reader_schema, schema, columns)


def avro_file_holds_records(path: str) -> bool:
    """Whether an Avro file holds a record (blocks of none are skipped)."""
    fastavro = fastavro_module()
    with open_input(path) as raw:
        try:
            return any(block.num_records for block in fastavro.block_reader(raw))
        except Exception as error:
            raise InputError(f"{path}: not a readable Avro file: {_first_line(error)}") from error
