"""Feature specs and the vectorised conversion of input Arrow batches into feature columns (no Beam).

A FeatureSpec says how one tf.train.Example feature is made from one input column. convert_batch
applies specs to a RecordBatch with pyarrow.compute kernels over whole columns, and separates the
rows that cannot be converted (an unparsable number, a float in an int64 feature, an int64 out of
range, a null where on_null is error, a list of the wrong length) as BadRows with their file, line,
reason and raw text. Rows are only looked at one by one to word the reasons of bad rows.

Rules (docs/build-config.md states them too):
- Only the configured null values are null; zeros, "" and false are values.
- int64 text must be an optional sign and decimal digits ("1.0", "1e3", "0x10" are bad rows);
  float text is a decimal or exponent number, inf/infinity or nan (any case, optional sign).
  No surrounding spaces. A float that overflows float32 (Example floats are 32-bit) is a bad row.
- Arrow columns: integers and booleans map to int64 (false is 0, true is 1; a uint64 above
  2**63-1 is a bad row), floats to float, strings/binary to bytes, lists of those to list
  features. Declared types may cast: any scalar to bytes (its text form), integers/booleans to
  float, decimals to float (rounded) or, with scale 0, to int64, dates/times/timestamps/
  durations to int64 (the stored count: days for date32, ms for date64, the unit otherwise).
  Floats are never cast to int64 (declare type: float). A struct field is a source written
  "column.field" or, exactly, as a path ["column", "field"] (see docs/inference.md).
- CSV inference: codes (a leading zero before a digit, integers beyond int64) are bytes; a
  feature's own null_values replace the file-wide ones for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.features.file_contents import FileOptions, FileRead, confinement, files_base, read_files
from tfrbeam.codec.kinds import (
    ARROW_TYPES,
    FEATURE_TYPES,
    is_binary as _is_binary,
    is_list as _is_list,
    is_temporal as _is_temporal,
    is_text as _is_text,
    plain_list,
    scalar_kind as _natural_type,
)
from tfrbeam.errors import ArrowConversionError
from tfrbeam.tfrecord.records import MAX_PAYLOAD_SIZE

__all__ = [
    "BadRow",
    "BatchProvenance",
    "ConvertedBatch",
    "FEATURE_TYPES",
    "FeatureSpec",
    "ambiguous_source",
    "ON_NULL_ACTIONS",
    "Provenance",
    "convert_batch",
    "float32_rounding",
    "infer_boolean_tokens",
    "infer_column_features",
    "infer_null_tokens",
    "infer_schema_features",
    "infer_spec",
    "infer_text_feature",
    "infer_text_type",
    "output_type",
    "resolve_spec",
    "source_column",
    "source_matches",
    "source_type",
]

TIMESTAMP = "timestamp"  # a declared type that becomes an int64 feature: the count of time_unit since the epoch
TIME_UNITS = ("s", "ms", "us", "ns")
TRUE_TOKENS, FALSE_TOKENS = ("true", "True", "TRUE"), ("false", "False", "FALSE")
_ZONED_TEXT = r":[0-9]{2}(\.[0-9]*)?(Z|z|[+-][0-9]{2}(:?[0-9]{2})?)$"  # a time of day, then a zone
_ISO_DATE_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
ON_NULL_ACTIONS = ("omit", "default", "error")

_INT_TEXT = r"^[+-]?[0-9]+$"
_FLOAT_TEXT = r"^[+-]?((([0-9]+\.?[0-9]*)|(\.[0-9]+))([eE][+-]?[0-9]+)?|[iI][nN][fF]([iI][nN][iI][tT][yY])?|[nN][aA][nN])$"
_INFINITY_TEXT = r"^[+-]?[iI][nN][fF]"
_LEADING_ZERO_TEXT = r"^[+-]?0[0-9]"  # a code such as a ZIP code ("02134"), not a number: inferred as bytes
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Round to nearest takes anything below max + half an ulp to max (3.4028235e38, numpy's shortest spelling of max,
# is a hair above it); from there on a float32 is infinite.
_FLOAT32_ROUNDS_TO_INFINITY = _FLOAT32_MAX + 2.0 ** (127 - 24)
_INT64_MAX_DIGITS = "9223372036854775807"
_INT64_MIN_DIGITS = "9223372036854775808"


@dataclass(frozen=True)
class FeatureSpec:
    """One output feature: its Example type, the input column it comes from and how nulls are handled.

    type is None only before inference (a feature listed without a type); separator splits a CSV
    string into a list; length fixes the list length (a different count is a bad row); is_list is
    true for separator features and for list-typed source columns (set when resolved on a schema).
    """

    name: str
    type: str | None
    source: str
    on_null: str = "error"
    default: Any = None
    separator: str | None = None
    length: int | None = None
    is_list: bool = False
    time_unit: str | None = None  # set for type: timestamp (an int64 count of this unit since 1970-01-01 UTC)
    time_format: str | None = None  # the strptime format of timestamp text; None is ISO 8601
    source_path: tuple[str, ...] | None = None  # set when source was given as a list: the exact column/field path
    null_values: tuple[str, ...] | None = None  # CSV tokens that are null for this feature; None: input.csv.null_values
    file: FileOptions | None = None  # set for from_file: the column holds paths, the feature the file's bytes (or facts)
    # set for a tensor feature: its shape (a nested fixed-size list, fixed_shape_tensor or declared shape); its
    # values are written flat, length is their count (the product of the sizes)
    tensor_shape: tuple[int, ...] | None = None

    @property
    def source_ref(self) -> str | tuple[str, ...]:
        """What the feature reads: its exact path (list syntax), else the source string (a column or dotted path)."""
        return self.source_path if self.source_path is not None else self.source

    @property
    def shape(self) -> tuple[int, ...] | None:
        """() for a scalar, (length,) for a fixed-length list, the tensor shape of a tensor feature, None for a
        variable-length list."""
        if self.tensor_shape is not None:
            return self.tensor_shape
        if not self.is_list:
            return ()
        return (self.length,) if self.length is not None else None

    @property
    def always_present(self) -> bool:
        """False when a row may lack the feature (a null with on_null: omit)."""
        return self.on_null != "omit"


@dataclass(frozen=True)
class BadRow:
    """A row that could not be converted: where it is, why, and its raw text for the dead letters."""

    path: str
    line: int
    reason: str
    raw: str

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass(frozen=True, eq=False)
class ConvertedBatch:
    """Feature columns (named by feature) of the good rows, and the bad rows taken out of the batch.

    kept_rows: the input row index of each output row (to take e.g. split_key columns from the input).
    """

    batch: pa.RecordBatch
    bad_rows: list[BadRow]
    kept_rows: np.ndarray


class Provenance(Protocol):
    """Where a batch's rows come from: the file, each row's line (or row number) and its raw text."""

    @property
    def path(self) -> str: ...

    @property
    def lines(self) -> np.ndarray: ...

    def raw_text(self, rows: Iterable[int]) -> list[str]: ...


@dataclass(frozen=True, eq=False)
class BatchProvenance:
    """Provenance for a batch in hand: rows numbered first_line, first_line + 1, ...; raw text as JSON."""

    path: str
    batch: pa.RecordBatch
    first_line: int = 1

    @property
    def lines(self) -> np.ndarray:
        return np.arange(self.first_line, self.first_line + self.batch.num_rows, dtype=np.int64)

    def raw_text(self, rows: Iterable[int]) -> list[str]:
        return rows_as_json(self.batch, rows)


def rows_as_json(batch: pa.RecordBatch, rows: Iterable[int]) -> list[str]:
    """The given rows rendered as JSON objects (bytes as text where UTF-8, else escaped)."""
    taken = batch.take(pa.array(list(rows), pa.int64())).to_pylist()
    return [json.dumps(row, default=_json_default, ensure_ascii=False) for row in taken]


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


# ------------------------------------------------------------------------------------ type rules


def output_type(spec: FeatureSpec) -> pa.DataType:
    """The Arrow type convert_batch gives a feature's column (what the columnar encoder takes)."""
    scalar = ARROW_TYPES[spec.type or "bytes"]
    return pa.list_(scalar) if spec.is_list else scalar


