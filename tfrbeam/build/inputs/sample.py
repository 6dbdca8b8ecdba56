"""What the plan reads of the inputs before the pipeline: the first file's schema and CSV sample (to infer and
check the features on), and whether any file holds a row."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from tfrbeam.build.config.schema import InputConfig
from tfrbeam.build.inputs.batch import empty_batch
from tfrbeam.build.inputs.csv import read_csv_file
from tfrbeam.build.inputs.csv_text import LineTracker, decoder_for, read_preamble, utf8_chunks
from tfrbeam.build.inputs.files import InputFile, list_inputs, open_input
from tfrbeam.build.inputs.parquet import parquet_file, parquet_input_schema, refuse_missing_checksums
from tfrbeam.errors import InputError

__all__ = ["SAMPLE_ROWS", "InputSample", "check_inputs_hold_rows", "inspect_input"]

_LOG = logging.getLogger(__name__)

SAMPLE_ROWS = 10_000


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
            with open_input(path) as raw:
                refuse_missing_checksums(path, raw, parquet_file(path, raw).metadata)
        return InputSample(path, parquet_input_schema(files, input_config.columns), None)
    batches, count = [], 0
    with contextlib.closing(read_csv_file(path, input_config.csv)) as sources:
        for source in sources:
            batches.append(source.batch)
            count += source.num_rows
            if count >= sample_rows:
                break
    if not batches:  # a header and no rows (read_csv_file yields nothing): the names are still known
        with open_input(path) as raw:
            tracker = LineTracker(utf8_chunks(raw, input_config.csv.encoding, True, None))
            names = read_preamble(tracker, input_config.csv, path, decoder_for("utf-8")).names
        batches = [empty_batch(names)]
    table = pa.Table.from_batches(batches).slice(0, sample_rows)
    sample = pa.concat_batches(table.to_batches()) if table.num_rows else empty_batch(table.schema.names)
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
        with open_input(path) as raw:
            return parquet_file(path, raw).metadata.num_rows > 0
    with contextlib.closing(read_csv_file(path, input_config.csv)) as sources:
        return any(source.num_rows or source.bad_rows for source in sources)
