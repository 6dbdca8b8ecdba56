"""WriteExamples: write dicts or Arrow record batches as sharded TFRecord files of tf.train.Example.

Record batches take the codec's columnar path (``encode_record_batch`` then ``frame_buffer``), so
a whole batch becomes one framed element and no per-row element ever exists in the pipeline.
Dicts are encoded one by one with ``encode_example`` and framed per ~4 MiB. Both then go through
the sink of ``tfrbeam.beam.sink`` (atomic, size-aware, sharded; same knobs as WriteToTFRecord).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.beam.sink import FramedBatch, FrameRecordsFn, StrOrProvider, WriteFramedBatches, make_sink_spec
from tfrbeam.codec.encode import encode_record_batch, feature_kind
from tfrbeam.codec.example import encode_example
from tfrbeam.errors import ArrowConversionError, ExampleEncodeError
from tfrbeam.tfrecord.records import frame_buffer

__all__ = ["WriteExamples"]


def check_batch_kinds(batch: pa.RecordBatch | pa.Table, kinds: Mapping[str, str | None]) -> None:
    """Refuse a batch whose Arrow types give a column another feature kind than ``kinds`` declares."""
    for field in batch.schema:
        if field.name not in kinds:
            continue
        actual, _ = feature_kind(field.name, field.type)
        if actual != kinds[field.name]:
            raise ArrowConversionError(
                f"column {field.name!r} has Arrow type {field.type}, which encodes as a {actual} feature, but "
                f"kinds declares {kinds[field.name]!r}; cast the column (e.g. batch.cast(schema)) or fix kinds"
            )


def encode_batch(batch: pa.RecordBatch | pa.Table) -> FramedBatch:
    """Encode and frame every row of an Arrow batch in one piece."""
    encoded = encode_record_batch(batch)
    lengths = np.diff(np.asarray(encoded.offsets, dtype=np.int64)).astype("<u4")
    return frame_buffer(encoded.data, encoded.offsets), lengths.tobytes()  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


class _FrameExamplesFn(FrameRecordsFn):
    """Frames dict elements like FrameRecordsFn and Arrow batches whole, with the columnar encoder."""

    def __init__(self, kinds: Mapping[str, str | None] | None):
        super().__init__(functools.partial(encode_example, kinds=kinds))
        self._kinds = kinds

    def process(self, element: Any) -> Iterator[FramedBatch]:
        if isinstance(element, (pa.RecordBatch, pa.Table)):
            if self._kinds:
                check_batch_kinds(element, self._kinds)
            if element.num_rows:
                yield encode_batch(element)
        elif isinstance(element, Mapping):
            yield from super().process(element)
        else:
            raise ExampleEncodeError(
                f"WriteExamples takes dicts (feature name -> values) or pyarrow RecordBatches/Tables, got a "
                f"{type(element).__name__}: {element!r:.80}"
            )


class WriteExamples(beam.PTransform):
    """Writes a PCollection of dicts or Arrow RecordBatches as tf.train.Example TFRecord shards.

    ``kinds`` (feature name -> "int64" | "float" | "bytes" | None) declares feature kinds as
    ``encode_example`` takes them; a record batch's kinds come from its Arrow types, and a batch
    column that disagrees with ``kinds`` raises ArrowConversionError. Every other argument is
    ``WriteToTFRecord``'s, with the same meaning; returns the final file names.
    """

    def __init__(
        self,
        file_path_prefix: StrOrProvider,
        *,
        kinds: Mapping[str, str | None] | None = None,
        file_name_suffix: StrOrProvider = "",
        num_shards: int = 0,
        shard_name_template: str | None = None,
        compression_type: str = CompressionTypes.AUTO,
        compression: str | None = None,
        max_records_per_shard: int | None = None,
        max_bytes_per_shard: int | None = None,
        overwrite: bool = True,
    ):
        super().__init__()
        self._kinds = dict(kinds) if kinds is not None else None
        self._spec = make_sink_spec(
            file_path_prefix, file_name_suffix, num_shards, shard_name_template, compression_type,
            compression, max_records_per_shard, max_bytes_per_shard, overwrite,
        )

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "EncodeExamples" >> beam.ParDo(_FrameExamplesFn(self._kinds))
            | "Write" >> WriteFramedBatches(self._spec)
        )
