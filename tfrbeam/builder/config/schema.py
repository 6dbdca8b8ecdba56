"""The build config as frozen dataclasses: what a parsed (and later resolved) config holds, and its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfrbeam.builder.features.convert import FeatureSpec

__all__ = [
    "AVRO_INSTALL_HINT",
    "BuildConfig",
    "CsvOptions",
    "ErrorsConfig",
    "InputConfig",
    "JsonlOptions",
    "OutputConfig",
    "ParquetOptions",
    "SequenceConfig",
    "ShuffleConfig",
    "SplitColumn",
    "SplitFiles",
    "TfrecordOptions",
]

DEFAULT_SPLIT_BYTES = 64 << 20
# input.format avro reads with fastavro, an optional extra: the config check and the reader say this when it is missing.
AVRO_INSTALL_HINT = "avro needs the fastavro package, which is not installed: pip install 'tfrbeam[avro]'"
DEFAULT_MAX_ROW_BYTES = 64 << 20
DEFAULT_MAX_BYTES_PER_SHARD = 256 << 20
# The largest SequenceExample of a group kept whole: a larger one is an error unless max_steps cuts
# the group. Four of this size fit the default shard size.
DEFAULT_MAX_GROUP_BYTES = 64 << 20


@dataclass(frozen=True)
class CsvOptions:
    """The CSV dialect. quote_char None disables quoting; only null_values are ever null."""

    delimiter: str = ","
    quote_char: str | None = '"'
    escape_char: str | None = None
    header: bool = True
    column_names: tuple[str, ...] | None = None
    null_values: tuple[str, ...] | None = None  # None: not given (none, unless inferred with the features)
    true_values: tuple[str, ...] | None = None  # read as 1 by int64 and float features (pyarrow's name)
    false_values: tuple[str, ...] | None = None  # read as 0
    skip_rows: int = 0
    encoding: str = "utf-8"
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES  # the longest row (in bytes) that can be read
    # Not a config key: the tokens features' own null_values name, derived from the features (None: no feature
    # has its own). The reader then nulls these and null_values, and keeps each null cell's token (null_text).
    feature_null_values: tuple[str, ...] | None = None


@dataclass(frozen=True)
class JsonlOptions:
    """JSON lines: max_row_bytes bounds a line (in bytes, without its \\n); a longer one is a bad row, skipped unread."""

    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES


@dataclass(frozen=True)
class ParquetOptions:
    """require_checksums: refuse files whose pages carry no CRC (pyarrow writes none unless write_page_checksum=True)."""

    require_checksums: bool = False


@dataclass(frozen=True)
class TfrecordOptions:
    """input.format tfrecord: the splits of a dataset to read (None: all) and the files' compression ("auto": from
    each file's extension, or a dataset's manifest; None: uncompressed; "gzip", "zlib")."""

    splits: tuple[str, ...] | None = None
    compression: str | None = "auto"


@dataclass(frozen=True)
class InputConfig:
    """Where the rows come from: a glob of CSV, Parquet, JSON lines, ORC, Avro or TFRecord files (or a tfrbeam
    dataset) and how to read them."""

    format: str
    path: str
    csv: CsvOptions = field(default_factory=CsvOptions)
    jsonl: JsonlOptions = field(default_factory=JsonlOptions)
    parquet: ParquetOptions = field(default_factory=ParquetOptions)
    tfrecord: TfrecordOptions = field(default_factory=TfrecordOptions)
    columns: tuple[str, ...] | None = None
    split_bytes: int = DEFAULT_SPLIT_BYTES


@dataclass(frozen=True)
class ShuffleConfig:
    """The seeded global shuffle; the same seed and input always give the same order."""

    enabled: bool = True
    seed: int = 0


@dataclass(frozen=True)
class OutputConfig:
    """Where and how shards are written.

    Exactly one of num_shards (an int for every split, or one per split) and max_bytes_per_shard is
    set; when the config gives neither, max_bytes_per_shard is 256 MiB. compression is None, "gzip"
    or "zlib" (the config's "none" becomes None).
    """

    path: str
    num_shards: int | dict[str, int] | None = None
    max_bytes_per_shard: int | None = DEFAULT_MAX_BYTES_PER_SHARD
    compression: str | None = None
    dali_index: bool = False  # also write NVIDIA DALI's tfrecord2idx files under {path}/dali/{split}/
    schema_pbtxt: bool = False  # also write {path}/schema.pbtxt, the features as a TensorFlow Metadata schema

    def shards_for(self, split: str) -> int | None:
        """The shard count of one split, or None when shards are sized by max_bytes_per_shard."""
        if isinstance(self.num_shards, dict):
            return self.num_shards[split]
        return self.num_shards


@dataclass(frozen=True)
class ErrorsConfig:
    """What a bad row does: fail the build, be skipped, or be written to {output}/_errors/."""

    on_bad_record: str = "fail"
    max_bad_fraction: float = 0.0
    allow_empty: bool = True  # false: inputs without a single row fail the build (true: a warning)


@dataclass(frozen=True)
class SequenceConfig:
    """A SequenceExample build: one record per distinct group_by key, its rows as steps in order_by order.

    group_by features and ``context`` are the record's context (one value per group); every
    other feature is a feature list, one step per row. Groups of fewer than min_steps rows are
    dropped (counted); longer than max_steps, they are cut (overflow split), cut short
    (truncate) or bad groups (error). max_group_bytes bounds the SequenceExample of a group kept whole.
    """

    group_by: tuple[str, ...]
    order_by: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    max_steps: int | None = None
    overflow: str = "split"
    min_steps: int = 1
    max_group_bytes: int = DEFAULT_MAX_GROUP_BYTES

    @property
    def context_features(self) -> tuple[str, ...]:
        """The features written once per SequenceExample: group_by (constant by definition), then context."""
        return self.group_by + self.context

    def sequence_features(self, features: tuple[FeatureSpec, ...] | None) -> tuple[str, ...]:
        """The features written as feature lists (every feature not in the context), in feature order."""
        context = set(self.context_features)
        return tuple(spec.name for spec in features or () if spec.name not in context)


@dataclass(frozen=True)
class SplitColumn:
    """Splits named by an input column, as in AutoML Tables and TFRecorder: a row goes to the split its value maps to.

    values: (the column's value as text, split name) pairs; empty: the values are the split names
    themselves. A null or unmapped value makes a bad row. The column is read even when it is not a
    feature, and written into the Examples only when it is one.
    """

    column: str
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SplitFiles:
    """Splits by input file, as TFX's input splits: every row of a file a split's glob matches goes to that split."""

    patterns: tuple[tuple[str, str], ...]  # (split name, glob) in config order


@dataclass(frozen=True)
class BuildConfig:
    """A whole dataset build. features None means: every input column, types inferred.

    splits maps each split name, in order, to its fraction of the content hash; with split_by (a
    split column or file patterns) the fractions are None and split_by assigns the rows.
    """

    input: InputConfig
    output: OutputConfig
    features: tuple[FeatureSpec, ...] | None = None
    shuffle: ShuffleConfig = field(default_factory=ShuffleConfig)
    splits: dict[str, float | None] = field(default_factory=lambda: {"train": 1.0})
    split_by: SplitColumn | SplitFiles | None = None
    split_key: tuple[str, ...] | None = None
    errors: ErrorsConfig = field(default_factory=ErrorsConfig)
    # Write stats.json and stats.html with the dataset. Off by default: on the 1M-row benchmark table
    # the statistics take ~2.4 s (two processes) against ~5 s for the build itself.
    stats: bool = False
    sequence: SequenceConfig | None = None  # set: one tf.train.SequenceExample per group instead of an Example per row

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
