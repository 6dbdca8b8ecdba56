"""The read index: where it lives, what its two sections keep, its byte format, stamping, the checks against the data,
how damaged, stale or planted indexes are ignored, the indexes of datasets written before (``.idx``, ``.offsets``),
and the DALI export."""

from __future__ import annotations

import glob
import logging
import os
import pathlib
import resource
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.helpers import index_as_written_before, record_offsets, write_index
from tests.planted import not_blocked_by
from tfrbeam.base import fileops
from tfrbeam.cli.main import main
from tfrbeam.errors import RecordIndexError
from tfrbeam.tfrecord import read_index
from tfrbeam.tfrecord.read_index import (
    INDEX_INTERVAL_BYTES,
    ReadIndexBuilder,
    SplitTable,
    dali_index_text,
    find_record_starts,
    find_split_table,
    index_is_current,
    index_path_for,
    index_paths_for,
    load_offsets,
    load_split_table,
    max_index_bytes,
    offsets_from_headers,
    offsets_problem,
    parse_read_index,
    read_index_bytes,
    seek_position,
    split_table_of,
    stamp_read_index,
    starts_bytes,
    table_bytes,
    trusted_index,
)
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordReader, RecordWriter, frame_records, masked_crc32c


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


def header_walk(path: pathlib.Path) -> list[tuple[int, int]]:
    """(offset, framed size) of every record, by reading each 8-byte length in turn (the reference)."""
    data = path.read_bytes()
    out, position = [], 0
    while position < len(data):
        size = int.from_bytes(data[position:position + 8], "little") + RECORD_OVERHEAD
        out.append((position, size))
        position += size
    return out


def write(path: pathlib.Path, payloads: list[bytes], batch: int = 7, interval: int = 64) -> ReadIndexBuilder:
    """Write payloads in framed batches the way the sinks do, feeding the index builder; its index unstamped beside."""
    builder = ReadIndexBuilder(interval)
    with RecordWriter(str(path)) as writer:
        for begin in range(0, len(payloads), batch):
            chunk = payloads[begin:begin + batch]
            builder.add_batch(writer.bytes_written, writer.records_written, [len(payload) for payload in chunk])
            writer.write_framed(frame_records(chunk), len(chunk))
    write_index(path, builder.to_bytes(path.stat().st_size, None))
    return builder


def payloads_of(count: int) -> list[bytes]:
    return [bytes([number % 251]) * (number * 7 % 300) for number in range(count)]


# ------------------------------------------------------------------------------ names and format


def test_index_path_is_a_hidden_sibling_directory():
    assert index_path_for("/data/out/train-00000-of-00002") == "/data/out/.tfrbeam-index/train-00000-of-00002.index"
    assert index_path_for("gs://bucket/dir/x.tfrecord") == "gs://bucket/dir/.tfrbeam-index/x.tfrecord.index"
    assert index_path_for("relative.tfrecord") == os.path.join(".tfrbeam-index", "relative.tfrecord.index")
    assert index_paths_for("/d/x") == ["/d/.tfrbeam-index/x.index", "/d/.tfrbeam-index/x.idx", "/d/.tfrbeam-index/x.offsets"]
    with pytest.raises(ValueError):
        index_path_for("/data/out/")


