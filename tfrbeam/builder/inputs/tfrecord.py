"""TFRecord input: tf.train.Example records of an existing tfrbeam dataset (read through its manifest) or of a glob of
TFRecord files, decoded as SourceBatches to be re-split, re-shuffled, re-sharded, projected or cast.

A dataset directory's manifest is data found on disk, not config: it is read and checked by
tfrbeam.layout (``DatasetDirectory``: the manifest's validation, every shard path confined, see docs/trust.md),
and any problem is a ConfigError naming the manifest and its key before the pipeline starts. Its
features give the schema the records are decoded as. A glob's schema is inferred by decoding the
first records (tfrecord_schema): a feature with exactly one value wherever it is present is a
scalar, any other a list; absent in some record, it is nullable.

Records are framed and CRC-checked by tfrbeam.tfrecord (a damaged or truncated file is an
InputError naming the file and byte offset), decoded many at once by
tfrbeam.codec.decode.examples_to_record_batch with the schema projected to the columns read; a
block that does not decode is decoded record by record to name its bad records (file and
1-based record number) as bad rows. Large uncompressed files with a current read index (the
``.tfrbeam-index/`` a build writes) are read in record ranges (tfrecord_pieces), others whole.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tfrbeam.beam import filesystem
from tfrbeam.builder.config.schema import InputConfig
from tfrbeam.builder.features.convert import TIMESTAMP, BadRow, FeatureSpec
from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.batch import SourceBatch
from tfrbeam.builder.inputs.files import InputFile, list_inputs
from tfrbeam.codec.infer import FeatureSample
from tfrbeam.codec.kinds import ARROW_TYPES
from tfrbeam.errors import (
    ArrowConversionError,
    ConfigError,
    ExampleDecodeError,
    InputError,
    ManifestError,
    RecordError,
    RecordLimitError,
    ShardMismatchError,
)
from tfrbeam.layout.dataset_dir import DatasetDirectory, DatasetShard
from tfrbeam.layout.manifest import manifest_path
from tfrbeam.layout.manifest_schema import EXAMPLE
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.tfrecord.blocks import record_blocks
from tfrbeam.tfrecord.read_index import trusted_index
from tfrbeam.tfrecord.records import normalize_compression

__all__ = [
    "dataset_manifest",
    "file_compression",
    "read_tfrecord_file",
    "read_tfrecord_piece",
    "shard_records",
    "tfrecord_holds_records",
    "tfrecord_inputs",
    "tfrecord_pieces",
    "tfrecord_pieces_and_records",
    "tfrecord_schema",
]

_LOG = logging.getLogger(__name__)

_BLOCK_RECORDS = 4096  # records decoded per examples_to_record_batch call (one SourceBatch)
_SAMPLE_RECORDS = 10_000  # records decoded to infer a glob's schema (as many as inputs.sample.SAMPLE_ROWS)
_BAD_RAW_BYTES = 64 << 10  # a bad record's first bytes kept (base64) as its raw text in the dead letters
_DECLARED_KINDS = {**ARROW_TYPES, TIMESTAMP: pa.int64()}  # a declared type's kind in the records
_DECODE_ERRORS = (ExampleDecodeError, ArrowConversionError, RecordLimitError)
_FANOUT = 16  # parts a block holding a bad record is decoded in, until each bad record stands alone

Piece = tuple[int, "int | None", int]  # (start offset, stop offset or None: the end, records before the start)


# ------------------------------------------------------------------------------------ the dataset


def dataset_manifest(path: str) -> DatasetDirectory | None:
    """The dataset directory ``path`` is (its manifest read and checked), None when it holds no manifest.

    A manifest that is damaged, unreadable or not of Example records is a ConfigError naming it.
    """
    if any(char in path for char in "*?["):
        return None
    try:
        dataset = DatasetDirectory.find(path, filesystem.BEAM_FILES)
    except ManifestError as error:
        raise ConfigError(f"input.path: {error}") from error
    except OSError as error:
        raise ConfigError(f"input.path: {manifest_path(path, filesystem.BEAM_FILES)}: cannot read the dataset "
                          f"manifest: {error}") from error
    if dataset is not None and dataset.record_type != EXAMPLE:
        raise ConfigError(f"input.path: {dataset.manifest_path}: the dataset holds {dataset.record_type} records; "
                          "input.format tfrecord reads tf.train.Example records only (read a SequenceExample dataset "
                          "with tfrbeam.dataset instead)")
    return dataset


def tfrecord_inputs(input_config: InputConfig) -> list[InputFile]:
    """The files a tfrecord input reads: a dataset's shards of input.splits (every split when left out), each
    confined to the dataset directory, in manifest order; or the files a glob matches."""
    dataset = dataset_manifest(input_config.path)
    if dataset is None:
        if input_config.tfrecord.splits is not None:
            raise ConfigError(f"input.splits: {input_config.path!r} is not a dataset directory (it holds no "
                              f"{MANIFEST_NAME}); input.splits picks splits of a dataset")
        return list_inputs(input_config.path)
    wanted = input_config.tfrecord.splits or dataset.split_names
    unknown = [name for name in wanted if name not in dataset.split_names]
    if unknown:
        raise ConfigError(f"input.splits: {', '.join(map(repr, unknown))} is not a split of {dataset.manifest_path} "
                          f"(splits: {', '.join(dataset.split_names)})")
    try:
        shards = dataset.shards(wanted)
    except ManifestError as error:
        raise ConfigError(f"input.path: {error}") from error
    files = [_shard_file(shard, f"{dataset.manifest_path}: splits.{shard.split}.shards[{shard.number}]")
             for shard in shards]
    if not files:
        raise ConfigError(f"input.path: {dataset.manifest_path} lists no shards in splits {', '.join(wanted)}")
    return files


def shard_records(input_config: InputConfig) -> dict[str, int]:
    """Each shard of a dataset input (by path, as tfrecord_inputs gives it) and the records its manifest counts;
    {} for a glob. The reader checks a shard it reads to its end against it."""
    dataset = dataset_manifest(input_config.path)
    if dataset is None:
        return {}
    wanted = [name for name in input_config.tfrecord.splits or dataset.split_names if name in dataset.split_names]
    return {shard.path: shard.num_examples for shard in dataset.shards(wanted)}


def _shard_file(shard: DatasetShard, key: str) -> InputFile:
    """A shard the manifest names (its path proven inside the dataset directory) that exists and has the size the
    manifest gives it."""
    matches = [meta for meta in filesystem.match(shard.path).values() if meta.path == shard.path]
    if not matches:
        raise ConfigError(f"input.path: {key}.path: {shard.path!r} does not exist; the dataset is incomplete "
                          "(tfrbeam verify checks it)")
    size = int(matches[0].size_in_bytes)
    if shard.num_bytes is not None and shard.num_bytes != size:
        raise ConfigError(f"input.path: {key}.num_bytes: {ShardMismatchError(shard.path, 'bytes', shard.num_bytes, size)}")
    return InputFile(shard.path, size, getattr(matches[0], "last_updated_in_seconds", None))


# ------------------------------------------------------------------------------------- the schema


def tfrecord_schema(input_config: InputConfig, files: Sequence[InputFile], sample_records: int = _SAMPLE_RECORDS,
                    declared: Sequence[FeatureSpec] | None = None) -> pa.Schema:
    """The schema the records are decoded as: a dataset's manifest features, or a glob's inferred from its first
    records (sample_records of them, in path order) with the declared features none of them holds added as lists
    of their type's kind (read from the records that hold them)."""
    dataset = dataset_manifest(input_config.path)
    if dataset is not None:
        return manifest_schema(dataset.manifest.features or {})
    schema = _sampled_schema(input_config, files, sample_records)
    for spec in declared or ():
        kind = _DECLARED_KINDS.get(spec.type or "")
        if spec.source not in schema.names and spec.source_path is None and kind is not None:
            _LOG.info("%s: no sampled record holds feature %r; it is read as a list of %s", input_config.path,
                      spec.source, kind)
            schema = schema.append(pa.field(spec.source, pa.list_(kind)))
    return schema


