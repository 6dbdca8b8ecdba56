"""The ``features`` key (a mapping of feature name to its settings) and ``features_from`` (a TFMD schema.pbtxt): the
build's FeatureSpecs, each setting checked as the YAML is read, and each spec written back as its settings.

A feature's settings are not the FeatureSpec's fields one to one (``type: timestamp`` is an int64 with a
unit, ``from_file`` a FileOptions, ``image`` adds features), so its keys are listed here, once, beside
the code that reads and writes them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any

from tfrbeam.builder.config.formats import ROWS_FORMAT
from tfrbeam.builder.config.keys import INT64_MAX, Checker, Kind, Scope, show
from tfrbeam.builder.config.tfmd import features_of_schema_file
from tfrbeam.builder.features.convert import FEATURE_TYPES, ON_NULL_ACTIONS, TIME_UNITS, TIMESTAMP, FeatureSpec
from tfrbeam.builder.features.file_contents import (
    DEFAULT_MAX_FILE_BYTES,
    IMAGE_EXTRA,
    IMAGE_PARTS,
    MAX_FILE_BYTES,
    FileOptions,
    pillow_missing,
)
from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest_schema import MAX_SHAPE_RANK

__all__ = ["Features", "check_default", "feature_to_dict"]

_FEATURE_KEYS = ("type", "source", "on_null", "default", "separator", "length", "shape", "format", "unit", "null_values",
                 "from_file", "max_file_bytes", "file_root", "image")
# Why a feature's own null_values is refused for an input that is not CSV: its nulls are typed already.
_NULLS_IN_FILES = "Parquet nulls are in the file"
_NULLS_ARE = {ROWS_FORMAT: "the rows' nulls are Arrow nulls"}


class Features(Kind):
    """``features``, or ``features_from``: the FeatureSpecs (None: every input column, types inferred)."""

    extra_keys = ("features_from",)

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        input_config = scope.value("input")
        features = _parse_features(scope.check, scope.raw.get(name), input_config.format)
        if scope.raw.get("features_from") is not None:
            features = _features_from(scope.check, scope.raw["features_from"], features, input_config.format)
        return features

    def dump(self, value: Any, owner: Any) -> Any:
        return {spec.name: feature_to_dict(spec) for spec in value} if value is not None else None


def _parse_features(check: Checker, raw: Any, input_format: str) -> tuple[FeatureSpec, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        check.fail("features", f"expected a mapping of feature name to its settings (or leave features out to "
                   f"take every input column), got {show(raw)}")
        return None
    specs = []
    for name, settings in raw.items():
        path = f"features.{name}"
        if not isinstance(name, str) or not name:
            check.fail(path, "a feature name must be a non-empty string")
            continue
        spec = _parse_feature(check, name, settings, path, input_format)
        specs.append(spec)
        specs.extend(_image_features(check, spec, settings, path))
    names = [spec.name for spec in specs]
    for name in sorted({name for name in names if names.count(name) > 1}):
        check.fail(f"features.{name}", "is also the name of an image fact another feature's image adds")
    return tuple(specs)


def _features_from(check: Checker, raw: Any, features: tuple[FeatureSpec, ...] | None,
                   input_format: str) -> tuple[FeatureSpec, ...] | None:
    """``features_from``: the features of a TensorFlow Metadata schema.pbtxt, instead of ``features``."""
    if features is not None:
        check.fail("features_from", "gives the features, and so does features; keep one of them")
        return features
    if not isinstance(raw, str) or not raw:
        check.fail("features_from", f"{show(raw)} is not the path of a schema.pbtxt")
        return None
    try:
        return features_of_schema_file(raw, input_format)
    except ConfigError as error:
        check.problems.append(str(error))
        return None


def _image_features(check: Checker, spec: FeatureSpec, raw: Any, path: str) -> list[FeatureSpec]:
    """The features ``image:`` adds to a from_file feature: <name>/height, /width, /channels, /format."""
    value = raw.get("image") if isinstance(raw, dict) else None
    if value is None or value is False:
        return []
    if spec.file is None or spec.file.part != "bytes":
        check.fail(f"{path}.image", "is only used with from_file: true (it adds the image's header facts as features)")
        return []
    if isinstance(value, dict):  # the spelling, {height, width}: a YAML mapping of names to null
        value = [key for key, wanted in value.items() if wanted is not False] or False
    if value is True:
        parts: list[str] = list(IMAGE_PARTS)
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        parts = [item for item in IMAGE_PARTS if item in value]
        for item in value:
            if item not in IMAGE_PARTS:
                check.fail(f"{path}.image", f"{show(item)} is not one of {', '.join(IMAGE_PARTS)}")
    else:
        check.fail(f"{path}.image", f"{show(value)} is not true or a list of some of {', '.join(IMAGE_PARTS)}")
        return []
    if pillow_missing():
        check.fail(f"{path}.image", f"needs Pillow: {IMAGE_EXTRA}")
    on_null = "omit" if spec.on_null == "default" else spec.on_null
    return [FeatureSpec(name=f"{spec.name}/{part}", type=FileOptions(part=part).feature_type, source=spec.source,
                        on_null=on_null, source_path=spec.source_path, null_values=spec.null_values,
                        file=FileOptions(part=part, max_bytes=None, file_root=spec.file.file_root)) for part in parts]


def _file_options(check: Checker, section: dict, path: str, type_name: str | None) -> FileOptions | None:
    """A feature's from_file settings: the file's bytes (from_file: true) or one image header fact, and max_file_bytes."""
    value = section.get("from_file")
    if value is None or value is False:
        for key in ("max_file_bytes", "file_root"):
            if section.get(key) is not None:
                check.fail(f"{path}.{key}", "is only used with from_file")
        return None
    if value is True:
        part = "bytes"
    elif isinstance(value, str) and value in IMAGE_PARTS:
        part = value
    else:
        check.fail(f"{path}.from_file", f"{show(value)} is not true (the file's bytes) or one of "
                   f"{', '.join(IMAGE_PARTS)} (a fact of the image's header)")
        return None
    for key in ("separator", "length"):
        if section.get(key) is not None:
            check.fail(f"{path}.{key}", "a from_file feature is one file (leave out separator and length)")
    feature_type = FileOptions(part=part).feature_type
    file_root = check.string(section, "file_root", path, None)
    if type_name is not None and type_name != feature_type:
        check.fail(f"{path}.type", f"from_file: {show(value)} gives {feature_type} values; set type: {feature_type} "
                   "or leave type out")
    if part != "bytes":
        if section.get("max_file_bytes") is not None:
            check.fail(f"{path}.max_file_bytes", "limits only from_file: true (a header fact reads just the header)")
        if pillow_missing():
            check.fail(f"{path}.from_file", f"{value} needs Pillow: {IMAGE_EXTRA}")
        return FileOptions(part=part, max_bytes=None, file_root=file_root)
    max_bytes = check.size(section, "max_file_bytes", path, DEFAULT_MAX_FILE_BYTES)
    if max_bytes > MAX_FILE_BYTES:
        check.fail(f"{path}.max_file_bytes", f"{max_bytes} is above 1GiB (a record holds at most 2 GiB - 1 bytes)")
    return FileOptions(part=part, max_bytes=max_bytes, file_root=file_root)


def _parse_feature(check: Checker, name: str, raw: Any, path: str, input_format: str) -> FeatureSpec:
    section = check.mapping(raw, path, _FEATURE_KEYS)
    type_name = section.get("type")
    if type_name is not None and type_name not in (*FEATURE_TYPES, TIMESTAMP):
        hint = {"string": "bytes", "str": "bytes", "int": "int64", "integer": "int64", "float32": "float",
                "float64": "float", "double": "float", "bool": "int64", "datetime": TIMESTAMP,
                "date": TIMESTAMP}.get(str(type_name).lower())
        close = difflib.get_close_matches(str(type_name).lower(), (*FEATURE_TYPES, TIMESTAMP), n=1, cutoff=0.6)
        suggestion = f"; use {hint}" if hint else f"; did you mean {close[0]!r}?" if close else ""
        check.fail(f"{path}.type", f"{show(type_name)} is not one of {', '.join((*FEATURE_TYPES, TIMESTAMP))}{suggestion}")
        type_name = None
    time_unit, time_format = _timestamp_settings(check, section, path, type_name == TIMESTAMP)
    file = _file_options(check, section, path, type_name)
    if file is not None:
        type_name = file.feature_type
    if type_name == TIMESTAMP:
        type_name = "int64"  # the feature holds the count of time_unit since the epoch
    source, source_path = _source(check, section, path, name)
    null_values = _feature_null_values(check, section, path, input_format)
    on_null = check.choice(section, "on_null", path, ON_NULL_ACTIONS, "error")
    separator = section.get("separator")
    if separator is not None and (not isinstance(separator, str) or not separator):
        check.fail(f"{path}.separator", f"{show(separator)} is not a non-empty string")
        separator = None
    length = check.integer(section, "length", path, None, minimum=1)
    if length is not None and separator is None and input_format == "csv":
        check.fail(f"{path}.length", "is only allowed with separator (a CSV column is one string; "
                   "set separator to split it into a list of this length)")
    tensor_shape = _tensor_shape(check, section, path)
    if tensor_shape is not None:
        if length is not None and length != math.prod(tensor_shape):
            check.fail(f"{path}.length", f"{length} is not the {math.prod(tensor_shape)} values shape "
                       f"{list(tensor_shape)} holds; leave length out")
        if separator is None and input_format == "csv":
            check.fail(f"{path}.shape", "needs separator for a CSV column (a CSV column is one string; set separator "
                       "to split it into the tensor's values, row-major)")
        length = math.prod(tensor_shape)
    is_list = separator is not None or length is not None
    default = section.get("default")
    if on_null is None:  # already reported; checking default against it would only add noise
        on_null, default = "error", None
    elif on_null == "default":
        if default is None:
            check.fail(f"{path}.default", f"is required when on_null is default (a value of type {type_name or 'the feature'})")
        elif type_name is not None:
            default = check_default(check, f"{path}.default", default, type_name, is_list, length)
    elif default is not None:
        check.fail(f"{path}.default", f"is only used with on_null: default, but on_null is {on_null}")
        default = None
    if time_unit is not None and (separator is not None or length is not None):
        check.fail(f"{path}.{'separator' if separator is not None else 'shape' if tensor_shape else 'length'}",
                   "a timestamp feature is one value (leave out separator, length and shape)")
    return FeatureSpec(name=name, type=type_name, source=source, on_null=on_null, default=default,
                       separator=separator, length=length, is_list=is_list, time_unit=time_unit, time_format=time_format,
                       source_path=source_path, null_values=null_values, file=file, tensor_shape=tensor_shape)


def _tensor_shape(check: Checker, section: dict, path: str) -> tuple[int, ...] | None:
    """A tensor feature's declared shape: a list of positive sizes (its values are written flat, row-major)."""
    value = section.get("shape")
    if value is None:
        return None
    if (not isinstance(value, list) or not value or len(value) > MAX_SHAPE_RANK
            or not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in value)):
        check.fail(f"{path}.shape", f"{show(value)} is not a list of 1 to {MAX_SHAPE_RANK} positive sizes (e.g. [3, 32, 32])")
        return None
    if math.prod(value) > INT64_MAX:
        check.fail(f"{path}.shape", f"{show(value)} holds more values than a list can")
        return None
    if section.get("from_file") not in (None, False):
        check.fail(f"{path}.shape", "a from_file feature is one file (leave out shape)")
        return None
    return tuple(value)