SourceRef = str | tuple[str, ...]


def source_type(schema: pa.Schema, source: SourceRef) -> pa.DataType | None:
    """The Arrow type of a source column, of a struct field written "column.field.sub", or of a path
    ("column", "field", ...); None if absent."""
    found = _find_source(schema.names, source)
    if found is None:
        return None
    head, fields = found
    arrow_type = schema.field(head).type
    for name in fields:
        if not pa.types.is_struct(arrow_type) or arrow_type.get_field_index(name) < 0:
            return None
        arrow_type = arrow_type.field(name).type
    return arrow_type


def source_column(schema: pa.Schema, source: SourceRef) -> str | None:
    """The top-level column a source reads ("s" for the struct field "s.a"); None if absent."""
    found = _find_source(schema.names, source) if source_type(schema, source) is not None else None
    return found[0] if found else None


def _find_source(names: Sequence[str], source: SourceRef) -> tuple[str, list[str]] | None:
    """(column, struct field path) of a source: a path as it is; of a string, an exact column name wins over a
    dotted path (validate_against_schema refuses a string that names both, see source_matches)."""
    if isinstance(source, tuple):
        return (source[0], list(source[1:])) if source and source[0] in names else None
    if source in names:
        return source, []
    parts = source.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in names:
            return head, parts[cut:]
    return None


def source_matches(schema: pa.Schema, source: str) -> list[tuple[str, ...]]:
    """Every existing path a source string can name: the column of that exact name, then each struct field path
    its dots can spell ("a.b": the column "a.b", field b of struct a). More than one is ambiguous."""
    parts = source.split(".")
    splits = [(source,)] + [(".".join(parts[:cut]), *parts[cut:]) for cut in range(len(parts) - 1, 0, -1)]
    return [path for path in splits if source_type(schema, path) is not None]


def ambiguous_source(schema: pa.Schema, spec: FeatureSpec) -> str | None:
    """Why a source string is ambiguous in the schema (it names a column and a struct field), or None."""
    if spec.source_path is not None:
        return None
    found = source_matches(schema, spec.source)
    if len(found) < 2:
        return None
    named = [f"the column {path[0]!r}" if len(path) == 1 else
             f"field {'.'.join(path[1:])} of struct column {path[0]}" for path in found]
    spelled = [f"source: [{', '.join(part if _plain(part) else json.dumps(part) for part in path)}] for "
               f"{'the column' if len(path) == 1 else 'the field'}" for path in found]
    return f"{spec.source!r} names both {' and '.join(named)}; write the path as a list: {' or '.join(spelled)}"


def _plain(name: str) -> bool:
    """Whether a name can be written in YAML flow syntax without quotes."""
    return bool(name) and name.replace("_", "").isalnum() and name[0].isalpha()


def _allowed_types(arrow_type: pa.DataType) -> tuple[str, ...]:
    """The feature types a scalar Arrow type may be declared as (casts included)."""
    if pa.types.is_dictionary(arrow_type):
        return _allowed_types(arrow_type.value_type)
    if pa.types.is_null(arrow_type):
        return FEATURE_TYPES
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return ("int64", "float", "bytes")
    if pa.types.is_floating(arrow_type):
        return ("float", "bytes")
    if _is_text(arrow_type) or _is_binary(arrow_type):
        return FEATURE_TYPES  # numbers are parsed from text by the rules above
    if pa.types.is_decimal(arrow_type):
        return ("float", "bytes", "int64") if arrow_type.scale == 0 else ("float", "bytes")
    if _is_temporal(arrow_type):
        return ("int64", "bytes")
    return ()


def _suggestion(column: str, arrow_type: pa.DataType) -> str:
    """The config that would map a column of this Arrow type, or why none can."""
    if pa.types.is_dictionary(arrow_type):
        return _suggestion(column, arrow_type.value_type)
    if pa.types.is_decimal(arrow_type):
        return (f"declare it, e.g. features: {{{column}: {{type: float}}}} (rounded to 32-bit float) or "
                f"{{type: bytes}} (exact decimal text)")
    if _is_temporal(arrow_type):
        unit = ("days" if pa.types.is_date32(arrow_type) else "milliseconds" if pa.types.is_date64(arrow_type)
                else "the type's unit")
        return (f"declare it, e.g. features: {{{column}: {{type: int64}}}} (the stored count of {unit} "
                f"since the epoch) or {{type: bytes}} (ISO 8601 text)")
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
        example = fields[0] if fields else "field"
        return (f"map its fields one by one with a dotted source, e.g. features: "
                f"{{{column}_{example}: {{type: ..., source: {column}.{example}}}}} (fields: {', '.join(fields)})")
    if pa.types.is_map(arrow_type):
        return "a map has no Example mapping; leave it out by listing the features you want in features"
    if _is_list(arrow_type):
        if pa.types.is_null(arrow_type.value_type):
            return (f"every list item is null; declare the item type, e.g. features: "
                    f"{{{column}: {{type: int64}}}} (a null item is still a bad row)")
        if _is_list(arrow_type.value_type):
            return (f"a nested list is a tensor feature only with a fixed shape: declare it, e.g. features: "
                    f"{{{column}: {{shape: [2, 3]}}}} (a row whose lists do not have those sizes is a bad row)")
        return ("an Example feature is one flat list, so lists of these items have no mapping; "
                "leave the column out by listing the features you want in features")
    if pa.types.is_null(arrow_type):
        return f"every value is null; declare its type, e.g. features: {{{column}: {{type: float, on_null: omit}}}}"
    return "leave it out by listing the features you want in features"


def infer_spec(name: str, arrow_type: pa.DataType, nullable: bool = True, source: str | None = None) -> FeatureSpec:
    """The feature a column of a typed (Parquet) schema becomes when the config does not declare it."""
    source = source or name
    leaf, sizes = tensor_nesting(arrow_type)
    if len(sizes) > 1 or isinstance(arrow_type, pa.FixedShapeTensorType):
        dims = _inferred_tensor_shape(source, arrow_type, sizes)
        feature_type = _natural_type(leaf)
        if feature_type is None:
            raise ArrowConversionError(f"column {source!r} has Arrow type {arrow_type}, whose items have no Example "
                                       f"feature mapping without a declared type")
        return FeatureSpec(name=name, type=feature_type, source=source, on_null="omit" if nullable else "error",
                           length=math.prod(dims), is_list=True, tensor_shape=dims)
    is_list = _is_list(arrow_type)
    item_type = arrow_type.value_type if is_list else arrow_type
    feature_type = _natural_type(item_type)
    if feature_type is None:
        raise ArrowConversionError(
            f"column {source!r} has Arrow type {arrow_type}, which has no Example feature mapping without a "
            f"declared type: {_suggestion(name, arrow_type)}")
    length = arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None
    return FeatureSpec(name=name, type=feature_type, source=source, on_null="omit" if nullable else "error",
                       length=length, is_list=is_list)


def tensor_nesting(arrow_type: pa.DataType) -> tuple[pa.DataType, tuple[int | None, ...]]:
    """The item type of a (nested) list or fixed_shape_tensor type, and each list level's fixed size (None: a
    variable-length level); () for a scalar type."""
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        return arrow_type.value_type, tuple(int(size) for size in arrow_type.shape)
    sizes: list[int | None] = []
    while _is_list(arrow_type):
        sizes.append(arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None)
        arrow_type = arrow_type.value_type
    return arrow_type, tuple(sizes)


