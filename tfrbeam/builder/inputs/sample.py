"""What the plan reads of the inputs before the pipeline: the first file's schema and CSV sample (to infer and
check the features on), and whether any file holds a row."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from tfrbeam.builder.config.schema import CsvOptions, InputConfig
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.inputs.avro import avro_file_holds_records, avro_input_schema, avro_schema, read_avro_file
from tfrbeam.builder.inputs.batch import SourceBatch, empty_batch
from tfrbeam.builder.inputs.csv import parse_row_texts, read_csv_file, row_texts
from tfrbeam.builder.inputs.files import InputFile, list_inputs, open_input
from tfrbeam.builder.inputs.jsonl import jsonl_holds_lines, jsonl_schema, read_jsonl_file
from tfrbeam.builder.inputs.orc import orc_file_rows, orc_input_schema, read_orc_file
from tfrbeam.builder.inputs.parquet import parquet_file, parquet_input_schema, read_parquet_file
from tfrbeam.builder.inputs.tfrecord import (
    file_compression,
    read_tfrecord_file,
    tfrecord_holds_records,
    tfrecord_inputs,
    tfrecord_schema,
)
from tfrbeam.errors import InputError

__all__ = [
    "SAMPLE_ROWS",
    "CsvSample",
    "InputSample",
    "check_inputs_hold_rows",
    "input_files",
    "inspect_input",
    "read_csv_sample",
    "typed_sample",
]

_LOG = logging.getLogger(__name__)

SAMPLE_ROWS = 10_000


def input_files(input_config: InputConfig) -> list[InputFile]:
    """The files an input reads: those its glob matches, or a TFRecord dataset's shards (see tfrecord_inputs)."""
    if input_config.format == "tfrecord":
        return tfrecord_inputs(input_config)
    return list_inputs(input_config.path)


@dataclass(frozen=True, eq=False)
class InputSample:
    """The schema of the first input file, and for CSV a sample of its rows (all binary) to infer types from.

    token_notes: for CSV text columns holding an inferred null token, why the token is null or a value
    there (resolve.infer_csv_tokens decides; infer-config comments on it).
    """

    path: str
    schema: pa.Schema
    sample: pa.RecordBatch | None
    token_notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class CsvSample:
    """A CSV input's sample as read once: what inspect_input gives, and the sampled rows to parse again.

    with_null_values gives the sample as inspect_input would read it with other null values, from
    the rows' text (each row parsed again alone: the values are the same, only which unquoted cells
    are null changes), without reading the file again.
    """

    inspected: InputSample
    options: CsvOptions
    sources: tuple[SourceBatch, ...]  # the batches read, with their raw text
    rows: int  # how many of their rows the sample holds

    def with_null_values(self, null_values: tuple[str, ...]) -> InputSample:
        """inspect_input's result for this input with csv.null_values set to null_values."""
        texts, left = [], self.rows
        for source in self.sources:
            texts += row_texts(source, left)
            left -= min(left, source.num_rows)
        names = self.inspected.schema.names
        table = parse_row_texts(texts, names, replace(self.options, null_values=null_values))
        sample = pa.concat_batches(table.to_batches()) if table.num_rows else empty_batch(names)
        return InputSample(self.inspected.path, self.inspected.schema, sample)


def inspect_input(input_config: InputConfig, sample_rows: int = SAMPLE_ROWS,
                  files: Sequence[InputFile] | None = None, declared: Sequence[FeatureSpec] | None = None
                  ) -> InputSample:
    """Read the input's schema (Parquet, ORC: every footer, see parquet_input_schema; JSON lines: inferred from the
    first lines of the first file holding any; Avro: the first file's, every header checked against it; CSV: the first
    file's header and sample)."""
    files = list(files) if files is not None else input_files(input_config)
    fmt, first = input_config.format, files[0].path
    if fmt == "parquet":
        schema = parquet_input_schema(files, input_config.columns, input_config.parquet.require_checksums)
    elif fmt == "orc":
        schema = orc_input_schema(files, input_config.columns)
    elif fmt == "jsonl":
        # The lines ReadTabular infers it from, too; fields never null there infer on_null: error.
        schema = jsonl_schema([item.path for item in files], sampled_nulls=True,
                              max_row_bytes=input_config.jsonl.max_row_bytes)
    elif fmt == "avro":
        schema = avro_input_schema(files, input_config.columns)
    elif fmt == "tfrecord":
        schema = tfrecord_schema(input_config, files, sample_rows, declared)  # declared: features the config gives
    else:
        return read_csv_sample(input_config, sample_rows, files).inspected
    return InputSample(first, schema, None)


def typed_sample(input_config: InputConfig, path: str, schema: pa.Schema, sample_rows: int = SAMPLE_ROWS
                 ) -> pa.RecordBatch:
    """The first sample_rows good rows of a typed input's file (Parquet, ORC, JSON lines, Avro, TFRecord) as one batch."""
    fmt = input_config.format
    if fmt == "parquet":
        sources: Iterator[SourceBatch] = read_parquet_file(path)
    elif fmt == "orc":
        sources = read_orc_file(path)
    elif fmt == "jsonl":
        sources = read_jsonl_file(path, pa.schema([field_.with_nullable(True) for field_ in schema]),  # as read
                                  max_row_bytes=input_config.jsonl.max_row_bytes)
    elif fmt == "tfrecord":
        sources = read_tfrecord_file(path, schema, file_compression(input_config, path))
    else:
        sources = read_avro_file(path, schema, avro_schema(path))
    batches, count = [], 0
    with contextlib.closing(sources):  # type: ignore[type-var]  # every reader is a generator
        for source in sources:
            batches.append(source.batch)
            count += source.num_rows
            if count >= sample_rows:
                break
    table = pa.Table.from_batches(batches, schema=batches[0].schema if batches else schema).slice(0, sample_rows)
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=table.schema)


def read_csv_sample(input_config: InputConfig, sample_rows: int = SAMPLE_ROWS,
                    files: Sequence[InputFile] | None = None) -> CsvSample:
    """The first file of a CSV input read once for its header and first sample_rows rows (see CsvSample)."""
    files = list(files) if files is not None else list_inputs(input_config.path)
    path = files[0].path
    sources, batches, count = [], [], 0
    names: list[tuple[str, ...]] = []
    with contextlib.closing(read_csv_file(path, input_config.csv, names_seen=names.append)) as read:
        for source in read:
            sources.append(source)
            batches.append(source.batch)
            count += source.num_rows
            if count >= sample_rows:
                break
    if not batches:  # a header and no rows (read_csv_file yields nothing): the names are still known
        batches = [empty_batch(names[0])]
    table = pa.Table.from_batches(batches).slice(0, sample_rows)
    sample = pa.concat_batches(table.to_batches()) if table.num_rows else empty_batch(table.schema.names)
    return CsvSample(InputSample(path, table.schema, sample), input_config.csv, tuple(sources), table.num_rows)


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
        with open_input(path) as raw:
            return parquet_file(path, raw).metadata.num_rows > 0
    if input_config.format == "orc":
        return orc_file_rows(path) > 0
    if input_config.format == "jsonl":
        return jsonl_holds_lines(path, input_config.jsonl.max_row_bytes)
    if input_config.format == "avro":
        return avro_file_holds_records(path)
    if input_config.format == "tfrecord":
        return tfrecord_holds_records(path, file_compression(input_config, path))
    with contextlib.closing(read_csv_file(path, input_config.csv)) as sources:
        return any(source.num_rows or source.bad_rows for source in sources)
