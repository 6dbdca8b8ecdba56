"""tfrbeam.tfrecord.blocks (tfrbeam.record_blocks): blocks of records equal RecordReader's records, errors and skips."""

from __future__ import annotations

import gzip
import itertools
import pathlib
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tfrbeam.tfrecord.blocks as record_blocks_module
from tests.helpers import record_offsets as record_starts
from tfrbeam.errors import RecordError
from tfrbeam.tfrecord.blocks import RecordBlock, first_damaged_record, offset_of_record, record_blocks
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordReader, frame_records

CHUNKS = st.sampled_from([16, 31, 64, 257, 4096, 1 << 20])
PAYLOADS = st.lists(st.binary(max_size=300), max_size=30)


def reader_result(path, start=0, **kwargs) -> tuple[list[tuple[int, bytes]], RecordError | None]:
    """RecordReader's records from ``start`` and the error it ends with (None when it reads to the end)."""
    records = []
    try:
        with RecordReader(path, None, start_offset=start, **kwargs) as reader:
            records.extend(reader.records_with_offsets())
    except RecordError as exc:
        return records, exc
    return records, None


def blocks_result(blocks) -> tuple[list[RecordBlock], RecordError | None]:
    got = []
    try:
        got.extend(blocks)
    except RecordError as exc:
        return got, exc
    return got, None


def records_of(blocks: list[RecordBlock]) -> list[tuple[int, bytes]]:
    return [(int(offset), block.payload(i)) for block in blocks for i, offset in enumerate(block.offsets.tolist())]


def same_error(got: RecordError | None, expected: RecordError | None) -> bool:
    if got is None or expected is None:
        return got is expected
    return (type(got), got.path, got.offset, got.check) == (type(expected), expected.path, expected.offset, expected.check)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payloads=PAYLOADS,
    chunk=CHUNKS,
    block_length=st.integers(1, 9),
    first=st.integers(0, 30),
    limit=st.one_of(st.none(), st.integers(0, 30)),
    stop_record=st.one_of(st.none(), st.integers(0, 31)),
    stop_inside=st.integers(0, 20),
    as_file=st.booleans(),
)
def test_blocks_equal_record_reader_from_any_record_start(
    monkeypatch, payloads, chunk, block_length, first, limit, stop_record, stop_inside, as_file
):
    """Any start at a record start, any stop offset (inside a record too), any limit: RecordReader's records, in full blocks."""
    monkeypatch.setattr(record_blocks_module, "READ_CHUNK", chunk)
    starts = record_starts(payloads)
    first = min(first, len(payloads))
    stop = None if stop_record is None else starts[min(stop_record, len(payloads))] + stop_inside
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "f.tfrecord"
        path.write_bytes(frame_records(payloads))
        expected = [(offset, payload) for offset, payload in zip(starts, payloads)][first:]
        expected = [record for record in expected if stop is None or record[0] < stop][:limit]
        with open(path, "rb") as handle:
            source = handle if as_file else str(path)
            blocks = list(record_blocks(source, None, starts[first], block_length, limit, stop_offset=stop))
            headers_only = list(record_blocks(source, None, starts[first], block_length, limit, stop_offset=stop, verify=False))
    assert records_of(blocks) == expected
    assert [len(block.offsets) for block in blocks[:-1]] == [block_length] * (len(blocks) - 1)  # full but the last
    assert all(0 < block.num_records <= block_length for block in blocks)
    assert all(block.data is None for block in headers_only)
    assert [block.offsets.tolist() for block in headers_only] == [block.offsets.tolist() for block in blocks]
    assert [block.lengths.tolist() for block in headers_only] == [block.lengths.tolist() for block in blocks]
    if blocks:
        assert blocks[-1].end_offset == expected[-1][0] + len(expected[-1][1]) + RECORD_OVERHEAD


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=20),
    chunk=CHUNKS,
    block_length=st.integers(1, 7),
    damage=st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.integers(1, 300), st.just(0)),
        st.tuples(st.just("garbage_length"), st.integers(0, 19), st.integers(1, 2**40)),
    ),
    first=st.integers(0, 19),
    stop_record=st.one_of(st.none(), st.integers(0, 20)),
)
def test_damage_gives_record_readers_records_then_its_error(
    monkeypatch, payloads, chunk, block_length, damage, first, stop_record
):
    """Flipped bytes, cut files, absurd lengths: the same good records first, then the same error type, check and offset."""
    monkeypatch.setattr(record_blocks_module, "READ_CHUNK", chunk)
    starts = record_starts(payloads)
    data = bytearray(frame_records(payloads))
    kind, where, value = damage
    if kind == "flip":
        data[where % len(data)] ^= value
    elif kind == "cut":
        del data[max(len(data) - where, 0):]
    else:  # a length field that claims far more than the file holds (its CRC no longer matches)
        at = starts[where % len(payloads)]
        data[at:at + 8] = value.to_bytes(8, "little")
    first = min(first, len(payloads) - 1)
    stop = None if stop_record is None else starts[min(stop_record, len(payloads))]
    with tempfile.TemporaryDirectory() as directory:
        path = str(pathlib.Path(directory) / "f.tfrecord")
        pathlib.Path(path).write_bytes(bytes(data))
        if starts[first] >= len(data):
            return
        expected, error = reader_result(path, starts[first])
        before_stop = [record for record in expected if stop is None or record[0] < stop]
        if error is not None and stop is not None and error.offset >= stop:
            error = None
        blocks, got_error = blocks_result(record_blocks(path, None, starts[first], block_length, stop_offset=stop))
        assert same_error(got_error, error), (got_error, error)
        got = records_of(blocks)
        assert got == (before_stop if error is None else expected[:len(got)])

        # skip_corrupt: the same records and the same skipped regions as RecordReader's.
        skipped_by_reader, skipped = [], []
        expected, error = reader_result(path, starts[first], skip_corrupt=True, on_skip=skipped_by_reader.append)
        assert error is None
        blocks = list(record_blocks(path, None, starts[first], block_length, skip_corrupt=True, on_skip=skipped.append))
        assert records_of(blocks) == expected and skipped == skipped_by_reader


