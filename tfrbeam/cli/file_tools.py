"""The work behind ``tfrbeam verify``, ``cat`` and ``inspect``: check, print and profile TFRecord files.

No Beam here; the CLI module only parses arguments and prints what these functions return.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import posixpath
from collections.abc import Callable, Iterator
from typing import Any

from tfrbeam.base.file_access import FileAccess, files_for
from tfrbeam.base.object_store import OBJECT_STORE_FILES, has_magic, input_size, is_object_store, object_glob
from tfrbeam.codec.example import decode_example, decode_sequence_example
from tfrbeam.codec.infer import FeatureSample, InferredFeature
from tfrbeam.codec.json_values import value_to_json
from tfrbeam.codec.sequence_decode import has_feature_lists
from tfrbeam.errors import ExampleDecodeError, RecordError, TfrbeamError
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.manifest import TF_DTYPES, find_manifest, manifest_path, read_manifest
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.layout.names import MANIFEST_NAMES, SCHEMA_PBTXT, TFDS_FEATURES
from tfrbeam.stats.files import STATS_HTML, STATS_JSON
from tfrbeam.stats.report import in_source_order
from tfrbeam.tfrecord.records import RecordReader

_NOT_RECORD_FILES = (*MANIFEST_NAMES, TFDS_FEATURES, SCHEMA_PBTXT, STATS_JSON, STATS_HTML)  # beside a dataset's shards


class NoInputError(TfrbeamError, FileNotFoundError):
    """A path or pattern given on the command line matches no file."""


def expand_record_paths(arguments: list[str]) -> list[str]:
    """Files named by paths, globs and directories (recursively; hidden and ``_``-prefixed entries skipped).

    A dataset directory, or one of its split directories, gives the shards its manifest lists, confined to
    the dataset as ``verify`` checks them (``DatasetDirectory.shards``): a damaged manifest is refused, and a
    split directory that is a symlink is read (inside the dataset) or refused (leading out), never skipped.
    """
    files: list[str] = []
    for argument in arguments:
        listed = _dataset_shards(argument)
        if listed is not None:
            found = listed
        elif is_object_store(argument):
            found = _objects_named(argument)
        elif os.path.isdir(argument):
            found = _files_below(argument)
        elif os.path.isfile(argument):
            found = [argument]
        else:
            found = sorted(path for path in glob.glob(argument, recursive=True) if os.path.isfile(path))
        if not found:
            raise NoInputError(f"{argument}: no such file, directory or matching files")
        files.extend(found)
    return list(dict.fromkeys(files))


def _dataset_shards(argument: str) -> list[str] | None:
    """The shards a dataset directory's manifest lists, or a split directory's; None for anything else."""
    if (has_magic(argument) if is_object_store(argument) else not os.path.isdir(argument)):
        return None
    access = files_for(argument)
    directory = argument.rstrip("/") or argument
    if _has_manifest(directory, access):
        return [shard.path for shard in _read_listing(directory, access).shards()]
    parent, split = (posixpath if is_object_store(directory) else os.path).split(directory)
    if parent and split and _has_manifest(parent, access):
        dataset = _read_listing(parent, access)
        if split in dataset.split_names:
            return [shard.path for shard in dataset.shards([split])]
    return None


def _has_manifest(directory: str, access: FileAccess) -> bool:
    """Anything at the manifest's name (a FIFO or a link too: reading it refuses it, naming what it is)."""
    return find_manifest(directory, access) is not None


def _read_listing(directory: str, access: FileAccess) -> DatasetDirectory:
    dataset = DatasetDirectory.find(directory, access)
    if dataset is None:  # removed since it was seen
        raise NoInputError(f"{manifest_path(directory, access)}: the dataset's manifest is gone")
    return dataset


def _objects_named(argument: str) -> list[str]:
    """A ``gs://`` or ``s3://`` argument's objects: a glob's, the object itself, or those below a prefix (as locally)."""
    if has_magic(argument):
        return object_glob(argument)
    if OBJECT_STORE_FILES.is_file(argument):
        return [argument]
    prefix = argument.rstrip("/") + "/"
    below = [(path[len(prefix):].split("/"), path) for path in OBJECT_STORE_FILES.list_files(argument)]
    kept = [(parts, path) for parts, path in below
            if not any(part.startswith((".", "_")) for part in parts) and parts[-1] not in _NOT_RECORD_FILES]
    # os.walk's order: a directory's files, then its subdirectories, each sorted by name
    return [path for parts, path in sorted(kept, key=lambda item: [(1, part) for part in item[0][:-1]] + [(0, item[0][-1])])]


