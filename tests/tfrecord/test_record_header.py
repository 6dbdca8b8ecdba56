"""One description of a sound record header: records.sound_header, and everything that checks headers agrees with it.

header_problem and record_length (the scalar checks that name the error) and the vectorised block checks
(length_crcs_match, read_index.offsets_problem) are each held to sound_header on headers sound and damaged.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tfrbeam.errors import RecordError
from tfrbeam.tfrecord.blocks import length_crcs_match
from tfrbeam.tfrecord.read_index import offsets_problem
from tfrbeam.tfrecord.records import (
    HEADER_SIZE,
    MAX_PAYLOAD_SIZE,
    RECORD_OVERHEAD,
    frame_records,
    header_problem,
    masked_crc32c,
    record_length,
    sound_header,
)

LENGTHS = st.integers(0, 64) | st.integers(MAX_PAYLOAD_SIZE - 2, MAX_PAYLOAD_SIZE + 2) | st.integers(0, 2**64 - 1)


def header_of(length: int) -> bytes:
    """The header RecordWriter writes for a payload of ``length`` bytes (any 64-bit length)."""
    encoded = struct.pack("<Q", length)
    return encoded + struct.pack("<I", masked_crc32c(encoded))


@st.composite
def headers(draw) -> bytes:
    """A sound header, one with a flipped bit, random bytes or a cut-off one."""
    header = header_of(draw(LENGTHS))
    kind = draw(st.sampled_from(["sound", "flipped", "random", "short"]))
    if kind == "flipped":
        bit = draw(st.integers(0, 8 * HEADER_SIZE - 1))
        header = header[:bit // 8] + bytes([header[bit // 8] ^ (1 << bit % 8)]) + header[bit // 8 + 1:]
    elif kind == "random":
        header = draw(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
    elif kind == "short":
        header = header[:draw(st.integers(0, HEADER_SIZE - 1))]
    return header


@given(header=headers(), room=st.none() | st.integers(0, 200))
def test_header_problem_and_record_length_agree_with_sound_header(header, room):
    problem = header_problem(header, "f.tfrecord", 7, None if room is None else 7 + room)
    assert (problem is None) == sound_header(header, room)
    if problem is None:
        assert record_length(header, "f.tfrecord", 7, None if room is None else 7 + room) == struct.unpack("<Q", header[:8])[0]
    else:
        assert (problem.path, problem.offset) == ("f.tfrecord", 7)
        with pytest.raises(RecordError) as raised:
            record_length(header, "f.tfrecord", 7, None if room is None else 7 + room)
        assert (type(raised.value), str(raised.value)) == (type(problem), str(problem))


def _within_limit(header: bytes) -> bool:
    return len(header) == HEADER_SIZE and struct.unpack("<Q", header[:8])[0] <= MAX_PAYLOAD_SIZE


@given(found=st.lists(headers().filter(_within_limit), min_size=1, max_size=20))
def test_the_block_length_crc_check_agrees_with_sound_header(found):
    """length_crcs_match (the block readers' and random access's check: one CRC call for all) says yes exactly when
    every header is sound (the lengths' limit the block readers check beside it, so these are within it)."""
    lengths = np.array([struct.unpack("<Q", header[:8])[0] for header in found], dtype=np.uint64)
    crcs = np.array([struct.unpack("<I", header[8:])[0] for header in found], dtype="<u4")
    assert length_crcs_match(lengths, crcs) == all(map(sound_header, found))


@given(payloads=st.lists(st.binary(max_size=30), min_size=1, max_size=12), data=st.data())
def test_the_read_index_offsets_check_agrees_with_sound_header(payloads, data):
    """offsets_problem (the dense index's trust check, vectorised) passes exactly when each header is sound and its
    record ends where the next starts."""
    raw = bytearray(frame_records(payloads))
    offsets = np.cumsum([0] + [len(payload) + RECORD_OVERHEAD for payload in payloads]).astype(np.int64)
    if data.draw(st.booleans()):
        bit = data.draw(st.integers(0, 8 * len(raw) - 1))
        raw[bit // 8] ^= 1 << bit % 8
    expected = all(
        sound_header(raw[start:start + HEADER_SIZE], end - start)
        and record_length(raw[start:start + HEADER_SIZE], "f", start) + RECORD_OVERHEAD == end - start
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())
    )
    assert (offsets_problem(bytes(raw), offsets) is None) == expected
