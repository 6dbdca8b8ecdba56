"""`stats` and `export` on one folder of TensorFlow-written files in each compression: every file read with its own.

Measured (issue 42): both applied the first file's compression to all files and failed, and
`export` left the files it had written before the failure behind (`expd/tf_gzip.parquet`), while
`cat`, `verify`, `inspect`, `open_dataset` and `build` read the same folder.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import pathlib
import shutil
import zlib

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import tfrbeam
from tests import memfs
from tests.conftest import TESTDATA
from tfrbeam.base import fileops
from tfrbeam.beam.parquet_export import ExportToParquet
from tfrbeam.beam.stats_combine import ComputeDatasetStats
from tfrbeam.cli.main import main as cli_main
from tfrbeam.stats.compute import FILES_SPLIT, compute_stats
from tfrbeam.stats.export import export_to_parquet

VECTORS = TESTDATA / "tf-vectors"
RECORDS_PER_FILE = 20  # examples.tfrecord: 20 Examples written by TensorFlow


def _disk_full_at_second_parquet_file(monkeypatch) -> None:
    """The disk fills when the export creates its second Parquet file (every file operation passes
    ``fileops.mutating``, which Beam's file systems use too)."""
    created = []
    real = fileops.mutating

    def mutating(op, path, action):
        if op == "create" and ".parquet" in os.path.basename(path):
            created.append(path)
            if len(created) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(op, path, action)

    monkeypatch.setattr(fileops, "mutating", mutating)


@pytest.fixture
def mixed(tmp_path) -> pathlib.Path:
    """TensorFlow's GZIP file, its uncompressed file and a ZLIB stream of it, in one folder (gzip sorts first)."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(VECTORS / "examples.tfrecord.gz", folder / "a_tf_gzip.tfrecord.gz")
    shutil.copy(VECTORS / "examples.tfrecord", folder / "b_plain.tfrecord")
    (folder / "c_zlib.tfrecord.zlib").write_bytes(zlib.compress((VECTORS / "examples.tfrecord").read_bytes()))
    return folder


def test_stats_reads_each_file_with_its_own_compression(mixed, tmp_path):
    stats = compute_stats(str(mixed / "*"))
    assert stats["splits"][FILES_SPLIT]["num_examples"] == 3 * RECORDS_PER_FILE
    assert cli_main(["stats", str(mixed / "*"), "--output-dir", str(tmp_path / "stats")]) == 0
    assert (tmp_path / "stats" / "stats.json").is_file()


def test_beam_stats_read_each_file_with_its_own_compression(mixed):
    with beam.Pipeline() as pipeline:
        stats = pipeline | ComputeDatasetStats(str(mixed / "*"))
        assert_that(stats | beam.Map(lambda document: document["splits"][FILES_SPLIT]["num_examples"]),
                    equal_to([3 * RECORDS_PER_FILE]))


def test_export_reads_each_file_with_its_own_compression(mixed, tmp_path):
    out = tmp_path / "expd"
    written = export_to_parquet(str(mixed / "*"), str(out))
    assert sorted(os.path.basename(path) for path in written) == [
        "a_tf_gzip.parquet", "b_plain.parquet", "c_zlib.parquet"]
    tables = [pq.read_table(path) for path in written]
    assert [table.num_rows for table in tables] == [RECORDS_PER_FILE] * 3
    assert _rows(tables[0]) == _rows(tables[1]) == _rows(tables[2])  # the same Examples in each codec
    with beam.Pipeline() as pipeline:
        _ = pipeline | ExportToParquet(str(mixed / "*"), str(tmp_path / "beam"))
    for path, table in zip(written, tables):
        assert _rows(pq.read_table(tmp_path / "beam" / os.path.basename(path))) == _rows(table)


def _rows(table) -> str:
    """A table's schema and rows as text (NaN, which the vectors hold, compares equal to itself here)."""
    return f"{table.schema}\n{table.to_pylist()}"


def test_a_failed_export_leaves_nothing_behind(mixed, tmp_path, monkeypatch):
    """The first file exports fine, the disk fills at the second: no Parquet file (and no temp) is left in the output."""
    out = tmp_path / "expd"
    with monkeypatch.context() as patch:
        _disk_full_at_second_parquet_file(patch)
        with pytest.raises(OSError, match="No space left"):
            export_to_parquet(str(mixed / "*"), str(out))
    assert not out.exists() or sorted(os.listdir(out)) == []
    with monkeypatch.context() as patch:
        _disk_full_at_second_parquet_file(patch)
        assert cli_main(["export", str(mixed / "*"), str(out)]) != 0
    assert not out.exists() or sorted(os.listdir(out)) == []
    assert cli_main(["export", str(mixed / "*"), str(out)]) == 0  # and a rerun needs no --overwrite
    assert sorted(os.listdir(out)) == ["a_tf_gzip.parquet", "b_plain.parquet", "c_zlib.parquet"]


def test_a_failed_beam_export_publishes_no_file(mixed, tmp_path, monkeypatch):
    out = tmp_path / "beam"
    _disk_full_at_second_parquet_file(monkeypatch)
    with pytest.raises(Exception, match="No space left"):
        with beam.Pipeline() as pipeline:
            _ = pipeline | ExportToParquet(str(mixed / "*"), str(out))
    published = collections.Counter(path.suffix for path in out.rglob("*") if not path.name.startswith("."))
    assert published == collections.Counter()


@pytest.fixture
def gzip_dataset_without_suffixes(tmp_path) -> str:
    """A GZIP dataset on a non-local filesystem (memfs://, as gs:// would be) whose shard names give no hint: the
    manifest alone says gzip, and nothing there can be looked inside before the read."""
    root = tmp_path / "ds"
    tfrbeam.write_dataset(pa.table({"x": list(range(30))}), str(root), splits={"train": 1.0}, num_shards=2,
                          shuffle=False, progress=False, compression="gzip")
    manifest_file = root / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["compression"] == "gzip"
    for shard in manifest["splits"]["train"]["shards"]:
        renamed = shard["path"].removesuffix(".gz")
        (root / shard["path"]).rename(root / renamed)
        shard["path"] = renamed
    manifest_file.write_text(json.dumps(manifest))
    url = memfs.upload(root, "memfs://bucket/gzip-ds")
    yield url
    memfs.clear("memfs://bucket")


def test_beam_stats_and_export_read_a_datasets_shards_with_its_manifests_compression(gzip_dataset_without_suffixes,
                                                                                       tmp_path):
    """Measured (issue 44): stats guessed the codec from each shard's name, so these shards read as uncompressed."""
    with beam.Pipeline() as pipeline:
        stats = pipeline | ComputeDatasetStats(gzip_dataset_without_suffixes)
        assert_that(stats | beam.Map(lambda document: document["splits"]["train"]["num_examples"]), equal_to([30]))
    with beam.Pipeline() as pipeline:
        _ = pipeline | ExportToParquet(gzip_dataset_without_suffixes, str(tmp_path / "out"))
    assert sum(pq.read_table(path).num_rows for path in (tmp_path / "out").rglob("*.parquet")) == 30
