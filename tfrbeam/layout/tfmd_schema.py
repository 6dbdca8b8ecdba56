"""The dataset's features as a TensorFlow Metadata schema (``schema.pbtxt``, what TFDV, TFT and TFX's SchemaGen use), and back.

A pure mapping between the manifest's feature entries (``{"type", "shape", "always_present"}``) and
``tensorflow_metadata.proto.v0.schema_pb2.Schema``, chosen so that TFT's ``schema_as_feature_spec``
of the schema is the manifest's ``parse_example_spec``:

- type: int64 INT, float FLOAT, bytes BYTES;
- a feature every example has: ``presence {min_fraction: 1 min_count: 1}``, and with one shape
  ``shape`` (no dims for a scalar, ``dim {size: n}`` for n values): TFT's ``FixedLenFeature``;
- a feature some examples lack: no presence, ``value_count {min: n max: n}`` when it holds n values
  where present; TFT's ``VarLenFeature``, as ours;
- a variable-length list: no ``shape`` and no ``value_count`` (its bounds are not in the manifest).

tensorflow-metadata is an optional extra (``pip install 'tfrbeam[tfmd]'``), imported when needed.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Mapping
from typing import Any

from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest_schema import Manifest

__all__ = ["TFMD_INSTALL_HINT", "entries_of_schema", "parse_schema_text", "schema_files_of",
           "schema_of_entries", "schema_pb2", "schema_text"]

_LOG = logging.getLogger(__name__)

TFMD_INSTALL_HINT = "pip install 'tfrbeam[tfmd]'"
_TYPES = {"int64": "INT", "float": "FLOAT", "bytes": "BYTES"}
# Features TFT leaves out of its parse spec (schema_utils._include_in_parsing_spec): the build leaves them out too.
_NOT_PARSED_STAGES = ("DEPRECATED", "PLANNED", "ALPHA", "DEBUG_ONLY")
_RAGGED_TAG = "ragged_tensor"


def schema_pb2(what: str) -> Any:
    """TFMD's ``schema_pb2`` module; ``ConfigError`` naming ``what`` needs it and the extra that installs it."""
    try:
        return importlib.import_module("tensorflow_metadata.proto.v0.schema_pb2")
    except ImportError as error:
        raise ConfigError(f"{what} needs the tensorflow-metadata package, which is not installed: "
                          f"{TFMD_INSTALL_HINT}") from error


def schema_of_entries(entries: Mapping[str, Mapping[str, Any]], what: str = "output.schema_pbtxt") -> Any:
    """The ``Schema`` of the manifest's feature entries, in their order."""
    pb = schema_pb2(what)
    schema = pb.Schema()
    for name, entry in entries.items():
        feature = schema.feature.add(name=name, type=pb.FeatureType.Value(_TYPES[entry["type"]]))
        shape = entry["shape"]
        if entry["always_present"]:
            feature.presence.min_fraction = 1.0
            feature.presence.min_count = 1
            if shape is not None:
                feature.shape.SetInParent()  # no dims: a scalar, which ``shape`` left unset would not say
                for size in shape:
                    feature.shape.dim.add(size=size)
        elif shape is not None:
            feature.value_count.min = feature.value_count.max = math.prod(shape)
    return schema


def schema_text(entries: Mapping[str, Mapping[str, Any]], what: str = "output.schema_pbtxt") -> str:
    """``schema.pbtxt``'s text: the ``Schema`` of the entries in protobuf text format, as TFDV's ``write_schema_text``."""
    text_format = importlib.import_module("google.protobuf.text_format")
    return str(text_format.MessageToString(schema_of_entries(entries, what)))


def parse_schema_text(text: str, where: str) -> Any:
    """A ``Schema`` from ``schema.pbtxt`` text; ``ConfigError`` naming ``where`` and the parser's line when it is not one."""
    pb = schema_pb2(where)
    text_format = importlib.import_module("google.protobuf.text_format")
    try:
        return text_format.Parse(text, pb.Schema())
    except text_format.ParseError as error:
        raise ConfigError(f"{where}: not a TensorFlow Metadata schema in text format ({error})") from error


