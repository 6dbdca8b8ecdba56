"""``write_dataset``: a tfrbeam dataset from Arrow data in memory (a pyarrow Table, pandas, Polars, DuckDB), launched
from this process as ``tfrbeam build`` is.

The table is planned as rows (``tfrbeam.builder.pipeline.from_rows``), written once to an Arrow IPC file in the
run's staging directory for the workers to read, and built by the same steps as any build; this process holds the
output's lock while its pipeline runs and publishes after it (docs/commit.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.beam import filesystem as fs
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.read import converted_ahead
from tfrbeam.builder.pipeline.from_rows import (
    ROWS_PER_BATCH,
    FeaturesOption,
    arrow_table,
    build_rows,
    dataset_config,
    plan_for,
)
from tfrbeam.builder.running.launch import BuildResult, build_options, launch, reporting
from tfrbeam.errors import InputError, OutputNotWritableError, RowCountError
from tfrbeam.layout.names import TABLE_FILE_NAME

__all__ = ["write_dataset"]

_LOG = logging.getLogger(__name__)

BATCHES_PER_ELEMENT = 4


def write_dataset(data: Any, path: str | os.PathLike, *, features: FeaturesOption = None,
                  splits: Mapping[str, Any] | None = None, split_key: str | Sequence[str] | None = None,
                  shuffle: bool = True, seed: int = 0, num_shards: int | Mapping[str, int] | None = None,
                  max_bytes_per_shard: int | str | None = None, compression: str | None = None,
                  errors: str | Mapping[str, Any] | None = None, stats: bool = False, schema_pbtxt: bool = False,
                  tfds: str | Mapping[str, str] | None = None, overwrite: bool = False,
                  pipeline_options: PipelineOptions | Sequence[str] | Mapping[str, Any] | None = None,
                  progress: bool = True, name: str = "table", keep_index: bool = False) -> BuildResult | None:
    """Build a tfrbeam dataset at ``path`` from Arrow data in memory, like ``tfrbeam build`` on a Parquet file of it.

    ``data``: anything ``arrow_table`` takes (pandas, Polars, DuckDB through ``__arrow_c_stream__``;
    none of them is needed by tfrbeam). The options are WriteDataset's; ``shuffle=False`` keeps
    the table's row order. This process is the launcher: it holds the output's lock while the
    pipeline runs (``pipeline_options``: Beam's, the FnApiRunner by default) and publishes after
    it. Returns the manifest and summary (None only under Beam's ``--dry_run``); raises our
    one-line TfrbeamErrors (a row's number in messages and dead letters is its 1-based position
    in the table; ``name`` names the table there). A pandas index is left out unless ``keep_index``
    (see ``arrow_table``).
    """
    started = time.monotonic()
    table = arrow_table(data, keep_index)
    config = dataset_config(path, name, features=features, splits=splits, split_key=split_key, shuffle=shuffle,
                            seed=seed, num_shards=num_shards, max_bytes_per_shard=max_bytes_per_shard,
                            compression=compression, errors=errors, stats=stats, schema_pbtxt=schema_pbtxt, tfds=tfds)
    options = build_options(pipeline_options)
    plan = plan_for(config, table.schema, options, overwrite, input_bytes=table.nbytes, own_options=True)
    if table.num_rows == 0:
        if not config.errors.allow_empty:
            raise InputError(f"{name} holds no rows; errors.allow_empty is false, so the build fails")
        _LOG.warning("%s holds no rows: the dataset will be empty; set errors.allow_empty: false to fail such a build",
                     name)
    table = table.select([column for column in table.column_names if column in set(plan.columns)])
    # Progress counts the bytes of the columns built from, against this total.
    plan = dataclasses.replace(plan, input_files=(dataclasses.replace(plan.input_files[0], size=table.nbytes),))
    rows_file = fs.join(plan.staging_dir, TABLE_FILE_NAME)
    batches = table.to_batches(ROWS_PER_BATCH)

    def attach(pipeline: beam.Pipeline) -> None:
        # Only each batch's number, first row and row count go into the pipeline: Beam pickles (and bz2-compresses)
        # what beam.Create holds, which cost seconds per 20k rows. The rows themselves go to an Arrow IPC file.
        rows = (pipeline
                | "Batches" >> beam.Create(_batch_chunks(batches), reshuffle=False)
                | "Rows" >> beam.ParDo(_ReadTableBatches(plan.config.input.path, rows_file, plan.features, table.num_rows))
                .with_output_types(SourceBatch))
        build_rows(rows, plan, publish=False, schema=table.schema, what="write_dataset")
        _write_table_file(rows_file, table.schema, batches)  # build_rows made the staging directory

    with reporting(progress):
        result = launch(plan, options, attach, started)
        if result is not None:
            _LOG.info("built %s:\n%s", result.path, result.summary)
    return result


def _batch_chunks(batches: Sequence[pa.RecordBatch]) -> list[tuple[tuple[int, int, int], ...]]:
    """The table's batches as elements of up to BATCHES_PER_ELEMENT (batch number, its first row's 1-based number, its
    rows) triples: a few batches an element, so one is converted ahead while the last is keyed, as tfrbeam build's
    readers do. Numbered from the batches themselves: a chunked table's batches keep its chunk boundaries, so they
    are not all ROWS_PER_BATCH rows."""
    starts, first = [], 1
    for index, batch in enumerate(batches):
        starts.append((index, first, batch.num_rows))
        first += batch.num_rows
    return [tuple(starts[at:at + BATCHES_PER_ELEMENT]) for at in range(0, len(starts), BATCHES_PER_ELEMENT)]


def _write_table_file(path: str, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> None:
    """The table's batches as an uncompressed Arrow IPC file, for the pipeline's workers to read.

    A full disk or the like is OutputNotWritableError naming the file: nothing has run, and the staging
    directory (with the partial file) goes with the run.
    """
    try:
        with fs.create(path) as handle, pa.ipc.new_file(handle, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    except OSError as error:
        raise OutputNotWritableError(f"{path}: cannot write the rows for the pipeline's workers "
                                     f"({error.strerror or error}); free space or choose another output") from error


class _ReadTableBatches(beam.DoFn):
    """Batch numbers -> those batches of the table's IPC file, as SourceBatches numbered by the rows' place in the
    table, their features converted a batch ahead (``converted_ahead``).

    A local file is memory-mapped (its batches are read without a copy); a remote one is read through Beam's FileSystems.
    """

    def __init__(self, source: str, path: str, specs: Sequence[FeatureSpec], table_rows: int):
        self._source, self._path, self._specs, self._table_rows = source, path, specs, table_rows

    def process(self, element: tuple[tuple[int, int, int], ...]) -> Iterator[SourceBatch]:
        yield from converted_ahead(self._batches(element), self._specs)

    def _batches(self, element: tuple[tuple[int, int, int], ...]) -> Generator[SourceBatch, None, None]:
        with contextlib.ExitStack() as stack:
            if fs.is_local(self._path):
                reader = pa.ipc.open_file(stack.enter_context(pa.memory_map(self._path)))
            else:
                reader = pa.ipc.open_file(pa.PythonFile(stack.enter_context(fs.open_read(self._path)), mode="r"))
            for index, first, rows in element:
                batch = reader.get_batch(index)
                if batch.num_rows != rows:  # the staged file is not what was planned: never build from part of it
                    raise RowCountError(f"{self._source}: batch {index} of the staged rows holds {batch.num_rows} rows, "
                                     f"the table's batch {rows} (rows {first} on); nothing was published")
                if batch.num_rows:  # every batch carries the table's num_rows: the commit checks the rows read against it
                    yield SourceBatch(self._source, np.arange(first, first + batch.num_rows, dtype=np.int64), batch,
                                      file_rows=self._table_rows)
