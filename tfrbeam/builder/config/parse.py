"""The build config: YAML (plus `--set key.path=value` overrides) parsed into the frozen dataclasses of schema.py.

Everything is checked before any pipeline starts. Every problem is reported as a ConfigError line
`key.path: <what is wrong> (<what is allowed>)`; all problems of a config are reported at once.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, overload

import yaml

from tfrbeam.builder.config.encodings import encoding_problem
from tfrbeam.builder.config.schema import (
    AVRO_INSTALL_HINT,
    DEFAULT_MAX_BYTES_PER_SHARD,
    DEFAULT_MAX_GROUP_BYTES,
    DEFAULT_MAX_ROW_BYTES,
    DEFAULT_SPLIT_BYTES,
    BuildConfig,
    CsvOptions,
    ErrorsConfig,
    InputConfig,
    JsonlOptions,
    OutputConfig,
    ParquetOptions,
    SequenceConfig,
    ShuffleConfig,
    SplitColumn,
    SplitFiles,
    TfrecordOptions,
)
from tfrbeam.builder.config.tfmd import features_of_schema_file
from tfrbeam.builder.features.convert import (
    FEATURE_TYPES,
    ON_NULL_ACTIONS,
    TIME_UNITS,
    TIMESTAMP,
    FeatureSpec,
)
from tfrbeam.builder.features.file_contents import (
    DEFAULT_MAX_FILE_BYTES,
    IMAGE_EXTRA,
    IMAGE_PARTS,
    MAX_FILE_BYTES,
    FileOptions,
    pillow_missing,
)
from tfrbeam.errors import ConfigError
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.layout.tfmd_schema import schema_pb2

__all__ = [
    "FORMAT_EXTENSIONS",
    "INPUT_FORMATS",
    "Checker",
    "apply_overrides",
    "check_default",
    "config_to_dict",
    "format_from_path",
    "load_config",
    "parse_config",
    "parse_size",
    "parse_yaml",
    "with_feature_null_values",
]

_LOG = logging.getLogger(__name__)

INPUT_FORMATS = ("csv", "parquet", "jsonl", "orc", "avro", "tfrecord")
# The extensions that name a format when input.format is left out; each may carry a compression suffix.
FORMAT_EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet",
                     ".parq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".orc": "orc",
                     ".avro": "avro", ".tfrecord": "tfrecord"}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".lzma", ".zst", ".zstd", ".deflate")  # what Beam's AUTO detects
COMPRESSIONS = ("none", "gzip", "zlib")
BAD_RECORD_ACTIONS = ("fail", "skip", "dead_letter")
# skip/dead_letter without an explicit limit still fail a build whose rows are mostly bad (a wrong
# type in the config would otherwise quietly produce an empty dataset).
DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING = 0.1
SPLIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_INT64_MAX = (1 << 63) - 1
OVERFLOW_ACTIONS = ("split", "truncate", "error")


# ----------------------------------------------------------------------------------------- loading


def load_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> BuildConfig:
    """Read a YAML config file, apply `key.path=value` overrides and validate everything."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read the config file {path}: {error.strerror or error}") from error
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, far beyond any build config; "
                          f"{_NOT_A_CONFIG_HINT}")
    raw = parse_yaml(_config_text(data, path), path)
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a YAML build config (a mapping of sections input, output, ...); "
                          f"it starts with {_first_line(data)}")
    return parse_config(apply_overrides(raw, overrides), where=path)


# A build config is a few KiB; the caps keep a huge file or a YAML alias bomb from eating memory.
MAX_CONFIG_BYTES = 16 * 2**20
MAX_YAML_NODES = 200_000

_NOT_A_CONFIG_HINT = "write one with: tfrbeam infer-config DATA_FILE > build.yaml"
_DATA_MAGIC = ((b"PAR1", "a Parquet"), (b"ORC", "an ORC"), (b"Obj\x01", "an Avro"))


def _config_text(data: bytes, path: str) -> str:
    """The config file's text; a data file (Parquet, ORC, Avro, JSON lines, binary, non-UTF-8) is named as such in one
    line."""
    kind = next((kind for magic, kind in _DATA_MAGIC if data.startswith(magic)), None)
    if kind is None and format_from_path(path) == "jsonl" and not path.lower().endswith(".json"):
        kind = "a JSON lines"  # a .json file may be a config written as JSON (YAML reads it)
    if kind is not None:
        raise ConfigError(f"{path}: not a YAML build config but {kind} data file; {_NOT_A_CONFIG_HINT}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a YAML build config (byte {error.start} is not UTF-8 text); "
                          f"{_NOT_A_CONFIG_HINT}") from error
    if "\0" in text:
        raise ConfigError(f"{path}: not a YAML build config (it holds NUL bytes); {_NOT_A_CONFIG_HINT}")
    return text


def _first_line(data: bytes, limit: int = 80) -> str:
    line = data.lstrip().split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
    shown = repr(line[:limit] + ("..." if len(line) > limit else ""))
    return f"{shown}; {_NOT_A_CONFIG_HINT}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (plain YAML silently keeps the last one)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    mapping: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (each key may appear once)", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def parse_yaml(text: str, where: str = "<config>") -> Any:
    """YAML text to Python objects; syntax errors and duplicate keys become a ConfigError with the line.

    Its values are counted from the parser's events (libyaml's when PyYAML has it) before a node is built: a
    document of more than MAX_YAML_NODES is refused naming that; only then are aliases expanded and counted.
    """
    nodes, aliases, line = _counted_values(text, MAX_YAML_NODES)
    if nodes > MAX_YAML_NODES:
        unexpanded = f", not counting what its {aliases:,}+ aliases expand to" if aliases else ""
        raise ConfigError(f"{where}: holds more than {MAX_YAML_NODES:,} YAML values (lists, mappings and scalars; "
                          f"that many by line {line}{unexpanded}), far beyond any build config (a few hundred); "
                          "is it a data file?")
    loader = _UniqueKeyLoader(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_node_count(node, MAX_YAML_NODES) if aliases else nodes
        if expanded > MAX_YAML_NODES:
            raise ConfigError(f"{where}: its YAML aliases (*name) expand to more than {MAX_YAML_NODES:,} values "
                              f"(an alias bomb?); write the repeated parts out or use fewer nested aliases")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: not valid YAML: {error}") from error
    except RecursionError as error:
        raise ConfigError(f"{where}: nested too deeply to be a build config") from error
    finally:
        loader.dispose()


_EVENT_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_VALUE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)


