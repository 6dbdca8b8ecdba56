"""Avro inputs (fastavro): split at sync blocks, records numbered in the file, schemas resolved, damage named."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import pathlib

import apache_beam as beam
import fastavro
import pyarrow as pa
import pytest
import yaml
from apache_beam.testing.util import assert_that, equal_to

import tfrbeam.builder.inputs.avro as avro_read
from tfrbeam.builder.config.schema import InputConfig
from tfrbeam.builder.inputs.avro import (
    arrow_schema,
    avro_blocks,
    avro_input_schema,
    avro_schema,
    read_avro_blocks,
    read_avro_file,
)
from tfrbeam.builder.inputs.files import list_inputs
from tfrbeam.builder.inputs.read import ReadTabular
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import ConfigError, InputError, ParquetSchemaError

SCHEMA = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "name", "type": ["null", "string"], "default": None}]}


def write(path, records, schema=SCHEMA, **options) -> str:
    with open(path, "wb") as out:
        fastavro.writer(out, schema, records, **options)
    return str(path)


def records(count: int) -> list[dict]:
    return [{"id": n, "name": None if n % 7 == 0 else f"name-{n}"} for n in range(count)]


def read_pieces(path: str, split_bytes: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    size = len(open(path, "rb").read())
    pieces, total = avro_blocks(path, size, split_bytes)
    reader_schema = avro_schema(path)
    schema = arrow_schema(reader_schema, path)
    rows = []
    for offset, blocks, before in pieces:
        for source in read_avro_blocks(path, offset, blocks, before, reader_schema, schema, ["id"]):
            rows += list(zip(source.lines.tolist(), source.batch.column("id").to_pylist()))
    assert total == len(rows)
    return pieces, rows


@pytest.mark.parametrize("codec", ["null", "deflate", "bzip2"])
def test_a_large_file_is_cut_at_sync_blocks_and_every_record_keeps_its_number(tmp_path, codec):
    path = write(tmp_path / "a.avro", records(5000), sync_interval=2000, codec=codec)
    whole, rows = read_pieces(path, 1 << 30)
    assert len(whole) == 1 and rows == [(n + 1, n) for n in range(5000)]
    pieces, split_rows = read_pieces(path, 3000)
    assert len(pieces) > 3 and split_rows == rows
    assert [before for _, _, before in pieces] == sorted({before for _, _, before in pieces})


def test_read_tabular_spreads_the_pieces_and_reads_every_record_once(tmp_path):
    write(tmp_path / "a.avro", records(3000), sync_interval=1000)
    write(tmp_path / "b.avro", records(5))
    config = InputConfig(format="avro", path=str(tmp_path / "*.avro"), split_bytes=4000)
    with beam.Pipeline() as pipeline:
        batches = pipeline | ReadTabular(config, ["id", "name"])
        assert_that(batches | beam.FlatMap(lambda source: [(source.path.rsplit("/", 1)[1], line, row["id"])
                                                           for line, row in zip(source.lines.tolist(),
                                                                                source.batch.to_pylist())]),
                    equal_to([("a.avro", n + 1, n) for n in range(3000)] + [("b.avro", n + 1, n) for n in range(5)]))


def test_later_files_are_read_with_the_first_files_schema(tmp_path):
    write(tmp_path / "a.avro", records(3))
    narrow = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]}
    second = write(tmp_path / "b.avro", [{"id": 9}], schema=narrow)
    first_schema = avro_schema(str(tmp_path / "a.avro"))
    rows = [row for source in read_avro_file(second, arrow_schema(first_schema, second), first_schema)
            for row in source.batch.to_pylist()]
    assert rows == [{"id": 9, "name": None}]  # int promoted to long, the missing field read as its default
    text = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "string"}]}
    third = write(tmp_path / "c.avro", [{"id": "x"}], schema=text)
    with pytest.raises(InputError) as raised:
        list(read_avro_file(third, arrow_schema(first_schema, third), first_schema))
    assert str(third) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_a_cut_file_is_one_line_naming_it_never_a_short_dataset(tmp_path, cut):
    data = io.BytesIO()
    fastavro.writer(data, SCHEMA, records(4000), sync_interval=1000)
    path = tmp_path / "cut.avro"
    path.write_bytes(data.getvalue()[:int(len(data.getvalue()) * cut)])
    with pytest.raises(InputError) as raised:
        avro_blocks(str(path), path.stat().st_size, 1 << 30)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_logical_types_map_to_arrow_and_infer_config_reads_them(tmp_path):
    schema = {"type": "record", "name": "Row", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "scores", "type": {"type": "array", "items": "float"}},
        {"name": "label", "type": ["null", "int"]}]}
    row = {"at": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), "day": datetime.date(2024, 1, 2),
           "price": decimal.Decimal("12.34"), "kind": "B", "scores": [0.5, 1.5], "label": None}
    path = write(tmp_path / "t.avro", [row], schema=schema)
    arrow = arrow_schema(avro_schema(path), path)
    assert arrow.field("at").type == pa.timestamp("ms", "UTC") and arrow.field("day").type == pa.date32()
    assert arrow.field("price").type == pa.decimal128(6, 2) and arrow.field("kind").type == pa.string()
    assert arrow.field("label").nullable and arrow.field("label").type == pa.int32()
    config = yaml.safe_load(infer_config(path))
    features = config["features"]
    assert {name: spec["type"] for name, spec in features.items()} == {
        "at": "int64", "day": "int64", "price": "float", "kind": "bytes", "scores": "float", "label": "int64"}
    assert features["label"]["on_null"] == "omit"
    config["output"] = {"path": str(tmp_path / "out"), "num_shards": 1}
    (tmp_path / "build.yaml").write_text(yaml.safe_dump(config))
    assert build_main([str(tmp_path / "build.yaml"), "--quiet"]) == 0
    assert [read for source in read_avro_file(path, arrow) for read in source.batch.to_pylist()] == [row]


def test_a_union_of_two_types_is_one_line_naming_the_field(tmp_path):
    schema = {"type": "record", "name": "Row", "fields": [{"name": "v", "type": ["null", "long", "string"]}]}
    path = write(tmp_path / "u.avro", [{"v": 1}], schema=schema)
    with pytest.raises(InputError, match=r"field 'v' is an Avro union of \['null', 'long', 'string'\]"):
        arrow_schema(avro_schema(path), path)


def test_a_record_that_holds_itself_is_one_line_naming_the_field(tmp_path):
    schema = {"type": "record", "name": "Node", "fields": [{"name": "v", "type": "long"},
                                                           {"name": "next", "type": ["null", "Node"]}]}
    path = write(tmp_path / "n.avro", [{"v": 1, "next": {"v": 2, "next": None}}], schema=schema)
    with pytest.raises(InputError, match=r"field 'next' is of the Avro record 'Node' that holds itself"):
        arrow_schema(avro_schema(path), path)


def test_without_fastavro_the_reader_says_how_to_install_it(monkeypatch):
    real = avro_read.importlib.import_module

    def refuse(name, *args):
        if name == "fastavro":
            raise ImportError("No module named 'fastavro'")
        return real(name, *args)

    monkeypatch.setattr(avro_read.importlib, "import_module", refuse)
    with pytest.raises(ConfigError, match=r"^input.format: avro needs the fastavro package, which is not installed: "
                                          r"pip install 'tfrbeam\[avro\]'$"):
        avro_read.fastavro_module()


def test_bad_rows_name_the_file_and_the_record_number(tmp_path):
    path = write(tmp_path / "rows.avro", records(30), sync_interval=100)
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": path}, "output": {"path": str(tmp_path / "out"), "num_shards": 1},
        "features": {"id": {"type": "int64"}, "name": {"type": "bytes", "on_null": "error"}},
        "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}}))
    assert build_main([str(config), "--quiet"]) == 0
    letters = [json.loads(line) for file in (tmp_path / "out" / "_errors").rglob("*") if file.is_file()
               for line in file.read_text().splitlines()]
    assert sorted((letter["file"], letter["line"]) for letter in letters) == [(path, n + 1) for n in range(0, 30, 7)]


def test_only_the_fields_read_are_decoded_and_named_types_survive_the_projection(tmp_path, monkeypatch):
    schema = {"type": "record", "name": "Row", "fields": [
        {"name": "first", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "id", "type": "long"}, {"name": "second", "type": "Kind"}]}
    path = write(tmp_path / "k.avro", [{"first": "A", "id": 1, "second": "B"}], schema=schema)
    reader_schema = avro_schema(path)
    arrow = arrow_schema(reader_schema, path)
    (offset, blocks, before), = avro_blocks(path, pathlib.Path(path).stat().st_size, 1 << 30)[0]
    seen = []
    real = fastavro.block_reader
    monkeypatch.setattr(fastavro, "block_reader", lambda raw, **options: seen.append(options) or real(raw, **options))

    def rows(columns):
        return [row for source in read_avro_blocks(path, offset, blocks, before, reader_schema, arrow, columns)
                for row in source.batch.to_pylist()]

    assert rows(["id"]) == [{"id": 1}]
    assert [field_["name"] for field_ in seen[-1]["reader_schema"]["fields"]] == ["id"]
    assert rows(["second"]) == [{"second": "B"}]  # Kind is defined by the left-out field: read with the whole schema
    assert len(seen[-1]["reader_schema"]["fields"]) == 3


def test_every_header_is_checked_at_plan_time_against_the_first_files_schema(tmp_path):
    wide = write(tmp_path / "a.avro", records(2))
    narrow = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]}
    write(tmp_path / "b.avro", [{"id": 9}], schema=narrow)
    assert avro_input_schema(list_inputs(str(tmp_path / "*.avro"))) == arrow_schema(avro_schema(wide), wide)
    (tmp_path / "a.avro").rename(tmp_path / "c.avro")  # now the narrow file comes first
    with pytest.raises(ParquetSchemaError) as raised:
        avro_input_schema(list_inputs(str(tmp_path / "*.avro")))
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'c.avro'}: field 'id' is int64 but {tmp_path / 'b.avro'} has it as int32")
    assert "\n" not in message
    text = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "string"}]}
    write(tmp_path / "d.avro", [{"id": "x"}], schema=text)
    with pytest.raises(ParquetSchemaError, match=r"d\.avro: column 'id' is string"):
        avro_input_schema(list_inputs(str(tmp_path / "*.avro")), ["id"])
