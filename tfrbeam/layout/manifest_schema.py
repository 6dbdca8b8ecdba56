"""The manifest's schema: one typed, bounded validator that every reader and ``verify`` apply, and the ``Manifest``
it guards (frozen; made only from a validated value, written only by ``Manifest.to_bytes``).

A manifest is found, not made: it may be damaged, from another tool, or written to attack the
reader. ``parse_manifest_bytes`` bounds its size before parsing and its nesting while parsing;
``validate_manifest`` checks the type and range of every key a reader uses, so a bad manifest is
one ``ManifestError`` line naming the key path (``splits.train.shards[3].num_bytes: expected a
non-negative integer, got 'abc'``), never a traceback deep inside a reader.

What a dataset is (splits, shards, counts, sizes, hashes, features, config) and how one run made it are apart:
the run's keys (``RUN_KEYS``) sit in one ``run`` record, so two builds of the same data on different runners
differ only there. Manifests of format 1 have those keys at the top level; ``run_record`` reads either.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfrbeam.errors import ManifestError
from tfrbeam.layout.names import LEGACY_MANIFEST_FORMAT, MANIFEST_FORMAT, MANIFEST_NAME
from tfrbeam.layout.paths import name_problem, path_problem

EXAMPLE, SEQUENCE_EXAMPLE = "Example", "SequenceExample"
RECORD_TYPES = (EXAMPLE, SEQUENCE_EXAMPLE)
FEATURE_KINDS = ("int64", "float", "bytes")
COMPRESSIONS = (None, "none", "gzip", "zlib")
MANIFEST_FORMATS = (MANIFEST_FORMAT, LEGACY_MANIFEST_FORMAT)  # what a reader accepts
# The manifest's "run" record: which run published this generation, when, and how the runner ran it.
RUN_KEYS = ("run_id", "started", "finished", "runner", "piece_store", "workers", "shuffled_bytes")
MAX_MANIFEST_BYTES = 512 << 20  # far above a million shards' entries; refused before json.loads
MAX_DEPTH = 32  # a manifest nests about 6 deep (its config a little more)
MAX_COUNT = 1 << 53  # examples or bytes: exact in a float, far above any dataset
MAX_SHARDS = 10_000_000
MAX_SHAPE_RANK = 32
MAX_SHAPE_SIZE = 1 << 31  # values one fixed-shape feature may hold per example


def parse_manifest_bytes(data: bytes, where: str) -> Any:
    """The JSON value of a manifest's bytes, bounded in size and nesting; ``ManifestError`` naming ``where``."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: {len(data)} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES}); "
                            "it is not a tfrbeam manifest")
    depth = _bracket_depth(data)
    if depth > MAX_DEPTH:
        raise ManifestError(f"{where}: JSON nested {depth} deep, more than a manifest's {MAX_DEPTH}; "
                            "it is damaged or not a tfrbeam manifest")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ManifestError(f"{where}: not a readable manifest ({error}); rebuild the dataset or restore the file") from error