def _counted_values(text: str, limit: int) -> tuple[int, int, int]:
    """(values, aliases, 1-based line reached) of a YAML text, from its parser's events, stopping past limit
    values. A syntax error stops the count: composing the text reports it, with the line, as it always has."""
    values = aliases = 0
    line = 1
    try:
        for event in yaml.parse(text, Loader=_EVENT_LOADER):
            if isinstance(event, _VALUE_EVENTS):
                values += 1
                if values > limit:
                    line = event.start_mark.line + 1 if event.start_mark is not None else 0
                    break
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
    except yaml.YAMLError:
        pass
    return values, aliases, line


def _expanded_node_count(root: yaml.Node, limit: int) -> int:
    """How many nodes the YAML graph has once every alias is expanded; stops counting past `limit`."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = limit + 1  # a cycle (a recursive alias) counts as too many
        total = 1
        children = node.value if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) else []
        for child in children:
            total += sum(size(part) for part in child) if isinstance(child, tuple) else size(child)
            if total > limit:
                break
        sizes[id(node)] = min(total, limit + 1)
        return sizes[id(node)]

    return size(root)


def apply_overrides(raw: Any, overrides: list[str] | tuple[str, ...]) -> dict:
    """Return a copy of the raw config with each `key.path=value` set; values are parsed as YAML."""
    result = _deep_copy(raw if raw is not None else {})
    if not isinstance(result, dict):
        raise ConfigError(f"the config must be a mapping of sections (input, features, ...), got {_show(raw)}")
    for override in overrides:
        key_path, sep, text = override.partition("=")
        keys = key_path.strip().split(".")
        if not sep or not all(keys):
            raise ConfigError(f"--set {override!r}: expected key.path=value, e.g. --set shuffle.seed=7")
        value = parse_yaml(text, f"--set {override!r}") if text.strip() else None
        node = result
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                at = ".".join(keys[: depth + 1])
                raise ConfigError(
                    f"--set {override!r}: {at} is {_show(child)}, not a mapping, so it has no key {keys[depth + 1]!r}"
                )
            node = child
        node[keys[-1]] = value
    _drop_replaced_sharding_key(result, overrides)
    return result


_SHARDING_KEYS = ("num_shards", "max_bytes_per_shard")


def _drop_replaced_sharding_key(raw: dict, overrides: list[str] | tuple[str, ...]) -> None:
    """--set of one of output.num_shards / output.max_bytes_per_shard replaces the other (they exclude each other)."""
    set_keys = {override.partition("=")[0].strip().split(".")[:2][-1] for override in overrides
                if override.strip().startswith("output.")}
    chosen = [key for key in _SHARDING_KEYS if key in set_keys]
    output = raw.get("output")
    if len(chosen) == 1 and isinstance(output, dict):
        other = _SHARDING_KEYS[1 - _SHARDING_KEYS.index(chosen[0])]
        output.pop(other, None)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value


def parse_size(value: Any) -> int:
    """A byte count from an int or a string like "256MiB", "1GB", "512 KiB" (KB = 1000, KiB = 1024)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            size = float(number) * _SIZE_UNITS[(unit or "b").lower()]
            if size == int(size):
                return int(size)
    raise ValueError("not a size")


# ------------------------------------------------------------------------------------- validation


class Checker:
    """Collects every problem of a raw config with its key path, so one error lists them all."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, raw: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        """The mapping at path (None = empty); unknown keys and missing required keys are problems."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.fail(path or "(top level)", f"expected a mapping with keys {', '.join(allowed)}, got {_show(raw)}")
            return {}
        for key in raw:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                self.fail(where, f"unknown key (allowed: {', '.join(allowed)}){suggestion}")
        for key in required:
            if raw.get(key) is None:
                self.fail(f"{path}.{key}" if path else key, "is required")
        return raw

    def choice(self, raw: dict, key: str, path: str, allowed: tuple[str, ...], default: str) -> str | None:
        """One of allowed (default when absent); None after reporting a value that is not allowed."""
        value = raw.get(key, default)
        if value is None:
            return default
        if value not in allowed:
            hint = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.75)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            self.fail(f"{path}.{key}", f"{_show(value)} is not one of {', '.join(allowed)}{suggestion}")
            return None
        return value

    def boolean(self, raw: dict, key: str, path: str, default: bool) -> bool:
        value = raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(f"{path}.{key}", f"{_show(value)} is not a boolean (true or false)")
            return default
        return value

    @overload
    def integer(self, raw: dict, key: str, path: str, default: int, minimum: int, maximum: int = ...) -> int: ...
    @overload
    def integer(self, raw: dict, key: str, path: str, default: None, minimum: int, maximum: int = ...) -> int | None: ...

    def integer(self, raw: dict, key: str, path: str, default: int | None, minimum: int, maximum: int = _INT64_MAX) -> int | None:
        value = raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{path}.{key}", f"{_show(value)} is not an integer (allowed: {minimum} to {maximum})")
            return default
        if not minimum <= value <= maximum:
            self.fail(f"{path}.{key}", f"{_show(value)} is out of range (allowed: {minimum} to {maximum})")
            return default
        return value

    def number(self, raw: dict, key: str, path: str, default: float, low: float, high: float) -> float:
        value = raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            self.fail(f"{path}.{key}", f"{_show(value)} is not a number from {low} to {high}")
            return default
        return float(value)

    @overload
    def string(self, raw: dict, key: str, path: str, default: str) -> str: ...
    @overload
    def string(self, raw: dict, key: str, path: str, default: None) -> str | None: ...

    def string(self, raw: dict, key: str, path: str, default: str | None) -> str | None:
        value = raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            self.fail(f"{path}.{key}", f"{_show(value)} is not a non-empty string")
            return default
        return value

    @overload
    def char(self, raw: dict, key: str, path: str, default: str, nullable: Literal[False]) -> str: ...
    @overload
    def char(self, raw: dict, key: str, path: str, default: str | None, nullable: bool) -> str | None: ...

    def char(self, raw: dict, key: str, path: str, default: str | None, nullable: bool) -> str | None:
        """A single character; null (or false) means none when nullable."""
        if key not in raw:
            return default
        value = raw[key]
        if (value is None or value is False) and nullable:
            return None
        if not isinstance(value, str) or len(value) != 1 or value in "\r\n":
            allowed = "a single character other than a line break" + (", or null for none" if nullable else "")
            self.fail(f"{path}.{key}", f"{_show(value)} is not {allowed}")
            return default
        return value

    def names(self, raw: dict, key: str, path: str, allow_single: bool = False,
              allow_empty: bool = False) -> tuple[str, ...] | None:
        """A list of unique non-empty strings (or one string when allow_single; [] when allow_empty); None stays None."""
        value = raw.get(key)
        if value is None:
            return None
        if allow_single and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not (value or allow_empty) or not all(isinstance(item, str) and item
                                                                                 for item in value):
            what = "a list of non-empty strings" if allow_empty else "a non-empty list of non-empty strings"
            self.fail(f"{path}.{key}" if path else key, f"{_show(value)} is not {what}")
            return None
        duplicates = sorted({item for item in value if value.count(item) > 1})
        if duplicates:
            self.fail(f"{path}.{key}", f"{_show(value)} names {', '.join(map(repr, duplicates))} more than once")
            return None
        return tuple(value)


