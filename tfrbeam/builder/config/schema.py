"""The build config as frozen dataclasses: what a parsed (and later resolved) config holds, its defaults, and its keys.

Each field made with ``key(kind, default, ...)`` is the YAML key of its name: keys.py reads it (with its
problems), lets ``--set`` reach it and writes it back (``config_to_dict``), so a new key is one field
here. The small functions above each class are checks across keys, named by the field that runs them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

from tfrbeam.builder.config.encodings import encoding_problem
from tfrbeam.builder.config.feature_keys import Features
from tfrbeam.builder.config.formats import InputFormat, without_compression_suffix
from tfrbeam.builder.config.keys import (
    Char,
    Choice,
    Flag,
    Integer,
    Names,
    Number,
    Scope,
    Section,
    Size,
    Text,
    Tokens,
    internal,
    key,
    show,
)
from tfrbeam.builder.config.split_keys import ShardCounts, SplitColumn, SplitFiles, Splits, split_patterns
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.errors import ConfigError
from tfrbeam.layout.tfds_info import check_tfds_identity
from tfrbeam.layout.tfmd_schema import schema_pb2

__all__ = [
    "AVRO_INSTALL_HINT",
    "DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING",
    "BuildConfig",
    "CsvOptions",
    "ErrorsConfig",
    "InputConfig",
    "JsonlOptions",
    "OutputConfig",
    "ParquetOptions",
    "SequenceConfig",
    "ShuffleConfig",
    "TfrecordOptions",
    "with_feature_null_values",
]

DEFAULT_SPLIT_BYTES = 64 << 20
# input.format avro reads with fastavro, an optional extra: the config check and the reader say this when it is missing.
AVRO_INSTALL_HINT = "avro needs the fastavro package, which is not installed: pip install 'tfrbeam[avro]'"
DEFAULT_MAX_ROW_BYTES = 64 << 20
DEFAULT_MAX_BYTES_PER_SHARD = 256 << 20
# The largest SequenceExample of a group kept whole: a larger one is an error unless max_steps cuts
# the group. Four of this size fit the default shard size.
DEFAULT_MAX_GROUP_BYTES = 64 << 20
COMPRESSIONS = ("none", "gzip", "zlib")
BAD_RECORD_ACTIONS = ("fail", "skip", "dead_letter")
# skip/dead_letter without an explicit limit still fail a build whose rows are mostly bad (a wrong
# type in the config would otherwise quietly produce an empty dataset).
DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING = 0.1
OVERFLOW_ACTIONS = ("split", "truncate", "error")


def _at_least_a_mebibyte(scope: Scope, size: int) -> int:
    """max_row_bytes (of CSV rows, of JSON lines): at least 1 MiB."""
    if size < 1 << 20:
        scope.fail("max_row_bytes", f"{show(scope.raw.get('max_row_bytes'))} is below 1 MiB (the default is "
                   f"{DEFAULT_MAX_ROW_BYTES >> 20}MiB; it only needs raising for longer rows)")
        return DEFAULT_MAX_ROW_BYTES
    return size


def _tab_for_tsv(scope: Scope) -> str:
    """The delimiter of a .tsv input is a tab unless the config says otherwise."""
    path = scope.outer.value("path") if scope.outer is not None else ""
    return "\t" if without_compression_suffix(path).endswith(".tsv") else ","


def _distinct_from_each_other(scope: Scope, escape_char: str | None) -> str | None:
    """The delimiter, quote_char and escape_char differ."""
    chars = {"delimiter": scope.value("delimiter"), "quote_char": scope.value("quote_char"), "escape_char": escape_char}
    used = [(name, char) for name, char in chars.items() if char is not None]
    for index, (name, char) in enumerate(used):
        for other, other_char in used[index + 1:]:
            if char == other_char:
                scope.fail(other, f"{show(char)} is also the {name}; they must differ")
    return escape_char


def _needed_without_header(scope: Scope, column_names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if not scope.value("header") and column_names is None:
        scope.fail("column_names", "is required when header is false (list the column names in file order)")
    return column_names


def _not_also_true(scope: Scope, false_values: tuple[str, ...] | None) -> tuple[str, ...] | None:
    for token in sorted(set(scope.value("true_values") or ()) & set(false_values or ())):
        scope.fail("false_values", f"{token!r} is also in true_values")
    return false_values


def _known_encoding(scope: Scope, encoding: str) -> str:
    problem = encoding_problem(encoding)
    if problem is not None:
        scope.fail("encoding", problem)
        return "utf-8"
    return encoding


@dataclass(frozen=True)
class CsvOptions:
    """The CSV dialect. quote_char None disables quoting; only null_values are ever null."""

    delimiter: str = key(Char(), ",", default_of=_tab_for_tsv)
    quote_char: str | None = key(Char(nullable=True), '"')
    escape_char: str | None = key(Char(nullable=True), None, check=_distinct_from_each_other)
    header: bool = key(Flag(), True)
    column_names: tuple[str, ...] | None = key(Names(), None, check=_needed_without_header)
    # None: not given (none, unless inferred with the features)
    null_values: tuple[str, ...] | None = key(Tokens('["", "NA"]'), None)
    # read as 1 by int64 and float features (pyarrow's name); false_values are read as 0
    true_values: tuple[str, ...] | None = key(Tokens('["TRUE", "true"]'), None)
    false_values: tuple[str, ...] | None = key(Tokens('["FALSE", "false"]'), None, check=_not_also_true)
    skip_rows: int = key(Integer(0), 0)
    encoding: str = key(Text(), "utf-8", check=_known_encoding)
    # the longest row (in bytes) that can be read
    max_row_bytes: int = key(Size(), DEFAULT_MAX_ROW_BYTES, check=_at_least_a_mebibyte)
    # The tokens features' own null_values name, derived from the features (None: no feature has its own). The
    # reader then nulls these and null_values, and keeps each null cell's token (null_text).
    feature_null_values: tuple[str, ...] | None = internal(None)


@dataclass(frozen=True)
class JsonlOptions:
    """JSON lines: max_row_bytes bounds a line (in bytes, without its \\n); a longer one is a bad row, skipped unread."""

    max_row_bytes: int = key(Size(), DEFAULT_MAX_ROW_BYTES, check=_at_least_a_mebibyte)


@dataclass(frozen=True)
class ParquetOptions:
    """require_checksums: refuse files whose pages carry no CRC (pyarrow writes none unless write_page_checksum=True)."""

    require_checksums: bool = key(Flag(), False)


@dataclass(frozen=True)
class TfrecordOptions:
    """input.format tfrecord: the splits of a dataset to read (None: all) and the files' compression ("auto": from
    each file's extension, or a dataset's manifest; None: uncompressed; "gzip", "zlib"). Keys of input itself."""

    splits: tuple[str, ...] | None = key(Names(allow_single=True), None, for_format="tfrecord")
    compression: str | None = key(Choice(("auto", *COMPRESSIONS), none="none"), "auto", for_format="tfrecord")


def _without_split_patterns(scope: Scope) -> bool:
    """input and input.path are required unless the splits are file patterns, whose globs list the input files."""
    top = scope
    while top.outer is not None:
        top = top.outer
    return not split_patterns(top.raw.get("splits"))


def _not_with_split_patterns(scope: Scope, path: str) -> str:
    if path and not _without_split_patterns(scope):
        scope.fail("path", "not used when splits are file patterns (each split's glob lists its files); drop it")
    return path


def _installed(scope: Scope, fmt: str) -> str:
    if fmt == "avro" and importlib.util.find_spec("fastavro") is None:
        scope.fail("format", AVRO_INSTALL_HINT)
    return fmt


@dataclass(frozen=True)
class InputConfig:
    """Where the rows come from: a glob of CSV, Parquet, JSON lines, ORC, Avro or TFRecord files (or a tfrbeam
    dataset) and how to read them."""

    format: str = key(InputFormat(), check=_installed)
    # "" (and not written) with file-pattern splits, whose globs list the input files
    path: str = key(Text(), required=_without_split_patterns, check=_not_with_split_patterns, skip_if="")
    csv: CsvOptions = key(Section(CsvOptions, label="CSV options"), default_factory=CsvOptions, for_format="csv")
    # written only when set: the manifests of builds from before the key keep matching a same-config rebuild
    jsonl: JsonlOptions = key(Section(JsonlOptions, label="JSON lines options"), default_factory=JsonlOptions,
                              for_format="jsonl", skip_if=JsonlOptions())
    parquet: ParquetOptions = key(Section(ParquetOptions, label="Parquet options"), default_factory=ParquetOptions,
                                  for_format="parquet")
    columns: tuple[str, ...] | None = key(Names(), None)
    split_bytes: int = key(Size(), DEFAULT_SPLIT_BYTES)
    tfrecord: TfrecordOptions = key(Section(TfrecordOptions, flatten=True), default_factory=TfrecordOptions)


@dataclass(frozen=True)
class ShuffleConfig:
    """The seeded global shuffle; the same seed and input always give the same order."""

    enabled: bool = key(Flag(), True)
    seed: int = key(Integer(0, (1 << 64) - 1), 0)

    @property
    def effective_seed(self) -> int | None:
        """The seed the build's order depends on: None when the rows keep their input order."""
        return self.seed if self.enabled else None


