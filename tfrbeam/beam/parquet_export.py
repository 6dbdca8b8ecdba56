"""TFRecord Examples -> Parquet as a Beam pipeline (Dataflow): ``ReadExamples`` -> ``WriteToParquetWithChecksums``.

``ExportToParquet(dataset, output_dir)`` reads each split with the export schema of
``tfrbeam.parquet_export`` (scalars, fixed_size_lists, lists, nulls for absent features) and
writes ``output_dir/<split>/<split>-SSSSS-of-NNNNN.parquet``, as many files as the split has
shards (Beam decides which rows go to which file; the rows of a split are the same multiset).
Files are committed by Beam's file sink (temp files, then renames) with page checksums on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io import iobase
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfrbeam.beam.stats_combine import read_batches
from tfrbeam.parquet_export import parquet_writer, plan_export


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

    Plain TFRecord files (a glob) are exported with the inferred schema to ``output_dir/part-SSSSS-of-NNNNN.parquet``.

    The manifest is read when the pipeline is constructed; the shards are read by the workers.
    """

    def __init__(self, dataset_dir: str, output_dir: str, splits: Sequence[str] | None = None,
                 columns: Sequence[str] | None = None, batch_size: int = 8192):
        super().__init__()
        self._plan = plan_export(dataset_dir, output_dir, splits, columns)
        self._output_dir = output_dir
        self._batch_size = batch_size

    def expand(self, pbegin):
        plan = self._plan
        by_split: dict[str | None, list[str]] = {}  # None: plain TFRecord files, not a build
        for record_path, _, _, split in plan.files:
            by_split.setdefault(split, []).append(record_path)
        written = []
        for split, files in by_split.items():
            label = split or "files"
            batches = read_batches(pbegin, f"export {label}", files, plan.schema, plan.compression, self._batch_size)
            prefix = FileSystems.join(self._output_dir, split, split) if split else FileSystems.join(self._output_dir, "part")
            written.append(batches | f"Write {split}" >> WriteToParquetWithChecksums(prefix, plan.schema, num_shards=len(files)))
        return written | "AllFiles" >> beam.Flatten()
