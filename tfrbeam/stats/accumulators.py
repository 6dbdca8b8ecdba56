"""Mergeable per-feature and per-split statistics accumulators, fed one Arrow RecordBatch at a time.

Columns arrive as the columnar decoder gives them with an all-list schema (``stats_schema``):
``list<int64 | float32 | binary>``, null where an example lacks the feature. Counts, sums, min
and max are exact; quantiles, histograms, top values and distinct counts come from the
mergeable sketches of ``tfrbeam.stats.sketches``. ``merge`` of two accumulators equals the
accumulator of both inputs (the Beam CombineFn and the local worker processes rely on it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.codec.kinds import ARROW_TYPES
from tfrbeam.stats.sketches import DistinctCount, QuantileSketch, TopValues, hash_binary, mix64

FEATURE_TYPES = ARROW_TYPES  # feature type name -> its Arrow value type (the one table in tfrbeam.codec.kinds)


def stats_schema(feature_types: Mapping[str, str]) -> pa.Schema:
    """The decode schema statistics read with: every feature a nullable list of its type (absent -> null)."""
    return pa.schema(
        [pa.field(name, pa.list_(FEATURE_TYPES[kind]), nullable=True) for name, kind in sorted(feature_types.items())]
    )


@dataclasses.dataclass
class Moments:
    """Count, mean and sum of squared deviations of finite values, merged with Chan et al.'s pairwise update."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, values: np.ndarray) -> None:
        if len(values):
            mean = float(values.mean())
            self.merge(Moments(len(values), mean, float(np.square(values - mean).sum())))

    def merge(self, other: Moments) -> None:
        if not other.count:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean += delta * other.count / total
        self.m2 += other.m2 + delta * delta * self.count * other.count / total
        self.count = total

    @property
    def std(self) -> float:
        """Population standard deviation (divided by n, as TFDV and numpy's default)."""
        return float(np.sqrt(max(self.m2, 0.0) / self.count)) if self.count else 0.0


