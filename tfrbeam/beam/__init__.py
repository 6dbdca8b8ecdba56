"""Apache Beam IO for TFRecord files and tf.train.Example datasets (imports apache_beam).

Names are imported lazily, like ``tfrbeam``'s own: a build that needs only the filesystem helpers
and the sink does not pay for the readers, the statistics and the Parquet export.

May import every package below the builder (stats, dataset, layout, codec, tfrecord, base). The one
home of Beam ``FileSystems`` calls is ``tfrbeam.beam.filesystem``. The dataset build as a transform,
``WriteDataset``, is the builder's: ``tfrbeam.WriteDataset`` or ``tfrbeam.builder.WriteDataset``.
"""

from __future__ import annotations

import tfrbeam.beam.arrow_coder  # noqa: F401  (registers the RecordBatch coder as soon as tfrbeam.beam is imported)
from tfrbeam.base.lazy_exports import lazy_exports

_EXPORTS = {
    "ComputeDatasetStats": "tfrbeam.beam.stats_combine",
    "ExportToParquet": "tfrbeam.beam.parquet_export",
    "ReadAllFromTFRecord": "tfrbeam.beam.source",
    "ReadExamples": "tfrbeam.beam.examples_read",
    "ReadFromTFRecord": "tfrbeam.beam.source",
    "ReadSequenceExamples": "tfrbeam.beam.sequence_examples",
    "RecordBatchCoder": "tfrbeam.beam.arrow_coder",
    "SplitStatsCombineFn": "tfrbeam.beam.stats_combine",
    "TFRecordSource": "tfrbeam.beam.source",
    "WriteExamples": "tfrbeam.beam.examples_write",
    "WriteSequenceExamples": "tfrbeam.beam.sequence_examples",
    "WriteStatsFiles": "tfrbeam.beam.stats_combine",
    "WriteToParquetWithChecksums": "tfrbeam.beam.parquet_export",
    "WriteToTFRecord": "tfrbeam.beam.sink",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
