"""``features_from: schema.pbtxt``: a build's features from a TensorFlow Metadata schema (TFDV's, TFX SchemaGen's).

Each schema feature becomes a feature read from the column of its name: its type, one value, a list
of n or a list of any length (``tfrbeam.layout.tfmd_schema`` reads the proto), ``on_null: error``
where the schema requires it (presence.min_fraction 1) and ``on_null: omit`` where it does not.
"""

from __future__ import annotations

import os

from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.errors import ConfigError
from tfrbeam.layout.tfmd_schema import entries_of_schema, parse_schema_text

__all__ = ["MAX_SCHEMA_BYTES", "features_of_schema_file"]

MAX_SCHEMA_BYTES = 64 << 20  # a schema of many thousand features is a few MiB


def features_of_schema_file(path: str, input_format: str, key: str = "features_from") -> tuple[FeatureSpec, ...]:
    """The features a local ``schema.pbtxt`` describes; ``ConfigError`` (one line naming ``key``, the file and the
    feature) for a file that cannot be read or a feature a build cannot write."""
    where = f"{key} {path}"
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            data = handle.read(MAX_SCHEMA_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{where}: cannot read it ({error.strerror or error})") from error
    if len(data) > MAX_SCHEMA_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_SCHEMA_BYTES >> 20} MiB, far beyond any schema.pbtxt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where}: not UTF-8 text ({error}); a schema.pbtxt is protobuf text format") from error
    entries = entries_of_schema(parse_schema_text(text, where), where)
    specs = []
    for name, entry in entries.items():
        shape = entry["shape"]
        if shape != [] and input_format == "csv":
            raise ConfigError(f"{where}: feature {name!r} is a list, and a CSV column is one string; declare it "
                              "under features: with a separator (and length) instead")
        specs.append(FeatureSpec(name=name, type=entry["type"], source=name,
                                 on_null="error" if entry["always_present"] else "omit",
                                 length=shape[0] if shape else None, is_list=shape != []))
    return tuple(specs)
