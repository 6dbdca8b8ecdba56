"""The names a build writes inside a dataset: what a run's record may name for recovery to delete."""

from __future__ import annotations

import pytest

from tfrbeam.errors import ConfigError, UnsupportedCompressionError
from tfrbeam.layout.names import is_built_shard_path, shard_file_name
from tfrbeam.tfrecord.read_index import index_paths_for
from tfrbeam.tfrecord.records import compression_from_name


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


@pytest.mark.parametrize("spelling,codec", [(None, None), ("none", None), ("GZIP", "gzip"), ("gz", "gzip"),
                                            ("deflate", "zlib"), ("ZLIB", "zlib")])
def test_a_shard_is_named_by_its_codec_in_any_spelling_and_read_back_as_it(spelling, codec):
    """The suffix comes from the compression home's one table, whatever spelling of the codec it is given; "auto"
    compression reads the name back as the codec it was written with."""
    name = shard_file_name("train", 2, 8, spelling)
    assert name == "train-00002-of-00008.tfrecord" + {None: "", "gzip": ".gz", "zlib": ".zlib"}[codec]
    assert compression_from_name(name, look_inside=False) == codec and is_built_shard_path(f"train/{name}")


def test_a_shard_name_refuses_auto_and_codecs_tensorflow_cannot_read():
    with pytest.raises(ConfigError, match="not 'auto'"):
        shard_file_name("train", 0, 1, "auto")
    with pytest.raises(UnsupportedCompressionError):
        shard_file_name("train", 0, 1, "bzip2")
