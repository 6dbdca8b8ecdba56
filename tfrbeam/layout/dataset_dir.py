"""A dataset directory as one object: its checked manifest, and what every tool asks of it.

``DatasetDirectory.open(path)`` reads and checks the manifest once (``Manifest.from_bytes``: bounded, parsed,
validated) and answers the splits, each shard's full path (confined to the dataset, see docs/trust.md) with its
count, size and sha256, the compression (resolved by ``tfrbeam.tfrecord.records``, the one home of it), the record
type and the generation it read. Local paths and ``gs://`` / ``s3://`` alike: ``files`` is how the directory is read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from tfrbeam.base.file_access import FileAccess, files_for
from tfrbeam.errors import ConfigError, ManifestError
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.manifest import find_manifest, load_manifest, manifest_path, shard_compression, shard_path
from tfrbeam.layout.manifest_schema import Manifest, Split
from tfrbeam.tfrecord.records import AUTO_COMPRESSION

__all__ = ["DatasetDirectory", "DatasetShard"]


@dataclass(frozen=True)
class DatasetShard:
    """One shard of a dataset: its split, number in the split, full path, and the manifest's figures for it."""

    split: str
    number: int
    path: str
    num_examples: int
    num_bytes: int | None
    sha256: str | None


@dataclass(frozen=True)
class DatasetDirectory:
    """A dataset directory and its checked manifest, as read once (``data``: the bytes, which pin its generation)."""

    path: str
    manifest_path: str
    manifest: Manifest = field(repr=False)
    data: bytes = field(repr=False)
    files: FileAccess = field(repr=False)

    @classmethod
    def open(cls, path: str, files: FileAccess | None = None, verifiable: bool = False) -> DatasetDirectory:
        """The dataset at ``path``; ``ManifestError`` when it has no manifest or a damaged one, ``OSError`` when
        the manifest cannot be read (the caller says what that means to it)."""
        found = cls.find(path, files, verifiable)
        if found is None:
            access = files or files_for(path)
            raise ManifestError(f"{manifest_path(path, access)}: no dataset manifest: not a tfrbeam dataset, or its "
                                "build did not finish")
        return found

    @classmethod
    def find(cls, path: str, files: FileAccess | None = None, verifiable: bool = False) -> DatasetDirectory | None:
        """The dataset at ``path``, or None when there is no manifest (errors as ``open``)."""
        access = files or files_for(path)
        found = find_manifest(path, access)
        return None if found is None else cls.of_manifest(found, access, verifiable, root=path)

    @classmethod
    def of_manifest(cls, manifest_file: str, files: FileAccess | None = None, verifiable: bool = False,
                    root: str | None = None) -> DatasetDirectory:
        """The dataset whose manifest is the file ``manifest_file``; ``root``: the directory as named, else its parent."""
        access = files or files_for(manifest_file)
        manifest, data = load_manifest(manifest_file, access, verifiable)
        return cls(root or posixpath.dirname(manifest_file) or ".", manifest_file, manifest, data, access)

    @property
    def splits(self) -> tuple[Split, ...]:
        return self.manifest.splits

    @property
    def split_names(self) -> tuple[str, ...]:
        return self.manifest.split_names

    def split(self, name: str) -> Split:
        """The split ``name``; ``ConfigError`` naming the splits there are when it has none of that name."""
        try:
            return self.manifest.split(name)
        except KeyError:
            raise ConfigError(f"{self.path}: has no split {name!r} (splits: {', '.join(self.split_names)})") from None

    def shards(self, splits: Sequence[str] | None = None) -> list[DatasetShard]:
        """The shards of ``splits`` (default: every split) in the manifest's order, each path confined to the dataset
        (``UnsafePathError`` naming the key otherwise: a symlink is followed while it stays inside)."""
        chosen = self.splits if splits is None else [self.split(name) for name in splits]
        return [self._shard(split, number) for split in chosen for number in range(len(split.shards))]

    def shard(self, split: str, number: int) -> DatasetShard:
        """Shard ``number`` (manifest order) of ``split``, its path confined as ``shards`` confines it."""
        return self._shard(self.split(split), number)

    def _shard(self, split: Split, number: int) -> DatasetShard:
        shard = split.shards[number]
        path = shard_path(self.path, self.manifest_path, split.name, number, shard, self.files)
        return DatasetShard(split.name, number, path, shard.num_examples, shard.num_bytes, shard.sha256)

    @property
    def record_type(self) -> str:
        """"Example" or "SequenceExample"."""
        return self.manifest.record_type

    @property
    def compression(self) -> str | None:
        """The shards' codec: None, "gzip" or "zlib", as the manifest says (never a guess from a shard's name)."""
        return self.compression_for(AUTO_COMPRESSION)

    def compression_for(self, requested: str | None) -> str | None:
        """The codec to read the shards with: ``requested`` when given, for "auto" the manifest's."""
        return shard_compression(self.manifest, requested)

    @property
    def run_id(self) -> str | None:
        """The id of the run that published this generation."""
        return self.manifest.run_id

    @cached_property
    def generation(self) -> Generation:
        """The generation read: a reader checks against it that the dataset has not been replaced since."""
        return Generation.of(posixpath.dirname(self.manifest_path) or ".", self.data, posixpath.basename(self.manifest_path))
