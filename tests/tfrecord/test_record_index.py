"""The read index: where it lives, what it keeps, its byte format, and how damaged or stale indexes are ignored."""

from __future__ import annotations

import glob
import logging
import os

import pytest
from hypothesis import given, settings, strategies as st

from tests.helpers import record_offsets, write_index
from tfrbeam.errors import RecordIndexError
from tfrbeam.tfrecord.record_index import (
    INDEX_INTERVAL_BYTES,
    IndexBuilder,
    RecordIndex,
    index_path_for,
    load_index,
    parse_index,
)
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordReader, RecordWriter, masked_crc32c


def expected_entries(starts: list[int], interval: int) -> list[int]:
    """The reference rule: the first record start at or after each multiple of the interval."""
    kept: list[int] = []
    boundary = 0
    while starts and boundary <= starts[-1]:
        first = next(s for s in starts if s >= boundary)
        if not kept or kept[-1] != first:
            kept.append(first)
        boundary += interval
    return kept


def test_index_path_is_a_hidden_sibling_directory():
    assert index_path_for("/data/out/train-00000-of-00002") == "/data/out/.tfrbeam-index/train-00000-of-00002.idx"
    assert index_path_for("gs://bucket/dir/x.tfrecord") == "gs://bucket/dir/.tfrbeam-index/x.tfrecord.idx"
    assert index_path_for("relative.tfrecord") == os.path.join(".tfrbeam-index", "relative.tfrecord.idx")
    with pytest.raises(ValueError):
        index_path_for("/data/out/")


