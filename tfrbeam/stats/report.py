"""The ``stats.json`` document: split accumulators -> per-split, per-feature statistics and drift between splits.

The schema is documented in docs/stats-export.md ("stats.json"); ``FORMAT`` names its version. Every
feature entry has every key, null where it does not apply (``min`` of a bytes feature).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tfrbeam import __version__
from tfrbeam.codec.json_values import value_to_json
from tfrbeam.stats.accumulators import FeatureAccumulator, SplitAccumulator
from tfrbeam.stats.drift import DEFAULT_THRESHOLDS, chance_bound, feature_drift, rounded
from tfrbeam.stats.sketches import DISTINCT_K, EXACT_VALUES, QUANTILE_K, TOP_CAPACITY

FORMAT = "tfrbeam-stats/1"
HISTOGRAM_BUCKETS = 20
NUM_TOP_VALUES = 20
DECILES = [index / 10 for index in range(11)]


def sketch_notes() -> dict[str, str]:
    """What each estimated number means, written into the report."""
    return {
        "quantiles": f"exact up to {EXACT_VALUES} values per feature and split, then a KLL sketch (Apache "
                     f"DataSketches, k={QUANTILE_K}): each quantile's rank is within quantile_rank_error of the true "
                     "rank (99 % confidence)",
        "histogram": "counts from the same values or sketch: exact when histogram_exact, else each bucket's count "
                     "is within histogram_count_error of the true count (99 % confidence)",
        "top_values": f"Misra-Gries counters (capacity {TOP_CAPACITY}): exact when top_values_exact, else every "
                      "count is at most top_values_max_error below the true count",
        "num_unique": f"bottom-{DISTINCT_K} sketch of 64-bit hashes: exact below {DISTINCT_K} distinct values, else "
                      "an estimate (num_unique_estimated) with relative standard error num_unique_relative_error",
    }


def feature_result(feature: FeatureAccumulator, num_examples: int, shape: Any = None) -> dict[str, Any]:
    """One feature's entry of ``splits.<split>.features``."""
    counts = feature.values_per_example
    entry: dict[str, Any] = {
        "type": feature.kind,
        "shape": shape,
        "present": feature.present,
        "missing": num_examples - feature.present,
        "present_fraction": feature.present / num_examples if num_examples else None,
        "num_values": feature.num_values,
        "values_per_example": {
            "min": counts.min, "max": counts.max, "mean": counts.total / counts.count if counts.count else None,
        },
    }
    entry.update(_numeric_entry(feature))
    entry.update(_categorical_entry(feature))
    lengths = feature.lengths
    entry["length"] = None if lengths is None else {
        "min": lengths.min, "max": lengths.max, "mean": lengths.total / lengths.count if lengths.count else None,
    }
    return entry


def _numeric_entry(feature: FeatureAccumulator) -> dict[str, Any]:
    numeric = feature.numeric
    keys = ("min", "max", "mean", "std", "num_zeros", "num_nan", "num_pos_inf", "num_neg_inf", "quantiles",
            "quantile_rank_error", "histogram", "quantile_histogram", "histogram_exact", "histogram_count_error")
    if numeric is None:
        return dict.fromkeys(keys)
    sketch = numeric.quantiles
    finite = numeric.moments.count
    return {
        "min": numeric.min, "max": numeric.max,
        "mean": numeric.moments.mean if finite else None, "std": numeric.moments.std if finite else None,
        "num_zeros": numeric.num_zeros, "num_nan": numeric.num_nan,
        "num_pos_inf": numeric.num_pos_inf, "num_neg_inf": numeric.num_neg_inf,
        "quantiles": _deciles(numeric),
        "quantile_rank_error": sketch.rank_error,
        "histogram": _equal_width_histogram(numeric),
        "quantile_histogram": _quantile_histogram(numeric),
        "histogram_exact": sketch.exact,
        "histogram_count_error": math.ceil(sketch.mass_error * finite),
    }


def _deciles(numeric) -> list[dict[str, float]]:
    """Values at ranks 0, 0.1, ..., 1: the ends are the exact min and max, the rest from the sketch."""
    values = numeric.quantiles.quantiles(DECILES)
    if values:
        values[0], values[-1] = float(numeric.min), float(numeric.max)
    return [{"rank": rank, "value": value} for rank, value in zip(DECILES, values)]


def _bucket_counts(numeric, edges: list[float]) -> list[int]:
    """Counts of finite values in ``[edges[i], edges[i+1])`` (the last bucket includes its upper edge)."""
    total = numeric.moments.count
    cdf = numeric.quantiles.cdf(edges[1:-1])
    cumulative = [0] + [int(round(fraction * total)) for fraction in cdf[:-1]] + [total]
    return np.diff(np.maximum.accumulate(cumulative)).tolist()