def _inferred_tensor_shape(source: str, arrow_type: pa.DataType, sizes: tuple[int | None, ...]) -> tuple[int, ...]:
    """The shape a nested list or fixed_shape_tensor column gives a feature without a declared shape."""
    permutation = arrow_type.permutation if isinstance(arrow_type, pa.FixedShapeTensorType) else None
    if permutation is not None and list(permutation) != sorted(permutation):  # None: row-major (a type made by name)
        raise ArrowConversionError(f"column {source!r} is a fixed_shape_tensor with permutation {arrow_type.permutation}; "
                                   "only row-major tensors (no permutation) can be written flat")
    if any(size is None for size in sizes):
        raise ArrowConversionError(f"column {source!r} has Arrow type {arrow_type}, a nested list whose lengths are not "
                                   f"fixed: {_suggestion(source, arrow_type)}")
    return tuple(size for size in sizes if size is not None)


def _tensor_spec(spec: FeatureSpec, arrow_type: pa.DataType) -> FeatureSpec:
    """A spec with its tensor shape settled on the column's type: declared (it must fit the column's fixed sizes, and a
    nested list's depth) or given by a nested fixed-size list or fixed_shape_tensor column; length is its size."""
    _, sizes = tensor_nesting(arrow_type)
    declared = spec.tensor_shape
    if declared is None:
        dims = _inferred_tensor_shape(spec.source, arrow_type, sizes)
    else:
        dims = declared
        if len(sizes) > 1 and (len(sizes) != len(declared)
                               or any(size is not None and size != want for size, want in zip(sizes, declared))):
            raise ArrowConversionError(f"shape {list(declared)} does not fit column {spec.source!r} of Arrow type "
                                       f"{arrow_type}: a nested list or fixed_shape_tensor needs one size per level, "
                                       "equal to its fixed sizes (or leave shape out)")
        fixed = _fixed_size(arrow_type, sizes)
        if fixed is not None and fixed != math.prod(declared):
            raise ArrowConversionError(f"shape {list(declared)} holds {math.prod(declared)} values, but every value of "
                                       f"column {spec.source!r} ({arrow_type}) holds {fixed}")
        if isinstance(arrow_type, pa.FixedShapeTensorType):
            _inferred_tensor_shape(spec.source, arrow_type, sizes)  # refuses a permutation
    if spec.length is not None and spec.length != math.prod(dims):
        raise ArrowConversionError(f"length {spec.length} and shape {list(dims)} ({math.prod(dims)} values) disagree; "
                                   "leave length out")
    return replace(spec, tensor_shape=dims, length=math.prod(dims), is_list=True)


def _fixed_size(arrow_type: pa.DataType, sizes: tuple[int | None, ...]) -> int | None:
    """How many items every value of a list or tensor column holds, when its type fixes it."""
    if not sizes or any(size is None for size in sizes):
        return None
    return math.prod(size for size in sizes if size is not None)


def infer_column_features(name: str, source: SourceRef, arrow_type: pa.DataType,
                          nullable: bool) -> tuple[list[tuple[FeatureSpec, str]], str]:
    """The features a typed (Parquet) column becomes when the config leaves features out, each with a comment on
    what its values become, and a note on what nothing can map (left out), or "".

    The one inference of the build (features left out) and of infer-config (which writes these
    specs and comments), so both build the same dataset. Structs give one feature per scalar field
    (source "col.field", with source_path ("col", "field")); types with no direct mapping get the cast that
    maps them. infer_schema_features settles the sources against the whole schema.
    """
    if isinstance(source, tuple):
        path, source = source, ".".join(source)
    else:
        path = None
    if pa.types.is_struct(arrow_type):
        features: list[tuple[FeatureSpec, str]] = []
        notes = []
        for index in range(arrow_type.num_fields):
            child = arrow_type.field(index)
            found, note = infer_column_features(f"{name}_{child.name}", (*(path or (source,)), child.name),
                                                child.type, nullable or child.nullable)
            features.extend(found)
            if note:
                notes.append(note)
        return features, "; ".join(notes)
    null_comment = "nullable in the schema: a null leaves the feature out of that example" if nullable else ""
    try:
        spec = replace(infer_spec(name, arrow_type, nullable=nullable, source=source), source_path=path)
        return [(spec, null_comment)], ""
    except ArrowConversionError:
        pass  # no direct mapping: the cast below
    cast = _cast_for(arrow_type)
    unmappable = f"{source} ({arrow_type}): no Example feature can hold it"
    if cast is None:
        return [], unmappable
    feature_type, why = cast
    try:
        spec = resolve_spec(FeatureSpec(name, feature_type, source, on_null="omit" if nullable else "error",
                                        source_path=path), arrow_type)
    except ArrowConversionError:
        return [], unmappable
    return [(spec, "; ".join(part for part in (f"{arrow_type} {why}", null_comment) if part))], ""


def infer_schema_features(schema: pa.Schema, columns: Sequence[str]) -> tuple[list[tuple[FeatureSpec, str]], list[str]]:
    """The features of the given columns of a typed schema (see infer_column_features), with sources settled and
    names unique, and the notes on what nothing can map.

    A source is written as a dotted string where that names one path in the schema, else as a
    list (source_path): a column "a.b" next to a struct a with a field b gets ["a.b"] and [a, b].
    A feature name already taken (column "a_b" and field b of struct a) gets a suffix, _2, _3, ...
    """
    found: list[tuple[FeatureSpec, str]] = []
    notes: list[str] = []
    for column in columns:
        field_ = schema.field(column)
        features, note = infer_column_features(column, (column,), field_.type, field_.nullable)
        found.extend(features)
        if note:
            notes.append(note)
    used: set[str] = set()
    settled = []
    for spec, comment in found:
        path = spec.source_path or (spec.source,)
        spec = replace(spec, source_path=path if source_matches(schema, ".".join(path)) != [path] else None)
        if spec.name in used:
            taken = spec.name
            spec = replace(spec, name=next(f"{taken}_{n}" for n in range(2, len(found) + 2) if f"{taken}_{n}" not in used))
            comment = "; ".join(part for part in (f"named {spec.name}: another feature is {taken}", comment) if part)
        used.add(spec.name)
        settled.append((spec, comment))
    return settled, notes


def _cast_for(arrow_type: pa.DataType) -> tuple[str, str] | None:
    """The declared type that maps a column with no direct mapping, and what the values become."""
    item = arrow_type.value_type if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) else arrow_type
    if pa.types.is_dictionary(item):
        item = item.value_type
    if pa.types.is_timestamp(item) or pa.types.is_duration(item) or pa.types.is_time(item):
        return "int64", f"as int64: the count of {item.unit} (use type: bytes for ISO 8601 text)"
    if pa.types.is_date32(item):
        return "int64", "as int64: days since 1970-01-01 (use type: bytes for ISO 8601 text)"
    if pa.types.is_date64(item):
        return "int64", "as int64: milliseconds since 1970-01-01 (use type: bytes for ISO 8601 text)"
    if pa.types.is_decimal(item):
        return "float", "as a 32-bit float, rounded (use type: bytes for the exact decimal text)"
    if pa.types.is_null(item):
        return "float", "holds only nulls; float is a guess, set the real type"
    return None


