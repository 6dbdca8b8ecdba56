"""What to read: the files of a dataset (a ``tfrbeam build`` directory or a glob) and its feature spec.

A build directory carries its manifest ``tfrbeam_dataset.json`` (``dataset_info.json`` if built before): splits,
shard files with record counts, the feature spec, compression, and whether its records are tf.train.Example or
SequenceExample.
Any other path is a glob of TFRecord files whose feature spec is given by the caller or
inferred from the first records, of the record type the caller names (Example by default).
"""

from __future__ import annotations

import dataclasses
import glob as globmod
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard, Union

import numpy as np
import pyarrow as pa

from tfrbeam.base.file_access import files_for
from tfrbeam.base.object_store import OBJECT_STORE_FILES, is_object_store, object_glob
from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES, examples_to_record_batch
from tfrbeam.codec.infer import infer_column
from tfrbeam.codec.kinds import ARROW_TYPES, FEATURE_TYPES
from tfrbeam.codec.sequence_decode import has_feature_lists, sequence_examples_to_record_batches
from tfrbeam.dataset.splits import record_ranges
from tfrbeam.errors import ArrowConversionError, ConfigError, ExampleDecodeError, RecordLimitError
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.manifest import find_manifest
from tfrbeam.layout.manifest_schema import RECORD_TYPES, SEQUENCE_EXAMPLE, Manifest
from tfrbeam.layout.names import MANIFEST_NAME, MANIFEST_NAMES
from tfrbeam.tfrecord.records import RecordReader, normalize_compression

_LOG = logging.getLogger(__name__)

DTYPES = FEATURE_TYPES
_DTYPE_ALIASES = {
    "int64": "int64", "int": "int64", "int32": "int64",
    "float": "float", "float32": "float", "float64": "float",
    "bytes": "bytes", "string": "bytes", "str": "bytes", "binary": "bytes",
}
NUMPY_DTYPES: dict[str, np.dtype] = {"int64": np.dtype(np.int64), "float": np.dtype(np.float32), "bytes": np.dtype(object)}
INFER_RECORDS = 1000


def _dtype(value: Any, where: str) -> str:
    key = str(getattr(value, "name", value)).lower()
    if key not in _DTYPE_ALIASES:
        raise ConfigError(f"{where}: dtype {value!r} is not one of int64, float, bytes")
    return _DTYPE_ALIASES[key]


def _normalize_fixed(spec: Any) -> None:
    """Shape as a tuple of ints (none negative) and dtype by its canonical name, set on a frozen spec."""
    where = type(spec).__name__
    object.__setattr__(spec, "shape", tuple(int(size) for size in spec.shape))
    object.__setattr__(spec, "dtype", _dtype(spec.dtype, where))
    if any(size < 0 for size in spec.shape):
        raise ConfigError(f"{where} shape {spec.shape} has a negative size")


