"""A JSON lines build on the multi-process DirectRunner: the same dataset as in process, and the same shards as Parquet.

The demo flights (native lists, nulls, a few null labels that become dead letters) are written as
gzip JSON lines by the json module and as Parquet by pyarrow; one config (the format from the
extension) builds them.
"""

from __future__ import annotations

import gzip
import json
import pathlib

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


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("formats")
    table = demo_table(3000)
    (directory / "jsonl").mkdir()
    (directory / "parquet").mkdir()
    for index, part in enumerate((table.slice(0, 1800), table.slice(1800))):
        text = "".join(json.dumps(row) + "\n" for row in part.to_pylist())
        (directory / "jsonl" / f"flights-{index}.jsonl.gz").write_bytes(gzip.compress(text.encode()))
        pq.write_table(part, directory / "parquet" / f"flights-{index}.parquet", row_group_size=500)
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
