"""ReadAllFromTFRecord(skip_corrupt=True) on TensorFlow's corrupted vectors, against counts from the files' structure.

The oracle walks each file with its own TFRecord framing code (crc32c straight from the crc32c
package, the mask from the format's definition), independent of tfrbeam.records:
- an uncompressed file is checked at the record offsets of the intact examples.tfrecord: a
  record whose header and payload CRCs verify is kept; each run of consecutive damaged records
  (CRC mismatch or cut by the end of the file) is one skip;
- a gzip file is decompressed as far as it goes: the complete records are kept, a partial
  record at the end is one skip, and a stream that ends before its trailer is one more.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import struct
import zlib

import apache_beam as beam
import crc32c
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from tfrbeam.beam import ReadAllFromTFRecord


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record_at(data: bytes, offset: int) -> tuple[bytes | None, int]:
    """(the payload if the record at ``offset`` verifies, else None; the offset after it as framed)."""
    header = data[offset:offset + 12]
    if len(header) < 12:
        return None, len(data)
    length, length_crc = struct.unpack("<QI", header)
    end = offset + 12 + length + 4
    if _masked(header[:8]) != length_crc or end > len(data):
        return None, end
    payload = data[offset + 12:offset + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[end - 4:end])
    return (payload if _masked(payload) == payload_crc else None), end


def _intact_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 0
    while offset < len(data):
        payload, end = _record_at(data, offset)
        assert payload is not None, f"the intact file does not verify at {offset}"
        offsets.append(offset)
        offset = end
    return offsets


def _oracle_plain(damaged: bytes, intact_offsets: list[int]) -> tuple[list[bytes], int]:
    kept, skips, in_damaged_run = [], 0, False
    for offset in intact_offsets:
        if offset >= len(damaged):
            break  # cut off before this record started: absent, not damaged
        payload, _ = _record_at(damaged, offset)
        if payload is None:
            skips += 0 if in_damaged_run else 1
            in_damaged_run = True
        else:
            kept.append(payload)
            in_damaged_run = False
    return kept, skips


def _oracle_gzip(damaged: bytes) -> tuple[list[bytes], int]:
    stream = zlib.decompressobj(wbits=31)
    data = stream.decompress(damaged)
    kept, offset = [], 0
    while offset < len(data):
        payload, end = _record_at(data, offset)
        if payload is None:
            break
        kept.append(payload)
        offset = end
    return kept, int(offset < len(data)) + int(not stream.eof)


def test_skip_corrupt_keeps_and_counts_what_the_files_structure_says(tf_vectors: pathlib.Path):
    intact_offsets = _intact_offsets((tf_vectors / "examples.tfrecord").read_bytes())
    assert len(intact_offsets) == 20
    expected: list[tuple[str, str]] = []
    expected_skips = 0
    paths = sorted(tf_vectors.glob("corrupt_*"))
    assert len(paths) == 7
    for path in paths:
        damaged = path.read_bytes()
        kept, skips = _oracle_gzip(damaged) if path.suffix == ".gz" else _oracle_plain(damaged, intact_offsets)
        assert skips >= 1, f"{path.name}: the oracle finds no damage"
        expected += [(path.name, hashlib.sha256(payload).hexdigest()) for payload in kept]
        expected_skips += skips

    pipeline = beam.Pipeline(options=PipelineOptions([]))
    digests = (
        pipeline
        | beam.Create([str(tf_vectors / "corrupt_*")])
        | ReadAllFromTFRecord(with_filename=True, skip_corrupt=True)
        | beam.MapTuple(lambda path, record: (os.path.basename(path), hashlib.sha256(record).hexdigest()))
    )
    assert_that(digests, equal_to(expected))
    result = pipeline.run()
    result.wait_until_finish()
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("tfrbeam"))["counters"]:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    assert totals["corrupt_records_skipped"] == expected_skips
    assert totals["records_read"] == len(expected)
