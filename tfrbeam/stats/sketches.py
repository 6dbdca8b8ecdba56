"""Mergeable summaries of a stream of values: quantiles (KLL), top values (Misra–Gries) and distinct counts (bottom-k).

Every summary has ``add`` (a numpy batch at a time), ``merge`` (another summary of the same
kind; the result summarises the union of both streams) and pickles small, so Beam can ship them
between workers.

- ``QuantileSketch``: the values themselves up to 32,768 of them (exact), then Apache
  DataSketches' KLL sketch (``datasketches.kll_doubles_sketch``): vectorised updates, merges, and
  a documented normalised rank error (``rank_error``, at 99 % confidence).
- ``TopValues``: counters of up to ``capacity`` keys, summed exactly while the stream has at
  most that many distinct keys; past that Misra–Gries pruning keeps every key whose count is
  above ``max_error`` and underestimates any count by at most ``max_error`` (Agarwal et al.,
  "Mergeable summaries", 2012). Counting is vectorised (pending keys sorted and summed in groups).
- ``DistinctCount``: the ``k`` smallest distinct 64-bit hashes. Exact while fewer than ``k``
  distinct values were seen (up to 64-bit hash collisions); past that the estimate
  ``(k - 1) / (h_k / 2^64)`` has relative standard error ``1 / sqrt(k - 2)``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash
from datasketches import kll_doubles_sketch

EXACT_VALUES = 1 << 15  # quantiles and histograms are exact up to 32,768 values per feature and split
QUANTILE_K = 800  # normalised rank error ~0.35 % (quantiles), ~0.45 % (histogram masses), 99 % confidence
TOP_CAPACITY = 4096
DISTINCT_K = 16384  # exact below 16,384 distinct values; then ~0.78 % relative standard error
_PENDING_LIMIT = 1 << 17
_SMALL_RANGE = 4096

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_BYTE_BASE = np.uint64(0x100000001B3)  # odd: its powers are invertible modulo 2^64
_BYTE_INVERSE = np.uint64(pow(int(_BYTE_BASE), -1, 2**64))
_TWO_64 = float(2**64)
_LONG_VALUE = 4096
_HASH_CHUNK_BYTES = 1 << 20


def mix64(keys: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64, copy=True) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def hash_binary(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each value ``data[offsets[i]:offsets[i+1]]`` (uint8 data), equal values giving equal hashes.

    Short values are hashed together without a Python loop, a bounded number of bytes at a time:
    a polynomial hash modulo 2^64 (prefix sums of ``(byte + 1) * B^position``, each value's sum
    rescaled by ``B^-start``) with the length mixed in, then SplitMix64's finaliser. Long values
    (over ``_LONG_VALUE`` bytes) are hashed one by one with XXH3, which is faster per byte.
    """
    offsets = offsets.astype(np.int64, copy=False)
    lengths = np.diff(offsets)
    hashes = np.empty(len(lengths), dtype=np.uint64)
    long_values = np.flatnonzero(lengths > _LONG_VALUE)
    for index in long_values.tolist():
        chunk = data[offsets[index]:offsets[index + 1]]
        hashes[index] = xxhash.xxh3_64_intdigest(chunk.tobytes())
    bounds = [-1] + long_values.tolist() + [len(lengths)]
    for previous, following in zip(bounds[:-1], bounds[1:]):  # runs of short values between long ones
        run_start = previous + 1
        for low, high in _byte_bounded_groups(lengths[run_start:following]):
            hashes[run_start + low:run_start + high] = _polynomial_hashes(data, offsets[run_start + low:run_start + high + 1])
    return mix64(hashes)