def _uncompressed(scope: Scope, dali_index: bool) -> bool:
    if dali_index and scope.value("compression") is not None:
        scope.fail("dali_index", "DALI indexes describe uncompressed TFRecord files; set output.compression: none "
                   "or drop dali_index")
    return dali_index


def _tfmd_installed(scope: Scope, schema_pbtxt: bool) -> bool:
    if schema_pbtxt:
        try:
            schema_pb2("output.schema_pbtxt")
        except ConfigError as error:
            scope.check.problems.append(str(error))
    return schema_pbtxt


def _tfds_name(scope: Scope, name: str) -> str:
    if not name:  # left out: "is required" says so
        return name
    try:
        check_tfds_identity(name, "1.0.0", scope.path)
    except ConfigError as error:
        scope.check.problems.append(str(error))
    return name


def _tfds_version(scope: Scope, version: str) -> str:
    try:
        check_tfds_identity("x", version, scope.path)
    except ConfigError as error:
        scope.check.problems.append(str(error))
    return version


@dataclass(frozen=True)
class TfdsOutput:
    """``output.tfds``: also write TFDS's dataset_info.json and features.json, so tfds.builder_from_directory loads it."""

    name: str = key(Text(), required=True, check=_tfds_name)
    version: str = key(Text(), "1.0.0", check=_tfds_version)


