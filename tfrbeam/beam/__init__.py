"""Apache Beam IO for TFRecord files and tf.train.Example datasets (imports apache_beam)."""

from __future__ import annotations

# Reading (source helper).
from tfrbeam.beam.arrow_coder import RecordBatchCoder
from tfrbeam.beam.examples_read import ReadExamples

# Writing (sink helper).
from tfrbeam.beam.examples_write import WriteExamples

# Statistics and Parquet export of datasets.
from tfrbeam.beam.parquet_export import ExportToParquet, WriteToParquetWithChecksums
from tfrbeam.beam.sequence_examples import ReadSequenceExamples, WriteSequenceExamples
from tfrbeam.beam.sink import WriteToTFRecord
from tfrbeam.beam.source import ReadAllFromTFRecord, ReadFromTFRecord, TFRecordSource
from tfrbeam.beam.stats_combine import ComputeDatasetStats, SplitStatsCombineFn, WriteStatsFiles

__all__ = [
    "ComputeDatasetStats",
    "ExportToParquet",
    "ReadAllFromTFRecord",
    "RecordBatchCoder",
    "ReadExamples",
    "ReadFromTFRecord",
    "ReadSequenceExamples",
    "SplitStatsCombineFn",
    "TFRecordSource",
    "WriteExamples",
    "WriteSequenceExamples",
    "WriteStatsFiles",
    "WriteToParquetWithChecksums",
    "WriteToTFRecord",
]
