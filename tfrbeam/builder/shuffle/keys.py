"""Where a record goes, from its bytes alone: content digests and CRCs, seeded sort keys, input-order keys,
split indices and the bucket count (no Beam).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import typing
from collections.abc import Sequence

import crc32c
import numpy as np
import xxhash

from tfrbeam.base.gc_pause import gc_paused

__all__ = [
    "FILE_INDEX_BITS", "MAX_BUCKET_BITS", "MIN_BUCKET_BITS", "ROW_NUMBER_BITS", "bucket_bits_for", "content_digests",
    "input_order_keys", "key_range_bounds", "occurrence_keys", "payload_crcs", "record_checksums", "seeded_sort_keys",
    "split_indices",
]

_SHUFFLE_PERSON = b"tfrbeam-shuffle"
_COPIES_PERSON = b"tfrbeam-copies"
# Odd, so that key + k * _OCCURRENCE_STEP differs for every k < 2**64: a record's copies get distinct keys.
_OCCURRENCE_STEP = np.uint64(0x9E3779B97F4A7C15)
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


def _keyed_mix(values: np.ndarray, seed: int, person: bytes) -> np.ndarray:
    """A bijection of 64-bit values keyed by ``seed``: four rounds of xor with a derived key, then splitmix64's finaliser."""
    round_keys = np.frombuffer(
        hashlib.blake2b(int(seed).to_bytes(8, "little"), digest_size=32, person=person).digest(), dtype="<u8"
    ).astype(np.uint64)
    values = np.asarray(values, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for round_key in round_keys:
            values = _splitmix_finalize(values ^ round_key)
    return values


def seeded_sort_keys(content_hashes: np.ndarray, seed: int) -> np.ndarray:
    """Sort keys from 64-bit content hashes: a bijection keyed by ``seed`` (vectorised, no per-row Python)."""
    return _keyed_mix(content_hashes, seed, _SHUFFLE_PERSON)


def occurrence_keys(keys: np.ndarray, occurrences: np.ndarray) -> np.ndarray:
    """The sort key of copy ``occurrences[i]`` (0, 1, ...) of a record whose key is ``keys[i]``.

    Copy 0 keeps the key (so a dataset without duplicates keeps its order); copy k > 0 gets the
    bijection of key + k * an odd constant, so one record's copies have distinct keys, as uniform
    and as independent of the others as the keys of distinct records. The seed is in the key already.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    occurrences = np.asarray(occurrences, dtype=np.uint64)
    with np.errstate(over="ignore"):
        moved = _keyed_mix(keys + occurrences * _OCCURRENCE_STEP, 0, _COPIES_PERSON)
    return np.where(occurrences == 0, keys, moved)


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


class Bisectable(typing.Protocol):
    """What ``bisect`` needs of a sorted sequence: its length and an item by index (a numpy array, or a file's)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> typing.Any: ...


def key_range_bounds(split: Bisectable, key: Bisectable, range_bits: int,
                     only: int | None = None) -> list[tuple[int, int, int]]:
    """(range, first, end) of each run of records sorted by (split, key) whose keys share their top ``range_bits`` bits.

    One run per split and range (or for range ``only`` alone). ``split`` and ``key`` may be any sequence of
    integers, numpy arrays or arrays read from a file item by item: they are bisected, never read whole.
    """
    count, shift, ranges = len(key), 64 - range_bits, 1 << range_bits
    split, key = typing.cast(Sequence[int], split), typing.cast(Sequence[int], key)  # bisect's stubs want a Sequence
    wanted = range(ranges) if only is None else range(only, only + 1)
    bounds: list[tuple[int, int, int]] = []
    low = 0
    while low < count:
        high = bisect.bisect_right(split, int(split[low]), low, count)  # this split's records: low:high
        for index in wanted:
            first = low if index == 0 else bisect.bisect_left(key, index << shift, low, high)
            end = high if index == ranges - 1 else bisect.bisect_left(key, (index + 1) << shift, first, high)
            if end > first:
                bounds.append((index, first, end))
        low = high
    return bounds
