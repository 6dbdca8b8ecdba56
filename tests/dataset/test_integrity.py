"""The reader against damaged data: shards that disagree with the manifest, and read indexes that disagree with the data."""

from __future__ import annotations

import bisect
import json
import logging
import os
import pathlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import FixedLenFeature, open_dataset
from tfrbeam.errors import ShardMismatchError
from tfrbeam.tfrecord.read_index import ReadIndexBuilder, index_path_for, parse_read_index, seek_position, stamp_read_index
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordWriter, masked_crc32c, read_records

SPEC = {"id": FixedLenFeature((), "int64"), "pad": FixedLenFeature((), "bytes")}
INTERVAL = 400  # bytes between index entries: many entries in a small file


def make_record(record_id: int, pad: int = 0) -> bytes:
    return encode_example({"id": record_id, "pad": b"p" * (record_id % 7 + pad)})


def write_shard(path: pathlib.Path, ids: list[int], stamp: bool = True) -> None:
    """A shard of the given record ids with a read index (real mtime when ``stamp``, else none, as builds wrote)."""
    builder = ReadIndexBuilder(INTERVAL)
    with RecordWriter(str(path)) as writer:
        for record_id in ids:
            builder.add(writer.bytes_written, writer.records_written)
            writer.write(make_record(record_id))
    index_path = pathlib.Path(index_path_for(str(path)))
    index_path.parent.mkdir(exist_ok=True)
    index_path.write_bytes(builder.to_bytes(path.stat().st_size, None))
    if stamp:
        stamp_read_index(str(path))


