"""Apache Beam IO for TFRecord files and tf.train.Example datasets (imports apache_beam).

Names are imported lazily, like ``tfrbeam``'s own: a build that needs only the filesystem helpers
and the sink does not pay for the readers, the statistics and the Parquet export.

May import every package below the build (stats, dataset, layout, codec, tfrecord, base). The one
home of Beam ``FileSystems`` calls is ``tfrbeam.beam.filesystem``.

One name is an explicit exception to the layering: ``WriteDataset`` lives in ``tfrbeam.builder``
(it is the dataset build's own graph) but is offered here beside the other transforms. It is a
lazy name (a string in ``_EXPORTS``, resolved on first use), never an import, so nothing in this
package depends on the build; ``UPWARD_EXPORTS`` lists it and tests/test_layering.py holds that
it is the only one.
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
    "WriteDataset": "tfrbeam.builder.pipeline.from_rows",  # an upward name: see UPWARD_EXPORTS
    "WriteExamples": "tfrbeam.beam.examples_write",
    "WriteSequenceExamples": "tfrbeam.beam.sequence_examples",
    "WriteStatsFiles": "tfrbeam.beam.stats_combine",
    "WriteToParquetWithChecksums": "tfrbeam.beam.parquet_export",
    "WriteToTFRecord": "tfrbeam.beam.sink",
}

# Names resolved from a package above this one (lazily, on first use): the exception the docstring describes.
UPWARD_EXPORTS = ("WriteDataset",)

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
