"""The ``Manifest`` object: built only through the validator, written byte for byte as a build writes it."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.errors import ManifestError
from tfrbeam.layout.manifest_schema import Manifest, Shard
from tfrbeam.layout.names import LEGACY_MANIFEST_FORMAT, MANIFEST_NAME

SHA = "ab" * 32


def _built(tmp_path, **options) -> bytes:
    table = pa.table({"id": list(range(60)), "text": [f"row {i}" for i in range(60)]})
    tfrbeam.write_dataset(table, str(tmp_path / "ds"), splits={"train": 0.75, "eval": 0.25}, num_shards=2,
                          progress=False, **options)
    return (tmp_path / "ds" / MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize("options", [{}, {"compression": "gzip"}])
def test_a_built_manifest_round_trips_byte_for_byte(tmp_path, options):
    data = _built(tmp_path, **options)
    manifest = Manifest.from_bytes(data, "ds", verifiable=True)
    assert manifest.to_bytes() == data
    assert manifest.to_dict() == json.loads(data)
    assert manifest.split_names == ("train", "eval") and manifest.record_type == "Example"
    assert manifest.compression == options.get("compression")
    train = manifest.split("train")
    assert sum(shard.num_examples for shard in train.shards) == train.num_examples
    assert all(shard.sha256 is not None and shard.num_bytes for shard in train.shards)
    assert "examples_with_feature" in train.rest and "features" not in manifest.rest
    assert manifest.run_id == json.loads(data)["run"]["run_id"] and "run" not in manifest.rest


def test_a_format_1_manifest_reads_with_its_run_keys_as_the_run_record():
    old = {"format": LEGACY_MANIFEST_FORMAT, "run_id": "r0", "runner": "FnApiRunner",
           "splits": {"train": {"num_examples": 2, "shards": [{"path": "train/a", "num_examples": 2}]}}}
    data = (json.dumps(old, indent=2) + "\n").encode()
    manifest = Manifest.from_bytes(data, "old")
    assert manifest.run == {"run_id": "r0", "runner": "FnApiRunner"} and manifest.run_id == "r0"
    assert manifest.rest == {} and manifest.record_type == "Example" and manifest.compression is None
    assert manifest.split("train").shards == (Shard("train/a", 2),) and manifest.split("train").num_bytes is None
    assert manifest.to_bytes() == data  # nothing added, nothing moved


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["splits"]["train"]["shards"][0].update(num_bytes="abc"),
     r"^ds/m\.json: splits\.train\.shards\[0\]\.num_bytes: expected a non-negative integer, got \"abc\"$"),
    (lambda m: m["splits"]["train"].update(num_bytes=-1),
     r"^ds/m\.json: splits\.train\.num_bytes: expected a non-negative integer, got -1$"),
    (lambda m: m.pop("splits"), r"^ds/m\.json: the key splits is missing; the manifest is damaged or from another tool$"),
])
def test_a_bad_manifest_is_one_line_naming_the_key(edit, message):
    manifest = {"format": "tfrbeam-dataset/2", "splits": {"train": {
        "num_examples": 1, "num_bytes": 9, "shards": [{"path": "train/a", "num_examples": 1, "num_bytes": 9, "sha256": SHA}]}}}
    edit(manifest)
    with pytest.raises(ManifestError, match=message):
        Manifest.from_bytes(json.dumps(manifest).encode(), "ds/m.json")


def test_bytes_over_the_bound_are_refused_before_parsing():
    with pytest.raises(ManifestError, match=r"^m: JSON nested \d+ deep, more than a manifest.s 32"):
        Manifest.from_bytes(b"[" * 40 + b"]" * 40, "m")


def test_no_dict_shares_a_value_with_a_manifest():
    source = {"format": "tfrbeam-dataset/2", "config": {"seed": 1}, "features": {"id": {"type": "int64"}},
              "splits": {"train": {"num_examples": 0, "shards": [], "examples_with_feature": {"id": 0}}}}
    manifest = Manifest.from_dict(source, "m")
    source["config"]["seed"] = 2
    source["features"]["id"]["type"] = "bytes"
    written = manifest.to_dict()
    written["config"]["seed"] = 3
    written["splits"]["train"]["examples_with_feature"]["id"] = 9
    assert manifest.rest["config"] == {"seed": 1} and manifest.features == {"id": {"type": "int64"}}
    assert manifest.split("train").rest == {"examples_with_feature": {"id": 0}}


def test_a_renamed_manifest_lists_its_files_under_their_new_names_and_nothing_else_changes():
    shard = {"path": "train/a.tfrecord", "num_examples": 1, "num_bytes": 9, "sha256": SHA}
    source = {"format": "tfrbeam-dataset/2", "splits": {"train": {"num_examples": 1, "num_bytes": 9, "shards": [shard]}},
              "schema_pbtxt": "schema.pbtxt", "bad_records": {"count": 1, "files": ["_errors/x.jsonl"]}}
    manifest = Manifest.from_dict(source, "m")
    renamed = manifest.renamed({"train/a.tfrecord": "train/a-gR1.tfrecord", "schema.pbtxt": "schema-gR1.pbtxt",
                                "_errors/x.jsonl": "_errors/x-gR1.jsonl"})
    assert renamed.split("train").shards == (Shard("train/a-gR1.tfrecord", 1, 9, SHA),)
    assert renamed.rest == {"schema_pbtxt": "schema-gR1.pbtxt", "bad_records": {"count": 1, "files": ["_errors/x-gR1.jsonl"]}}
    assert manifest == Manifest.from_dict(source, "m") and renamed.keys == manifest.keys
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[0\]\.path"):
        manifest.renamed({"train/a.tfrecord": "../out.tfrecord"})
