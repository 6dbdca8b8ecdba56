"""Every name in and beside a dataset directory, in one place.

- Shard names: ``ShardNaming`` makes Beam's ``prefix + template(shard, count) + suffix`` names
  (the sink); ``shard_file_name`` makes a build's ``{split}-00003-of-00008.tfrecord``.
- Inside a dataset: the manifest (``tfrbeam_dataset.json``; ``dataset_info.json`` before TFDS output took
  that name), the dead-letter, index, DALI, stats, schema.pbtxt and TFDS names.
- Beside an output ``…/name`` (a dataset directory, or a sink's file prefix): the lock file
  ``.name.tfrbeam-lock``, staging directories ``.name.tfrbeam-<run>/`` and partial files
  ``.name.tfrbeam-partial-<id>``. All hidden, so shard globs and TensorFlow never match them.
- Inside a staging directory: the run's ``owner.json`` (``abandoned.json`` once it is over), the commit's
  journal and record, the new and the old dataset, and held rows.

Some names are defined lower down and used or re-exported here: partial files belong to the atomic write
(``tfrbeam.base.fileops``), the read-index directory and names to the index (``tfrbeam.tfrecord.read_index``), a
compressed shard's suffix (``.gz``, ``.zlib``) to the compression resolver (``tfrbeam.tfrecord.records``).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re

from tfrbeam.base.fileops import PARTIAL_INFIX, beside, partial_path, split_target
from tfrbeam.tfrecord.read_index import INDEX_DIR_NAME, INDEX_SUFFIXES
from tfrbeam.tfrecord.records import COMPRESSION_SUFFIX, compression_suffix

__all__ = [
    "ABANDONED_NAME", "COMMIT_RECORD", "HELD_ROWS_DIR", "JOURNAL_NAME", "NEW_DATASET_DIR", "OLD_DATASET_DIR",
    "OWNER_NAME", "TABLE_FILE_NAME", "DALI_DIR_NAME", "DALI_INDEX_SUFFIX", "ERRORS_DIR_NAME", "EXPORT_NAME",
    "INDEX_DIR_NAME", "LEGACY_MANIFEST_FORMAT", "LEGACY_MANIFEST_NAME", "LOCK_SUFFIX", "MANIFEST_FORMAT",
    "MANIFEST_NAME", "MANIFEST_NAMES", "SCHEMA_PBTXT", "TFDS_DATASET_INFO", "TFDS_FEATURES", "PARTIAL_INFIX",
    "PROBE_PREFIX", "RECORD_SUFFIXES", "SHARD_NAME", "STAGING_INFIX", "STATS_HTML", "STATS_JSON", "ShardNaming",
    "dali_index_path", "is_built_shard_path", "is_staging_name", "lock_path", "partial_path", "shard_file_name",
    "staging_path", "staging_prefix",
]

LOCK_SUFFIX = ".tfrbeam-lock"
STAGING_INFIX = ".tfrbeam-"
MANIFEST_NAME = "tfrbeam_dataset.json"  # written last, in the dataset directory: the commit point
LEGACY_MANIFEST_NAME = "dataset_info.json"  # the manifest's name in datasets built before TFDS output took it
MANIFEST_NAMES = (MANIFEST_NAME, LEGACY_MANIFEST_NAME)  # a reader's order: a dataset has the first, or only the second
TFDS_DATASET_INFO = "dataset_info.json"  # TFDS's, beside our manifest when output.tfds is set
TFDS_FEATURES = "features.json"
SCHEMA_PBTXT = "schema.pbtxt"  # beside the manifest, when output.schema_pbtxt is true
MANIFEST_FORMAT = "tfrbeam-dataset/2"  # what a build writes: how the run went in one "run" record
LEGACY_MANIFEST_FORMAT = "tfrbeam-dataset/1"  # still read: the run's keys (run_id, runner, ...) at the top level
ERRORS_DIR_NAME = "_errors"  # dead-letter files of bad rows
DALI_DIR_NAME = "dali"  # NVIDIA DALI tfrecord2idx files of the shards (output.dali_index)
DALI_INDEX_SUFFIX = ".idx"  # a DALI index is named after its TFRecord file: {file name}.idx
PROBE_PREFIX = ".tfrbeam-probe-"  # the file that proves a directory writable, removed at once
STATS_JSON = "stats.json"
STATS_HTML = "stats.html"
_COMPRESSED_SUFFIXES = tuple(suffix for suffix in COMPRESSION_SUFFIX.values() if suffix)  # .gz, .zlib
SHARD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*-\d{5,}-of-\d{5,}\.tfrecord"  # a build's shard file
                        f"({'|'.join(map(re.escape, _COMPRESSED_SUFFIXES))})?")
EXPORT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*-\d{5,}-of-\d{5,}\.parquet")  # what export writes of a shard
RECORD_SUFFIXES = (*_COMPRESSED_SUFFIXES, ".tfrecord", ".tfrecords", ".tfr")  # stripped from a shard's name on export
# Inside a run's staging directory (``staging_path``):
OWNER_NAME = "owner.json"  # the run's identity and the output it writes: recovery trusts the directory by it
ABANDONED_NAME = "abandoned.json"  # owner.json renamed: the run is over, its staging directory is garbage
JOURNAL_NAME = "commit.json"  # the commit's journal, once a publish has begun
COMMIT_RECORD = "commit-ready.json"  # a staged dataset's record, for the launcher to publish after the pipeline
NEW_DATASET_DIR = "dataset"  # the new dataset, assembled before the swap
OLD_DATASET_DIR = "old"  # the replaced dataset, until it is deleted
HELD_ROWS_DIR = "held-rows"  # the batches a run holds past its memory budget
TABLE_FILE_NAME = "write-dataset-rows.arrow"  # the table write_dataset was given, for the pipeline's workers

def dali_index_path(split: str, shard_path: str) -> str:
    """Where a shard's DALI index lies inside its dataset: ``dali/{split}/{shard file name}.idx``."""
    return posixpath.join(DALI_DIR_NAME, split, posixpath.basename(shard_path) + DALI_INDEX_SUFFIX)


