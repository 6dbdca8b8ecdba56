"""Helpers several test modules share (one definition each)."""

from __future__ import annotations

import glob
import hashlib
import math
import os
import pathlib
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tfrbeam.builder.config import parse_config
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.read_index import INDEX_SUFFIX, index_path_for, parse_read_index, starts_bytes, table_bytes
from tfrbeam.tfrecord.records import RECORD_OVERHEAD


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


def write_index(data_path: str | os.PathLike, data: bytes, suffix: str = INDEX_SUFFIX) -> None:
    """Put ``data`` where the read index of ``data_path`` lives (``suffix`` ".idx" or ".offsets": a dataset's of before)."""
    index_path = index_path_for(str(data_path), suffix)
    os.makedirs(os.path.dirname(index_path), exist_ok=True)
    with open(index_path, "wb") as handle:
        handle.write(data)


def index_as_written_before(data_path: str | os.PathLike, files: str) -> None:
    """Replace the ``.index`` of ``data_path`` with what a dataset written before it existed has: its split table as an
    ``.idx`` file, its record starts as an ``.offsets`` file, ``both`` or ``none``."""
    index = pathlib.Path(index_path_for(str(data_path)))
    parsed = parse_read_index(index.read_bytes(), str(index))
    index.unlink()
    if files in ("idx", "both"):
        write_index(data_path, table_bytes(parsed.split_table()), ".idx")
    if files in ("offsets", "both"):
        assert parsed.starts is not None
        write_index(data_path, starts_bytes(parsed.starts.offsets, parsed.mtime), ".offsets")


def shard_files(prefix: str, suffix: str = "") -> list[str]:
    """Files named like Beam-style shards of ``prefix`` (``-SSSSS-of-NNNNN`` + suffix), found on disk."""
    pattern = re.escape(prefix) + r"-\d{5}-of-\d{5}" + re.escape(suffix)
    return sorted(path for path in glob.glob(f"{prefix}-*") if re.fullmatch(pattern, path))


# ------------------------------------------------------------------ Parquet: pyarrow's read, the oracle

EXAMPLE_TYPES = {"int64": pa.int64(), "float": pa.float32(), "bytes": pa.binary()}


def same_values(left: Any, right: Any) -> bool:
    """Equal values, NaN equal to NaN (pyarrow's Table.equals says NaN != NaN)."""
    if isinstance(left, float) and isinstance(right, float):
        return (math.isnan(left) and math.isnan(right)) or left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same_values(a, b) for a, b in zip(left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_values(left[key], right[key]) for key in left)
    return left == right


def pyarrow_read(path: str | os.PathLike) -> pa.Table | Exception:
    """pyarrow's own read of a Parquet file (page checksums verified), or the error it refuses the file with."""
    try:
        return pq.read_table(pathlib.Path(path), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as error:
        return error


def _flat(table: pa.Table) -> pa.Table:
    """Struct columns flattened (recursively) into "col.field" columns, the build's source names; pyarrow's
    own flatten applies a null struct to its fields."""
    while any(pa.types.is_struct(field.type) for field in table.schema):
        table = table.flatten()
    return table


def expected_rows(oracle: pa.Table, features: Sequence[Any]) -> list[dict[str, Any]]:
    """Per row, per feature: pyarrow's cast of the feature's source value to the feature's type."""
    flat = _flat(oracle)
    columns = {}
    for spec in features:
        column = flat.column(spec.source)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        target = pa.list_(EXAMPLE_TYPES[spec.type]) if spec.is_list else EXAMPLE_TYPES[spec.type]
        columns[spec.name] = pc.cast(column, target).to_pylist()
    return [{name: values[row] for name, values in columns.items()} for row in range(oracle.num_rows)]


def expected_bad(values: dict[str, Any], features: Sequence[Any]) -> bool:
    """Whether an Example cannot hold the row: a null in an on_null: error feature, or a null list item."""
    for spec in features:
        value = values[spec.name]
        if value is None:
            if spec.on_null == "error":
                return True
        elif isinstance(value, list) and any(item is None for item in value):
            return True
    return False


# ------------------------------------------- TFRecord framing: the oracle for the corrupted vectors


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record_at(data: bytes, offset: int) -> tuple[bytes | None, int]:
    """(the payload if the record at ``offset`` verifies, else None; the offset after it as framed)."""
    header = data[offset:offset + 12]
    if len(header) < 12:
        return None, len(data)
    length, length_crc = struct.unpack("<QI", header)
    end = offset + 12 + length + 4
    if _masked(header[:8]) != length_crc or end > len(data):
        return None, end
    payload = data[offset + 12:offset + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[end - 4:end])
    return (payload if _masked(payload) == payload_crc else None), end


def _intact_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 0
    while offset < len(data):
        payload, end = _record_at(data, offset)
        assert payload is not None, f"the intact file does not verify at {offset}"
        offsets.append(offset)
        offset = end
    return offsets


def _oracle_plain(damaged: bytes, intact_offsets: list[int]) -> tuple[list[bytes], int]:
    kept, skips, in_damaged_run = [], 0, False
    for offset in intact_offsets:
        if offset >= len(damaged):
            break  # cut off before this record started: absent, not damaged
        payload, _ = _record_at(damaged, offset)
        if payload is None:
            skips += 0 if in_damaged_run else 1
            in_damaged_run = True
        else:
            kept.append(payload)
            in_damaged_run = False
    return kept, skips


def _oracle_gzip(damaged: bytes) -> tuple[list[bytes], int]:
    stream = zlib.decompressobj(wbits=31)
    data = stream.decompress(damaged)
    kept, offset = [], 0
    while offset < len(data):
        payload, end = _record_at(data, offset)
        if payload is None:
            break
        kept.append(payload)
        offset = end
    return kept, int(offset < len(data)) + int(not stream.eof)


def corrupt_vectors_oracle(tf_vectors: pathlib.Path) -> tuple[list[tuple[str, str]], int]:
    """What skip_corrupt must give for TensorFlow's corrupt_* vectors, from the files' own structure (framing
    checked with the crc32c package, not tfrbeam.tfrecord.records): (file name, sha256) of every record kept, and the skips.

    An uncompressed file is checked at the record offsets of the intact examples.tfrecord: a record
    whose header and payload CRCs verify is kept; each run of consecutive damaged records (CRC
    mismatch or cut by the end of the file) is one skip. A gzip file is decompressed as far as it
    goes: the complete records are kept, a partial record at the end is one skip, and a stream that
    ends before its trailer is one more.
    """
    intact_offsets = _intact_offsets((tf_vectors / "examples.tfrecord").read_bytes())
    assert len(intact_offsets) == 20
    expected: list[tuple[str, str]] = []
    expected_skips = 0
    paths = sorted(tf_vectors.glob("corrupt_*"))
    assert len(paths) == 7
    for path in paths:
        damaged = path.read_bytes()
        kept, skips = _oracle_gzip(damaged) if path.suffix == ".gz" else _oracle_plain(damaged, intact_offsets)
        assert skips >= 1, f"{path.name}: the oracle finds no damage"
        expected += [(path.name, hashlib.sha256(payload).hexdigest()) for payload in kept]
        expected_skips += skips
    return expected, expected_skips


def config_problems(raw: Any) -> str:
    """The ConfigError message parse_config raises for a raw config (the test fails if it raises none)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return str(caught.value)