def _feature_null_values(check: Checker, section: dict, path: str, input_format: str) -> tuple[str, ...] | None:
    """A feature's own CSV null tokens (they replace input.csv.null_values for it); None when not given."""
    value = section.get("null_values")
    if value is None:
        return None
    if input_format != "csv":
        check.fail(f"{path}.null_values", f"is only for CSV inputs ({_NULLS_ARE.get(input_format, _NULLS_IN_FILES)})")
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        check.fail(f"{path}.null_values", f"{show(value)} is not a list of strings (e.g. [\"\"] or []); quote "
                   "values YAML would read as something else, like 'null' or '1'")
        return None
    return tuple(value)


def _source(check: Checker, section: dict, path: str, name: str) -> tuple[str, tuple[str, ...] | None]:
    """A feature's source: a string (a column, or a dotted struct path when no column has that name), or a list,
    the exact path ([column, field, ...]; ["a.b"] is the column "a.b")."""
    value = section.get("source")
    if not isinstance(value, list):
        return check.string(section, "source", path, name), None
    if not value or not all(isinstance(part, str) and part for part in value):
        check.fail(f"{path}.source", f"{show(value)} is not a non-empty list of non-empty names "
                   "(e.g. [column, field] for a struct field)")
        return name, None
    return ".".join(value), tuple(value)


