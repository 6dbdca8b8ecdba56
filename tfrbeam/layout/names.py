"""Every name in and beside a dataset directory, in one place (the old homes re-export them).

The names beside an output (lock, staging, partial files) stay defined in ``tfrbeam.naming``,
which the commit owns; they are re-exported here so a reader of this module sees them all.
"""

from __future__ import annotations

import re

from tfrbeam.naming import LOCK_SUFFIX, PARTIAL_INFIX, STAGING_INFIX, lock_path, partial_path, staging_path

__all__ = [
    "DALI_DIR_NAME", "ERRORS_DIR_NAME", "INDEX_DIR_NAME", "LOCK_SUFFIX", "MANIFEST_FORMAT", "MANIFEST_NAME",
    "EXPORT_NAME", "PARTIAL_INFIX", "RECORD_SUFFIXES", "SHARD_NAME", "STAGING_INFIX", "STATS_HTML", "STATS_JSON", "lock_path",
    "partial_path", "staging_path",
]

MANIFEST_NAME = "dataset_info.json"  # written last, in the dataset directory: the commit point
MANIFEST_FORMAT = "tfrbeam-dataset/1"
ERRORS_DIR_NAME = "_errors"  # dead-letter files of bad rows
INDEX_DIR_NAME = ".tfrbeam-index"  # read indexes of a split's shards, inside the split directory
DALI_DIR_NAME = "dali"  # NVIDIA DALI tfrecord2idx files of the shards (output.dali_index)
STATS_JSON = "stats.json"
STATS_HTML = "stats.html"
SHARD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*-\d{5,}-of-\d{5,}\.tfrecord(\.gz|\.zlib)?")  # a build's shard file
EXPORT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*-\d{5,}-of-\d{5,}\.parquet")  # what export writes of a shard
RECORD_SUFFIXES = (".gz", ".zlib", ".tfrecord", ".tfrecords", ".tfr")  # stripped from a shard's name on export
