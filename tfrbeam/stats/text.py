"""A short plain-text summary of a ``stats.json`` document (``tfrbeam stats`` and ``tfrbeam inspect`` print it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfrbeam.base.wording import counted

TOP_IN_SUMMARY = 3


def format_fraction(count: int, total: int) -> str:
    """``count / total`` as a percentage that reads 100 % only when it is exactly 100 % (and 0 % only when 0).

    One decimal by default; more while rounding would show 100.0 or 0.0 (26,111 / 26,115 -> "99.98%").
    """
    if total <= 0:
        return "n/a"
    if count == total:
        return "100%"
    if count == 0:
        return "0%"
    percent = 100.0 * count / total
    for decimals in range(1, 7):
        text = f"{percent:.{decimals}f}"
        if text not in (f"{100:.{decimals}f}", f"{0:.{decimals}f}"):
            return text + "%"
    return ">99.999999%" if percent > 50 else "<0.000001%"


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def value_label(value: Any, width: int | None = None) -> str:
    """A top value of stats.json as text (``base64:...`` for bytes that are not UTF-8), cut to ``width``."""
    text = "base64:" + value["base64"] if isinstance(value, dict) else str(value)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def feature_summary(feature: Mapping[str, Any]) -> str:
    """One feature's values in a phrase: range, mean and std for numbers; distinct count and top values otherwise."""
    parts = []
    if feature.get("min") is not None:
        parts.append(f"{_number(feature['min'])}..{_number(feature['max'])} mean {feature['mean']:.4g} std {feature['std']:.4g}")
        if feature.get("num_nan"):
            parts.append(f"{feature['num_nan']:,} NaN")
    if feature.get("num_unique") is not None and (feature["type"] == "bytes" or feature["num_unique"] <= 20):
        unique = ("~" if feature["num_unique_estimated"] else "") + f"{feature['num_unique']:,} unique"
        top = ", ".join(
            f"{value_label(item['value'], 16)} ({item['count']:,})" for item in feature["top_values"][:TOP_IN_SUMMARY]
        )
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
        lines.append(f"split {split}: {counted(total, 'example', grouped=True)}")
        lines.append(f"  {'feature':<24} {'type':<6} {'present':>9}  values")
        for name, feature in entry["features"].items():
            lines.append(
                f"  {name:<24} {feature['type']:<6} {format_fraction(feature['present'], total):>9}  {feature_summary(feature)}"
            )
    drift = stats.get("drift") or {}
    if drift.get("comparisons"):
        flagged = drift.get("flagged", [])
        lines.append(f"drift against {drift['baseline']}: {len(flagged)} feature(s) flagged")
        for item in flagged:
            lines.append(f"  {item['split']}/{item['feature']}: {item['method']} {item['score']:.4g} > {item['threshold']:g}")
        for split, scores in drift["comparisons"].items():
            small = sorted(name for name, found in scores.items() if found is not None and found.get("too_small"))
            if small:
                lines.append(f"  {split}: too few values to show drift in {len(small)} feature(s) ({', '.join(small[:5])}"
                             f"{', ...' if len(small) > 5 else ''}): samples this small differ by chance beyond the threshold")
    return lines