def _timestamp_settings(check: Checker, section: dict, path: str, is_timestamp: bool) -> tuple[str | None, str | None]:
    """(unit, format) of a timestamp feature; format and unit are refused on other types."""
    if not is_timestamp:
        for key in ("format", "unit"):
            if section.get(key) is not None:
                check.fail(f"{path}.{key}", "is only used with type: timestamp")
        return None, None
    unit = check.choice(section, "unit", path, TIME_UNITS, "s") or "s"
    time_format = None
    if section.get("format") is not None:
        if not isinstance(section["format"], str) or not section["format"]:
            check.fail(f"{path}.format", f"{show(section['format'])} is not a non-empty string "
                       "(a strptime format like \"%Y-%m-%d %H:%M\", or null for ISO 8601)")
        else:
            time_format = section["format"]
    return unit, time_format


def check_default(check: Checker, path: str, value: Any, type_name: str, is_list: bool, length: int | None) -> Any:
    """The default converted to its stored form (tuple for lists), or None after reporting a problem."""
    if is_list:
        if not isinstance(value, list):
            check.fail(path, f"{show(value)} is not a list of {type_name} values (the feature is a list)")
            return None
        if length is not None and len(value) != length:
            check.fail(path, f"{show(value)} has {len(value)} values but length is {length}")
            return None
        items = [_default_item(item, type_name) for item in value]
        if any(item is None for item in items):
            check.fail(path, f"{show(value)} is not a list of {type_name} values ({_TYPE_WORDS[type_name]})")
            return None
        return tuple(items)
    item = _default_item(value, type_name)
    if item is None:
        check.fail(path, f"{show(value)} is not a {type_name} value ({_TYPE_WORDS[type_name]})")
    return item


