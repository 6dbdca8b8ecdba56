"""The wire primitives' own contracts, which the decoder tests (tests/codec/test_decode.py) reach only through whole records.

Covered there already and not repeated here: ``gather`` (every width, spans at the buffer's end), the input forms and
checks of ``RecordBuffer`` (``test_input_forms_agree``, ``test_span_input_is_checked``), and every value decoder
against protobuf as oracle.
"""

from __future__ import annotations

import numpy as np

from tfrbeam.codec import wire


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _padded(data: bytes) -> np.ndarray:
    return np.frombuffer(data + bytes(wire.PAD), dtype=np.uint8)


def test_read_lengths_reads_up_to_four_byte_varints_and_flags_longer_ones():
    values = [0, 127, 128, 300, 2**21 - 1, 2**28 - 1, 2**28]
    pieces = [_varint(v) for v in values]
    positions = np.cumsum([0] + [len(p) for p in pieces[:-1]]).astype(np.int64)
    length, after, ok = wire.read_lengths(_padded(b"".join(pieces)), positions)
    assert ok is not None and ok.tolist() == [True] * 6 + [False]  # 2**28 takes 5 bytes: the exact walker's case
    assert length[:6].tolist() == values[:6]
    assert (after[:6] - positions[:6]).tolist() == [len(p) for p in pieces[:6]]
    small, next_at, all_one_byte = wire.read_lengths(_padded(bytes([5, 0, 127])), np.arange(3))
    assert small.tolist() == [5, 0, 127] and next_at.tolist() == [1, 2, 3] and all_one_byte is None


def test_decode_varints_counts_per_owner_keeps_the_low_64_bits_and_names_broken_runs():
    runs = [_varint(1) + _varint(-1), b"", _varint(2**63) + _varint(5), b"\x81", b"\x80" * 10 + b"\x01"]
    starts = np.cumsum([0] + [len(r) for r in runs[:-1]]).astype(np.int64)
    lengths = np.array([len(r) for r in runs], dtype=np.int64)
    owner = np.array([0, 1, 1, 2, 3])
    counts, values, bad = wire.decode_varints(_padded(b"".join(runs)), owner, starts, lengths, 4)
    assert values[:4].tolist() == [1, -1, -(2**63), 5]  # a 10-byte varint is a negative int64, as protobuf reads it
    assert counts[:2].tolist() == [2, 2]
    assert bad.tolist() == [2, 3]  # a cut varint (owner 2) and an 11-byte one (owner 3)


def test_packed_payloads_and_bytes_list_values_accept_only_canonical_lists():
    floats = b"\x0a\x08" + np.array([1.5, -2.0], "<f4").tobytes()
    words = b"\x0a\x02ab\x0a\x00\x0a\x03cde"
    data = floats + words + b"\x12\x00"  # the last list is not field 1: not canonical
    buf = _padded(data)
    start = np.array([0, len(floats) + len(words), len(floats)], dtype=np.int64)
    end = np.array([len(floats), len(data), len(floats)], dtype=np.int64)  # the third is empty
    payload_start, payload_length, ok = wire.packed_payloads(buf, start, end)
    assert ok.tolist() == [True, False, True]
    assert payload_start[0] == 2 and payload_length.tolist() == [8, 0, 0]
    owner, value_start, value_length, bad = wire.bytes_list_values(buf, np.array([len(floats), 0]),
                                                                    np.array([len(floats) + len(words), 4]))
    assert owner.tolist() == [0, 0, 0] and value_length.tolist() == [2, 0, 3]
    assert [data[s : s + n] for s, n in zip(value_start, value_length)] == [b"ab", b"", b"cde"]
    assert bad.tolist() == [1]  # "0a 08 00 00": the value runs past the list's end


def test_record_buffer_pads_a_sequence_with_zeros_the_walk_may_read():
    batch = wire.RecordBuffer.from_sequence([b"\x0a\x00", b"", b"xyz"])
    assert batch.starts.tolist() == [0, 2, 2] and batch.ends.tolist() == [2, 2, 5]
    assert batch.buf.size == 5 + wire.PAD and not batch.buf[5:].any()
    assert [batch.record_bytes(i) for i in range(3)] == [b"\x0a\x00", b"", b"xyz"]
    assert batch.chunk(1, 3).starts.tolist() == [2, 2] and batch.chunk(1, 3).buf is batch.buf


def test_ranges_and_exclusive_cumsum():
    assert wire.exclusive_cumsum(np.array([3, 0, 2])).tolist() == [0, 3, 3]
    assert wire.ranges(np.array([10, 0, 5]), np.array([2, 0, 3])).tolist() == [10, 11, 5, 6, 7]
    assert wire.ranges(np.array([], np.int64), np.array([], np.int64)).size == 0