def _files_below(directory: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(names):
            if not name.startswith((".", "_")) and name not in _NOT_RECORD_FILES:
                found.append(os.path.join(root, name))
    return found


@dataclasses.dataclass(frozen=True)
class FileReport:
    """The outcome of verifying one file."""

    path: str
    records: int
    payload_bytes: int
    file_bytes: int
    problem: str | None = None


def verify_file(
    path: str, examples: bool = False, progress: Callable[[int, int], None] | None = None
) -> FileReport:
    """Read every record of ``path`` checking CRCs (and, with ``examples``, that each parses as an Example)."""
    size = input_size(path)
    reader = RecordReader(path)
    try:
        with reader:
            for count, (offset, payload) in enumerate(reader.records_with_offsets(), 1):
                if examples:
                    _check_example(path, offset, payload)
                if progress is not None and count % 4096 == 0:
                    progress(reader.offset, size)
    except (RecordError, ExampleDecodeError) as error:
        return FileReport(path, reader.stats.records, reader.stats.payload_bytes, size, str(error))
    return FileReport(path, reader.stats.records, reader.stats.payload_bytes, size)


def _check_example(path: str, offset: int, payload: bytes) -> None:
    """The record parses as a tf.train.Example, or as a SequenceExample when it has feature lists."""
    sequence = is_sequence_example(payload)
    try:
        decode_sequence_example(payload) if sequence else decode_example(payload)
    except ExampleDecodeError as error:
        kind = "SequenceExample" if sequence else "Example"
        raise ExampleDecodeError(f"{path}: the record at offset {offset} is not a tf.train.{kind}: {error}") from error


def is_sequence_example(payload: bytes) -> bool:
    """Whether a record holds feature lists: a SequenceExample (an Example parser would silently keep only its context)."""
    return bool(has_feature_lists([payload])[0])


def _not_an_example(path: str, offset: int, command: str) -> ExampleDecodeError:
    return ExampleDecodeError(
        f"{path}: the record at offset {offset} is a tf.train.SequenceExample (it has feature lists); "
        f"read as an Example it would show only its context: use {command}"
    )


def iter_decoded(paths: list[str], sequence: bool = False) -> Iterator[tuple[str, int, Any]]:
    """Yield ``(path, offset, decoded)`` for every record, decoded with kinds (``(context, feature_lists)`` if sequence)."""
    for path in paths:
        with RecordReader(path) as reader:
            for offset, payload in reader.records_with_offsets():
                if not sequence and is_sequence_example(payload):
                    raise _not_an_example(path, offset, "cat --sequence")
                try:
                    decoded = decode_sequence_example(payload, kinds=True) if sequence else decode_example(payload, kinds=True)
                except ExampleDecodeError as error:
                    kind = "SequenceExample" if sequence else "Example"
                    raise ExampleDecodeError(f"{path}: the record at offset {offset} is not a tf.train.{kind} "
                                             f"({error}); use cat --raw to print records of any kind") from error
                yield path, offset, decoded


def iter_raw_json(paths: list[str], limit: int | None = None) -> Iterator[dict]:
    """Every record as ``{"offset", "size", "data"}`` (data as in value_to_json), for ``cat --raw``."""
    count = 0
    for path in paths:
        with RecordReader(path) as reader:
            for offset, payload in reader.records_with_offsets():
                if limit is not None and count >= limit:
                    return
                count += 1
                yield {"offset": offset, "size": len(payload), "data": value_to_json("bytes", bytes(payload))}


def source_order(paths: list[str]) -> list[str]:
    """The features in the order of the source the build read, from the manifest of the dataset ``paths`` lie in.

    An Example's features are a map, so a record keeps no order: files outside a dataset give [] (names sorted).
    """
    from tfrbeam.stats.compute import dataset_holding

    for path in paths:
        directory = dataset_holding(path)
        if directory is not None:
            return _manifest_order(directory)
    return []


def source_shapes(paths: list[str]) -> dict[str, list[int]]:
    """The fixed shapes the manifest of the dataset ``paths`` lie in gives its features (a tensor's ``[2, 3]``)."""
    from tfrbeam.stats.compute import dataset_holding

    for path in paths:
        directory = dataset_holding(path)
        if directory is not None:
            manifest = _manifest_of(directory)
            features = (manifest.features if manifest is not None else None) or {}
            return {name: entry["shape"] for name, entry in features.items() if isinstance(entry.get("shape"), list)}
    return {}


def _manifest_order(directory: str) -> list[str]:
    manifest = _manifest_of(directory)
    if manifest is None:
        return []
    return [name for entries in (manifest.features, manifest.context_features, manifest.sequence_features)
            for name in entries or {}]


def _manifest_of(directory: str) -> Manifest | None:
    try:
        return read_manifest(directory, files_for(directory))
    except (OSError, TfrbeamError):  # verify reports a damaged manifest; here it only orders and shapes what is printed
        return None


def features_to_json(features: dict[str, tuple[str | None, list]], with_kinds: bool = False,
                     order: list[str] | None = None) -> dict:
    """Render ``decode_example(..., kinds=True)`` output as a JSON-ready dict, features in ``order`` (see in_source_order)."""
    rendered = {}
    for name in in_source_order(features, order or []):
        kind, values = features[name]
        json_values = [value_to_json(kind, value) for value in values]
        rendered[name] = {"kind": kind, "values": json_values} if with_kinds else json_values
    return rendered


@dataclasses.dataclass(frozen=True)
class FeatureStats:
    """What ``inspect`` learns about one feature across records: the one inference's (``codec.infer``), in inspect's
    words."""

    inferred: InferredFeature

    @property
    def present(self) -> int:
        return self.inferred.present

    @property
    def min_count(self) -> int:
        return self.inferred.min_values

    @property
    def max_count(self) -> int:
        return self.inferred.max_values

    def kind(self) -> str | None:
        known = self.inferred.kinds
        return known[0] if len(known) == 1 else (None if not known else "mixed:" + ",".join(sorted(known)))

    def parse_spec(self, shape: list[int] | None = None) -> str | None:
        """A ``tf.io.parse_example`` feature for this feature, ready to paste; None when no one kind was seen.

        ``shape``: the dataset's own for the feature (a tensor's ``[2, 3]``), used when every record holds that many.
        """
        kind, fixed = self.inferred.kind, self.inferred.shape
        if kind not in TF_DTYPES:
            return None
        dtype = TF_DTYPES[kind]
        if fixed is None:
            return f"tf.io.VarLenFeature({dtype})"
        if shape is not None and len(shape) > 1 and math.prod(shape) == self.min_count:
            return f"tf.io.FixedLenFeature({list(shape)}, {dtype})"
        return f"tf.io.FixedLenFeature({list(fixed)}, {dtype})"


@dataclasses.dataclass
class InspectReport:
    """Record count, sizes and per-feature statistics of a set of files."""

    files: list[str]
    records: int = 0
    payload_bytes: int = 0
    file_bytes: int = 0
    sample: FeatureSample = dataclasses.field(default_factory=FeatureSample)  # every record looked at
    order: list[str] = dataclasses.field(default_factory=list)  # the source's feature order (source_order)
    shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # the dataset's shapes (source_shapes)

    @property
    def features(self) -> dict[str, FeatureStats]:
        return {name: FeatureStats(inferred) for name, inferred in self.sample.features().items()}

    def ordered_features(self) -> list[tuple[str, FeatureStats]]:
        """The features in the source's order (by name for files outside a dataset)."""
        features = self.features
        return [(name, features[name]) for name in in_source_order(features, self.order)]

    def parse_example_spec(self) -> dict[str, str]:
        """The features ``tf.io.parse_example`` can be given; a feature of no kind or mixed kinds is left out."""
        specs = {name: stats.parse_spec(self.shapes.get(name)) for name, stats in self.ordered_features()}
        return {name: spec for name, spec in specs.items() if spec is not None}

    def unparseable(self) -> dict[str, str]:
        """Features left out of the parse spec, each with why: no kind in any record, or several kinds."""
        return {name: _why_no_spec(stats.kind()) for name, stats in self.ordered_features() if stats.parse_spec() is None}


def _why_no_spec(kind: str | None) -> str:
    return "no kind in any record" if kind is None else f"kinds {kind.removeprefix('mixed:')} in different records"


def inspect_files(paths: list[str], limit: int | None = None) -> InspectReport:
    """Profile the Examples in ``paths`` (all records, or the first ``limit``)."""
    report = InspectReport(files=paths, file_bytes=sum(input_size(path) for path in paths), order=source_order(paths),
                           shapes=source_shapes(paths))
    for path in paths:
        with RecordReader(path) as reader:
            for offset, payload in reader.records_with_offsets():
                if limit is not None and report.records >= limit:
                    return report
                if is_sequence_example(payload):
                    raise _not_an_example(path, offset, "cat --sequence to look at such records")
                try:
                    features = decode_example(payload, kinds=True)
                except ExampleDecodeError as error:
                    raise ExampleDecodeError(f"{path}: the record at offset {offset} does not decode: {error}") from error
                report.records += 1
                report.payload_bytes += len(payload)
                report.sample.add_decoded(features)
    return report


def inspect_statistics(report: InspectReport, limit: int | None = None) -> dict:
    """The statistics (``tfrbeam.stats``) of the records ``inspect_files`` looked at, one split named "files".

    Features seen with one kind are counted; a feature with mixed kinds is left out (its report line says so).
    """
    from tfrbeam.stats.accumulators import SplitAccumulator
    from tfrbeam.stats.compute import FILES_SPLIT, accumulate_file
    from tfrbeam.stats.report import dataset_stats

    kinds = {name: stats.kind() for name, stats in report.features.items()}
    types = {name: kind for name, kind in kinds.items() if kind is not None and kind in TF_DTYPES}
    total = SplitAccumulator(types)
    remaining = limit
    for path in report.files:
        if remaining is not None and remaining <= 0:
            break
        part = accumulate_file(path, types, "auto", limit=remaining)
        total.merge(part)
        if remaining is not None:
            remaining -= part.num_examples
    return dataset_stats({FILES_SPLIT: total})