_TOP_KEYS = ("input", "features", "features_from", "shuffle", "splits", "split_key", "output", "errors", "stats", "sequence")
_INPUT_KEYS = ("format", "path", "csv", "jsonl", "parquet", "columns", "split_bytes", "splits", "compression")
_JSONL_KEYS = ("max_row_bytes",)
_PARQUET_KEYS = ("require_checksums",)
_CSV_KEYS = ("delimiter", "quote_char", "escape_char", "header", "column_names", "null_values", "true_values",
             "false_values", "skip_rows", "encoding", "max_row_bytes")
_FEATURE_KEYS = ("type", "source", "on_null", "default", "separator", "length", "format", "unit", "null_values",
                 "from_file", "max_file_bytes", "file_root", "image")
_SHUFFLE_KEYS = ("enabled", "seed")
_OUTPUT_KEYS = ("path", "num_shards", "max_bytes_per_shard", "compression", "dali_index", "schema_pbtxt")
_ERRORS_KEYS = ("on_bad_record", "max_bad_fraction", "allow_empty")
_SEQUENCE_KEYS = ("group_by", "order_by", "context", "max_steps", "overflow", "min_steps", "max_group_bytes")


def parse_config(raw: Any, where: str = "<config>") -> BuildConfig:
    """Validate a raw (YAML-loaded) config and build the BuildConfig; all problems raise one ConfigError."""
    check = Checker()
    patterns = _split_patterns(raw.get("splits") if isinstance(raw, dict) else None)
    top = check.mapping(raw, "", _TOP_KEYS, required=("output",) if patterns else ("input", "output"))
    input_config = _parse_input(check, top.get("input"), patterns)
    features = _parse_features(check, top.get("features"), input_config)
    if top.get("features_from") is not None:
        features = _features_from(check, top["features_from"], features, input_config)
    input_config = with_feature_null_values(input_config, features)
    shuffle = _parse_shuffle(check, top.get("shuffle"))
    splits, split_by = _parse_splits(check, top.get("splits"))
    split_key = check.names(top, "split_key", "split_key", allow_single=True)
    if split_by is not None and split_key is not None:
        check.fail("split_key", "only fraction splits are hashed; splits from a column or file patterns take no split_key")
    output = _parse_output(check, top.get("output"), splits)
    errors = _parse_errors(check, top.get("errors"))
    stats = top.get("stats", False)
    if not isinstance(stats, bool):
        check.fail("stats", f"{_show(stats)} is not a boolean (true writes stats.json and stats.html with the dataset)")
        stats = False
    sequence = _parse_sequence(check, top.get("sequence")) if top.get("sequence") is not None else None
    if sequence is not None and split_by is not None:
        check.fail("sequence", "a SequenceExample build splits by its group key's hash; give splits as fractions")
    elif sequence is not None:
        split_key = _sequence_split_key(check, sequence, split_key)
        if stats:
            check.fail("stats", "statistics of SequenceExample datasets are not computed yet (set stats: false)")
        if output.schema_pbtxt:
            check.fail("output.schema_pbtxt", "a schema.pbtxt of SequenceExamples is not written yet (set it false)")
    if check.problems:
        count = len(check.problems)
        heading = f"{where}: {count} problem{'s' if count > 1 else ''} in the build config:\n  "
        raise ConfigError(heading + "\n  ".join(check.problems))
    return BuildConfig(input=input_config, output=output, features=features, shuffle=shuffle,
                       splits=splits, split_by=split_by, split_key=split_key, errors=errors, stats=stats,
                       sequence=sequence)


def _parse_input(check: Checker, raw: Any, patterns: tuple[tuple[str, str], ...] = ()) -> InputConfig:
    """The input section; with file-pattern splits (``patterns``) there is no input.path, and the format is the first
    pattern's."""
    section = check.mapping(raw, "input", _INPUT_KEYS, required=("path",) if raw is not None and not patterns else ())
    path = (check.string(section, "path", "input", None) or "") if patterns else check.string(section, "path", "input", "")
    if patterns and path:
        check.fail("input.path", "not used when splits are file patterns (each split's glob lists its files); drop it")
    fmt = (section.get("format") or format_from_path(path or (patterns[0][1] if patterns else ""))
           or _dataset_format(path or ""))
    if patterns and not section.get("format"):
        _check_pattern_formats(check, patterns)
    if fmt is None:
        known = ", ".join(FORMAT_EXTENSIONS)
        check.fail("input.format", f"is required: {path!r} does not end in an extension that names a format ({known}; "
                   f"each also with .gz, .bz2, .xz, .zst or .deflate), nor is it a tfrbeam dataset directory "
                   f"(allowed: {', '.join(INPUT_FORMATS)})")
        fmt = "csv"
    else:
        fmt = check.choice({"format": fmt}, "format", "input", INPUT_FORMATS, "csv") or "csv"
    if fmt == "avro" and importlib.util.find_spec("fastavro") is None:
        check.fail("input.format", AVRO_INSTALL_HINT)
    if fmt != "csv" and section.get("csv") is not None:
        check.fail("input.csv", f"CSV options are only for input.format csv, but the format is {fmt}")
    if fmt != "jsonl" and section.get("jsonl") is not None:
        check.fail("input.jsonl", f"JSON lines options are only for input.format jsonl, but the format is {fmt}")
    if fmt != "parquet" and section.get("parquet") is not None:
        check.fail("input.parquet", f"Parquet options are only for input.format parquet, but the format is {fmt}")
    tsv = _without_compression_suffix(path or "").endswith(".tsv")
    csv = _parse_csv(check, section.get("csv"), default_delimiter="\t" if tsv else ",")
    jsonl_section = check.mapping(section.get("jsonl"), "input.jsonl", _JSONL_KEYS)
    jsonl = JsonlOptions(max_row_bytes=_max_row_bytes(check, jsonl_section, "input.jsonl"))
    parquet_section = check.mapping(section.get("parquet"), "input.parquet", _PARQUET_KEYS)
    parquet = ParquetOptions(require_checksums=check.boolean(parquet_section, "require_checksums", "input.parquet", False))
    columns = check.names(section, "columns", "input")
    split_bytes = _size(check, section, "split_bytes", "input", DEFAULT_SPLIT_BYTES)
    tfrecord = _parse_tfrecord(check, section, fmt)
    return InputConfig(format=fmt, path=path or "", csv=csv, jsonl=jsonl, parquet=parquet, tfrecord=tfrecord,
                       columns=columns, split_bytes=split_bytes)