class _NoReader:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the fast path handed an undamaged file to RecordReader")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=PAYLOADS, chunk=CHUNKS, block_length=st.integers(1, 40))
def test_undamaged_files_never_leave_the_fast_path(monkeypatch, payloads, chunk, block_length):
    """The block CRC check accepts every undamaged block (a wrong check would hide behind RecordReader)."""
    monkeypatch.setattr(record_blocks_module, "READ_CHUNK", chunk)
    monkeypatch.setattr(record_blocks_module, "RecordReader", _NoReader)
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "f.tfrecord"
        path.write_bytes(frame_records(payloads))
        blocks = list(record_blocks(str(path), None, 0, block_length))
    assert records_of(blocks) == list(zip(record_starts(payloads), payloads))
    for block in blocks:  # the buffer keeps zero slack after the last record for vectorised readers
        assert len(block.data) - int(block.ends[-1]) >= record_blocks_module.TRAILING_SLACK
        assert not np.asarray(block.data)[int(block.ends[-1]) + 4:].any()


def _framed_block(payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    raw = np.frombuffer(frame_records(payloads), dtype=np.uint8)
    heads = np.array(record_starts(payloads)[:-1], dtype=np.int64)
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    return raw, heads, lengths, heads + 12 + lengths


def test_block_crc_check_fails_for_any_flipped_bit_of_any_record():
    """Every single-bit flip in a length, a length CRC, a payload or a data CRC fails the block check."""
    payloads = [b"", b"a", b"hello world", bytes(range(40))]
    raw, heads, lengths, ends = _framed_block(payloads)
    assert record_blocks_module._block_crcs_match(raw.copy(), heads, lengths, ends, raw.size)
    for position in range(raw.size):
        for bit in range(8):
            damaged = raw.copy()
            damaged[position] ^= 1 << bit
            damaged_lengths = damaged[heads[:, None] + np.arange(8)].copy().view("<u8").reshape(-1).astype(np.int64)
            if (damaged_lengths != lengths).any():
                continue  # the walk would have located other records: the length CRC check is below
            assert not record_blocks_module._block_crcs_match(damaged, heads, lengths, ends, raw.size), (position, bit)
    for record, head in enumerate(heads.tolist()):  # a changed length field fails its length CRC
        damaged = raw.copy()
        damaged[head] ^= 1
        damaged_lengths = damaged[heads[:, None] + np.arange(8)].copy().view("<u8").reshape(-1).astype(np.int64)
        assert not record_blocks_module._block_crcs_match(damaged, heads, damaged_lengths, ends, raw.size), record


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(min_size=1, max_size=60), min_size=2, max_size=12), data=st.data())
def test_damage_in_several_records_of_one_block_fails_the_check(payloads, data):
    """Damage to several records of one block does not cancel out (barring a 2**-32 coincidence)."""
    raw, heads, lengths, ends = _framed_block(payloads)
    damaged = raw.copy()
    records = data.draw(st.sets(st.integers(0, len(payloads) - 1), min_size=2, max_size=4))
    for record in records:
        span = np.r_[heads[record] + 8:heads[record] + 12, heads[record] + 12:ends[record] + 4]  # all but the length
        damaged[span[data.draw(st.integers(0, len(span) - 1))]] ^= data.draw(st.integers(1, 255))
    assert not record_blocks_module._block_crcs_match(damaged, heads, lengths, ends, raw.size)


