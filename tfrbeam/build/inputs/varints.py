"""Base-128 varints, as ORC's protobuf footer and Avro's block headers (zigzag-coded there) hold them."""

from __future__ import annotations

__all__ = ["read_varint", "read_zigzag"]


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at position and the position after it; IndexError when data ends inside it."""
    value, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def read_zigzag(data: bytes, position: int) -> tuple[int, int]:
    """The zigzag-coded signed varint (Avro's int and long) at position and the position after it."""
    value, position = read_varint(data, position)
    return (value >> 1) ^ -(value & 1), position
