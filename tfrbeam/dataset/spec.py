"""What to read: the files of a dataset (a ``tfrbeam build`` directory or a glob) and its feature spec.

A build directory carries ``dataset_info.json`` (splits, shard files with record counts, the
feature spec, compression). Any other path is a glob of TFRecord files whose feature spec is
given by the caller or inferred from the first records.
"""

from __future__ import annotations

import dataclasses
import glob as globmod
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
import pyarrow as pa

from tfrbeam.columnar_decode import DEFAULT_MAX_FEATURES, examples_to_record_batch
from tfrbeam.errors import ArrowConversionError, ConfigError, ExampleDecodeError, RecordLimitError
from tfrbeam.manifest import MANIFEST_NAME, parse_manifest
from tfrbeam.records import RecordReader, normalize_compression

_LOG = logging.getLogger(__name__)

DTYPES = ("int64", "float", "bytes")
_DTYPE_ALIASES = {
    "int64": "int64", "int": "int64", "int32": "int64",
    "float": "float", "float32": "float", "float64": "float",
    "bytes": "bytes", "string": "bytes", "str": "bytes", "binary": "bytes",
}
_ARROW_TYPES = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}
NUMPY_DTYPES: dict[str, np.dtype] = {"int64": np.dtype(np.int64), "float": np.dtype(np.float32), "bytes": np.dtype(object)}
INFER_RECORDS = 1000