def build_dir(root: pathlib.Path, sizes: list[int], stamp: bool = True) -> pathlib.Path:
    """A dataset directory with one split "train" of shards of ``sizes`` records and its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    shards, next_id = [], 0
    for number, size in enumerate(sizes):
        path = root / f"train-{number:05d}-of-{len(sizes):05d}.tfrecord"
        write_shard(path, list(range(next_id, next_id + size)), stamp)
        next_id += size
        shards.append({"path": path.name, "num_examples": size, "num_bytes": path.stat().st_size})
    manifest = {
        "format": "tfrbeam-dataset/1",
        "compression": None,
        "splits": {"train": {"num_examples": next_id, "num_bytes": 0, "shards": shards}},
        "features": {"id": {"type": "int64", "shape": [], "always_present": True},
                     "pad": {"type": "bytes", "shape": [], "always_present": True}},
    }
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


def ids_of(dataset) -> list[int]:
    return [int(value) for batch in dataset for value in batch["id"].tolist()]


def record_offsets(path: pathlib.Path) -> list[int]:
    offsets, position = [], 0
    for payload in read_records(str(path)):
        offsets.append(position)
        position += len(payload) + RECORD_OVERHEAD
    return offsets


def merge_two_records(path: pathlib.Path, first: int) -> None:
    """Rewrite records ``first`` and ``first + 1`` as one valid Example of the same framed size (the file keeps its size)."""
    data = path.read_bytes()
    offsets = record_offsets(path) + [len(data)]
    start, end = offsets[first], offsets[first + 2]
    target = end - start - RECORD_OVERHEAD
    payload = next(p for p in (encode_example({"id": 10**9, "pad": b"m" * n}) for n in range(target)) if len(p) == target)
    framed = struct.pack("<Q", target) + struct.pack("<I", masked_crc32c(struct.pack("<Q", target)))
    framed += payload + struct.pack("<I", masked_crc32c(payload))
    before = path.stat().st_mtime_ns
    path.write_bytes(data[:start] + framed + data[end:])
    # A rewrite moves the mtime, but within one tick of the kernel's coarse clock it can come out
    # unchanged; model a later rewrite, as the measured case was (a same-tick rewrite that keeps
    # every index entry consistent is the gap the README names).
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


# ---------------------------------------------------------------------- the manifest is the truth


def test_a_shard_cut_at_a_record_boundary_raises_naming_shard_counts_and_verify(tmp_path):
    root = build_dir(tmp_path / "ds", [60, 80])
    shard = root / "train-00001-of-00002.tfrecord"
    cut = record_offsets(shard)[50]
    shard.write_bytes(shard.read_bytes()[:cut])
    dataset = open_dataset(root, "train", batch_size=16, executor="threads")
    assert len(dataset) == 9  # what the manifest promises; reading must deliver it or fail
    with pytest.raises(ShardMismatchError, match=r"train-00001-of-00002\.tfrecord: the manifest says \d+ bytes.*tfrbeam verify"):
        list(dataset)
    with pytest.raises(ShardMismatchError):
        list(open_dataset(root, "train", batch_size=16, executor="threads").shard(2, 0, by="record"))


def test_a_shard_with_fewer_records_of_the_same_size_raises_with_both_counts(tmp_path):
    root = build_dir(tmp_path / "ds", [60, 80])
    shard = root / "train-00000-of-00002.tfrecord"
    merge_two_records(shard, 20)
    with pytest.raises(
        ShardMismatchError, match=r"train-00000-of-00002\.tfrecord: the manifest says 60 records, the shard has 59"
    ) as info:
        list(open_dataset(root, "train", batch_size=16, executor="threads"))
    assert (info.value.expected, info.value.found) == (60, 59)
    for workers in (2, 3, 7):
        with pytest.raises(ShardMismatchError, match="60 records"):
            for index in range(workers):
                list(open_dataset(root, "train", batch_size=16, executor="threads").shard(workers, index, by="record"))


def test_a_shard_with_more_records_than_the_manifest_raises(tmp_path):
    root = build_dir(tmp_path / "ds", [30])
    manifest = json.loads((root / "tfrbeam_dataset.json").read_text())
    manifest["splits"]["train"]["shards"][0]["num_examples"] = 29
    manifest["splits"]["train"]["num_examples"] = 29  # the split's total agrees (else the manifest validator refuses it)
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardMismatchError, match="the manifest says 29 records, the shard has 30"):
        list(open_dataset(root, "train", batch_size=8, executor="processes", num_workers=2))


def test_an_intact_dataset_reads_whole_by_every_sharding(tmp_path):
    root = build_dir(tmp_path / "ds", [60, 80])
    for workers in (1, 2, 3, 7):
        union = []
        for index in range(workers):
            union += ids_of(open_dataset(root, "train", batch_size=16, executor="threads").shard(workers, index, by="record"))
        assert sorted(union) == list(range(140))


# ------------------------------------------------------------------- indexes are checked, not trusted


def record_range_union(path_or_glob, workers: int, **kwargs) -> list[int]:
    union = []
    for index in range(workers):
        union += ids_of(
            open_dataset(path_or_glob, batch_size=16, executor="threads", feature_spec=SPEC, **kwargs).shard(
                workers, index, by="record"
            )
        )
    return union


@pytest.mark.parametrize("stamped", [False, True], ids=["index-without-mtime", "index-with-an-older-mtime"])
def test_a_stale_index_is_ignored_with_a_warning_and_no_record_is_read_twice(tmp_path, caplog, stamped):
    shard = tmp_path / "part-0.tfrecord"
    write_shard(shard, list(range(300)), stamp=stamped)
    expected = sorted(set(range(300)) - {100, 101} | {10**9})
    # The case measured: the file changed but kept its size; the index (no mtime, as builds wrote them) counts 300.
    merge_two_records(shard, 100)
    index_path = index_path_for(str(shard))
    if stamped:
        later = shard.stat().st_mtime + 5
        os.utime(shard, (later, later))
    caplog.set_level(logging.WARNING)
    for workers in (2, 3, 7):
        assert sorted(record_range_union(str(shard), workers)) == expected
    warnings = [record.getMessage() for record in caplog.records if "ignoring the read index" in record.getMessage()]
    assert len(warnings) == 1 and index_path in warnings[0] and str(shard) in warnings[0]
    # resuming after 7 batches of a record-range shard reads the rest exactly once
    dataset = open_dataset(str(shard), batch_size=16, executor="threads", feature_spec=SPEC, seed=3).shard(2, 1, by="record")
    iterator = iter(dataset)
    head = [int(value) for _ in range(7) for value in next(iterator)["id"].tolist()]
    state = dataset.state_dict()
    resumed = open_dataset(str(shard), batch_size=16, executor="threads", feature_spec=SPEC, seed=3).shard(2, 1, by="record")
    resumed.load_state_dict(state)
    rest = ids_of(resumed)
    first_half = ids_of(open_dataset(str(shard), batch_size=16, executor="threads", feature_spec=SPEC).shard(2, 0, by="record"))
    assert sorted(first_half + head + rest) == expected


def forge(shard: pathlib.Path, offsets: list[int], numbers: list[int], num_records: int) -> None:
    """Write an index for ``shard`` with these entries (a split table alone), a valid CRC and the file's real size and
    mtime."""
    index_path = pathlib.Path(index_path_for(str(shard)))
    header = struct.pack(
        "<8sIIQdQQ", b"TFRBIDX1", 1, INTERVAL, shard.stat().st_size, shard.stat().st_mtime, num_records, len(offsets)
    )
    body = header + b"".join(struct.pack("<QQ", offset, number) for offset, number in zip(offsets, numbers))
    index_path.write_bytes(body + struct.pack("<I", masked_crc32c(body)))


def test_an_index_with_record_numbers_off_by_one_loses_no_record(tmp_path, caplog):
    shard = tmp_path / "part-0.tfrecord"
    write_shard(shard, list(range(300)))
    index = parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "index").table
    forge(shard, list(index.offsets), [0] + [number + 1 for number in index.record_numbers[1:]], index.num_records + 1)
    caplog.set_level(logging.WARNING)
    assert sorted(record_range_union(str(shard), 3)) == list(range(300))
    assert any("ignoring the read index" in record.getMessage() for record in caplog.records)


def test_an_index_entry_inside_a_payload_is_reported_as_the_index_fault_not_a_truncated_record(tmp_path, caplog):
    shard = tmp_path / "part-0.tfrecord"
    write_shard(shard, list(range(300)))
    index = parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "index").table
    offsets = list(index.offsets)
    used = bisect.bisect_right(index.record_numbers, 300 // 7) - 1  # the entry worker 1 of 7 seeks with
    offsets[used] += 13  # inside the record's payload
    forge(shard, offsets, list(index.record_numbers), index.num_records)
    caplog.set_level(logging.WARNING)
    assert sorted(record_range_union(str(shard), 7)) == list(range(300))
    messages = [record.getMessage() for record in caplog.records if "ignoring the read index" in record.getMessage()]
    assert messages and f"entry {used}" in messages[0] and "no record starts at offset" in messages[0]


@st.composite
def forgeries(draw):
    """A real index's entries with some changed: offsets moved, numbers shifted, entries dropped or the count changed."""
    changes = draw(
        st.lists(
            st.tuples(st.integers(0, 40), st.sampled_from(["offset", "number", "shift", "drop"]), st.integers(-40, 40)),
            min_size=1,
            max_size=4,
        )
    )
    count_delta = draw(st.sampled_from([0, 0, 1, -1]))
    workers = draw(st.sampled_from([2, 3, 5]))
    return changes, count_delta, workers