def shard_file_name(split: str, shard: int, num_shards: int, compression: str | None) -> str:
    """``{split}-{shard:05d}-of-{num_shards:05d}.tfrecord`` plus ``.gz`` / ``.zlib`` when compressed.

    Both numbers take the width of the larger (at least 5), so names sort in shard order.
    """
    width = max(5, len(str(num_shards)))
    return f"{split}-{shard:0{width}d}-of-{num_shards:0{width}d}.tfrecord{compression_suffix(compression)}"


def is_built_shard_path(relative: str) -> bool:
    """Whether ``relative`` (a path inside a dataset) names a shard a build writes, ``{split}/{split}-NNNNN-of-NNNNN
    .tfrecord[.gz|.zlib]``, or its read index, ``{split}/.tfrbeam-index/{shard}.index`` (or the ``.idx`` and ``.offsets``
    of a build from before the ``.index``).

    What a run's record may name for recovery to delete: anything else in an output may be the user's.
    """
    parts = relative.split("/")
    if len(parts) == 3 and parts[1] == INDEX_DIR_NAME and parts[2].endswith(INDEX_SUFFIXES):
        shard = parts[2].rsplit(".", 1)[0]
        return not shard.endswith(_COMPRESSED_SUFFIXES) and is_built_shard_path(f"{parts[0]}/{shard}")
    return (len(parts) == 2 and SHARD_NAME.fullmatch(parts[1]) is not None
            and parts[1].startswith(parts[0] + "-") and parts[1][len(parts[0]) + 1:len(parts[0]) + 2].isdigit())


def lock_path(target: str) -> str:
    """The lock file of ``target``, beside it."""
    return beside(target, LOCK_SUFFIX)


def staging_path(target: str, run_id: str) -> str:
    """A run's staging directory for ``target``, beside it (on the same filesystem, so renames are cheap)."""
    return beside(target, f"{STAGING_INFIX}{run_id}")


def staging_prefix(target: str) -> tuple[str, str]:
    """(directory, name prefix) that every staging directory of ``target`` has; the lock file shares it."""
    directory, name, _ = split_target(target)
    return directory, f".{name}{STAGING_INFIX}"


def is_staging_name(target: str, name: str) -> bool:
    _, prefix = staging_prefix(target)
    return name.startswith(prefix) and not name.endswith(LOCK_SUFFIX) and not name[len(prefix):].startswith("partial-")


@dataclasses.dataclass(frozen=True)
class ShardNaming:
    """Final file names ``prefix + template(shard, count) + suffix`` as Beam's file sinks make them.

    In the template the first run of ``S`` is the zero-padded shard number and the first run of
    ``N`` the zero-padded shard count; ``''`` means one unsharded file named ``prefix + suffix``.
    """

    prefix: str
    suffix: str
    template: str

    def __post_init__(self) -> None:
        if self.template and not re.search("S+", self.template):
            raise ValueError(f"shard_name_template {self.template!r} has no shard number placeholder (a run of S)")
        if self.template and re.search("[UWV]", self.template):
            raise ValueError(
                f"shard_name_template {self.template!r} uses U, W or V (uuid and window placeholders of "
                "Beam's streaming writes); this sink writes bounded PCollections only: use S and N"
            )

    def _parts(self) -> list[tuple[str, str]]:
        """The template split into ("S" | "N" | "text", text) pieces."""
        parts: list[tuple[str, str]] = []
        rest = self.template
        runs = {}
        for letter in "SN":
            match = re.search(f"{letter}+", rest)
            if match:
                runs[match.start()] = (letter, match.group(0))
        position = 0
        for start in sorted(runs):
            letter, run = runs[start]
            parts.append(("text", rest[position:start]))
            parts.append((letter, run))
            position = start + len(run)
        parts.append(("text", rest[position:]))
        return [part for part in parts if part[1]]

    def name(self, shard: int, num_shards: int) -> str:
        """The final name of shard ``shard`` of ``num_shards``."""
        pieces = []
        for kind, text in self._parts():
            if kind == "S":
                pieces.append(f"{shard:0{len(text)}d}")
            elif kind == "N":
                pieces.append(f"{num_shards:0{len(text)}d}")
            else:
                pieces.append(text)
        return self.prefix + "".join(pieces) + self.suffix

    def glob(self) -> str:
        """A glob that matches this naming for every shard number and count (a superset; see ``matches``)."""
        middle = "".join("*" if kind in "SN" else text for kind, text in self._parts())
        return self.prefix + middle + self.suffix

    def matches(self, path: str) -> bool:
        """Whether ``path`` is a shard name this naming can produce, for any shard count."""
        middle = "".join(
            rf"\d{{{len(text)},}}" if kind in "SN" else re.escape(text) for kind, text in self._parts()
        )
        return re.fullmatch(re.escape(self.prefix) + middle + re.escape(self.suffix), path) is not None