def _dtype(value: Any, where: str) -> str:
    key = str(getattr(value, "name", value)).lower()
    if key not in _DTYPE_ALIASES:
        raise ConfigError(f"{where}: dtype {value!r} is not one of int64, float, bytes")
    return _DTYPE_ALIASES[key]


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
        object.__setattr__(self, "shape", tuple(int(size) for size in self.shape))
        object.__setattr__(self, "dtype", _dtype(self.dtype, "FixedLenFeature"))
        if any(size < 0 for size in self.shape):
            raise ConfigError(f"FixedLenFeature shape {self.shape} has a negative size")

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values per record (none when absent), read as ``Ragged``."""

    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _dtype(self.dtype, "VarLenFeature"))


Feature = FixedLenFeature | VarLenFeature


def feature_from_manifest(name: str, entry: Mapping[str, Any]) -> Feature:
    """A manifest entry ``{"type", "shape", "always_present"}`` as a feature spec.

    ``shape`` [] or [n] with ``always_present`` is fixed-length; anything else (null shape, or a
    feature some rows omit) is variable-length.
    """
    where = f"features.{name}"
    if not isinstance(entry, Mapping) or "type" not in entry:
        raise ConfigError(f"{where}: expected a mapping with 'type' (and 'shape', 'always_present'), got {entry!r}")
    dtype = _dtype(entry["type"], where)
    shape = entry.get("shape")
    if shape is not None and entry.get("always_present", True):
        return FixedLenFeature(tuple(shape), dtype)
    return VarLenFeature(dtype)


def normalize_feature_spec(spec: Mapping[str, Any]) -> dict[str, Feature]:
    """Accept FixedLenFeature / VarLenFeature values, manifest-style mappings or a bare dtype string (VarLen)."""
    out: dict[str, Feature] = {}
    for name, value in spec.items():
        if isinstance(value, (FixedLenFeature, VarLenFeature)):
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
    """The Arrow field the columnar decoder fills for ``feature`` (nullable where a record may lack it)."""
    value_type = _ARROW_TYPES[feature.dtype]
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
    manifest: dict | None
    split: str | None
    inferred: bool

    @property
    def num_records(self) -> int | None:
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
) -> Source:
    """Find the files and feature spec of ``path`` (a build directory, its manifest, a glob or a list of files)."""
    manifest_path = _manifest_path(path)
    if manifest_path is not None:
        return _from_manifest(manifest_path, split, feature_spec, compression)
    if split is not None:
        if isinstance(path, (str, os.PathLike)) and not os.path.exists(path) and not globmod.has_magic(os.fspath(path)):
            raise ConfigError(f"{os.fspath(path)!r} does not exist (relative paths are from {os.getcwd()})")
        raise ConfigError(
            f"split={split!r} needs a directory written by `tfrbeam build` (with {MANIFEST_NAME}); "
            f"{path!r} has no manifest, so pass the split's files (a glob) instead"
        )
    paths = _expand(path)
    files = tuple(ShardFile(item, normalize_compression(compression, item)) for item in paths)
    if feature_spec is not None:
        return Source(files, normalize_feature_spec(feature_spec), None, None, False)
    return Source(files, infer_feature_spec(files, skip_corrupt=skip_corrupt, max_features=max_features), None, None, True)


def _manifest_path(path: PathSpec) -> str | None:
    if not isinstance(path, (str, os.PathLike)):
        return None
    text = os.fspath(path)
    if os.path.isdir(text) and os.path.isfile(os.path.join(text, MANIFEST_NAME)):
        return os.path.join(text, MANIFEST_NAME)
    if os.path.basename(text) == MANIFEST_NAME and os.path.isfile(text):
        return text
    return None


def _expand(path: PathSpec) -> list[str]:
    patterns = [os.fspath(path)] if isinstance(path, (str, os.PathLike)) else [os.fspath(item) for item in path]
    found: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
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


def read_manifest(manifest_path: str) -> dict:
    """The checked ``dataset_info.json`` at ``manifest_path`` (``tfrbeam.manifest`` reads and checks it)."""
    try:
        with open(manifest_path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(f"{manifest_path}: cannot read the dataset manifest: {exc}") from exc
    return parse_manifest(data, manifest_path)


def _from_manifest(
    manifest_path: str, split: str | None, feature_spec: Mapping[str, Any] | None, compression: str | None
) -> Source:
    root = os.path.dirname(manifest_path)
    manifest = read_manifest(manifest_path)
    splits = manifest.get("splits") or {}
    if split is None:
        if len(splits) != 1:
            raise ConfigError(f"{root} has splits {sorted(splits)}: pass split= one of them")
        split = next(iter(splits))
    if split not in splits:
        raise ConfigError(f"{root} has no split {split!r}; it has {sorted(splits)}")
    stored = manifest.get("compression")
    codec = normalize_compression(stored if compression == "auto" else compression)
    files = tuple(
        ShardFile(
            os.path.join(root, shard["path"]), codec, int(shard["num_examples"]),
            int(shard["num_bytes"]) if shard.get("num_bytes") is not None else None,
        )
        for shard in splits[split]["shards"]
    )
    if feature_spec is not None:
        features = normalize_feature_spec(feature_spec)
    else:
        features = {name: feature_from_manifest(name, entry) for name, entry in manifest.get("features", {}).items()}
    return Source(files, features, manifest, split, False)


def infer_feature_spec(
    files: Sequence[ShardFile], records: int = INFER_RECORDS, skip_corrupt: bool = False,
    max_features: int | None = DEFAULT_MAX_FEATURES,
) -> dict[str, Feature]:
    """Guess each feature's spec from the first ``records`` records of the first files.

    A feature with exactly one value in every sampled record is a scalar, with n values in every
    one a fixed ``[n]``, anything else (incl. absent somewhere) variable-length. Features with no
    kind set in any sampled record are left out (their type is unknown).
    """
    payloads: list[bytes] = []
    sources: list[tuple[str, int]] = []  # (file, record number in it) of each payload, for error messages
    for shard in files:
        with RecordReader(shard.path, shard.compression, skip_corrupt=skip_corrupt) as reader:
            for number, payload in enumerate(reader):
                payloads.append(payload)
                sources.append((shard.path, number))
                if len(payloads) >= records:
                    break
        if len(payloads) >= records:
            break
    if not payloads:
        raise ConfigError(
            f"cannot infer a feature spec: the files ({len(files)}, first {files[0].path if files else None!r}) hold no records"
        )
    try:
        batch = examples_to_record_batch(payloads, max_features=max_features)
    except RecordLimitError as exc:
        where: tuple[str, int | None] = sources[exc.record] if exc.record is not None else (files[0].path, None)
        path, record_number = where
        raise RecordLimitError(
            f"{path}: record {record_number} has more than {exc.limit} features, too many to infer a feature spec "
            "column by column; pass open_dataset(max_features=...) a larger limit (or None), or raw=True",
            record=exc.record, limit=exc.limit,
        ) from exc
    except (ArrowConversionError, ExampleDecodeError) as exc:
        raise ConfigError(
            f"cannot infer a feature spec from the first {len(payloads)} records of {files[0].path}: {exc}; "
            "pass feature_spec= (or raw=True for payloads that are not tf.train.Examples)"
        ) from exc
    features: dict[str, Feature] = {}
    for name, column in zip(batch.schema.names, batch.columns):
        value_type = column.type.value_type
        if pa.types.is_null(value_type):
            _LOG.warning(
                "feature %r has no kind in the first %d records; leaving it out (pass feature_spec to read it)",
                name,
                len(payloads),
            )
            continue
        dtype = "int64" if pa.types.is_integer(value_type) else "float" if pa.types.is_floating(value_type) else "bytes"
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        # Always empty is variable-length too: Arrow cannot read a fixed_size_list of size 0 (SIGFPE).
        if column.null_count or len(set(lengths.tolist())) != 1 or lengths[0] == 0:
            features[name] = VarLenFeature(dtype)
        else:
            width = int(lengths[0])
            features[name] = FixedLenFeature(() if width == 1 else (width,), dtype)
    _LOG.info("inferred feature spec from %d records: %s", len(payloads), features)
    return features
