"""The dataset manifest ``{dataset}/tfrbeam_dataset.json``: finding it, its schema, reading it, checking a dataset against it.

Datasets built before TFDS output took ``dataset_info.json`` have their manifest under that name; every reader
finds it through ``find_manifest`` (the new name first), so they open as before.

One home for the manifest: it is a ``Manifest`` (``tfrbeam.layout.manifest_schema``), which the build writes
with ``Manifest.to_bytes`` and every reader gets from ``read_manifest`` / ``load_manifest`` (or a
``tfrbeam.layout.dataset_dir.DatasetDirectory``), refused when it lacks a key its readers need
(``ManifestError`` naming the key). Paths
inside the manifest are relative to the dataset directory, so a dataset can be copied or moved whole.

The manifest is the commit point of a build (see ``tfrbeam.beam.publish``): a directory whose
manifest is missing, or disagrees with the files beside it, is not a valid dataset.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from tfrbeam.base.bounded_read import check_found
from tfrbeam.base.file_access import LOCAL_FILES, FileAccess, LocalFiles, is_remote, read_found
from tfrbeam.codec.kinds import TF_DTYPES  # feature type -> TensorFlow dtype (also imported from here)
from tfrbeam.errors import ManifestError, RecordError, RecordIndexError, RefusedFileError
from tfrbeam.layout.manifest_schema import (  # noqa: F401 (the record types are re-exported from here)
    EXAMPLE,
    MAX_MANIFEST_BYTES,
    RECORD_TYPES,
    SEQUENCE_EXAMPLE,
    Manifest,
    Shard,
)
from tfrbeam.layout.names import (
    LOCK_SUFFIX,
    MANIFEST_NAME,
    MANIFEST_NAMES,
    STAGING_INFIX,
    dali_index_path,
    is_staging_name,
    staging_prefix,
)
from tfrbeam.layout.paths import confined_path
from tfrbeam.layout.tfds_info import tfds_files_for, tfds_files_of
from tfrbeam.layout.tfmd_schema import schema_files_of
from tfrbeam.tfrecord.read_index import INDEX_DIR_NAME, index_is_current, index_paths_for, max_index_bytes, parse_read_index
from tfrbeam.tfrecord.records import AUTO_COMPRESSION, RecordReader, compression_from_name, dataset_compression

_READ_CHUNK = 1 << 20


class FeatureDescription(Protocol):
    """What the manifest records of a feature (``tfrbeam.builder.features.convert.FeatureSpec`` is one, once resolved)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> str | None: ...  # None only before a build resolves it; never in a manifest

    @property
    def shape(self) -> tuple[int, ...] | None: ...

    @property
    def always_present(self) -> bool: ...


def feature_entries(features: Sequence[FeatureDescription]) -> dict[str, dict[str, Any]]:
    """The manifest's ``features``: type, shape ([] scalar, [n] fixed length, null variable), always_present.

    In the order given, which for a build is the source's column order (``column_2`` before ``column_10``).
    """
    return {
        spec.name: {
            "type": spec.type,
            "shape": None if spec.shape is None else list(spec.shape),
            "always_present": spec.always_present,
        }
        for spec in features
    }


def parse_example_spec(features: Sequence[FeatureDescription]) -> dict[str, str]:
    """A ``tf.io.parse_example`` spec to paste: FixedLenFeature when every example has the same shape, else VarLenFeature."""
    return parse_example_spec_of(feature_entries(features))