def manifest_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    """A manifest's features as Arrow fields: shape [] a scalar, [n] a fixed-size list, null a list; nullable unless
    always present."""
    fields = []
    for name, entry in features.items():
        value_type = ARROW_TYPES[entry["type"]]
        shape = entry.get("shape")
        if shape == []:
            arrow_type = value_type
        elif shape is not None and len(shape) == 1:
            arrow_type = pa.list_(value_type, int(shape[0]))
        else:
            arrow_type = pa.list_(value_type)
        fields.append(pa.field(name, arrow_type, nullable=not entry.get("always_present", False)))
    return pa.schema(fields)


def _sampled_schema(input_config: InputConfig, files: Sequence[InputFile], sample_records: int) -> pa.Schema:
    """The schema of a glob's first records as the one inference (``codec.infer``) sees them: each feature a list
    of the kind most records hold (records of another kind: bad rows), a scalar where every record holding it
    holds one value, nullable where one lacks it. Features with no kind in the sample are left out (logged)."""
    sample = FeatureSample()
    for item in files:
        for batch in _sample_batches(item.path, file_compression(input_config, item.path), sample_records - sample.records):
            sample.add_batch(batch)
        if sample.records >= sample_records:
            break
    fields = []
    for name, feature in sorted(sample.features().items()):
        if feature.majority_kind is None:
            _LOG.warning("%s: feature %r has no value in the first %d records; it is left out", input_config.path,
                         name, sample.records)
            continue
        value_type = ARROW_TYPES[feature.majority_kind]
        fields.append(pa.field(name, value_type if feature.one_value_each else pa.list_(value_type),
                               nullable=not feature.always_present))
    return pa.schema(fields)


