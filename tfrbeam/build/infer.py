"""`tfrbeam infer-config`: write a complete, commented build config inferred from an input file.

Parquet, ORC, Avro and JSON lines (the types pyarrow reads in the first file's first lines): one
feature per column from the schema (nullable columns get on_null: omit; types
without a direct mapping get the cast that maps them, structs one feature per scalar field, and
columns nothing can map are left out with a comment). CSV: the delimiter is sniffed and the header
detected from the first lines; types come from the first SAMPLE_ROWS rows with the build's own
parsers (int64, else float, else bytes; codes like "02134" are bytes); tokens like "" or NA that
stand in for numbers become null_values, and a text column where such a token is a value gets its
own null_values (docs/inference.md); columns holding ";"- or "|"-separated numbers become list features. The result is
accepted by load_config unchanged. With a sequence column (``--sequence-by``) the config builds
SequenceExamples, proposing as context the columns constant within every group of the sample.
"""

from __future__ import annotations

import csv
import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.build.config import (
    DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING,
    DEFAULT_MAX_BYTES_PER_SHARD,
    INPUT_FORMATS,
    BuildConfig,
    CsvOptions,
    InputConfig,
    OutputConfig,
    format_from_path,
)
from tfrbeam.build.features import FeatureSpec, infer_schema_features, infer_text_type
from tfrbeam.build.inputs.csv_text import unnamed_column_name
from tfrbeam.build.inputs.files import list_inputs, open_input
from tfrbeam.build.inputs.sample import SAMPLE_ROWS, input_files, inspect_input, typed_sample
from tfrbeam.build.inputs.tfrecord import dataset_manifest
from tfrbeam.build.resolve import float32_note, resolve_with_sample
from tfrbeam.errors import ConfigError

__all__ = ["infer_config"]

SNIFF_BYTES = 64 << 10
_DELIMITERS = ",;\t|"
# A column constant within at least this share of the sample's multi-row groups (but not all) is named in a comment.
_NEARLY_CONSTANT = 0.9


@dataclass(frozen=True)
class _Feature:
    """One feature line of the config, with the comment that explains it (empty when obvious)."""

    spec: FeatureSpec
    comment: str = ""


def infer_config(input_path: str, format: str | None = None, sequence_by: str | None = None,
                 order_by: str | None = None) -> str:
    """A complete, commented YAML build config for the input (a file or glob), ready to edit and run.

    ``sequence_by`` (a feature name) makes it a SequenceExample build, its steps ordered by ``order_by``.
    """
    if order_by is not None and sequence_by is None:
        raise ConfigError("--order-by needs --sequence-by (the column whose values make one sequence each)")
    dataset = (format or "tfrecord") == "tfrecord" and dataset_manifest(input_path) is not None
    if dataset:
        format = "tfrecord"  # a tfrbeam dataset directory: its shards and the manifest's features
        files = input_files(InputConfig(format="tfrecord", path=input_path))
    else:
        files = list_inputs(input_path)
    fmt = format or _format_of(files[0].path)
    if fmt not in INPUT_FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not one of {', '.join(INPUT_FORMATS)}")
    if fmt != "csv":
        input_config = InputConfig(format=fmt, path=input_path)
        sample = inspect_input(input_config, files=files)
        features, left_out = _typed_features(sample.schema)
        header = [_TYPED_HEADERS["dataset" if dataset else fmt].format(path=input_path if dataset else sample.path,
                                                                       rows=SAMPLE_ROWS)]
        csv_options = None
        rows = typed_sample(input_config, sample.path, sample.schema) if sequence_by is not None else None
    else:
        csv_options, sniff_notes, unnamed = _sniff_csv(files[0].path)
        draft = BuildConfig(input=InputConfig(format="csv", path=input_path, csv=csv_options),
                            output=OutputConfig(path="out"))
        resolved, sample = resolve_with_sample(draft, files)  # the build's own inference, null values included
        csv_options = resolved.input.csv
        rows = sample.sample
        assert rows is not None  # a CSV input is always sampled
        features, null_notes = _csv_features(resolved.features, rows, csv_options.null_values, unnamed)
        left_out = []
        header = [f"# Inferred from the first {min(rows.num_rows, SAMPLE_ROWS)} rows of {sample.path}.",
                  *sniff_notes, *null_notes,
                  "# Types were inferred from a sample: a later value that does not parse as its",
                  "# type is a bad row (see errors), never a silent change of type."]
    if not features:
        raise ConfigError(f"{files[0].path}: no column maps to an Example feature ({'; '.join(left_out)})")
    sequence = None
    if sequence_by is not None:
        assert rows is not None  # sampled above for sequence builds
        sequence = _sequence_lines(features, pa.Table.from_batches([rows]), sequence_by, order_by)
    return _render(input_path, fmt, csv_options, features, left_out, header, files[0].path, sequence)


