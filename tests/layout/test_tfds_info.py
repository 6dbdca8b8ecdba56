"""TFDS's dataset_info.json and features.json from our manifest (tfrbeam/layout/tfds_info.py), without TensorFlow.

The expected JSON is what TFDS 4.9.10's own ``DatasetInfo.write_to_directory`` wrote for the same features and
splits; tests/builder/pipeline/test_tfds_output.py loads built datasets with real TFDS.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest import verify_dataset
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.layout.names import TFDS_DATASET_INFO, TFDS_FEATURES
from tfrbeam.layout.tfds_info import tfds_files


def manifest(**overrides):
    shards = [{"path": f"train/train-0000{i}-of-00002.tfrecord", "num_examples": 5 + i, "num_bytes": 100 + i,
               "sha256": "0" * 64} for i in range(2)]
    base = {
        "format": "tfrbeam-dataset/1", "record_type": "Example", "compression": None,
        "splits": {"train": {"num_examples": 11, "num_bytes": 201, "shards": shards}},
        "features": {
            "id": {"type": "int64", "shape": [], "always_present": True},
            "maybe": {"type": "float", "shape": [], "always_present": False},
            "vec": {"type": "float", "shape": [3], "always_present": False},
            "grid": {"type": "int64", "shape": [2, 3], "always_present": True},
            "tokens": {"type": "bytes", "shape": None, "always_present": False},
        },
    }
    base.update(overrides)
    return Manifest.from_dict(base, "m")


def test_dataset_info_names_each_splits_shards_as_tfds_writes_them():
    info = json.loads(tfds_files(manifest(), "flights", "2.1.0")[TFDS_DATASET_INFO])
    assert info == {
        "fileFormat": "tfrecord", "name": "flights", "version": "2.1.0",
        "splits": [{"filepathTemplate": "train/train-{SHARD_X_OF_Y}.{FILEFORMAT}", "name": "train",
                    "numBytes": "201", "shardLengths": ["5", "6"]}],
    }


def test_a_replaces_tagged_shard_names_in_a_bucket_are_named_literally_in_the_template():
    shards = [{"path": f"train/train-gR7f-0000{i}-of-00002.tfrecord", "num_examples": 1, "num_bytes": 10}
              for i in range(2)]
    changed = manifest(splits={"train": {"num_examples": 2, "num_bytes": 20, "shards": shards}})
    info = json.loads(tfds_files(changed, "flights")[TFDS_DATASET_INFO])
    assert info["splits"][0]["filepathTemplate"] == "train/train-gR7f-{SHARD_X_OF_Y}.{FILEFORMAT}"


def test_features_map_scalars_fixed_shapes_optional_and_variable_length_lists():
    features = json.loads(tfds_files(manifest(), "flights")[TFDS_FEATURES])
    assert features["pythonClassName"] == "tensorflow_datasets.core.features.features_dict.FeaturesDict"
    entries = features["featuresDict"]["features"]
    scalar = "tensorflow_datasets.core.features.scalar.Scalar"
    tensor = "tensorflow_datasets.core.features.tensor_feature.Tensor"
    assert entries == {
        "id": {"pythonClassName": scalar, "tensor": {"dtype": "int64", "encoding": "none", "shape": {}}},
        "maybe": {"pythonClassName": scalar,
                  "tensor": {"dtype": "float32", "encoding": "none", "optional": True, "shape": {}}},
        "vec": {"pythonClassName": tensor,
                "tensor": {"dtype": "float32", "encoding": "none", "optional": True, "shape": {"dimensions": ["3"]}}},
        "grid": {"pythonClassName": tensor,
                 "tensor": {"dtype": "int64", "encoding": "none", "shape": {"dimensions": ["2", "3"]}}},
        "tokens": {"pythonClassName": tensor,
                   "tensor": {"dtype": "string", "encoding": "none", "shape": {"dimensions": ["-1"]}}},
    }


@pytest.mark.parametrize(("changes", "message"), [
    ({"compression": "gzip"}, "TFDS reads uncompressed TFRecord files only, and this build writes gzip ones"),
    ({"record_type": "SequenceExample"}, "TFDS loads datasets of tf.train.Example only"),
    ({"splits": {"train": {"num_examples": 2, "num_bytes": 2, "shards": [
        {"path": "train/train-00000-of-00002.tfrecord", "num_examples": 1, "num_bytes": 1},
        {"path": "train/train-gR1-00001-of-00002.tfrecord", "num_examples": 1, "num_bytes": 1}]}}},
     "shard 'train/train-00000-of-00002.tfrecord' of split 'train' does not follow its split's PREFIX-NNNNN-of"),
    ({"splits": {"train": {"num_examples": 1, "num_bytes": 1, "shards": [
        {"path": "train/part-00000.tfrecord", "num_examples": 1, "num_bytes": 1}]}}},
     "shard 'train/part-00000.tfrecord' of split 'train' does not follow"),
])
def test_what_tfds_cannot_load_is_refused_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=r"^output\.tfds: ") as raised:
        tfds_files(manifest(**changes), "flights")
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("name", "version", "message"), [
    ("Flights", "1.0.0", "output.tfds.name: 'Flights' is not a TFDS dataset name"),
    ("my-data", "1.0.0", "output.tfds.name: 'my-data' is not a TFDS dataset name"),
    ("flights", "1.0", "output.tfds.version: '1.0' is not a TFDS version (MAJOR.MINOR.PATCH"),
])
def test_a_name_or_version_tfds_would_refuse_is_refused_here(name, version, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        tfds_files(manifest(), name, version)


def test_verify_names_tfds_files_that_are_missing_or_do_not_describe_the_dataset(tmp_path):
    dataset = tmp_path / "ds"
    tfrbeam.write_dataset(pa.table({"id": list(range(30))}), str(dataset), num_shards=2, tfds="rows", progress=False)
    assert verify_dataset(str(dataset)) == []
    (dataset / TFDS_DATASET_INFO).write_bytes((dataset / TFDS_DATASET_INFO).read_bytes().replace(b'"rows"', b'"old"'))
    (dataset / TFDS_FEATURES).unlink()
    problems = verify_dataset(str(dataset))
    assert len(problems) == 2
    assert problems[0].startswith(f"{dataset / TFDS_DATASET_INFO}: TFDS's file does not describe this dataset")
    assert problems[1].startswith(f"{dataset / TFDS_FEATURES}: TFDS's file cannot be read")
