"""Builds with their input, their output or both in a bucket (issue 41, item 2): SequenceExample builds, ``from_file``
features whose files are objects, TFRecord inputs, and a prefix given with or without its trailing slash.

The servers are real (tests/storage_servers.py). Each test reads what the build wrote back from the bucket with the
server's own client (never through tfrbeam's reader) and compares it with what went in; the bucket's objects outside
the output prefix are listed with their hashes before and after and must not change.
"""

from __future__ import annotations

import io
import json
import os
import pathlib

import numpy as np
import pyarrow as pa
import pytest
import yaml

import tfrbeam
from tests.builder.pipeline.sequence_oracle import check_manifest_counts, decoded, oracle
from tests.builder.pipeline.test_sequence_build import _aircraft_table
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import aircraft_flights_table, write_demo_data
from tfrbeam.codec.example import decode_example
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.tfrecord.records import read_records

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SEQUENCE_KINDS = {"tailnum": "bytes", "carrier": "bytes", "sched_dep": "int64", "origin": "bytes", "dest": "bytes",
                  "distance": "float", "dep_delay": "float"}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("object-store-builds") / "demo_data"
    write_demo_data(str(directory))
    return directory


def _build(workdir: pathlib.Path, config: dict, bucket, *args: str) -> int:
    """``tfrbeam build`` in this process, from ``workdir``, with the store's own Beam options."""
    path = workdir / "build.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        return build_main([str(path), "--quiet", *args, *bucket.pipeline_args()])
    finally:
        os.chdir(previous)


def _outside(listing: dict[str, str], prefix: str) -> dict[str, str]:
    return {key: digest for key, digest in listing.items() if not key.startswith((prefix + "/", f".{prefix}."))}


def _bucket_dataset(bucket, key: str) -> tuple[dict, dict[str, list[bytes]]]:
    """The manifest at ``key`` and every split's records, each shard fetched with the server's own client."""
    manifest = json.loads(bucket.get(f"{key}/{MANIFEST_NAME}"))
    records = {name: [record for shard in split["shards"]
                      for record in read_records(io.BytesIO(bucket.get(f"{key}/{shard['path']}")), compression=None)]
               for name, split in manifest["splits"].items()}
    return manifest, records


def _local_dataset(path: pathlib.Path) -> tuple[dict, dict[str, list[bytes]]]:
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    records = {name: [record for shard in split["shards"] for record in read_records(str(path / shard["path"]))]
               for name, split in manifest["splits"].items()}
    return manifest, records


def _upload_file(bucket, local: pathlib.Path, key: str) -> str:
    bucket.put(key, local.read_bytes())
    return bucket.url(key)


# ----------------------------------------------------------------------- SequenceExample builds


def _sequence_config(input_path: str, output_path: str) -> dict:
    config = yaml.safe_load((REPO_ROOT / "configs" / "sequence_example.yaml").read_text())
    config["input"]["path"] = input_path
    config["output"]["path"] = output_path
    return config


@pytest.mark.parametrize("where", ["bucket-to-bucket", "local-to-bucket", "bucket-to-local"])
def test_a_sequence_example_build_with_input_or_output_in_a_bucket(bucket, demo_data, tmp_path, where):
    """configs/sequence_example.yaml with its CSV, its output or both in the bucket: the SequenceExamples read back
    are the independent oracle's (tests/builder/pipeline/sequence_oracle.py), with every count of the manifest; the bucket's
    other objects are unchanged."""
    csv = demo_data / "sequences" / "flights-by-aircraft.csv"
    input_path = _upload_file(bucket, csv, "in/flights.csv") if where.startswith("bucket") else str(csv)
    output_path = bucket.url("seq") if where.endswith("bucket") else str(tmp_path / "seq")
    bucket.put("elsewhere/keep.txt", b"a user's object")
    before = bucket.listing()
    assert _build(tmp_path, _sequence_config(input_path, output_path), bucket) == 0
    manifest, records = (_bucket_dataset(bucket, "seq") if where.endswith("bucket")
                         else _local_dataset(tmp_path / "seq"))
    expected = oracle(_aircraft_table(), SEQUENCE_KINDS, {"train": 0.8, "eval": 0.2}, ["tailnum"], ["sched_dep"],
                      ["carrier"], max_steps=32, min_steps=3)
    assert sorted(records) == sorted(expected.splits)
    for split, counts in expected.splits.items():
        assert decoded(records[split]) == decoded(counts.examples), split
    check_manifest_counts(manifest, expected, rows_read=aircraft_flights_table().num_rows, bad_rows=0)
    assert _outside(bucket.listing(), "seq") == before


