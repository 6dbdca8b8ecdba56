"""Base-128 varints, as ORC's protobuf footer and Avro's block headers (zigzag-coded there) hold them."""

from __future__ import annotations

__all__ = ["read_varint", "read_zigzag"]


_MAX_VARINT_BYTES = 10  # a 64-bit value: protobuf's and Avro's longest


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at position and the position after it; IndexError when data ends inside it, ValueError
    when it runs past 10 bytes (damage: no 64-bit value is longer, and each further byte would grow the number)."""
    value, shift, start = 0, 0, position
    while position - start < _MAX_VARINT_BYTES:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position
    raise ValueError(f"a varint at byte {start} runs past {_MAX_VARINT_BYTES} bytes; the data is damaged")


def read_zigzag(data: bytes, position: int) -> tuple[int, int]:
    """The zigzag-coded signed varint (Avro's int and long) at position and the position after it."""
    value, position = read_varint(data, position)
    return (value >> 1) ^ -(value & 1), position
