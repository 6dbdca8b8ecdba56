"""How feature values are written as JSON by the file tools and the statistics: one rule for both.

Bytes are text when they are valid UTF-8, else ``{"base64": ...}``; non-finite floats are strings;
other floats are the shortest decimal that reads back as the same float32 (Example floats are
float32, so ``5.2``, not ``5.199999809265137``).
"""

from __future__ import annotations

import base64
import math
import struct

__all__ = ["shortest_float32", "value_to_json"]

_FLOAT32 = struct.Struct("<f")


def value_to_json(kind: str | None, value: object) -> object:
    """A JSON-safe value: bytes as text when valid UTF-8, else ``{"base64": ...}``; non-finite floats as strings."""
    if kind == "bytes":
        assert isinstance(value, bytes)
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if kind == "float":
        assert isinstance(value, float)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        # Example floats are float32: the shortest text that reads back as the same float32 (5.2, not 5.199999809265137).
        return shortest_float32(value)
    return value


def shortest_float32(value: float) -> float:
    """The float with the fewest significant digits that is still the same float32 as ``value``."""
    for digits in range(1, 10):  # 9 significant digits always round-trip a float32
        candidate = float(f"{value:.{digits}g}")
        try:
            if _FLOAT32.unpack(_FLOAT32.pack(candidate))[0] == value:
                return candidate
        except OverflowError:  # rounded past the largest float32
            continue
    return value
