"""numpy views of a byte buffer at every byte offset: the vectorised reads and writes of framing and codec.

A TFRecord file or a batch of serialized Examples keeps its fields at arbitrary byte offsets.
These views let one fancy index read (or write) such a field for many records at once: as a
little-endian integer, as a row of bytes, or as one opaque ``width``-byte element.
"""

from __future__ import annotations

import numpy as np


def le_integers(buffer: np.ndarray, width: int) -> np.ndarray:
    """``buffer`` (uint8) as little-endian unsigned integers of ``width`` (1, 2, 4 or 8) bytes starting at every offset."""
    return np.ndarray(shape=(buffer.size - width + 1,), dtype=f"<u{width}", buffer=buffer, strides=(1,))


def byte_rows(buffer: np.ndarray, width: int) -> np.ndarray:
    """``buffer`` (uint8) as rows of ``width`` bytes starting at every offset; writes go to ``buffer``."""
    return np.lib.stride_tricks.as_strided(buffer, shape=(buffer.size - width + 1, width), strides=(1, 1))


def windows(buffer: np.ndarray, width: int) -> np.ndarray:
    """Every ``width``-byte window of ``buffer`` as one opaque element (``V{width}``), by start offset."""
    return byte_rows(np.asarray(buffer, dtype=np.uint8), width).view(f"V{width}")[:, 0]