def _sample_batches(path: str, compression: str | None, limit: int) -> Iterator[pa.RecordBatch]:
    """A file's first records (up to limit) decoded without a schema; a block whose records disagree on a feature's
    kind (or holds a bad record) one record at a time, leaving out those that do not decode."""
    with _opened(path) as source:
        for block in record_blocks(source, compression, 0, _BLOCK_RECORDS, limit, name=path):
            try:
                yield _decode((block.data, block.starts, block.ends))
                continue
            except _DECODE_ERRORS:
                pass  # decoded one by one below
            for index in range(block.num_records):
                try:
                    yield _decode([block.payload(index)])
                except _DECODE_ERRORS:
                    continue  # a bad row when the build reads it


# --------------------------------------------------------------------------------------- reading


def file_compression(input_config: InputConfig, path: str) -> str | None:
    """A file's compression: input.compression, or with "auto" its name's (.gz gzip, .zlib zlib) or a local file's
    first bytes' (``normalize_compression``)."""
    return normalize_compression(input_config.tfrecord.compression, path)


def tfrecord_pieces(path: str, size: int, split_bytes: int, compression: str | None) -> list[Piece]:
    """The record ranges a file is read in: a local uncompressed file over split_bytes with a current read index
    (see tfrecord.read_index.trusted_index) in ranges of about split_bytes cut at its entries; any other whole."""
    return tfrecord_pieces_and_records(path, size, split_bytes, compression)[0]


def tfrecord_pieces_and_records(path: str, size: int, split_bytes: int,
                                compression: str | None) -> tuple[list[Piece], int | None]:
    """tfrecord_pieces, and the records the file's read index counts (None: a file read whole, which has none)."""
    whole: list[Piece] = [(0, None, 0)]
    if compression is not None or size <= split_bytes or filesystem.scheme_of(path) is not None:
        return whole, None
    index = trusted_index(path, None, lambda index: _cuts(index.offsets, split_bytes))
    if index is None or not index.offsets:
        return whole, None
    cuts = _cuts(index.offsets, split_bytes)
    starts = [index.offsets[position] for position in cuts]
    return [(start, stop, index.record_numbers[position])
            for position, start, stop in zip(cuts, starts, [*starts[1:], None])], index.num_records


def _cuts(offsets: Sequence[int], split_bytes: int) -> list[int]:
    """The index entries a file is cut at: the first, then each first at least split_bytes past the cut before (only
    these are checked against the data, see read_index.trusted_index)."""
    cuts = [0]
    for position, offset in enumerate(offsets):
        if offset >= offsets[cuts[-1]] + split_bytes:
            cuts.append(position)
    return cuts


def read_tfrecord_piece(path: str, start: int, stop: int | None, records_before: int, schema: pa.Schema | None,
                        compression: str | None, columns: Sequence[str] | None = None, *,
                        on_block: Callable[[int, int], None] | None = None, expected_records: int | None = None
                        ) -> Iterator[SourceBatch]:
    """The records from byte start (a record start) to stop (None: the end) as batches of ``schema`` projected to
    ``columns`` (None schema: inferred list columns); lines are 1-based record numbers in the file, counted from
    records_before. on_block(records, bytes) is told of every block read (the progress counter). A file read to
    its end that holds other than expected_records records (its manifest's count) is a ShardMismatchError."""
    if schema is not None and columns is not None:
        missing = [name for name in columns if name not in schema.names]
        if missing:
            raise InputError(f"{path}: has no feature {', '.join(map(repr, missing))} (features: "
                             f"{', '.join(schema.names)})")
        schema = pa.schema([schema.field(name) for name in dict.fromkeys(columns)])
    if schema is not None:  # a record lacking a feature is a null: its on_null decides (a bad row only for error)
        schema = pa.schema([field_.with_nullable(True) for field_ in schema])
    read = _batches(path, start, stop, records_before, schema, compression, on_block,
                    expected_records if stop is None else None)
    return read_ahead(read, "tfrbeam-tfrecord-read")


