"""tfrbeam.beam.arrow_coder: RecordBatches cross Beam stages as Arrow IPC, sized from their buffers."""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam import coders
from apache_beam.testing.util import assert_that, equal_to

from tfrbeam.beam.arrow_coder import RecordBatchCoder
from tfrbeam.beam.examples_read import ReadExamples
from tfrbeam.codec.example import encode_example
from tfrbeam.tfrecord.records import RecordWriter

BATCH = pa.record_batch({
    "id": pa.array([1, 2, None], pa.int64()),
    "name": pa.array([b"a", b"", b"ccc"], pa.binary()),
    "vec": pa.array([[1.5, 2.0], [], None], pa.list_(pa.float32())),
})


@pytest.mark.parametrize("batch", [BATCH, BATCH.slice(1, 2), BATCH.slice(0, 0), pa.record_batch({})])
def test_round_trip_keeps_schema_and_values(batch):
    coder = RecordBatchCoder()
    decoded = coder.decode(coder.encode(batch))
    assert decoded.schema == batch.schema and decoded.equals(batch) and decoded.num_rows == batch.num_rows


def test_size_comes_from_the_buffers_without_encoding(monkeypatch):
    coder = RecordBatchCoder()
    monkeypatch.setattr(RecordBatchCoder, "encode", lambda self, batch: pytest.fail("estimate_size encoded the batch"))
    assert coder.estimate_size(BATCH) == BATCH.get_total_buffer_size() > 0
    assert coder.get_impl().estimate_size(BATCH) == BATCH.get_total_buffer_size()


def test_registered_for_record_batches_and_typed_on_read_examples(tmp_path):
    assert coders.registry.get_coder(pa.RecordBatch) == RecordBatchCoder()
    assert not RecordBatchCoder().is_deterministic()
    path = tmp_path / "e.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(encode_example({"id": [1]}))
    pipeline = beam.Pipeline()
    batches = pipeline | "Batches" >> ReadExamples(str(path), output="record_batches")
    dicts = pipeline | "Dicts" >> ReadExamples(str(path))
    assert batches.element_type is pa.RecordBatch and dicts.element_type is not pa.RecordBatch


def test_batches_cross_a_shuffle_intact():
    with beam.Pipeline() as pipeline:
        rows = (
            pipeline
            | beam.Create([BATCH, BATCH.slice(2)]).with_output_types(pa.RecordBatch)
            | beam.Reshuffle()
            | beam.FlatMap(lambda batch: batch.to_pylist())
        )
        assert_that(rows, equal_to(BATCH.to_pylist() + BATCH.slice(2).to_pylist()))