def _byte_bounded_groups(lengths: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive value ranges holding about ``_HASH_CHUNK_BYTES`` bytes each (keeps temporaries small)."""
    ends = np.cumsum(lengths)
    groups, low = [], 0
    while low < len(lengths):
        base = ends[low - 1] if low else 0
        high = int(np.searchsorted(ends, base + _HASH_CHUNK_BYTES, side="right"))
        high = max(high, low + 1)
        groups.append((low, high))
        low = high
    return groups


def _polynomial_hashes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    starts, ends = offsets[:-1], offsets[1:]
    base = int(starts[0])
    span = data[base:int(ends[-1])]
    with np.errstate(over="ignore"):
        powers = np.empty(len(span) + 1, dtype=np.uint64)
        powers[0] = 1
        np.cumprod(np.full(len(span), _BYTE_BASE, dtype=np.uint64), out=powers[1:])
        inverse_powers = np.empty(len(span) + 1, dtype=np.uint64)
        inverse_powers[0] = 1
        np.cumprod(np.full(len(span), _BYTE_INVERSE, dtype=np.uint64), out=inverse_powers[1:])
        sums = np.zeros(len(span) + 1, dtype=np.uint64)
        np.cumsum((span.astype(np.uint64) + np.uint64(1)) * powers[:-1], out=sums[1:])
        local_starts, local_ends = starts - base, ends - base
        hashes = (sums[local_ends] - sums[local_starts]) * inverse_powers[local_starts]
        return hashes ^ mix64((ends - starts).astype(np.uint64))


class QuantileSketch:
    """Quantiles, CDF and histogram masses of finite float64 values.

    The values themselves are kept while there are at most ``exact_limit`` of them (exact and the
    same on every run); past that they go into a KLL sketch, whose compactions are randomised.
    """

    def __init__(self, k: int = QUANTILE_K, exact_limit: int = EXACT_VALUES):
        self.k = k
        self.exact_limit = exact_limit
        self._values: list[np.ndarray] | None = []
        self._count = 0
        self._sketch = kll_doubles_sketch(k)

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        values = np.ascontiguousarray(values, dtype=np.float64)
        self._count += len(values)
        if self._values is None:
            self._sketch.update(values)
            return
        self._values.append(values)
        if self._count > self.exact_limit:
            self._to_sketch()

    def merge(self, other: QuantileSketch) -> None:
        if other._values is not None:
            for values in other._values:
                self.add(values)
            return
        self._to_sketch()
        self._count += other._count
        self._sketch.merge(other._sketch)

    def _to_sketch(self) -> None:
        if self._values is not None:
            for values in self._values:
                self._sketch.update(values)
            self._values = None

    def _sorted(self) -> np.ndarray:
        ordered = np.sort(np.concatenate(self._values)) if self._values else np.zeros(0)
        self._values = [ordered]
        return ordered

    @property
    def count(self) -> int:
        return self._count

    @property
    def exact(self) -> bool:
        return self._values is not None or not self._sketch.is_estimation_mode()

    @property
    def rank_error(self) -> float:
        """Normalised rank error of quantiles (99 % confidence); 0 while exact."""
        return 0.0 if self.exact else float(kll_doubles_sketch.get_normalized_rank_error(self.k, False))

    @property
    def mass_error(self) -> float:
        """Error of each histogram bucket's fraction (99 % confidence); 0 while exact."""
        return 0.0 if self.exact else float(kll_doubles_sketch.get_normalized_rank_error(self.k, True))

    def quantiles(self, ranks: list[float]) -> list[float]:
        """The smallest value whose rank (fraction of values at or below it) reaches each of ``ranks``."""
        if not self._count:
            return []
        if self._values is None:
            return [float(value) for value in self._sketch.get_quantiles(ranks, inclusive=True)]
        ordered = self._sorted()
        positions = np.clip(np.ceil(np.asarray(ranks) * len(ordered)).astype(np.int64) - 1, 0, len(ordered) - 1)
        return ordered[positions].tolist()

    def cdf(self, split_points: list[float]) -> list[float]:
        """Fraction of values below each split point (plus 1.0 at the end)."""
        if not self._count:
            return []
        if self._values is None:
            return [float(value) for value in self._sketch.get_cdf(split_points)]
        ordered = self._sorted()
        return (np.searchsorted(ordered, np.asarray(split_points, dtype=np.float64), side="left") / len(ordered)).tolist() + [1.0]

    def __getstate__(self) -> dict:
        values = None if self._values is None else [np.concatenate(self._values)] if self._values else []
        return {"k": self.k, "exact_limit": self.exact_limit, "values": values, "count": self._count,
                "sketch": self._sketch.serialize()}

    def __setstate__(self, state: dict) -> None:
        self.k, self.exact_limit = state["k"], state["exact_limit"]
        self._values, self._count = state["values"], state["count"]
        self._sketch = kll_doubles_sketch.deserialize(state["sketch"])


class TopValues:
    """Approximate top counts of uint64 keys (Misra–Gries), exact while at most ``capacity`` distinct keys were seen.

    ``labels`` (an Arrow array aligned with ``keys``, or None) keeps one original value per key:
    the bytes a hash stands for.
    """

    def __init__(self, capacity: int = TOP_CAPACITY):
        self.capacity = capacity
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.labels: pa.Array | None = None
        self.max_error = 0  # no reported count is more than this below the true count
        self.total = 0
        self._pending: list[tuple[np.ndarray, np.ndarray, pa.Array | None]] = []
        self._pending_size = 0

    def add(self, keys: np.ndarray, labels: pa.Array | None = None) -> None:
        """Count each of ``keys`` once; ``labels[i]`` is the value ``keys[i]`` stands for."""
        if not len(keys):
            return
        self.total += len(keys)
        keys = keys.astype(np.uint64, copy=False)
        counted = _small_range_counts(keys) if labels is None else None
        if counted is not None:  # few distinct small integers (flags, labels, enums): counted here, cheaply
            keys, weights = counted
        else:
            weights = np.ones(len(keys), dtype=np.int64)
        self._pending.append((keys, weights, labels))
        self._pending_size += len(keys)
        if self._pending_size >= _PENDING_LIMIT:
            self._compact()

    def merge(self, other: TopValues) -> None:
        other._compact()
        self.total += other.total
        self.max_error += other.max_error
        self._pending.append((other.keys, other.counts, other.labels))
        self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        parts = [(self.keys, self.counts, self.labels)] + self._pending
        self._pending, self._pending_size = [], 0
        keys = np.concatenate([part[0] for part in parts])
        weights = np.concatenate([part[1] for part in parts])
        unique, counts, first = _grouped_sums(keys, weights)
        label_parts = [part[2] for part in parts if len(part[0])]
        labels = None
        if label_parts and all(part is not None for part in label_parts):
            labels = pa.concat_arrays(label_parts).take(pa.array(first))
        if len(unique) > self.capacity:
            # Misra–Gries: subtract the (capacity+1)-th largest count from every counter, keep those above zero.
            cut = int(np.partition(counts, len(counts) - self.capacity - 1)[len(counts) - self.capacity - 1])
            keep = np.flatnonzero(counts > cut)
            self.max_error += cut
            unique, counts = unique[keep], counts[keep] - cut
            labels = None if labels is None else labels.take(pa.array(keep))
        self.keys, self.counts, self.labels = unique, counts, labels

    @property
    def exact(self) -> bool:
        self._compact()
        return self.max_error == 0

    @property
    def pruned(self) -> bool:
        """Whether more than ``capacity`` distinct keys were seen (as far as the last compaction knows)."""
        return self.max_error > 0

    def top(self, count: int, signed: bool = False) -> list[tuple[int, object, int]]:
        """The ``count`` largest ``(key, label, count)`` triples: by count, ties by label (or key; ``signed``: as int64)."""
        self._compact()
        if not len(self.keys) or count <= 0:
            return []
        cut = np.sort(self.counts)[::-1][min(count, len(self.counts)) - 1]
        candidates = np.flatnonzero(self.counts >= cut)  # every key that could make the list, ties included
        keys = self.keys[candidates]
        labels = self.labels.take(pa.array(candidates)).to_pylist() if self.labels is not None else [None] * len(candidates)
        sort_keys = labels if self.labels is not None else (keys.view(np.int64) if signed else keys).tolist()
        rows = sorted(zip(self.counts[candidates].tolist(), sort_keys, keys.tolist(), labels), key=lambda row: (-row[0], row[1]))
        return [(key, label, value_count) for value_count, _, key, label in rows[:count]]

    def frequencies(self) -> dict[int, float]:
        """Each kept key's share of all counted values (the normalised distribution drift scores compare)."""
        self._compact()
        total = max(self.total, 1)
        return dict(zip(self.keys.tolist(), (self.counts / total).tolist()))

    def __getstate__(self) -> dict:
        self._compact()
        return dict(self.__dict__)


def _distinct_sorted(keys: np.ndarray) -> np.ndarray:
    """The distinct keys, ascending (sort and drop repeats: far faster than np.unique's hashing for uint64)."""
    ordered = np.sort(keys)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def _grouped_sums(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(distinct keys ascending, summed weights, index of each key's first occurrence)``."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if len(ordered) else np.zeros(0, np.int64)
    sums = np.add.reduceat(weights[order], starts) if len(ordered) else np.zeros(0, np.int64)
    return ordered[starts], sums.astype(np.int64), order[starts]


def _small_range_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(distinct keys, counts)`` by ``np.bincount`` when the keys, as int64, span fewer than 4096 values; else None."""
    signed = keys.view(np.int64)
    low, high = int(signed.min()), int(signed.max())
    if high - low >= _SMALL_RANGE:
        return None
    counts = np.bincount(signed - low, minlength=high - low + 1)
    present = np.flatnonzero(counts)
    return (present + low).astype(np.int64).view(np.uint64), counts[present].astype(np.int64)


class DistinctCount:
    """The number of distinct values: exact below ``k`` distinct hashes, then the bottom-k estimate."""

    def __init__(self, k: int = DISTINCT_K):
        self.k = k
        self.hashes = np.zeros(0, dtype=np.uint64)  # sorted, distinct, at most k
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def add(self, hashes: np.ndarray) -> None:
        if len(self.hashes) >= self.k:
            hashes = hashes[hashes < self.hashes[-1]]
        if len(hashes):
            self._pending.append(hashes.astype(np.uint64, copy=False))
            self._pending_size += len(hashes)
            if self._pending_size >= 2 * self.k:  # soon full: from then on most hashes fail the filter above
                self._compact()

    def merge(self, other: DistinctCount) -> None:
        other._compact()
        self._pending.append(other.hashes)
        self._compact()

    def _compact(self) -> None:
        if self._pending:
            merged = _distinct_sorted(np.concatenate([self.hashes] + self._pending))
            self.hashes = merged[: self.k]
            self._pending, self._pending_size = [], 0

    @property
    def exact(self) -> bool:
        self._compact()
        return len(self.hashes) < self.k

    @property
    def relative_error(self) -> float:
        """Relative standard error of ``estimate()``: 0 while exact."""
        return 0.0 if self.exact else 1.0 / float(np.sqrt(self.k - 2))

    def estimate(self) -> int:
        self._compact()
        if len(self.hashes) < self.k:
            return len(self.hashes)
        return int(round((self.k - 1) / ((float(self.hashes[-1]) + 1.0) / _TWO_64)))

    def __getstate__(self) -> dict:
        self._compact()
        return dict(self.__dict__)
