"""Drift between two splits' distributions of one feature.

- Categorical features (bytes, and int64 with at most ``CATEGORICAL_MAX_UNIQUE`` distinct values
  in both splits): the L-infinity distance between the normalised value distributions,
  ``max_v |p(v) - q(v)|``, as TFDV defines it.
- Numeric features: the Jensen–Shannon divergence (base 2, in [0, 1]) between the two splits'
  histograms over ``DRIFT_BUCKETS`` equal-width buckets of the range both splits cover.

Two samples of one distribution differ by chance, the more so the smaller they are. ``chance_bound``
is the score such samples reach about 5% of the time; a score that cannot clear it says nothing, so a
split whose bound is at or above the threshold is reported as too small to show drift, never flagged.
"""

from __future__ import annotations

import math

import numpy as np

from tfrbeam.stats.accumulators import FeatureAccumulator, NumericValues
from tfrbeam.stats.sketches import TopValues

CATEGORICAL_MAX_UNIQUE = 20
DRIFT_BUCKETS = 20
DEFAULT_THRESHOLDS = {"l_infinity": 0.1, "jensen_shannon": 0.1}


def l_infinity(p: dict, q: dict) -> float:
    """``max |p(v) - q(v)|`` over the values of either distribution (a value one lacks counts as 0 there)."""
    return max((abs(p.get(value, 0.0) - q.get(value, 0.0)) for value in set(p) | set(q)), default=0.0)


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence (base-2 logs) of two histograms, each normalised to sum 1; 0 for identical ones."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.sum() <= 0 or q.sum() <= 0:
        return 0.0
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / m[mask])))

    return min(max(0.5 * kl(p) + 0.5 * kl(q), 0.0), 1.0)


# Two-sample Kolmogorov–Smirnov coefficient at the 5% level: distributions of n and m samples of one source differ
# by at most 1.36 * sqrt(1/n + 1/m) in any cumulative (so also any single value's) frequency, 95% of the time.
_KS_95 = 1.36


def chance_bound(method: str, n: int, m: int) -> float:
    """The score two samples of n and m values of one distribution reach by chance about 5% of the time.

    L-infinity: the two-sample KS bound. Jensen–Shannon: twice its expectation for two samples over
    DRIFT_BUCKETS buckets, (k - 1)(1/n + 1/m) / (8 ln 2), from the chi-square approximation.
    """
    if n <= 0 or m <= 0:
        return math.inf
    if method == "l_infinity":
        return _KS_95 * math.sqrt(1 / n + 1 / m)
    return 2 * (DRIFT_BUCKETS - 1) * (1 / n + 1 / m) / (8 * math.log(2))


def is_categorical(kind: str, *features: FeatureAccumulator) -> bool:
    if kind == "bytes":
        return True
    if kind != "int64":
        return False
    return all(f.categorical is not None and f.categorical.distinct.exact
               and f.categorical.distinct.estimate() <= CATEGORICAL_MAX_UNIQUE for f in features)


def feature_drift(kind: str, base: FeatureAccumulator, other: FeatureAccumulator) -> dict | None:
    """``{"method", "score"}`` comparing ``other`` with ``base``; None when either split has no values to compare."""
    if not base.num_values or not other.num_values:
        return None
    if is_categorical(kind, base, other):
        base_top, other_top = _top_values(base), _top_values(other)
        score = l_infinity(base_top.frequencies(), other_top.frequencies())
        return {"method": "l_infinity", "score": score, "values": [base.num_values, other.num_values]}
    base_numbers, other_numbers = _numeric(base), _numeric(other)
    if base_numbers.min is None or other_numbers.min is None:
        return None
    assert base_numbers.max is not None and other_numbers.max is not None  # set with min
    low = min(base_numbers.min, other_numbers.min)
    high = max(base_numbers.max, other_numbers.max)
    values = [base.num_values, other.num_values]
    if not high > low:
        return {"method": "jensen_shannon", "score": 0.0, "values": values}
    edges = np.linspace(float(low), float(high), DRIFT_BUCKETS + 1)[1:-1].tolist()
    score = jensen_shannon(_masses(base, edges), _masses(other, edges))
    return {"method": "jensen_shannon", "score": score, "values": values}


def _top_values(feature: FeatureAccumulator) -> TopValues:
    """The top values of a feature ``is_categorical`` accepted (they are kept below TopValues' capacity)."""
    assert feature.categorical is not None and feature.categorical.top is not None
    return feature.categorical.top


def _numeric(feature: FeatureAccumulator) -> NumericValues:
    """The numeric statistics of an int64 or float feature."""
    assert feature.numeric is not None
    return feature.numeric


def _masses(feature: FeatureAccumulator, inner_edges: list[float]) -> np.ndarray:
    cdf = _numeric(feature).quantiles.cdf(inner_edges)
    return np.diff(np.concatenate(([0.0], cdf)))


def rounded(value: float) -> float:
    """Scores kept to 6 significant digits in the report (they are estimates)."""
    return float(f"{value:.6g}") if math.isfinite(value) else value
