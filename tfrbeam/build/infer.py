"""`tfrbeam infer-config`: write a complete, commented build config inferred from an input file.

Parquet: one feature per column from the schema (nullable columns get on_null: omit; types
without a direct mapping get the cast that maps them, structs one feature per scalar field, and
columns nothing can map are left out with a comment). CSV: the delimiter is sniffed and the header
detected from the first lines; types come from the first SAMPLE_ROWS rows with the build's own
parsers (int64, else float, else bytes); tokens like "" or NA that stand in for numbers become
null_values; columns holding ";"- or "|"-separated numbers become list features. The result is
accepted by load_config unchanged.
"""

from __future__ import annotations

import csv
import json
import posixpath
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.build.config import DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING, DEFAULT_MAX_BYTES_PER_SHARD
from tfrbeam.build.inputs import SAMPLE_ROWS, CsvOptions, InputConfig, _open, inspect_input, list_inputs
from tfrbeam.errors import ArrowConversionError, ConfigError
from tfrbeam.build.features import FeatureSpec, infer_spec, infer_text_type, resolve_spec

__all__ = ["infer_config"]

SNIFF_BYTES = 64 << 10
_DELIMITERS = ",;\t|"
_NULL_TOKENS = ("", "NA", "N/A", "NULL", "null", "None", "none", "nan", "NaN", "-")
_LIST_SEPARATORS = (";", "|")


@dataclass(frozen=True)
class _Feature:
    """One feature line of the config, with the comment that explains it (empty when obvious)."""

    spec: FeatureSpec
    comment: str = ""


def infer_config(input_path: str, format: str | None = None) -> str:
    """A complete, commented YAML build config for the input (a file or glob), ready to edit and run."""
    files = list_inputs(input_path)
    fmt = format or _format_of(files[0].path)
    if fmt not in ("csv", "parquet"):
        raise ConfigError(f"--format: {fmt!r} is not one of csv, parquet")
    if fmt == "parquet":
        input_config = InputConfig(format="parquet", path=input_path)
        sample = inspect_input(input_config, files=files)
        features, left_out = _parquet_features(sample.schema)
        header = [f"# Inferred from the Parquet schema of {sample.path}."]
        csv_options = None
    else:
        csv_options, sniff_notes = _sniff_csv(files[0].path)
        input_config = InputConfig(format="csv", path=input_path, csv=csv_options)
        sample = inspect_input(input_config, files=files)
        null_tokens = _null_tokens(_as_text(sample.sample.column(i)) for i in range(sample.sample.num_columns))
        if null_tokens:  # read the sample again as the build will: quoted tokens stay values
            input_config = replace(input_config, csv=replace(csv_options, null_values=tuple(null_tokens)))
            sample = inspect_input(input_config, files=files)
            if not any(sample.sample.column(i).null_count for i in range(sample.sample.num_columns)):
                null_tokens = []
                input_config = replace(input_config, csv=csv_options)
        csv_options = input_config.csv
        features, null_notes = _csv_features(sample.sample, null_tokens)
        left_out: list[str] = []
        header = [f"# Inferred from the first {min(sample.sample.num_rows, SAMPLE_ROWS)} rows of {sample.path}.",
                  *sniff_notes, *null_notes,
                  "# Types were inferred from a sample: a later value that does not parse as its",
                  "# type is a bad row (see errors), never a silent change of type."]
    if not features:
        raise ConfigError(f"{files[0].path}: no column maps to an Example feature ({'; '.join(left_out)})")
    return _render(input_path, fmt, csv_options, features, left_out, header, files[0].path)


def _format_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith((".parquet", ".pq", ".parq")):
        return "parquet"
    if lower.endswith((".csv", ".tsv", ".txt", ".csv.gz")):
        return "csv"
    raise ConfigError(f"cannot tell the format of {path!r} from its name; pass --format csv or --format parquet")


# ----------------------------------------------------------------------------------------- Parquet


def _parquet_features(schema: pa.Schema) -> tuple[list[_Feature], list[str]]:
    features: list[_Feature] = []
    left_out: list[str] = []
    for field in schema:
        features_of_field, note = _parquet_field(field.name, field.name, field.type, field.nullable)
        features.extend(features_of_field)
        if note:
            left_out.append(note)
    return features, left_out