def test_shard_globs_do_not_see_the_index(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    names = ["train.tfrecord-00000-of-00002", "train.tfrecord-00001-of-00002"]
    for name in names:
        data_path = tmp_path / name
        data_path.write_bytes(b"")
        index_path = index_path_for(str(data_path))
        os.makedirs(os.path.dirname(index_path), exist_ok=True)
        open(index_path, "wb").close()
    expected = sorted(str(tmp_path / name) for name in names)
    for pattern in ("train.tfrecord-*", "*.tfrecord*", "train*", "*"):
        assert sorted(glob.glob(str(tmp_path / pattern))) == expected, pattern
        matched = FileSystems.match([str(tmp_path / pattern)])[0].metadata_list
        assert sorted(m.path for m in matched) == expected, pattern


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), max_size=60),
    interval=st.integers(1, 700),
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_add_and_add_batch_keep_the_first_start_after_each_boundary(lengths, interval, cuts):
    starts = record_offsets(lengths)[:-1]
    one_by_one = IndexBuilder(interval)
    for number, start in enumerate(starts):
        one_by_one.add(start, number)
    batched = IndexBuilder(interval)
    bounds = sorted({0, len(lengths), *(min(c, len(lengths)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:]):
        batched.add_batch(starts[lo] if lo < len(starts) else 0, lo, lengths[lo:hi])
    file_size = sum(lengths) + RECORD_OVERHEAD * len(lengths)
    want = expected_entries(starts, interval)
    for builder in (one_by_one, batched):
        index = parse_index(builder.to_bytes(file_size, 12.5, len(lengths)), "x.idx")
        assert list(index.offsets) == want
        assert [starts[n] for n in index.record_numbers] == want


def test_round_trip_keeps_every_field():
    builder = IndexBuilder(100)
    for number, start in enumerate(record_offsets([40] * 30)[:-1]):
        builder.add(start, number)
    index = parse_index(builder.to_bytes(30 * 56, 1_700_000_000.123456, 30), "x.idx")
    assert index == RecordIndex(
        file_size=1680, mtime=1_700_000_000.123456, num_records=30,
        offsets=(0, 112, 224, 336, 448, 504, 616, 728, 840, 952, 1008, 1120, 1232, 1344, 1400, 1512, 1624),
        record_numbers=(0, 2, 4, 6, 8, 9, 11, 13, 15, 17, 18, 20, 22, 24, 25, 27, 29),
        interval=100,
    )
    unknown_mtime = parse_index(builder.to_bytes(1680, None, 30), "x.idx")
    assert unknown_mtime.mtime is None


def test_empty_file_index():
    index = parse_index(IndexBuilder().to_bytes(0, 5.0, 0), "x.idx")
    assert (index.offsets, index.num_records, index.file_size) == ((), 0, 0)
    assert index.entry_at_or_before(123) == (0, 0)


def test_to_bytes_refuses_entries_outside_the_file():
    builder = IndexBuilder(10)
    builder.add(0, 0)
    builder.add(20, 1)
    with pytest.raises(ValueError, match="outside"):
        builder.to_bytes(20, None, 2)
    with pytest.raises(ValueError, match="increasing order"):
        builder.add(30, 1)


def test_every_damaged_byte_and_every_truncation_is_refused():
    builder = IndexBuilder(64)
    for number, start in enumerate(record_offsets([30] * 20)[:-1]):
        builder.add(start, number)
    data = builder.to_bytes(20 * 46, 3.0, 20)
    for position in range(len(data)):
        for flip in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[position] ^= flip
            with pytest.raises(RecordIndexError, match=r"broken\.idx"):
                parse_index(bytes(damaged), "broken.idx")
    for size in range(len(data)):
        with pytest.raises(RecordIndexError):
            parse_index(data[:size], "short.idx")
    with pytest.raises(RecordIndexError):
        parse_index(data + b"\0", "long.idx")


def test_implausible_entries_with_a_valid_checksum_are_refused():
    builder = IndexBuilder(1)
    builder.add(0, 0)
    builder.add(10, 1)  # 10 bytes cannot hold a whole record (16 bytes at least)
    with pytest.raises(RecordIndexError, match="16 bytes per record"):
        parse_index(builder.to_bytes(100, None, 2), "x.idx")
    too_many = IndexBuilder(1)
    with pytest.raises(RecordIndexError, match="cannot fit"):
        parse_index(too_many.to_bytes(100, None, 7), "x.idx")


def test_is_current_compares_size_and_mtime():
    index = RecordIndex(file_size=100, mtime=50.0, num_records=1, offsets=(0,), record_numbers=(0,))
    assert index.is_current(100, 50.0)
    assert index.is_current(100, 50.0004)
    assert index.is_current(100, None)
    assert not index.is_current(101, 50.0)
    assert not index.is_current(100, 51.0)
    unknown = RecordIndex(file_size=100, mtime=None, num_records=1, offsets=(0,), record_numbers=(0,))
    assert unknown.is_current(100, 12345.0)
    assert not unknown.is_current(99, None)


def test_lookups_and_restriction():
    index = RecordIndex(
        file_size=10_000, mtime=None, num_records=100,
        offsets=(0, 1000, 2000, 3000), record_numbers=(0, 10, 20, 30),
    )
    assert index.entry_at_or_before(0) == (0, 0)
    assert index.entry_at_or_before(999) == (0, 0)
    assert index.entry_at_or_before(1000) == (1000, 10)
    assert index.entry_at_or_before(9999) == (3000, 30)
    part = index.restricted_to(1500, 2500)
    assert (part.offsets, part.record_numbers) == ((1000, 2000), (10, 20))
    assert part.entry_at_or_before(2400) == (2000, 20)
    assert index.restricted_to(2000, 2001).offsets == (2000,)
    assert index.restricted_to(0, 1).offsets == (0,)


def test_index_of_a_real_file_points_at_record_starts(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    payloads = [bytes([n % 251]) * ((n * 7919) % 3000) for n in range(800)]
    builder = IndexBuilder(16 * 1024)
    with RecordWriter(path) as writer:
        for number, payload in enumerate(payloads):
            builder.add(writer.bytes_written, number)
            writer.write(payload)
    with RecordReader(path) as reader:
        starts = [offset for offset, _ in reader.records_with_offsets()]
    size = os.path.getsize(path)
    index = parse_index(builder.to_bytes(size, os.path.getmtime(path), len(payloads)), "x.idx")
    assert list(index.offsets) == expected_entries(starts, 16 * 1024)
    assert all(starts[n] == offset for offset, n in zip(index.offsets, index.record_numbers))
    assert len(index.offsets) == pytest.approx(size / (16 * 1024), abs=1)


def test_load_index_uses_current_and_ignores_missing_garbage_and_stale(tmp_path, caplog):
    data_path = str(tmp_path / "x.tfrecord")
    assert load_index(data_path, 160, 7.0) is None  # missing: silently None
    builder = IndexBuilder()
    builder.add(0, 0)
    write_index(data_path, builder.to_bytes(160, 7.0, 10))
    assert load_index(data_path, 160, 7.0).offsets == (0,)
    with caplog.at_level(logging.WARNING, logger="tfrbeam.tfrecord.record_index"):
        assert load_index(data_path, 176, 7.0) is None
        assert "stale" in caplog.text and data_path in caplog.text
        caplog.clear()
        assert load_index(data_path, 160, 9.0) is None
        assert "stale" in caplog.text
        caplog.clear()
        write_index(data_path, b"not an index at all, just garbage bytes here........")
        assert load_index(data_path, 160, 7.0) is None
        assert "magic" in caplog.text and index_path_for(data_path) in caplog.text
    assert load_index(data_path, 160, 7.0, read_bytes=lambda path: builder.to_bytes(160, 7.0, 10)).offsets == (0,)


def test_default_interval_is_one_mebibyte():
    assert INDEX_INTERVAL_BYTES == 1 << 20
    assert IndexBuilder().interval == 1 << 20
    with pytest.raises(ValueError):
        IndexBuilder(0)


def test_an_interval_of_zero_is_refused():
    """tfrbeam writes intervals of 1 to 2**32 - 1; a 0 with a valid checksum is a damaged or foreign index."""
    body = bytearray(IndexBuilder(7).to_bytes(0, None, 0))
    interval_at = body.index((7).to_bytes(4, "little"))
    body[interval_at:interval_at + 4] = bytes(4)
    del body[-4:]
    data = bytes(body) + masked_crc32c(bytes(body)).to_bytes(4, "little")
    with pytest.raises(RecordIndexError, match="interval is 0"):
        parse_index(data, "zero.idx")