def test_shard_globs_do_not_see_the_index(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    names = ["train.tfrecord-00000-of-00002", "train.tfrecord-00001-of-00002"]
    for name in names:
        data_path = tmp_path / name
        data_path.write_bytes(b"")
        write_index(data_path, b"")
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
def test_add_and_add_batch_keep_every_start_and_the_first_after_each_boundary(lengths, interval, cuts):
    offsets = record_offsets(lengths)
    starts = offsets[:-1]
    one_by_one = ReadIndexBuilder(interval)
    for number, start in enumerate(starts):
        one_by_one.add(start, number)
    batched = ReadIndexBuilder(interval)
    bounds = sorted({0, len(lengths), *(min(c, len(lengths)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:]):
        batched.add_batch(starts[lo] if lo < len(starts) else 0, lo, lengths[lo:hi])
    want = expected_entries(starts, interval)
    for builder in (one_by_one, batched):
        index = parse_read_index(builder.to_bytes(offsets[-1], 12.5), "x.index")
        assert list(index.table.offsets) == want
        assert [starts[n] for n in index.table.record_numbers] == want
        assert index.starts.offsets.tolist() == offsets and index.num_records == len(lengths)


def test_round_trip_keeps_every_field_of_both_sections():
    offsets = record_offsets([40] * 30)
    index = parse_read_index(read_index_bytes(np.array(offsets), 1_700_000_000.123456, 100), "x.index")
    assert index.table == SplitTable(
        file_size=1680, mtime=1_700_000_000.123456, num_records=30,
        offsets=(0, 112, 224, 336, 448, 504, 616, 728, 840, 952, 1008, 1120, 1232, 1344, 1400, 1512, 1624),
        record_numbers=(0, 2, 4, 6, 8, 9, 11, 13, 15, 17, 18, 20, 22, 24, 25, 27, 29),
        interval=100,
    )
    assert index.starts.offsets.tolist() == offsets and index.starts.mtime == 1_700_000_000.123456
    assert parse_read_index(read_index_bytes(np.array(offsets), None), "x").mtime is None


def test_the_split_table_comes_first_and_is_small():
    """A reader that splits or seeks reads only the front: 16 bytes a MiB, whatever the record count."""
    offsets = np.arange(0, 64 << 20, 64, dtype=np.int64)  # 1M records of 48-byte payloads in 64 MiB
    data = read_index_bytes(offsets, None)
    table = parse_read_index(data, "x").table
    assert len(table.offsets) == 64
    assert read_index.table_length(data, "x") == 52 + 16 * 64 == len(table_bytes(table))
    assert len(data) - read_index.table_length(data, "x") == 40 + 8 * len(offsets) + 4


def test_empty_file_index():
    index = parse_read_index(ReadIndexBuilder().to_bytes(0, 5.0), "x.index")
    assert (index.table.offsets, index.num_records, index.file_size) == ((), 0, 0)
    assert index.starts.offsets.tolist() == [0]
    assert index.table.entry_at_or_before(123) == (0, 0)


def test_builder_refuses_records_out_of_order_and_intervals_out_of_range():
    builder = ReadIndexBuilder()
    builder.add_batch(0, 0, [3, 4])
    with pytest.raises(ValueError, match="expected record 2 at offset 39"):
        builder.add_batch(40, 2, [1])
    assert INDEX_INTERVAL_BYTES == 1 << 20 == ReadIndexBuilder().interval
    with pytest.raises(ValueError):
        ReadIndexBuilder(0)


def test_every_damaged_byte_and_every_truncation_is_refused():
    data = read_index_bytes(np.array(record_offsets([30] * 20)), 3.0, 64)
    table_end = read_index.table_length(data, "x")
    for position in range(len(data)):
        for flip in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[position] ^= flip
            with pytest.raises(RecordIndexError, match=r"broken\.index"):
                parse_read_index(bytes(damaged), "broken.index")
    for size in range(len(data)):
        if size == table_end:  # cut where the record starts begin: what is left is a whole split table
            assert parse_read_index(data[:size], "cut").starts is None
            continue
        with pytest.raises(RecordIndexError):
            parse_read_index(data[:size], "short.index")
    with pytest.raises(RecordIndexError):
        parse_read_index(data + b"\0", "long.index")


def test_sections_that_disagree_are_refused():
    offsets = np.array(record_offsets([30] * 20))
    table = split_table_of(offsets, 3.0, 64)
    for other in (starts_bytes(offsets, 4.0), starts_bytes(np.array(record_offsets([30] * 19 + [31])), 3.0)):
        with pytest.raises(RecordIndexError, match="its split table"):
            parse_read_index(table_bytes(table) + other, "x.index")


def test_implausible_entries_with_a_valid_checksum_are_refused():
    with pytest.raises(RecordIndexError, match="16 bytes per record"):  # 10 bytes cannot hold a whole record
        parse_read_index(table_bytes(SplitTable(100, None, 2, (0, 10), (0, 1), 1)), "x.idx")
    with pytest.raises(RecordIndexError, match="cannot fit"):
        parse_read_index(table_bytes(SplitTable(100, None, 7, (), (), 1)), "x.idx")
    body = bytearray(table_bytes(SplitTable(0, None, 0, (), (), 7)))  # an interval of 0, with a valid checksum
    body[12:16] = bytes(4)
    data = bytes(body[:-4]) + masked_crc32c(bytes(body[:-4])).to_bytes(4, "little")
    with pytest.raises(RecordIndexError, match="interval is 0"):
        parse_read_index(data, "zero.idx")


def test_is_current_compares_size_and_mtime():
    table = SplitTable(file_size=100, mtime=50.0, num_records=1, offsets=(0,), record_numbers=(0,))
    assert table.is_current(100, 50.0) and table.is_current(100, 50.0004) and table.is_current(100, None)
    assert not table.is_current(101, 50.0) and not table.is_current(100, 51.0)
    unknown = SplitTable(file_size=100, mtime=None, num_records=1, offsets=(0,), record_numbers=(0,))
    assert unknown.is_current(100, 12345.0) and not unknown.is_current(99, None)


def test_lookups_and_restriction():
    table = SplitTable(file_size=10_000, mtime=None, num_records=100, offsets=(0, 1000, 2000, 3000),
                       record_numbers=(0, 10, 20, 30))
    assert table.entry_at_or_before(0) == (0, 0)
    assert table.entry_at_or_before(999) == (0, 0)
    assert table.entry_at_or_before(1000) == (1000, 10)
    assert table.entry_at_or_before(9999) == (3000, 30)
    part = table.restricted_to(1500, 2500)
    assert (part.offsets, part.record_numbers) == ((1000, 2000), (10, 20))
    assert part.entry_at_or_before(2400) == (2000, 20)
    assert table.restricted_to(2000, 2001).offsets == (2000,)
    assert table.restricted_to(0, 1).offsets == (0,)


def test_index_of_a_real_file_points_at_record_starts(tmp_path):
    path = tmp_path / "data.tfrecord"
    write(path, payloads_of(800), interval=16 * 1024)
    with RecordReader(str(path)) as reader:
        starts = [offset for offset, _ in reader.records_with_offsets()]
    index = parse_read_index(pathlib.Path(index_path_for(str(path))).read_bytes(), "x")
    assert list(index.table.offsets) == expected_entries(starts, 16 * 1024)
    assert all(starts[n] == offset for offset, n in zip(index.table.offsets, index.table.record_numbers))
    assert index.starts.offsets.tolist() == starts + [path.stat().st_size] == offsets_from_headers(str(path)).tolist()
    assert offsets_problem(path.read_bytes(), index.starts.offsets) is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=60), st.integers(1, 9))
def test_the_writer_api_records_every_start_and_round_trips(tmp_path_factory, payloads, batch):
    path = tmp_path_factory.mktemp("w") / "data.tfrecord"
    builder = write(path, payloads, batch)
    expected = [offset for offset, _ in header_walk(path)] + [path.stat().st_size]
    assert builder.offsets(path.stat().st_size).tolist() == expected
    parsed = parse_read_index(pathlib.Path(index_path_for(str(path))).read_bytes(), "index")
    assert parsed.starts.offsets.tolist() == expected and parsed.mtime is None and parsed.num_records == len(payloads)


# ------------------------------------------------------------------------------ stamping


def test_stamping_makes_the_index_current_for_verify(tmp_path):
    path = tmp_path / "data.tfrecord"
    write(path, [b"x" * n for n in range(40)])
    index = index_path_for(str(path))
    current, reason = index_is_current(str(path), index)
    assert not current and "records no mtime" in reason
    stamp_read_index(str(path))
    current, reason = index_is_current(str(path), index)
    assert current and "matches" in reason
    stamped = parse_read_index(pathlib.Path(index).read_bytes(), index)
    assert stamped.table.mtime == stamped.starts.mtime == path.stat().st_mtime
    os.utime(path, (path.stat().st_mtime + 9, path.stat().st_mtime + 9))
    current, reason = index_is_current(str(path), index)
    assert not current and "last modified" in reason and str(path) in reason
    (tmp_path / "other.index").write_bytes(ReadIndexBuilder().to_bytes(999, None))
    with pytest.raises(RecordIndexError, match="the data file has"):
        stamp_read_index(str(path), str(tmp_path / "other.index"))  # an index of another file is not stamped


@pytest.mark.parametrize("suffix", [".idx", ".offsets"])
def test_stamping_stamps_a_single_section_file_too(tmp_path, suffix):
    path = tmp_path / "data.tfrecord"
    offsets = np.array(write(path, payloads_of(30)).offsets(path.stat().st_size))
    section = table_bytes(split_table_of(offsets, None, 64)) if suffix == ".idx" else starts_bytes(offsets, None)
    write_index(path, section, suffix)
    stamp_read_index(str(path), index_path_for(str(path), suffix))
    assert index_is_current(str(path), index_path_for(str(path), suffix))[0]


def test_stamping_a_shards_index_streams_it_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A build stamps every shard's index at once: each must cost a chunk, not the index (8 bytes a record) twice."""
    import tracemalloc

    count = 1_000_000
    offsets = np.arange(count + 1, dtype=np.int64) * (RECORD_OVERHEAD + 4)
    data_path = tmp_path / "data.tfrecord"
    data_path.write_bytes(b"")
    os.truncate(data_path, int(offsets[-1]))  # only its size and mtime are read
    index_path = tmp_path / "data.index"
    index_path.write_bytes(read_index_bytes(offsets, None))
    tracemalloc.start()
    try:
        stamp_read_index(str(data_path), str(index_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stamped = parse_read_index(index_path.read_bytes(), str(index_path))
    assert stamped.mtime == os.path.getmtime(data_path) and stamped.starts.offsets.tolist() == offsets.tolist()
    assert peak < 3 << 20 < index_path.stat().st_size / 2, f"stamping allocated {peak:,} bytes"  # chunks of 1 MiB

    # An index that changes between its check and its copy is refused, and left as it was.
    before = index_path.read_bytes()
    changed_at = read_index.table_length(before, "x") + 48
    mutating = fileops.mutating

    def changed_meanwhile(op, path, action):  # the fault hook: the stamp's copy is written after the checks
        if (op, path) == ("write", str(index_path)):
            with open(index_path, "r+b") as handle:
                handle.seek(changed_at)
                handle.write(b"\xff")
        return mutating(op, path, action)

    monkeypatch.setattr(fileops, "mutating", changed_meanwhile)
    with pytest.raises(RecordIndexError, match="changed while it was being stamped; nothing was written"):
        stamp_read_index(str(data_path), str(index_path))
    after = bytearray(before)
    after[changed_at] = 0xFF
    assert index_path.read_bytes() == bytes(after)  # the change, but nothing of the stamp
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------ loading and trust


def test_load_split_table_uses_current_and_ignores_missing_garbage_and_stale(tmp_path, caplog):
    data_path = str(tmp_path / "x.tfrecord")
    assert load_split_table(data_path, 160, 7.0) is None  # missing: silently None
    write_index(data_path, read_index_bytes(np.arange(0, 161, 16), 7.0))
    assert load_split_table(data_path, 160, 7.0).offsets == (0,)
    with caplog.at_level(logging.WARNING, logger="tfrbeam.tfrecord.read_index"):
        assert load_split_table(data_path, 176, 7.0) is None
        assert "stale" in caplog.text and data_path in caplog.text
        caplog.clear()
        assert load_split_table(data_path, 160, 9.0) is None
        assert "stale" in caplog.text
        caplog.clear()
        write_index(data_path, b"not an index at all, just garbage bytes here........")
        assert load_split_table(data_path, 160, 7.0) is None
        assert "magic" in caplog.text and index_path_for(data_path) in caplog.text
    good = read_index_bytes(np.arange(0, 161, 16), 7.0)
    assert load_split_table(data_path, 160, 7.0, read=lambda path, limit: good[:limit]).offsets == (0,)


def test_a_split_reads_only_the_front_of_the_index(tmp_path):
    data_path = str(tmp_path / "x.tfrecord")
    offsets = np.arange(0, (8 << 20) + 1, 32, dtype=np.int64)  # 8 MiB of 262,144 records: 2 MiB of record starts
    write_index(data_path, read_index_bytes(offsets, None))
    asked: list[int] = []

    def front(path: str, limit: int) -> bytes | None:
        asked.append(limit)
        return read_index.read_local_front(path, limit)

    table = load_split_table(data_path, int(offsets[-1]), None, read=front)
    assert len(table.offsets) == 8 and asked == [52 + 16 * 9]


def test_a_table_of_entries_closer_than_a_mebibyte_is_read_whole_from_the_front(tmp_path):
    path = tmp_path / "data.tfrecord"
    write(path, payloads_of(400), interval=100)
    found, where = find_split_table(str(path), path.stat().st_size)
    assert where == index_path_for(str(path)) and len(found.offsets) > 100


@pytest.fixture()
def shard(tmp_path) -> pathlib.Path:
    """An uncompressed shard of 300 records with its read index, stamped as a build leaves it."""
    path = tmp_path / "train-00000-of-00001.tfrecord"
    write(path, [bytes([number % 256]) * (number % 50) for number in range(300)], interval=256)
    stamp_read_index(str(path))
    assert index_is_current(str(path), index_path_for(str(path)))[0]
    return path


def test_seeks_and_splits_use_checked_entries(shard):
    table = trusted_index(str(shard), 300)
    assert table is not None and len(table.offsets) > 5
    starts = offsets_from_headers(str(shard))
    for record in (0, 1, 150, 299):
        offset, number = seek_position(str(shard), record, 300)
        assert number <= record and offset == starts[number]
    assert trusted_index(str(shard), 301) is None  # the manifest's count disagrees


@pytest.mark.parametrize("damage", ["drop", "move", "short", "inside"])
def test_offsets_that_do_not_match_the_data_are_caught_and_rebuilt(tmp_path, damage, caplog):
    path = tmp_path / "data.tfrecord"
    write(path, [b"y" * (n % 13) for n in range(50)])
    good = offsets_from_headers(str(path))
    bad = {"drop": np.delete(good, 7), "move": np.where(np.arange(len(good)) == 9, good + 1, good),
           "short": good[:-2].tolist() + [good[-1]], "inside": np.where(np.arange(len(good)) == 12, good + 5, good)}[damage]
    bad = np.asarray(bad, dtype=np.int64)
    assert offsets_problem(path.read_bytes(), bad) is not None
    write_index(path, read_index_bytes(bad, path.stat().st_mtime))
    caplog.set_level(logging.WARNING)
    assert load_offsets(str(path)).tolist() == good.tolist()
    assert any("ignoring the read index" in record.getMessage() for record in caplog.records)
    rebuilt = parse_read_index(pathlib.Path(index_path_for(str(path))).read_bytes(), "i")
    assert rebuilt.starts.offsets.tolist() == good.tolist() and rebuilt.table is not None


def _fifo_instead_of(index: str) -> pathlib.Path:
    path = pathlib.Path(index)
    path.unlink()
    os.mkfifo(path)
    return path


def test_a_fifo_index_is_ignored_at_once_named_by_verify_and_replaced_by_one_from_the_headers(shard, caplog):
    expected = load_offsets(str(shard), write=False).tolist()
    index = _fifo_instead_of(index_path_for(str(shard)))
    with not_blocked_by(index):
        current, reason = index_is_current(str(shard), str(index))
        with caplog.at_level(logging.WARNING):
            loaded = load_split_table(str(shard), shard.stat().st_size, shard.stat().st_mtime)
            trusted = trusted_index(str(shard))
            offsets = load_offsets(str(shard))
    assert not current and "FIFO" in reason and str(index) in reason
    assert loaded is None and trusted is None and "FIFO" in caplog.text
    assert offsets.tolist() == expected
    assert index.is_file() and parse_read_index(index.read_bytes(), "i").starts is not None  # rebuilt, a regular file


@pytest.mark.parametrize("suffix", [".index", ".idx", ".offsets"])
def test_an_index_larger_than_its_shard_allows_is_refused_without_a_read(shard, suffix):
    index = pathlib.Path(index_path_for(str(shard), suffix))
    index.write_bytes(b"")
    with open(index, "r+b") as handle:
        handle.truncate(1 << 30)  # sparse: 1 GiB beside a shard of a few kB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    current, reason = index_is_current(str(shard), str(index))
    assert not current and f"{1 << 30} bytes, larger than any read index" in reason  # refused from its size
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: never read


def test_the_cap_holds_a_full_index_of_the_smallest_records(tmp_path):
    path = tmp_path / "empty-records.tfrecord"  # empty records only: one per 16 bytes, an entry each in both sections
    with RecordWriter(str(path)) as writer:
        writer.write_framed(frame_records([b""] * 100), 100)
    builder = ReadIndexBuilder(1)
    builder.add_batch(0, 0, [0] * 100)
    data = builder.to_bytes(path.stat().st_size, None)
    assert len(parse_read_index(data, "x").table.offsets) == 100
    assert len(data) <= max_index_bytes(path.stat().st_size)


# ------------------------------------------------------------------------------ datasets written before


@pytest.mark.parametrize("files", ["idx", "offsets", "both", "none"])
def test_a_shard_written_before_is_split_sought_and_read_by_its_own_files(shard, files, caplog):
    starts = offsets_from_headers(str(shard))
    table_now = parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "x").table
    index_as_written_before(shard, files)
    size, mtime = shard.stat().st_size, shard.stat().st_mtime
    with caplog.at_level(logging.WARNING):
        table = load_split_table(str(shard), size, mtime)
        trusted = trusted_index(str(shard), 300)
        found_starts = find_record_starts(str(shard), size)
        offsets = load_offsets(str(shard), write=False)
        offset, number = seek_position(str(shard), 222, 300)
    assert not caplog.records, caplog.text
    assert offsets.tolist() == starts.tolist() and offset == starts[number]
    if files == "none":
        assert table is None and trusted is None and found_starts is None and number == 0
        return
    assert table == trusted and table.num_records == 300
    if files == "offsets":  # the split table is made from the record starts, with the writers' interval (1 MiB)
        assert table == split_table_of(starts, mtime)
    else:
        assert table == table_now and number > 0
    assert (found_starts is None) == (files == "idx")
    for suffix in (".idx", ".offsets"):
        path = index_path_for(str(shard), suffix)
        if os.path.exists(path):
            assert index_is_current(str(shard), path)[0]


def test_an_index_beside_files_of_before_is_the_one_used(shard):
    """A shard of a dataset written before whose random access wrote a fresh ``.index``: that one is read first."""
    index_as_written_before(shard, "both")
    write_index(shard, b"", ".offsets")  # broken, but never looked at once there is an .index
    load_offsets(str(shard))  # .offsets unusable: rebuilt from the headers into an .index
    assert parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "i").table is not None
    assert find_split_table(str(shard), shard.stat().st_size)[1] == index_path_for(str(shard))


# --------------------------------------------------------------------------------------- DALI


def test_dali_text_is_offset_and_framed_size_per_record():
    assert dali_index_text(np.array([0, 20, 45, 61])) == "0 20\n20 25\n45 16\n"


def test_tfrbeam_index_dali_writes_one_file_per_shard_matching_a_header_walk(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for number, count in enumerate([25, 0, 40]):
        write(data / f"train-{number}.tfrecord", [bytes([n]) * (n * 7 % 300) for n in range(count)])
    out = tmp_path / "dali"
    assert main(["index", str(data), "--dali", str(out)]) == 0
    assert "train-2.tfrecord: 40 records" in capsys.readouterr().out
    for number in range(3):
        lines = (out / f"train-{number}.tfrecord.idx").read_text()
        assert lines == "".join(f"{offset} {size}\n" for offset, size in header_walk(data / f"train-{number}.tfrecord"))
    assert sorted(os.listdir(out)) == [f"train-{number}.tfrecord.idx" for number in range(3)]  # no index of the hidden indexes
    assert main(["index", str(data / "train-0*"), "--dali", str(tmp_path / "one")]) == 0
    assert os.listdir(tmp_path / "one") == ["train-0.tfrecord.idx"]


def test_tfrbeam_index_refuses_compressed_files_and_reports_damage(tmp_path, capsys):
    with RecordWriter(str(tmp_path / "a.tfrecord.gz"), "gzip") as writer:
        writer.write(b"z")
    assert main(["index", str(tmp_path / "a.tfrecord.gz"), "--dali", str(tmp_path / "o")]) == 2
    assert "compressed" in capsys.readouterr().err
    broken = tmp_path / "b.tfrecord"
    write(broken, [b"q" * 30] * 4)
    broken.write_bytes(broken.read_bytes()[:-10])
    assert main(["index", str(broken), "--dali", str(tmp_path / "o")]) == 1
    assert "b.tfrecord" in capsys.readouterr().err


def test_the_console_script_has_the_index_command():
    command = [sys.executable, "-m", "tfrbeam.cli.main", "index", "--help"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "--dali OUT_DIR" in result.stdout