def _parquet_field(name: str, source: str, arrow_type: pa.DataType, nullable: bool) -> tuple[list[_Feature], str]:
    """The features one Parquet column (or struct field) becomes, or a note on why it is left out."""
    if pa.types.is_struct(arrow_type):
        features: list[_Feature] = []
        notes = []
        for index in range(arrow_type.num_fields):
            child = arrow_type.field(index)
            found, note = _parquet_field(f"{name}_{child.name}", f"{source}.{child.name}", child.type,
                                         nullable or child.nullable)
            features.extend(found)
            if note:
                notes.append(note)
        return features, "; ".join(notes)
    null_comment = "nullable in the schema: a null leaves the feature out of that example" if nullable else ""
    try:
        spec = infer_spec(name, arrow_type, nullable=nullable, source=source)
        return [_Feature(spec, null_comment)], ""
    except ArrowConversionError:
        pass  # no direct mapping: suggest a cast below
    cast = _parquet_cast(arrow_type)
    if cast is None:
        return [], f"{source} ({arrow_type}): no Example feature can hold it"
    feature_type, why = cast
    try:
        spec = resolve_spec(FeatureSpec(name, feature_type, source, on_null="omit" if nullable else "error"), arrow_type)
    except ArrowConversionError:
        return [], f"{source} ({arrow_type}): no Example feature can hold it"
    return [_Feature(spec, "; ".join(part for part in (f"{arrow_type} {why}", null_comment) if part))], ""


def _parquet_cast(arrow_type: pa.DataType) -> tuple[str, str] | None:
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


# ----------------------------------------------------------------------------------------------- CSV


def _sniff_csv(path: str) -> tuple[CsvOptions, list[str]]:
    """Delimiter and header from the first lines (csv.Sniffer), with comments saying what was found."""
    with _open(path) as raw:
        head = raw.read(SNIFF_BYTES)
    encoding = "utf-8"
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as error:
        if len(head) == SNIFF_BYTES and error.start >= len(head) - 3:  # a character cut by the sample's end
            text = head[:error.start].decode("utf-8")
        else:
            encoding = "latin-1"
            text = head.decode("latin-1")
    lines = text.splitlines(keepends=True)
    if len(head) == SNIFF_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    sample = "".join(lines)
    notes = []
    sniffer = csv.Sniffer()
    try:
        dialect = sniffer.sniff(sample, delimiters=_DELIMITERS)
        delimiter = dialect.delimiter
    except csv.Error:
        delimiter = "\t" if path.lower().endswith(".tsv") else ","
        notes.append("# The delimiter could not be sniffed; check input.csv.delimiter.")
    # A header names columns; names are almost never numbers, data rows almost always hold some.
    first = next(csv.reader([lines[0]] if lines else [""], delimiter=delimiter), [])
    header = not any(infer_text_type(pa.array([field])) != "bytes" for field in first if field)
    column_names = None
    if not header:
        column_names = tuple(f"column_{index}" for index in range(len(first)))
        notes.append("# No header line was detected: the columns got names; rename them in column_names.")
    if encoding != "utf-8":
        notes.append("# The file is not UTF-8; latin-1 is a guess, check input.csv.encoding.")
    return CsvOptions(delimiter=delimiter, header=header, column_names=column_names, encoding=encoding), notes


def _csv_features(sample: pa.RecordBatch, null_tokens: list[str]) -> tuple[list[_Feature], list[str]]:
    """One feature per column of a sample read with the chosen null values, and the comments on nulls."""
    if null_tokens:
        shown = ", ".join(json.dumps(token) for token in null_tokens)
        notes = [f"# {shown} stand{'s' if len(null_tokens) == 1 else ''} in for missing numbers, so "
                 f"{'it is a null value' if len(null_tokens) == 1 else 'they are null values'} in every column."]
    else:
        notes = ["# No null values: empty fields and zeros are values. Add tokens to null_values to change that."]
    features = []
    for name in sample.schema.names:
        values = _as_text(sample.column(name))
        null_count = values.null_count
        comment = (f"{null_count} of {len(values)} sampled rows are null: they leave the feature out"
                   if null_count else "")
        spec = FeatureSpec(name, infer_text_type(values), name, on_null="omit" if null_count else "error")
        list_spec = _list_feature(spec, values) if spec.type == "bytes" else None
        features.append(_Feature(list_spec or spec, comment))
    return features, notes


def _as_text(column: pa.Array) -> pa.Array:
    return column.cast(pa.binary()).view(pa.string()) if not pa.types.is_string(column.type) else column


def _null_tokens(columns) -> list[str]:
    """Tokens that appear in columns whose other values are all numbers: they stand for missing values."""
    found: set[str] = set()
    for text in columns:
        present = [token for token in _NULL_TOKENS if pc.any(pc.equal(text, token)).as_py()]
        if not present:
            continue
        rest = pc.if_else(pc.is_in(text, value_set=pa.array(present)), pa.scalar(None, pa.string()), text)
        if rest.null_count < len(rest) and infer_text_type(rest) in ("int64", "float"):
            found.update(token for token in present if not _is_float_token(token))
    return [token for token in _NULL_TOKENS if token in found]


