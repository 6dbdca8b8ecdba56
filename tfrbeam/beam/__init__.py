"""Apache Beam IO for TFRecord files and tf.train.Example datasets (imports apache_beam)."""

from __future__ import annotations

# Reading (source helper).
from tfrbeam.beam.arrow_coder import RecordBatchCoder
from tfrbeam.beam.examples_read import ReadExamples
from tfrbeam.beam.source import ReadAllFromTFRecord, ReadFromTFRecord, TFRecordSource

# Writing (sink helper).
from tfrbeam.beam.examples_write import WriteExamples
from tfrbeam.beam.sink import WriteToTFRecord

__all__ = [
    "ReadAllFromTFRecord",
    "RecordBatchCoder",
    "ReadExamples",
    "ReadFromTFRecord",
    "TFRecordSource",
    "WriteExamples",
    "WriteToTFRecord",
]