class NumericValues:
    """Exact min, max, mean, std, zero/NaN/inf counts, and a KLL sketch of the finite values."""

    def __init__(self, kind: str):
        self.kind = kind
        self.moments = Moments()
        self.quantiles = QuantileSketch()
        self.min: float | int | None = None
        self.max: float | int | None = None
        self.num_zeros = self.num_nan = self.num_pos_inf = self.num_neg_inf = 0

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.num_zeros += int(np.count_nonzero(values == 0))
        if self.kind == "float":
            finite_mask = np.isfinite(values)
            if not finite_mask.all():
                nan = np.isnan(values)
                self.num_nan += int(np.count_nonzero(nan))
                self.num_pos_inf += int(np.count_nonzero(values == np.inf))
                self.num_neg_inf += int(np.count_nonzero(values == -np.inf))
                values = values[finite_mask]
            if not len(values):
                return
        low, high = values.min().item(), values.max().item()
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        as_float = values.astype(np.float64)
        self.moments.add(as_float)
        self.quantiles.add(as_float)

    def merge(self, other: NumericValues) -> None:
        for name in ("num_zeros", "num_nan", "num_pos_inf", "num_neg_inf"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.min is not None and other.max is not None:  # both are set by the first value
            self.min = other.min if self.min is None else min(self.min, other.min)
            self.max = other.max if self.max is None else max(self.max, other.max)
        self.moments.merge(other.moments)
        self.quantiles.merge(other.quantiles)


class CategoricalValues:
    """Top values and the distinct count of int64 or bytes values (keys: the int64 bits, or a 64-bit hash of the bytes).

    With ``numeric_keys`` (int64 features), top values are kept only while the feature looks
    categorical: past ``TopValues.capacity`` distinct values (ids, measurements) they are dropped
    (``top`` is None) rather than estimated, as TFDV gives integer features no top values at all.
    """

    def __init__(self, numeric_keys: bool = False):
        self.numeric_keys = numeric_keys
        self.top: TopValues | None = TopValues()
        self.distinct = DistinctCount()

    def add(self, keys: np.ndarray, labels: pa.Array | None) -> None:
        if self.top is not None:
            self.top.add(keys, labels)
            self._drop_uncategorical_top()
        self.distinct.add(mix64(keys))

    def merge(self, other: CategoricalValues) -> None:
        if self.top is not None and other.top is not None:
            self.top.merge(other.top)
            self._drop_uncategorical_top()
        else:
            self.top = None
        self.distinct.merge(other.distinct)

    def _drop_uncategorical_top(self) -> None:
        if self.numeric_keys and self.top is not None and self.top.pruned:
            self.top = None


@dataclasses.dataclass
class Lengths:
    """Exact min, max and total of byte lengths (of bytes values)."""

    min: int | None = None
    max: int | None = None
    total: int = 0
    count: int = 0

    def add(self, lengths: np.ndarray) -> None:
        if len(lengths):
            self.merge(Lengths(int(lengths.min()), int(lengths.max()), int(lengths.sum()), len(lengths)))

    def merge(self, other: Lengths) -> None:
        if other.count:
            assert other.min is not None and other.max is not None  # set with the first count
            self.min = other.min if self.min is None else min(self.min, other.min)
            self.max = other.max if self.max is None else max(self.max, other.max)
            self.total += other.total
            self.count += other.count


class FeatureAccumulator:
    """Everything the statistics report says about one feature in one split."""

    def __init__(self, kind: str):
        if kind not in FEATURE_TYPES:
            raise ValueError(f"feature type {kind!r} is not one of {sorted(FEATURE_TYPES)}")
        self.kind = kind
        self.present = 0
        self.num_values = 0
        self.values_per_example = Lengths()  # over examples that have the feature
        self.numeric = NumericValues(kind) if kind != "bytes" else None
        self.categorical = CategoricalValues(numeric_keys=kind == "int64") if kind != "float" else None
        self.lengths = Lengths() if kind == "bytes" else None

    def add(self, column: pa.Array) -> None:
        present = len(column) - column.null_count
        if not present:
            return
        self.present += present
        counts = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if column.null_count:
            counts = counts[column.is_valid().to_numpy(zero_copy_only=False)]
        self.values_per_example.add(counts.astype(np.int64))
        values = column.flatten()
        self.num_values += len(values)
        if not len(values):
            return
        if self.kind == "bytes":
            self._add_bytes(values)
            return
        numbers = values.to_numpy(zero_copy_only=False)
        assert self.numeric is not None  # every kind but bytes has numeric statistics
        self.numeric.add(numbers)
        if self.categorical is not None:
            self.categorical.add(numbers.view(np.uint64), None)

    def _add_bytes(self, values: pa.Array) -> None:
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]
        data_buffer = values.buffers()[2]
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
        assert self.lengths is not None and self.categorical is not None  # both exist for bytes
        self.lengths.add(np.diff(offsets))
        self.categorical.add(hash_binary(data, offsets), values)

    def merge(self, other: FeatureAccumulator) -> None:
        self.present += other.present
        self.num_values += other.num_values
        self.values_per_example.merge(other.values_per_example)
        for part in ("numeric", "categorical", "lengths"):
            mine = getattr(self, part)
            if mine is not None:
                mine.merge(getattr(other, part))


class SplitAccumulator:
    """Statistics of one split: the example count and one FeatureAccumulator per feature."""

    def __init__(self, feature_types: Mapping[str, str]):
        self.feature_types = dict(sorted(feature_types.items()))
        self.num_examples = 0
        self.features = {name: FeatureAccumulator(kind) for name, kind in self.feature_types.items()}

    def add(self, batch: pa.RecordBatch) -> None:
        self.num_examples += batch.num_rows
        for name, accumulator in self.features.items():
            index = batch.schema.get_field_index(name)
            if index >= 0:
                accumulator.add(batch.column(index))

    def merge(self, other: SplitAccumulator) -> None:
        if other.feature_types != self.feature_types:
            raise ValueError(
                f"cannot merge statistics of features {sorted(other.feature_types)} into {sorted(self.feature_types)}"
            )
        self.num_examples += other.num_examples
        for name, accumulator in self.features.items():
            accumulator.merge(other.features[name])