def resolve_spec(spec: FeatureSpec, arrow_type: pa.DataType, text_sample: pa.Array | None = None,
                 infer_from_text: bool = False) -> FeatureSpec:
    """Complete a spec on its source's Arrow type (infer a missing type, mark lists) or say why it cannot map.

    infer_from_text is true for CSV inputs: a string column without a declared type becomes
    int64, else float, else bytes by what its values in text_sample (a sample of the file) parse as.
    Typed (Parquet) columns keep their natural type.
    """
    if spec.file is not None:
        if not (_is_text(arrow_type) or _is_binary(arrow_type) or pa.types.is_null(arrow_type)):
            raise ArrowConversionError(f"from_file needs a column of paths (strings), but column {spec.source!r} has "
                                       f"Arrow type {arrow_type}")
        return replace(spec, type=spec.file.feature_type, is_list=False)
    if spec.time_unit is not None:
        if not (_is_text(arrow_type) or _is_binary(arrow_type) or pa.types.is_timestamp(arrow_type)
                or pa.types.is_date(arrow_type)):
            raise ArrowConversionError(f"type timestamp needs a text, timestamp or date column, but column "
                                       f"{spec.source!r} has Arrow type {arrow_type}")
        return replace(spec, type="int64", is_list=False)
    if spec.separator is not None and not (_is_text(arrow_type) or _is_binary(arrow_type)):
        raise ArrowConversionError(f"separator needs a string column, but column {spec.source!r} has Arrow type {arrow_type}")
    leaf, sizes = tensor_nesting(arrow_type)
    if spec.tensor_shape is not None or len(sizes) > 1 or isinstance(arrow_type, pa.FixedShapeTensorType):
        if spec.separator is None and not sizes:
            raise ArrowConversionError(f"shape needs a list, nested list, fixed_shape_tensor or (with a separator) "
                                       f"string column, but column {spec.source!r} has Arrow type {arrow_type}")
        tensor = _tensor_spec(spec, arrow_type)
        flat = pa.list_(leaf) if sizes else arrow_type  # the item rules below are those of a flat list
        return replace(resolve_spec(replace(tensor, tensor_shape=None, length=None), flat, text_sample, infer_from_text),
                       tensor_shape=tensor.tensor_shape, length=tensor.length, is_list=True)
    if spec.length is not None and spec.separator is None and not _is_list(arrow_type):
        raise ArrowConversionError(
            f"length needs a separator or a list column, but column {spec.source!r} has Arrow type {arrow_type}")
    item_type = arrow_type.value_type if _is_list(arrow_type) else arrow_type
    allowed = _allowed_types(item_type)
    if not allowed:
        raise ArrowConversionError(
            f"column {spec.source!r} has Arrow type {arrow_type}, which has no Example feature mapping: "
            f"{_suggestion(spec.name, arrow_type)}")
    feature_type = spec.type
    if feature_type is None:
        if infer_from_text and (_is_text(item_type) or _is_binary(item_type) or pa.types.is_null(item_type)):
            sample = text_sample
            if sample is not None and spec.separator is not None:
                sample = pc.list_flatten(_split_text(_as_text(sample), spec.separator))
            feature_type = infer_text_type(sample)
        else:
            feature_type = _natural_type(item_type)
        if feature_type is None:
            raise ArrowConversionError(
                f"column {spec.source!r} has Arrow type {arrow_type}, which has no Example feature mapping without "
                f"a declared type: {_suggestion(spec.name, arrow_type)}")
    elif feature_type not in allowed:
        why = ("a float column is never cast to int64 (that would silently drop fractions); declare type: float"
               if feature_type == "int64" and pa.types.is_floating(item_type)
               else f"allowed for it: {', '.join(allowed)}")
        raise ArrowConversionError(f"type {feature_type} does not fit column {spec.source!r} of Arrow type {arrow_type}: {why}")
    length = spec.length
    if length is None and pa.types.is_fixed_size_list(arrow_type):
        length = arrow_type.list_size
    is_list = spec.separator is not None or _is_list(arrow_type)
    return replace(spec, type=feature_type, is_list=is_list, length=length)


def infer_text_type(values: pa.Array | None, true_values: Sequence[str] = (), false_values: Sequence[str] = (),
                    codes_as_text: bool = True) -> str:
    """int64 when every non-null value parses as one, else float when every one parses as a number, else bytes.

    The same parsers convert the data later, so a value that does not parse as the type inferred
    from a sample is a bad row then (the type never changes mid-build). true_values and
    false_values count as 1 and 0, as they convert. With codes_as_text (the default), values that
    are codes rather than numbers make the column bytes: a leading zero before a digit ("02134",
    "007"; not "0" or "0.5"), or an integer beyond int64 (a float would round it).
    """
    if values is None:
        return "bytes"
    text = _booleans_as_digits(_as_text(values), true_values, false_values)
    if text.null_count == len(text):
        return "bytes"
    if codes_as_text and pc.any(pc.match_substring_regex(text, _LEADING_ZERO_TEXT)).as_py():
        return "bytes"
    not_int64 = _parse_int64(text)[1]
    if not_int64 is None:
        return "int64"
    if codes_as_text and pc.any(pc.match_substring_regex(text.take(pa.array(not_int64)), _INT_TEXT)).as_py():
        return "bytes"  # an integer beyond int64's range: never rounded to a float
    if _parse_float(text)[1] is None:
        return "float"
    return "bytes"


