"""TFRecord Examples -> Parquet as a Beam pipeline (Dataflow): one Parquet file per shard, as ``tfrbeam export`` writes.

``ExportToParquet(dataset, output_dir)`` writes ``output_dir/<split>/<shard name>.parquet`` (plain
TFRecord files: ``output_dir/<file>.parquet``), the files and rows of the local export, with the
export schema of ``tfrbeam.stats.export`` (scalars, fixed_size_lists, lists, nulls for absent
features; bytes features as text when every value is UTF-8, found by a first read of those features
alone) and page checksums on. Each shard is one element: a worker reads it through Beam's
FileSystems (the manifest too, when the pipeline is built, so ``gs://`` datasets work) with its
own compression, writes a temp file beside the target and checks its row count against the
manifest's. Only when every shard's temp file is whole does one last step rename them all to their
final names, so a failed export publishes no file (its hidden ``.<name>.<id>.tmp`` temps may stay
behind: the runner, not the pipeline, sees the failure). Parquet files already in the target
directories are refused unless ``overwrite=True``, which deletes export's own in that last step.

``WriteToParquetWithChecksums`` is Beam's file sink writing Tables with page checksums, for
pipelines that make their own Tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io import iobase
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.stats_combine import resolve_beam_input
from tfrbeam.errors import ManifestError
from tfrbeam.stats.export import (
    ExportPlan,
    existing_files_error,
    files_to_replace,
    non_text_features,
    parquet_writer,
    plan_export,
    text_columns,
    with_binary,
    write_parquet,
)


class _ChecksummedParquetSink(FileBasedSink):
    """Beam's file sink writing pyarrow Tables into Parquet files with page checksums (beam's own sink has no such option)."""

    def __init__(self, file_path_prefix: str, schema: pa.Schema, num_shards: int):
        super().__init__(
            file_path_prefix, coder=None, file_name_suffix=".parquet", num_shards=num_shards,
            shard_name_template="-SSSSS-of-NNNNN", mime_type="application/x-parquet",
            compression_type=CompressionTypes.UNCOMPRESSED,
        )
        self._schema = schema
        self._handles: dict[int, Any] = {}  # writer id -> the file handle under it

    def open(self, temp_path):
        handle = super().open(temp_path)
        writer = parquet_writer(handle, self._schema)
        self._handles[id(writer)] = handle
        return writer

    def write_record(self, writer, table: pa.Table) -> None:
        writer.write_table(table.cast(self._schema) if table.schema != self._schema else table)

    def close(self, writer) -> None:
        writer.close()
        self._handles.pop(id(writer)).close()


class WriteToParquetWithChecksums(beam.PTransform):
    """Write a PCollection of pyarrow Tables or RecordBatches (all of ``schema``) as ``num_shards`` Parquet files."""

    def __init__(self, file_path_prefix: str, schema: pa.Schema, num_shards: int = 0):
        super().__init__()
        self._sink = _ChecksummedParquetSink(file_path_prefix, schema, num_shards)

    def expand(self, pcoll):
        tables = pcoll | "ToTables" >> beam.Map(
            lambda item: pa.Table.from_batches([item]) if isinstance(item, pa.RecordBatch) else item
        )
        return tables | "Write" >> iobase.Write(self._sink)


class ExportToParquet(beam.PTransform):
    """Export a build directory's splits (or some, ``splits``; some features, ``columns``) to Parquet; gives the file names.

    Plain TFRecord files (a local glob) are exported with the inferred schema to ``output_dir/<file>.parquet``.
    ``batch_size`` is the number of records decoded at a time. Parquet files already where the
    export writes are refused (OutputExistsError) unless ``overwrite``.
    """

    def __init__(self, dataset_dir: str, output_dir: str, splits: Sequence[str] | None = None,
                 columns: Sequence[str] | None = None, batch_size: int = 8192, overwrite: bool = False):
        super().__init__()
        source = resolve_beam_input(dataset_dir, splits)
        self._plan = plan_export(dataset_dir, output_dir, splits, columns, source=source, join=fs.join)
        self._stale = _existing_parquet(self._plan)
        if self._stale and not overwrite:
            raise existing_files_error(self._stale)
        self._stale = files_to_replace(self._plan, self._stale)  # --overwrite deletes export's own files only
        self._batch_size = batch_size

    def expand(self, pbegin):
        plan = self._plan
        items = [(record, parquet, expected, plan.compressions[record]) for record, parquet, expected, _ in plan.files]
        shards = (pbegin
                  | "Shards" >> beam.Create(items, reshuffle=False)
                  | "SpreadShards" >> beam.Reshuffle())
        # Which bytes features are text (every value UTF-8, in every shard) is known only once all are read:
        # a first read of those features alone, so every shard is written with the one schema.
        binary = (shards
                  | "NonTextFeatures" >> beam.Map(_non_text_features, plan.schema, self._batch_size)
                  | "AllNonText" >> beam.CombineGlobally(_union))
        return (shards
                | "ExportShard" >> beam.ParDo(_ExportShard(plan.schema, self._batch_size), beam.pvalue.AsSingleton(binary))
                | "AllShards" >> beam.combiners.ToList()
                | "Publish" >> beam.FlatMap(_publish, self._stale))


def _existing_parquet(plan: ExportPlan) -> list[str]:
    """The Parquet files already in the directories the export writes to (any Beam filesystem)."""
    directories = sorted({fs.split(target)[0] for _, target, _, _ in plan.files})
    found = []
    for directory in directories:
        pattern = fs.join(directory, "*.parquet")
        found += [metadata.path for metadata in fs.match_metadata(pattern)
                  if fs.split(metadata.path)[0].rstrip("/") == directory.rstrip("/")]
    return sorted(found)


def _non_text_features(item: tuple[str, str, int | None, str | None], schema: pa.Schema,
                       block_length: int) -> frozenset[str]:
    record_path, _, _, compression = item
    if not text_columns(schema):
        return frozenset()
    with fs.open_read(record_path) as records:
        return non_text_features(records, record_path, schema, compression, block_length)


def _union(found: Iterable[frozenset[str]]) -> frozenset[str]:
    return frozenset().union(*found)


def _publish(staged: Sequence[tuple[str, str]], stale: Sequence[str]) -> Iterator[str]:
    """Every shard's temp file is whole: delete the stale files (not those the renames replace), then rename each
    temp to its final name, in file order; gives the final names."""
    staged = sorted(staged, key=lambda pair: pair[1])
    finals = {final for _, final in staged}
    doomed = [path for path in stale if path not in finals]
    if doomed:
        fs.delete_files(doomed)
    for temp, final in staged:
        fs.rename([(temp, final)])
        yield final


class _ExportShard(beam.DoFn):
    """One TFRecord file -> a temp Parquet file beside its final name, read (with the file's own compression) and
    written through Beam's FileSystems, the bytes features in ``binary`` as binary, the others as text; gives
    (temp, final) for the last step to rename."""

    def __init__(self, schema: pa.Schema, block_length: int):
        super().__init__()
        self._schema = schema
        self._block_length = block_length

    def process(self, item: tuple[str, str, int | None, str | None], binary: frozenset[str]) -> Iterator[tuple[str, str]]:
        record_path, parquet_path, expected, compression = item
        schema = with_binary(self._schema, binary)
        directory, name = fs.split(parquet_path)
        temp = fs.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")  # a retried bundle writes its own
        try:
            with fs.open_read(record_path) as records, \
                    fs.create(temp, mime_type="application/x-parquet") as target:
                rows = write_parquet(records, record_path, target, schema, compression,
                                     block_length=self._block_length)
            if expected is not None and rows != expected:
                raise ManifestError(f"{record_path}: holds {rows} records, but the manifest says {expected}; "
                                    "the shard does not match its dataset (run tfrbeam verify)")
        except BaseException:
            fs.delete_files([temp])
            raise
        yield temp, parquet_path
