"""`export` writes text as Arrow `string`, as `cat` shows it as text: a bytes feature whose every value is UTF-8.

Measured (issue 42): every bytes feature became a `binary` column, names and carriers included.
A feature holding any value that is not UTF-8 stays `binary`, so no value is ever changed.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.example_builds import build_examples
from tfrbeam.beam.parquet_export import ExportToParquet
from tfrbeam.codec.encode import record_batch_to_examples
from tfrbeam.stats.export import export_to_parquet
from tfrbeam.tfrecord.records import RecordWriter

NOT_UTF8 = b"\xff\xfe\x00raw"


def _write(path, table: pa.Table) -> None:
    with RecordWriter(str(path)) as writer:
        writer.write_many(record_batch_to_examples(table))


@pytest.fixture
def files(tmp_path):
    """Three files of 3,000 rows: text, a list of text, optional text, and bytes that are text in the first two files
    only (one value of the last file's last row is not UTF-8)."""
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(3):
        rows = range(index * 3000, (index + 1) * 3000)
        blobs = [f"blob-{row}".encode() for row in rows]
        if index == 2:
            blobs[-1] = NOT_UTF8
        _write(folder / f"part-{index}.tfrecord", pa.table({
            "name": pa.array([f"名前-{row}" for row in rows], pa.binary()),
            "tags": pa.array([[f"t{row % 7}", "ü"] for row in rows], pa.list_(pa.binary())),
            "note": pa.array([None if row % 3 else f"note {row}" for row in rows], pa.binary()),
            "blob": pa.array(blobs, pa.binary()),
            "n": pa.array(list(rows), pa.int64()),
        }))
    return folder


def _types(path) -> dict[str, pa.DataType]:
    schema = pq.read_schema(path)
    return {name: schema.field(name).type for name in schema.names}


def _check(paths) -> None:
    for path in paths:
        types = _types(path)
        assert types["name"] == pa.string()
        assert types["tags"] == pa.list_(pa.string(), 2)  # two tags in every record
        assert types["note"] == pa.list_(pa.string())  # some records lack a note: a list
        assert types["blob"] == pa.binary()  # one value in all the files is not UTF-8: the whole column stays bytes
    tables = [pq.read_table(path) for path in paths]
    assert tables[0].column("name")[5].as_py() == "名前-5"
    assert tables[1].column("tags")[0].as_py() == ["t4", "ü"]
    assert tables[0].column("note").to_pylist()[:4] == [["note 0"], None, None, ["note 3"]]
    assert tables[2].column("blob")[-1].as_py() == NOT_UTF8
    assert tables[0].column("blob")[0].as_py() == b"blob-0"


def test_export_writes_text_features_as_string_and_bytes_as_binary(files, tmp_path):
    _check(sorted(export_to_parquet(str(files / "*.tfrecord"), str(tmp_path / "out"))))


def test_beam_export_gives_the_same_schema(files, tmp_path):
    with beam.Pipeline() as pipeline:
        _ = pipeline | ExportToParquet(str(files / "*.tfrecord"), str(tmp_path / "beam"))
    _check(sorted((tmp_path / "beam").glob("*.parquet")))


def test_a_built_datasets_text_columns_export_as_string(tmp_path):
    dataset = build_examples(tmp_path, "demo.yaml")["demo"]
    [path] = export_to_parquet(str(dataset), str(tmp_path / "out"), splits=["eval"])
    types = _types(path)
    assert {name: types[name] for name in ("carrier", "origin", "dest", "tailnum")} == dict.fromkeys(
        ("carrier", "origin", "dest", "tailnum"), pa.string())
    assert types["flight_id"] == pa.int64() and types["embedding"] == pa.list_(pa.float32(), 4)
