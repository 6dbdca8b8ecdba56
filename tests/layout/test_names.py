"""The names a build writes inside a dataset: what a run's record may name for recovery to delete."""

from __future__ import annotations

import pytest

from tfrbeam.layout.names import is_built_shard_path, shard_file_name
from tfrbeam.tfrecord.read_index import index_paths_for


@pytest.mark.parametrize("split,count,compression", [("train", 4, None), ("eval", 1, "gzip"), ("test_2", 123456, "zlib")])
def test_every_shard_and_read_index_a_build_names_is_a_built_shard_path(split, count, compression):
    for shard in (0, count - 1):
        relative = f"{split}/{shard_file_name(split, shard, count, compression)}"
        assert is_built_shard_path(relative)
        if compression is None:
            assert all(is_built_shard_path(index) for index in index_paths_for(relative))  # .index, and .idx .offsets


@pytest.mark.parametrize("relative", [
    "train/NOTES.md", "train/train-00000-of-00003.tfrecord.bak", "keep/data.bin", "tfrbeam_dataset.json",
    "train/eval-00000-of-00003.tfrecord", "train/trainx-00000-of-00003.tfrecord", "x/train/train-00000-of-00003.tfrecord",
    "train-00000-of-00003.tfrecord", "train/.tfrbeam-index/NOTES.md.idx",
    "train/.tfrbeam-index/train-00000-of-00003.tfrecord.gz.idx", "train/.tfrbeam-index/NOTES.md.index",
    "train/.tfrbeam-index/train-00000-of-00003.tfrecord.gz.index", "train/.tfrbeam-index/train-00000-of-00003.tfrecord.bak",
    "train/_errors/train-00000-of-00003.tfrecord", "../train/train-00000-of-00003.tfrecord", "stats.json",
])
def test_anything_else_in_an_output_may_be_the_users(relative):
    assert not is_built_shard_path(relative)