def test_a_threads_reads_reuse_one_read_buffer_and_interleave_safely(tmp_path):
    """The read buffer outlives a read for the thread's next one; stale bytes in it never leak into blocks."""
    first, second = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    payloads_a = [bytes([n % 251]) * (300 + n) for n in range(200)]
    payloads_b = [bytes([7]) * n for n in range(150)]
    first.write_bytes(frame_records(payloads_a))
    second.write_bytes(frame_records(payloads_b))
    assert records_of(list(record_blocks(str(first), None, 0, 64))) == list(zip(record_starts(payloads_a), payloads_a))
    spare = record_blocks_module._spare.buffer
    assert len(spare) >= first.stat().st_size  # the whole small file was read into it
    reads = record_blocks(str(second), None, 0, 16), record_blocks(str(first), None, 0, 16)
    interleaved = [[], []]
    for pair in itertools.zip_longest(*reads):
        for got, block in zip(interleaved, pair):
            if block is not None:
                got.append(block)
    assert records_of(interleaved[0]) == list(zip(record_starts(payloads_b), payloads_b))
    assert records_of(interleaved[1]) == list(zip(record_starts(payloads_a), payloads_a))
    assert record_blocks_module._spare.buffer is spare or len(record_blocks_module._spare.buffer) >= len(spare)


def test_read_buffers_above_the_cap_are_not_kept(tmp_path, monkeypatch):
    """Blocks of large records need large read buffers; a thread keeps none larger than SPARE_BUFFER_MAX."""
    payloads = [bytes([n]) * 5000 for n in range(40)]
    path = tmp_path / "big.tfrecord"
    path.write_bytes(frame_records(payloads))
    monkeypatch.setattr(record_blocks_module, "READ_CHUNK", 4096)
    kept = {}

    def read(cap: int) -> None:
        monkeypatch.setattr(record_blocks_module, "SPARE_BUFFER_MAX", cap)
        got = list(record_blocks(str(path), None, 0, 8))
        kept[cap] = (records_of(got), getattr(record_blocks_module._spare, "buffer", None))

    for cap in (16 << 10, 1 << 20):  # each in a fresh thread: no spare buffer to start with
        thread = threading.Thread(target=read, args=(cap,))
        thread.start()
        thread.join()
    expected = list(zip(record_starts(payloads), payloads))
    assert kept[16 << 10][0] == expected and kept[16 << 10][1] is None
    assert kept[1 << 20][0] == expected and 4 * 8 * 5016 <= len(kept[1 << 20][1]) <= 1 << 20


def test_compressed_files_and_skipped_records_go_through_the_reader(tmp_path):
    payloads = [bytes([n]) * n for n in range(40)]
    path = tmp_path / "f.tfrecord.gz"
    path.write_bytes(gzip.compress(frame_records(payloads)))
    blocks = list(record_blocks(str(path), "auto", 0, 16))
    assert [block.num_records for block in blocks] == [16, 16, 8]
    assert records_of(blocks) == list(zip(record_starts(payloads), payloads))
    skipped = list(record_blocks(str(path), "gzip", 0, 16, 10, skip_records=5))
    assert records_of(skipped) == list(zip(record_starts(payloads), payloads))[5:15]