def _bracket_depth(data: bytes) -> int:
    """The deepest nesting of [ and { outside JSON strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def validate_manifest(manifest: Any, where: str, verifiable: bool = False) -> None:
    """Raise ``ManifestError`` naming the first missing, mistyped or out-of-range key a reader relies on.

    ``verifiable`` also requires what ``verify`` checks against (each shard's size and sha256, the schema).
    """
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: a manifest is a JSON object, found {type(manifest).__name__}")
    if "format" not in manifest and "fileFormat" in manifest:
        raise ManifestError(f"{where}: TFDS's dataset_info.json, not a tfrbeam manifest (a tfrbeam dataset has "
                            f"{MANIFEST_NAME}): load it with tfds.builder_from_directory, or read its TFRecord files "
                            "by a glob")
    if manifest.get("format") not in MANIFEST_FORMATS:
        raise ManifestError(f"{where}: format {manifest.get('format')!r} is not {MANIFEST_FORMAT!r} (nor "
                            f"{LEGACY_MANIFEST_FORMAT!r}); it was written by a newer tfrbeam or another tool")
    record_type = manifest.get("record_type", EXAMPLE)
    if record_type not in RECORD_TYPES:
        raise ManifestError(f"{where}: record_type {record_type!r} is not one of {', '.join(RECORD_TYPES)}")
    check = _Checker(where)
    check.optional(manifest, "compression", "", lambda value: value in COMPRESSIONS, f"one of {COMPRESSIONS}")
    if manifest["format"] == LEGACY_MANIFEST_FORMAT:
        check.optional(manifest, "run_id", "", _short_string, "a string of at most 200 characters")
    else:
        run = check.optional(manifest, "run", "", _is_dict, "an object")
        check.optional(run or {}, "run_id", "run", _short_string, "a string of at most 200 characters")
    splits = check.required(manifest, "splits", "", lambda value: isinstance(value, dict), "an object of splits")
    for name, split in splits.items():
        problem = name_problem(name)
        if problem is not None:
            check.fail(f"splits[{name!r}]", f"not a safe split name: {problem}")
        _check_split(check, split, f"splits.{name}", verifiable)
    _check_listed_once(check, splits)
    check.optional(manifest, "schema_pbtxt", "", lambda value: path_problem(value) is None,
                   "the relative path of the dataset's schema.pbtxt")
    check.optional(manifest, "tfds", "", _tfds_identity, "an object with the TFDS name and version")
    schema_keys = ("features",) if record_type == EXAMPLE else ("context_features", "sequence_features")
    for key in schema_keys:
        entries = check.required(manifest, key, "", _is_dict, "an object of features") if verifiable else (
            check.optional(manifest, key, "", _is_dict, "an object of features"))
        for feature, entry in (entries or {}).items():
            _check_feature(check, entry, f"{key}.{feature}")
    if record_type == SEQUENCE_EXAMPLE and verifiable:
        check.required(manifest, "sequence", "", _is_dict, "an object")
    _check_inputs(check, manifest)


def run_record(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """How the run that published this generation went (``RUN_KEYS``, those present): the manifest's ``run`` record,
    or in a format 1 manifest the same keys at its top level. ``{}`` when there is none."""
    if manifest.get("format") == LEGACY_MANIFEST_FORMAT:
        return {key: manifest[key] for key in RUN_KEYS if key in manifest}
    run = manifest.get("run")
    return dict(run) if isinstance(run, dict) else {}


def run_id_of(manifest: Mapping[str, Any]) -> str | None:
    """The id of the run that published the manifest's generation (what recovery and the commit compare), or None."""
    run_id = run_record(manifest).get("run_id")
    return run_id if isinstance(run_id, str) else None


def _check_inputs(check: _Checker, manifest: dict) -> None:
    """The inputs' rows read, where recorded (manifests before rows_read have none), and at most the rows read in all."""
    inputs = check.optional(manifest, "inputs", "", lambda value: isinstance(value, list), "a list of inputs")
    total = 0
    for number, entry in enumerate(inputs or ()):
        where = f"inputs[{number}]"
        if not isinstance(entry, dict):
            check.fail(where, f"expected an object, got {_show(entry)}")
        total += check.optional(entry, "rows_read", where, _count, "a non-negative integer") or 0
    rows_read = check.optional(manifest, "rows_read", "", _count, "a non-negative integer")
    if rows_read is not None and any(isinstance(entry, dict) and "rows_read" in entry for entry in inputs or ()) \
            and total != rows_read:
        check.fail("rows_read", f"{rows_read}, but its inputs list {total} rows read; the manifest is damaged or was "
                   "edited: rebuild the dataset or restore its manifest")


def _check_split(check: _Checker, split: Any, key: str, verifiable: bool) -> None:
    if not isinstance(split, dict):
        check.fail(key, f"expected an object, got {_show(split)}")
    total = check.required(split, "num_examples", key, _count, "a non-negative integer")
    check.optional(split, "num_bytes", key, _count, "a non-negative integer")
    shards = check.required(split, "shards", key, lambda value: isinstance(value, list) and len(value) <= MAX_SHARDS,
                            "a list of shards")
    for number, shard in enumerate(shards):
        where = f"{key}.shards[{number}]"
        if not isinstance(shard, dict):
            check.fail(where, f"expected an object, got {_show(shard)}")
        path = check.required(shard, "path", where, lambda value: True, "a path")
        problem = path_problem(path)
        if problem is not None:
            check.fail(f"{where}.path", problem)
        check.required(shard, "num_examples", where, _count, "a non-negative integer")
        if verifiable:
            check.required(shard, "num_bytes", where, _count, "a non-negative integer")
            check.required(shard, "sha256", where, _sha256, "a sha256 hex digest")
        else:
            check.optional(shard, "num_bytes", where, _count, "a non-negative integer")
            check.optional(shard, "sha256", where, _sha256, "a sha256 hex digest")
    listed = sum(shard["num_examples"] for shard in shards)
    if listed != total:  # a shard entry lost or added: every reader would give a count the manifest contradicts
        check.fail(f"{key}.num_examples", f"{total}, but its shards list {listed} examples; the manifest is damaged "
                   "or was edited: rebuild the dataset or restore its manifest")


def _check_listed_once(check: _Checker, splits: dict[str, Any]) -> None:
    """No shard is listed twice, in one split or two: every reader would give its records twice."""
    first_listed: dict[str, str] = {}
    for name, split in splits.items():
        for number, shard in enumerate(split["shards"]):
            key = f"splits.{name}.shards[{number}].path"
            first = first_listed.setdefault(shard["path"], key)
            if first != key:
                check.fail(key, f"{_show(shard['path'])} is listed twice (first at {first}), so its records would be "
                           "read twice; the manifest is damaged or was edited: rebuild the dataset or restore its manifest")


def _check_feature(check: _Checker, entry: Any, key: str) -> None:
    if not isinstance(entry, dict):
        check.fail(key, f"expected an object with type, shape and always_present, got {_show(entry)}")
    check.required(entry, "type", key, lambda value: value in FEATURE_KINDS, f"one of {', '.join(FEATURE_KINDS)}")
    check.optional(entry, "shape", key, _shape, f"null or a list of at most {MAX_SHAPE_RANK} non-negative integers "
                   f"holding at most {MAX_SHAPE_SIZE} values")
    check.optional(entry, "always_present", key, lambda value: isinstance(value, bool), "true or false")


class _Checker:
    """Looks keys up and raises the one-line error naming the key path."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, message: str) -> None:
        raise ManifestError(f"{self.where}: {key}: {message}")

    def required(self, parent: Mapping[str, Any], name: str, prefix: str, valid, expected: str) -> Any:
        key = f"{prefix}.{name}" if prefix else name
        if name not in parent:
            raise ManifestError(f"{self.where}: the key {key} is missing; the manifest is damaged or from another tool")
        return self._valid(parent[name], key, valid, expected)

    def optional(self, parent: Mapping[str, Any], name: str, prefix: str, valid, expected: str) -> Any:
        if parent.get(name) is None:
            return None
        return self._valid(parent[name], f"{prefix}.{name}" if prefix else name, valid, expected)

    def _valid(self, value: Any, key: str, valid, expected: str) -> Any:
        if not valid(value):
            self.fail(key, f"expected {expected}, got {_show(value)}")
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _count(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= MAX_COUNT


def _short_string(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 200


def _sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(char in "0123456789abcdef" for char in value)


def _tfds_identity(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"name", "version"}
            and all(_short_string(item) for item in value.values()))


def _shape(value: Any) -> bool:
    if not isinstance(value, list) or len(value) > MAX_SHAPE_RANK:
        return False
    if not all(_is_int(size) and 0 <= size <= MAX_SHAPE_SIZE for size in value):
        return False
    return math.prod(value) <= MAX_SHAPE_SIZE


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Shard:
    """One shard as the manifest lists it: its path relative to the dataset, records, and (when recorded) size and sha256.

    Another key in a shard's entry is not kept (a build writes none): readers need these four only.
    """

    path: str
    num_examples: int
    num_bytes: int | None = None
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"path": self.path, "num_examples": self.num_examples}
        if self.num_bytes is not None:
            entry["num_bytes"] = self.num_bytes
        if self.sha256 is not None:
            entry["sha256"] = self.sha256
        return entry


@dataclass(frozen=True)
class Split:
    """One split: its examples, bytes and shards in the manifest's order; ``rest`` holds the per-split figures a build
    adds beside them (``examples_with_feature``, a sequence build's groups and steps), as written."""

    name: str
    num_examples: int
    shards: tuple[Shard, ...]
    num_bytes: int | None = None
    rest: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"num_examples": self.num_examples}
        if self.num_bytes is not None:
            entry["num_bytes"] = self.num_bytes
        return {**entry, "shards": [shard.to_dict() for shard in self.shards], **copy.deepcopy(dict(self.rest))}


# The top-level keys Manifest holds in fields of their own; every other key is kept as written in ``rest``.
_FIELD_KEYS = ("format", "record_type", "splits", "compression", "features", "context_features", "sequence_features")


@dataclass(frozen=True)
class Manifest:
    """A dataset's manifest, checked: built only by ``from_bytes`` or ``from_dict`` (through ``validate_manifest``)
    and written only by ``to_bytes``, so a build's manifest round-trips byte for byte.

    ``record_type`` is resolved (a manifest without one holds Examples); ``compression`` is as written (None or
    "none": uncompressed; ``tfrbeam.tfrecord.records`` resolves it). ``run`` is the run record (``RUN_KEYS``; a
    format 1 manifest's are at its top level). Feature entries are as written ({type, shape, always_present}).
    """

    format: str
    record_type: str
    splits: tuple[Split, ...]
    compression: str | None
    features: Mapping[str, Mapping[str, Any]] | None
    context_features: Mapping[str, Mapping[str, Any]] | None
    sequence_features: Mapping[str, Mapping[str, Any]] | None
    run: Mapping[str, Any]
    rest: Mapping[str, Any]  # config, inputs, seed, versions, rows_read, bad_records, parse specs, tfds, ...
    keys: tuple[str, ...] = field(repr=False)  # the top-level keys in the order written: the bytes round-trip

    @classmethod
    def from_bytes(cls, data: bytes, where: str, verifiable: bool = False) -> Manifest:
        """The manifest of ``data``, bounded, parsed and checked; ``ManifestError`` naming ``where`` and the key."""
        return cls.from_dict(parse_manifest_bytes(data, where), where, verifiable)

    @classmethod
    def from_dict(cls, value: Any, where: str, verifiable: bool = False) -> Manifest:
        """The manifest of a JSON value, checked by ``validate_manifest`` first (``verifiable``: as ``verify`` needs)."""
        validate_manifest(value, where, verifiable)
        legacy = value["format"] == LEGACY_MANIFEST_FORMAT
        value = {key: item if key == "splits" else copy.deepcopy(item) for key, item in value.items()}  # none shared
        return cls(
            format=value["format"],
            record_type=value.get("record_type", EXAMPLE),
            splits=tuple(_split(name, entry) for name, entry in value["splits"].items()),
            compression=value.get("compression"),
            features=value.get("features"),
            context_features=value.get("context_features"),
            sequence_features=value.get("sequence_features"),
            run=run_record(value),
            rest={key: item for key, item in value.items()
                  if key not in _FIELD_KEYS and key != "run" and not (legacy and key in RUN_KEYS)},
            keys=tuple(value),
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest as its JSON object, keys in the order written (a copy: changing it changes no Manifest)."""
        known: dict[str, Any] = {
            "format": self.format, "record_type": self.record_type,
            "splits": {split.name: split.to_dict() for split in self.splits}, "compression": self.compression,
            "features": self.features, "context_features": self.context_features,
            "sequence_features": self.sequence_features,
            **(dict(self.run) if self.format == LEGACY_MANIFEST_FORMAT else {"run": dict(self.run)}),
        }
        return {key: known[key] if key == "splits" else copy.deepcopy(known[key] if key in known else self.rest[key])
                for key in self.keys}

    def to_bytes(self) -> bytes:
        """The manifest as written: indented JSON, keys in the order the build put them, one trailing newline."""
        return (json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n").encode("utf-8")

    def renamed(self, names: Mapping[str, str]) -> Manifest:
        """The manifest with the files it lists (shards, dead-letter files, schema.pbtxt) renamed by ``names`` (a path
        not in it is kept), checked again: a replace in a bucket publishes taken names under new ones."""
        value = self.to_dict()
        for split in value["splits"].values():
            for shard in split["shards"]:
                shard["path"] = names.get(shard["path"], shard["path"])
        if "schema_pbtxt" in value:
            value["schema_pbtxt"] = names.get(value["schema_pbtxt"], value["schema_pbtxt"])
        bad = value.get("bad_records") or {}
        if bad.get("files"):
            bad["files"] = sorted(names.get(path, path) for path in bad["files"])
        return Manifest.from_dict(value, "<renamed manifest>")

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(split.name for split in self.splits)

    def split(self, name: str) -> Split:
        """The split ``name``; ``KeyError`` when the manifest has none of that name."""
        for split in self.splits:
            if split.name == name:
                return split
        raise KeyError(name)

    @property
    def run_id(self) -> str | None:
        """The id of the run that published this generation (what recovery and the commit compare), or None."""
        run_id = self.run.get("run_id")
        return run_id if isinstance(run_id, str) else None


def _split(name: str, entry: Mapping[str, Any]) -> Split:
    shards = tuple(Shard(shard["path"], shard["num_examples"], shard.get("num_bytes"), shard.get("sha256"))
                   for shard in entry["shards"])
    return Split(name, entry["num_examples"], shards, entry.get("num_bytes"),
                 {key: copy.deepcopy(item) for key, item in entry.items() if key not in ("num_examples", "num_bytes", "shards")})
