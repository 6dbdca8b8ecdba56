"""The tools that write files, writing into a bucket (issue 41, item 2): ``tfrbeam export`` to a ``gs://`` or ``s3://``
prefix (from a dataset in a bucket or on disk) and ``tfrbeam stats --output-dir gs://...``.

Each runs as a user runs it (a subprocess with only the clients' environment) from an empty working directory, which
must stay empty: a URL is never taken for a local path. What lands in the bucket is read back with the server's own
client and compared with the same tool's local output; nothing outside the output prefix changes.
"""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tests.integration.test_object_store_reads import _upload

ROWS = 5000


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> pathlib.Path:
    where = tmp_path_factory.mktemp("object-store-tools") / "ds"
    rng = np.random.default_rng(3)
    table = pa.table({"id": np.arange(ROWS, dtype=np.int64), "x": rng.random(ROWS).astype(np.float32),
                      "name": [f"row {i}" for i in range(ROWS)], "tags": [list(range(i % 5)) for i in range(ROWS)]})
    tfrbeam.write_dataset(table, str(where), splits={"train": 0.8, "eval": 0.2}, num_shards=3, progress=False)
    return where


def _cli(cwd: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", *arguments], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture
def empty_cwd(tmp_path) -> pathlib.Path:
    where = tmp_path / "cwd"
    where.mkdir()
    return where


def _under(listing: dict[str, str], prefix: str) -> dict[str, str]:
    return {key[len(prefix) + 1:]: digest for key, digest in listing.items() if key.startswith(prefix + "/")}


def _outside(listing: dict[str, str], prefix: str) -> dict[str, str]:
    return {key: digest for key, digest in listing.items() if not key.startswith(prefix + "/")}


@pytest.mark.parametrize("source", ["bucket", "local"])
def test_export_into_a_bucket_writes_the_local_exports_files_there(bucket, local_dataset, tmp_path, empty_cwd, source):
    """``tfrbeam export DATASET gs://b/parquet``: the objects under the prefix are the Parquet files a local export
    writes, table for table; nothing else in the bucket changes, no temp object stays, nothing is written locally."""
    dataset = _upload(bucket, local_dataset, "ds") if source == "bucket" else str(local_dataset)
    bucket.put("parquet-notes/keep.txt", b"not under the export's prefix")
    before = bucket.listing()
    done = _cli(empty_cwd, "export", dataset, bucket.url("parquet"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(empty_cwd.iterdir()) == [], "the export wrote into the working directory"
    assert _cli(tmp_path, "export", str(local_dataset), str(tmp_path / "local")).returncode == 0
    expected = sorted(path.relative_to(tmp_path / "local").as_posix() for path in (tmp_path / "local").rglob("*")
                      if path.is_file())
    after = bucket.listing()
    assert sorted(_under(after, "parquet")) == expected and len(expected) == 6
    for name in expected:
        table = pq.read_table(io.BytesIO(bucket.get(f"parquet/{name}")), page_checksum_verification=True)
        assert table.equals(pq.read_table(tmp_path / "local" / name)), name
    assert _outside(after, "parquet") == before


def test_export_into_a_bucket_refuses_earlier_files_unless_overwrite_and_then_replaces_them(bucket, local_dataset,
                                                                                            empty_cwd):
    """As locally: Parquet objects already where the export writes are refused (exit 2, naming one, nothing
    written); with --overwrite export's own are replaced and a stale one of an older export with more shards goes;
    a user's object beside them is never deleted."""
    dataset = _upload(bucket, local_dataset, "ds")
    bucket.put("parquet/train/train-00007-of-00008.parquet", b"an older export's file")
    bucket.put("parquet/train/README.md", b"a user's notes")
    before = bucket.listing()
    refused = _cli(empty_cwd, "export", dataset, bucket.url("parquet"))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "train-00007-of-00008.parquet" in refused.stderr and "--overwrite" in refused.stderr
    assert bucket.listing() == before
    done = _cli(empty_cwd, "export", dataset, bucket.url("parquet"), "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    after = bucket.listing()
    assert "parquet/train/train-00007-of-00008.parquet" not in after
    assert after["parquet/train/README.md"] == before["parquet/train/README.md"]
    rows = sum(pq.read_table(io.BytesIO(bucket.get(key))).num_rows for key in after if key.endswith(".parquet"))
    assert rows == ROWS
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.parametrize("source", ["bucket", "local"])
def test_stats_into_a_bucket_writes_what_a_local_output_directory_gets(bucket, local_dataset, tmp_path, empty_cwd,
                                                                        source):
    """``tfrbeam stats DATASET --output-dir gs://b/report``: stats.json and stats.html objects equal to a local run's
    (but the ``source`` each names); nothing else in the bucket changes; nothing is written locally."""
    dataset = _upload(bucket, local_dataset, "ds") if source == "bucket" else str(local_dataset)
    before = bucket.listing()
    done = _cli(empty_cwd, "stats", dataset, "--output-dir", bucket.url("report"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {bucket.url('report/stats.json')} and {bucket.url('report/stats.html')}" in done.stdout
    assert list(empty_cwd.iterdir()) == [], "stats wrote into the working directory"
    assert _cli(tmp_path, "stats", dataset, "--output-dir", str(tmp_path / "local")).returncode == 0
    after = bucket.listing()
    assert sorted(_under(after, "report")) == ["stats.html", "stats.json"]
    remote, local = json.loads(bucket.get("report/stats.json")), json.loads((tmp_path / "local" / "stats.json").read_text())
    assert remote == local and remote["splits"]["train"]["num_examples"] + remote["splits"]["eval"]["num_examples"] == ROWS
    assert bucket.get("report/stats.html").startswith(b"<!DOCTYPE html>")
    assert _outside(after, "report") == before