def _tfds_uncompressed(scope: Scope, tfds: TfdsOutput | None) -> TfdsOutput | None:
    if tfds is not None and scope.value("compression") is not None:
        scope.fail("tfds", "TFDS reads uncompressed TFRecord files only; set output.compression: none or drop tfds")
    return tfds


@dataclass(frozen=True)
class OutputConfig:
    """Where and how shards are written.

    Exactly one of num_shards (an int for every split, or one per split) and max_bytes_per_shard is
    set; when the config gives neither, max_bytes_per_shard is 256 MiB. compression is None, "gzip"
    or "zlib" (the config's "none" becomes None).
    """

    path: str = key(Text(), required=True)
    num_shards: int | dict[str, int] | None = key(ShardCounts(), None)
    max_bytes_per_shard: int | None = key(Size(), DEFAULT_MAX_BYTES_PER_SHARD, excludes="num_shards")
    compression: str | None = key(Choice(COMPRESSIONS, none="none"), None)
    # also write NVIDIA DALI's tfrecord2idx files under {path}/dali/{split}/
    dali_index: bool = key(Flag(), False, check=_uncompressed)
    # also write {path}/schema.pbtxt, the features as a TensorFlow Metadata schema (written only when set)
    schema_pbtxt: bool = key(Flag(), False, check=_tfmd_installed, skip_if=False)
    # also write TFDS's dataset_info.json and features.json: tfds.builder_from_directory(path) loads the dataset
    tfds: TfdsOutput | None = key(Section(TfdsOutput, optional=True), None, check=_tfds_uncompressed, skip_if=None)

    def shards_for(self, split: str) -> int | None:
        """The shard count of one split, or None when shards are sized by max_bytes_per_shard."""
        if isinstance(self.num_shards, dict):
            return self.num_shards[split]
        return self.num_shards


