"""A JSON lines build on the multi-process DirectRunner: the same dataset as in process, and the same shards as Parquet;
ORC and Avro builds there give those shards too (their pieces and readers cross to worker processes), and so does
the Parquet build's own dataset read back as input.format tfrecord.

The demo flights (native lists, nulls, a few null labels that become dead letters) are written as
gzip JSON lines by the json module, as Parquet and ORC by pyarrow and as Avro by fastavro; one
config (the format from the extension) builds them.
"""

from __future__ import annotations

import gzip
import json
import pathlib

import fastavro
import pyarrow.orc as porc
import pyarrow.parquet as pq
import pytest
import yaml

from tests.integration.test_runner_matrix import MULTI_PROCESSING, _dataset
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import demo_table

FEATURES = {
    "flight_id": {"type": "int64"}, "carrier": {"type": "bytes"}, "distance": {"type": "float"},
    "dep_delay": {"type": "float", "on_null": "omit"}, "tailnum": {"type": "bytes", "on_null": "default", "default": "UNKNOWN"},
    "cancelled": {"type": "int64"}, "embedding": {"type": "float"}, "tags": {"type": "bytes"},
    "label": {"type": "int64", "on_null": "error"},
}


AVRO_SCHEMA = {"type": "record", "name": "Flight", "fields": [
    {"name": "flight_id", "type": "long"}, {"name": "carrier", "type": "string"}, {"name": "origin", "type": "string"},
    {"name": "origin_city", "type": "string"}, {"name": "dest", "type": "string"}, {"name": "distance", "type": "double"},
    {"name": "dep_delay", "type": ["null", "double"]}, {"name": "tailnum", "type": ["null", "string"]},
    {"name": "cancelled", "type": "long"}, {"name": "embedding", "type": {"type": "array", "items": "float"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}}, {"name": "label", "type": ["null", "long"]}]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("formats")
    table = demo_table(3000)
    for name in ("jsonl", "parquet", "orc", "avro"):
        (directory / name).mkdir()
    for index, part in enumerate((table.slice(0, 1800), table.slice(1800))):
        text = "".join(json.dumps(row) + "\n" for row in part.to_pylist())
        (directory / "jsonl" / f"flights-{index}.jsonl.gz").write_bytes(gzip.compress(text.encode()))
        pq.write_table(part, directory / "parquet" / f"flights-{index}.parquet", row_group_size=500)
        porc.write_table(part, directory / "orc" / f"flights-{index}.orc", stripe_size=16384, batch_size=256)
        with open(directory / "avro" / f"flights-{index}.avro", "wb") as out:
            fastavro.writer(out, AVRO_SCHEMA, part.to_pylist(), sync_interval=8192, codec="deflate")
    return directory


def _build(inputs: pathlib.Path, pattern: str, name: str, *args: str) -> pathlib.Path:
    output = inputs / "out" / name
    config = inputs / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": str(inputs / pattern)}, "features": FEATURES, "shuffle": {"seed": 42},
        "splits": {"train": 0.9, "eval": 0.1}, "split_key": ["flight_id"],
        "output": {"path": str(output), "max_bytes_per_shard": "64KiB"},
        "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.01}}))
    assert build_main([str(config), "--quiet", *args]) == 0, f"{name} failed"
    return output


def test_jsonl_on_the_multi_process_direct_runner_gives_the_in_process_bytes_and_parquets(inputs):
    in_process = _dataset(_build(inputs, "jsonl/*.jsonl.gz", "jsonl-default"))
    multi = _dataset(_build(inputs, "jsonl/*.jsonl.gz", "jsonl-multi", *MULTI_PROCESSING))
    files, manifest = multi
    assert sorted(files) == sorted(in_process[0])
    assert [name for name in files if files[name] != in_process[0][name]] == []
    assert manifest == in_process[1]
    assert any(name.startswith("_errors/") for name in files)  # the null labels, as dead letters
    parquet, _ = _dataset(_build(inputs, "parquet/*.parquet", "parquet-default"))
    shards = {name: data for name, data in files.items() if name.endswith(".tfrecord")}
    assert len(shards) > 2 and shards == {name: data for name, data in parquet.items() if name.endswith(".tfrecord")}


@pytest.mark.parametrize("fmt", ["orc", "avro"])
def test_orc_and_avro_on_the_multi_process_direct_runner_give_the_parquet_shards(inputs, fmt):
    built, _ = _dataset(_build(inputs, f"{fmt}/*.{fmt}", f"{fmt}-multi", *MULTI_PROCESSING, "--set",
                               "input.split_bytes=32KiB"))
    parquet, _ = _dataset(_build(inputs, "parquet/*.parquet", "parquet-reference"))
    shards = {name: data for name, data in built.items() if name.endswith(".tfrecord")}
    assert len(shards) > 2 and shards == {name: data for name, data in parquet.items() if name.endswith(".tfrecord")}


def test_a_tfrecord_dataset_rebuilt_on_the_multi_process_direct_runner_gives_its_own_shards(inputs):
    """The Parquet build's dataset read back (input.format tfrecord, every split) with the same config gives its
    shards again: the shards cross to worker processes as pieces, the records are decoded there."""
    reference = _build(inputs, "parquet/*.parquet", "parquet-for-tfrecord")
    parquet, _ = _dataset(reference)
    built, _ = _dataset(_build(inputs, "out/parquet-for-tfrecord", "tfrecord-multi", *MULTI_PROCESSING, "--set",
                               "input.format=tfrecord"))
    shards = {name: data for name, data in built.items() if name.endswith(".tfrecord")}
    assert len(shards) > 2 and shards == {name: data for name, data in parquet.items() if name.endswith(".tfrecord")}
    assert not any(name.startswith("_errors/") for name in built)  # the bad rows stayed behind in the first build
