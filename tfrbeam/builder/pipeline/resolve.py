"""Resolving a parsed config against its input: the first file's schema and a CSV sample settle the features
(inferred when left out, typed, checked), the CSV null and boolean tokens, and the columns to read."""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.config.feature_keys import check_default
from tfrbeam.builder.config.keys import Checker
from tfrbeam.builder.config.schema import BuildConfig, CsvOptions, InputConfig, SequenceConfig, with_feature_null_values
from tfrbeam.builder.config.split_keys import SplitColumn
from tfrbeam.builder.features.convert import (
    FeatureSpec,
    ambiguous_source,
    float32_rounding,
    infer_boolean_tokens,
    infer_null_tokens,
    infer_schema_features,
    infer_text_feature,
    resolve_spec,
    source_column,
    source_type,
)
from tfrbeam.builder.inputs.files import InputFile
from tfrbeam.builder.inputs.sample import CsvSample, InputSample, inspect_input, read_csv_sample
from tfrbeam.builder.pipeline.splits import split_column_problem
from tfrbeam.errors import ArrowConversionError, ConfigError

__all__ = [
    "float32_note",
    "infer_csv_tokens",
    "resolve_config",
    "resolve_with_sample",
    "validate_against_schema",
    "with_features",
]

_LOG = logging.getLogger(__name__)


def with_features(config: BuildConfig, features: tuple[FeatureSpec, ...], csv: CsvOptions | None = None) -> BuildConfig:
    """A copy of the config with its features (and the CSV options, null_values settled) replaced once resolved."""
    if csv is not None:
        config = replace(config, input=replace(config.input, csv=csv))
    return replace(config, features=features)


# ------------------------------------------------------------------------ checks against the input