def parse_example_spec_of(entries: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The same spec from the manifest's ``features`` entries (type, shape, always_present)."""
    return _spec_strings(entries, "FixedLenFeature")


def parse_sequence_example_spec_of(context: dict[str, dict[str, Any]],
                                   sequence: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """A ``tf.io.parse_sequence_example`` spec from the manifest's context and sequence feature entries.

    Context features are as in ``parse_example_spec_of``. A sequence feature is a
    FixedLenSequenceFeature when every step of every record has a value of one shape, else a
    VarLenFeature (a step without a value is an empty list, which a fixed length cannot hold).
    """
    return {"context_features": _spec_strings(context, "FixedLenFeature"),
            "sequence_features": _spec_strings(sequence, "FixedLenSequenceFeature")}


def _spec_strings(entries: dict[str, dict[str, Any]], fixed: str) -> dict[str, str]:
    """``tf.io.{fixed}(shape, dtype)`` for entries every record (or step) has with one shape, else VarLenFeature."""
    spec_strings = {}
    for name in entries:  # the features' order: the source's
        entry = entries[name]
        dtype = TF_DTYPES[entry["type"]]
        if entry["always_present"] and entry["shape"] is not None:
            spec_strings[name] = f"tf.io.{fixed}({list(entry['shape'])}, {dtype})"
        else:
            spec_strings[name] = f"tf.io.VarLenFeature({dtype})"
    return spec_strings


def find_manifest(dataset_dir: str, files: FileAccess = LOCAL_FILES,
                  names: Sequence[str] = MANIFEST_NAMES) -> str | None:
    """The path of ``dataset_dir``'s manifest (its own name, else the name datasets had before), or None.

    A dangling link or anything else at the name counts as there, so the reader refuses it rather than miss it.
    ``names``: the names to try, in order (a caller that lists the directory anyway asks for the new one alone).
    """
    for name in names:
        path = files.join(dataset_dir, name)
        if files.exists(path) or (not is_remote(path) and os.path.lexists(path)):
            return path
    return None


def manifest_path(dataset_dir: str, files: FileAccess = LOCAL_FILES) -> str:
    """Where ``dataset_dir``'s manifest is, or where a build would write it when there is none (for messages)."""
    return find_manifest(dataset_dir, files) or files.join(dataset_dir, MANIFEST_NAME)


def read_manifest(dataset_dir: str, files: FileAccess = LOCAL_FILES, verifiable: bool = False,
                  names: Sequence[str] = MANIFEST_NAMES) -> Manifest | None:
    """The checked manifest of ``dataset_dir``, or None when there is none; ``ManifestError`` when it is damaged."""
    path = find_manifest(dataset_dir, files, names)
    return None if path is None else load_manifest(path, files, verifiable)[0]


def load_manifest(path: str, files: FileAccess = LOCAL_FILES, verifiable: bool = False) -> tuple[Manifest, bytes]:
    """The checked manifest at ``path`` and the bytes it was parsed from (a reader pins its generation by them).

    ``OSError`` when it cannot be read (the caller says what that means to it); ``ManifestError`` when it is damaged
    or is no manifest at all: a FIFO, device or directory, a symlink, or more than ``MAX_MANIFEST_BYTES``
    (``read_found``: refused at once, at most the cap + 1 bytes read).
    """
    try:
        data = read_found(path, MAX_MANIFEST_BYTES, "manifest", files=files)
    except RefusedFileError as error:
        raise ManifestError(str(error)) from error
    return Manifest.from_bytes(data, path, verifiable), data


def check_manifest_file(dataset_dir: str) -> None:
    """``ManifestError`` naming what is at a local dataset's manifest name when no manifest can be there: a FIFO,
    device, directory or link, or more than ``MAX_MANIFEST_BYTES`` (nothing is opened or read).

    ``build --overwrite`` asks before it touches anything: a replace would otherwise read it after publishing.
    """
    path = None if is_remote(dataset_dir) else find_manifest(dataset_dir)
    if path is None:
        return
    try:
        check_found(path, MAX_MANIFEST_BYTES, "manifest")
    except RefusedFileError as error:
        raise ManifestError(str(error)) from error


class _HashingReader:
    """A read-only file wrapper that sha256-hashes and counts every byte read through it."""

    def __init__(self, handle):
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.sha256.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_READ_CHUNK):
            pass

    def close(self) -> None:
        self._handle.close()


def verify_dataset(dataset_dir: str, files: FileAccess = LOCAL_FILES) -> list[str]:
    """Check a dataset against its manifest: files, sizes, sha256, every record's CRCs, all counts, read indexes.

    Returns the problems found, one line each; an empty list means the dataset is intact. No
    manifest, a damaged one, or a commit still in progress is a problem too.
    """
    found = find_manifest(dataset_dir, files)
    if found is None:
        return [
            f"{manifest_path(dataset_dir, files)}: no manifest: not a tfrbeam dataset, or its build did not finish "
            "(rerun the build to recover)"
        ]
    try:
        manifest = load_manifest(found, files, verifiable=True)[0]
    except ManifestError as error:
        return [str(error)]
    except OSError as error:
        return [f"{found}: cannot read the manifest: {error}"]
    problems: list[str] = []
    compression = shard_compression(manifest)
    for split in manifest.splits:
        for number, shard in enumerate(split.shards):
            try:
                path = shard_path(dataset_dir, found, split.name, number, shard, files)
            except ManifestError as error:
                problems.append(str(error))
                continue
            problems.extend(_verify_shard(path, shard, compression, files))
        total = sum(shard.num_examples for shard in split.shards)
        if total != split.num_examples:
            problems.append(f"split {split.name}: the shards hold {total} examples, the manifest says {split.num_examples}")
        problems.extend(_unlisted_files(dataset_dir, split.name, {shard.path for shard in split.shards}, files))
    problems.extend(_verify_tfds_files(dataset_dir, manifest, files))
    return problems


def _verify_tfds_files(dataset_dir: str, manifest: Manifest, files: FileAccess) -> list[str]:
    """``output.tfds``: TFDS's files beside the manifest must be the ones its ``tfds`` entry makes."""
    if not tfds_files_of(manifest):
        return []
    problems = []
    for name, expected in tfds_files_for(manifest).items():
        path = files.join(dataset_dir, name)
        try:
            found = read_found(path, MAX_MANIFEST_BYTES, "TFDS file", files=files)
        except (OSError, RefusedFileError) as error:
            problems.append(f"{path}: TFDS's file cannot be read ({error}); rerun the same build to write it")
            continue
        if found != expected:
            problems.append(f"{path}: TFDS's file does not describe this dataset (a build stopped right after its "
                            "switch?); rerun the same build to write it")
    return problems


def dataset_files(manifest: Manifest) -> set[str]:
    """Relative paths of the files a manifest makes part of its dataset: shards, their read indexes, DALI indexes,
    dead-letter files, its ``schema.pbtxt`` and TFDS's files (what a replace may delete, and nothing of the user's)."""
    own: set[str] = set()
    for split in manifest.splits:
        for shard in split.shards:
            own.update({shard.path, *index_paths_for(shard.path),
                        dali_index_path(split.name, shard.path)})
    bad_records = manifest.rest.get("bad_records")
    listed = bad_records.get("files") if isinstance(bad_records, dict) else None
    own.update(path for path in listed or () if isinstance(path, str))
    return own | schema_files_of(manifest) | tfds_files_of(manifest)


def shard_path(dataset_dir: str, manifest_file: str, split: str, number: int, shard: Shard,
               files: FileAccess = LOCAL_FILES) -> str:
    """Shard ``number`` of ``split`` as a path inside ``dataset_dir`` (``confined_path``: otherwise ``UnsafePathError``
    naming the manifest and the key, ``splits.train.shards[3].path``)."""
    return confined_path(dataset_dir, shard.path, f"{manifest_file}: splits.{split}.shards[{number}].path", files.join)


def shard_compression(manifest: Manifest, requested: str | None = AUTO_COMPRESSION) -> str | None:
    """The codec to read a dataset's shards with: ``requested`` when given, for "auto" the manifest's (resolved by
    ``tfrbeam.tfrecord.records``, never guessed from a shard's name)."""
    return dataset_compression({"compression": manifest.compression}, requested)


def _verify_shard(path: str, shard: Shard, compression: str | None, files: FileAccess) -> list[str]:
    if not files.exists(path):
        return [f"{path}: listed in the manifest but missing"]
    try:
        handle = _HashingReader(files.open_read(path))
    except RefusedFileError as error:  # a FIFO, a device, a directory: one line, never a hang
        return [str(error)]
    problems = []
    records = 0
    try:
        with RecordReader(handle, compression, name=path) as reader:
            for _ in reader:
                records += 1
    except RecordError as error:
        problems.append(str(error))
    handle.drain()
    handle.close()
    if handle.size != shard.num_bytes:
        problems.append(f"{path}: {handle.size} bytes, the manifest says {shard.num_bytes}")
    if handle.sha256.hexdigest() != shard.sha256:
        problems.append(f"{path}: sha256 {handle.sha256.hexdigest()} differs from the manifest's {shard.sha256}")
    if not problems and records != shard.num_examples:
        problems.append(f"{path}: {records} records, the manifest says {shard.num_examples}")
    if compression is None and compression_from_name(path) is None:
        problems.extend(_verify_index(path, handle.size, records, files))
    return problems


def _verify_index(path: str, size: int, records: int, files: FileAccess) -> list[str]:
    """A shard's read index (its ``.index``; in a dataset written before, its ``.idx`` and ``.offsets``) must describe it
    exactly: readers ignore a stale one, verify names it. Locally every entry and record start is checked."""
    problems = []
    for index_path in index_paths_for(path):
        if not files.exists(index_path):
            continue
        if isinstance(files, LocalFiles):
            current, reason = index_is_current(path, index_path)
            if not current:
                problems.append(f"{index_path}: a stale read index ({reason}); readers ignore it: delete it (random "
                                "access then writes a fresh one)")
            continue
        try:
            index = parse_read_index(read_found(index_path, max_index_bytes(size), "read index", files=files), index_path)
        except (RecordIndexError, RefusedFileError) as error:
            problems.append(str(error))
            continue
        if index.file_size != size or index.num_records != records:
            problems.append(f"{index_path}: describes {index.num_records} records in {index.file_size} bytes, "
                            f"the shard has {records} in {size}")
    return problems


def _unlisted_files(dataset_dir: str, split: str, listed: Iterable[str], files: FileAccess) -> list[str]:
    """Files in a split's directory that the manifest does not list (leftovers of another build)."""
    split_dir = files.join(dataset_dir, split)
    listed_names = {posixpath.basename(path) for path in listed}
    return [
        f"{files.join(split_dir, name)}: in split directory {split}/ but not listed in the manifest"
        for name in files.list_names(split_dir)
        if name != INDEX_DIR_NAME and name not in listed_names
    ]


def write_leftovers(dataset_dir: str, files: FileAccess = LOCAL_FILES) -> list[str]:
    """What writes into ``dataset_dir`` left beside it: staging directories and a lock file, one line each.

    They never make the dataset invalid (a reader never sees them); the next build into the same
    output removes those of dead runs. A lock file may also belong to a build running right now.
    """
    directory, prefix = staging_prefix(dataset_dir)
    notes = []
    for name in files.list_names(directory):
        path = files.join(directory, name)
        if is_staging_name(dataset_dir, name):
            notes.append(f"{path}: a staging directory of an interrupted or running build (the next build removes it)")
        elif name == prefix[: -len(STAGING_INFIX)] + LOCK_SUFFIX:
            notes.append(f"{path}: a lock file (a build is running, or one was killed; the next build takes it over)")
    return notes