@pytest.fixture(scope="module")
def forged_dataset(tmp_path_factory):
    root = build_dir(tmp_path_factory.mktemp("forged") / "ds", [250, 180])
    shard = root / "train-00000-of-00002.tfrecord"
    return root, shard, parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "index").table


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(forgeries())
def test_a_forged_index_cannot_change_which_records_are_read(forged_dataset, forgery):
    root, shard, index = forged_dataset
    changes, count_delta, workers = forgery
    offsets, numbers = list(index.offsets), list(index.record_numbers)
    for position, kind, amount in changes:
        if not offsets:
            break
        position %= len(offsets)
        if kind == "offset":
            offsets[position] = max(0, offsets[position] + amount)
        elif kind == "number":
            numbers[position] = max(0, numbers[position] + amount)
        elif kind == "shift":
            numbers[position:] = [max(0, number + amount) for number in numbers[position:]]
        else:
            del offsets[position], numbers[position]
    forge(shard, offsets, numbers, index.num_records + count_delta)
    try:
        union = []
        for number in range(workers):
            union += ids_of(open_dataset(root, "train", batch_size=16, executor="threads").shard(workers, number, by="record"))
        assert sorted(union) == list(range(430))
    finally:
        forge(shard, list(index.offsets), list(index.record_numbers), index.num_records)


def test_a_current_index_is_used_without_a_warning(tmp_path, caplog, monkeypatch):
    shard = tmp_path / "part-0.tfrecord"
    write_shard(shard, list(range(300)))
    caplog.set_level(logging.WARNING)
    import tfrbeam.dataset.reader as reader_module

    walked: list[int] = []
    original = reader_module.offset_of_record
    monkeypatch.setattr(
        reader_module, "offset_of_record", lambda path, offset, count: walked.append(count) or original(path, offset, count)
    )
    assert sorted(record_range_union(str(shard), 5)) == list(range(300))
    assert not [record for record in caplog.records if "read index" in record.getMessage()]
    record_size = len(make_record(6)) + RECORD_OVERHEAD
    assert walked and max(walked) <= INTERVAL // (record_size - 6) + 1  # seeks from an entry, not the file start
    assert os.path.exists(index_path_for(str(shard)))


def test_a_rewrite_in_the_same_mtime_tick_is_caught_on_every_seek_by_the_last_entrys_walk(tmp_path, caplog):
    """Checks are cached per (size, mtime); a rewrite of the same size in the same mtime tick keeps that key, so the
    cheap check (the last entry's walk ends at the end of the file after the index's count) runs on every seek."""
    shard = tmp_path / "part-0.tfrecord"
    write_shard(shard, list(range(300)))
    index = parse_read_index(pathlib.Path(index_path_for(str(shard))).read_bytes(), "index").table
    last = len(index.offsets) - 1
    number = index.record_numbers[last]
    assert seek_position(str(shard), number, 300) == (index.offsets[last], number)  # checked and cached
    middle = bisect.bisect_right(index.record_numbers, 150) - 1
    assert seek_position(str(shard), 150, 300) == (index.offsets[middle], index.record_numbers[middle])
    tick = shard.stat().st_mtime_ns
    merge_two_records(shard, number - 1)  # the last entry now points inside a payload
    os.utime(shard, ns=(tick, tick))  # ... and the rewrite landed in the same mtime tick
    caplog.set_level(logging.WARNING)
    assert seek_position(str(shard), 150, 300) == (0, 0)  # a seek that does not use the last entry catches it too
    assert seek_position(str(shard), number, 300) == (0, 0)
    assert any("ignoring the read index" in record.getMessage() for record in caplog.records)
    assert sorted(record_range_union(str(shard), 3)) == sorted(set(range(300)) - {number - 1, number} | {10**9})
