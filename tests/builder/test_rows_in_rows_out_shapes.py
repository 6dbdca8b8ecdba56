"""Rows in = rows out over the shapes real data has: every row becomes one record with its values exact.

Property tests (the fixed hypothesis profile of tests/conftest.py, few examples each: every one runs
a build) over chunked tables with empty chunks and sliced arrays, RecordBatchReaders of many
batches, Parquet of many row groups and pages, multi-stripe ORC, multi-block Avro, CSV with quoted
line breaks across pieces and read blocks, JSON lines with long lines at range boundaries, and the
compressed variants of the files.
"""

from __future__ import annotations

import gzip
import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.orc as porc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import tfrbeam
from tfrbeam.builder.running.launch import run
from tfrbeam.codec.example import decode_example
from tfrbeam.tfrecord.records import read_records

FEW = settings(max_examples=4)
TEXT = st.text(st.sampled_from("ab ,;\"'\n\té€"), min_size=0, max_size=12)


def rows_table(count: int, texts: list[str] | None = None) -> pa.Table:
    """id, a text (prefixed: never empty and never a null token) and a float, per row."""
    ids = np.arange(count, dtype=np.int64)
    texts = texts if texts is not None else [f"row {i}" for i in range(count)]
    return pa.table({"id": ids, "text": [f"t{texts[i % len(texts)] if texts else ''}{i}" for i in range(count)],
                     "value": ids * 0.25 - 3.0})


def records_of(dataset: pathlib.Path) -> list[dict]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return [decode_example(record) for split in manifest["splits"].values() for shard in split["shards"]
            for record in read_records(str(dataset / shard["path"]))]


def assert_exact(dataset: pathlib.Path, table: pa.Table) -> None:
    """One record per row, each with the row's id, text and value (as the Example's float32) exactly."""
    records = sorted(records_of(dataset), key=lambda record: int(record["id"][0]))
    assert len(records) == table.num_rows
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    assert manifest["rows_read"] == table.num_rows and manifest["bad_records"]["count"] == 0
    for record, row in zip(records, table.to_pylist()):
        assert int(record["id"][0]) == row["id"]
        assert record["text"] == [row["text"].encode("utf-8")]
        assert record["value"] == [float(np.float32(row["value"]))]


def build(tmp_path: pathlib.Path, path: pathlib.Path | str, fmt: str, name: str = "out", **input_settings) -> pathlib.Path:
    out = tmp_path / name
    config = {"input": {"path": str(path), "format": fmt, **input_settings}, "output": {"path": str(out)},
              "splits": {"train": 0.5, "eval": 0.5},
              "features": {"id": {"type": "int64"}, "text": {"type": "bytes"}, "value": {"type": "float"}}}
    run(config, overwrite=True, progress=False)
    return out


def fresh(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("shape")


# ------------------------------------------------------------------------------------------ in memory


@FEW
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6), offset=st.integers(0, 5))
def test_chunked_tables_with_empty_chunks_and_sliced_arrays(tmp_path_factory, sizes, offset):
    whole = rows_table(sum(sizes) + offset + 1)
    chunks, start = [], offset
    for size in sizes:  # each chunk a slice of the arrays (an offset into their buffers); size 0: an empty chunk
        chunks.append(whole.slice(start, size))
        start += size
    table = pa.concat_tables(chunks)
    expected = whole.slice(offset, sum(sizes))
    tmp_path = fresh(tmp_path_factory)
    if table.num_rows == 0:
        return
    tfrbeam.write_dataset(table, tmp_path / "out", splits={"train": 0.5, "eval": 0.5}, progress=False,
                          features={"id": "int64", "text": "bytes", "value": "float"})
    assert_exact(tmp_path / "out", expected.rename_columns(["id", "text", "value"]))


@FEW
@given(sizes=st.lists(st.integers(0, 200), min_size=2, max_size=30))
def test_record_batch_readers_of_many_batches(tmp_path_factory, sizes):
    table = rows_table(sum(sizes))
    if table.num_rows == 0:
        return
    batches, start = [], 0
    for size in sizes:
        batches.append(table.slice(start, size).combine_chunks().to_batches()[0] if size else
                       pa.RecordBatch.from_pylist([], schema=table.schema))
        start += size
    reader = pa.RecordBatchReader.from_batches(table.schema, batches)
    tmp_path = fresh(tmp_path_factory)
    tfrbeam.write_dataset(reader, tmp_path / "out", splits={"train": 0.5, "eval": 0.5}, progress=False)
    assert_exact(tmp_path / "out", table)


# ---------------------------------------------------------------------------------------- typed files


@FEW
@given(rows=st.integers(1, 3000), group=st.integers(1, 700), page=st.sampled_from([64, 1024]),
       compression=st.sampled_from(["none", "snappy", "zstd", "gzip"]))
