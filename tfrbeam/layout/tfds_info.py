"""The files TFDS reads to load a dataset directory (``tfds.builder_from_directory``), from our manifest.

TFDS parses ``dataset_info.json`` strictly into its ``DatasetInfo`` proto and ``features.json`` into
its feature connectors. Both are plain JSON that TFDS's own ``DatasetInfo.write_to_directory`` writes;
this module writes the same fields without TensorFlow:

- ``dataset_info.json``: ``name``, ``version``, ``fileFormat: tfrecord`` and, per split, its shard
  lengths, bytes and a ``filepathTemplate`` naming its shards' common prefix literally
  (``train/train-{SHARD_X_OF_Y}.{FILEFORMAT}``, or ``train/train-gRUN-...`` for a replace's tagged names
  in a bucket: TFDS's template parser takes ``{SPLIT}`` once and needs no variable but the shard's);
- ``features.json``: a ``FeaturesDict`` whose entries map the manifest's features: int64 → ``int64``,
  float → ``float32``, bytes → ``string``; a scalar is a ``Scalar``, a fixed shape a ``Tensor`` of that
  shape, a variable-length list a ``Tensor`` of shape ``(-1,)``; a scalar or fixed shape some examples
  lack is ``optional``.

TFDS reads uncompressed TFRecord files of ``tf.train.Example`` only, so a compressed or SequenceExample
dataset is refused in one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest_schema import EXAMPLE, Manifest, Split
from tfrbeam.layout.names import TFDS_DATASET_INFO, TFDS_FEATURES

__all__ = ["check_tfds_identity", "tfds_files", "tfds_files_for", "tfds_files_of"]

_DTYPES = {"int64": "int64", "float": "float32", "bytes": "string"}
_SCALAR = "tensorflow_datasets.core.features.scalar.Scalar"
_TENSOR = "tensorflow_datasets.core.features.tensor_feature.Tensor"
_FEATURES_DICT = "tensorflow_datasets.core.features.features_dict.FeaturesDict"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # TFDS's dataset names: snake_case, as its registry requires
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_SHARD = re.compile(r"^(?P<prefix>[^{}]+-)(?P<index>[0-9]{5})-of-(?P<count>[0-9]{5})\.tfrecord$")


def check_tfds_identity(name: Any, version: Any, where: str) -> None:
    """``ConfigError`` unless ``name`` is a TFDS dataset name and ``version`` is ``MAJOR.MINOR.PATCH``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a TFDS dataset name (lower case letters, digits and "
                          "underscores, starting with a letter, e.g. my_dataset)")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ConfigError(f"{where}.version: {version!r} is not a TFDS version (MAJOR.MINOR.PATCH, e.g. 1.0.0)")


def tfds_files(manifest: Manifest, name: str, version: str = "1.0.0",
               where: str = "output.tfds") -> dict[str, bytes]:
    """TFDS's ``dataset_info.json`` and ``features.json`` for the dataset ``manifest`` describes, by file name."""
    check_tfds_identity(name, version, where)
    _check_loadable(manifest, where)
    info = {
        "fileFormat": "tfrecord",
        "name": name,
        "splits": [_split_info(split, where) for split in manifest.splits],
        "version": version,
    }
    features = {
        "featuresDict": {"features": {feature: _feature(entry) for feature, entry in (manifest.features or {}).items()}},
        "pythonClassName": _FEATURES_DICT,
    }
    return {TFDS_DATASET_INFO: _json_bytes(info), TFDS_FEATURES: _json_bytes(features)}


def tfds_files_of(manifest: Manifest) -> set[str]:
    """The names of the TFDS files beside the manifest (none unless it was built with ``output.tfds``)."""
    return {TFDS_DATASET_INFO, TFDS_FEATURES} if "tfds" in manifest.rest else set()


def tfds_files_for(manifest: Manifest) -> dict[str, bytes]:
    """The TFDS files a manifest with a ``tfds`` entry (``{"name", "version"}``) has beside it, by name."""
    identity = manifest.rest["tfds"]
    return tfds_files(manifest, identity["name"], identity["version"])


def _check_loadable(manifest: Manifest, where: str) -> None:
    if manifest.record_type != EXAMPLE:
        raise ConfigError(f"{where}: TFDS loads datasets of tf.train.Example only, and this build writes "
                          f"{manifest.record_type}s (remove {where})")
    if manifest.compression:
        raise ConfigError(f"{where}: TFDS reads uncompressed TFRecord files only, and this build writes "
                          f"{manifest.compression} ones (set output.compression to none, or remove {where})")


def _split_info(split: Split, where: str) -> dict[str, Any]:
    shards = split.shards
    matches = [_SHARD.match(shard.path) for shard in shards]
    prefixes = {match["prefix"] for match in matches if match}
    for index, (shard, match) in enumerate(zip(shards, matches)):
        if not match or len(prefixes) != 1 or int(match["index"]) != index or int(match["count"]) != len(shards):
            raise ConfigError(f"{where}: shard {shard.path!r} of split {split.name!r} does not follow its split's "
                              "PREFIX-NNNNN-of-NNNNN.tfrecord names, the one layout a TFDS template can describe")
    return {
        "filepathTemplate": (prefixes.pop() if prefixes else f"{split.name}/{split.name}-") + "{SHARD_X_OF_Y}.{FILEFORMAT}",
        "name": split.name,
        "numBytes": str(split.num_bytes),
        "shardLengths": [str(shard.num_examples) for shard in shards],
    }


def _feature(entry: Mapping[str, Any]) -> dict[str, Any]:
    shape = entry["shape"]
    tensor: dict[str, Any] = {"dtype": _DTYPES[entry["type"]], "encoding": "none"}
    if shape is None:
        tensor["shape"] = {"dimensions": ["-1"]}
    else:
        tensor["shape"] = {"dimensions": [str(size) for size in shape]} if shape else {}
        if not entry["always_present"]:
            tensor["optional"] = True
    return {"pythonClassName": _SCALAR if shape == [] else _TENSOR, "tensor": tensor}


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=4, sort_keys=True) + "\n").encode()
