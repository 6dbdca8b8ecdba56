"""``WriteExamples`` into a bucket on a real storage API (issue 41, item 2): dicts and Arrow record batches in, shards
of ``tf.train.Example`` out, read back with the server's own client and decoded independently of the sink.

(``WriteToTFRecord`` into a bucket: tests/beam/test_object_store_writes.py.)
"""

from __future__ import annotations

import io

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import tfrbeam
from tfrbeam.codec.example import decode_example
from tfrbeam.tfrecord.records import read_records

ROWS = 2500


def _rows() -> list[dict]:
    return [{"id": [i], "score": [i / 8], "name": [f"row {i}".encode()], "tags": list(range(i % 6))} for i in range(ROWS)]


def _batches(rows: list[dict], size: int) -> list[pa.RecordBatch]:
    table = pa.table({"id": [row["id"][0] for row in rows], "score": pa.array([row["score"][0] for row in rows], pa.float32()),
                      "name": [row["name"][0] for row in rows], "tags": [row["tags"] for row in rows]})
    return table.to_batches(max_chunksize=size)


def _shards(bucket, prefix: str) -> list[str]:
    return sorted(key for key in bucket.listing() if key.startswith(prefix))


def _decoded(bucket, keys: list[str]) -> dict[int, dict]:
    found = {}
    for key in keys:
        for record in read_records(io.BytesIO(bucket.get(key)), compression="gzip" if key.endswith(".gz") else None):
            example = decode_example(record)
            found[example["id"][0]] = example
    return found


@pytest.mark.parametrize("elements", ["dicts", "record batches"])
def test_write_examples_into_a_bucket_writes_every_row_once(bucket, elements):
    """WriteExamples('gs://b/examples/part', num_shards=3, .gz): three gzip shards whose Examples are the rows that
    went in, each once; no staging object or lock stays; the bucket's other objects are unchanged."""
    rows = _rows()
    bucket.put("examples-not/keep.bin", b"\x00 a user's object")
    before = bucket.listing()
    source = rows if elements == "dicts" else _batches(rows, 300)
    kinds = {"id": "int64", "score": "float", "name": "bytes", "tags": "int64"}
    with beam.Pipeline(options=PipelineOptions(bucket.pipeline_args())) as pipeline:
        _ = (pipeline | beam.Create(source, reshuffle=False)
             | tfrbeam.WriteExamples(bucket.url("examples/part"), kinds=kinds if elements == "dicts" else None,
                                     file_name_suffix=".tfrecord.gz", num_shards=3))
    after = bucket.listing()
    shards = [key for key in after if key.startswith("examples/")]
    assert shards == [f"examples/part-0000{i}-of-00003.tfrecord.gz" for i in range(3)], sorted(after)
    assert not [key for key in after if ".part.tfrbeam-" in key], "staging objects or the lock were left behind"
    assert {key: digest for key, digest in after.items() if not key.startswith("examples/")} == before
    found = _decoded(bucket, shards)
    assert sorted(found) == list(range(ROWS))
    for row in rows:
        example = found[row["id"][0]]
        assert example["name"] == row["name"] and example["tags"] == row["tags"]
        assert np.float32(example["score"][0]) == np.float32(row["score"][0])


def test_write_examples_into_a_prefix_that_already_holds_shards_replaces_them(bucket):
    """A second write into the same prefix with fewer shards: the earlier run's extra shard is gone, and what is
    read back is the second run's rows only."""
    for shards, offset in ((4, 0), (2, 10_000)):
        rows = [{"id": [offset + i], "name": [b"x"]} for i in range(500)]
        with beam.Pipeline(options=PipelineOptions(bucket.pipeline_args())) as pipeline:
            _ = pipeline | beam.Create(rows) | tfrbeam.WriteExamples(
                bucket.url("again/part"), kinds={"id": "int64", "name": "bytes"}, num_shards=shards)
    listed = _shards(bucket, "again/")
    keys = [key for key in listed if "/.tfrbeam-index/" not in key]
    assert keys == ["again/part-00000-of-00002", "again/part-00001-of-00002"]
    indexes = [key for key in listed if "/.tfrbeam-index/" in key]  # the read indexes of these shards only
    assert indexes and all(key.split("/")[-1].startswith(("part-00000-of-00002.", "part-00001-of-00002.")) for key in indexes)
    assert sorted(_decoded(bucket, keys)) == list(range(10_000, 10_500))
