"""tfrbeam: TensorFlow-free TFRecord and tf.train.Example tools, Apache Beam IO and dataset builds.

Names are imported lazily, so ``import tfrbeam`` stays cheap and the format core never pulls in
Apache Beam: ``tfrbeam.read_records`` loads only the framing module, ``tfrbeam.WriteToTFRecord``
loads Beam.
"""

from __future__ import annotations

from tfrbeam.base.lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # framing
    "RecordWriter": "tfrbeam.tfrecord.records",
    "RecordReader": "tfrbeam.tfrecord.records",
    "read_records": "tfrbeam.tfrecord.records",
    "masked_crc32c": "tfrbeam.tfrecord.records",
    "record_blocks": "tfrbeam.tfrecord.blocks",
    # Example codec
    "encode_example": "tfrbeam.codec.example",
    "decode_example": "tfrbeam.codec.example",
    "encode_sequence_example": "tfrbeam.codec.example",
    "decode_sequence_example": "tfrbeam.codec.example",
    "record_batch_to_examples": "tfrbeam.codec.encode",
    "encode_record_batch": "tfrbeam.codec.encode",
    "encode_sequence_batch": "tfrbeam.codec.sequence_encode",
    "examples_to_record_batch": "tfrbeam.codec.decode",
    # Beam IO
    "TFRecordSource": "tfrbeam.beam.source",
    "ReadFromTFRecord": "tfrbeam.beam.source",
    "ReadAllFromTFRecord": "tfrbeam.beam.source",
    "WriteToTFRecord": "tfrbeam.beam.sink",
    "ReadExamples": "tfrbeam.beam.examples_read",
    "WriteExamples": "tfrbeam.beam.examples_write",
    "ReadSequenceExamples": "tfrbeam.beam.sequence_examples",
    "WriteSequenceExamples": "tfrbeam.beam.sequence_examples",
    # dataset builds from rows (tfrbeam.builder)
    "WriteDataset": "tfrbeam.builder.pipeline.from_rows",
    "write_dataset": "tfrbeam.builder.running.write_table",
    # training-side reader
    "open_dataset": "tfrbeam.dataset",
    "open_random_access": "tfrbeam.dataset",
    "even_splits": "tfrbeam.dataset",
    "mix": "tfrbeam.dataset",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
