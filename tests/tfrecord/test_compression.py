"""One compression resolver (issue 44): every spelling means the same codec at every entry point, "auto" goes by
a file's name or first bytes, and a dataset's codec is its manifest's.

Measured before: the rules lived in four places (records.py, beam/source.py twice, stats/compute.py's guess from
shard names; now records.py holds them and the others call it), and ``open_dataset(dataset_dir,
compression="AUTO")`` read a GZIP dataset as uncompressed.
"""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa
import pytest
from apache_beam.io.filesystem import CompressionTypes

import tfrbeam
from tfrbeam.beam.sink import make_sink_spec
from tfrbeam.beam.source import TFRecordSource
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import ConfigError, UnsupportedCompressionError
from tfrbeam.stats.accumulators import stats_schema
from tfrbeam.stats.compute import accumulate_file
from tfrbeam.stats.export import write_parquet
from tfrbeam.tfrecord.blocks import record_blocks
from tfrbeam.tfrecord.records import (
    RecordWriter,
    canonical_compression,
    combine_compressions,
    dataset_compression,
    normalize_compression,
    read_records,
)

RECORDS = [encode_example({"x": [number]}) for number in range(5)]
TYPES = {"x": "int64"}

# Each spelling some entry point accepts, and the codec it means.
SPELLINGS = [
    (None, None), ("", None), ("none", None), ("NONE", None), ("uncompressed", None), (CompressionTypes.UNCOMPRESSED, None),
    ("gzip", "gzip"), ("GZIP", "gzip"), (" Gzip ", "gzip"), ("gz", "gzip"), (CompressionTypes.GZIP, "gzip"),
    ("zlib", "zlib"), ("ZLIB", "zlib"), ("zz", "zlib"), ("deflate", "zlib"), (CompressionTypes.DEFLATE, "zlib"),
]
AUTO_SPELLINGS = ["auto", "AUTO", " Auto ", CompressionTypes.AUTO]


def _no_hint_file(tmp_path: pathlib.Path, codec: str | None) -> str:
    """The records written with ``codec`` under a name that implies no compression."""
    path = str(tmp_path / "records")
    with RecordWriter(path, codec) as writer:
        writer.write_many(RECORDS)
    return path


def _read_by_records(path: str, spelling: str | None) -> int:
    return len(list(read_records(path, spelling)))


def _read_by_blocks(path: str, spelling: str | None) -> int:
    return sum(block.num_records for block in record_blocks(path, spelling))


def _read_by_source(path: str, spelling: str | None) -> int:
    (bundle,) = list(TFRecordSource(path, compression=spelling).split(float("inf")))
    source = bundle.source
    return len(list(source.read(source.get_range_tracker(None, None))))


def _read_by_reader(path: str, spelling: str | None) -> int:
    return sum(len(batch["x"]) for batch in open_dataset(path, compression=spelling, num_parallel_reads=1))


def _read_by_stats(path: str, spelling: str | None) -> int:
    return accumulate_file(path, TYPES, compression=spelling).num_examples


def _read_by_export(path: str, spelling: str | None) -> int:
    return write_parquet(path, path, str(pathlib.Path(path).with_suffix(".parquet")), stats_schema(TYPES), spelling)


READERS = [_read_by_records, _read_by_blocks, _read_by_source, _read_by_reader, _read_by_stats, _read_by_export]


@pytest.mark.parametrize("read", READERS, ids=lambda read: read.__name__.removeprefix("_read_by_"))
@pytest.mark.parametrize(("spelling", "codec"), SPELLINGS, ids=repr)
def test_every_spelling_reads_its_codec_at_every_entry_point(tmp_path, read, spelling, codec):
    assert canonical_compression(spelling) == codec
    assert read(_no_hint_file(tmp_path, codec), spelling) == len(RECORDS)


@pytest.mark.parametrize("read", READERS, ids=lambda read: read.__name__.removeprefix("_read_by_"))
@pytest.mark.parametrize("spelling", AUTO_SPELLINGS, ids=repr)
@pytest.mark.parametrize("codec", [None, "gzip", "zlib"])
def test_auto_in_any_spelling_reads_a_local_file_by_its_first_bytes(tmp_path, read, spelling, codec):
    assert read(_no_hint_file(tmp_path, codec), spelling) == len(RECORDS)


