"""`tfrbeam infer-config`: write a complete, commented build config inferred from an input file.

Parquet, ORC, Avro and JSON lines (the types pyarrow reads in the first file's first lines): one
feature per column from the schema (nullable columns get on_null: omit; types
without a direct mapping get the cast that maps them, structs one feature per scalar field, and
columns nothing can map are left out with a comment). CSV: the delimiter is sniffed, and title lines,
the header (or --header/--no-header) and ragged lines are found in the first lines, each decision
with its reason in a comment; types come from the first SAMPLE_ROWS rows with the build's own
parsers (int64, else float, else bytes; codes like "02134" are bytes); tokens like "" or NA that
stand in for numbers become null_values in every column, and a column of codes where such a token
is one gets its own null_values (docs/inference.md); columns holding ";"- or "|"-separated numbers
become list features. The result is accepted by load_config unchanged. With a sequence column
(``--sequence-by``) the config builds SequenceExamples, proposing as context the columns constant
within every group of the sample.
"""

from __future__ import annotations

import collections
import csv
import json
import posixpath
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.config import (
    DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING,
    DEFAULT_MAX_BYTES_PER_SHARD,
    INPUT_FORMATS,
    BuildConfig,
    CsvOptions,
    InputConfig,
    OutputConfig,
    format_from_path,
)
from tfrbeam.builder.features.convert import NULL_TOKEN_CANDIDATES, FeatureSpec, infer_schema_features, infer_text_type
from tfrbeam.builder.inputs.csv_text import unnamed_column_name
from tfrbeam.builder.inputs.files import list_inputs, open_input
from tfrbeam.builder.inputs.sample import SAMPLE_ROWS, input_files, inspect_input, typed_sample
from tfrbeam.builder.inputs.tfrecord import dataset_manifest
from tfrbeam.builder.pipeline.resolve import float32_note, resolve_with_sample
from tfrbeam.errors import ConfigError

__all__ = ["infer_config"]

SNIFF_BYTES = 64 << 10
_DELIMITERS = ",;\t|"
_COMMENT_WIDTH = 110
# A column constant within at least this share of the sample's multi-row groups (but not all) is named in a comment.
_NEARLY_CONSTANT = 0.9


@dataclass(frozen=True)
class _Feature:
    """One feature line of the config, with the comment that explains it (empty when obvious)."""

    spec: FeatureSpec
    comment: str = ""


