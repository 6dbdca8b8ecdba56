"""The dataset manifest ``{output.path}/dataset_info.json``: what a build wrote, and checking a dataset against it.

The keys are the contract of notes/BUILD.md (the dataset reader relies on them). Paths inside the
manifest are relative to the dataset directory, so a dataset can be copied or moved whole.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfrbeam.errors import RecordError, RecordIndexError
from tfrbeam.feature_spec import FeatureSpec
from tfrbeam.manifest_format import MANIFEST_FORMAT, MANIFEST_NAME, TF_DTYPES
from tfrbeam.record_index import INDEX_DIR_NAME, index_path_for, parse_index
from tfrbeam.records import RecordReader, compression_from_name

ERRORS_DIR_NAME = "_errors"
_READ_CHUNK = 1 << 20


def join_path(base: str, *parts: str) -> str:
    """Join a dataset-relative path onto a local or remote base (``gs://...``) with the right separator."""
    return FileSystems.join(base, *parts) if parts else base


def feature_entries(features: Sequence[FeatureSpec]) -> dict[str, dict[str, Any]]:
    """The manifest's ``features``: type, shape ([] scalar, [n] fixed length, null variable), always_present."""
    return {
        spec.name: {
            "type": spec.type,
            "shape": None if spec.shape is None else list(spec.shape),
            "always_present": spec.always_present,
        }
        for spec in sorted(features, key=lambda spec: spec.name)
    }


def parse_example_spec(features: Sequence[FeatureSpec]) -> dict[str, str]:
    """A ``tf.io.parse_example`` spec to paste: FixedLenFeature when every example has the same shape, else VarLenFeature."""
    spec_strings = {}
    for spec in sorted(features, key=lambda spec: spec.name):
        dtype = TF_DTYPES[spec.type]
        if spec.always_present and spec.shape is not None:
            spec_strings[spec.name] = f"tf.io.FixedLenFeature({list(spec.shape)}, {dtype})"
        else:
            spec_strings[spec.name] = f"tf.io.VarLenFeature({dtype})"
    return spec_strings


def manifest_path(dataset_dir: str) -> str:
    return join_path(dataset_dir, MANIFEST_NAME)


def write_manifest(dataset_dir: str, manifest: dict[str, Any]) -> str:
    """Write the manifest (through a temp name and a rename, so readers never see half of it); returns its path."""
    final_path = manifest_path(dataset_dir)
    temp_path = join_path(dataset_dir, f".{MANIFEST_NAME}.tmp")
    text = json.dumps(manifest, indent=2, sort_keys=False) + "\n"
    with FileSystems.create(temp_path, mime_type="application/json", compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(text.encode("utf-8"))
    if FileSystems.exists(final_path):
        FileSystems.delete([final_path])
    FileSystems.rename([temp_path], [final_path])
    return final_path


def read_manifest(dataset_dir: str) -> dict[str, Any] | None:
    """The manifest of ``dataset_dir``, or None when there is none."""
    path = manifest_path(dataset_dir)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return json.loads(handle.read().decode("utf-8"))


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


def verify_dataset(dataset_dir: str) -> list[str]:
    """Check a dataset against its manifest: files, sizes, sha256, every record's CRCs and all counts.

    Returns the problems found, one line each; an empty list means the dataset is intact.
    """
    try:
        manifest = read_manifest(dataset_dir)
    except (OSError, ValueError) as error:
        return [f"{manifest_path(dataset_dir)}: cannot read the manifest: {error}"]
    if manifest is None:
        return [f"{manifest_path(dataset_dir)}: no manifest (not a tfrbeam dataset, or its build did not finish)"]
    if manifest.get("format") != MANIFEST_FORMAT:
        return [f"{manifest_path(dataset_dir)}: format {manifest.get('format')!r} is not {MANIFEST_FORMAT!r}"]
    problems: list[str] = []
    for split, entry in manifest.get("splits", {}).items():
        shards = entry.get("shards", [])
        listed = {shard["path"] for shard in shards}
        for shard in shards:
            problems.extend(_verify_shard(dataset_dir, shard, manifest.get("compression")))
        total = sum(shard.get("num_examples", 0) for shard in shards)
        if total != entry.get("num_examples"):
            problems.append(f"split {split}: the shards hold {total} examples, the manifest says {entry.get('num_examples')}")
        problems.extend(_unlisted_files(dataset_dir, split, listed))
    return problems


def _verify_shard(dataset_dir: str, shard: dict[str, Any], compression: str | None) -> list[str]:
    path = join_path(dataset_dir, *shard["path"].split("/"))
    if not FileSystems.exists(path):
        return [f"{path}: listed in the manifest but missing"]
    handle = _HashingReader(FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED))
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
    if handle.size != shard["num_bytes"]:
        problems.append(f"{path}: {handle.size} bytes, the manifest says {shard['num_bytes']}")
    if handle.sha256.hexdigest() != shard["sha256"]:
        problems.append(f"{path}: sha256 {handle.sha256.hexdigest()} differs from the manifest's {shard['sha256']}")
    if not problems and records != shard["num_examples"]:
        problems.append(f"{path}: {records} records, the manifest says {shard['num_examples']}")
    if compression is None and compression_from_name(path) is None:
        problems.extend(_verify_index(path, handle.size, records))
    return problems


def _verify_index(path: str, size: int, records: int) -> list[str]:
    index_path = index_path_for(path)
    if not FileSystems.exists(index_path):
        return []
    with FileSystems.open(index_path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        data = handle.read()
    try:
        index = parse_index(data, index_path)
    except RecordIndexError as error:
        return [str(error)]
    if not index.is_current(size, None) or index.num_records != records:
        return [f"{index_path}: describes {index.num_records} records in {index.file_size} bytes, the shard has {records} in {size}"]
    return []


def _unlisted_files(dataset_dir: str, split: str, listed: Iterable[str]) -> list[str]:
    """Files in a split's directory that the manifest does not list (leftovers of another build)."""
    split_dir = join_path(dataset_dir, split)
    try:
        matches = FileSystems.match([join_path(split_dir, "*")])[0].metadata_list
    except (OSError, ValueError):
        return []
    listed_names = {posixpath.basename(path) for path in listed}
    problems = []
    for metadata in matches:
        name = posixpath.basename(metadata.path.replace("\\", "/"))
        if name and name != INDEX_DIR_NAME and name not in listed_names:
            problems.append(f"{metadata.path}: in split directory {split}/ but not listed in the manifest")
    return problems