# ----------------------------------------------------------------------- from_file features


def _objects_for_files(bucket, count: int) -> dict[str, bytes]:
    """``count`` objects of distinct bytes (some empty, some 1 MiB) under files/ in the bucket: key -> bytes."""
    rng = np.random.default_rng(7)
    objects = {}
    for index in range(count):
        size = 0 if index % 7 == 0 else (1 << 20 if index % 5 == 0 else int(rng.integers(1, 5000)))
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        key = f"files/part-{index // 10}/file-{index}.bin"
        bucket.put(key, data)
        objects[key] = data
    return objects


def test_from_file_features_read_their_files_from_the_bucket(bucket, tmp_path):
    """A column of gs:// or s3:// URLs and of paths relative to the table (itself in the bucket) becomes the objects'
    very bytes; a URL that names no object is a dead letter naming it; the bucket is unchanged."""
    table_in_bucket = True
    objects = _objects_for_files(bucket, 40)
    keys = sorted(objects)
    rows = []
    for index, key in enumerate(keys):
        relative = table_in_bucket and index % 2 == 1
        rows.append((index, key[len("files/"):] if relative else bucket.url(key)))
    missing = bucket.url("files/no-such-object.bin")
    rows.append((len(keys), missing))
    csv_text = "id,path\n" + "".join(f"{index},{path}\n" for index, path in rows)
    if table_in_bucket:
        bucket.put("files/table.csv", csv_text.encode())
        input_path = bucket.url("files/table.csv")
    else:
        (tmp_path / "table.csv").write_text(csv_text)
        input_path = str(tmp_path / "table.csv")
    before = bucket.listing()
    config = {"input": {"path": input_path, "format": "csv"},
              "features": {"id": {"type": "int64"}, "blob": {"source": "path", "from_file": True}},
              "splits": {"train": 1.0}, "output": {"path": str(tmp_path / "out"), "num_shards": 2},
              "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}}
    assert _build(tmp_path, config, bucket) == 0
    manifest, records = _local_dataset(tmp_path / "out")
    found = {}
    for record in records["train"]:
        example = decode_example(record)
        found[example["id"][0]] = example["blob"][0] if example["blob"] else b""
    assert found == {index: objects[key] for index, key in enumerate(keys)}
    assert manifest["bad_records"]["count"] == 1
    letters = [json.loads(line) for path in sorted((tmp_path / "out" / "_errors").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(letters) == 1 and "files/no-such-object.bin" in letters[0]["reason"]
    assert bucket.listing() == before


# ----------------------------------------------------------------------- TFRecord inputs


def _rows(count: int, offset: int = 0) -> pa.Table:
    return pa.table({"id": np.arange(offset, offset + count, dtype=np.int64),
                     "x": np.linspace(0, 1, count, dtype=np.float32),
                     "name": [f"row {i}" for i in range(offset, offset + count)],
                     "tags": [list(range(i % 4)) for i in range(count)]})


def _id_rows(records: list[bytes]) -> dict[int, dict]:
    return {example["id"][0]: example for example in map(decode_example, records)}


@pytest.mark.parametrize("output_in_bucket", [True, False])
def test_a_build_from_a_tfrecord_dataset_in_a_bucket(bucket, tmp_path, output_in_bucket):
    """input.format tfrecord on a tfrbeam dataset in the bucket (written there by write_dataset): the rows read back
    from the new dataset are the rows of the table that went in; the bucket outside the output is unchanged."""
    table = _rows(3000)
    assert tfrbeam.write_dataset(table, bucket.url("source"), splits={"train": 0.7, "eval": 0.3}, num_shards=3,
                                 seed=5, progress=False, pipeline_options=bucket.pipeline_args()) is not None
    before = bucket.listing()
    output = bucket.url("rebuilt") if output_in_bucket else str(tmp_path / "rebuilt")
    config = {"input": {"path": bucket.url("source"), "format": "tfrecord"},
              "splits": {"train": 0.5, "eval": 0.5}, "output": {"path": output, "num_shards": 2}}
    assert _build(tmp_path, config, bucket) == 0
    _, records = _bucket_dataset(bucket, "rebuilt") if output_in_bucket else _local_dataset(tmp_path / "rebuilt")
    got = _id_rows([record for split in records.values() for record in split])
    assert sorted(got) == list(range(3000))
    for row in table.to_pylist():
        example = got[row["id"]]
        assert example["name"] == [row["name"].encode()] and example["tags"] == row["tags"]
        assert np.float32(example["x"][0]) == np.float32(row["x"])
    assert _outside(bucket.listing(), "rebuilt") == before


def test_a_build_from_a_glob_of_tfrecord_files_in_a_bucket(bucket, tmp_path):
    """Plain TFRecord files of Examples in the bucket (no manifest), named by a glob: every record is a row."""
    local = tmp_path / "plain"
    tfrbeam.write_dataset(_rows(900), str(local), splits={"train": 1.0}, num_shards=3, seed=1, progress=False)
    for shard in sorted((local / "train").glob("*.tfrecord")):
        bucket.put(f"plain/{shard.name}", shard.read_bytes())
    config = {"input": {"path": bucket.url("plain/*.tfrecord"), "format": "tfrecord"},
              "features": {"id": {"type": "int64"}, "name": {"type": "bytes"}},
              "splits": {"train": 1.0}, "output": {"path": bucket.url("out"), "num_shards": 1}}
    assert _build(tmp_path, config, bucket) == 0
    _, records = _bucket_dataset(bucket, "out")
    got = _id_rows(records["train"])
    assert sorted(got) == list(range(900))
    assert all(got[i]["name"] == [f"row {i}".encode()] for i in range(900))


# ----------------------------------------------------------------------- a prefix with or without its slash


def test_an_output_and_input_prefix_with_a_trailing_slash_is_the_same_prefix(bucket, tmp_path):
    """``gs://b/dir/`` and ``gs://b/dir`` name one dataset: a build into either writes the same objects under dir/
    (no empty-named part, no object named ``dir/``), the second replaces the first's, and either names it as input."""
    table = _rows(400)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    config = {"input": {"path": str(tmp_path / "rows.jsonl")}, "splits": {"train": 1.0},
              "output": {"path": bucket.url("dir") + "/", "num_shards": 2}}
    assert _build(tmp_path, config, bucket) == 0
    first = bucket.listing()
    assert f"dir/{MANIFEST_NAME}" in first
    assert not [key for key in first if "//" in key or key.endswith("/") or key.startswith(".dir")], sorted(first)
    config["output"]["path"] = bucket.url("dir")
    assert _build(tmp_path, config, bucket, "--overwrite") == 0
    second = bucket.listing()
    manifest = json.loads(bucket.get(f"dir/{MANIFEST_NAME}"))
    listed = {f"dir/{shard['path']}" for split in manifest["splits"].values() for shard in split["shards"]}
    assert sorted(key for key in second if key.endswith(".tfrecord")) == sorted(listed)  # the first's are gone
    assert not [key for key in second if "//" in key or key.endswith("/") or key.startswith(".dir")], sorted(second)
    for input_path in (bucket.url("dir"), bucket.url("dir") + "/"):
        config = {"input": {"path": input_path, "format": "tfrecord"}, "splits": {"train": 1.0},
                  "output": {"path": str(tmp_path / f"copy{len(input_path)}"), "num_shards": 1}}
        assert _build(tmp_path, config, bucket) == 0, input_path
        _, records = _local_dataset(tmp_path / f"copy{len(input_path)}")
        assert sorted(_id_rows(records["train"])) == list(range(400)), input_path