def test_parquet_of_many_row_groups_and_pages(tmp_path_factory, rows, group, page, compression):
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows)
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=group, data_page_size=page,
                   compression=compression)
    assert pq.ParquetFile(tmp_path / "rows.parquet").metadata.num_row_groups == -(-rows // group)
    assert_exact(build(tmp_path, tmp_path / "rows.parquet", "parquet"), table)


@FEW
@given(rows=st.integers(1, 20000), compression=st.sampled_from(["uncompressed", "zlib", "zstd"]))
def test_orc_of_many_stripes(tmp_path_factory, rows, compression):
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows)
    porc.write_table(table, str(tmp_path / "rows.orc"), stripe_size=4096, compression=compression)
    assert_exact(build(tmp_path, tmp_path / "rows.orc", "orc"), table)


def test_orc_of_many_stripes_is_split_in_stripes(tmp_path):
    table = rows_table(20000)
    porc.write_table(table, str(tmp_path / "rows.orc"), stripe_size=4096)
    assert porc.ORCFile(str(tmp_path / "rows.orc")).nstripes > 3
    assert_exact(build(tmp_path, tmp_path / "rows.orc", "orc"), table)


@FEW
@given(rows=st.integers(1, 3000), interval=st.sampled_from([256, 2048]), codec=st.sampled_from(["null", "deflate"]),
       split=st.sampled_from([1024, 64 << 20]))
def test_avro_of_many_blocks(tmp_path_factory, rows, interval, codec, split):
    fastavro = pytest.importorskip("fastavro")
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows)
    schema = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "text", "type": "string"},
                                                          {"name": "value", "type": "double"}]}
    with open(tmp_path / "rows.avro", "wb") as handle:
        fastavro.writer(handle, fastavro.parse_schema(schema), table.to_pylist(), codec=codec, sync_interval=interval)
    assert_exact(build(tmp_path, tmp_path / "rows.avro", "avro", split_bytes=split), table)


# ----------------------------------------------------------------------------------------- text files


def _csv_bytes(table: pa.Table) -> bytes:
    text = io.BytesIO()
    pacsv.write_csv(table, text, pacsv.WriteOptions(quoting_style="needed"))
    return text.getvalue()


@FEW
@given(texts=st.lists(TEXT, min_size=1, max_size=20), rows=st.integers(1, 2000), split=st.sampled_from([512, 4096]),
       compressed=st.booleans())
def test_csv_with_quoted_line_breaks_across_pieces(tmp_path_factory, texts, rows, split, compressed):
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows, texts)
    data = _csv_bytes(table)
    name = "rows.csv.gz" if compressed else "rows.csv"
    (tmp_path / name).write_bytes(gzip.compress(data) if compressed else data)
    assert_exact(build(tmp_path, tmp_path / name, "csv", split_bytes=split), table)


def test_csv_with_a_quoted_line_break_across_pyarrows_read_block(tmp_path):
    """Rows of quoted line breaks around pyarrow's 4 MiB CSV block: read whole, block by block."""
    table = rows_table(110_000, ["a\nb,\"c\"" + "x" * 20])
    data = _csv_bytes(table)
    assert len(data) > 4 << 20 and b'"' in data
    (tmp_path / "rows.csv").write_bytes(data)
    assert_exact(build(tmp_path, tmp_path / "rows.csv", "csv"), table)


def _jsonl_bytes(table: pa.Table, long_every: int) -> bytes:
    lines = []
    for number, row in enumerate(table.to_pylist()):
        line = json.dumps(row, ensure_ascii=False)
        lines.append(line)
        if long_every and number % long_every == 0:
            lines.append("")  # a blank line: no row
    return ("\n".join(lines) + "\n").encode("utf-8")


@FEW
@given(rows=st.integers(1, 1500), long_text=st.integers(0, 3000), split=st.sampled_from([700, 4096]),
       long_every=st.integers(0, 50), compressed=st.booleans())
def test_json_lines_with_long_lines_at_range_boundaries(tmp_path_factory, rows, long_text, split, long_every,
                                                          compressed):
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows, ["x" * long_text, "short", "é€" * (long_text // 3)])
    data = _jsonl_bytes(table, long_every)
    name = "rows.jsonl.gz" if compressed else "rows.jsonl"
    (tmp_path / name).write_bytes(gzip.compress(data) if compressed else data)
    assert_exact(build(tmp_path, tmp_path / name, "jsonl", split_bytes=split), table)


@FEW
@given(rows=st.integers(1, 3000), compression=st.sampled_from([None, "gzip", "zlib"]), split=st.sampled_from([1024, 64 << 20]))
def test_tfrecord_files_of_a_dataset_and_their_compressed_variants(tmp_path_factory, rows, compression, split):
    tmp_path = fresh(tmp_path_factory)
    table = rows_table(rows)
    tfrbeam.write_dataset(table, tmp_path / "first", splits={"train": 1.0}, num_shards=2, compression=compression,
                          progress=False)
    assert_exact(build(tmp_path, tmp_path / "first", "tfrecord", split_bytes=split), table)