def _parse_tfrecord(check: Checker, section: dict, fmt: str) -> TfrecordOptions:
    """input.splits (which splits of a dataset to read) and input.compression, keys of input.format tfrecord only."""
    for key in ("splits", "compression"):
        if fmt != "tfrecord" and section.get(key) is not None:
            check.fail(f"input.{key}", f"only for input.format tfrecord, but the format is {fmt}")
    splits = check.names(section, "splits", "input", allow_single=True)
    compression = check.choice(section, "compression", "input", ("auto", *COMPRESSIONS), "auto") or "auto"
    return TfrecordOptions(splits=splits, compression=None if compression == "none" else compression)


def _dataset_format(path: str) -> str | None:
    """tfrecord for a local directory holding a dataset manifest (a tfrbeam dataset to re-split or re-shard)."""
    return "tfrecord" if path and os.path.isfile(os.path.join(path, MANIFEST_NAME)) else None


def _check_pattern_formats(check: Checker, patterns: tuple[tuple[str, str], ...]) -> None:
    """File-pattern splits read one format: globs whose extensions name different ones need input.format."""
    formats = [(name, format_from_path(pattern)) for name, pattern in patterns]
    if len({fmt for _, fmt in formats if fmt is not None}) > 1:
        check.fail("splits", f"the globs name different formats ({', '.join(f'{name}: {fmt}' for name, fmt in formats)}); "
                   "one build reads one input.format")


def format_from_path(path: str) -> str | None:
    """The input format a path's (or glob's) extension names, a compression suffix (.gz, ...) left aside; or None."""
    lower = _without_compression_suffix(path).removesuffix(".zlib")  # TFRecord's own ZLIB files
    return next((fmt for extension, fmt in FORMAT_EXTENSIONS.items() if lower.endswith(extension)), None)


def _without_compression_suffix(path: str) -> str:
    lower = path.lower()
    suffix = next((suffix for suffix in _COMPRESSION_SUFFIXES if lower.endswith(suffix)), "")
    return lower[:len(lower) - len(suffix)]


def _parse_csv(check: Checker, raw: Any, default_delimiter: str) -> CsvOptions:
    section = check.mapping(raw, "input.csv", _CSV_KEYS)
    path = "input.csv"
    delimiter = check.char(section, "delimiter", path, default_delimiter, nullable=False)
    quote_char = check.char(section, "quote_char", path, '"', nullable=True)
    escape_char = check.char(section, "escape_char", path, None, nullable=True)
    header = check.boolean(section, "header", path, True)
    column_names = check.names(section, "column_names", path)
    if not header and column_names is None:
        check.fail(f"{path}.column_names", "is required when header is false (list the column names in file order)")
    chars = {"delimiter": delimiter, "quote_char": quote_char, "escape_char": escape_char}
    used = [(name, char) for name, char in chars.items() if char is not None]
    for index, (name, char) in enumerate(used):
        for other, other_char in used[index + 1:]:
            if char == other_char:
                check.fail(f"{path}.{other}", f"{_show(char)} is also the {name}; they must differ")
    null_values = _tokens(check, section, "null_values", '["", "NA"]')
    true_values = _tokens(check, section, "true_values", '["TRUE", "true"]')
    false_values = _tokens(check, section, "false_values", '["FALSE", "false"]')
    for token in sorted(set(true_values or ()) & set(false_values or ())):
        check.fail(f"{path}.false_values", f"{token!r} is also in true_values")
    skip_rows = check.integer(section, "skip_rows", path, 0, minimum=0)
    encoding = check.string(section, "encoding", path, "utf-8")
    problem = encoding_problem(encoding)
    if problem is not None:
        check.fail(f"{path}.encoding", problem)
        encoding = "utf-8"
    return CsvOptions(delimiter=delimiter, quote_char=quote_char, escape_char=escape_char, header=header,
                      column_names=column_names, null_values=null_values, true_values=true_values,
                      false_values=false_values, skip_rows=skip_rows, encoding=encoding,
                      max_row_bytes=_max_row_bytes(check, section, "input.csv"))


def _max_row_bytes(check: Checker, section: dict, path: str) -> int:
    """input.csv's or input.jsonl's max_row_bytes: a size of at least 1 MiB (64 MiB when left out)."""
    size = _size(check, section, "max_row_bytes", path, DEFAULT_MAX_ROW_BYTES)
    if size is not None and size < 1 << 20:
        check.fail(f"{path}.max_row_bytes", f"{_show(section.get('max_row_bytes'))} is below 1 MiB (the default is "
                   f"{DEFAULT_MAX_ROW_BYTES >> 20}MiB; it only needs raising for longer rows)")
        return DEFAULT_MAX_ROW_BYTES
    return size or DEFAULT_MAX_ROW_BYTES


def _tokens(check: Checker, section: dict, key: str, example: str) -> tuple[str, ...] | None:
    """A list of strings; None when not given (none, or inferred from a sample when features are left out too)."""
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        check.fail(f"input.csv.{key}", f"{_show(value)} is not a list of strings (e.g. {example}); "
                   "quote values YAML would read as something else, like 'null' or '1'")
        return ()
    return tuple(value)


