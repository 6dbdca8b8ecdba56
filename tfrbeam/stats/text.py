"""A short plain-text summary of a ``stats.json`` document (``tfrbeam stats`` and ``tfrbeam inspect`` print it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfrbeam.stats.report import format_fraction

TOP_IN_SUMMARY = 3


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _label(value: Any) -> str:
    text = "base64:" + value["base64"] if isinstance(value, dict) else str(value)
    return text if len(text) <= 16 else text[:15] + "…"


def feature_summary(feature: Mapping[str, Any]) -> str:
    """One feature's values in a phrase: range, mean and std for numbers; distinct count and top values otherwise."""
    parts = []
    if feature.get("min") is not None:
        parts.append(f"{_number(feature['min'])}..{_number(feature['max'])} mean {feature['mean']:.4g} std {feature['std']:.4g}")
        if feature.get("num_nan"):
            parts.append(f"{feature['num_nan']:,} NaN")
    if feature.get("num_unique") is not None and (feature["type"] == "bytes" or feature["num_unique"] <= 20):
        unique = ("~" if feature["num_unique_estimated"] else "") + f"{feature['num_unique']:,} unique"
        top = ", ".join(f"{_label(item['value'])} ({item['count']:,})" for item in feature["top_values"][:TOP_IN_SUMMARY])
        parts.append(f"{unique}: {top}" if top else unique)
    counts = feature["values_per_example"]
    if counts["min"] is not None and (counts["min"], counts["max"]) != (1, 1):
        parts.append(f"{counts['min']}..{counts['max']} values/example")
    return "; ".join(parts) if parts else "no values"


def summary_lines(stats: Mapping[str, Any]) -> list[str]:
    """Per split, one line per feature (name, type, presence, values), then the features flagged for drift."""
    lines: list[str] = []
    for split, entry in stats["splits"].items():
        total = entry["num_examples"]
        lines.append(f"split {split}: {total:,} examples")
        lines.append(f"  {'feature':<24} {'type':<6} {'present':>9}  values")
        for name, feature in entry["features"].items():
            lines.append(f"  {name:<24} {feature['type']:<6} {format_fraction(feature['present'], total):>9}  {feature_summary(feature)}")
    drift = stats.get("drift") or {}
    if drift.get("comparisons"):
        flagged = drift.get("flagged", [])
        lines.append(f"drift against {drift['baseline']}: {len(flagged)} feature(s) flagged")
        for item in flagged:
            lines.append(f"  {item['split']}/{item['feature']}: {item['method']} {item['score']:.4g} > {item['threshold']:g}")
    return lines