def float32_rounding(values: pa.Array | None) -> tuple[str, int] | None:
    """The first sampled whole number float32 cannot hold exactly (its text, what float32 stores), or None.

    Example floats are 32-bit: whole numbers above 2**24 may round (16777217 -> 16777216), which
    breaks ids and dates like 20120101 silently; inference says so rather than change the type.
    """
    if values is None or not (_is_text(values.type) or _is_binary(values.type)):
        return None
    text = _as_text(values)
    numbers = np.asarray(_parse_float(text)[0].fill_null(0.0), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        stored = numbers.astype(np.float32).astype(np.float64)
        rounded = np.isfinite(numbers) & (np.abs(numbers) <= _FLOAT32_MAX) & (numbers == np.floor(numbers)) \
            & (stored != numbers)
    found = np.flatnonzero(rounded)
    if not len(found):
        return None
    return str(text[int(found[0])].as_py()), int(stored[found[0]])


# Tokens that stand in for a missing number when a column holds only them and numbers; NaN stays a float value.
NULL_TOKEN_CANDIDATES = ("", "NA", "N/A", "NULL", "null", "None", "none", "nan", "NaN", "-")
LIST_SEPARATORS = (";", "|")


def infer_null_tokens(columns: Iterable[pa.Array]) -> list[str]:
    """Tokens that appear in sampled text columns whose other values are all numbers: they stand for missing values."""
    found: set[str] = set()
    for column in columns:
        text = _as_text(column)
        present = [token for token in NULL_TOKEN_CANDIDATES if pc.any(pc.equal(text, token)).as_py()]
        if not present:
            continue
        rest = pc.if_else(pc.is_in(text, value_set=pa.array(present)), pa.scalar(None, pa.string()), text)
        if rest.null_count < len(rest) and infer_text_type(rest) in ("int64", "float"):
            found.update(token for token in present if token.lower() != "nan")
    return [token for token in NULL_TOKEN_CANDIDATES if token in found]


def infer_text_feature(name: str, values: pa.Array, source: str | None = None, true_values: Sequence[str] = (),
                       false_values: Sequence[str] = ()) -> FeatureSpec:
    """The feature a sampled CSV column becomes: int64, else float, else an ISO 8601 timestamp (in the coarsest
    unit that holds every value), else numbers joined by ";" or "|" as a list, else bytes. Nulls in the sample
    make it on_null: omit; none make a later null a bad row (on_null: error)."""
    text = _as_text(values)
    spec = FeatureSpec(name, infer_text_type(text, true_values, false_values), source or name,
                       on_null="omit" if text.null_count else "error")
    if spec.type == "bytes":
        return _timestamp_feature(spec, text) or _list_feature(spec, text) or spec
    return spec


def _timestamp_feature(spec: FeatureSpec, text: pa.Array) -> FeatureSpec | None:
    present = text.drop_null()
    if not len(present) or not pc.all(pc.match_substring_regex(present, _ISO_DATE_TEXT)).as_py():
        return None
    for unit in TIME_UNITS:
        if not _iso_timestamps(present, unit).null_count:
            return replace(spec, type="int64", time_unit=unit)
    return None


def infer_boolean_tokens(columns: Iterable[pa.Array]) -> tuple[list[str], list[str]]:
    """The true and false spellings (true/True/TRUE, false/...) of sampled columns that hold nothing else."""
    found: set[str] = set()
    for column in columns:
        values = set(pc.unique(_as_text(column).drop_null()).to_pylist())
        if values and values <= set(TRUE_TOKENS + FALSE_TOKENS):
            found |= values
    spellings = [index for index in range(len(TRUE_TOKENS)) if {TRUE_TOKENS[index], FALSE_TOKENS[index]} & found]
    return [TRUE_TOKENS[index] for index in spellings], [FALSE_TOKENS[index] for index in spellings]


def _list_feature(spec: FeatureSpec, text: pa.Array) -> FeatureSpec | None:
    """A list feature when every non-null value is numbers joined by one of the list separators."""
    present = text.drop_null()
    if not len(present):
        return None
    for separator in LIST_SEPARATORS:
        if not pc.all(pc.match_substring(present, separator)).as_py():
            continue
        parts = pc.split_pattern(present, separator)
        item_type = infer_text_type(pc.list_flatten(parts))
        if item_type == "bytes":
            continue
        counts = np.asarray(pc.list_value_length(parts))
        length = int(counts[0]) if (counts == counts[0]).all() else None
        return replace(spec, type=item_type, separator=separator, length=length, is_list=True)
    return None


# ----------------------------------------------------------------------------------- conversion


@dataclass
class _Problems:
    """Per-row reasons collected while converting the columns of one batch."""

    count: int

    def __post_init__(self) -> None:
        self.bad = np.zeros(self.count, dtype=bool)
        self.reasons: dict[int, list[str]] = {}

    def add(self, rows: np.ndarray, reasons: Sequence[str]) -> None:
        self.bad[rows] = True
        for row, reason in zip(rows.tolist(), reasons):
            self.reasons.setdefault(row, []).append(reason)


def convert_batch(batch: pa.RecordBatch, specs: Sequence[FeatureSpec], provenance: Provenance,
                  true_values: Sequence[str] = (), false_values: Sequence[str] = (),
                  null_text: Mapping[str, pa.Array] | None = None, null_values: Sequence[str] = ()) -> ConvertedBatch:
    """Turn input columns into feature columns; bad rows come out separately with file, line, reason, raw text.

    specs must be resolved (see resolve_spec). String columns declared int64 or float are parsed,
    true_values and false_values (CSV tokens) as 1 and 0. null_text (CSV read with per-feature
    null_values): per column, the token each null cell held; a feature whose own null_values (else
    the file-wide null_values) leave that token out reads it as a value.
    """
    problems = _Problems(batch.num_rows)
    booleans = (tuple(true_values), tuple(false_values))
    sources = [_with_null_tokens(spec, _source_column(batch, spec.source_ref, provenance.path), null_text, null_values)
               for spec in specs]
    reads = _read_files(specs, sources, provenance.path)
    columns = [_convert_column(spec, source, problems, booleans) if spec.file is None
               else _convert_file_column(spec, source, reads[_file_key(spec)], problems)
               for spec, source in zip(specs, sources)]
    if reads:
        _check_record_file_bytes(specs, columns, problems)
    bad_rows = []
    kept_rows = np.arange(batch.num_rows, dtype=np.int64)
    if problems.bad.any():
        kept_rows = np.flatnonzero(~problems.bad)
        rows = np.flatnonzero(problems.bad)
        raws = provenance.raw_text(rows)
        lines = np.asarray(provenance.lines)
        bad_rows = [BadRow(provenance.path, int(lines[row]), "; ".join(problems.reasons[row]), raw)
                    for row, raw in zip(rows.tolist(), raws)]
        keep = pa.array(~problems.bad)
        columns = [column.filter(keep) for column in columns]
    if not specs:
        raise ArrowConversionError("no features to convert: a build needs at least one feature")
    schema = pa.schema([pa.field(spec.name, output_type(spec)) for spec in specs])
    return ConvertedBatch(batch=pa.RecordBatch.from_arrays(columns, schema=schema), bad_rows=bad_rows,
                          kept_rows=kept_rows)


# A record's other features and framing need room beside its files' bytes.
_RECORD_FILE_BYTES = MAX_PAYLOAD_SIZE - (16 << 20)


_IMAGE_FACTS = {"height": 0, "width": 1, "channels": 2, "format": 3}  # FileRead.image's fields


def _file_key(spec: FeatureSpec) -> tuple[SourceRef, str | None, str | None]:
    assert spec.file is not None
    return spec.source_ref, spec.file.root, spec.file.file_root


def _read_files(specs: Sequence[FeatureSpec], sources: Sequence[pa.Array], input_path: str
                ) -> dict[tuple[SourceRef, str | None, str | None], list[FileRead | None]]:
    """The files the from_file features of a batch name, each source column's read once (concurrently) for all
    the features that read it: bytes up to their largest max_bytes, the image header when a fact is asked."""
    wanted: dict[tuple[SourceRef, str | None, str | None], tuple[pa.Array, list[FileOptions]]] = {}
    for spec, source in zip(specs, sources):
        if spec.file is not None:
            wanted.setdefault(_file_key(spec), (source, []))[1].append(spec.file)
    reads = {}
    for key, (source, options) in wanted.items():
        limits = [option.max_bytes for option in options if option.part == "bytes" and option.max_bytes is not None]
        paths = _path_texts(source)
        reads[key] = read_files(paths, files_base(input_path, key[1]), max(limits) if limits else None,
                                image=any(option.part != "bytes" for option in options),
                                confine=confinement(key[2], key[1]))
    return reads


def _path_texts(column: pa.Array) -> list[str | None]:
    """A column of paths as Python strings; bytes that are not UTF-8 kept as surrogate escapes (as os paths are)."""
    if _is_binary(column.type):
        return [None if value is None else value.decode("utf-8", "surrogateescape")
                for value in column.cast(pa.binary()).to_pylist()]
    return _as_text(column).to_pylist()


def _convert_file_column(spec: FeatureSpec, column: pa.Array, reads: list[FileRead | None],
                         problems: _Problems) -> pa.Array:
    """A from_file feature's values from its files as read; a file that cannot be read, is above max_file_bytes
    or (for image facts) is not an image makes its row bad."""
    options = spec.file
    assert options is not None
    label = f"feature {spec.name!r}" + (f" (column {spec.source!r})" if spec.source != spec.name else "")
    values: list[Any] = []
    rows: list[int] = []
    reasons: list[str] = []
    fact = _IMAGE_FACTS.get(options.part)
    for row, read in enumerate(reads):
        value: Any = None
        problem: str | None = None
        if read is None:
            pass  # a null path: on_null decides below
        elif read.problem is not None:
            problem = read.problem
        elif fact is None:
            limit = options.max_bytes
            if read.data is None or (limit is not None and len(read.data) > limit):
                size = f"{read.size} bytes" if read.size >= 0 else f"more than {limit} bytes"
                problem = (f"{read.path} is {size}, but max_file_bytes is {limit} bytes (raise "
                           f"features.{spec.name}.max_file_bytes, up to 1GiB, to keep it)")
            else:
                value = read.data
        elif read.image is None:
            problem = read.image_problem or f"{read.path}: no image header was read"
        else:
            value = read.image[fact]
        values.append(value)
        if problem is not None:
            rows.append(row)
            reasons.append(f"{label}: {problem}")
    if rows:
        problems.add(np.asarray(rows, dtype=np.int64), reasons)
    return _apply_on_null(spec, pa.array(values, output_type(spec)), column.is_null(), problems, label)


def _check_record_file_bytes(specs: Sequence[FeatureSpec], columns: Sequence[pa.Array], problems: _Problems) -> None:
    """Rows whose files together are more than one record can hold (TFRecord's 2 GiB - 1) are bad."""
    totals = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for spec, column in zip(specs, columns):
        if spec.file is not None and spec.file.part == "bytes":
            totals += np.asarray(pc.fill_null(pc.binary_length(column), 0), dtype=np.int64)
    over = np.flatnonzero(totals > _RECORD_FILE_BYTES)
    problems.add(over, [f"the files of this row hold {int(totals[row])} bytes together, more than one record can "
                        f"({_RECORD_FILE_BYTES} bytes); read fewer files per row" for row in over.tolist()])


def _with_null_tokens(spec: FeatureSpec, column: pa.Array, null_text: Mapping[str, pa.Array] | None,
                      file_tokens: Sequence[str]) -> pa.Array:
    """The column with the null cells whose token is not null for this feature given back their text."""
    path = spec.source_path or (spec.source,)
    if not null_text or len(path) != 1 or path[0] not in null_text or not column.null_count:
        return column
    tokens = spec.null_values if spec.null_values is not None else tuple(file_tokens)
    text = null_text[path[0]]
    restore = pc.and_(text.is_valid(), pc.invert(pc.is_in(text, value_set=pa.array(list(tokens), text.type))))
    return pc.if_else(restore, text, column)


def _source_column(batch: pa.RecordBatch, source: SourceRef, path: str) -> pa.Array:
    found = _find_source(batch.schema.names, source)
    if found is None:
        raise ArrowConversionError(
            f"{path}: has no column {source!r} (columns: {', '.join(batch.schema.names)}); "
            "every input file must have the columns the features read")
    head, fields = found
    column = batch.column(head)
    if fields:
        column = pc.struct_field(column, fields)
    if isinstance(column, pa.ChunkedArray):
        column = pa.concat_arrays(column.chunks) if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if isinstance(column, pa.ExtensionArray) and isinstance(column.type, pa.FixedShapeTensorType):
        column = column.storage  # a fixed_size_list of the tensor's values, row-major
    return plain_list(column)


def _convert_column(spec: FeatureSpec, column: pa.Array, problems: _Problems,
                    booleans: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())) -> pa.Array:
    label = f"feature {spec.name!r}" + (f" (column {spec.source!r})" if spec.source != spec.name else "")
    if spec.time_unit is not None:
        return _apply_on_null(spec, _convert_timestamp(spec, column, problems, label), column.is_null(), problems, label)
    feature_type = spec.type
    assert feature_type is not None  # specs are resolved before any batch is converted
    if spec.separator is None and feature_type in ("int64", "float") and any(booleans) and (
            _is_text(column.type) or _is_binary(column.type)):
        column_text = _booleans_as_digits(_as_text(column), *booleans)
        return _apply_on_null(spec, _convert_scalar(feature_type, column_text, problems, label), column.is_null(),
                              problems, label)
    if spec.separator is not None:
        values = _split_text(_as_text(column), spec.separator)
    else:
        values = column
    shaped = None
    if _is_list(values.type) and _is_list(values.type.value_type):
        values, shaped = _flatten_nested(spec, values, problems, label)
    if _is_list(values.type):
        result = _convert_list(spec, values, problems, label, shaped)
    else:
        result = _convert_scalar(feature_type, values, problems, label)
    return _apply_on_null(spec, result, column.is_null(), problems, label)


