"""Reading one segment (a file, or a record range of one) as decoded blocks of consecutive records.

Framing and CRC checks go through ``tfrbeam.records.RecordReader``; decoding through the columnar
decoder with an Arrow schema built from the feature spec, so only the requested features are
decoded. Every block carries the ids of its records (segment index << 40 | record number), which
is what the exactly-once tests, resume and sharding reason about.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import os
from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.columnar_decode import examples_to_record_batch
from tfrbeam.dataset.columns import Block, Column
from tfrbeam.dataset.spec import Feature, FixedLenFeature, arrow_field
from tfrbeam.errors import ArrowConversionError, ExampleDecodeError
from tfrbeam.record_index import load_index
from tfrbeam.records import RecordReader, SkippedRegion

_LOG = logging.getLogger(__name__)

RECORD_BITS = 40
ID_KEY = "__id__"


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


@dataclasses.dataclass(frozen=True)
class BlockDecoder:
    """Decodes blocks of serialized Examples into columns, for the selected features only."""

    features: Mapping[str, Feature]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([arrow_field(name, feature) for name, feature in self.features.items()])

    def decode(self, data: bytes, offsets: np.ndarray, path: str, record_offsets: list[int]) -> Block:
        try:
            batch = examples_to_record_batch((data, offsets), self.schema)
        except (ExampleDecodeError, ArrowConversionError) as exc:
            raise self._locate_error(data, offsets, path, record_offsets, exc) from exc
        return {name: _to_column(batch.column(i), feature) for i, (name, feature) in enumerate(self.features.items())}

    def _locate_error(self, data: bytes, offsets: np.ndarray, path: str, record_offsets: list[int], exc: Exception) -> Exception:
        """Find the first failing record of a block to name its file and byte offset."""
        for i, record_offset in enumerate(record_offsets):
            try:
                examples_to_record_batch((data, offsets[i:i + 2]), self.schema)
            except (ExampleDecodeError, ArrowConversionError) as single:
                return type(exc)(
                    f"{path}: the record at offset {record_offset} does not match the feature spec: {single}. "
                    "If the spec was inferred from the first records, pass feature_spec= (VarLenFeature for "
                    "features whose length varies) or columns= to skip the feature."
                )
        return type(exc)(f"{path}: records at offsets {record_offsets[0]}..{record_offsets[-1]}: {exc}")


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(byte length of each value, the values' bytes back to back) of a binary array without nulls inside."""
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[array.offset:array.offset + len(array) + 1]
    data_buffer = array.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return np.diff(offsets).astype(np.int64), data[int(offsets[0]):int(offsets[-1])]


def _to_column(array: pa.Array, feature: Feature) -> Column:
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
        flat = values.to_numpy(zero_copy_only=False)
        return Column(flat.reshape((rows,) + feature.shape))
    row_lengths = array.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = array.flatten()
    if feature.dtype == "bytes":
        lengths, data = _binary_parts(values)
        return Column(data, (row_lengths, lengths))
    return Column(values.to_numpy(zero_copy_only=False), (row_lengths,))


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
    """Blocks of up to ``block_length`` records of ``segment`` from record ``first`` (default: its start)."""
    first = segment.start if first is None else first
    stop = segment.stop
    if stop is not None and first >= stop:
        return
    skipped: list[SkippedRegion] = []
    reader = _open_at(segment, first, skip_corrupt, skipped.append)
    with reader:
        records = reader.records_with_offsets()
        number = first
        while True:
            want = block_length if stop is None else min(block_length, stop - number)
            if want <= 0:
                return
            chunk = list(itertools.islice(records, want))
            if not chunk:
                if skipped:
                    yield SegmentBlock(record_ids(segment_index, number, 0), None, skipped)
                return
            ids = record_ids(segment_index, number, len(chunk))
            number += len(chunk)
            block = None
            if decoder is not None:
                offsets, payloads = zip(*chunk)
                lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
                bounds = np.zeros(len(payloads) + 1, dtype=np.int64)
                np.cumsum(lengths, out=bounds[1:])
                block = decoder.decode(b"".join(payloads), bounds, segment.path, list(offsets))
            yield SegmentBlock(ids, block, skipped)
            skipped = []
            if len(chunk) < want:
                return


def _open_at(segment: Segment, first: int, skip_corrupt: bool, on_skip) -> RecordReader:
    """A reader positioned at record ``first``: via the read index where one is current, else by walking headers."""
    if segment.compression is not None:
        # A compressed stream cannot be entered in the middle: decompress from the start and skip.
        reader = RecordReader(segment.path, segment.compression, skip_corrupt=skip_corrupt, on_skip=on_skip)
        for _ in itertools.islice(reader.records_with_offsets(), first):
            pass
        return reader
    offset, number = _indexed_position(segment.path, first) if first else (0, 0)
    if number < first:
        with RecordReader(segment.path, None, verify=False, start_offset=offset, skip_corrupt=skip_corrupt) as walker:
            for _ in itertools.islice(walker.records_with_offsets(), first - number):
                pass
            offset = walker.offset
    return RecordReader(segment.path, None, skip_corrupt=skip_corrupt, on_skip=on_skip, start_offset=offset)


def _indexed_position(path: str, record: int) -> tuple[int, int]:
    """(byte offset, record number) of the indexed record closest at or before ``record``, else (0, 0)."""
    try:
        stat = os.stat(path)
    except OSError:
        return 0, 0
    index = load_index(path, stat.st_size, stat.st_mtime)
    if index is None or not index.record_numbers:
        return 0, 0
    position = bisect.bisect_right(index.record_numbers, record) - 1
    if position < 0:
        return 0, 0
    return index.offsets[position], index.record_numbers[position]


def count_records(path: str, compression: str | None) -> int:
    """Records in a file: from its read index when current, else by walking the record headers."""
    if compression is None:
        try:
            stat = os.stat(path)
            index = load_index(path, stat.st_size, stat.st_mtime)
        except OSError:
            index = None
        if index is not None:
            return index.num_records
    with RecordReader(path, compression, verify=False) as reader:
        return sum(1 for _ in reader.records_with_offsets())