def test_offset_of_record_and_block_helpers(tmp_path):
    payloads = [b"a" * n for n in (3, 0, 17, 5, 9)]
    starts = record_starts(payloads)
    path = tmp_path / "f.tfrecord"
    path.write_bytes(frame_records(payloads))
    assert [offset_of_record(str(path), 0, count) for count in range(6)] == starts
    assert offset_of_record(str(path), starts[2], 2) == starts[4]
    (block,) = record_blocks(str(path), None, 0, 10)
    assert block.payload_bytes == sum(map(len, payloads)) and block.end_offset == starts[-1]
    head = block.prefix(3)
    assert records_of([head]) == list(zip(starts, payloads))[:3] and head.end_offset == starts[3]
    assert block.prefix(5) is block
    rebuilt = RecordBlock.from_payloads(payloads, starts[:-1])
    assert records_of([rebuilt]) == records_of([block])
    assert rebuilt.data[int(rebuilt.ends[-1]):] == bytes(record_blocks_module.TRAILING_SLACK)  # decoded in place
    for joined, bounds in (rebuilt.joined(), block.joined()):
        assert joined == b"".join(payloads) and bounds.tolist() == np.cumsum([0, *map(len, payloads)]).tolist()
    with pytest.raises(ValueError, match="block_length"):
        list(record_blocks(str(path), None, 0, 0))


def test_blocks_feed_the_columnar_decoder_as_one_buffer(tmp_path):
    from tfrbeam.codec.decode import examples_to_record_batch
    from tfrbeam.codec.example import encode_example

    payloads = [encode_example({"id": [n], "name": [b"x" * n]}) for n in range(50)]
    path = tmp_path / "f.tfrecord"
    path.write_bytes(frame_records(payloads))
    blocks = list(record_blocks(str(path), None, 0, 20))
    decoded = [examples_to_record_batch((block.data, block.starts, block.ends)) for block in blocks]
    head = blocks[0].prefix(7)
    decoded.append(examples_to_record_batch((head.data, head.starts, head.ends)))
    assert [ids for batch in decoded for ids in batch.column("id").to_pylist()] == [[n] for n in range(50)] + [
        [n] for n in range(7)
    ]


def test_importing_record_blocks_imports_no_beam():
    code = "import sys, tfrbeam.tfrecord.blocks; print('apache_beam' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _framed(payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    frames = np.frombuffer(frame_records(payloads), np.uint8)
    offsets = np.zeros(len(payloads) + 1, np.int64)
    np.cumsum([len(payload) + RECORD_OVERHEAD for payload in payloads], out=offsets[1:])
    return frames, offsets


def test_framed_records_read_back_show_no_damage_until_any_byte_of_them_changes():
    payloads = [b"", b"a", b"carrier=AA origin=JFK", bytes(range(256)) * 3, b"z" * 17]
    frames, offsets = _framed(payloads)
    assert first_damaged_record(frames, offsets) is None
    assert first_damaged_record(frames[:0], offsets[:1]) is None
    for position in range(len(frames)):  # every byte of every header, payload and footer
        damaged = frames.copy()
        damaged[position] ^= 0x04
        found = first_damaged_record(damaged, offsets)
        record = int(np.searchsorted(offsets, position, side="right")) - 1
        assert found is not None and found[0] == record, position
        assert found[1] in ("length", "length_crc", "data_crc")
    assert frames.tobytes() == frame_records(payloads)  # the check works on a copy


def test_framed_records_must_have_the_lengths_the_offsets_say():
    frames, offsets = _framed([b"abc", b"defgh"])
    assert first_damaged_record(frames, np.array([0, 20, 40])) == (0, "length")  # a byte more than framed
    with pytest.raises(ValueError, match="offsets"):
        first_damaged_record(frames[:30], offsets)


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=40) | st.binary(min_size=10, max_size=14), max_size=40),
       block_length=st.integers(1, 12), slack=st.booleans())
def test_payload_objects_are_each_records_payload(payloads, block_length, slack):
    # Values up to 12 bytes sit inside Arrow's binary view, longer ones are named by their place: both sides of it.
    data = frame_records(payloads)
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "f.tfrecord"
        path.write_bytes(data)
        blocks = list(record_blocks(str(path), None, 0, block_length))
    made = [blocks] if payloads else []
    if payloads:  # a block without slack after its last payload (the joined fallback) and one with
        framed = np.frombuffer(data + (b"\0" * 512 if slack else b""), np.uint8)
        starts = np.array(record_starts(payloads)[:-1], np.int64) + 12
        made.append([RecordBlock(framed, starts, starts + np.array([len(p) for p in payloads]), starts - 12)])
    for group in made:
        objects = [value for block in group for value in block.payload_objects()]
        assert objects == payloads and all(type(value) is bytes for value in objects)
    assert RecordBlock.from_payloads([], []).payload_objects().dtype == object