def _split_text(text: pa.Array, separator: str) -> pa.Array:
    """A string column split into lists; "" is the empty list, null stays null."""
    split = _split_on_byte(text, separator)
    if split is not None:
        return split
    parts = pc.split_pattern(text, separator)
    empty = pc.fill_null(pc.equal(text, ""), False)
    if not pc.any(empty).as_py():
        return parts
    offsets = np.asarray(parts.offsets)
    lengths = np.diff(offsets)
    lengths[np.asarray(empty)] = 0
    keep = np.repeat(lengths > 0, np.diff(offsets))
    items = parts.values.slice(offsets[0], offsets[-1] - offsets[0]).filter(pa.array(keep))
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(new_offsets), items, mask=pc.is_null(text))


def _split_on_byte(text: pa.Array, separator: str) -> pa.Array | None:
    """The fast split for a one-byte separator: the separators' places cut the items, the rest is the data.

    Works on the buffers (numpy finds the separators, bytes.replace drops them; no per-item
    allocation); None when it does not apply.
    """
    sep = separator.encode("utf-8")
    if len(sep) != 1 or not (pa.types.is_string(text.type) or pa.types.is_binary(text.type)):
        return None
    count = len(text)
    offsets = np.frombuffer(text.buffers()[1], np.int32, count + 1, offset=4 * text.offset).astype(np.int64)
    valid = np.asarray(text.is_valid())
    filled = offsets[1:] > offsets[:-1]
    if (filled & ~valid).any():
        return None
    low, high = int(offsets[0]), int(offsets[-1])
    data = text.buffers()[2]
    segment = data.slice(low, high - low).to_pybytes() if data is not None and high > low else b""
    seps = np.flatnonzero(np.frombuffer(segment, np.uint8) == sep[0])
    seps_before = np.searchsorted(seps, offsets - low)
    # A row of n separators holds n + 1 items, an empty (or null) row none.
    list_offsets = np.concatenate([[0], np.cumsum(filled)]) + seps_before
    item_offsets = np.empty(int(list_offsets[-1]) + 1, np.int64)
    is_first = np.zeros(len(item_offsets) - 1, dtype=bool)
    first_items = list_offsets[:-1][filled]
    is_first[first_items] = True
    # Item offsets in the data without separators: a row's first item starts where the row does,
    # every other item just after a separator; both less the separators before them.
    item_offsets[first_items] = (offsets[:-1] - low - seps_before[:-1])[filled]
    item_offsets[:-1][~is_first] = seps + 1 - np.arange(1, len(seps) + 1)
    item_offsets[-1] = (high - low) - len(seps)
    compact = segment.replace(sep, b"") if len(seps) else segment
    if len(compact) > np.iinfo(np.int32).max:
        return None
    items = pa.Array.from_buffers(text.type, len(item_offsets) - 1,
                                  [None, pa.py_buffer(item_offsets.astype(np.int32)), pa.py_buffer(compact)])
    return pa.ListArray.from_arrays(pa.array(list_offsets.astype(np.int32)), items, mask=pa.array(~valid))


def _flatten_nested(spec: FeatureSpec, lists: pa.Array, problems: _Problems, label: str) -> tuple[pa.Array, np.ndarray]:
    """A nested list column as one flat list of its items per row (row-major), and the rows found bad here: those
    with a null inner list or a list whose length is not its level's size in the feature's shape."""
    dims = spec.tensor_shape
    assert dims is not None  # resolve_spec makes every nested list column a tensor feature
    rows = len(lists)
    flagged = np.zeros(rows, dtype=bool)
    level, owner, depth = lists, np.arange(rows, dtype=np.int64), 0
    while True:
        counts = np.asarray(pc.fill_null(pc.list_value_length(level), 0), dtype=np.int64)
        present = np.asarray(level.is_valid())
        wrong = np.flatnonzero(present & (counts != dims[depth]) | (~present if depth else False))
        reasons = {}
        for item in wrong.tolist():
            row = int(owner[item])
            if not flagged[row] and row not in reasons:
                reasons[row] = (f"{label}: a list at depth {depth + 1} is null (a tensor's lists cannot be)" if not present[item]
                                else f"{label}: a list at depth {depth + 1} holds {counts[item]} values, but shape "
                                     f"{list(dims)} needs {dims[depth]} there")
        if reasons:
            problems.add(np.fromiter(reasons, dtype=np.int64, count=len(reasons)), list(reasons.values()))
            flagged[list(reasons)] = True
        items = pc.list_flatten(level)
        if not _is_list(items.type):
            break
        owner = owner[np.asarray(pc.list_parent_indices(level), dtype=np.int64)]
        level, depth = plain_list(items), depth + 1
    per_row = np.bincount(owner, weights=counts, minlength=rows).astype(np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, items, mask=lists.is_null()), flagged


