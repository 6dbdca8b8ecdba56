"""Read indexes (``.idx``) and offset indexes (``.offsets``) as found files: a FIFO, a link or a file larger than any
index of its shard can be is ignored at once (readers walk the headers) and named by the checks (issue 43 item 1).

Each index may hold at most what its shard's size allows (one record per 16 bytes), so a sparse
giant beside a small shard is refused from its size, without a read.
"""

from __future__ import annotations

import logging
import os
import pathlib
import resource

import pytest

from tests.planted import not_blocked_by
from tfrbeam.tfrecord.offset_index import (
    OffsetIndexBuilder,
    load_offsets,
    max_offset_index_bytes,
    offset_index_is_current,
    offset_index_path_for,
)
from tfrbeam.tfrecord.record_index import (
    IndexBuilder,
    index_is_current,
    index_path_for,
    load_index,
    max_index_bytes,
    stamp_index,
    trusted_index,
)
from tfrbeam.tfrecord.records import RecordWriter, frame_records

PAYLOADS = [bytes([number % 256]) * (number % 50) for number in range(300)]


@pytest.fixture()
def shard(tmp_path) -> pathlib.Path:
    """An uncompressed shard of 300 records with both indexes, stamped as a build leaves them."""
    path = tmp_path / "train-00000-of-00001.tfrecord"
    offsets, sparse = OffsetIndexBuilder(), IndexBuilder(256)
    with RecordWriter(str(path)) as writer:
        lengths = [len(payload) for payload in PAYLOADS]
        offsets.add_batch(0, 0, lengths)
        sparse.add_batch(0, 0, lengths)
        writer.write_framed(frame_records(PAYLOADS), len(PAYLOADS))
    size, mtime = path.stat().st_size, path.stat().st_mtime
    pathlib.Path(index_path_for(str(path))).parent.mkdir()
    pathlib.Path(offset_index_path_for(str(path))).write_bytes(offsets.to_bytes(size, mtime))
    pathlib.Path(index_path_for(str(path))).write_bytes(sparse.to_bytes(size, None, len(PAYLOADS)))
    stamp_index(str(path))
    assert index_is_current(str(path))[0] and offset_index_is_current(str(path))[0]
    return path


def _fifo_instead_of(index: str) -> pathlib.Path:
    path = pathlib.Path(index)
    path.unlink()
    os.mkfifo(path)
    return path


def test_a_fifo_offset_index_is_ignored_at_once_and_replaced_by_one_from_the_headers(shard, caplog):
    expected = load_offsets(str(shard), write=False).tolist()
    index = _fifo_instead_of(offset_index_path_for(str(shard)))
    with not_blocked_by(index):
        current, reason = offset_index_is_current(str(shard))
        with caplog.at_level(logging.WARNING):
            offsets = load_offsets(str(shard))
    assert not current and "FIFO" in reason and str(index) in reason
    assert offsets.tolist() == expected
    assert "FIFO" in caplog.text
    assert index.is_file() and offset_index_is_current(str(shard))[0]  # rebuilt in its place, a regular file


def test_a_fifo_read_index_is_ignored_at_once_and_named_by_verify(shard, caplog):
    index = _fifo_instead_of(index_path_for(str(shard)))
    with not_blocked_by(index):
        current, reason = index_is_current(str(shard))
        with caplog.at_level(logging.WARNING):
            loaded = load_index(str(shard), shard.stat().st_size, shard.stat().st_mtime)
            trusted = trusted_index(str(shard))
    assert not current and "FIFO" in reason
    assert loaded is None and trusted is None and "FIFO" in caplog.text


@pytest.mark.parametrize("kind", ["read index", "offset index"])
def test_an_index_larger_than_its_shard_allows_is_refused_from_its_size(shard, kind):
    index = pathlib.Path(index_path_for(str(shard)) if kind == "read index" else offset_index_path_for(str(shard)))
    with open(index, "r+b") as handle:
        handle.truncate(1 << 30)  # sparse: 1 GiB beside a shard of a few kB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    check = index_is_current if kind == "read index" else offset_index_is_current
    current, reason = check(str(shard))
    assert not current and f"{1 << 30} bytes, larger than any {kind}" in reason
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: never read


def test_the_caps_hold_a_full_index_of_the_smallest_records(tmp_path):
    # A shard of empty records only: one record per 16 bytes, an entry each in both indexes.
    path = tmp_path / "empty-records.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_framed(frame_records([b""] * 100), 100)
    size = path.stat().st_size
    offsets, sparse = OffsetIndexBuilder(), IndexBuilder(1)
    offsets.add_batch(0, 0, [0] * 100)
    sparse.add_batch(0, 0, [0] * 100)
    assert len(offsets.to_bytes(size, None)) <= max_offset_index_bytes(size)
    assert len(sparse.to_bytes(size, None, 100)) <= max_index_bytes(size)