def validate_against_schema(config: BuildConfig, schema: pa.Schema, sample: pa.RecordBatch | None = None,
                            where: str = "the input", column_nulls: Mapping[str, tuple[str, ...]] | None = None
                            ) -> BuildConfig:
    """Check sources, split_key and types against the input's schema; return the config with every feature resolved.

    Features left out of the config become every input column (or input.columns); features
    without a type get one (Parquet: from the schema; CSV: int64, else float, else bytes by what
    every value of `sample` parses as). Unmappable types are reported with the config that
    would map them. Raises one ConfigError listing every problem. In the result, input.columns
    is the projection to read (the sources' columns) when the config left it out. split_key
    names features: the split is hashed from their converted values.
    """
    check = Checker()
    csv = config.input.format == "csv"
    names = schema.names
    for column in config.input.columns or ():
        if column not in names:
            check.fail("input.columns", f"{column!r} is not a column of {where} (columns: {_names(names)})")
    specs = config.features
    inferred = specs is None
    split_by = config.split_by if isinstance(config.split_by, SplitColumn) else None
    split_column = split_by.column if split_by is not None else None
    if split_by is not None:
        problem = split_column_problem(split_by, schema, config.input.columns, where)
        if problem is not None:
            check.fail("splits.column", problem)
    if specs is None:  # the split column is not a feature unless listed (as TFRecorder drops it)
        columns = [name for name in names if (config.input.columns is None or name in config.input.columns)
                   and name != split_column]
        if csv and sample is not None:  # the sample-based inference infer-config writes, too
            booleans = (config.input.csv.true_values or (), config.input.csv.false_values or ())
            nulls = column_nulls or {}
            specs = tuple(replace(infer_text_feature(name, sample.column(name), None, *booleans),
                                  null_values=nulls.get(name)) for name in columns)
        elif csv:
            specs = tuple(_inferred_spec(schema.field(name), config) for name in columns)
        else:  # the schema-based inference infer-config writes, too
            specs = _inferred_typed_specs(schema, columns, where)
    resolved = []
    for spec in specs:
        path = f"features.{spec.name}"
        ambiguous = ambiguous_source(schema, spec)
        if ambiguous is not None:
            check.fail(f"{path}.source" if spec.source != spec.name else path, ambiguous)
            continue
        arrow_type = source_type(schema, spec.source_ref)
        if arrow_type is None:
            hint = difflib.get_close_matches(spec.source, names, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            key = f"{path}.source" if spec.source != spec.name else path
            shown = spec.source_path if spec.source_path is not None else spec.source
            check.fail(key, f"column {shown!r} is not in {where} (columns: {_names(names)}){suggestion}")
            continue
        read = source_column(schema, spec.source_ref)
        if config.input.columns is not None and read not in config.input.columns:
            check.fail(path, f"reads column {spec.source!r}, which input.columns leaves out")
        whole = read is not None and (spec.source_path or (spec.source,)) == (read,)  # not a struct field
        text = sample.column(read) if whole and sample is not None and read in sample.schema.names else None
        try:
            spec_done = resolve_spec(spec, arrow_type, text_sample=text, infer_from_text=csv)
        except ArrowConversionError as error:
            check.fail(path + (" (inferred: features was left out)" if inferred else ""), str(error))
            continue
        if spec.type is None and spec.on_null == "default":
            assert spec_done.type is not None  # resolve_spec always settles the type
            default = check_default(check, f"{path}.default", spec.default, spec_done.type, spec_done.is_list,
                                     spec_done.length)
            spec_done = replace(spec_done, default=default)
        if spec_done.file is not None and spec_done.file.root is None:  # relative inputs' files, read on any worker
            spec_done = replace(spec_done, file=replace(spec_done.file, root=os.getcwd()))
        resolved.append(spec_done)
        if csv and spec_done.type == "float" and not spec_done.is_list:
            _warn_float32_rounding(spec_done, text)
    feature_names = [spec.name for spec in specs]
    grouped_by = config.sequence.group_by if config.sequence is not None else ()
    for key in config.split_key or ():
        if key not in feature_names and key not in grouped_by:  # the split is hashed from converted feature values
            check.fail("split_key", f"{key!r} is not a feature (features: {_names(feature_names)}); "
                       "the split key is hashed from the converted values of the features it names")
    if config.sequence is not None:
        _check_sequence_names(check, config.sequence, resolved, feature_names)
    if not specs:
        check.fail("features", f"{where} has no columns to make features of")
    if check.problems:
        count = len(check.problems)
        raise ConfigError(f"{count} problem{'s' if count > 1 else ''} with the config on {where}:\n  "
                          + "\n  ".join(check.problems))
    input_config = with_feature_null_values(config.input, tuple(resolved))
    if input_config.columns is None:
        columns = [source_column(schema, spec.source_ref) for spec in resolved]
        columns += [split_column] if split_column else []
        input_config = replace(input_config, columns=tuple(dict.fromkeys(columns)))
    return replace(config, input=input_config, features=tuple(resolved))


def float32_note(spec: FeatureSpec, text: pa.Array | None) -> str:
    """What float32 does to the sampled whole numbers of a float feature ("" when it holds them exactly)."""
    found = float32_rounding(text)
    if found is None:
        return ""
    shown, stored = found
    return (f"float32 rounds {shown} to {stored} (Example floats are 32-bit: whole numbers above 2**24 may not "
            "be exact); declare type: bytes to keep the text, or type: int64 if the values are written as integers")


def _warn_float32_rounding(spec: FeatureSpec, text: pa.Array | None) -> None:
    """One log line naming a float feature whose sampled values float32 cannot hold exactly."""
    note = float32_note(spec, text)
    if note:
        _LOG.warning("feature %r: %s", spec.name, note)


def _inferred_typed_specs(schema: pa.Schema, columns: list[str], where: str) -> tuple[FeatureSpec, ...]:
    """infer-config's features for typed columns; what nothing can map is left out with a warning, as it comments."""
    found, notes = infer_schema_features(schema, columns)
    for note in notes:
        _LOG.warning("%s: left out (features was left out): %s", where, note)
    return tuple(spec for spec, _ in found)


def _check_sequence_names(check: Checker, sequence: SequenceConfig, resolved: list[FeatureSpec],
                          feature_names: list[str]) -> None:
    """Every name of the sequence section is a feature; steps are ordered by scalars; some feature is a feature list."""
    shapes = {spec.name: spec.shape for spec in resolved}
    for key in ("group_by", "order_by", "context"):
        for name in getattr(sequence, key):
            if name not in feature_names:
                hint = difflib.get_close_matches(name, feature_names, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                check.fail(f"sequence.{key}", f"{name!r} is not a feature (features: {_names(feature_names)}){suggestion}")
            elif key == "order_by" and name in shapes and shapes[name] != ():
                check.fail("sequence.order_by", f"{name!r} is a list feature; steps are ordered by scalar features")
    if feature_names and not sequence.sequence_features(tuple(resolved)) and len(resolved) == len(feature_names):
        check.fail("sequence.context", "every feature is context or group_by; a SequenceExample needs at least one "
                   "sequence feature (leave one out of context)")


def _inferred_spec(field_: pa.Field, config: BuildConfig) -> FeatureSpec:
    """A feature for a CSV column the config leaves to inference without a sample; nulls are omitted where they can occur."""
    nullable = bool(config.input.csv.null_values)  # no sample to tell
    return FeatureSpec(name=field_.name, type=None, source=field_.name, on_null="omit" if nullable else "error")


def _names(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def resolve_config(config: BuildConfig, files: list[InputFile] | None = None) -> BuildConfig:
    """Read the first input file's schema (and a CSV sample) and validate_against_schema on it."""
    return resolve_with_sample(config, files)[0]


def resolve_with_sample(config: BuildConfig, files: list[InputFile] | None = None) -> tuple[BuildConfig, InputSample]:
    """resolve_config, and the sample it was resolved on (infer-config comments on it).

    A CSV config that leaves out both features and null_values gets them inferred from a sample
    (tokens like NA in number columns become null values); with features given, null_values
    left out means none.
    """
    input_config = config.input
    csv = input_config.csv
    column_nulls: dict[str, tuple[str, ...]] = {}
    if input_config.format == "csv" and None in (csv.null_values, csv.true_values, csv.false_values):
        if config.features is None:
            input_config, sample, column_nulls = infer_csv_tokens(input_config, files)
        else:
            input_config = replace(input_config, csv=replace(
                csv, null_values=csv.null_values or (), true_values=csv.true_values or (),
                false_values=csv.false_values or ()))
            sample = inspect_input(input_config, files=files)
    else:
        sample = inspect_input(input_config, files=files, declared=config.features)
    config = replace(config, input=input_config)
    return validate_against_schema(config, sample.schema, sample.sample, where=sample.path,
                                   column_nulls=column_nulls), sample


def infer_csv_tokens(input_config: InputConfig, files: list[InputFile] | None = None
                     ) -> tuple[InputConfig, InputSample, dict[str, tuple[str, ...]]]:
    """The CSV input with the null, true and false values it leaves out inferred from a sample, the sample (as the
    build reads it), and the own null_values of the text columns where a file-wide token is a value.

    Null tokens (like NA in number columns): the sample is parsed again with them, as the build
    reads it (a quoted "NA" stays a value), and tokens that then make nothing null are dropped.
    Boolean tokens: true/false spellings of columns that hold nothing else. The file is read once
    (read_csv_sample); every other look at the sample parses the rows' text again.
    """
    csv = input_config.csv
    read = read_csv_sample(replace(input_config, csv=replace(csv, null_values=csv.null_values or ())), files=files)
    sample = read.inspected
    rows = sample.sample
    assert rows is not None  # a CSV input is always sampled
    if csv.true_values is None and csv.false_values is None:
        true_values, false_values = infer_boolean_tokens(rows.columns)
        csv = replace(csv, true_values=tuple(true_values), false_values=tuple(false_values))
    csv = replace(csv, true_values=csv.true_values or (), false_values=csv.false_values or ())
    if csv.null_values is None:
        tokens = infer_null_tokens(rows.columns)
        if tokens:
            with_nulls = replace(input_config, csv=replace(csv, null_values=tuple(tokens)))
            resampled = read.with_null_values(tuple(tokens))
            if resampled.sample is not None and any(column.null_count for column in resampled.sample.columns):
                return with_nulls, *_text_columns_keep_tokens(with_nulls, read, rows, resampled)
        csv = replace(csv, null_values=())
    return replace(input_config, csv=csv), sample, {}


# Distinct values per text column looked at to tell whether the file quotes its strings.
_QUOTING_PROBE_VALUES = 200


def _text_columns_keep_tokens(input_config: InputConfig, read: CsvSample, raw: pa.RecordBatch,
                              nulled: InputSample) -> tuple[InputSample, dict[str, tuple[str, ...]]]:
    """The sample with word tokens (NA, NULL, ...) given back as values in the text columns of codes where one is
    a code, those columns' own null_values, and (InputSample.token_notes) why each text column holding a token
    nulls it or keeps it.

    A file that writes a missing number as NA writes a missing string so too (R does): the token is
    null in text columns as well, unless every other value of the column has the token's shape (two
    capitals: "NA" is Namibia among "US", "DE"), as codes do. Even then the token is null where the file
    quotes that column's strings and leaves the token bare (R's write.csv writes a missing string as a
    bare NA): the file tells them apart. A quoted token is always a value. "" stays null where the
    file-wide list says so.
    """
    sample = nulled.sample
    assert sample is not None  # a CSV input is always sampled
    csv = input_config.csv
    words = [token for token in csv.null_values or () if token != ""]
    if not words:
        return nulled, {}
    notes: dict[str, str] = {}
    codes: dict[str, tuple[pa.Array, tuple[str, ...]]] = {}
    for name in sample.schema.names:
        values, text = sample.column(name), raw.column(name)
        hit = pc.and_(values.is_null(), pc.fill_null(pc.is_in(text, value_set=pa.array(words, text.type)), False))
        if not pc.any(hit).as_py() or values.null_count == len(values):
            continue
        spec = infer_text_feature(name, values, None, csv.true_values or (), csv.false_values or ())
        if spec.type != "bytes" or spec.is_list or spec.time_unit is not None:
            continue
        held = sorted({_as_str(token) for token in pc.unique(text.filter(hit)).to_pylist()})
        others = [_as_str(value) for value in pc.unique(values.drop_null()).to_pylist()]
        kept = tuple(token for token in held if _fits_codes(token, others))
        shown = ", ".join(json.dumps(token) for token in held)
        if not kept:
            notes[name] = f"{shown} is missing here too, as in the number columns (the file's convention)"
            continue
        kept_hit = pc.and_(hit, pc.fill_null(pc.is_in(text, value_set=pa.array(kept, text.type)), False))
        codes[name] = (kept_hit, kept)
    quoted = _quoted_text_columns(read, sample, list(codes)) if codes else set()
    columns = dict(zip(sample.schema.names, sample.columns))
    overrides = {}
    for name, (hit, kept) in codes.items():
        shown = ", ".join(json.dumps(token) for token in kept)
        if name in quoted:
            notes[name] = f"{shown} is missing here: the file quotes this column's strings and leaves {shown} bare"
            continue
        examples = ", ".join(json.dumps(value) for value in _examples(sample.column(name)))
        notes[name] = (f"{shown} is a value here: every other value has its shape, as codes do ({examples}), so it "
                       "reads as one of them, as \"NA\" (Namibia) does among country codes")
        overrides[name] = tuple(token for token in csv.null_values or () if token not in kept)
        columns[name] = pc.if_else(hit, raw.column(name), sample.column(name))
    batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
    return replace(nulled, sample=batch, token_notes=notes), overrides


def _as_str(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# A code column has at least this many distinct values besides the token, all of the token's shape.
_MIN_CODES = 2


def _shape(text: str) -> str:
    """A value's shape: each capital letter A, small letter a, digit 9, anything else itself ("NA" -> "AA")."""
    return "".join("A" if char.isupper() else "a" if char.islower() else "9" if char.isdigit() else char
                   for char in text)


def _fits_codes(token: str, others: list[str]) -> bool:
    """Whether every other value of a column has the token's shape, as codes do (NA among US, DE, FR)."""
    return len(others) >= _MIN_CODES and all(_shape(value) == _shape(token) for value in others)


def _examples(values: pa.Array, count: int = 3) -> list[str]:
    return [_as_str(value) for value in pc.unique(values.drop_null()).slice(0, count).to_pylist()]


def _quoted_text_columns(read: CsvSample, sample: pa.RecordBatch, names: list[str]) -> set[str]:
    """The columns whose sampled values (a probe of up to _QUOTING_PROBE_VALUES distinct ones) are all quoted.

    The sample is parsed once more with those values as null tokens: a quoted value never becomes null.
    """
    probes = {name: pc.unique(sample.column(name).drop_null()).slice(0, _QUOTING_PROBE_VALUES) for name in names}
    tokens = sorted({value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                     for probe in probes.values() for value in probe.to_pylist()})
    probed = read.with_null_values(tuple(tokens))
    assert probed.sample is not None
    quoted = set()
    for name, probe in probes.items():
        looked_at = pc.fill_null(pc.is_in(sample.column(name), value_set=probe), False)
        if not pc.any(pc.and_(looked_at, probed.sample.column(name).is_null())).as_py():
            quoted.add(name)
    return quoted
