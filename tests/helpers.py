"""Helpers several test modules share (one definition each)."""

from __future__ import annotations

import glob
import os
import re
import struct
from collections.abc import Iterable
from typing import Any

import pytest

from tfrbeam.build.config import parse_config
from tfrbeam.errors import ConfigError
from tfrbeam.record_index import index_path_for
from tfrbeam.records import RECORD_OVERHEAD


def float32_bits(value: float) -> str:
    """A float's float32 bit pattern, so NaNs compare equal and -0.0 differs from 0.0."""
    try:
        return f"0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x}"
    except OverflowError:  # beyond float32's range: not a float32 at all
        return repr(value)


def with_float32_bits(decoded: Any) -> Any:
    """Decoded output with every float replaced by its float32 bit pattern (lists, tuples and dicts walked)."""
    if isinstance(decoded, float):
        return float32_bits(decoded)
    if isinstance(decoded, (list, tuple)):
        return type(decoded)(with_float32_bits(item) for item in decoded)
    if isinstance(decoded, dict):
        return {name: with_float32_bits(value) for name, value in decoded.items()}
    return decoded


def record_offsets(records: Iterable[int | bytes], start: int = 0) -> list[int]:
    """Where each framed record starts (given payloads or payload lengths), then where the last one ends."""
    offsets = [start]
    for record in records:
        length = record if isinstance(record, int) else len(record)
        offsets.append(offsets[-1] + length + RECORD_OVERHEAD)
    return offsets


def write_index(data_path: str | os.PathLike, data: bytes) -> None:
    """Put ``data`` where the read index of ``data_path`` lives."""
    index_path = index_path_for(str(data_path))
    os.makedirs(os.path.dirname(index_path), exist_ok=True)
    with open(index_path, "wb") as handle:
        handle.write(data)


def shard_files(prefix: str, suffix: str = "") -> list[str]:
    """Files named like Beam-style shards of ``prefix`` (``-SSSSS-of-NNNNN`` + suffix), found on disk."""
    pattern = re.escape(prefix) + r"-\d{5}-of-\d{5}" + re.escape(suffix)
    return sorted(path for path in glob.glob(f"{prefix}-*") if re.fullmatch(pattern, path))


def config_problems(raw: Any) -> str:
    """The ConfigError message parse_config raises for a raw config (the test fails if it raises none)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return str(caught.value)