def _format_of(path: str) -> str:
    fmt = format_from_path(path)
    if fmt is None:
        raise ConfigError(f"cannot tell the format of {path!r} from its name; pass --format "
                          f"({', '.join(INPUT_FORMATS)})")
    return fmt


_TYPED_HEADERS = {
    "parquet": "# Inferred from the Parquet schema of {path}.",
    "orc": "# Inferred from the ORC schema of {path}.",
    "avro": "# Inferred from the Avro schema of {path}.",
    "tfrecord": "# Inferred from the first {rows} tf.train.Example records, from {path} on: a feature with one value\n"
                "# wherever present is a scalar; a later record that does not fit is a bad row (see errors).",
    "dataset": "# Inferred from the features in the manifest of the dataset {path}; input.splits: [train, ...]\n"
               "# picks the splits read (default: all of them).",
    "jsonl": "# Inferred from the types pyarrow reads in the first {rows} lines of {path}; a later value of\n"
             "# another type is a bad row (see errors), never a silent change of type.",
}


# ---------------------------------------------------------------------- Parquet, ORC, Avro, JSON lines


def _typed_features(schema: pa.Schema) -> tuple[list[_Feature], list[str]]:
    found, left_out = infer_schema_features(schema, schema.names)
    return [_Feature(spec, comment) for spec, comment in found], left_out


# ----------------------------------------------------------------------------------------------- CSV


def _sniff_csv(path: str) -> tuple[CsvOptions, list[str], dict[str, int]]:
    """Delimiter and header from the first lines (csv.Sniffer), comments saying what was found, and the
    generated names of columns the header leaves unnamed (with their index)."""
    with open_input(path) as raw:
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
    # Codes ("02134") count as numbers here: a data row of ZIP codes is not a header.
    header = not any(infer_text_type(pa.array([field]), codes_as_text=False) != "bytes" for field in first if field)
    column_names = None
    if not header:
        column_names = tuple(unnamed_column_name(index) for index in range(len(first)))
        notes.append("# No header line was detected: the columns got names; rename them in column_names.")
    unnamed = [index for index, name in enumerate(first) if not name] if header else []
    if encoding != "utf-8":
        notes.append("# The file is not UTF-8; latin-1 is a guess, check input.csv.encoding.")
    options = CsvOptions(delimiter=delimiter, header=header, column_names=column_names, encoding=encoding)
    return options, notes, {unnamed_column_name(index): index for index in unnamed}


