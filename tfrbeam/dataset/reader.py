"""Reading one segment (a file, or a record range of one) as decoded blocks of consecutive records.

Framing and CRC checks go through ``tfrbeam.tfrecord.blocks`` (a fast path for uncompressed files
that hands any damage to ``tfrbeam.tfrecord.records.RecordReader``); decoding through the columnar decoder
(``tfrbeam.codec.sequence_decode`` for SequenceExamples) with an Arrow schema built from the feature spec,
so only the requested features are decoded. A feature list becomes a column whose first level is
each record's steps. Every block carries the ids of its records (segment index << 40 | record
number), which is what the exactly-once tests, resume and sharding reason about.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.base.object_store import (
    in_background,
    input_size,
    is_object_store,
    open_ranged,
    open_to_read,
    opened_size,
)
from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES, examples_to_record_batch
from tfrbeam.codec.sequence_decode import sequence_examples_to_record_batches
from tfrbeam.dataset.columns import Block, Column, DenseLayout
from tfrbeam.dataset.spec import (
    NUMPY_DTYPES,
    ContextFeature,
    Feature,
    FixedLenFeature,
    FixedLenSequenceFeature,
    SequenceFeature,
    VarLenFeature,
    VarLenSequenceFeature,
    arrow_field,
    check_record_type,
    is_sequence_feature,
)
from tfrbeam.errors import (
    ArrowConversionError,
    ExampleDecodeError,
    MissingShardError,
    RecordLimitError,
    ShardMismatchError,
)
from tfrbeam.layout.generation import Generation
from tfrbeam.tfrecord.blocks import RecordBlock, offset_of_record, record_blocks
from tfrbeam.tfrecord.read_index import indexed_record_starts, seek_position, trusted_index
from tfrbeam.tfrecord.records import SkippedRegion

RECORD_BITS = 40
ID_KEY = "__id__"
RAW_KEY = "record"
# Presence flags travel (packed with the dense columns) under this prefix: an absent feature is null in Arrow output.
PRESENT_PREFIX = "\x00present\x00"


def record_ids(segment_index: int, first: int, count: int) -> np.ndarray:
    return np.arange(first, first + count, dtype=np.int64) + (segment_index << RECORD_BITS)


def split_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment index, record number) of each id."""
    return ids >> RECORD_BITS, ids & ((1 << RECORD_BITS) - 1)


@dataclasses.dataclass(frozen=True)
class Segment:
    """Records ``start`` up to ``stop`` (None: the end) of one file."""

    path: str
    compression: str | None
    start: int = 0
    stop: int | None = None
    expected_records: int | None = None  # the whole file's, from the manifest
    expected_bytes: int | None = None
    generation: Generation | None = None  # the dataset generation the read pinned (build directories)


def present_key(name: str) -> str:
    """The block key of a variable-length feature's presence flags (True where the record holds the feature)."""
    return f"{PRESENT_PREFIX}{name}"


def dense_layout(features: Mapping[str, Feature]) -> DenseLayout:
    """The packed layout of the record ids, every fixed-shape numeric feature and the VarLen features' presence flags."""
    dense: list[tuple[str, str, tuple[int, ...]]] = [(ID_KEY, "<i8", ())]
    dense += [
        (name, NUMPY_DTYPES[feature.dtype].str, feature.shape)
        for name, feature in features.items()
        if isinstance(feature, FixedLenFeature) and feature.dtype != "bytes"
    ]
    dense += [(present_key(name), "?", ()) for name, feature in features.items() if isinstance(feature, VarLenFeature)]
    return DenseLayout(tuple(dense))