def _convert_list(spec: FeatureSpec, lists: pa.Array, problems: _Problems, label: str,
                  shaped: np.ndarray | None = None) -> pa.Array:
    """A list column's items converted; shaped: rows whose nested lists _flatten_nested already found bad (their
    count is not checked again)."""
    valid = np.asarray(lists.is_valid())
    counts = np.asarray(pc.fill_null(pc.list_value_length(lists), 0), dtype=np.int64)
    items = pc.list_flatten(lists)
    item_problems = _Problems(len(items))
    feature_type = spec.type
    assert feature_type is not None  # specs are resolved before any batch is converted
    converted = _convert_scalar(feature_type, items, item_problems, label)
    null_items = np.asarray(items.is_null()) if items.null_count else np.zeros(len(items), dtype=bool)
    flagged = np.flatnonzero(item_problems.bad | null_items)
    if len(flagged):
        item_rows = np.asarray(pc.list_parent_indices(lists))
        starts = np.cumsum(counts) - counts
        reasons = []
        for item in flagged.tolist():
            why = item_problems.reasons.get(item, [f"{label}: is null (an Example list cannot hold a null)"])
            reasons.append(f"{label}: item {item - starts[item_rows[item]]} " + "; ".join(w.split(": ", 1)[1] for w in why))
        problems.add(item_rows[flagged], reasons)
    if spec.length is not None:
        wrong = np.flatnonzero(valid & (counts != spec.length) & (~shaped if shaped is not None else True))
        expected = (f"length is {spec.length}" if spec.tensor_shape is None
                    else f"shape {list(spec.tensor_shape)} holds {spec.length} (values are never reshaped)")
        problems.add(wrong, [f"{label}: has {counts[row]} values, but {expected}" for row in wrong.tolist()])
    if converted.null_count:
        converted = pc.fill_null(converted, _zero(feature_type))  # only in rows already reported as bad
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, converted, type=output_type(spec), mask=pa.array(~valid))


def _zero(feature_type: str) -> pa.Scalar:
    return {"int64": pa.scalar(0, pa.int64()), "float": pa.scalar(0.0, pa.float32()),
            "bytes": pa.scalar(b"", pa.binary())}[feature_type]


def _convert_scalar(feature_type: str, values: pa.Array, problems: _Problems, label: str) -> pa.Array:
    arrow_type = values.type
    if pa.types.is_null(arrow_type):
        return pa.nulls(len(values), _scalar_output(feature_type))
    if feature_type == "bytes":
        if _is_text(arrow_type) or (_is_binary(arrow_type) and not pa.types.is_fixed_size_binary(arrow_type)):
            return values.cast(pa.binary())
        if pa.types.is_fixed_size_binary(arrow_type):
            return values.cast(pa.binary())
        return pc.cast(pc.cast(values, pa.string()), pa.binary())
    if _is_text(arrow_type) or _is_binary(arrow_type):
        text = _as_text(values)
        if feature_type == "int64":
            parsed, bad = _parse_int64(text)
            if bad is not None:
                problems.add(bad, [f"{label}: {_quote(text[row])} is not an int64 ({_int_problem(text[row])})"
                                   for row in bad.tolist()])
            return parsed
        parsed, bad = _parse_float(text)
        if bad is not None:
            problems.add(bad, [f"{label}: {_quote(text[row])} is not a number{_empty_hint(text[row])}"
                               for row in bad.tolist()])
        return _to_float32(parsed, problems, label, text)
    if feature_type == "int64":
        return _to_int64(values, problems, label)
    if pa.types.is_boolean(arrow_type):
        return pc.cast(pc.cast(values, pa.int8()), pa.float32())
    if pa.types.is_integer(arrow_type) or pa.types.is_float16(arrow_type) or pa.types.is_float32(arrow_type):
        return pc.cast(values, pa.float32(), safe=False)
    return _to_float32(pc.cast(values, pa.float64(), safe=False), problems, label, None)


def _booleans_as_digits(text: pa.Array, true_values: Sequence[str], false_values: Sequence[str]) -> pa.Array:
    """Text with the true and false tokens replaced by "1" and "0" (pyarrow's true_values/false_values)."""
    for tokens, digit in ((true_values, "1"), (false_values, "0")):
        if tokens:
            hit = pc.fill_null(pc.is_in(text, value_set=pa.array(list(tokens), pa.string())), False)
            text = pc.if_else(hit, pa.scalar(digit, pa.string()), text)
    return text


def _convert_timestamp(spec: FeatureSpec, column: pa.Array, problems: _Problems, label: str) -> pa.Array:
    """Timestamp text (ISO 8601, or time_format) or a timestamp/date column as int64 counts of time_unit since the epoch."""
    unit = spec.time_unit
    assert unit is not None
    if _is_text(column.type) or _is_binary(column.type):
        text = _as_text(column)
        if spec.time_format is not None:
            counts = pc.cast(pc.strptime(text, format=spec.time_format, unit=unit, error_is_null=True), pa.int64())
        else:
            counts = _iso_timestamps(text, unit)
    else:
        target = pa.timestamp(unit, tz=column.type.tz) if pa.types.is_timestamp(column.type) else pa.timestamp(unit)
        counts = _cast_or_null(column, target)
        text = None
    failed = np.flatnonzero(np.asarray(pc.and_(counts.is_null(), column.is_valid())))
    if len(failed):
        problems.add(failed, [f"{label}: {_timestamp_problem(spec, column, text, row)}" for row in failed.tolist()])
    return counts


def _timestamp_problem(spec: FeatureSpec, column: pa.Array, text: pa.Array | None, row: int) -> str:
    if text is None:
        return f"{column[row].as_py()} is not a whole number of {spec.time_unit} (use a finer unit)"
    shown = _quote(text[row])
    if spec.time_format is not None:
        return f"{shown} does not match format {spec.time_format!r}"
    # A copy, not a slice: for a sliced array pyarrow 19 to 23 gives all nulls here (25 does not).
    if _iso_timestamps(text.take([row]), "ns").null_count == 0:
        finer = ", ".join(TIME_UNITS[TIME_UNITS.index(spec.time_unit) + 1:])
        return f"{shown} is not an ISO 8601 timestamp in whole {spec.time_unit} (use a finer unit: {_or_list(finer)})"
    return f"{shown} is not an ISO 8601 timestamp (set format, e.g. format: \"%d/%m/%Y\")"


def _or_list(items: str) -> str:
    head, _, last = items.rpartition(", ")
    return f"{head} or {last}" if head else last


def _iso_timestamps(text: pa.Array, unit: str) -> pa.Array:
    """ISO 8601 text as int64 counts of unit since the epoch (a zone offset is applied, no offset is UTC); null where it is
    not."""
    text = _without_zero_digits_beyond(text, unit)
    zoned = pc.fill_null(pc.match_substring_regex(text, _ZONED_TEXT), False)
    no_text = pa.scalar(None, pa.string())
    naive = _cast_or_null(pc.if_else(zoned, no_text, text), pa.timestamp(unit))
    aware = _cast_or_null(pc.if_else(zoned, text, no_text), pa.timestamp(unit, tz="UTC"))
    return pc.if_else(zoned, aware, naive)


_FRACTION_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _without_zero_digits_beyond(text: pa.Array, unit: str) -> pa.Array:
    """ISO text with trailing zero fraction digits finer than unit dropped ("00:00:00.000" is a whole second)."""
    digits = _FRACTION_DIGITS.get(unit)
    if digits is None or digits == 9:
        return text
    seconds = r"[T ]\d\d:\d\d:\d\d" + (rf"\.\d{{{digits}}}" if digits else "")
    zeros = r"0+" if digits else r"\.0+"
    return pc.replace_substring_regex(text, pattern=f"({seconds}){zeros}($|Z|[+-]\\d)", replacement=r"\1\2")