_TYPE_WORDS = {"int64": "an integer from -2**63 to 2**63-1", "float": "a number", "bytes": "a string"}


def _default_item(value: Any, type_name: str) -> Any:
    if isinstance(value, bool):
        return None
    if type_name == "int64":
        return value if isinstance(value, int) and -INT64_MAX - 1 <= value <= INT64_MAX else None
    if type_name == "float":
        return float(value) if isinstance(value, (int, float)) and not math.isinf(value) else None
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8") if isinstance(value, str) else None


def feature_to_dict(spec: FeatureSpec) -> dict:
    default = spec.default
    as_text: Callable[[Any], Any] = lambda v: v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v
    if isinstance(default, tuple):
        default = [as_text(item) for item in default]
    else:
        default = as_text(default)
    source: Any = list(spec.source_path) if spec.source_path is not None else spec.source
    result: dict[str, Any] = {"type": spec.type, "source": source, "on_null": spec.on_null}
    if spec.time_unit is not None:
        result.update(type=TIMESTAMP, unit=spec.time_unit, format=spec.time_format)
    if spec.on_null == "default":
        result["default"] = default
    if spec.separator is not None:
        result["separator"] = spec.separator
    if spec.tensor_shape is not None:
        result["shape"] = list(spec.tensor_shape)
    elif spec.length is not None:
        result["length"] = spec.length
    if spec.null_values is not None:
        result["null_values"] = list(spec.null_values)
    if spec.file is not None:
        result["from_file"] = True if spec.file.part == "bytes" else spec.file.part
        if spec.file.max_bytes is not None:
            result["max_file_bytes"] = spec.file.max_bytes
        if spec.file.file_root is not None:
            result["file_root"] = spec.file.file_root
    return result