def _parse_features(check: Checker, raw: Any, input_config: InputConfig) -> tuple[FeatureSpec, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        check.fail("features", f"expected a mapping of feature name to its settings (or leave features out to "
                   f"take every input column), got {_show(raw)}")
        return None
    specs = []
    for name, settings in raw.items():
        path = f"features.{name}"
        if not isinstance(name, str) or not name:
            check.fail(path, "a feature name must be a non-empty string")
            continue
        spec = _parse_feature(check, name, settings, path, input_config)
        specs.append(spec)
        specs.extend(_image_features(check, spec, settings, path))
    names = [spec.name for spec in specs]
    for name in sorted({name for name in names if names.count(name) > 1}):
        check.fail(f"features.{name}", "is also the name of an image fact another feature's image adds")
    return tuple(specs)


def _features_from(check: Checker, raw: Any, features: tuple[FeatureSpec, ...] | None,
                   input_config: InputConfig) -> tuple[FeatureSpec, ...] | None:
    """``features_from``: the features of a TensorFlow Metadata schema.pbtxt, instead of ``features``."""
    if features is not None:
        check.fail("features_from", "gives the features, and so does features; keep one of them")
        return features
    if not isinstance(raw, str) or not raw:
        check.fail("features_from", f"{_show(raw)} is not the path of a schema.pbtxt")
        return None
    try:
        return features_of_schema_file(raw, input_config.format)
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
                check.fail(f"{path}.image", f"{_show(item)} is not one of {', '.join(IMAGE_PARTS)}")
    else:
        check.fail(f"{path}.image", f"{_show(value)} is not true or a list of some of {', '.join(IMAGE_PARTS)}")
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
        check.fail(f"{path}.from_file", f"{_show(value)} is not true (the file's bytes) or one of "
                   f"{', '.join(IMAGE_PARTS)} (a fact of the image's header)")
        return None
    for key in ("separator", "length"):
        if section.get(key) is not None:
            check.fail(f"{path}.{key}", "a from_file feature is one file (leave out separator and length)")
    feature_type = FileOptions(part=part).feature_type
    file_root = check.string(section, "file_root", path, None)
    if type_name is not None and type_name != feature_type:
        check.fail(f"{path}.type", f"from_file: {_show(value)} gives {feature_type} values; set type: {feature_type} "
                   "or leave type out")
    if part != "bytes":
        if section.get("max_file_bytes") is not None:
            check.fail(f"{path}.max_file_bytes", "limits only from_file: true (a header fact reads just the header)")
        if pillow_missing():
            check.fail(f"{path}.from_file", f"{value} needs Pillow: {IMAGE_EXTRA}")
        return FileOptions(part=part, max_bytes=None, file_root=file_root)
    max_bytes = _size(check, section, "max_file_bytes", path, DEFAULT_MAX_FILE_BYTES)
    if max_bytes > MAX_FILE_BYTES:
        check.fail(f"{path}.max_file_bytes", f"{max_bytes} is above 1GiB (a record holds at most 2 GiB - 1 bytes)")
    return FileOptions(part=part, max_bytes=max_bytes, file_root=file_root)


def _parse_feature(check: Checker, name: str, raw: Any, path: str, input_config: InputConfig) -> FeatureSpec:
    section = check.mapping(raw, path, _FEATURE_KEYS)
    type_name = section.get("type")
    if type_name is not None and type_name not in (*FEATURE_TYPES, TIMESTAMP):
        hint = {"string": "bytes", "str": "bytes", "int": "int64", "integer": "int64", "float32": "float",
                "float64": "float", "double": "float", "bool": "int64", "datetime": TIMESTAMP,
                "date": TIMESTAMP}.get(str(type_name).lower())
        close = difflib.get_close_matches(str(type_name).lower(), (*FEATURE_TYPES, TIMESTAMP), n=1, cutoff=0.6)
        suggestion = f"; use {hint}" if hint else f"; did you mean {close[0]!r}?" if close else ""
        check.fail(f"{path}.type", f"{_show(type_name)} is not one of {', '.join((*FEATURE_TYPES, TIMESTAMP))}{suggestion}")
        type_name = None
    time_unit, time_format = _timestamp_settings(check, section, path, type_name == TIMESTAMP)
    file = _file_options(check, section, path, type_name)
    if file is not None:
        type_name = file.feature_type
    if type_name == TIMESTAMP:
        type_name = "int64"  # the feature holds the count of time_unit since the epoch
    source, source_path = _source(check, section, path, name)
    null_values = _feature_null_values(check, section, path, input_config)
    on_null = check.choice(section, "on_null", path, ON_NULL_ACTIONS, "error")
    separator = section.get("separator")
    if separator is not None and (not isinstance(separator, str) or not separator):
        check.fail(f"{path}.separator", f"{_show(separator)} is not a non-empty string")
        separator = None
    length = check.integer(section, "length", path, None, minimum=1)
    if length is not None and separator is None and input_config.format == "csv":
        check.fail(f"{path}.length", "is only allowed with separator (a CSV column is one string; "
                   "set separator to split it into a list of this length)")
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
        check.fail(f"{path}.{'separator' if separator is not None else 'length'}",
                   "a timestamp feature is one value (leave out separator and length)")
    return FeatureSpec(name=name, type=type_name, source=source, on_null=on_null, default=default,
                       separator=separator, length=length, is_list=is_list, time_unit=time_unit, time_format=time_format,
                       source_path=source_path, null_values=null_values, file=file)


def _feature_null_values(check: Checker, section: dict, path: str, input_config: InputConfig) -> tuple[str, ...] | None:
    """A feature's own CSV null tokens (they replace input.csv.null_values for it); None when not given."""
    value = section.get("null_values")
    if value is None:
        return None
    if input_config.format != "csv":
        check.fail(f"{path}.null_values", "is only for CSV inputs (Parquet nulls are in the file)")
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        check.fail(f"{path}.null_values", f"{_show(value)} is not a list of strings (e.g. [\"\"] or []); quote "
                   "values YAML would read as something else, like 'null' or '1'")
        return None
    return tuple(value)


def with_feature_null_values(input_config: InputConfig, features: tuple[FeatureSpec, ...] | None) -> InputConfig:
    """The input with csv.feature_null_values derived from the features' own null_values (what the reader nulls)."""
    own = [spec.null_values for spec in features or () if spec.null_values is not None]
    tokens = tuple(dict.fromkeys(token for tokens in own for token in tokens)) if own else None
    if input_config.csv.feature_null_values == tokens:
        return input_config
    return replace(input_config, csv=replace(input_config.csv, feature_null_values=tokens))


def _source(check: Checker, section: dict, path: str, name: str) -> tuple[str, tuple[str, ...] | None]:
    """A feature's source: a string (a column, or a dotted struct path when no column has that name), or a list,
    the exact path ([column, field, ...]; ["a.b"] is the column "a.b")."""
    value = section.get("source")
    if not isinstance(value, list):
        return check.string(section, "source", path, name), None
    if not value or not all(isinstance(part, str) and part for part in value):
        check.fail(f"{path}.source", f"{_show(value)} is not a non-empty list of non-empty names "
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
            check.fail(f"{path}.format", f"{_show(section['format'])} is not a non-empty string "
                       "(a strptime format like \"%Y-%m-%d %H:%M\", or null for ISO 8601)")
        else:
            time_format = section["format"]
    return unit, time_format


def check_default(check: Checker, path: str, value: Any, type_name: str, is_list: bool, length: int | None) -> Any:
    """The default converted to its stored form (tuple for lists), or None after reporting a problem."""
    if is_list:
        if not isinstance(value, list):
            check.fail(path, f"{_show(value)} is not a list of {type_name} values (the feature is a list)")
            return None
        if length is not None and len(value) != length:
            check.fail(path, f"{_show(value)} has {len(value)} values but length is {length}")
            return None
        items = [_default_item(item, type_name) for item in value]
        if any(item is None for item in items):
            check.fail(path, f"{_show(value)} is not a list of {type_name} values ({_TYPE_WORDS[type_name]})")
            return None
        return tuple(items)
    item = _default_item(value, type_name)
    if item is None:
        check.fail(path, f"{_show(value)} is not a {type_name} value ({_TYPE_WORDS[type_name]})")
    return item


_TYPE_WORDS = {"int64": "an integer from -2**63 to 2**63-1", "float": "a number", "bytes": "a string"}


def _default_item(value: Any, type_name: str) -> Any:
    if isinstance(value, bool):
        return None
    if type_name == "int64":
        return value if isinstance(value, int) and -_INT64_MAX - 1 <= value <= _INT64_MAX else None
    if type_name == "float":
        return float(value) if isinstance(value, (int, float)) and not math.isinf(value) else None
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8") if isinstance(value, str) else None


def _parse_shuffle(check: Checker, raw: Any) -> ShuffleConfig:
    section = check.mapping(raw, "shuffle", _SHUFFLE_KEYS)
    enabled = check.boolean(section, "enabled", "shuffle", True)
    seed = check.integer(section, "seed", "shuffle", 0, minimum=0, maximum=(1 << 64) - 1)
    return ShuffleConfig(enabled=enabled, seed=seed)


def _split_patterns(raw: Any) -> tuple[tuple[str, str], ...]:
    """The (split, glob) pairs of file-pattern splits (a mapping of split name to string, no ``column`` key), else ()."""
    if not isinstance(raw, dict) or "column" in raw or not any(isinstance(value, str) for value in raw.values()):
        return ()
    return tuple((str(name), value) for name, value in raw.items() if isinstance(value, str))


def _parse_splits(check: Checker, raw: Any) -> tuple[dict[str, float | None], SplitColumn | SplitFiles | None]:
    """The split names in order and what assigns rows to them: fractions of the hash, a split column or file patterns."""
    if raw is None:
        return {"train": 1.0}, None
    if not isinstance(raw, dict) or not raw:
        check.fail("splits", "expected a mapping of split name to fraction (e.g. {train: 0.8, eval: 0.2}), a split column "
                   "({column: NAME, map: {VALUE: SPLIT}}) or file patterns ({train: data/train-*.csv}), got "
                   + _show(raw))
        return {"train": 1.0}, None
    if "column" in raw:
        return _parse_split_column(check, raw)
    if _split_patterns(raw):
        return _parse_split_files(check, raw)
    splits: dict[str, float] = {}
    for name, fraction in raw.items():
        if not _split_name_ok(check, f"splits.{name}", name):
            continue
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            check.fail(f"splits.{name}", f"{_show(fraction)} is not a fraction greater than 0 and at most 1")
            continue
        splits[name] = float(fraction)
    _check_split_case(check, list(splits), lambda name: f"splits.{name}")
    if len(splits) == len(raw) and abs(math.fsum(splits.values()) - 1.0) > 1e-9:
        check.fail("splits", f"fractions {', '.join(f'{k}: {v:g}' for k, v in splits.items())} sum to "
                   f"{math.fsum(splits.values()):.12g}, not 1")
    return {**splits}, None


def _split_name_ok(check: Checker, path: str, name: Any) -> bool:
    if isinstance(name, str) and SPLIT_NAME.match(name):
        return True
    check.fail(path, f"{_show(name)} is not a valid split name (a letter, then letters, digits, _ or -; it becomes part "
               "of file names)")
    return False


def _check_split_case(check: Checker, names: list[str], path_of: Callable[[str], str]) -> None:
    """Distinct split names that differ only in case are refused: their directories and file names would clash."""
    lowered = [name.lower() for name in names]
    for name in names:
        if lowered.count(name.lower()) > 1:
            check.fail(path_of(name), "differs from another split name only in case (file names would clash)")


def _parse_split_column(check: Checker, raw: dict) -> tuple[dict[str, float | None], SplitColumn | None]:
    """splits: {column: NAME, map: {VALUE: SPLIT, ...}, names: [SPLIT, ...]}; names is required without a map."""
    section = check.mapping(raw, "splits", ("column", "map", "names"))
    column = check.string(section, "column", "splits", "")
    raw_map = section.get("map")
    values: list[tuple[str, str]] = []
    if raw_map is not None and (not isinstance(raw_map, dict) or not raw_map):
        check.fail("splits.map", f"{_show(raw_map)} is not a non-empty mapping of column value to split name")
    elif raw_map is not None:
        values = _split_map(check, raw_map)
    names = _split_names(check, section.get("names"), values, raw_map is not None)
    _check_split_case(check, names, lambda name: "splits.map" if raw_map is not None else "splits.names")
    if not column or not names:
        return {"train": None}, None
    return dict.fromkeys(names), SplitColumn(column, tuple(values))


def _split_map(check: Checker, raw_map: dict) -> list[tuple[str, str]]:
    """The map's (value as the column's text, split) pairs: integer keys as digits, booleans as true/false."""
    values: list[tuple[str, str]] = []
    for key, split in raw_map.items():
        if isinstance(key, bool):
            text = "true" if key else "false"
        elif isinstance(key, (str, int)):
            text = str(key)
        else:
            check.fail(f"splits.map.{key}", f"a map key is a string, integer or boolean (the column's value), not {_show(key)}")
            continue
        if any(text == seen for seen, _ in values):
            check.fail("splits.map", f"the value {text!r} is given twice")
        elif _split_name_ok(check, f"splits.map.{key}", split):
            values.append((text, split))
    return values


def _split_names(check: Checker, raw_names: Any, values: list[tuple[str, str]], mapped: bool) -> list[str]:
    """The split names of a split column in order: names if given (checked against the map), else the map's values."""
    from_map = list(dict.fromkeys(split for _, split in values))
    if raw_names is None:
        if not mapped:
            check.fail("splits.names", "is required without splits.map (the split names the column's values are, "
                       "e.g. names: [train, eval])")
        return from_map
    if not isinstance(raw_names, list) or not raw_names:
        check.fail("splits.names", f"{_show(raw_names)} is not a non-empty list of split names")
        return from_map
    names = [name for name in raw_names if _split_name_ok(check, "splits.names", name)]
    if len(set(names)) < len(names):
        check.fail("splits.names", f"{_show(raw_names)} names a split more than once")
    if mapped and values and set(names) != set(from_map):
        check.fail("splits.names", f"{_show(raw_names)} differs from the split names of splits.map ({', '.join(from_map)})")
    return list(dict.fromkeys(names))


def _parse_split_files(check: Checker, raw: dict) -> tuple[dict[str, float | None], SplitFiles | None]:
    """splits: {SPLIT: GLOB, ...}: every row of a file a split's glob matches goes to that split."""
    if not all(isinstance(value, str) for value in raw.values()):
        for name, value in raw.items():
            if isinstance(value, str):
                check.fail(f"splits.{name}", f"{_show(value)} is not a fraction greater than 0 and at most 1 (splits "
                           "mixes fractions and file patterns: give every split a fraction, or every split a glob)")
        return {"train": None}, None
    patterns: list[tuple[str, str]] = []
    for name, pattern in raw.items():
        if not _split_name_ok(check, f"splits.{name}", name):
            continue
        if not pattern:
            check.fail(f"splits.{name}", f"{_show(pattern)} is not a non-empty glob")
            continue
        patterns.append((name, pattern))
    _check_split_case(check, [name for name, _ in patterns], lambda name: f"splits.{name}")
    if len(patterns) < len(raw):
        return {"train": None}, None
    return dict.fromkeys(name for name, _ in patterns), SplitFiles(tuple(patterns))


def _parse_output(check: Checker, raw: Any, splits: dict[str, float | None]) -> OutputConfig:
    section = check.mapping(raw, "output", _OUTPUT_KEYS, required=("path",) if raw is not None else ())
    path = check.string(section, "path", "output", "") or ""
    raw_shards = section.get("num_shards")
    num_shards: int | dict[str, int] | None = None
    if isinstance(raw_shards, dict):
        num_shards = {}
        for split, count in raw_shards.items():
            if split not in splits:
                check.fail(f"output.num_shards.{split}", f"is not a split name (splits: {', '.join(splits)})")
            elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
                check.fail(f"output.num_shards.{split}", f"{_show(count)} is not a positive integer")
            else:
                num_shards[split] = count
        missing = [split for split in splits if split not in raw_shards]
        if missing:
            check.fail("output.num_shards", f"gives no shard count for split{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)} (give every split a count, or one integer for all)")
    elif raw_shards is not None:
        num_shards = check.integer(section, "num_shards", "output", None, minimum=1, maximum=1_000_000)
    raw_max_bytes = section.get("max_bytes_per_shard")
    max_bytes = _size(check, section, "max_bytes_per_shard", "output", None)
    if raw_shards is not None and raw_max_bytes is not None:
        check.fail("output.max_bytes_per_shard", "cannot be set together with num_shards (set one of them)")
    if raw_shards is None and raw_max_bytes is None:
        max_bytes = DEFAULT_MAX_BYTES_PER_SHARD
    compression = check.choice(section, "compression", "output", COMPRESSIONS, "none") or "none"
    dali_index = check.boolean(section, "dali_index", "output", False)
    schema_pbtxt = check.boolean(section, "schema_pbtxt", "output", False)
    if schema_pbtxt:
        try:
            schema_pb2("output.schema_pbtxt")
        except ConfigError as error:
            check.problems.append(str(error))
    if dali_index and compression != "none":
        check.fail("output.dali_index", "DALI indexes describe uncompressed TFRecord files; set output.compression: none "
                   "or drop dali_index")
    return OutputConfig(path=path, num_shards=num_shards, max_bytes_per_shard=max_bytes,
                        compression=None if compression == "none" else compression, dali_index=dali_index,
                        schema_pbtxt=schema_pbtxt)


def _parse_sequence(check: Checker, raw: Any) -> SequenceConfig | None:
    """The sequence section; names are checked against the features later (validate_against_schema)."""
    path = "sequence"
    section = check.mapping(raw, path, _SEQUENCE_KEYS, required=("group_by",) if isinstance(raw, dict) else ())
    if not isinstance(raw, dict):
        return None
    group_by = check.names(section, "group_by", path, allow_single=True) or ()
    order_by = check.names(section, "order_by", path, allow_empty=True) or ()
    context = check.names(section, "context", path, allow_empty=True) or ()
    for name in order_by:
        if name in group_by:
            check.fail(f"{path}.order_by", f"{name!r} is in group_by (it is constant within a group; order by another feature)")
    for name in context:
        if name in group_by:
            check.fail(f"{path}.context", f"{name!r} is in group_by (group_by features are context already; "
                       "leave it out of context)")
        elif name in order_by:
            check.fail(f"{path}.context", f"{name!r} is in order_by too (order_by features are steps; a feature is one "
                       "or the other)")
    max_steps = check.integer(section, "max_steps", path, None, minimum=1)
    overflow = check.choice(section, "overflow", path, OVERFLOW_ACTIONS, "split") or "split"
    if overflow != "split" and section.get("max_steps") is None:
        check.fail(f"{path}.overflow", f"{overflow} needs max_steps (the longest sequence to keep)")
    min_steps = check.integer(section, "min_steps", path, 1, minimum=1)
    if max_steps is not None and min_steps > max_steps:
        check.fail(f"{path}.min_steps", f"{min_steps} is more than max_steps {max_steps} (no sequence could be kept)")
    max_group_bytes = _size(check, section, "max_group_bytes", path, DEFAULT_MAX_GROUP_BYTES)
    if not group_by:
        return None
    return SequenceConfig(group_by=group_by, order_by=order_by, context=context, max_steps=max_steps,
                          overflow=overflow, min_steps=min_steps, max_group_bytes=max_group_bytes)


def _sequence_split_key(check: Checker, sequence: SequenceConfig, split_key: tuple[str, ...] | None) -> tuple[str, ...]:
    """A sequence build splits by its group key (or a part of it): a group never straddles splits."""
    if split_key is None:
        return sequence.group_by
    outside = [name for name in split_key if name not in sequence.group_by]
    if outside:
        check.fail("split_key", f"{list(outside)} is not part of sequence.group_by {list(sequence.group_by)}: a group's "
                   "rows would straddle splits (allowed: a subset of group_by, or leave split_key out to split by it)")
    return split_key


def _parse_errors(check: Checker, raw: Any) -> ErrorsConfig:
    section = check.mapping(raw, "errors", _ERRORS_KEYS)
    action = check.choice(section, "on_bad_record", "errors", BAD_RECORD_ACTIONS, "fail") or "fail"
    default_fraction = 0.0 if action == "fail" else DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING
    fraction = check.number(section, "max_bad_fraction", "errors", default_fraction, 0.0, 1.0)
    allow_empty = check.boolean(section, "allow_empty", "errors", True)
    return ErrorsConfig(on_bad_record=action, max_bad_fraction=fraction, allow_empty=allow_empty)


@overload
def _size(check: Checker, section: dict, key: str, path: str, default: int) -> int: ...
@overload
def _size(check: Checker, section: dict, key: str, path: str, default: None) -> int | None: ...


def _size(check: Checker, section: dict, key: str, path: str, default: int | None) -> int | None:
    value = section.get(key)
    if value is None:
        return default
    try:
        size = parse_size(value)
    except ValueError:
        size = 0
    if size < 1:
        check.fail(f"{path}.{key}", f"{_show(value)} is not a positive size (an integer number of bytes, "
                   "or a string like \"256MiB\", \"1GB\", \"512KiB\")")
        return default
    return size


def _show(value: Any) -> str:
    """A value as the user wrote it: strings quoted, YAML null as null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# ----------------------------------------------------------------------------------- serialising


def config_to_dict(config: BuildConfig) -> dict:
    """The full resolved config as plain YAML/JSON data; parse_config(config_to_dict(c)) == c."""
    csv = config.input.csv
    input_section: dict[str, Any] = {"format": config.input.format}
    if config.input.path:  # file-pattern splits have no input.path
        input_section["path"] = config.input.path
    if config.input.format == "csv":
        input_section["csv"] = {
            "delimiter": csv.delimiter, "quote_char": csv.quote_char, "escape_char": csv.escape_char,
            "header": csv.header, "column_names": _list_or_none(csv.column_names),
            "null_values": _list_or_none(csv.null_values), "true_values": _list_or_none(csv.true_values),
            "false_values": _list_or_none(csv.false_values), "skip_rows": csv.skip_rows, "encoding": csv.encoding,
            "max_row_bytes": csv.max_row_bytes,
        }
    if config.input.format == "jsonl" and config.input.jsonl.max_row_bytes != DEFAULT_MAX_ROW_BYTES:
        # only when set: the manifests of builds from before the key keep matching a same-config rebuild
        input_section["jsonl"] = {"max_row_bytes": config.input.jsonl.max_row_bytes}
    if config.input.format == "parquet":
        input_section["parquet"] = {"require_checksums": config.input.parquet.require_checksums}
    if config.input.format == "tfrecord":
        input_section["splits"] = _list_or_none(config.input.tfrecord.splits)
        input_section["compression"] = config.input.tfrecord.compression or "none"
    input_section["columns"] = _list_or_none(config.input.columns)
    input_section["split_bytes"] = config.input.split_bytes
    features = None
    if config.features is not None:
        features = {spec.name: _feature_to_dict(spec) for spec in config.features}
    output = config.output
    return {
        "input": input_section,
        "features": features,
        "shuffle": {"enabled": config.shuffle.enabled, "seed": config.shuffle.seed},
        "splits": _splits_to_dict(config),
        "split_key": _list_or_none(config.split_key),
        "output": {
            "path": output.path,
            "num_shards": dict(output.num_shards) if isinstance(output.num_shards, dict) else output.num_shards,
            "max_bytes_per_shard": output.max_bytes_per_shard,
            "compression": output.compression or "none",
            "dali_index": output.dali_index,
            # only when set: the manifests of builds from before the key keep matching a same-config rebuild
            **({"schema_pbtxt": True} if output.schema_pbtxt else {}),
        },
        "errors": {"on_bad_record": config.errors.on_bad_record, "max_bad_fraction": config.errors.max_bad_fraction,
                   "allow_empty": config.errors.allow_empty},
        "stats": config.stats,
        "sequence": _sequence_to_dict(config.sequence),
    }


def _splits_to_dict(config: BuildConfig) -> dict:
    split_by = config.split_by
    if isinstance(split_by, SplitColumn):
        return {"column": split_by.column, "map": dict(split_by.values) if split_by.values else None,
                "names": list(config.splits)}
    if isinstance(split_by, SplitFiles):
        return dict(split_by.patterns)
    return dict(config.splits)


def _sequence_to_dict(sequence: SequenceConfig | None) -> dict | None:
    if sequence is None:
        return None
    return {"group_by": list(sequence.group_by), "order_by": list(sequence.order_by), "context": list(sequence.context),
            "max_steps": sequence.max_steps, "overflow": sequence.overflow, "min_steps": sequence.min_steps,
            "max_group_bytes": sequence.max_group_bytes}


def _feature_to_dict(spec: FeatureSpec) -> dict:
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
    if spec.length is not None:
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


def _list_or_none(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None
