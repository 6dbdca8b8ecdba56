"""The shared deterministic benchmark table: a typical tabular workload of 20 columns.

8 int64 columns `i0`..`i7` of various magnitudes (0/1 flags, small counts, negative values,
full-range 64-bit hashes, ids, epoch seconds), 8 float64 columns `f0`..`f7` (tiny, unit, large,
prices with two decimals, integral values), 2 short strings `s0`, `s1` (5 to 12 lowercase
letters), a 16-float embedding `emb` (list<float32>, as Parquet gives it back) and a nullable
int64 `n0` (10 % nulls). Built column-wise from numpy's default_rng(seed): 1M rows take ~1 s.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EMBEDDING_SIZE = 16
NULL_FRACTION = 0.1


def make_benchmark_table(num_rows: int = 1_000_000, seed: int = 0) -> pa.Table:
    """The benchmark table with `num_rows` rows; the same (num_rows, seed) gives the same table."""
    rng = np.random.default_rng(seed)
    columns: dict[str, pa.Array] = {
        "i0": rng.integers(0, 2, num_rows),
        "i1": rng.integers(0, 100, num_rows),
        "i2": rng.integers(-1_000_000, 1_000_000, num_rows),
        "i3": rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, num_rows, endpoint=True),
        "i4": rng.integers(0, 10, num_rows),
        "i5": rng.integers(0, 2**31, num_rows),
        "i6": rng.integers(-1, 2, num_rows),
        "i7": rng.integers(1_500_000_000, 1_800_000_000, num_rows),
        "f0": rng.normal(0.0, 0.01, num_rows),
        "f1": rng.random(num_rows),
        "f2": rng.exponential(5.0, num_rows),
        "f3": rng.normal(0.0, 1000.0, num_rows),
        "f4": rng.random(num_rows) * 1e-3,
        "f5": np.round(rng.random(num_rows) * 1000.0, 2),
        "f6": rng.normal(0.0, 1.0, num_rows),
        "f7": rng.integers(18, 90, num_rows).astype(np.float64),
    }
    columns = {name: pa.array(values) for name, values in columns.items()}
    columns["s0"] = _random_words(rng, num_rows)
    columns["s1"] = _random_words(rng, num_rows)
    embedding = rng.normal(0.0, 1.0, num_rows * EMBEDDING_SIZE).astype(np.float32)
    offsets = np.arange(0, (num_rows + 1) * EMBEDDING_SIZE, EMBEDDING_SIZE, dtype=np.int32)
    columns["emb"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(embedding))
    nulls = rng.random(num_rows) < NULL_FRACTION
    columns["n0"] = pa.array(rng.integers(0, 1000, num_rows), mask=nulls)
    return pa.table(columns)


def write_parquet(table: pa.Table, path: str, **options) -> None:
    """Write a benchmark Parquet file with page checksums (pyarrow's default stores none), as users should."""
    pq.write_table(table, path, write_page_checksum=True, **options)


def _random_words(rng: np.random.Generator, num_rows: int, shortest: int = 5, longest: int = 12) -> pa.Array:
    """Strings of `shortest`..`longest` lowercase ASCII letters, built from buffers directly."""
    lengths = rng.integers(shortest, longest + 1, num_rows)
    letters = rng.integers(ord("a"), ord("z") + 1, (num_rows, longest), dtype=np.uint8)
    data = letters[np.arange(longest) < lengths[:, None]]
    offsets = np.zeros(num_rows + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(num_rows, pa.py_buffer(offsets), pa.py_buffer(data))