@dataclasses.dataclass(frozen=True)
class FixedLenFeature:
    """A feature with the same number of values in every record, read as a dense array.

    ``shape=()`` is one value per record (batch shape ``[B]``); ``shape=(16,)`` gives ``[B, 16]``.
    A record that lacks the feature gets ``default_value`` when one is given, else it is an error.
    """

    shape: tuple[int, ...]
    dtype: str
    default_value: Any = None

    def __post_init__(self) -> None:
        _normalize_fixed(self)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values per record (none when absent), read as ``Ragged``.

    ``scalar=True`` says a record holds at most one value (a manifest's shape [] that some records
    omit): padded to the batch's longest, it reads as ``[B]`` (and its mask ``[B]``), as Keras wants.
    """

    dtype: str
    scalar: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype, "VarLenFeature"))


@dataclasses.dataclass(frozen=True)
class FixedLenSequenceFeature:
    """A SequenceExample feature list whose every step has ``shape`` (``()``: one value per step).

    Read as ``Ragged`` over steps: values ``[steps of the batch, *shape]``, lengths the steps of
    each record (0 when a record lacks the list); ``padded`` gives ``[B, T, *shape]``.
    """

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        _normalize_fixed(self)

    @property
    def step(self) -> FixedLenFeature:
        """One step, as an Example feature of that shape."""
        return FixedLenFeature(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class VarLenSequenceFeature:
    """A SequenceExample feature list whose steps hold any number of values: Ragged over steps of Ragged values."""

    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype, "VarLenSequenceFeature"))

    @property
    def step(self) -> VarLenFeature:
        return VarLenFeature(self.dtype)


ContextFeature = FixedLenFeature | VarLenFeature
SequenceFeature = FixedLenSequenceFeature | VarLenSequenceFeature
Feature = ContextFeature | SequenceFeature


def feature_from_manifest(name: str, entry: Mapping[str, Any]) -> ContextFeature:
    """A manifest entry ``{"type", "shape", "always_present"}`` as a feature spec.

    ``shape`` [] or [n] with ``always_present`` is fixed-length; anything else (null shape, or a
    feature some rows omit) is variable-length, a ``scalar`` one when its shape is [].
    """
    dtype, shape = _manifest_entry(f"features.{name}", entry)
    if shape is None:
        return VarLenFeature(dtype, scalar=entry.get("shape") in ([], ()))
    return FixedLenFeature(shape, dtype)


def sequence_feature_from_manifest(name: str, entry: Mapping[str, Any]) -> SequenceFeature:
    """A manifest ``sequence_features`` entry (``shape`` per step) as a feature-list spec.

    ``shape`` [] or [n] with ``always_present`` (every step of every record has a value) is a
    fixed step shape; anything else has steps of any length.
    """
    dtype, shape = _manifest_entry(f"sequence_features.{name}", entry)
    return VarLenSequenceFeature(dtype) if shape is None else FixedLenSequenceFeature(shape, dtype)


def _manifest_entry(where: str, entry: Mapping[str, Any]) -> tuple[str, tuple[int, ...] | None]:
    """(dtype, fixed shape or None for variable length) of a manifest feature entry."""
    if not isinstance(entry, Mapping) or "type" not in entry:
        raise ConfigError(f"{where}: expected a mapping with 'type' (and 'shape', 'always_present'), got {entry!r}")
    dtype = _dtype(entry["type"], where)
    shape = entry.get("shape")
    return dtype, tuple(shape) if shape is not None and entry.get("always_present", True) else None


def normalize_feature_spec(spec: Mapping[str, Any]) -> dict[str, Feature]:
    """Accept FixedLen / VarLen (Sequence) Feature values, manifest-style mappings or a bare dtype string (VarLen)."""
    out: dict[str, Feature] = {}
    for name, value in spec.items():
        if isinstance(value, (FixedLenFeature, VarLenFeature, FixedLenSequenceFeature, VarLenSequenceFeature)):
            out[name] = value
        elif isinstance(value, Mapping):
            out[name] = feature_from_manifest(name, value)
        elif isinstance(value, str):
            out[name] = VarLenFeature(value)
        else:
            raise ConfigError(
                f"feature_spec[{name!r}]: {value!r} is not a FixedLenFeature, VarLenFeature, dtype string "
                "or {'type': ..., 'shape': ...} mapping"
            )
    return out


def arrow_field(name: str, feature: Feature) -> pa.Field:
    """The Arrow field the columnar decoder fills for ``feature`` (nullable where a record may lack it).

    A feature list's field is a list of its step's field (null where a record lacks the list).
    """
    if isinstance(feature, (FixedLenSequenceFeature, VarLenSequenceFeature)):
        return pa.field(name, pa.list_(arrow_field(name, feature.step).type), nullable=True)
    value_type = ARROW_TYPES[feature.dtype]
    if isinstance(feature, VarLenFeature):
        return pa.field(name, pa.list_(value_type), nullable=True)
    nullable = feature.default_value is not None
    if feature.shape == ():
        return pa.field(name, value_type, nullable=nullable)
    return pa.field(name, pa.list_(value_type, feature.size), nullable=nullable)


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """One TFRecord file of the dataset, with its record count when the manifest knows it."""

    path: str
    compression: str | None
    num_records: int | None = None
    num_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Source:
    """Everything ``open_dataset`` resolved from its path: files, feature spec and where it came from."""

    files: tuple[ShardFile, ...]
    features: dict[str, Feature]
    manifest: Manifest | None
    split: str | None
    inferred: bool
    record_type: str = "Example"
    generation: Generation | None = None  # the dataset's manifest as pinned when it was opened (build directories)
    # A sliced split string's record range (start, stop) of each file, in step with ``files``; None: whole files.
    ranges: tuple[tuple[int, int], ...] | None = None

    @property
    def num_records(self) -> int | None:
        if self.ranges is not None:
            return sum(stop - start for start, stop in self.ranges)
        counts = [shard.num_records for shard in self.files]
        known = [count for count in counts if count is not None]
        return sum(known) if len(known) == len(counts) else None


PathSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


def resolve_source(
    path: PathSpec,
    split: str | None,
    feature_spec: Mapping[str, Any] | None,
    compression: str | None,
    skip_corrupt: bool,
    max_features: int | None = DEFAULT_MAX_FEATURES,
    record_type: str | None = None,
) -> Source:
    """Find the files and feature spec of ``path`` (a build directory, its manifest, a glob or a list of files).

    ``record_type`` ("Example" or "SequenceExample") is the manifest's for a build directory
    (passing another is an error), else the caller's, by default "Example".
    """
    if record_type is not None and record_type not in RECORD_TYPES:
        raise ConfigError(f"record_type={record_type!r} is not one of {', '.join(map(repr, RECORD_TYPES))}")
    manifest_path = _manifest_path(path)
    if manifest_path is not None:
        return _checked(_from_manifest(manifest_path, split, feature_spec, compression, record_type))
    if split is not None:
        if isinstance(path, (str, os.PathLike)) and not globmod.has_magic(os.fspath(path)) and not _exists(os.fspath(path)):
            where = "" if is_object_store(os.fspath(path)) else f" (relative paths are from {os.getcwd()})"
            raise ConfigError(f"{os.fspath(path)!r} does not exist{where}")
        raise ConfigError(
            f"split={split!r} needs a directory written by `tfrbeam build` (with {MANIFEST_NAME}); "
            f"{path!r} has no manifest, so pass the split's files (a glob) instead"
        )
    paths = _expand(path)
    files = tuple(ShardFile(item, normalize_compression(compression, item)) for item in paths)
    kind = record_type or "Example"
    if feature_spec is not None:
        return _checked(Source(files, normalize_feature_spec(feature_spec), None, None, False, kind))
    features = infer_feature_spec(files, skip_corrupt=skip_corrupt, max_features=max_features, record_type=kind)
    return Source(files, features, None, None, True, kind)


def _checked(source: Source) -> Source:
    """Feature-list specs are for SequenceExamples only."""
    if source.record_type == "Example":
        lists = sorted(name for name, feature in source.features.items() if is_sequence_feature(feature))
        if lists:
            raise ConfigError(
                f"features {lists} are feature lists (Fixed/VarLenSequenceFeature), which only SequenceExamples have; "
                "pass record_type='SequenceExample' to read SequenceExamples"
            )
    return source


def is_sequence_feature(feature: Feature) -> TypeGuard[SequenceFeature]:
    return isinstance(feature, (FixedLenSequenceFeature, VarLenSequenceFeature))


def _exists(path: str) -> bool:
    return OBJECT_STORE_FILES.exists(path) if is_object_store(path) else os.path.exists(path)


def _manifest_path(path: PathSpec) -> str | None:
    if not isinstance(path, (str, os.PathLike)):
        return None
    text = os.fspath(path)
    if is_object_store(text):
        return _object_manifest_path(text)
    # Anything at the manifest's name is the manifest: a FIFO, a device or a link there is refused when it is read
    # (naming what it is), never taken for "no manifest".
    if os.path.isdir(text):
        return find_manifest(text)
    if os.path.basename(text) in MANIFEST_NAMES and os.path.lexists(text):
        return text
    return None


def _object_manifest_path(text: str) -> str | None:
    """The manifest of a dataset in a bucket: ``text`` itself, or the one under ``text``; None when neither exists."""
    if text.rstrip("/").rsplit("/", 1)[-1] in MANIFEST_NAMES:
        return text if OBJECT_STORE_FILES.is_file(text) else None
    return find_manifest(text, OBJECT_STORE_FILES)


def _expand_objects(pattern: str) -> list[str]:
    """An object, the objects a glob names, or the objects directly under a prefix (hidden and ``_`` names left out)."""
    if globmod.has_magic(pattern):
        return object_glob(pattern)
    if OBJECT_STORE_FILES.is_file(pattern):
        return [pattern]
    prefix = pattern.rstrip("/") + "/"
    return sorted(
        path for path in OBJECT_STORE_FILES.list_files(pattern)
        if "/" not in path[len(prefix):] and not path[len(prefix):].startswith((".", "_"))
    )


def _expand(path: PathSpec) -> list[str]:
    patterns = [os.fspath(path)] if isinstance(path, (str, os.PathLike)) else [os.fspath(item) for item in path]
    found: list[str] = []
    for pattern in patterns:
        if is_object_store(pattern):
            matches = _expand_objects(pattern)
        elif os.path.isdir(pattern):
            matches = sorted(
                os.path.join(pattern, name) for name in os.listdir(pattern)
                if not name.startswith((".", "_")) and os.path.isfile(os.path.join(pattern, name))
            )
        elif os.path.isfile(pattern):
            matches = [pattern]
        else:
            matches = sorted(item for item in globmod.glob(pattern) if os.path.isfile(item))
        if not matches:
            raise ConfigError(f"no TFRecord files match {pattern!r}")
        found.extend(matches)
    return found


def read_pinned_manifest(manifest_path: str) -> DatasetDirectory:
    """The dataset whose manifest is ``manifest_path``, read and checked once (``DatasetDirectory``); its
    ``generation`` pins it (the bytes' digest and run id)."""
    try:
        return DatasetDirectory.of_manifest(manifest_path, files_for(manifest_path))
    except OSError as exc:
        raise ConfigError(f"{manifest_path}: cannot read the dataset manifest: {exc}") from exc


def _from_manifest(
    manifest_path: str, split: str | None, feature_spec: Mapping[str, Any] | None, compression: str | None,
    record_type: str | None = None,
) -> Source:
    dataset = read_pinned_manifest(manifest_path)
    root, manifest, stored_type = dataset.path, dataset.manifest, dataset.record_type
    if record_type is not None and record_type != stored_type:
        raise ConfigError(
            f"{root} holds {stored_type} records (its manifest says so), but record_type={record_type!r} was "
            "passed; leave record_type out to read what the manifest says"
        )
    if split is None:
        if len(manifest.splits) != 1:
            raise ConfigError(f"{root} has splits {sorted(manifest.split_names)}: pass split= one of them")
        split = manifest.split_names[0]
    codec = dataset.compression_for(compression)

    def shard_file(name: str, number: int) -> ShardFile:
        shard = dataset.shard(name, number)
        return ShardFile(shard.path, codec, shard.num_examples, shard.num_bytes)

    ranges: tuple[tuple[int, int], ...] | None = None
    if split in manifest.split_names:
        files = tuple(shard_file(split, number) for number in range(len(manifest.split(split).shards)))
    else:  # a split string: TFDS's slices, "+" and even parts (tfrbeam.dataset.splits)
        lengths = {entry.name: [shard.num_examples for shard in entry.shards] for entry in manifest.splits}
        try:
            pieces = record_ranges(split, lengths)
        except ConfigError as error:
            raise ConfigError(f"{root}: {error}") from error
        files = tuple(shard_file(piece.split, piece.shard) for piece in pieces)
        ranges = tuple((piece.start, piece.stop) for piece in pieces)
    if feature_spec is not None:
        features = normalize_feature_spec(feature_spec)
    elif stored_type == SEQUENCE_EXAMPLE:
        features = _manifest_sequence_features(manifest, manifest_path)
    else:
        features = {name: feature_from_manifest(name, entry) for name, entry in (manifest.features or {}).items()}
    return Source(files, features, manifest, split, False, stored_type, dataset.generation, ranges)


def _manifest_sequence_features(manifest: Manifest, manifest_path: str) -> dict[str, Feature]:
    """The context features, then the feature lists, of a SequenceExample manifest (one name space)."""
    context = manifest.context_features or {}
    lists = manifest.sequence_features or {}
    both = sorted(set(context) & set(lists))
    if both:
        raise ConfigError(
            f"{manifest_path}: {both} are both context features and feature lists; the reader gives every feature "
            "under its name, so pass feature_spec= naming the ones to read"
        )
    features: dict[str, Feature] = {name: feature_from_manifest(name, entry) for name, entry in context.items()}
    features.update((name, sequence_feature_from_manifest(name, entry)) for name, entry in lists.items())
    return features


def infer_feature_spec(
    files: Sequence[ShardFile], records: int = INFER_RECORDS, skip_corrupt: bool = False,
    max_features: int | None = DEFAULT_MAX_FEATURES, record_type: str = "Example",
) -> dict[str, Feature]:
    """Guess each feature's spec from the first ``records`` records of the first files.

    A feature with exactly one value in every sampled record is a scalar, with n values in every
    one a fixed ``[n]``, anything else (incl. absent somewhere) variable-length; a feature list's
    step shape is guessed the same way from its steps. Features with no kind set in any sampled
    record are left out (their type is unknown).
    """
    payloads, sources = _first_records(files, records, skip_corrupt)
    check_record_type(payloads, record_type, lambda index: (sources[index][0], sources[index][2]))
    try:
        if record_type == SEQUENCE_EXAMPLE:
            context, lists = sequence_examples_to_record_batches(payloads, max_features=max_features)
        else:
            context, lists = examples_to_record_batch(payloads, max_features=max_features), None
    except RecordLimitError as exc:
        where: tuple[str, int | None] = sources[exc.record][:2] if exc.record is not None else (files[0].path, None)
        path, record_number = where
        raise RecordLimitError(
            f"{path}: record {record_number} has more than {exc.limit} features, too many to infer a feature spec "
            "column by column; pass open_dataset(max_features=...) a larger limit (or None), or raw=True",
            record=exc.record, limit=exc.limit,
        ) from exc
    except (ArrowConversionError, ExampleDecodeError) as exc:
        raise ConfigError(
            f"cannot infer a feature spec from the first {len(payloads)} records of {files[0].path}: {exc}; "
            f"pass feature_spec= (or raw=True for payloads that are not tf.train.{record_type}s)"
        ) from exc
    features: dict[str, Feature] = dict(_inferred(zip(context.schema.names, context.columns), len(payloads)))
    if lists is not None:
        steps = [(name, lists.column(name).flatten()) for name in lists.schema.names]  # each step as a row
        for name, step in _inferred(steps, len(payloads), "feature list"):
            if name in features:
                raise ConfigError(f"{name!r} is both a context feature and a feature list of {files[0].path}; pass "
                                  "feature_spec= naming the ones to read (each feature comes out under its name)")
            features[name] = (FixedLenSequenceFeature(step.shape, step.dtype) if isinstance(step, FixedLenFeature)
                              else VarLenSequenceFeature(step.dtype))
    _LOG.info("inferred feature spec from %d records: %s", len(payloads), features)
    return features


def _first_records(
    files: Sequence[ShardFile], records: int, skip_corrupt: bool
) -> tuple[list[bytes], list[tuple[str, int, int]]]:
    """Up to ``records`` payloads from the first files, and the (file, record number, offset) of each."""
    payloads: list[bytes] = []
    sources: list[tuple[str, int, int]] = []
    for shard in files:
        with RecordReader(shard.path, shard.compression, skip_corrupt=skip_corrupt) as reader:
            for number, (offset, payload) in enumerate(reader.records_with_offsets()):
                payloads.append(payload)
                sources.append((shard.path, number, offset))
                if len(payloads) >= records:
                    break
        if len(payloads) >= records:
            break
    if not payloads:
        raise ConfigError(
            f"cannot infer a feature spec: the files ({len(files)}, first {files[0].path if files else None!r}) hold no records"
        )
    return payloads, sources


def check_record_type(records: Any, record_type: str, where: Callable[[int], tuple[str, Any]]) -> None:
    """Refuse SequenceExamples read as Examples, and (when feature lists are read) the reverse.

    The two are told apart by the feature_lists field (2), which only SequenceExamples have.
    ``where(i)`` gives the (file, offset) of record i, for the one-line error.
    """
    lists = has_feature_lists(records)
    if record_type == "Example" and lists.any():
        path, offset = where(int(np.argmax(lists)))
        raise ExampleDecodeError(
            f"{path}: the record at offset {offset} is a tf.train.SequenceExample (it has feature_lists), not a "
            "tf.train.Example: pass record_type='SequenceExample' to read SequenceExamples"
        )
    if record_type == "SequenceExample" and len(lists) and not lists.any():
        path, offset = where(0)
        raise ExampleDecodeError(
            f"{path}: the record at offset {offset} has no feature_lists, nor has any record read with it: these are "
            "tf.train.Examples, not SequenceExamples: pass record_type='Example' to read Examples"
        )


def _inferred(
    columns: Iterable[tuple[str, pa.Array]], sampled: int, what: str = "feature"
) -> Iterator[tuple[str, ContextFeature]]:
    """The spec the one inference (``codec.infer``) gives each list<kind> column of a decoded sample."""
    for name, column in columns:
        feature = infer_column(name, column)
        if feature.kind is None:
            _LOG.warning(
                "%s %r has no kind in the first %d records; leaving it out (pass feature_spec to read it)",
                what, name, sampled,
            )
            continue
        yield name, (VarLenFeature(feature.kind) if feature.shape is None else FixedLenFeature(feature.shape, feature.kind))