def infer_config(input_path: str, format: str | None = None, sequence_by: str | None = None,
                 order_by: str | None = None, header: bool | None = None) -> str:
    """A complete, commented YAML build config for the input (a file, glob or directory), ready to edit and run.

    ``sequence_by`` (a feature name) makes it a SequenceExample build, its steps ordered by ``order_by``.
    ``header`` says whether a CSV file's first line is its header (None: decided from the first lines).
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
    if header is not None and fmt != "csv":
        raise ConfigError(f"--{'' if header else 'no-'}header is for CSV inputs; {input_path!r} is {fmt}")
    if fmt != "csv":
        input_config = InputConfig(format=fmt, path=input_path)
        sample = inspect_input(input_config, files=files)
        features, left_out = _typed_features(sample.schema)
        heading = [_TYPED_HEADERS["dataset" if dataset else fmt].format(path=input_path if dataset else sample.path,
                                                                       rows=SAMPLE_ROWS)]
        csv_options = None
        rows = typed_sample(input_config, sample.path, sample.schema) if sequence_by is not None else None
    else:
        csv_options, sniff_notes, unnamed = _sniff_csv(files[0].path, header)
        draft = BuildConfig(input=InputConfig(format="csv", path=input_path, csv=csv_options),
                            output=OutputConfig(path="out"))
        resolved, sample = resolve_with_sample(draft, files)  # the build's own inference, null values included
        csv_options = resolved.input.csv
        rows = sample.sample
        assert rows is not None  # a CSV input is always sampled
        features, null_notes = _csv_features(resolved.features, rows, csv_options.null_values, unnamed, sample.token_notes)
        left_out = []
        heading = [f"# Inferred from the first {min(rows.num_rows, SAMPLE_ROWS)} rows of {sample.path}.",
                  *sniff_notes, *null_notes,
                  "# Types were inferred from a sample: a later value that does not parse as its",
                  "# type is a bad row (see errors), never a silent change of type."]
    if not features:
        raise ConfigError(f"{files[0].path}: no column maps to an Example feature ({'; '.join(left_out)})")
    sequence = None
    if sequence_by is not None:
        assert rows is not None  # sampled above for sequence builds
        sequence = _sequence_lines(features, pa.Table.from_batches([rows]), sequence_by, order_by)
    return _render(input_path, fmt, csv_options, features, left_out, heading, files[0].path, sequence)


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


def _sniff_csv(path: str, header: bool | None = None) -> tuple[CsvOptions, list[str], dict[str, int]]:
    """Delimiter, lines before the table, header and column names from the first lines; comments saying what was
    found and why; and the generated names of columns the header leaves unnamed (with their index).

    ``header`` forces the header decision (``--header``/``--no-header``); None decides it (_header_verdict).
    """
    text, encoding = _head_text(path)
    notes = []
    try:
        delimiter = csv.Sniffer().sniff(text, delimiters=_DELIMITERS).delimiter
    except csv.Error:
        delimiter = "\t" if path.lower().endswith(".tsv") else ","
        notes.append("The delimiter could not be sniffed; check input.csv.delimiter.")
    records = _records(text, delimiter)
    start, title_notes = _title_records(records, delimiter)
    notes += title_notes
    first_line, first = records[start] if start < len(records) else (1, [])
    body = records[start + 1:]
    skip_rows = first_line - 1 if start else 0
    if header is None:
        header, why = _header_verdict(first, [fields for _, fields in body])
    else:
        why = ""
    flag = "--header" if header else "--no-header"
    column_names: tuple[str, ...] | None = None
    unnamed: list[int] = []
    width = _common_width(body)
    if header and first and width == len(first) + 1:
        column_names, unnamed, note = _short_header(first, [fields for _, fields in body], width)
        notes.append(note)
        header, skip_rows, data, whose = False, first_line, body, "the header's"
    elif header:
        unnamed = [index for index, name in enumerate(first) if not name]
        notes.append(f"The first line{_at_line(first_line)} is the header: {why}. Pass --no-header if it is data."
                     if why else f"The first line{_at_line(first_line)} is the header ({flag}).")
        data, whose = body, "the header's"
    else:
        column_names = tuple(unnamed_column_name(index) for index in range(len(first)))
        notes.append("No header line was detected: the columns got names; rename them in column_names.")
        notes.append(f"The first line{_at_line(first_line)} is data: {why}. Pass --header if it names the columns."
                     if why else f"The first line{_at_line(first_line)} is data ({flag}).")
        data, whose = records[start:], "the first row's"
    notes += _ragged_notes(data, len(column_names) if column_names is not None else len(first), whose)
    if encoding != "utf-8":
        notes.append("The file is not UTF-8; latin-1 is a guess, check input.csv.encoding.")
    options = CsvOptions(delimiter=delimiter, header=header, column_names=column_names, encoding=encoding,
                         skip_rows=skip_rows)
    comments = [line for note in notes for line in _comment(note)]
    return options, comments, {unnamed_column_name(index): index for index in unnamed}


def _comment(text: str) -> list[str]:
    """A sentence as comment lines of the config."""
    return textwrap.wrap(text, width=_COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# ",
                         break_long_words=False, break_on_hyphens=False)


def _head_text(path: str) -> tuple[str, str]:
    """The first SNIFF_BYTES of the file as text (a BOM dropped, a line cut by the end left out), and its encoding."""
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
    lines = _PHYSICAL_LINE.findall(text)
    if len(head) == SNIFF_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    return "".join(lines), encoding


# A physical line as the build counts them: ended by \n, \r\n or a lone \r (or the end of the text).
_PHYSICAL_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_HEAD_RECORDS = 1000  # records of the head looked at for widths, title lines and the header
_MAX_TITLE_LINES = 5
_INTEGER = re.compile(r"[+-]?\d+\Z")


def _records(text: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """The head's records (at most _HEAD_RECORDS), each with the physical line it starts on; blank lines are not
    records (as in the build)."""
    reader = csv.reader(_PHYSICAL_LINE.findall(text), delimiter=delimiter, quotechar='"', doublequote=True, strict=False)
    records: list[tuple[int, list[str]]] = []
    try:
        while len(records) < _HEAD_RECORDS:
            line = reader.line_num + 1
            fields = next(reader)
            if fields:
                records.append((line, fields))
    except (StopIteration, csv.Error):
        pass  # the end of the head, or a line the build reports itself
    return records


def _at_line(line: int) -> str:
    return "" if line == 1 else f" of the table (line {line})"


def _common_width(records: list[tuple[int, list[str]]]) -> int:
    """The number of fields most of the records have (0 for none)."""
    widths = collections.Counter(len(fields) for _, fields in records)
    return widths.most_common(1)[0][0] if widths else 0


def _title_records(records: list[tuple[int, list[str]]], delimiter: str) -> tuple[int, list[str]]:
    """How many leading records are not rows of the table below them, and the comments saying which and why.

    Such a record has another number of fields than (nearly) every record after it, like scikit-learn's
    count line `569,30,malignant,benign` above rows of 31 numbers, or it is that line padded to the rows'
    width with empty fields. A record one field short over rows of numbers is a header without the row-name
    column (R's write.table), not a title.
    """
    start, notes = 0, []
    while start < min(_MAX_TITLE_LINES, len(records) - 2):
        line, fields = records[start]
        below = records[start + 1:]
        width = _common_width(below)
        agreeing = sum(len(row) == width for _, row in below)
        if agreeing < 0.9 * len(below):
            break  # no table shape below to tell a title from
        shown = delimiter.join(fields).rstrip(delimiter)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        if len(fields) != width:
            if len(fields) == width - 1 and _names_only(fields) and not _names_only(below[0][1]):
                break  # a header one field short: see _short_header
            most = f"every one of the {len(below)} lines after it has" if agreeing == len(below) else \
                f"{agreeing} of the {len(below)} lines after it have"
            why = f"{len(fields)} field{'s' if len(fields) != 1 else ''}, while {most} {width}"
        elif _padded_title(fields, [row for _, row in below]):
            filled = len(fields) - _trailing_empty(fields)
            why = f"its last {len(fields) - filled} fields are empty where the rows below hold values, and " \
                  "it holds text over columns of numbers"
        else:
            break
        notes.append(f"Line {line} ({shown}) is not a row of the table: {why}; it is skipped (skip_rows).")
        start += 1
    return start, notes


def _names_only(fields: list[str]) -> bool:
    """Non-empty, distinct fields none of which is a number: what a header line holds."""
    return all(fields) and len(set(fields)) == len(fields) and not any(_is_number(field) for field in fields)


def _trailing_empty(fields: list[str]) -> int:
    """How many of the last fields are empty."""
    count = 0
    while count < len(fields) and not fields[len(fields) - 1 - count]:
        count += 1
    return count


def _padded_title(fields: list[str], rows: list[list[str]]) -> bool:
    """A line whose last half or more of fields is empty where most rows below hold values, and that holds text
    over a column of numbers: a count or title line padded to the rows' width, not a sparse row."""
    empty = _trailing_empty(fields)
    filled = len(fields) - empty
    if empty * 2 < len(fields) or filled == 0:
        return False
    full = sum(len(row) == len(fields) and all(row[filled:]) for row in rows)
    if full * 2 <= len(rows):
        return False
    return any(not _is_number(field) and _column_kind(rows, index) != "bytes"
               for index, field in enumerate(fields[:filled]) if field)


def _short_header(names: list[str], rows: list[list[str]], width: int) -> tuple[tuple[str, ...], list[int], str]:
    """Column names for a header one field shorter than its rows: a trailing delimiter on every row (an empty last
    column), else R's write.table (the row names' column first, unnamed); the unnamed indices and the comment."""
    if all(len(row) == width and not row[-1] for row in rows):
        column_names = (*names, unnamed_column_name(width - 1))
        return column_names, [width - 1], (f"The header names {len(names)} columns and the rows have {width} fields, "
                                           "each ending in an empty one (a trailing delimiter): the last column is "
                                           f"{unnamed_column_name(width - 1)}; header: false names every column.")
    column_names = (unnamed_column_name(0), *names)
    return column_names, [0], (f"The header names {len(names)} columns and the rows have {width} fields: the first is "
                               "the rows' names (R's write.table leaves it out of the header; pandas makes it the "
                               f"index), here {unnamed_column_name(0)}; header: false names every column.")


def _is_number(field: str) -> bool:
    """A number as the build parses one; codes ("02134") count as numbers here."""
    return infer_text_type(pa.array([field], pa.string()), codes_as_text=False) != "bytes"


def _present(values: list[str]) -> list[str]:
    """The values that are not missing (empty, or a null token like NA)."""
    return [value for value in values if value and value not in NULL_TOKEN_CANDIDATES]


def _column_kind(rows: list[list[str]], index: int) -> str:
    """int64, float or bytes: what the present values of column ``index`` of the rows parse as (bytes when none)."""
    present = _present([row[index] for row in rows if index < len(row)])
    return infer_text_type(pa.array(present, pa.string()), codes_as_text=False) if present else "bytes"


def _header_verdict(first: list[str], rows: list[list[str]]) -> tuple[bool, str]:
    """Whether the first line names the columns of the rows below, and why (for the comment).

    A line without numbers is a header and a line of only numbers is data. A line of both is what a wide
    table's header looks like (`Country Name,...,1960,1961`) and also what many data rows look like, so each
    column votes: a name over numbers, an integer over decimals (a year over measurements), a run of
    integers with a constant step that no row below repeats (1960, 1961, ...), or a name of another length
    than every value of a column of fixed-length codes says header; a number among numbers, or a value the
    column holds again below, says data. More header votes than data votes make it a header.
    """
    named = [(index, field) for index, field in enumerate(first) if field and field not in NULL_TOKEN_CANDIDATES]
    numbers = [field for _, field in named if _is_number(field)]
    if not numbers:
        return True, "none of its fields is a number"
    if len(numbers) == len(named):
        return False, f"every field of it is a number, like the rows below{'' if rows else ' (there are none)'}"
    repeated = sorted({field for _, field in named if [name for _, name in named].count(field) > 1})
    if repeated:
        return False, f"{', '.join(map(json.dumps, repeated[:3]))} appear{'s' if len(repeated) == 1 else ''} twice in it, " \
                      "and a header's names differ"
    labels = _label_run(first, rows)
    for_header: list[str] = []
    for_data: list[str] = []
    for index, field in named:
        vote, example = _column_vote(field, [row[index] for row in rows if index < len(row)], index in labels)
        (for_header if vote > 0 else for_data if vote < 0 else []).append(example)
    header = len(for_header) > len(for_data)
    won, lost = (for_header, for_data) if header else (for_data, for_header)
    kind = "a name, not a value" if header else "a value, not a name"
    won.sort(key=lambda example: "characters long" in example)  # the type-based votes are the plainer examples
    shown = "; ".join(won[:2]) + ("; ..." if len(won) > 2 else "")
    return header, (f"in {len(won)} of its {len(first)} columns it reads as {kind} ({shown})"
                    f"{f', in {len(lost)} the other way' if lost else ''}" if won else
                    "nothing in the rows below tells its fields from values")


def _label_run(first: list[str], rows: list[list[str]]) -> set[int]:
    """The columns of a run of 3 or more integers with a constant step in adjacent fields of the first line
    (years 1960, 1961, ...), when no row below holds such a run in the same columns: names, not values."""
    found: set[int] = set()
    index = 0
    while index < len(first):
        end = index
        while end + 1 < len(first) and _steps_on(first, index, end + 1):
            end += 1
        if end - index >= 2 and not any(_steps_on(row, index, end) for row in rows if len(row) > end):
            found.update(range(index, end + 1))
        index = end + 1
    return found


def _steps_on(fields: list[str], start: int, end: int) -> bool:
    """Whether fields start..end are integers with one non-zero step between neighbours."""
    if not all(_INTEGER.match(field) for field in fields[start:end + 1]):
        return False
    values = [int(field) for field in fields[start:end + 1]]
    steps = {later - earlier for earlier, later in zip(values, values[1:])}
    return len(values) == 1 or (len(steps) == 1 and 0 not in steps)


def _column_vote(field: str, values: list[str], in_label_run: bool) -> tuple[int, str]:
    """+1 when the first line's field reads as the name of the column below, -1 as one of its values, 0 when the
    column cannot tell; with the example the comment shows."""
    present = _present(values)
    if not present:
        return 0, ""
    kind = infer_text_type(pa.array(present, pa.string()), codes_as_text=False)
    number = _is_number(field)
    if kind != "bytes":
        if not number:
            return 1, f"{json.dumps(field)} over numbers like {json.dumps(present[0])}"
        decimals = [value for value in present if not _INTEGER.match(value)]
        if _INTEGER.match(field) and len(decimals) * 2 > len(present):
            return 1, f"{json.dumps(field)} over numbers like {json.dumps(decimals[0])}"
    if in_label_run:
        return 1, f"{json.dumps(field)} in a run of numbered column names no row repeats"
    if kind != "bytes":
        return -1, f"{json.dumps(field)} among numbers like {json.dumps(present[0])}"
    if field in present:
        return -1, f"{json.dumps(field)}, a value its column holds again"
    lengths = {len(value) for value in present}
    if not number and len(present) >= 3 and len(lengths) == 1 and len(field) not in lengths:
        return 1, f"{json.dumps(field)} over values all {len(present[0])} characters long like {json.dumps(present[0])}"
    return 0, ""


def _ragged_notes(records: list[tuple[int, list[str]]], width: int, whose: str) -> list[str]:
    """The comment on sampled rows with another number of fields than the table's: each is a bad row in the build."""
    ragged = [(line, len(fields)) for line, fields in records if len(fields) != width]
    if not ragged:
        return []
    shown = ", ".join(f"line {line}: {count} field{'s' if count != 1 else ''}" for line, count in ragged[:3])
    return [f"{len(ragged)} of the {len(records)} sampled rows have another number of fields than {whose} {width} "
            f"({shown}{', ...' if len(ragged) > 3 else ''}): "
            "each is a bad row in the build (errors.on_bad_record: fail stops, skip or dead_letter go on)."]


def _csv_features(specs, sample: pa.RecordBatch, null_tokens, unnamed: dict[str, int],
                  token_notes: Mapping[str, str]) -> tuple[list[_Feature], list[str]]:
    """The inferred features with the comments on their nulls, and the comments on the null values."""
    if null_tokens:
        shown = ", ".join(json.dumps(token) for token in null_tokens)
        notes = [f"# {shown} stand{'s' if len(null_tokens) == 1 else ''} in for missing numbers, so "
                 f"{'it is a null value' if len(null_tokens) == 1 else 'they are null values'}; a text column "
                 "where a word token is a value", "# (\"NA\" for Namibia) has its own null_values."]
        nulled = [spec.name for spec in specs if spec.source in token_notes and spec.null_values is None]
        if nulled:
            notes += _comment(f"That is the file's convention for missing values in every column: the text columns "
                              f"{', '.join(nulled)} null it too (R writes a missing string as NA). Only a column of "
                              "codes that all share the token's shape keeps it as a value.")
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
        note = token_notes.get(spec.source, "")
        if spec.null_values is not None:
            kept = [token for token in null_tokens or () if token not in spec.null_values]
            comments.append(f"{note or ', '.join(json.dumps(token) for token in kept) + ' is a value in this text column'}"
                            " (its null_values replace input.csv.null_values)")
        else:
            comments.append(note)
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
                f"    skip_rows: {csv_options.skip_rows}",
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
