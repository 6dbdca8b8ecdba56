"""Where a record goes, from its bytes alone: content digests and CRCs, seeded sort keys, input-order keys,
split indices and the bucket count (no Beam).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import crc32c
import numpy as np
import xxhash

from tfrbeam.base.gc_pause import gc_paused

__all__ = [
    "FILE_INDEX_BITS", "MAX_BUCKET_BITS", "MIN_BUCKET_BITS", "ROW_NUMBER_BITS", "bucket_bits_for", "content_digests",
    "input_order_keys", "payload_crcs", "record_checksums", "seeded_sort_keys", "split_indices",
]

_SHUFFLE_PERSON = b"tfrbeam-shuffle"
FILE_INDEX_BITS = 24
ROW_NUMBER_BITS = 64 - FILE_INDEX_BITS
MIN_BUCKET_BITS = 10
MAX_BUCKET_BITS = 24

_crc32c = crc32c.crc32c


def _record_slices(data: np.ndarray | bytes, offsets: np.ndarray) -> list[memoryview]:
    """One memoryview per record of ``data`` (bounded by ``offsets``), for the per-record hash and CRC calls."""
    buffer = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    view = memoryview(np.ascontiguousarray(buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
    bounds = np.asarray(offsets, dtype=np.int64).tolist()
    return [view[start:end] for start, end in zip(bounds, bounds[1:])]


def _digest_array(digests: bytes) -> np.ndarray:
    return np.frombuffer(digests, dtype="<u8").reshape(-1, 2).astype(np.uint64, copy=False)


def content_digests(data: np.ndarray | bytes, offsets: np.ndarray) -> np.ndarray:
    """XXH3-128 of every record in ``data`` (bounded by ``offsets``) as an (n, 2) uint64 array."""
    with gc_paused():
        return _digest_array(b"".join(map(xxhash.xxh3_128_digest, _record_slices(data, offsets))))


def payload_crcs(data: np.ndarray | bytes, offsets: np.ndarray) -> np.ndarray:
    """CRC32C (unmasked, uint32) of every record in ``data`` (bounded by ``offsets``)."""
    with gc_paused():
        payloads = _record_slices(data, offsets)
        return np.fromiter(map(_crc32c, payloads), dtype=np.uint32, count=len(payloads))


def record_checksums(data: np.ndarray | bytes, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``content_digests`` and ``payload_crcs`` together, slicing the records once and reading them in input order."""
    with gc_paused():
        payloads = _record_slices(data, offsets)
        digests = _digest_array(b"".join(map(xxhash.xxh3_128_digest, payloads)))
        return digests, np.fromiter(map(_crc32c, payloads), dtype=np.uint32, count=len(payloads))


def _splitmix_finalize(values: np.ndarray) -> np.ndarray:
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def seeded_sort_keys(content_hashes: np.ndarray, seed: int) -> np.ndarray:
    """Sort keys from 64-bit content hashes: a bijection keyed by ``seed`` (vectorised, no per-row Python)."""
    round_keys = np.frombuffer(
        hashlib.blake2b(int(seed).to_bytes(8, "little"), digest_size=32, person=_SHUFFLE_PERSON).digest(), dtype="<u8"
    ).astype(np.uint64)
    values = np.asarray(content_hashes, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for round_key in round_keys:
            values = _splitmix_finalize(values ^ round_key)
    return values


def input_order_keys(file_index: int, row_numbers: np.ndarray) -> np.ndarray:
    """Sort keys that keep input order: the file's index in the sorted input list, then the row number."""
    rows = np.asarray(row_numbers, dtype=np.int64)
    if not 0 <= file_index < 1 << FILE_INDEX_BITS:
        raise ValueError(f"input file index {file_index} needs more than {FILE_INDEX_BITS} bits (too many input files)")
    if rows.size and (rows.min() < 0 or rows.max() >= 1 << ROW_NUMBER_BITS):
        raise ValueError(f"row numbers must be in [0, 2**{ROW_NUMBER_BITS}), got {rows.min()}..{rows.max()}")
    return (np.uint64(file_index) << np.uint64(ROW_NUMBER_BITS)) | rows.astype(np.uint64)


def split_indices(split_hashes: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    """The split of each record: hash / 2**64 falls into the cumulative fraction intervals."""
    cumulative = [math.fsum(fractions[: i + 1]) for i in range(len(fractions) - 1)]
    thresholds = np.array([min(int(round(c * 2**64)), 2**64 - 1) for c in cumulative], dtype=np.uint64)
    return np.searchsorted(thresholds, np.asarray(split_hashes, dtype=np.uint64), side="right").astype(np.uint16)


def bucket_bits_for(max_shards: int) -> int:
    """Hash buckets for a split written in up to ``max_shards`` shards: about 64 buckets per shard."""
    wanted = math.ceil(math.log2(max(1, max_shards) * 64))
    return min(MAX_BUCKET_BITS, max(MIN_BUCKET_BITS, wanted))
