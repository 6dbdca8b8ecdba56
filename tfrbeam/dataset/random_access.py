"""Any record of a dataset in one seek: ``open_random_access`` for Grain, PyTorch map-style loaders and friends.

The object it returns is Grain's ``RandomAccessDataSource`` (``__len__``, ``__getitem__``) and a
PyTorch map-style ``Dataset`` (plus ``__getitems__``, which PyTorch's DataLoader and Grain's
batched reads call). Record ``i`` is the i-th in manifest order (shards in the manifest's order,
records in file order; for a glob, files sorted by name). Each shard is memory-mapped on first
use and located through its read index (``tfrbeam.tfrecord.read_index``: checked against the file,
rebuilt from the headers where missing or stale). A batch of indices is read in file order,
every data CRC checked, and decoded with one columnar decode call. Reads take no lock once a
shard is open, so threads share one object; pickling drops the maps, which each process
reopens.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Literal, cast

import crc32c
import numpy as np

from tfrbeam.base.bounded_read import open_regular
from tfrbeam.base.object_store import coalesced_ranges, is_object_store, open_ranged
from tfrbeam.dataset.columns import Ragged
from tfrbeam.dataset.output import to_numpy
from tfrbeam.dataset.reader import RAW_KEY, BlockDecoder
from tfrbeam.dataset.spec import FixedLenFeature, PathSpec, ShardFile, resolve_source
from tfrbeam.errors import (
    ConfigError,
    CorruptRecordError,
    RandomAccessError,
    ShardMismatchError,
)
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.paths import escapes
from tfrbeam.tfrecord.blocks import TRAILING_SLACK, RecordBlock, length_crcs_match, record_blocks
from tfrbeam.tfrecord.read_index import bucket_record_starts, index_path_for, load_offsets
from tfrbeam.tfrecord.records import FOOTER_SIZE, HEADER_SIZE, RECORD_OVERHEAD, mask_crcs

_LOG = logging.getLogger(__name__)


def open_random_access(
    path: PathSpec,
    split: str | None = None,
    columns: Sequence[str] | None = None,
    raw: bool = False,
    feature_spec: Mapping[str, Any] | None = None,
    record_type: Literal["Example", "SequenceExample"] | None = None,
) -> RandomAccessDataset:
    """Open a dataset (a ``tfrbeam build`` directory and ``split``, or a glob / list of files) for reads by record number.

    ``split`` may be a TFDS split string (``"train[1000:2000]"``, ``"train[:10%]+eval"``): record 0 is the slice's first.

    Records come back as ``{feature: numpy value}`` dicts (only ``columns`` when given; the spec is the
    manifest's, ``feature_spec``, or inferred), or as bytes with ``raw=True``. The shards must be
    uncompressed. ``record_type`` is as for ``open_dataset``; a feature list of a SequenceExample
    comes back as its steps: ``[T, *shape]``, or ``Ragged`` (values, each step's length) when steps vary.
    """
    spec = {RAW_KEY: FixedLenFeature((), "bytes")} if raw else feature_spec
    source = resolve_source(path, split, spec, "auto", False, record_type=None if raw else record_type)
    compressed = [shard.path for shard in source.files if shard.compression is not None]
    if compressed:
        raise RandomAccessError(
            f"{compressed[0]} is {source.files[0].compression}-compressed: random access needs uncompressed shards "
            f"({len(compressed)} of {len(source.files)} are compressed). Rebuild with compression: none, or read "
            "sequentially with open_dataset"
        )
    features = dict(source.features)
    if columns is not None and not raw:
        missing = [name for name in columns if name not in features]
        if missing:
            raise ConfigError(f"columns {missing} are not features of this dataset; it has {sorted(features)}")
        features = {name: features[name] for name in columns}
    return RandomAccessDataset(source.files, features, raw, description=_describe(path, source.split),
                               record_type=source.record_type, generation=source.generation, ranges=source.ranges)


def _describe(path: PathSpec, split: str | None) -> str:
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else f"{len(path)} paths"
    return text if split is None else f"{text}, split={split!r}"


class _Shard:
    """One open shard: its bytes (memory-mapped) and every record's start.

    With a ``generation`` (a build directory) the shard is opened and its index read first, then
    proven to belong to the pinned run (as ``read_segment`` does). The read index is written only
    where it stays inside ``root`` (the dataset directory, else the file's own directory).
    """

    def __init__(self, shard: ShardFile, generation: Generation | None = None, root: str | None = None):
        self.path = shard.path
        with open_regular(shard.path, "TFRecord file") as handle:  # a FIFO or device: one line, never a hang
            size = os.fstat(handle.fileno()).st_size
            if shard.num_bytes is not None and size != shard.num_bytes:
                raise ShardMismatchError(shard.path, "bytes", shard.num_bytes, size)
            self.map: mmap.mmap | None = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.raw = np.frombuffer(self.map, dtype=np.uint8) if self.map is not None else np.zeros(0, np.uint8)
        index_root = root if root is not None else os.path.dirname(shard.path) or "."
        confined = escapes(index_root, index_path_for(shard.path)) is None
        self.offsets = load_offsets(shard.path, self.raw, write=confined)
        if generation is not None:
            generation.check()
        found = len(self.offsets) - 1
        if shard.num_records is not None and found != shard.num_records:
            raise ShardMismatchError(shard.path, "records", shard.num_records, found)

    def payloads(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(payload bytes back to back, each payload's length) of these records, every data CRC checked."""
        heads = self.offsets[records]
        starts = heads + HEADER_SIZE
        ends = self.offsets[records + 1] - FOOTER_SIZE
        view = memoryview(self.raw)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
        # One slice per record: cheaper than a vectorised gather for records of a few hundred bytes.
        parts = list(map(view.__getitem__, map(slice, starts.tolist(), ends.tolist())))
        computed = np.fromiter(map(crc32c.crc32c, parts), dtype=np.uint32, count=len(parts))
        stored = self.raw[ends[:, None] + np.arange(FOOTER_SIZE)].view("<u4").ravel()
        wrong = np.flatnonzero(mask_crcs(computed) != stored)
        if wrong.size:
            bad = int(wrong[0])
            raise CorruptRecordError(self.path, int(heads[bad]), "data_crc", f"record {int(records[bad])} of the shard")
        return np.frombuffer(b"".join(parts), dtype=np.uint8), ends - starts


@dataclasses.dataclass(frozen=True)
class _Misplaced:
    """A record header that is not where a shard's record starts say (an index of another version of the shard)."""

    offset: int
    detail: str


class _ObjectShard:
    """One shard in a bucket: every record's start, and its records read with range requests (several in parallel).

    The starts come from the shard's read index when the bucket holds one for an object of this size (its CRC,
    first and last offset and spacing checked up front; each record's header is checked as the record is read, and
    a header that disagrees has the starts rebuilt from the headers), else from a walk of the headers: one
    sequential read of the shard. Checking every header up front, as for a local file, would read the whole shard.
    Nothing is written to the bucket.
    """

    def __init__(self, shard: ShardFile, generation: Generation | None = None):
        self.path = shard.path
        self._expected = shard.num_records
        self._lock = threading.Lock()
        self.file = open_ranged(shard.path)
        try:
            if shard.num_bytes is not None and self.file.size != shard.num_bytes:
                raise ShardMismatchError(shard.path, "bytes", shard.num_bytes, self.file.size)
            indexed = self._indexed_offsets()
            self.walked = indexed is None
            self.offsets = self._walked_offsets() if indexed is None else indexed
            if generation is not None:
                generation.check()
            self._check_count()
        except BaseException:
            self.file.close()
            raise

    def _indexed_offsets(self) -> np.ndarray | None:
        """The record starts of the shard's read index in the bucket when it describes an object of this size and count;
        else None."""
        return bucket_record_starts(self.path, self.file.size, self._expected)

    def _walked_offsets(self) -> np.ndarray:
        """Every record start and the size, by one sequential read of the record headers (a damaged file raises)."""
        with open_ranged(self.path, prefetch=True) as handle:
            blocks = record_blocks(cast(BinaryIO, handle), None, 0, 1 << 16, None, verify=False, name=self.path)
            pieces = [block.offsets for block in blocks]
            size = handle.size
        return np.concatenate(pieces + [np.array([size], dtype=np.int64)]).astype(np.int64)

    def _check_count(self) -> None:
        found = len(self.offsets) - 1
        if self._expected is not None and found != self._expected:
            raise ShardMismatchError(self.path, "records", self._expected, found)

    def payloads(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(payload bytes back to back, each payload's length) of these (sorted) records, every CRC checked."""
        offsets, walked = self.offsets, self.walked
        result = self._read(offsets, records)
        if isinstance(result, _Misplaced) and not walked:
            with self._lock:
                if self.offsets is offsets:
                    _LOG.warning("the read index of %s does not match the shard (%s); walking its record headers "
                                 "instead", self.path, result.detail)
                    self.offsets, self.walked = self._walked_offsets(), True
                    self._check_count()
            result = self._read(self.offsets, records)
        if isinstance(result, _Misplaced):  # the headers were walked: the shard changed since
            raise CorruptRecordError(self.path, result.offset, "length_crc", result.detail)
        return result

    def _read(self, offsets: np.ndarray, records: np.ndarray) -> tuple[np.ndarray, np.ndarray] | _Misplaced:
        """The records' payloads, or where a record's header is not what ``offsets`` say it is."""
        heads, tails = offsets[records], offsets[records + 1]
        spans = coalesced_ranges(heads.tolist(), tails.tolist())
        span_starts = np.array([start for start, _ in spans], dtype=np.int64)
        bases = np.concatenate(([0], np.cumsum([length for _, length in spans])))
        raw = np.frombuffer(b"".join(self.file.read_ranges(spans)), dtype=np.uint8)
        span_of = np.searchsorted(span_starts, heads, side="right") - 1
        at = heads - span_starts[span_of] + bases[span_of]  # each record's place in raw
        headers = raw[at[:, None] + np.arange(HEADER_SIZE)]
        lengths = np.ascontiguousarray(headers[:, :8]).view("<u8").ravel().astype(np.int64)
        wrong = np.flatnonzero(lengths + RECORD_OVERHEAD != tails - heads)
        if wrong.size:
            head, span = int(heads[wrong[0]]), int(tails[wrong[0]] - heads[wrong[0]])
            return _Misplaced(head, f"the record at offset {head} holds {int(lengths[wrong[0]])} payload bytes, "
                                    f"its starts say {span - RECORD_OVERHEAD}")
        if not length_crcs_match(lengths, np.ascontiguousarray(headers[:, 8:]).view("<u4").ravel()):
            return _Misplaced(int(heads[0]), f"a length CRC does not match among the records at offsets "
                                             f"{int(heads[0])}..{int(heads[-1])}")
        starts = at + HEADER_SIZE
        ends = starts + lengths
        view = memoryview(raw)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
        parts = list(map(view.__getitem__, map(slice, starts.tolist(), ends.tolist())))
        computed = np.fromiter(map(crc32c.crc32c, parts), dtype=np.uint32, count=len(parts))
        stored = raw[ends[:, None] + np.arange(FOOTER_SIZE)].view("<u4").ravel()
        bad = np.flatnonzero(mask_crcs(computed) != stored)
        if bad.size:
            first = int(bad[0])
            raise CorruptRecordError(self.path, int(heads[first]), "data_crc", f"record {int(records[first])} of the shard")
        return np.frombuffer(b"".join(parts), dtype=np.uint8), lengths


class RandomAccessDataset:
    """Records of a dataset by number: ``len``, ``[i]``, ``__getitems__(indices)``; thread-safe and picklable.

    ``ranges`` (a split string's record range of each file, in step with ``files``) numbers the records of those
    ranges one after another; a file named by several ranges is opened once.
    """

    def __init__(self, files: Sequence[ShardFile], features: Mapping[str, Any], raw: bool, description: str = "",
                 record_type: str = "Example", generation: Generation | None = None,
                 ranges: Sequence[tuple[int, int]] | None = None):
        self._files = tuple(dict.fromkeys(files))
        number_of = {file: number for number, file in enumerate(self._files)}
        self._piece_files = np.array([number_of[file] for file in files], dtype=np.int64)
        self._generation = generation  # a build directory's pinned manifest: every shard opened is proven to be its
        self._features = dict(features)
        self._raw = raw
        self._description = description
        self._decoder = BlockDecoder(self._features, raw=False, record_type=record_type)
        self._reset()
        if ranges is None:
            counts = [shard.num_records for shard in files]
            if any(count is None for count in counts):  # no manifest: the read indexes give the counts
                counts = [self._shard(int(number)).offsets.size - 1 for number in self._piece_files]
            ranges = [(0, int(count)) for count in counts]  # type: ignore[arg-type]
        self._piece_starts = np.array([start for start, _ in ranges], dtype=np.int64)
        lengths = np.array([stop - start for start, stop in ranges], dtype=np.int64)
        self._bounds = np.concatenate(([0], np.cumsum(lengths)))

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Shard | _ObjectShard] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_open", "_pid"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _shard(self, number: int) -> _Shard | _ObjectShard:
        if self._pid != os.getpid():  # forked: the parent's lock may be held, its maps are its own
            self._reset()
        shard = self._open.get(number)
        if shard is None:
            with self._lock:
                shard = self._open.get(number)
                if shard is None:
                    root = self._generation.root if self._generation is not None else None
                    file = self._files[number]
                    shard = self._open[number] = (_ObjectShard(file, self._generation) if is_object_store(file.path)
                                                  else _Shard(file, self._generation, root))
        return shard

    def __len__(self) -> int:
        return int(self._bounds[-1])

    def __repr__(self) -> str:
        what = "raw bytes" if self._raw else f"features={list(self._features)}"
        return f"RandomAccessDataset({self._description!r}: {len(self):,} records in {len(self._files)} shards, {what})"

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, slice):
            return self.__getitems__(range(len(self))[index])
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices``, in that order (read in file order, decoded in one call)."""
        wanted = self._positions(indices)
        if not wanted.size:
            return []
        unique, inverse = np.unique(wanted, return_inverse=True)
        # Ranges are numbered one after another, so the sorted indices visit them in order.
        range_numbers = np.searchsorted(self._bounds, unique, side="right") - 1
        shard_numbers = self._piece_files[range_numbers]
        pieces, lengths = [], []
        for number in np.unique(range_numbers).tolist():
            chosen = unique[range_numbers == number] - self._bounds[number] + self._piece_starts[number]
            data, sizes = self._shard(int(self._piece_files[number])).payloads(chosen)
            pieces.append(data)
            lengths.append(sizes)
        sizes = np.concatenate(lengths)
        bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=bounds[1:])
        records = self._raw_records(pieces, bounds) if self._raw else self._decoded(pieces, bounds, unique, shard_numbers)
        return [records[position] for position in inverse.tolist()]

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        total = len(self)
        wanted = np.where(wanted < 0, wanted + total, wanted)
        if wanted.size and (wanted.min() < 0 or wanted.max() >= total):
            bad = next(int(index) for index in np.asarray(indices).reshape(-1).tolist() if not -total <= int(index) < total)
            raise IndexError(f"record index {bad} is out of range for {total} records")
        return wanted

    @staticmethod
    def _raw_records(pieces: list[np.ndarray], bounds: np.ndarray) -> list[bytes]:
        joined = np.concatenate(pieces).tobytes() if pieces else b""
        return [joined[begin:end] for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist())]

    def _decoded(
        self, pieces: list[np.ndarray], bounds: np.ndarray, records: np.ndarray, shard_numbers: np.ndarray
    ) -> list[dict[str, Any]]:
        names = sorted({os.path.basename(self._files[number].path) for number in np.unique(shard_numbers).tolist()})
        return decode_rows(self._decoder, pieces, bounds, records, ", ".join(names))


def decode_rows(
    decoder: BlockDecoder, pieces: list[np.ndarray], bounds: np.ndarray, ids: np.ndarray, where: str
) -> list[dict[str, Any]]:
    """Payloads (``pieces`` back to back, split at ``bounds``) decoded in one call, as one dict per record.

    ``where`` names the files in error messages; ``ids`` label the records.
    """
    data = np.concatenate(pieces + [np.zeros(TRAILING_SLACK, np.uint8)])
    block = RecordBlock(data, bounds[:-1], bounds[1:], ids)
    decoded = decoder.decode(block, where, ids)
    columns = to_numpy(decoder.layout.unpack(decoded), decoder.features, {})
    return _rows(columns, len(ids))


def _per_record(value: Ragged) -> list[Any]:
    """Each record's rows of a Ragged: an array, or a Ragged of its steps when the values are Ragged too."""
    if isinstance(value.values, Ragged):
        return value.to_list()
    offsets = value.offsets.tolist()
    return [value.values[begin:end] for begin, end in zip(offsets[:-1], offsets[1:])]


def _rows(columns: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """A batch of columns as one dict per record (numpy scalars, row arrays, bytes)."""
    per_feature = [_per_record(value) if isinstance(value, Ragged) else list(value) for value in columns.values()]
    names = list(columns)
    if not names:
        return [{} for _ in range(count)]
    return list(map(dict, map(zip, itertools.repeat(names), zip(*per_feature))))
