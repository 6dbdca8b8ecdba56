"""One table written as CSV, Parquet, JSON lines, ORC and Avro by other tools builds byte-identical datasets.

CSV by Python's csv module, Parquet and ORC by pyarrow, JSON lines by the json module and by pandas,
Avro by fastavro; each built by ``tfrbeam build`` with its format inferred from the extension and its
features inferred from the file (no features: given), so both the readers and the inference agree.
"""

from __future__ import annotations

import csv
import gzip
import json
import pathlib

import fastavro
import pandas as pd
import pyarrow as pa
import pyarrow.orc as porc
import pyarrow.parquet as pq
import pytest
import yaml

from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.cli.build import main as build_main

ROWS = 300


def _rows() -> list[dict]:
    return [{"id": index, "label": index % 3, "score": round(index * 0.25 - 7.5, 2),
             "name": f"item-{index:04d}", "group": ["a", "b", "c", "d"][index % 4]} for index in range(ROWS)]


AVRO_SCHEMA = {"type": "record", "name": "Row", "fields": [
    {"name": "id", "type": "long"}, {"name": "label", "type": "long"}, {"name": "score", "type": "double"},
    {"name": "name", "type": "string"}, {"name": "group", "type": "string"}]}
TYPES = pa.schema([("id", pa.int64()), ("label", pa.int64()), ("score", pa.float64()), ("name", pa.string()),
                   ("group", pa.string())])


def write_all_formats(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """The same rows in every format, each written by a tool other than tfrbeam; the inputs by format."""
    rows = _rows()
    table = pa.Table.from_pylist(rows, schema=TYPES)
    paths = {}
    paths["csv"] = directory / "rows.csv"
    with open(paths["csv"], "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    paths["parquet"] = directory / "rows.parquet"
    pq.write_table(table, paths["parquet"], row_group_size=70)
    paths["jsonl"] = directory / "rows.jsonl"
    paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    paths["jsonl-pandas"] = directory / "rows-pandas.jsonl"
    pd.DataFrame(rows).to_json(paths["jsonl-pandas"], orient="records", lines=True)
    paths["jsonl.gz"] = directory / "rows.ndjson.gz"
    paths["jsonl.gz"].write_bytes(gzip.compress(paths["jsonl"].read_bytes()))
    paths["orc"] = directory / "rows.orc"
    porc.write_table(table, paths["orc"], stripe_size=1024, batch_size=50)
    paths["avro"] = directory / "rows.avro"
    with open(paths["avro"], "wb") as out:
        fastavro.writer(out, AVRO_SCHEMA, rows, sync_interval=1024, codec="deflate")
    return paths


def build(input_path: pathlib.Path, output: pathlib.Path, *args: str, config: dict | None = None) -> pathlib.Path:
    raw = config or {"input": {"path": str(input_path)}, "output": {"path": str(output), "num_shards": 3},
                     "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 7}}
    config_path = output.parent / f"{output.name}.yaml"
    config_path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    status = build_main([str(config_path), "--quiet", *args])
    assert status == 0, f"the build of {input_path} failed"
    return output


def shard_bytes(output: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() for path in sorted(output.rglob("*.tfrecord"))}


def test_every_format_builds_the_same_bytes_as_csv(tmp_path):
    paths = write_all_formats(tmp_path)
    assert sorted(paths) == ["avro", "csv", "jsonl", "jsonl-pandas", "jsonl.gz", "orc", "parquet"]
    assert porc.ORCFile(str(paths["orc"])).nstripes > 1  # read as several stripes
    with open(paths["avro"], "rb") as raw:
        assert sum(1 for _ in fastavro.block_reader(raw)) > 1  # and several blocks
    built = {name: shard_bytes(build(path, tmp_path / f"out-{name}")) for name, path in paths.items()}
    expected = built["csv"]
    assert len(expected) == 6 and all(expected.values())
    for name, shards in built.items():
        assert shards == expected, f"{name} differs from csv"


@pytest.mark.parametrize("name", ["jsonl", "orc", "avro"])
def test_infer_config_of_each_format_builds_as_csv_infers(tmp_path, name):
    """infer-config writes the features CSV inference finds, and its config builds."""
    paths = write_all_formats(tmp_path)
    text = infer_config(str(paths[name]))
    config = yaml.safe_load(text)
    assert config["input"]["format"] == name
    features = {key: value["type"] for key, value in config["features"].items()}
    assert features == {"id": "int64", "label": "int64", "score": "float", "name": "bytes", "group": "bytes"}
    config["output"] = {"path": str(tmp_path / "inferred"), "num_shards": 3}
    config.update(splits={"train": 0.8, "eval": 0.2}, shuffle={"seed": 7})
    inferred = build(paths[name], tmp_path / "inferred", config=config)
    assert shard_bytes(inferred) == shard_bytes(build(paths["csv"], tmp_path / "from-csv"))
