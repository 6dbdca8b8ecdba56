"""Tensor features end to end: a Parquet input's nested fixed-size lists and fixed_shape_tensor columns, and numpy
columns given to write_dataset, build with their shape in the manifest; open_dataset and open_random_access give
(B, *shape) arrays equal to the input, and TensorFlow's tf.io.parse_example with the manifest's FixedLenFeature
specs reads the same arrays."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tests.tf_venv import run_in_tf_venv, tf_venv_python
from tfrbeam.builder.running.launch import run
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.layout.manifest import read_manifest

ROWS = 9
IMAGES = np.arange(ROWS * 2 * 3, dtype=np.float32).reshape(ROWS, 2, 3) / 4
VOLUMES = np.arange(ROWS * 2 * 2 * 2, dtype=np.int64).reshape(ROWS, 2, 2, 2)


def build_parquet(tmp_path: pathlib.Path, table: pa.Table, features: dict | None = None) -> pathlib.Path:
    pq.write_table(table, tmp_path / "in.parquet")
    config = {"input": {"path": str(tmp_path / "in.parquet")}, "output": {"path": str(tmp_path / "out")},
              "splits": {"train": 1.0}, "shuffle": {"enabled": False}}
    if features is not None:
        config["features"] = features
    run(config, progress=False)
    return tmp_path / "out"


@pytest.fixture(scope="module")
def tensor_dataset(tmp_path_factory) -> pathlib.Path:
    table = pa.table({
        "id": pa.array(np.arange(ROWS), pa.int64()),
        "image": pa.array(IMAGES.tolist(), pa.list_(pa.list_(pa.float32(), 3), 2)),
        "volume": pa.FixedShapeTensorArray.from_numpy_ndarray(VOLUMES),
    })
    return build_parquet(tmp_path_factory.mktemp("tensors"), table)


def test_the_manifest_has_each_tensor_features_shape(tensor_dataset):
    manifest = read_manifest(str(tensor_dataset)).to_dict()
    assert manifest["features"]["image"]["shape"] == [2, 3]
    assert manifest["features"]["volume"]["shape"] == [2, 2, 2]
    assert manifest["parse_example_spec"]["volume"] == "tf.io.FixedLenFeature([2, 2, 2], tf.int64)"


def test_open_dataset_and_open_random_access_give_arrays_of_each_shape(tensor_dataset):
    batches = list(open_dataset(str(tensor_dataset), "train", batch_size=4))
    assert [batch["image"].shape for batch in batches] == [(4, 2, 3), (4, 2, 3), (1, 2, 3)]
    ids = np.concatenate([batch["id"] for batch in batches])
    np.testing.assert_array_equal(np.concatenate([batch["image"] for batch in batches]), IMAGES[ids])
    np.testing.assert_array_equal(np.concatenate([batch["volume"] for batch in batches]), VOLUMES[ids])
    source = open_random_access(str(tensor_dataset), split="train")
    for index in (0, ROWS - 1):
        record = source[index]
        np.testing.assert_array_equal(record["image"], IMAGES[record["id"]])
        np.testing.assert_array_equal(record["volume"], VOLUMES[record["id"]])


def test_write_dataset_takes_a_numpy_column_of_2d_values(tmp_path):
    values = np.arange(6 * 2 * 3, dtype=np.float64).reshape(6, 2, 3)
    tfrbeam.write_dataset({"id": np.arange(6), "x": values}, tmp_path / "out", splits={"train": 1.0}, shuffle=False,
                          progress=False)
    assert read_manifest(str(tmp_path / "out")).to_dict()["features"]["x"]["shape"] == [2, 3]
    batch = next(iter(open_dataset(str(tmp_path / "out"), "train", batch_size=6)))
    assert batch["x"].shape == (6, 2, 3)
    np.testing.assert_array_equal(batch["x"], values.astype(np.float32))


def test_a_value_of_another_shape_is_a_bad_row_naming_its_row_and_feature(tmp_path):
    grids = [[[1, 2, 3], [4, 5, 6]], [[1, 2], [3, 4, 5, 6]], [[7, 8, 9], [1, 2, 3]]]
    table = pa.table({"id": [0, 1, 2], "grid": pa.array(grids, pa.list_(pa.list_(pa.int64())))})
    pq.write_table(table, tmp_path / "in.parquet")
    config = {"input": {"path": str(tmp_path / "in.parquet")}, "output": {"path": str(tmp_path / "out")},
              "splits": {"train": 1.0}, "shuffle": {"enabled": False},
              "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5},
              "features": {"id": {"type": "int64"}, "grid": {"shape": [2, 3]}}}
    run(config, progress=False)
    batch = next(iter(open_dataset(str(tmp_path / "out"), "train", batch_size=3)))
    np.testing.assert_array_equal(batch["grid"], np.array([grids[0], grids[2]]))
    [dead] = [json.loads(line) for path in (tmp_path / "out").rglob("*.jsonl") for line in path.read_text().splitlines()]
    assert (dead["file"], dead["line"]) == (str(tmp_path / "in.parquet"), 2)
    assert dead["reason"] == "feature 'grid': a list at depth 2 holds 2 values, but shape [2, 3] needs 3 there"


_PARSE_WITH_TF = r"""
import json, sys, glob
import numpy as np
import tensorflow as tf
spec_texts = json.loads(sys.argv[2])
spec = {name: eval(text, {"tf": tf}) for name, text in spec_texts.items()}
records = [r.numpy() for r in tf.data.TFRecordDataset(sorted(glob.glob(sys.argv[1] + "/train/*.tfrecord")))]
parsed = tf.io.parse_example(tf.constant(records), spec)
print(json.dumps({name: {"shape": list(value.shape), "values": value.numpy().tolist()} for name, value in parsed.items()}))
"""


@pytest.fixture(scope="module")
def tf_python(request, tmp_path_factory) -> pathlib.Path:
    return tf_venv_python(request, tmp_path_factory)


def test_tensorflow_parses_the_tensors_with_the_manifests_fixed_len_features(tensor_dataset, tf_python):
    spec = read_manifest(str(tensor_dataset)).to_dict()["parse_example_spec"]
    parsed = run_in_tf_venv(tf_python, _PARSE_WITH_TF, str(tensor_dataset), json.dumps(spec))
    assert parsed["image"]["shape"] == [ROWS, 2, 3] and parsed["volume"]["shape"] == [ROWS, 2, 2, 2]
    ids = np.asarray(parsed["id"]["values"])
    np.testing.assert_array_equal(np.asarray(parsed["image"]["values"], np.float32), IMAGES[ids])
    np.testing.assert_array_equal(np.asarray(parsed["volume"]["values"]), VOLUMES[ids])


def test_inspect_prints_each_tensors_fixed_len_feature_with_its_shape(tensor_dataset):
    done = subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", "inspect", "--json", str(tensor_dataset)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)["parse_example_spec"]
    assert spec["image"] == "tf.io.FixedLenFeature([2, 3], tf.float32)"
    assert spec["volume"] == "tf.io.FixedLenFeature([2, 2, 2], tf.int64)"
    assert spec == read_manifest(str(tensor_dataset)).to_dict()["parse_example_spec"]