def _buckets(edges: list[float], counts: list[int]) -> list[dict[str, float]]:
    return [{"low": low, "high": high, "count": count} for low, high, count in zip(edges[:-1], edges[1:], counts)]


def _equal_width_histogram(numeric) -> list[dict[str, float]]:
    if numeric.min is None:
        return []
    low, high = float(numeric.min), float(numeric.max)
    if not high > low:
        return _buckets([low, high], [numeric.moments.count])
    edges = np.linspace(low, high, HISTOGRAM_BUCKETS + 1).tolist()
    return _buckets(edges, _bucket_counts(numeric, edges))


def _quantile_histogram(numeric) -> list[dict[str, float]]:
    """Buckets between consecutive distinct deciles (about a tenth of the values each)."""
    if numeric.min is None:
        return []
    edges = sorted({item["value"] for item in _deciles(numeric)})
    if len(edges) == 1:
        return _buckets([edges[0], edges[0]], [numeric.moments.count])
    return _buckets(edges, _bucket_counts(numeric, edges))


def _categorical_entry(feature: FeatureAccumulator) -> dict[str, Any]:
    keys = ("top_values", "top_values_exact", "top_values_max_error", "num_unique", "num_unique_estimated",
            "num_unique_relative_error")
    categorical = feature.categorical
    if categorical is None:
        return dict.fromkeys(keys)
    top = categorical.top
    if top is not None and categorical.numeric_keys and not top.exact:
        top = None  # an int64 feature with more distinct values than the counters hold: not categorical
    values = None
    if top is not None:
        values = []
        for key, label, count in top.top(NUM_TOP_VALUES, signed=feature.kind == "int64"):
            value = value_to_json("bytes", label) if feature.kind == "bytes" else int(np.uint64(key).view(np.int64))
            values.append({"value": value, "count": count})
    distinct = categorical.distinct
    return {
        "top_values": values,
        "top_values_exact": None if top is None else top.exact,
        "top_values_max_error": None if top is None else top.max_error,
        "num_unique": distinct.estimate(),
        "num_unique_estimated": not distinct.exact,
        "num_unique_relative_error": distinct.relative_error,
    }


def split_result(split: SplitAccumulator, shapes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One split's entry; features in the order of ``shapes`` (a manifest's: the source's column order)."""
    shapes = shapes or {}
    return {
        "num_examples": split.num_examples,
        "features": {
            name: feature_result(split.features[name], split.num_examples, shapes.get(name))
            for name in in_source_order(split.features, shapes)
        },
    }


def in_source_order(names: Iterable[str], order: Iterable[str]) -> list[str]:
    """``names`` in ``order`` (the source's column order, as a manifest lists features); names it lacks follow."""
    position = {name: index for index, name in enumerate(order)}
    return sorted(names, key=lambda name: (position.get(name, len(position)), name))


def drift_result(splits: Mapping[str, SplitAccumulator], thresholds: Mapping[str, float],
                 order: Iterable[str] = ()) -> dict[str, Any]:
    """Each split after the first compared with the first, per feature (in ``order``, as split_result's);
    flagged = score above the method's threshold."""
    names = list(splits)
    comparisons: dict[str, Any] = {}
    flagged = []
    if names:
        base = splits[names[0]]
        for split in names[1:]:
            scores: dict[str, dict[str, Any] | None] = {}
            for feature in in_source_order(splits[split].features, order):
                accumulator = splits[split].features[feature]
                found = feature_drift(accumulator.kind, base.features[feature], accumulator)
                if found is None:
                    scores[feature] = None
                    continue
                found["score"] = rounded(found["score"])
                found["threshold"] = thresholds[found["method"]]
                found["chance"] = rounded(chance_bound(found["method"], *found.pop("values")))
                # only a score beyond what chance alone gives at this sample size is drift
                found["too_small"] = found["chance"] >= found["threshold"] > 0
                found["flagged"] = found["score"] > max(found["threshold"], found["chance"])
                scores[feature] = found
                if found["flagged"]:
                    flagged.append({"split": split, "feature": feature, **found})
            comparisons[split] = scores
    flagged.sort(key=lambda item: (-item["score"], item["split"], item["feature"]))
    return {
        "baseline": names[0] if names else None,
        "thresholds": dict(thresholds),
        "comparisons": comparisons,
        "flagged": flagged,
    }


def dataset_stats(
    splits: Mapping[str, SplitAccumulator],
    shapes: Mapping[str, Any] | None = None,
    thresholds: Mapping[str, float] | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The whole ``stats.json`` document (splits in the order given; the first is the drift baseline)."""
    return {
        "format": FORMAT,
        "tfrbeam_version": __version__,
        "source": source,
        "sketches": sketch_notes(),
        "splits": {name: split_result(accumulator, shapes) for name, accumulator in splits.items()},
        "drift": drift_result(splits, {**DEFAULT_THRESHOLDS, **(thresholds or {})}, shapes or {}),
    }