@pytest.mark.parametrize(("compression_type", "codec"), [
    (CompressionTypes.UNCOMPRESSED, None), (CompressionTypes.GZIP, "gzip"), (CompressionTypes.DEFLATE, "zlib")])
def test_beams_compression_types_read_their_codec(tmp_path, compression_type, codec):
    path = _no_hint_file(tmp_path, codec)
    (bundle,) = list(TFRecordSource(path, compression_type=compression_type).split(float("inf")))
    assert len(list(bundle.source.read(bundle.source.get_range_tracker(None, None)))) == len(RECORDS)
    assert make_sink_spec(str(tmp_path / "out"), compression_type=compression_type).codec() == codec


@pytest.mark.parametrize(("spelling", "codec"), [*SPELLINGS, *((spelling, None) for spelling in AUTO_SPELLINGS)],
                         ids=repr)
def test_the_sink_writes_the_codec_each_spelling_means(tmp_path, spelling, codec):
    assert make_sink_spec(str(tmp_path / "out"), compression=spelling).codec() == codec


@pytest.mark.parametrize(("name", "codec"), [
    ("a.tfrecord.gz", "gzip"), ("a.GZIP", "gzip"), ("a.tfrecord.zlib", "zlib"), ("a.zz", "zlib"),
    ("a.tfrecord.deflate", "zlib"), ("gs://bucket/a.tfrecord", None), ("gs://bucket/a-00000-of-00001", None),
])
def test_auto_goes_by_the_name(name, codec):
    assert normalize_compression("auto", name) == codec


@pytest.mark.parametrize("suffix", [".bz2", ".zst", ".zstd", ".xz", ".lzma"])
def test_auto_refuses_a_name_of_a_codec_tensorflow_cannot_read_at_every_entry_point(tmp_path, suffix):
    """Before, only the Beam source refused these; the reader read the bytes as a TFRecord and called them corrupt."""
    path = tmp_path / f"data.tfrecord{suffix}"
    path.write_bytes(b"\x00" * 64)
    for read in (_read_by_records, _read_by_blocks, _read_by_reader, _read_by_stats, _read_by_source):
        with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
            read(str(path), "auto")


@pytest.mark.parametrize("spelling", ["bzip2", "BZIP2", "zstd", "lzma", "snappy", "lz4", "br"])
def test_other_codecs_are_refused_by_name(spelling):
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
        canonical_compression(spelling)


def test_two_arguments_must_agree_unless_one_is_auto():
    assert combine_compressions(CompressionTypes.AUTO, "GZIP") == "gzip"
    assert combine_compressions(CompressionTypes.DEFLATE, "auto") == "zlib"
    assert combine_compressions(CompressionTypes.DEFLATE, "zlib") == "zlib"
    with pytest.raises(ConfigError, match="disagree"):
        combine_compressions(CompressionTypes.GZIP, "zlib")


@pytest.mark.parametrize(("stored", "codec"), [(None, None), ("none", None), ("gzip", "gzip"), ("zlib", "zlib")])
def test_a_datasets_codec_is_its_manifests(stored, codec):
    manifest = {"compression": stored}
    assert dataset_compression(manifest) == codec
    assert dataset_compression(manifest, "AUTO") == codec
    assert dataset_compression(manifest, "GZIP") == "gzip"  # an explicit codec is the caller's to give
    assert dataset_compression({}) is None


@pytest.fixture(scope="module")
def gzip_dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("gzip") / "ds"
    table = pa.table({"x": list(range(40))})
    tfrbeam.write_dataset(table, str(root), splits={"train": 1.0}, num_shards=2, shuffle=False, progress=False,
                          compression="gzip")
    assert json.loads((root / "tfrbeam_dataset.json").read_text())["compression"] == "gzip"
    return root


@pytest.mark.parametrize("spelling", AUTO_SPELLINGS, ids=repr)
def test_open_dataset_reads_a_dataset_with_its_manifests_codec_in_any_spelling_of_auto(gzip_dataset, spelling):
    """Before, "AUTO" (not "auto") on a dataset directory resolved against an empty name: uncompressed."""
    dataset = open_dataset(str(gzip_dataset), compression=spelling, num_parallel_reads=1)
    assert {shard.compression for shard in dataset.source.files} == {"gzip"}
    assert sum(len(batch["x"]) for batch in dataset) == 40