@dataclasses.dataclass(frozen=True)
class BlockDecoder:
    """Decodes blocks of serialized Examples (or SequenceExamples) into columns, for the selected features only."""

    features: Mapping[str, Feature]
    # Hand out each record's bytes as feature RAW_KEY instead of decoding: a column of ``bytes`` objects, made once
    # here, which the shuffle buffer and the batches move as references (the caller gets these objects).
    raw: bool = False
    max_features: int | None = DEFAULT_MAX_FEATURES  # features one record may have (None: no limit)
    record_type: str = "Example"

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The (context) features' schema, built once per decoder, not per block (cached in the instance)."""
        return pa.schema([arrow_field(name, feature) for name, feature in self.features.items()
                          if not is_sequence_feature(feature)])

    @functools.cached_property
    def sequence_schema(self) -> pa.Schema:
        """The feature lists' schema (list<step> fields)."""
        return pa.schema([arrow_field(name, feature) for name, feature in self.features.items()
                          if is_sequence_feature(feature)])

    @functools.cached_property
    def layout(self) -> DenseLayout:
        return dense_layout(self.features)

    def decode(self, records: RecordBlock, path: str, ids: np.ndarray) -> Block:
        """The records' features (dense ones packed with the ids, see ``DenseLayout``)."""
        if self.raw:
            return self.layout.pack({RAW_KEY: Column(records.payload_objects()), ID_KEY: Column(ids)})
        spans = (records.data, records.starts, records.ends)
        if self.record_type == "Example" or len(self.sequence_schema):
            check_record_type(spans, self.record_type, lambda index: (path, int(records.offsets[index])))
        try:
            context, lists = self._decode_spans(spans, self.max_features)
        except RecordLimitError as exc:
            offset = int(records.offsets[exc.record]) if exc.record is not None else None
            raise RecordLimitError(
                f"{path}: the record at offset {offset} has more than {exc.limit} features; decoding one column per "
                f"feature would cost gigabytes. Pass open_dataset(max_features=...) a larger limit (or None) to read it, "
                "or raw=True for its bytes",
                record=exc.record,
                limit=exc.limit,
            ) from exc
        except (ExampleDecodeError, ArrowConversionError) as exc:
            raise self._locate_error(records, path, exc) from exc
        block = self._columns(context, lists)
        self._check_scalars(block, records, path)
        block[ID_KEY] = Column(ids)
        return self.layout.pack(block)

    def _columns(self, context: pa.RecordBatch, lists: pa.RecordBatch | None) -> Block:
        block: Block = {}
        for name, feature in self.features.items():
            if isinstance(feature, (FixedLenSequenceFeature, VarLenSequenceFeature)):
                assert lists is not None  # feature lists are read from SequenceExamples only (spec refuses others)
                block[name] = _sequence_column(lists.column(name), feature)
            else:
                array = context.column(name)
                block[name] = _to_column(array, feature)
                if isinstance(feature, VarLenFeature):
                    block[present_key(name)] = Column(_present(array))
        return block

    def _check_scalars(self, block: Block, records: RecordBlock, path: str) -> None:
        """A feature the spec says is one value where present (``VarLenFeature(scalar=True)``) holds no more."""
        for name, feature in self.features.items():
            if isinstance(feature, VarLenFeature) and feature.scalar:
                lengths = block[name].levels[0]
                if len(lengths) and lengths.max() > 1:
                    row = int(np.argmax(lengths > 1))
                    raise ExampleDecodeError(
                        f"{path}: the record at offset {int(records.offsets[row])} holds {int(lengths[row])} values of "
                        f"feature {name!r}, whose spec says one value (shape [] in the manifest); pass feature_spec= "
                        f"with VarLenFeature({feature.dtype!r}) to read every value"
                    )

    def _decode_spans(self, records: Any, max_features: int | None) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
        """(context or Example batch, feature-lists batch or None for Examples) of the records."""
        if self.record_type == "SequenceExample":
            return sequence_examples_to_record_batches(records, self.schema, self.sequence_schema, max_features=max_features)
        return examples_to_record_batch(records, self.schema, max_features=max_features), None

    def _locate_error(self, records: RecordBlock, path: str, exc: Exception) -> Exception:
        """Find the first failing record of a block to name its file and byte offset."""
        record_offsets = records.offsets.tolist()
        for i, record_offset in enumerate(record_offsets):
            try:
                self._decode_spans([records.payload(i)], None)
            except (ExampleDecodeError, ArrowConversionError) as single:
                return type(exc)(
                    f"{path}: the record at offset {record_offset} does not match the feature spec: {single}. "
                    "If the spec was inferred from the first records, pass feature_spec= (VarLenFeature or "
                    "VarLenSequenceFeature for features whose length varies) or columns= to skip the feature."
                )
        return type(exc)(f"{path}: records at offsets {record_offsets[0]}..{record_offsets[-1]}: {exc}")


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(byte length of each value, the values' bytes back to back) of a binary array without nulls inside."""
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[array.offset:array.offset + len(array) + 1]
    data_buffer = array.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return np.diff(offsets).astype(np.int64), data[int(offsets[0]):int(offsets[-1])]


_NUMPY_TYPES = {
    pa.type_for_alias(name): np.dtype(name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
}


def numpy_of(array: pa.Array) -> np.ndarray:
    """A numeric or boolean Arrow array without nulls as numpy, read from its buffers (numbers: without a copy).

    Not Arrow's ``to_numpy``: with pandas installed, its first call imports pandas (0.4 s, paid by
    every reader process on its first block, each time a dataset is opened).
    """
    dtype = _NUMPY_TYPES.get(array.type)
    boolean = pa.types.is_boolean(array.type)
    if array.null_count or (dtype is None and not boolean):
        return array.to_numpy(zero_copy_only=False)
    if not len(array):
        return np.zeros(0, dtype=bool if boolean else dtype)
    data = array.buffers()[1]
    if boolean:  # one bit a value, least significant first
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[array.offset:array.offset + len(array)].astype(bool)
    return np.frombuffer(data, dtype=dtype)[array.offset:array.offset + len(array)]


def _list_lengths(array: pa.Array) -> np.ndarray:
    """Each list's length as int64, 0 where the list is null (``fill_null`` imports pandas too: see ``numpy_of``)."""
    lengths = np.diff(numpy_of(array.offsets)).astype(np.int64)
    if array.null_count:
        lengths[~numpy_of(array.is_valid())] = 0
    return lengths


def _to_column(array: pa.Array, feature: ContextFeature) -> Column:
    """One decoded Arrow column as a ``Column`` (defaults filled in for absent fixed-length features)."""
    rows = len(array)
    if isinstance(feature, FixedLenFeature) and array.null_count:
        default = pa.scalar(_default_for(feature), type=array.type)
        array = pc.if_else(array.is_valid(), array, default)
    if isinstance(feature, FixedLenFeature):
        values = array if feature.shape == () else array.flatten()
        if feature.dtype == "bytes":
            lengths, data = _binary_parts(values)
            if feature.shape == ():
                return Column(data, (lengths,))
            return Column(data, (np.full(rows, feature.size, dtype=np.int64), lengths))
        return Column(numpy_of(values).reshape((rows,) + feature.shape))
    row_lengths = _list_lengths(array)
    values = array.flatten()
    if feature.dtype == "bytes":
        lengths, data = _binary_parts(values)
        return Column(data, (row_lengths, lengths))
    return Column(numpy_of(values), (row_lengths,))


def _present(array: pa.Array) -> np.ndarray:
    """True where the record holds the feature (a null list is an absent feature; an empty one is present)."""
    if not array.null_count:
        return np.ones(len(array), dtype=bool)
    return numpy_of(array.is_valid())


def _sequence_column(array: pa.Array, feature: SequenceFeature) -> Column:
    """A decoded list<step> column as a ``Column`` whose first level is each record's steps (0 where it lacks the list)."""
    steps = _list_lengths(array)
    offsets = numpy_of(array.offsets)
    step_values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    inner = _to_column(step_values, feature.step)
    return Column(inner.leaf, (steps, *inner.levels))


def _default_for(feature: FixedLenFeature):
    default = feature.default_value
    if feature.shape == ():
        return default
    flat = np.broadcast_to(np.asarray(default, dtype=object if feature.dtype == "bytes" else None), feature.shape).reshape(-1)
    return flat.tolist()


@dataclasses.dataclass
class SegmentBlock:
    """What a reader hands on: a block of consecutive records of one segment."""

    ids: np.ndarray
    block: Block | None  # None when reading ids only (fast-forwarding)
    skipped: list[SkippedRegion]


def read_segment(
    segment: Segment,
    segment_index: int,
    block_length: int,
    decoder: BlockDecoder | None,
    *,
    skip_corrupt: bool = False,
    first: int | None = None,
) -> Iterator[SegmentBlock]:
    """Blocks of up to ``block_length`` records of ``segment`` from record ``first`` (default: its start).

    Without a decoder only record ids come out, and no CRC is checked (fast-forwarding). Against
    the manifest (when the segment has its figures) the file's byte size is checked first, and
    its record count once the file's end is reached or missed: ``ShardMismatchError``.
    """
    first = segment.start if first is None else first
    limit = None if segment.stop is None else segment.stop - first
    if limit is not None and limit <= 0:
        return
    remote = is_object_store(segment.path)
    if not remote and segment.expected_bytes is not None and not os.path.lexists(segment.path):
        raise MissingShardError(segment.path)
    if segment.generation is None and not remote:
        check_shard_size(segment)
        offset, skip = _position_of(segment, first, segment.path)
        starts = _record_starts(segment, skip_corrupt, lambda: os.path.getsize(segment.path))
        yield from _read_blocks(segment, segment.path, segment_index, block_length, decoder, skip_corrupt,
                                first, limit, offset, skip, starts)
        return
    # Open, then find the start (the index is read by path), then prove both belong to the pinned run.
    # An object is read with range requests, the next one asked for while this one is decoded; its read index
    # (sized by the manifest, which the opened object must match) is requested while it is opened.
    indexed = in_background(_record_starts, segment, skip_corrupt, lambda: segment.expected_bytes) if (
        remote and segment.expected_bytes is not None) else None
    try:
        handle = open_to_read(segment.path, prefetch=True)
    except FileNotFoundError as error:  # gone between the check above and now (an object: not there)
        if segment.expected_bytes is None and remote:
            raise  # a file of a glob, not a manifest's shard: the store's "no such object" names it
        raise MissingShardError(segment.path) from error
    with handle:
        offset, skip = _position_of(segment, first, handle if remote else segment.path)
        starts = indexed.result() if indexed is not None else None
        if segment.generation is not None:
            segment.generation.check()
        check_shard_size(segment, opened_size(handle))
        if indexed is None:
            starts = _record_starts(segment, skip_corrupt, lambda: opened_size(handle))
        yield from _read_blocks(segment, handle, segment_index, block_length, decoder, skip_corrupt,
                                first, limit, offset, skip, starts)


# A shard with fewer records is walked without its read index: in a bucket the index costs a request, and
# walking 10,000 headers costs 3 ms of CPU.
INDEXED_STARTS_MIN_RECORDS = 10_000


def _record_starts(segment: Segment, skip_corrupt: bool, size: Callable[[], int]) -> np.ndarray | None:
    """The record starts of the segment's read index, for a sequential read to check against the headers instead
    of walking them one by one in Python (a fifth of a raw epoch's CPU); None where it would not be used."""
    count = segment.expected_records
    if segment.compression is not None or skip_corrupt or count is None or count < INDEXED_STARTS_MIN_RECORDS:
        return None
    return indexed_record_starts(segment.path, size(), count)


def _read_blocks(segment: Segment, source: Any, segment_index: int, block_length: int, decoder: BlockDecoder | None,
                 skip_corrupt: bool, first: int, limit: int | None, offset: int, skip: int,
                 starts: np.ndarray | None = None) -> Iterator[SegmentBlock]:
    """The blocks of ``read_segment`` from ``source`` (the segment's path, or its file opened and proven)."""
    skipped: list[SkippedRegion] = []  # filled by the framing layer as it skips damaged bytes
    blocks = record_blocks(
        source, segment.compression, offset, block_length, limit,
        verify=decoder is not None, skip_corrupt=skip_corrupt, on_skip=skipped.append, skip_records=skip,
        name=segment.path, record_starts=starts,
    )
    number = first
    skipped_any = False
    for records in blocks:
        count = records.num_records
        ids = record_ids(segment_index, number, count)
        number += count
        block = None if decoder is None else decoder.decode(records, segment.path, ids)
        yield SegmentBlock(ids, block, skipped[:])
        skipped_any = skipped_any or bool(skipped)
        skipped.clear()
    if skipped:
        yield SegmentBlock(record_ids(segment_index, number, 0), None, skipped[:])
    elif not skipped_any:  # records skipped as damaged cannot be counted
        check_shard_count(segment, number)


def _position_of(segment: Segment, first: int, source: Any) -> tuple[int, int]:
    """(byte offset, records still to skip from there) of record ``first``: via the read index and a header walk.

    ``source`` is the segment's path or its opened file (an object's: its read index is not used, the walk reads
    the headers from its start).
    """
    if not first:
        return 0, 0
    if segment.compression is not None:
        return 0, first  # a compressed stream cannot be entered in the middle
    offset, number = (0, 0) if is_object_store(segment.path) else _indexed_position(segment, first)
    return offset_of_record(source, offset, first - number), 0


def _indexed_position(segment: Segment, record: int) -> tuple[int, int]:
    """(byte offset, record number) of the checked index entry closest at or before ``record``, else (0, 0)."""
    return seek_position(segment.path, record, segment.expected_records)


def check_shard_size(segment: Segment, size: int | None = None) -> None:
    """The file's size (``size``, else a stat: cheap enough for every segment) against the manifest's."""
    if segment.expected_bytes is None:
        return
    try:
        size = input_size(segment.path) if size is None else size
    except OSError:
        return  # opening it reports why
    if size != segment.expected_bytes:
        raise ShardMismatchError(segment.path, "bytes", segment.expected_bytes, size)


def check_shard_count(segment: Segment, end: int) -> None:
    """After a read that stopped at record ``end``: the file's end must come exactly where the manifest says.

    An open-ended read stops at the file's end, so ``end`` is the file's count; a bounded read
    that stops short of its ``stop`` met the end early.
    """
    expected = segment.expected_records
    if expected is None:
        return
    if segment.stop is None or end < segment.stop:
        if end != expected:
            raise ShardMismatchError(segment.path, "records", expected, end)


def count_records(path: str, compression: str | None) -> int:
    """Records in a file: from its read index when it checks out, else by walking the record headers."""
    if is_object_store(path):
        with open_ranged(path, prefetch=True) as handle:
            blocks = record_blocks(cast(BinaryIO, handle), compression, 0, 1 << 16, None, verify=False, name=path)
            return sum(block.num_records for block in blocks)
    if compression is None:
        index = trusted_index(path)
        if index is not None:
            return index.num_records
    return sum(block.num_records for block in record_blocks(path, compression, 0, 1 << 16, None, verify=False))