def read_tfrecord_file(path: str, schema: pa.Schema | None, compression: str | None,
                       columns: Sequence[str] | None = None) -> Iterator[SourceBatch]:
    """Every record of a file (see read_tfrecord_piece)."""
    return read_tfrecord_piece(path, 0, None, 0, schema, compression, columns)


def tfrecord_holds_records(path: str, compression: str | None) -> bool:
    """Whether a TFRecord file holds a record (its first one framed and checked)."""
    with _opened(path) as source:
        return next(record_blocks(source, compression, 0, 1, 1, name=path), None) is not None


def _batches(path: str, start: int, stop: int | None, records_before: int, schema: pa.Schema | None,
             compression: str | None, on_block: Callable[[int, int], None] | None,
             expected_records: int | None) -> Generator[SourceBatch, None, None]:
    number = records_before + 1
    with _opened(path) as source:
        blocks = record_blocks(source, compression, start, _BLOCK_RECORDS, stop_offset=stop, name=path)
        while True:
            try:
                block = next(blocks, None)
            except RecordError as error:
                raise InputError(f"{error} The file is damaged or cut short: restore or rebuild it, or leave it out "
                                 "of input.path.") from error
            if block is None:
                break
            if on_block is not None:
                on_block(block.num_records, block.end_offset - int(block.offsets[0]))
            yield _decoded(path, block, number, schema)
            number += block.num_records
    if expected_records is not None and number - 1 != expected_records:
        raise ShardMismatchError(path, "records", expected_records, number - 1)


def _opened(path: str):
    """A local path as it is (record_blocks opens it); another filesystem's file opened through Beam."""
    if filesystem.scheme_of(path) is None:
        return contextlib.nullcontext(path)
    return filesystem.open_read(path)


def _decoded(path: str, block, first: int, schema: pa.Schema | None) -> SourceBatch:
    """A block's records decoded at once; when that fails, parts of it are decoded until each bad record stands
    alone (_bad_records), and those are bad rows naming their number."""
    lines = np.arange(first, first + block.num_records, dtype=np.int64)
    try:
        batch = _decode((block.data, block.starts, block.ends), schema=schema)
        return SourceBatch(path=path, lines=lines, batch=batch)
    except _DECODE_ERRORS:
        pass  # a bad record in the block: found below
    payloads = [block.payload(index) for index in range(block.num_records)]
    problems = _bad_records(payloads, list(range(len(payloads))), schema)
    bad = tuple(BadRow(path, int(lines[index]), _reason(error), _raw(payloads[index]))
                for index, error in sorted(problems.items()))
    good = [index for index in range(len(payloads)) if index not in problems]
    batch = _decode([payloads[index] for index in good], schema=schema) if schema is not None or good else \
        pa.RecordBatch.from_pylist([])
    return SourceBatch(path=path, lines=lines[good], batch=batch, bad_rows=bad)


def _bad_records(payloads: list[bytes], indices: list[int], schema: pa.Schema | None) -> dict[int, Exception]:
    """The records among indices that do not decode, with why: a failing run is decoded in _FANOUT parts until each
    bad record stands alone, so a block with a few bad records costs a few decodes of it, not one per record."""
    try:
        _decode([payloads[index] for index in indices], schema=schema)
        return {}
    except _DECODE_ERRORS as error:
        if len(indices) == 1:
            return {indices[0]: error}
    step = -(-len(indices) // _FANOUT)
    found: dict[int, Exception] = {}
    for start in range(0, len(indices), step):
        found.update(_bad_records(payloads, indices[start:start + step], schema))
    return found


def _decode(records: Any, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """examples_to_record_batch, imported on first use: a build of other formats never loads the decoder."""
    from tfrbeam.codec.decode import examples_to_record_batch

    return examples_to_record_batch(records, schema=schema)


def _reason(error: Exception) -> str:
    text = str(error).removeprefix("record 0: ")
    return f"not a tf.train.Example of the input's features: {text}"


def _raw(payload: bytes) -> str:
    """A bad record's raw text for the dead letters: its bytes in base64 (the first _BAD_RAW_BYTES of them)."""
    cut = " (cut)" if len(payload) > _BAD_RAW_BYTES else ""
    return f"base64:{base64.b64encode(payload[:_BAD_RAW_BYTES]).decode('ascii')}{cut}"