def _fraction_for_action(scope: Scope) -> float:
    return 0.0 if scope.value("on_bad_record") == "fail" else DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING


@dataclass(frozen=True)
class ErrorsConfig:
    """What a bad row does: fail the build, be skipped, or be written to {output}/_errors/."""

    on_bad_record: str = key(Choice(BAD_RECORD_ACTIONS), "fail")
    max_bad_fraction: float = key(Number(0.0, 1.0), 0.0, default_of=_fraction_for_action)
    allow_empty: bool = key(Flag(), True)  # false: inputs without a single row fail the build (true: a warning)


def _not_grouped_by(scope: Scope, order_by: tuple[str, ...]) -> tuple[str, ...]:
    for name in order_by:
        if name in scope.value("group_by"):
            scope.fail("order_by", f"{name!r} is in group_by (it is constant within a group; order by another feature)")
    return order_by


def _neither_group_nor_step(scope: Scope, context: tuple[str, ...]) -> tuple[str, ...]:
    for name in context:
        if name in scope.value("group_by"):
            scope.fail("context", f"{name!r} is in group_by (group_by features are context already; leave it out of "
                       "context)")
        elif name in scope.value("order_by"):
            scope.fail("context", f"{name!r} is in order_by too (order_by features are steps; a feature is one or the "
                       "other)")
    return context


def _cut_needs_max_steps(scope: Scope, overflow: str) -> str:
    if overflow != "split" and scope.raw.get("max_steps") is None:
        scope.fail("overflow", f"{overflow} needs max_steps (the longest sequence to keep)")
    return overflow


def _at_most_max_steps(scope: Scope, min_steps: int) -> int:
    max_steps = scope.value("max_steps")
    if max_steps is not None and min_steps > max_steps:
        scope.fail("min_steps", f"{min_steps} is more than max_steps {max_steps} (no sequence could be kept)")
    return min_steps


@dataclass(frozen=True)
class SequenceConfig:
    """A SequenceExample build: one record per distinct group_by key, its rows as steps in order_by order.

    group_by features and ``context`` are the record's context (one value per group); every
    other feature is a feature list, one step per row. Groups of fewer than min_steps rows are
    dropped (counted); longer than max_steps, they are cut (overflow split), cut short
    (truncate) or bad groups (error). max_group_bytes bounds the SequenceExample of a group kept whole.
    """

    group_by: tuple[str, ...] = key(Names(allow_single=True), required=True)
    order_by: tuple[str, ...] = key(Names(allow_empty=True), (), check=_not_grouped_by)
    context: tuple[str, ...] = key(Names(allow_empty=True), (), check=_neither_group_nor_step)
    max_steps: int | None = key(Integer(1), None)
    overflow: str = key(Choice(OVERFLOW_ACTIONS), "split", check=_cut_needs_max_steps)
    min_steps: int = key(Integer(1), 1, check=_at_most_max_steps)
    max_group_bytes: int = key(Size(), DEFAULT_MAX_GROUP_BYTES)

    @property
    def context_features(self) -> tuple[str, ...]:
        """The features written once per SequenceExample: group_by (constant by definition), then context."""
        return self.group_by + self.context

    def sequence_features(self, features: tuple[FeatureSpec, ...] | None) -> tuple[str, ...]:
        """The features written as feature lists (every feature not in the context), in feature order."""
        context = set(self.context_features)
        return tuple(spec.name for spec in features or () if spec.name not in context)