def _csv_features(specs, sample: pa.RecordBatch, null_tokens, unnamed: dict[str, int]) -> tuple[list[_Feature], list[str]]:
    """The inferred features with the comments on their nulls, and the comment on the null values."""
    if null_tokens:
        shown = ", ".join(json.dumps(token) for token in null_tokens)
        notes = [f"# {shown} stand{'s' if len(null_tokens) == 1 else ''} in for missing numbers, so "
                 f"{'it is a null value' if len(null_tokens) == 1 else 'they are null values'}; a text column "
                 "where a word token is a value", "# (\"NA\" for Namibia) has its own null_values."]
    else:
        notes = ["# No null values: empty fields and zeros are values. Add tokens to null_values to change that."]
    features = []
    for spec in specs:
        values = sample.column(spec.source)
        comments = [f"{values.null_count} of {len(values)} sampled rows are null: they leave the feature out"
                    if values.null_count else ""]
        if spec.time_unit is not None:
            comments.insert(0, f"ISO 8601 text -> {spec.time_unit} since 1970-01-01 UTC (a zone offset is applied; "
                            "set format for other layouts, e.g. \"%d/%m/%Y %H:%M\")")
        if spec.null_values is not None:
            kept = [token for token in null_tokens or () if token not in spec.null_values]
            comments.append(f"{', '.join(json.dumps(token) for token in kept)} is a value in this text column "
                            "(its null_values replace input.csv.null_values)")
        if spec.type == "float" and not spec.is_list:
            comments.append(float32_note(spec, values))
        if spec.source in unnamed:
            comments.insert(0, f"the header gives column {unnamed[spec.source]} no name; the build calls it {spec.source}")
        features.append(_Feature(spec, "; ".join(comment for comment in comments if comment)))
    return features, notes


# ------------------------------------------------------------------------------------------ sequences


def _sequence_lines(features: list[_Feature], sample: pa.Table, group_by: str, order_by: str | None) -> list[str]:
    """The sequence section: group_by, order_by, and as context the columns constant within every group of the sample."""
    specs = {feature.spec.name: feature.spec for feature in features}
    names = ", ".join(specs)
    for flag, name in (("--sequence-by", group_by), ("--order-by", order_by)):
        if name is not None and name not in specs:
            raise ConfigError(f"{flag}: {name!r} is not a feature of the input (features: {names})")
    if order_by is not None and specs[order_by].shape != ():
        raise ConfigError(f"--order-by: {order_by!r} is a list feature; steps are ordered by a scalar feature")
    key = _whole_column(specs[group_by], sample.column_names)
    if key is None:
        raise ConfigError(f"--sequence-by: {group_by!r} reads a struct field; group by a top-level column")
    rows = sample.filter(pc.is_valid(sample.column(key)))
    sizes = rows.group_by(key).aggregate([(key, "count")])
    groups, multi = sizes.num_rows, int(pc.sum(pc.greater(sizes.column(f"{key}_count"), 1)).as_py() or 0)
    context, notes = [], []
    for name, spec in specs.items():
        column = _whole_column(spec, rows.column_names)
        if name in (group_by, order_by) or column is None:
            continue
        if spec.shape != ():
            notes.append(f"  # {name}: a list column, never proposed as context")
            continue
        if multi == 0:
            continue
        distinct = rows.group_by(key).aggregate([(column, "count_distinct", pc.CountOptions(mode="all")),
                                                 (key, "count")])
        within = pc.greater(distinct.column(f"{key}_count"), 1)
        constant = int(pc.sum(pc.and_(within, pc.less_equal(distinct.column(f"{column}_count_distinct"), 1)))
                       .as_py() or 0)
        if constant == multi:
            context.append(name)
        elif constant >= _NEARLY_CONSTANT * multi:
            notes.append(f"  # {name}: constant within {constant} of the {multi} groups with more than one row (not proposed)")
    if multi == 0:
        why = "  # context: every group of the sample has one row, so nothing tells context from steps"
    else:
        why = (f"  # context: the columns constant within every one of the sample's {groups} groups "
               f"(of {rows.num_rows} rows); a group where one varies is a bad group")
    null_note = ("   # on_null: omit above: a row with a null key is a bad row" if specs[group_by].on_null == "omit" else "")
    return [
        f"sequence:                     # one tf.train.SequenceExample per {group_by}; every other feature not in context is",
        "                              # a feature list, one step per row",
        f"  group_by: [{_q(group_by)}]{null_note}",
        f"  order_by: [{_q(order_by) if order_by is not None else ''}]"
        "             # steps in this order (nulls last); ties by the row's content hash",
        why, *notes,
        f"  context: [{', '.join(_q(name) for name in context)}]",
        "  max_steps: null             # e.g. 100: longer groups are cut (overflow: split | truncate | error)",
        "  overflow: split",
        "  min_steps: 1                # shorter groups are dropped (counted in the manifest)",
    ]


