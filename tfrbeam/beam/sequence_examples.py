"""WriteSequenceExamples / ReadSequenceExamples: ``(context, feature_lists)`` pairs as tf.train.SequenceExample files.

A pair is what ``tfrbeam.codec.example.encode_sequence_example`` takes and ``decode_sequence_example``
gives: ``({name: values}, {name: [step values, ...]})``. Writing encodes each pair canonically and
hands the framed records to the sink of ``tfrbeam.beam.sink`` (atomic, sharded, the knobs of
WriteToTFRecord); reading splits files as ReadFromTFRecord does and decodes each block of records
where it was read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io import iobase
from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.beam.examples_read import DEFAULT_BATCH_SIZE
from tfrbeam.beam.runner_support import refuse_lossy_runner
from tfrbeam.beam.sink import FrameRecordsFn, StrOrProvider, WriteFramedBatches, make_sink_spec
from tfrbeam.beam.source import DecodedBatchSource
from tfrbeam.codec.example import decode_sequence_example, encode_sequence_example
from tfrbeam.errors import ExampleDecodeError, ExampleEncodeError
from tfrbeam.tfrecord.blocks import RecordBlock

__all__ = ["ReadSequenceExamples", "WriteSequenceExamples"]

SequencePair = tuple[dict[str, Any], dict[str, list]]


class _EncodePairs:
    """Encodes one ``(context, feature_lists)`` pair under the declared kinds (picklable, for workers)."""

    def __init__(self, context_kinds: Mapping[str, str | None] | None, feature_list_kinds: Mapping[str, Any] | None):
        self._context_kinds = context_kinds
        self._feature_list_kinds = feature_list_kinds

    def __call__(self, element: Any) -> bytes:
        if not (isinstance(element, (tuple, list)) and len(element) == 2
                and all(isinstance(part, Mapping) for part in element)):
            raise ExampleEncodeError(
                "WriteSequenceExamples takes (context dict, feature_lists dict) pairs, got a "
                f"{type(element).__name__}: {element!r:.80}"
            )
        context, feature_lists = element
        return encode_sequence_example(context, feature_lists, self._context_kinds, self._feature_list_kinds)


class WriteSequenceExamples(beam.PTransform):
    """Writes a PCollection of ``(context dict, feature_lists dict)`` pairs as tf.train.SequenceExample shards.

    ``context_kinds`` / ``feature_list_kinds`` (name -> "int64" | "float" | "bytes" | None) declare
    kinds as ``encode_sequence_example`` takes them (``kinds`` / ``feature_list_kinds``); a pair
    it cannot encode raises ExampleEncodeError naming the feature. Every other argument is
    ``WriteToTFRecord``'s, with the same meaning and default; returns the final file names.
    """

    def __init__(
        self,
        file_path_prefix: StrOrProvider,
        *,
        context_kinds: Mapping[str, str | None] | None = None,
        feature_list_kinds: Mapping[str, Any] | None = None,
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
        self._encode = _EncodePairs(
            dict(context_kinds) if context_kinds is not None else None,
            dict(feature_list_kinds) if feature_list_kinds is not None else None,
        )
        self._spec = make_sink_spec(
            file_path_prefix, file_name_suffix, num_shards, shard_name_template, compression_type,
            compression, max_records_per_shard, max_bytes_per_shard, overwrite,
        )

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (
            pcoll
            | "EncodeSequenceExamples" >> beam.ParDo(FrameRecordsFn(self._encode))
            | "Write" >> WriteFramedBatches(self._spec)
        )


class DecodeToPairs:
    """Batch decoder: one ``(context, feature_lists)`` pair per record, as decode_sequence_example gives."""

    def __call__(self, path: str, block: RecordBlock) -> Iterator[SequencePair]:
        for index, offset in enumerate(block.offsets.tolist()):
            try:
                yield decode_sequence_example(block.payload(index))
            except ExampleDecodeError as exc:
                raise ExampleDecodeError(f"{path}: the record at offset {offset}: {exc}") from exc


class ReadSequenceExamples(beam.PTransform):
    """Read tf.train.SequenceExample records from TFRecord files matching ``file_pattern``.

    Each record becomes one ``(context, feature_lists)`` pair: ``{name: [values]}`` and
    ``{name: [[step values], ...]}``, names sorted (bytes, float or int values). Files are split
    as ``ReadFromTFRecord`` splits them; ``compression``/``compression_type``, ``validate``,
    ``skip_corrupt`` and ``split_unindexed`` mean what they mean there. A malformed record raises
    ExampleDecodeError naming the file and the record's byte offset.
    """

    def __init__(
        self,
        file_pattern,
        *,
        compression: str | None = "auto",
        compression_type: str = CompressionTypes.AUTO,
        validate: bool = True,
        skip_corrupt: bool = False,
        split_unindexed: bool = False,
    ):
        super().__init__()
        self._source = DecodedBatchSource(
            file_pattern, DecodeToPairs(), DEFAULT_BATCH_SIZE, compression_type=compression_type, validate=validate,
            compression=compression, skip_corrupt=skip_corrupt, split_unindexed=split_unindexed,
        )

    def expand(self, pbegin):
        refuse_lossy_runner(pbegin.pipeline, "tfrbeam.ReadSequenceExamples")
        return pbegin.pipeline | iobase.Read(self._source).with_output_types(self._source.options.output_type_hint())
