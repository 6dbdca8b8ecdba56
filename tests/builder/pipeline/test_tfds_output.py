"""``output.tfds``: a build TFDS loads with ``tfds.builder_from_directory``, checked with real TFDS and TensorFlow.

TensorFlow and TFDS run in a throwaway venv (tests/tf_venv.py). For the demo build and a table given to
``write_dataset``, TFDS's ``train[:10%]`` must be exactly our split's first 10 % of records (TFDS's rounding),
with the split sizes and shard lengths of our manifest and a working ``len()``; TensorFlow's ``parse_example``
with the spec ``tfrbeam inspect`` prints must read the same values.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import tfrbeam
from tests.tf_venv import run_in_tf_venv, tf_venv_python
from tfrbeam.codec.example import decode_example
from tfrbeam.layout.manifest import read_manifest
from tfrbeam.tfrecord.records import read_records

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]

TFDS_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

directory, split, spec_text = sys.argv[1], sys.argv[2], sys.argv[3]
builder = tfds.builder_from_directory(directory)
dataset = builder.as_dataset(split=split)

def plain(value):
    value = np.asarray(value)
    if value.dtype.kind in "SO":
        return [item.hex() for item in value.reshape(-1).tolist()] if value.ndim else value.item().hex()
    return value.tolist()

records = [{name: plain(value) for name, value in example.items()} for example in tfds.as_numpy(dataset)]
spec = {name: eval(text, {"tf": tf}) for name, text in json.loads(spec_text).items()}
raw = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(f"{directory}/{split.split('[')[0]}/*.tfrecord")))
parsed = []
for serialized in raw.take(len(records)):
    example = tf.io.parse_single_example(serialized, spec)
    parsed.append({name: plain(tf.sparse.to_dense(value) if isinstance(value, tf.sparse.SparseTensor) else value)
                   for name, value in example.items()})
print(json.dumps({
    "splits": {name: {"num_examples": info.num_examples, "shard_lengths": list(info.shard_lengths),
                      "num_bytes": info.num_bytes} for name, info in builder.info.splits.items()},
    "len": len(dataset),
    "records": records,
    "parsed": parsed,
}))
"""


@pytest.fixture(scope="module")
def tf_python(request, tmp_path_factory) -> pathlib.Path:
    return tf_venv_python(request, tmp_path_factory)


def tfrbeam_cli(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", *args], cwd=cwd, capture_output=True, text=True)


def our_first_records(dataset: pathlib.Path, split: str, count: int) -> list[dict]:
    """The first ``count`` records of ``split`` in shard order, decoded by tfrbeam: what TFDS's ``[:N]`` reads."""
    manifest = read_manifest(str(dataset)).to_dict()
    records = []
    for shard in manifest["splits"][split]["shards"]:
        records.extend(read_records(str(dataset / shard["path"])))
    return [decode_example(record) for record in records[:count]]


def tfds_first_ten_percent(num_examples: int) -> int:
    return int(round(10 * num_examples / 100))


TFDS_MISSING = {"int64": -(1 << 63), "float": float(np.finfo(np.float32).min), "bytes": ""}  # TFDS's None, by dtype


def as_tfds_values(example: dict, features: dict) -> dict:
    """Our decoded example as TFDS gives it: an absent optional feature as TFDS's "None" (its dtype's minimum, or
    empty bytes, as TFDS's ``Tensor._default_value`` has it), bytes as hex."""
    values = {}
    for name, entry in features.items():
        present = example.get(name)
        if present is None or len(present) == 0:
            missing = TFDS_MISSING[entry["type"]]
            values[name] = [] if entry["shape"] is None else (
                missing if entry["shape"] == [] else np.full(entry["shape"], missing).tolist())
            continue
        items = [item.hex() for item in present] if entry["type"] == "bytes" else list(present)
        values[name] = items[0] if entry["shape"] == [] else items
    return values


def check_loaded_by_tfds(dataset: pathlib.Path, tf_python: pathlib.Path, split: str = "train") -> None:
    manifest = read_manifest(str(dataset)).to_dict()
    spec = manifest["parse_example_spec"]
    loaded = run_in_tf_venv(tf_python, TFDS_SCRIPT, str(dataset), f"{split}[:10%]", json.dumps(spec))
    for name, entry in manifest["splits"].items():
        assert loaded["splits"][name] == {"num_examples": entry["num_examples"], "num_bytes": entry["num_bytes"],
                                          "shard_lengths": [shard["num_examples"] for shard in entry["shards"]]}
    count = tfds_first_ten_percent(manifest["splits"][split]["num_examples"])
    assert loaded["len"] == count == len(loaded["records"])
    ours = [as_tfds_values(example, manifest["features"]) for example in our_first_records(dataset, split, count)]
    for theirs, parsed, mine in zip(loaded["records"], loaded["parsed"], ours, strict=True):
        for name in manifest["features"]:
            got = theirs[name]
            expected = pytest.approx(mine[name]) if manifest["features"][name]["type"] == "float" else mine[name]
            assert got == expected, (name, got, mine[name])
            if manifest["features"][name]["always_present"]:
                assert parsed[name] == got


def test_the_demo_build_with_output_tfds_loads_in_tfds_with_its_slices_sizes_and_len(tmp_path, tf_python):
    subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", "demo-data", "demo_data"], cwd=tmp_path, check=True,
                   capture_output=True)
    built = tfrbeam_cli("build", str(REPO_ROOT / "configs" / "demo.yaml"), "--set", "output.path=out/demo",
                        "--set", "output.tfds.name=demo", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    dataset = tmp_path / "out" / "demo"
    info = json.loads((dataset / "dataset_info.json").read_text())
    assert info["name"] == "demo" and info["version"] == "1.0.0" and info["fileFormat"] == "tfrecord"
    assert tfrbeam_cli("verify", str(dataset), cwd=tmp_path).returncode == 0
    check_loaded_by_tfds(dataset, tf_python)


def test_a_table_written_with_tfds_loads_in_tfds(tmp_path, tf_python):
    rows = 400
    table = pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "image/label": pa.array([i % 3 for i in range(rows)], pa.int64()),
        "tokens": pa.array([list(range(i % 4)) for i in range(rows)], pa.list_(pa.int64())),
        "maybe": pa.array([None if i % 5 == 0 else i / 4 for i in range(rows)], pa.float64()),
        "vec": pa.array([[1.5, float(i), -2.0] for i in range(rows)], pa.list_(pa.float32(), 3)),
        "name": pa.array([f"row {i}" if i % 2 else None for i in range(rows)], pa.string()),
    })
    dataset = tmp_path / "ds"
    tfrbeam.write_dataset(table, str(dataset), splits={"train": 0.8, "eval": 0.2}, num_shards=3, seed=3,
                          tfds={"name": "rows", "version": "2.0.1"})
    assert json.loads((dataset / "dataset_info.json").read_text())["version"] == "2.0.1"
    check_loaded_by_tfds(dataset, tf_python)
    check_loaded_by_tfds(dataset, tf_python, split="eval")
