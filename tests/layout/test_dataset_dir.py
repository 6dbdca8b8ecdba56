"""``DatasetDirectory``: what every tool asks of a dataset, answered from its checked manifest, locally and in a bucket."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.errors import ConfigError, ManifestError, UnsafePathError
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.names import MANIFEST_NAME

ROWS = 90


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """A gzip dataset of two splits, two shards each."""
    dataset = tmp_path_factory.mktemp("dataset-dir") / "ds"
    table = pa.table({"id": list(range(ROWS)), "text": [f"row {i}" for i in range(ROWS)]})
    tfrbeam.write_dataset(table, str(dataset), splits={"train": 0.7, "eval": 0.3}, num_shards=2, compression="gzip",
                          progress=False)
    return dataset


def _answers(dataset: DatasetDirectory) -> dict:
    """What the directory says, with shard paths relative to it (so a local and a bucket copy compare)."""
    return {
        "splits": dataset.split_names, "record_type": dataset.record_type, "compression": dataset.compression,
        "run_id": dataset.run_id,
        "shards": [(shard.split, shard.number, shard.path[len(dataset.path.rstrip("/")) + 1:], shard.num_examples,
                    shard.num_bytes, shard.sha256) for shard in dataset.shards()],
    }


def test_a_local_dataset_answers_from_its_manifest(built):
    dataset = DatasetDirectory.open(str(built))
    manifest = json.loads((built / MANIFEST_NAME).read_text())
    answers = _answers(dataset)
    assert answers["splits"] == ("train", "eval") and answers["record_type"] == "Example"
    assert answers["compression"] == "gzip" and answers["run_id"] == manifest["run"]["run_id"]
    assert [shard[2] for shard in answers["shards"]] == [shard["path"] for split in manifest["splits"].values()
                                                         for shard in split["shards"]]
    for shard in dataset.shards():  # full paths, each with the size and hash of the file there
        data = pathlib.Path(shard.path).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (shard.num_bytes, shard.sha256)
    assert sum(shard.num_examples for shard in dataset.shards(["eval"])) == dataset.split("eval").num_examples
    assert dataset.shard("eval", 1) == dataset.shards(["eval"])[1]
    assert dataset.generation == Generation.of(str(built), (built / MANIFEST_NAME).read_bytes())
    assert dataset.compression_for("zlib") == "zlib"  # a reader's own choice over the manifest's
    with pytest.raises(ConfigError, match=r"has no split 'test' \(splits: train, eval\)$"):
        dataset.shards(["test"])


def test_no_manifest_and_a_shard_leading_out_are_refused(built, tmp_path):
    assert DatasetDirectory.find(str(tmp_path)) is None
    with pytest.raises(ManifestError, match=f"^{tmp_path}/{MANIFEST_NAME}: no dataset manifest"):
        DatasetDirectory.open(str(tmp_path))
    copy = tmp_path / "copy"
    copy.mkdir()
    manifest = json.loads((built / MANIFEST_NAME).read_text())
    os.symlink(built / "train", copy / "train")  # inside the copy's name, outside the copy
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(UnsafePathError, match=r"splits\.train\.shards\[0\]\.path: .* outside the dataset"):
        DatasetDirectory.open(str(copy)).shards(["train"])


def test_a_dataset_in_a_gcs_bucket_answers_as_its_local_copy(built, gcs_bucket):
    for path in sorted(built.rglob("*")):
        if path.is_file():
            gcs_bucket.put(f"ds/{path.relative_to(built).as_posix()}", path.read_bytes())
    remote = DatasetDirectory.open(gcs_bucket.url("ds"))
    assert remote.path == gcs_bucket.url("ds")
    assert all(shard.path.startswith(gcs_bucket.url("ds") + "/") for shard in remote.shards())
    assert _answers(remote) == _answers(DatasetDirectory.open(str(built)))
    assert remote.manifest.to_bytes() == (built / MANIFEST_NAME).read_bytes()
    assert remote.generation.run_id == remote.run_id