def _cast_or_null(values: pa.Array, target: pa.DataType) -> pa.Array:
    """values cast (safely) to a timestamp type, as int64; values that do not cast become null, found one by one."""
    try:
        return pc.cast(values.cast(target), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass  # some value does not cast: find which, one by one (only batches with a bad value get here)
    counts = []
    for index in range(len(values)):
        try:
            counts.append(pc.cast(values.slice(index, 1).cast(target), pa.int64())[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            counts.append(None)
    return pa.array(counts, pa.int64())


def _scalar_output(feature_type: str) -> pa.DataType:
    return ARROW_TYPES[feature_type]


def _as_text(values: pa.Array) -> pa.Array:
    if pa.types.is_string(values.type):
        return values
    if _is_binary(values.type) and not pa.types.is_fixed_size_binary(values.type):
        return values.cast(pa.binary()).view(pa.string())
    return values.cast(pa.string())


def _quote(value: pa.Scalar) -> str:
    text = value.as_py()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _int_problem(value: pa.Scalar) -> str:
    text = pa.array([value.as_py()], pa.string())
    if pc.match_substring_regex(text, _INT_TEXT)[0].as_py():
        return "out of the int64 range -2**63 .. 2**63-1"
    if pc.match_substring_regex(text, _FLOAT_TEXT)[0].as_py():
        return "a float value in an int64 feature is never rounded; declare type: float"
    return "expected an optional sign and decimal digits" + _empty_hint(value)


def _empty_hint(value: pa.Scalar) -> str:
    if value.as_py() == "":
        return "; an empty field is a value, add \"\" to input.csv.null_values to read it as null"
    return ""


def _data_contains(text: pa.Array, byte_values: bytes) -> bool:
    """Whether any of the given bytes occurs in the character data of a string array (a fast scan)."""
    offsets_buffer, data_buffer = text.buffers()[1], text.buffers()[2]
    if data_buffer is None or len(text) == 0:
        return False
    bounds = np.frombuffer(offsets_buffer, dtype=np.int32, count=len(text) + 1, offset=4 * text.offset)
    data = np.frombuffer(data_buffer, dtype=np.uint8, count=int(bounds[-1] - bounds[0]), offset=int(bounds[0]))
    return any(bool((data == value).any()) for value in byte_values)


def _parse_int64(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Strings to int64 (nulls stay null); also the indices of the values that are not int64 text."""
    try:
        values = pc.cast(text, pa.int64())
        if not _data_contains(text, b"xX"):  # Arrow also reads hexadecimal "0x10"; we do not
            return values, None
    except pa.ArrowInvalid:
        pass  # some value is not int64 text: find which below
    shaped = pc.match_substring_regex(text, _INT_TEXT)
    digits = pc.replace_substring_regex(text, r"^[+-]?0*", "")
    size = pc.binary_length(digits)
    limit = pc.if_else(pc.starts_with(text, "-"), _INT64_MIN_DIGITS, _INT64_MAX_DIGITS)
    in_range = pc.or_(pc.less(size, 19), pc.and_(pc.equal(size, 19), pc.less_equal(digits, limit)))
    good = pc.and_(shaped, in_range)
    bad = np.flatnonzero(np.asarray(pc.fill_null(pc.invert(good), False)))
    cleaned = pc.if_else(good, pc.replace_substring_regex(text, r"^\+", ""), pa.scalar(None, pa.string()))
    return pc.cast(cleaned, pa.int64()), (bad if len(bad) else None)


def _parse_float(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Strings to float64 (nulls stay null); also the indices of the values that are not number text."""
    try:
        return pc.cast(text, pa.float64()), None
    except pa.ArrowInvalid:
        pass  # some value is not number text: find which below
    good = pc.match_substring_regex(text, _FLOAT_TEXT)
    bad = np.flatnonzero(np.asarray(pc.fill_null(pc.invert(good), False)))
    cleaned = pc.if_else(good, text, pa.scalar(None, pa.string()))
    return pc.cast(cleaned, pa.float64()), (bad if len(bad) else None)


def _to_float32(values: pa.Array, problems: _Problems, label: str, text: pa.Array | None) -> pa.Array:
    """float64 to float32, making finite values beyond float32's range bad rows (never silent infinities)."""
    numbers = np.asarray(values.fill_null(0.0)) if values.null_count else np.asarray(values)
    overflow = np.abs(numbers) >= _FLOAT32_ROUNDS_TO_INFINITY
    if overflow.any():
        if text is None:
            overflow &= np.isfinite(numbers)
        else:  # "1e400" parsed to infinity too; only the spelled-out infinities are infinite values
            overflow &= ~np.asarray(pc.fill_null(pc.match_substring_regex(text, _INFINITY_TEXT), False))
        rows = np.flatnonzero(overflow)
        if len(rows):
            shown = [(_quote(text[row]) if text is not None else repr(float(numbers[row]))) for row in rows.tolist()]
            problems.add(rows, [f"{label}: {value} is beyond the float32 range (Example floats are 32-bit)"
                                for value in shown])
    return pc.cast(values, pa.float32(), safe=False)


def _to_int64(values: pa.Array, problems: _Problems, label: str) -> pa.Array:
    arrow_type = values.type
    if pa.types.is_boolean(arrow_type):
        return pc.cast(values, pa.int64())
    if _is_temporal(arrow_type):
        width = pa.int32() if arrow_type.bit_width == 32 else pa.int64()
        return pc.cast(values.view(width), pa.int64())
    if pa.types.is_uint64(arrow_type):
        numbers = np.asarray(values.fill_null(0)) if values.null_count else np.asarray(values)
        rows = np.flatnonzero(numbers > np.uint64((1 << 63) - 1))
        if len(rows):
            problems.add(rows, [f"{label}: {int(numbers[row])} is out of the int64 range -2**63 .. 2**63-1"
                                for row in rows.tolist()])
            values = pc.if_else(pa.array(numbers > np.uint64((1 << 63) - 1)), pa.scalar(None, arrow_type), values)
        return pc.cast(values, pa.int64(), safe=False)
    if pa.types.is_decimal(arrow_type):
        try:
            return pc.cast(values, pa.int64())
        except pa.ArrowInvalid:
            return _decimal_to_int64_rowwise(values, problems, label)
    return pc.cast(values, pa.int64())


def _decimal_to_int64_rowwise(values: pa.Array, problems: _Problems, label: str) -> pa.Array:
    """The failure path of a scale-0 decimal column: find the values beyond int64 one by one."""
    limit = (1 << 63) - 1
    numbers = values.to_pylist()
    rows = [row for row, number in enumerate(numbers) if number is not None and not -limit - 1 <= number <= limit]
    problems.add(np.asarray(rows, dtype=np.int64),
                 [f"{label}: {numbers[row]} is out of the int64 range -2**63 .. 2**63-1" for row in rows])
    mask = np.zeros(len(values), dtype=bool)
    mask[rows] = True
    return pc.cast(pc.if_else(pa.array(mask), pa.scalar(None, values.type), values), pa.int64())


def _apply_on_null(spec: FeatureSpec, values: pa.Array, input_nulls: pa.Array, problems: _Problems,
                   label: str) -> pa.Array:
    """Input nulls left where on_null is omit, filled with the default, or made bad rows when it is error.

    Values that failed to convert are null in values too, but their rows are already bad.
    """
    if not values.null_count:
        return values
    if spec.on_null == "default":
        default = list(spec.default) if spec.is_list else spec.default
        return pc.fill_null(values, pa.scalar(default, output_type(spec)))
    if spec.on_null == "error":
        rows = np.flatnonzero(np.asarray(input_nulls))
        problems.add(rows, [f"{label}: is null (on_null: error; use omit or default to accept nulls)"] * len(rows))
    return values
