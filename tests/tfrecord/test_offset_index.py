"""The offset index (every record start) and the DALI export: format, writer API, checks against the data, CLI."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.cli.main import main
from tfrbeam.errors import RecordIndexError
from tfrbeam.tfrecord.offset_index import (
    OffsetIndexBuilder,
    dali_index_text,
    load_offsets,
    offset_index_bytes,
    offset_index_is_current,
    offset_index_path_for,
    offsets_from_headers,
    offsets_problem,
    parse_offset_index,
    stamp_offset_index,
)
from tfrbeam.tfrecord.record_index import IndexBuilder, index_is_current, index_path_for, stamp_index
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordWriter, frame_records


def header_walk(path: pathlib.Path) -> list[tuple[int, int]]:
    """(offset, framed size) of every record, by reading each 8-byte length in turn (the reference)."""
    data = path.read_bytes()
    out, position = [], 0
    while position < len(data):
        size = int.from_bytes(data[position:position + 8], "little") + RECORD_OVERHEAD
        out.append((position, size))
        position += size
    return out


def write(path: pathlib.Path, payloads: list[bytes], batch: int = 7) -> OffsetIndexBuilder:
    """Write payloads in framed batches the way the sink does, feeding both index builders."""
    offsets, sparse = OffsetIndexBuilder(), IndexBuilder(64)
    with RecordWriter(str(path)) as writer:
        for begin in range(0, len(payloads), batch):
            chunk = payloads[begin:begin + batch]
            lengths = [len(payload) for payload in chunk]
            offsets.add_batch(writer.bytes_written, writer.records_written, lengths)
            sparse.add_batch(writer.bytes_written, writer.records_written, lengths)
            writer.write_framed(frame_records(chunk), len(chunk))
    index_path = pathlib.Path(offset_index_path_for(str(path)))
    index_path.parent.mkdir(exist_ok=True)
    index_path.write_bytes(offsets.to_bytes(path.stat().st_size, None))
    pathlib.Path(index_path_for(str(path))).write_bytes(sparse.to_bytes(path.stat().st_size, None, len(payloads)))
    return offsets


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=60), st.integers(1, 9))
def test_the_writer_api_records_every_start_and_round_trips(tmp_path_factory, payloads, batch):
    path = tmp_path_factory.mktemp("w") / "data.tfrecord"
    builder = write(path, payloads, batch)
    walk = header_walk(path)
    expected = [offset for offset, _ in walk] + [path.stat().st_size]
    assert builder.offsets(path.stat().st_size).tolist() == expected
    parsed = parse_offset_index(pathlib.Path(offset_index_path_for(str(path))).read_bytes(), "index")
    assert parsed.offsets.tolist() == expected and parsed.mtime is None and parsed.num_records == len(payloads)
    assert offsets_from_headers(str(path)).tolist() == expected
    assert offsets_problem(path.read_bytes(), parsed.offsets) is None


def test_builder_refuses_records_out_of_order():
    builder = OffsetIndexBuilder()
    builder.add_batch(0, 0, [3, 4])
    with pytest.raises(ValueError, match="expected record 2 at offset 39"):
        builder.add_batch(40, 2, [1])


def test_stamping_makes_indexes_current_for_verify(tmp_path):
    path = tmp_path / "data.tfrecord"
    write(path, [b"x" * n for n in range(40)])
    assert index_is_current(str(path))[0] is False and "records no mtime" in index_is_current(str(path))[1]
    assert offset_index_is_current(str(path))[0] is False
    stamp_index(str(path))
    stamp_offset_index(str(path))
    assert index_is_current(str(path)) == (True, index_is_current(str(path))[1]) and "matches" in index_is_current(str(path))[1]
    assert offset_index_is_current(str(path))[0] is True
    os.utime(path, (path.stat().st_mtime + 9, path.stat().st_mtime + 9))
    current, reason = index_is_current(str(path))
    assert not current and "last modified" in reason and str(path) in reason
    assert offset_index_is_current(str(path))[0] is False
    (tmp_path / "other.idx").write_bytes(IndexBuilder().to_bytes(999, None, 0))
    with pytest.raises(RecordIndexError, match="the data file has"):
        stamp_index(str(path), str(tmp_path / "other.idx"))  # an index of another file is not stamped


@pytest.mark.parametrize("damage", ["drop", "move", "short", "inside"])
def test_offsets_that_do_not_match_the_data_are_caught(tmp_path, damage, caplog):
    path = tmp_path / "data.tfrecord"
    write(path, [b"y" * (n % 13) for n in range(50)])
    good = offsets_from_headers(str(path))
    bad = {"drop": np.delete(good, 7), "move": np.where(np.arange(len(good)) == 9, good + 1, good),
           "short": good[:-2].tolist() + [good[-1]], "inside": np.where(np.arange(len(good)) == 12, good + 5, good)}[damage]
    bad = np.asarray(bad, dtype=np.int64)
    assert offsets_problem(path.read_bytes(), bad) is not None
    pathlib.Path(offset_index_path_for(str(path))).write_bytes(offset_index_bytes(bad, path.stat().st_mtime))
    caplog.set_level(logging.WARNING)
    assert load_offsets(str(path)).tolist() == good.tolist()
    assert any("ignoring the offset index" in record.getMessage() for record in caplog.records)
    assert parse_offset_index(pathlib.Path(offset_index_path_for(str(path))).read_bytes(), "i").offsets.tolist() == good.tolist()


def test_a_damaged_index_file_is_refused_by_the_parser(tmp_path):
    data = bytearray(offset_index_bytes(np.array([0, 20], dtype=np.int64), None))
    data[-8] ^= 1
    with pytest.raises(RecordIndexError, match="checksum mismatch"):
        parse_offset_index(bytes(data), "x.offsets")


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


def test_stamping_a_shards_offset_index_streams_it_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A build stamps every shard's index at once: each must cost a chunk, not the index (8 bytes a record) twice."""
    import tracemalloc

    import tfrbeam.tfrecord.offset_index as offset_index

    count = 1_000_000
    offsets = np.arange(count + 1, dtype=np.int64) * (RECORD_OVERHEAD + 4)
    data_path = tmp_path / "data.tfrecord"
    data_path.write_bytes(b"")
    os.truncate(data_path, int(offsets[-1]))  # only its size and mtime are read
    index_path = tmp_path / "data.offsets"
    index_path.write_bytes(offset_index_bytes(offsets, None))
    tracemalloc.start()
    try:
        offset_index.stamp_offset_index(str(data_path), str(index_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stamped = parse_offset_index(index_path.read_bytes(), str(index_path))
    assert stamped.mtime == os.path.getmtime(data_path) and stamped.offsets.tolist() == offsets.tolist()
    assert peak < 3 << 20 < index_path.stat().st_size / 2, f"stamping allocated {peak:,} bytes"  # chunks of 1 MiB

    # An index that changes between its check and its copy is refused, and left as it was.
    before = index_path.read_bytes()
    chunks = offset_index._stamped_chunks

    def changed_meanwhile(read, length, mtime, where):
        with open(index_path, "r+b") as handle:
            handle.seek(40)
            handle.write(b"\xff")
        yield from chunks(read, length, mtime, where)

    monkeypatch.setattr(offset_index, "_stamped_chunks", changed_meanwhile)
    with pytest.raises(RecordIndexError, match="changed while it was being stamped; nothing was written"):
        offset_index.stamp_offset_index(str(data_path), str(index_path))
    after = bytearray(before)
    after[40] = 0xFF
    assert index_path.read_bytes() == bytes(after)  # the change, but nothing of the stamp
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_stamping_a_large_offset_index_copies_it_once(tmp_path):
    """Every shard of a build is stamped at once: stamping must not parse the offsets (8 bytes a record)
    into arrays and copy the body again, or a build's last step is its memory peak."""
    import tracemalloc

    from tfrbeam.tfrecord.offset_index import stamped_offset_index_bytes

    count = 500_000
    offsets = np.arange(count + 1, dtype=np.int64) * (RECORD_OVERHEAD + 4)
    data = offset_index_bytes(offsets, None)
    tracemalloc.start()
    try:
        stamped = stamped_offset_index_bytes(data, int(offsets[-1]), 1234.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parse_offset_index(bytes(stamped), "x").mtime == 1234.5
    assert parse_offset_index(bytes(stamped), "x").offsets.tolist() == offsets.tolist()
    assert peak <= 1.2 * len(data), f"stamping {len(data):,} bytes allocated {peak:,} at its peak"