def _whole_column(spec: FeatureSpec, columns: list[str]) -> str | None:
    """The top-level column a feature reads whole, or None for a struct field (or a column not sampled)."""
    path = spec.source_path or (spec.source,)
    return path[0] if len(path) == 1 and path[0] in columns else None


# ------------------------------------------------------------------------------------------ render


def _q(value: Any) -> str:
    """A YAML scalar (JSON is valid YAML flow syntax, and quotes whatever needs quoting)."""
    if isinstance(value, str) and value and value.replace("_", "").replace("-", "").isalnum() and value[0].isalpha() \
            and value.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "none", "y", "n"):
        return value
    return json.dumps(value, ensure_ascii=False)


_GLOB_CHARACTERS = re.compile(r"[*?\[\]{}]")


def output_stem(input_path: str, first_file: str) -> str:
    """The output's name: the input file's, or for a glob what its name pattern has in common, else its directory's.

    "data/flights-*.csv" -> "flights", "demo_data/parquet/*.parquet" -> "parquet": never the first matched file's.
    """
    if not _GLOB_CHARACTERS.search(input_path):
        named = input_path if first_file.rstrip("/") != input_path.rstrip("/") else first_file  # a directory: its name
        return posixpath.basename(named.rstrip("/")).split(".")[0] or "dataset"
    directory, pattern = posixpath.split(input_path.rstrip("/"))
    fixed = _GLOB_CHARACTERS.split(pattern.split(".")[0])[0].strip("-_. ")
    if fixed:
        return fixed
    parent = posixpath.basename(directory.rstrip("/"))
    return parent if parent and not _GLOB_CHARACTERS.search(parent) and "://" not in parent else "dataset"


def _render(input_path: str, fmt: str, csv_options: CsvOptions | None, features: list[_Feature],
            left_out: list[str], header: list[str], first_file: str, sequence: list[str] | None = None) -> str:
    stem = output_stem(input_path, first_file)
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
                f"    null_values: {_token_list(csv_options.null_values)}"
                "   # only these are null; 0, \"\" and false are values otherwise",
                f"    true_values: {_token_list(csv_options.true_values)}"
                "   # read as 1 (and false_values as 0) by int64 and float features",
                f"    false_values: {_token_list(csv_options.false_values)}",
                "    skip_rows: 0",
                f"    encoding: {csv_options.encoding}"]
    out += [
        "features:                     # name: {type: int64 | float | bytes | timestamp, source, on_null, default, "
        "separator, length, unit, format, null_values}"
    ]
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
            "split_key: null               # e.g. [user_id]: rows with the same key land in the same split"
            if sequence is None else "split_key: null               # a sequence build splits by sequence.group_by",
            *(sequence or ()),
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


def _token_list(tokens) -> str:
    return f"[{', '.join(json.dumps(token) for token in tokens or ())}]"


def _feature_line(feature: _Feature) -> str:
    spec = feature.spec
    parts = [f"type: {spec.type}"] if spec.time_unit is None else ["type: timestamp", f"unit: {spec.time_unit}"]
    if spec.time_format is not None:
        parts.append(f"format: {json.dumps(spec.time_format)}")
    if spec.source_path is not None:
        parts.append(f"source: [{', '.join(_q(part) for part in spec.source_path)}]")
    elif spec.source != spec.name:
        parts.append(f"source: {_q(spec.source)}")
    parts.append(f"on_null: {spec.on_null}")
    if spec.null_values is not None:
        parts.append(f"null_values: {_token_list(spec.null_values)}")
    if spec.separator is not None:
        parts.append(f"separator: {json.dumps(spec.separator)}")
    if spec.length is not None and spec.separator is not None:
        parts.append(f"length: {spec.length}")
    line = f"  {_q(spec.name)}: {{{', '.join(parts)}}}"
    if feature.comment:
        line += f"   # {feature.comment}"
    return line