def entries_of_schema(schema: Any, where: str) -> dict[str, dict[str, Any]]:
    """Manifest-style feature entries of a ``Schema``: type, shape ([] scalar, [n], None variable), always_present.

    A feature with no tf.train.Example equivalent (STRUCT, sparse and weighted features, ragged
    tensors, a shape of rank 2 or more) is a ``ConfigError`` naming it and why; features TFT does
    not parse (deprecated, or lifecycle PLANNED, ALPHA, DEBUG_ONLY) are left out, with a warning.
    """
    pb = schema_pb2(where)
    _refuse_schema_level(schema, where)
    entries: dict[str, dict[str, Any]] = {}
    for feature in schema.feature:
        at = f"{where}: feature {feature.name!r}"
        if feature.deprecated or pb.LifecycleStage.Name(feature.lifecycle_stage) in _NOT_PARSED_STAGES:
            _LOG.warning("%s: left out, as TFT leaves it out of its parse spec (deprecated or lifecycle_stage %s)",
                         at, pb.LifecycleStage.Name(feature.lifecycle_stage))
            continue
        if feature.name in entries:
            raise ConfigError(f"{at}: named twice; an Example holds one feature of a name")
        entries[feature.name] = _entry_of_feature(pb, feature, at)
    if not entries:
        raise ConfigError(f"{where}: the schema has no feature the build could write; list at least one")
    return entries


def _refuse_schema_level(schema: Any, where: str) -> None:
    """Sparse and weighted features are made of several Example features: TFT parses them as one tensor, we cannot."""
    for sparse in schema.sparse_feature:
        raise ConfigError(f"{where}: sparse_feature {sparse.name!r}: a sparse tensor made of index and value features "
                          "has no single-feature Example equivalent; list its index and value features as features")
    for weighted in schema.weighted_feature:
        raise ConfigError(f"{where}: weighted_feature {weighted.name!r}: a feature weighted by another has no "
                          "single-feature Example equivalent; list the two features as features")


def _entry_of_feature(pb: Any, feature: Any, at: str) -> dict[str, Any]:
    type_name = pb.FeatureType.Name(feature.type)
    kinds = {proto: kind for kind, proto in _TYPES.items()}
    if type_name not in kinds:
        why = "nested features (a STRUCT) have" if type_name == "STRUCT" else "a feature without a type has"
        raise ConfigError(f"{at}: type {type_name}: {why} no tf.train.Example equivalent; give it type INT, FLOAT "
                          "or BYTES")
    if _RAGGED_TAG in feature.annotation.tag:
        raise ConfigError(f"{at}: tagged {_RAGGED_TAG}: a RaggedTensor has no tf.train.Example equivalent")
    required = feature.presence.min_fraction == 1.0
    shape_type = feature.WhichOneof("shape_type")
    if shape_type == "value_counts":
        raise ConfigError(f"{at}: value_counts describes nested lists, which a tf.train.Example feature cannot hold")
    shape: list[int] | None = None
    if shape_type == "shape":
        shape = [int(dim.size) for dim in feature.shape.dim]
        if not required:
            raise ConfigError(f"{at}: shape {shape} with presence.min_fraction {feature.presence.min_fraction:g}: TFT "
                              "refuses a shape on a feature some examples lack; use value_count, or min_fraction: 1")
        if len(shape) > 1 or any(size < 1 for size in shape):
            raise ConfigError(f"{at}: shape {shape}: the build writes one value or a list of n >= 1 values per "
                              "feature; give shape no dim or one dim of size n")
    elif shape_type == "value_count" and feature.value_count.min == feature.value_count.max >= 1:
        count = int(feature.value_count.min)  # n values in every example that has it (TFT's legacy rule too)
        shape = [] if count == 1 else [count]
    return {"type": kinds[type_name], "shape": shape, "always_present": required}


def schema_files_of(manifest: Manifest) -> set[str]:
    """The ``schema.pbtxt`` a manifest lists as its dataset's (``schema_pbtxt``), as a set of at most one relative path."""
    path = manifest.rest.get("schema_pbtxt")
    return {path} if isinstance(path, str) else set()
