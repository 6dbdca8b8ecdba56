"""Varints (ORC's footer, Avro's block headers) are at most 10 bytes, as protobuf's and Avro's longs are."""

from __future__ import annotations

import pytest

from tfrbeam.builder.inputs.varints import read_varint, read_zigzag


def test_a_varint_of_more_than_ten_bytes_is_refused_not_grown():
    assert read_varint(b"\xff" * 9 + b"\x01", 0) == (2**64 - 1, 10)
    assert read_zigzag(b"\x03", 0) == (-2, 1)
    with pytest.raises(ValueError, match="a varint at byte 0 runs past 10 bytes"):
        read_varint(b"\xff" * 100_000 + b"\x01", 0)
    with pytest.raises(IndexError):
        read_varint(b"\xff\xff", 0)  # cut short: the callers' "damaged" error