def with_feature_null_values(input_config: InputConfig, features: tuple[FeatureSpec, ...] | None) -> InputConfig:
    """The input with csv.feature_null_values derived from the features' own null_values (what the reader nulls)."""
    own = [spec.null_values for spec in features or () if spec.null_values is not None]
    tokens = tuple(dict.fromkeys(token for tokens in own for token in tokens)) if own else None
    if input_config.csv.feature_null_values == tokens:
        return input_config
    return replace(input_config, csv=replace(input_config.csv, feature_null_values=tokens))


def _settle_null_values(scope: Scope, features: tuple[FeatureSpec, ...] | None) -> tuple[FeatureSpec, ...] | None:
    scope.values["input"] = with_feature_null_values(scope.value("input"), features)
    return features


def _hashed_splits_only(scope: Scope, split_key: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if scope.values.get("split_by") is not None and split_key is not None:
        scope.fail("split_key", "only fraction splits are hashed; splits from a column or file patterns take no split_key")
    return split_key


def _sequence_fits(scope: Scope, sequence: SequenceConfig | None) -> SequenceConfig | None:
    """A sequence build splits by the hash of its group key (or a part of it): a group never straddles splits."""
    if sequence is None or not sequence.group_by:  # no group_by is a problem reported already
        return None
    if scope.values.get("split_by") is not None:
        scope.fail("sequence", "a SequenceExample build splits by its group key's hash; give splits as fractions")
        return sequence
    split_key = scope.value("split_key")
    outside = [name for name in split_key or () if name not in sequence.group_by]
    if outside:
        scope.fail("split_key", f"{list(outside)} is not part of sequence.group_by {list(sequence.group_by)}: a group's "
                   "rows would straddle splits (allowed: a subset of group_by, or leave split_key out to split by it)")
    scope.values["split_key"] = sequence.group_by if split_key is None else split_key
    if scope.value("stats"):
        scope.fail("stats", "statistics of SequenceExample datasets are not computed yet (set stats: false)")
    if scope.value("output").schema_pbtxt:
        scope.fail("output.schema_pbtxt", "a schema.pbtxt of SequenceExamples is not written yet (set it false)")
    if scope.value("output").tfds is not None:
        scope.fail("output.tfds", "TFDS loads datasets of tf.train.Example only (drop output.tfds for a SequenceExample "
                   "build)")
    return sequence


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """A whole dataset build. features None means: every input column, types inferred.

    splits maps each split name, in order, to its fraction of the content hash; with split_by (a
    split column or file patterns, set by the splits key) the fractions are None and split_by assigns the rows.
    """

    input: InputConfig = key(Section(InputConfig), required=_without_split_patterns)
    features: tuple[FeatureSpec, ...] | None = key(Features(), None, check=_settle_null_values)
    shuffle: ShuffleConfig = key(Section(ShuffleConfig), default_factory=ShuffleConfig)
    splits: dict[str, float | None] = key(Splits(), default_factory=lambda: {"train": 1.0})
    split_by: SplitColumn | SplitFiles | None = internal(None)
    split_key: tuple[str, ...] | None = key(Names(allow_single=True), None, check=_hashed_splits_only)
    output: OutputConfig = key(Section(OutputConfig), required=True)
    errors: ErrorsConfig = key(Section(ErrorsConfig), default_factory=ErrorsConfig)
    # Write stats.json and stats.html with the dataset. Off by default: on the 1M-row benchmark table
    # the statistics take ~2.4 s (two processes) against ~5 s for the build itself.
    stats: bool = key(Flag(hint="true writes stats.json and stats.html with the dataset"), False)
    # set: one tf.train.SequenceExample per group instead of an Example per row
    sequence: SequenceConfig | None = key(Section(SequenceConfig, optional=True), None, check=_sequence_fits)

    @property
    def fractions(self) -> tuple[float, ...]:
        """The hash splits' fractions, in split order (a config with split_by has none)."""
        if self.split_by is not None:
            raise ValueError(f"splits come from {type(self.split_by).__name__}, not from fractions")
        return tuple(fraction or 0.0 for fraction in self.splits.values())

    def feature(self, name: str) -> FeatureSpec:
        for spec in self.features or ():
            if spec.name == name:
                return spec
        raise KeyError(name)
