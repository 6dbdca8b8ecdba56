"""ORC inputs: one element per stripe numbered from the footer, the schema joined across files, bad rows by row."""

from __future__ import annotations

import json
import random

import apache_beam as beam
import pyarrow as pa
import pyarrow.orc as porc
import pytest
import yaml
from apache_beam.testing.util import assert_that, equal_to

import tfrbeam.builder.inputs.orc as orc_read
from tfrbeam.builder.config.schema import InputConfig
from tfrbeam.builder.inputs.files import list_inputs
from tfrbeam.builder.inputs.orc import orc_input_schema, read_orc_file, stripe_listing
from tfrbeam.builder.inputs.read import ReadTabular
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import InputError, ParquetSchemaError

TABLE = pa.table({"id": pa.array(range(1000), pa.int64()), "name": [f"n{i:04d}" for i in range(1000)]})
# Compressed stripes are cut at 64 KiB of compressed data: rows that do not compress away make several.
_RANDOM = random.Random(1)
WIDE = pa.table({"id": pa.array(range(20000), pa.int64()), "name": [f"{_RANDOM.getrandbits(64):x}" for _ in range(20000)]})


@pytest.mark.parametrize("compression", ["uncompressed", "zstd", "snappy", "zlib"])
def test_stripes_are_listed_from_the_footer_and_rows_keep_their_number(tmp_path, compression):
    path = tmp_path / "a.orc"
    porc.write_table(WIDE, path, stripe_size=4096, batch_size=256, compression=compression)
    stripes = porc.ORCFile(str(path)).nstripes
    assert stripes > 3
    listing = stripe_listing(str(path))
    assert [count for _, count, _ in listing] == [1] * stripes
    ids, lines = [], []
    for first, count, before in listing:
        for source in orc_read.read_orc_stripes(str(path), first, count, before, ["id"]):
            ids += source.batch.column("id").to_pylist()
            lines += source.lines.tolist()
            assert source.batch.schema.names == ["id"]
    assert ids == list(range(20000)) and lines == list(range(1, 20001))


class _WithoutFileTail:
    """An ORC reader as a pyarrow without ``serialized_file_tail`` has it: stripes readable, footer not to us."""

    def __init__(self, reader):
        self.reader = reader

    def __getattr__(self, name):
        if name == "serialized_file_tail":
            raise AttributeError(name)
        return getattr(self.reader, name)


def test_a_footer_that_cannot_be_read_makes_the_file_one_element(tmp_path, monkeypatch):
    path = tmp_path / "a.orc"
    porc.write_table(TABLE, path, stripe_size=2048, batch_size=64)
    opened = orc_read.orc_file

    def without_tail(*args):
        orc = opened(*args)
        orc.reader = _WithoutFileTail(orc.reader)
        return orc

    monkeypatch.setattr(orc_read, "orc_file", without_tail)
    listing = stripe_listing(str(path))
    assert listing == [(0, porc.ORCFile(str(path)).nstripes, 0)]
    rows = [(line, row) for source in read_orc_file(str(path)) for line, row in
            zip(source.lines.tolist(), source.batch.column("id").to_pylist())]
    assert rows == [(n + 1, n) for n in range(1000)]


def test_read_tabular_reads_each_stripe_as_its_own_piece(tmp_path):
    porc.write_table(TABLE, tmp_path / "a.orc", stripe_size=2048, batch_size=64)
    porc.write_table(TABLE.slice(0, 10), tmp_path / "b.orc")
    starts = [("a.orc", before + 1) for _, _, before in stripe_listing(str(tmp_path / "a.orc"))] + [("b.orc", 1)]
    assert len(starts) > 4
    read = ReadTabular(InputConfig(format="orc", path=str(tmp_path / "*.orc")), ["id"])
    with beam.Pipeline() as pipeline:
        batches = pipeline | read
        assert_that(batches | beam.Map(lambda source: (source.path.rsplit("/", 1)[1], source.first_line)),
                    equal_to(starts), label="one batch per stripe")
        assert_that(batches | beam.FlatMap(lambda source: source.batch.column("id").to_pylist()),
                    equal_to(list(range(1000)) + list(range(10))), label="rows")


def test_files_are_joined_by_lossless_widening_and_a_lossy_pair_is_one_line(tmp_path):
    porc.write_table(pa.table({"id": pa.array([1], pa.int32())}), tmp_path / "a.orc")
    porc.write_table(pa.table({"id": pa.array([2], pa.int64())}), tmp_path / "b.orc")
    assert orc_input_schema(list_inputs(str(tmp_path / "*.orc"))) == pa.schema([("id", pa.int64())])
    porc.write_table(pa.table({"id": pa.array(["x"])}), tmp_path / "c.orc")
    with pytest.raises(ParquetSchemaError) as raised:
        orc_input_schema(list_inputs(str(tmp_path / "*.orc")))
    assert str(tmp_path / "c.orc") in str(raised.value) and "\n" not in str(raised.value)


def test_a_file_that_is_not_orc_is_one_line_naming_it(tmp_path):
    path = tmp_path / "bad.orc"
    path.write_bytes(b"not an orc file at all")
    with pytest.raises(InputError, match=f"{path}: not a readable ORC file"):
        stripe_listing(str(path))


def test_bad_rows_name_the_file_and_the_row_number(tmp_path):
    table = pa.table({"id": pa.array([1, 2, None, 4, None], pa.int64())})
    porc.write_table(table, tmp_path / "rows.orc")
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump({
        "input": {"path": str(tmp_path / "rows.orc")}, "output": {"path": str(tmp_path / "out"), "num_shards": 1},
        "features": {"id": {"type": "int64", "on_null": "error"}},
        "errors": {"on_bad_record": "dead_letter", "max_bad_fraction": 0.5}}))
    assert build_main([str(config), "--quiet"]) == 0
    letters = [json.loads(line) for file in (tmp_path / "out" / "_errors").rglob("*") if file.is_file()
               for line in file.read_text().splitlines()]
    assert sorted((letter["file"], letter["line"]) for letter in letters) == [
        (str(tmp_path / "rows.orc"), 3), (str(tmp_path / "rows.orc"), 5)]