def _is_float_token(token: str) -> bool:
    return token.lower() == "nan"  # a float column keeps NaN as a value


def _list_feature(spec: FeatureSpec, values: pa.Array) -> FeatureSpec | None:
    """A list feature when every non-null value is numbers joined by one of the list separators."""
    present = values.drop_null()
    if not len(present):
        return None
    for separator in _LIST_SEPARATORS:
        if not pc.all(pc.match_substring(present, separator)).as_py():
            continue
        parts = pc.split_pattern(present, separator)
        item_type = infer_text_type(pc.list_flatten(parts))
        if item_type == "bytes":
            continue
        counts = np.asarray(pc.list_value_length(parts))
        length = int(counts[0]) if (counts == counts[0]).all() else None
        return FeatureSpec(spec.name, item_type, spec.source, on_null=spec.on_null, separator=separator,
                           length=length, is_list=True)
    return None


# ------------------------------------------------------------------------------------------ render


def _q(value: Any) -> str:
    """A YAML scalar (JSON is valid YAML flow syntax, and quotes whatever needs quoting)."""
    if isinstance(value, str) and value and value.replace("_", "").replace("-", "").isalnum() and value[0].isalpha() \
            and value.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "none", "y", "n"):
        return value
    return json.dumps(value, ensure_ascii=False)


def _render(input_path: str, fmt: str, csv_options: CsvOptions | None, features: list[_Feature],
            left_out: list[str], header: list[str], first_file: str) -> str:
    stem = posixpath.basename(first_file).split(".")[0] or "dataset"
    out = ["# tfrbeam build config written by `tfrbeam infer-config`; edit it, then run:",
           "#   tfrbeam build THIS_FILE.yaml",
           *header,
           "input:",
           f"  format: {fmt}",
           f"  path: {_q(input_path)}            # a glob; gs:// and s3:// paths work where Beam has them"]
    if csv_options is not None:
        names = (f"[{', '.join(_q(name) for name in csv_options.column_names)}]"
                 if csv_options.column_names is not None else "null")
        out += ["  csv:",
                f"    delimiter: {json.dumps(csv_options.delimiter)}",
                f"    quote_char: {json.dumps(csv_options.quote_char)}",
                "    escape_char: null",
                f"    header: {'true' if csv_options.header else 'false'}",
                f"    column_names: {names}",
                f"    null_values: [{', '.join(json.dumps(token) for token in csv_options.null_values)}]"
                "   # only these are null; 0, \"\" and false are values otherwise",
                "    skip_rows: 0",
                f"    encoding: {csv_options.encoding}"]
    out += ["features:                     # name: {type: int64 | float | bytes, source, on_null, default, separator, length}"]
    for feature in features:
        out.append(_feature_line(feature))
    for note in left_out:
        out.append(f"  # left out: {note}")
    out += ["shuffle:",
            "  enabled: true",
            "  seed: 42                    # same seed and input -> byte-identical output",
            "splits:                       # fractions sum to 1; a row's split is fixed by its content (or split_key)",
            "  train: 0.9",
            "  eval: 0.1",
            "split_key: null               # e.g. [user_id]: rows with the same key land in the same split",
            "output:",
            f"  path: {_q('out/' + stem)}",
            "  # Set one of these two; left out, shards are sized by bytes (the default below).",
            "  # num_shards: 4             # shards per split, or per split as {train: 8, eval: 1}",
            f"  # max_bytes_per_shard: {DEFAULT_MAX_BYTES_PER_SHARD >> 20}MiB  # or size shards by bytes",
            "  compression: none           # none | gzip | zlib",
            "errors:",
            "  on_bad_record: fail         # fail | skip | dead_letter ({output.path}/_errors/*.jsonl)",
            f"  # max_bad_fraction: {DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING}    # the default with skip and dead_letter "
            "(0 with fail): more bad rows than this fraction fail the build"]
    return "\n".join(out) + "\n"


def _feature_line(feature: _Feature) -> str:
    spec = feature.spec
    parts = [f"type: {spec.type}"]
    if spec.source != spec.name:
        parts.append(f"source: {_q(spec.source)}")
    parts.append(f"on_null: {spec.on_null}")
    if spec.separator is not None:
        parts.append(f"separator: {json.dumps(spec.separator)}")
    if spec.length is not None and spec.separator is not None:
        parts.append(f"length: {spec.length}")
    line = f"  {_q(spec.name)}: {{{', '.join(parts)}}}"
    if feature.comment:
        line += f"   # {feature.comment}"
    return line
