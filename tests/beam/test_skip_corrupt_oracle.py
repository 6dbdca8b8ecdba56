"""ReadAllFromTFRecord(skip_corrupt=True) on TensorFlow's corrupted vectors, against counts from the files' structure.

The oracle (tests.helpers.corrupt_vectors_oracle) walks each file with its own TFRecord framing
code (crc32c straight from the crc32c package, the mask from the format's definition),
independent of tfrbeam.tfrecord.records.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from tests.helpers import corrupt_vectors_oracle
from tfrbeam.beam import ReadAllFromTFRecord


def test_skip_corrupt_keeps_and_counts_what_the_files_structure_says(tf_vectors: pathlib.Path):
    expected, expected_skips = corrupt_vectors_oracle(tf_vectors)

    pipeline = beam.Pipeline(options=PipelineOptions([]))
    digests = (
        pipeline
        | beam.Create([str(tf_vectors / "corrupt_*")])
        | ReadAllFromTFRecord(with_filename=True, skip_corrupt=True)
        | beam.MapTuple(lambda path, record: (os.path.basename(path), hashlib.sha256(record).hexdigest()))
    )
    assert_that(digests, equal_to(expected))
    result = pipeline.run()
    result.wait_until_finish()
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("tfrbeam"))["counters"]:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    assert totals["corrupt_records_skipped"] == expected_skips
    assert totals["records_read"] == len(expected)
