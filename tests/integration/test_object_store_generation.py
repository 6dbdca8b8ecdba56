"""A read of a dataset in a bucket pins its generation at one manifest read, then one metadata request a shard
(issue 43 item 6 on gs:// and s3://): the check re-read the whole manifest at every shard open, quadratic in shards.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pyarrow as pa
import pytest

import tfrbeam
from tests.integration.test_object_store_reads import _upload
from tfrbeam.base import object_store
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import DatasetChangedError
from tfrbeam.layout import generation

SHARDS = 24


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> pathlib.Path:
    where = tmp_path_factory.mktemp("many-shards") / "ds"
    table = pa.table({"id": np.arange(2400, dtype=np.int64)})
    tfrbeam.write_dataset(table, str(where), splits={"train": 1.0}, num_shards=SHARDS, progress=False)
    return where


def _count_manifest_reads(monkeypatch) -> list[str]:
    """Every whole read of a manifest object (a ranged open for its bytes, or a versioned read) is appended."""
    reads: list[str] = []
    for module, name in ((object_store, "open_ranged"), (object_store, "read_versioned"),
                         (generation, "read_versioned")):
        original = getattr(module, name, None)
        if original is None:
            continue

        def counted(path, *args, _original=original, **kwargs):
            if path.endswith("tfrbeam_dataset.json"):
                reads.append(path)
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return reads


def test_reading_every_shard_reads_the_manifest_a_constant_number_of_times(bucket, many_shards, monkeypatch):
    url = _upload(bucket, many_shards, "ds")
    reads = _count_manifest_reads(monkeypatch)
    with open_dataset(url, split="train", batch_size=50, num_parallel_reads=1) as dataset:
        ids = np.concatenate([batch["id"] for batch in dataset])
    assert sorted(ids.tolist()) == list(range(2400))
    assert len(reads) <= 3, (len(reads), SHARDS)  # the open's own read and the first proof; was one per shard more


def test_a_manifest_replaced_mid_read_is_still_found(bucket, many_shards):
    url = _upload(bucket, many_shards, "ds2")
    manifest = json.loads((many_shards / "tfrbeam_dataset.json").read_bytes())
    manifest["run"]["run_id"] = "another-run"
    with pytest.raises(DatasetChangedError, match="another-run"):
        with open_dataset(url, split="train", batch_size=50, num_parallel_reads=1) as dataset:
            for index, _ in enumerate(dataset):
                if index == 2:
                    bucket.put("ds2/tfrbeam_dataset.json", json.dumps(manifest).encode())
