"""The manifest's record type: what each type requires, and the parse spec of SequenceExample datasets."""

from __future__ import annotations

import pytest

from tfrbeam.errors import ManifestError
from tfrbeam.layout.manifest import (
    MANIFEST_FORMAT,
    check_manifest,
    parse_sequence_example_spec_of,
    record_type_of,
)

SPLITS = {"train": {"num_examples": 1, "shards": [{"path": "train/a.tfrecord", "num_examples": 1, "num_bytes": 9,
                                                    "sha256": "0" * 64}]}}
SEQUENCE_KEYS = {"context_features": {}, "sequence_features": {}, "sequence": {}}


def test_a_manifest_without_record_type_is_an_example_one():
    old = {"format": MANIFEST_FORMAT, "splits": SPLITS, "features": {}}
    check_manifest(old, "old", verifiable=True)
    assert record_type_of(old) == "Example"


def test_each_record_type_requires_its_own_schema_keys():
    check_manifest({"format": MANIFEST_FORMAT, "record_type": "SequenceExample", "splits": SPLITS, **SEQUENCE_KEYS},
                   "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: the key context_features is missing"):
        check_manifest({"format": MANIFEST_FORMAT, "record_type": "SequenceExample", "splits": SPLITS, "features": {}},
                       "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: the key features is missing"):
        check_manifest({"format": MANIFEST_FORMAT, "record_type": "Example", "splits": SPLITS, **SEQUENCE_KEYS},
                       "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: record_type 'Tensor' is not one of Example, SequenceExample"):
        check_manifest({"format": MANIFEST_FORMAT, "record_type": "Tensor", "splits": SPLITS}, "m")


def test_the_parse_sequence_example_spec():
    context = {"user": {"type": "bytes", "shape": [], "always_present": True},
               "age": {"type": "int64", "shape": [], "always_present": False}}
    steps = {"t": {"type": "int64", "shape": [], "always_present": True},
             "emb": {"type": "float", "shape": [3], "always_present": True},
             "delay": {"type": "float", "shape": [], "always_present": False},
             "tags": {"type": "bytes", "shape": None, "always_present": True}}
    assert parse_sequence_example_spec_of(context, steps) == {
        "context_features": {"age": "tf.io.VarLenFeature(tf.int64)", "user": "tf.io.FixedLenFeature([], tf.string)"},
        "sequence_features": {"delay": "tf.io.VarLenFeature(tf.float32)",
                              "emb": "tf.io.FixedLenSequenceFeature([3], tf.float32)",
                              "t": "tf.io.FixedLenSequenceFeature([], tf.int64)", "tags": "tf.io.VarLenFeature(tf.string)"},
    }
