"""``stats.html``: the statistics report as one self-contained page (inline CSS and SVG, no script, no network).

Drawn from the ``stats.json`` document: the split comparison first (flagged features on top),
then one table per split with one row per feature: presence bar, value summary, an inline SVG
histogram and the top values. Laid out for 1280 px wide screens; prints as it shows.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from tfrbeam.stats.text import format_fraction, value_label

TOP_SHOWN = 5
_HIST_WIDTH, _HIST_HEIGHT = 220, 56

_CSS = """
:root { --ink:#1d2433; --muted:#5b6478; --line:#e3e7ef; --bar:#3b6fd8; --bar2:#8fb0f0; --bad:#c8372d; --ok:#2e8b57; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #f6f7fb; }
main { max-width: 1260px; margin: 0 auto; padding: 24px 20px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 10px; }
.sub { color: var(--muted); margin: 0 0 16px; }
.chips span { display: inline-block; background: #fff; border: 1px solid var(--line); border-radius: 14px;
              padding: 3px 12px; margin: 0 6px 6px 0; }
table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); border-radius: 6px; }
th, td { text-align: left; vertical-align: top; padding: 8px 10px; border-bottom: 1px solid var(--line); }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); background: #fafbfd; }
td.name { font-weight: 600; word-break: break-all; width: 150px; }
td.type { color: var(--muted); width: 80px; }
.num { font-variant-numeric: tabular-nums; }
.kv { display: grid; grid-template-columns: auto auto; column-gap: 10px; font-size: 12.5px; }
.kv b { font-weight: 500; color: var(--muted); }
.presence { width: 150px; } .presence .label { font-size: 12.5px; }
.top { font-size: 12.5px; min-width: 210px; }
.top div { display: grid; grid-template-columns: 110px 1fr auto; gap: 6px; align-items: center; }
.top i { display: block; height: 8px; background: var(--bar2); border-radius: 2px; }
.top .v { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.flag { color: #fff; background: var(--bad); border-radius: 3px; padding: 1px 6px; font-size: 12px; }
.fine { color: var(--ok); font-size: 12px; }
.small { color: var(--muted, #6b7280); font-size: 12px; }
.note { color: var(--muted); font-size: 12px; }
svg.hist rect { fill: var(--bar); } svg.hist rect.q { fill: var(--bar2); }
svg text { font-size: 9px; fill: var(--muted); }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _n(value: Any) -> str:
    """A number for people: integers with separators, others with 4 significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return _e(value)


def presence_bar(present: int, total: int) -> str:
    fraction = present / total if total else 0.0
    width = 120
    filled = round(width * fraction) if present < total else width
    if 0 < present < total:
        filled = min(max(filled, 1), width - 1)  # a partly missing feature never draws as full or empty
    return (
        f'<svg class="presence-bar" width="{width}" height="10" role="img" '
        f'aria-label="present {format_fraction(present, total)}">'
        f'<rect width="{width}" height="10" fill="#e3e7ef"/><rect width="{filled}" height="10" fill="#2e8b57"/></svg>'
        f'<div class="label num">{format_fraction(present, total)} · {present:,} / {total:,}</div>'
    )


def histogram_svg(buckets: list[dict[str, Any]], css_class: str = "", label: str = "histogram", by_value: bool = False) -> str:
    """Bars of ``buckets`` ([{low, high, count}]), heights relative to the largest.

    ``by_value`` places each bar over its value range and draws its density (count per unit of
    value): right for quantile buckets, whose counts are all about equal but whose widths differ.
    """
    if not buckets:
        return '<span class="note">no finite values</span>'
    plot_height = _HIST_HEIGHT - 12
    low_value, high_value = float(buckets[0]["low"]), float(buckets[-1]["high"])
    spread = high_value - low_value
    by_value = by_value and spread > 0
    if by_value:
        lefts = [(float(b["low"]) - low_value) / spread * _HIST_WIDTH for b in buckets]
        widths = [max((float(b["high"]) - float(b["low"])) / spread * _HIST_WIDTH, 0.0) for b in buckets]
        heights = [b["count"] / max(w, 0.5) for b, w in zip(buckets, widths)]
    else:
        widths = [_HIST_WIDTH / len(buckets)] * len(buckets)
        lefts = [index * widths[0] for index in range(len(buckets))]
        heights = [b["count"] for b in buckets]
    peak = max(heights) or 1
    bars = []
    for bucket, left, width, weight in zip(buckets, lefts, widths, heights):
        height = plot_height * weight / peak
        if bucket["count"] and height < 1:
            height = 1
        title = f"[{_n(bucket['low'])}, {_n(bucket['high'])}): {bucket['count']:,}"
        bars.append(
            f'<rect class="{css_class}" x="{left + 0.5:.2f}" y="{plot_height - height:.2f}" '
            f'width="{max(width - 1, 0.5):.2f}" height="{height:.2f}"><title>{_e(title)}</title></rect>'
        )
    low, high = _n(buckets[0]["low"]), _n(buckets[-1]["high"])
    return (
        f'<svg class="hist" width="{_HIST_WIDTH}" height="{_HIST_HEIGHT}" viewBox="0 0 {_HIST_WIDTH} {_HIST_HEIGHT}" '
        f'role="img" aria-label="{_e(label)}">{"".join(bars)}'
        f'<text x="0" y="{_HIST_HEIGHT - 1}">{low}</text>'
        f'<text x="{_HIST_WIDTH}" y="{_HIST_HEIGHT - 1}" text-anchor="end">{high}</text></svg>'
    )


def _summary(feature: Mapping[str, Any]) -> str:
    pairs: list[tuple[str, Any]] = []
    if feature["type"] != "bytes" and feature.get("min") is not None:
        pairs += [("min", feature["min"]), ("mean", feature["mean"]), ("max", feature["max"]), ("std", feature["std"]),
                  ("zeros", feature["num_zeros"])]
        if feature["type"] == "float":
            pairs.append(("NaN", feature["num_nan"]))
            if feature["num_pos_inf"] or feature["num_neg_inf"]:
                pairs.append(("±inf", f"{feature['num_pos_inf']:,} / {feature['num_neg_inf']:,}"))
    if feature.get("num_unique") is not None:
        unique = ("≈" if feature["num_unique_estimated"] else "") + f"{feature['num_unique']:,}"
        pairs.append(("unique", unique))
    length = feature.get("length")
    if length and length.get("min") is not None:
        pairs.append(("length", f"{length['min']:,} / {length['mean']:.3g} / {length['max']:,}"))
    counts = feature["values_per_example"]
    if counts["min"] is not None and (counts["min"] != 1 or counts["max"] != 1):
        pairs.append(("values/ex.", f"{counts['min']:,} / {counts['mean']:.3g} / {counts['max']:,}"))
    if not pairs:
        return '<span class="note">no values</span>'
    return '<div class="kv num">' + "".join(f"<b>{_e(key)}</b><span>{_n(value)}</span>" for key, value in pairs) + "</div>"


def _histograms(feature: Mapping[str, Any]) -> str:
    if feature.get("histogram") is None:
        return '<span class="note">–</span>'
    parts = [histogram_svg(feature["histogram"], "", "equal-width histogram")]
    note = "exact" if feature["histogram_exact"] else f"± {feature['histogram_count_error']:,} per bucket"
    parts.append(f'<div class="note">20 equal-width buckets ({_e(note)})</div>')
    if feature.get("quantile_histogram"):
        parts.append(histogram_svg(feature["quantile_histogram"], "q", "quantile histogram", by_value=True))
        parts.append('<div class="note">decile buckets (density)</div>')
    return "".join(parts)


def _top_values(feature: Mapping[str, Any]) -> str:
    values = feature.get("top_values") or []
    if not values:
        return '<span class="note">–</span>'
    peak = max(item["count"] for item in values) or 1
    rows = []
    for item in values[:TOP_SHOWN]:
        label = value_label(item["value"])
        rows.append(
            f'<div><span class="v" title="{_e(label)}">{_e(label)}</span>'
            f'<i style="width:{100 * item["count"] / peak:.1f}%"></i><span class="num">{item["count"]:,}</span></div>'
        )
    more = len(values) - TOP_SHOWN
    if more > 0:
        rows.append(f'<span class="note">+{more} more in stats.json</span>')
    if not feature.get("top_values_exact", True):
        rows.append(f'<span class="note">counts may be up to {feature["top_values_max_error"]:,} low</span>')
    return "".join(rows)


def _split_section(name: str, split: Mapping[str, Any]) -> str:
    rows = []
    total = split["num_examples"]
    for feature_name, feature in split["features"].items():
        rows.append(
            f'<tr class="feature-row" data-feature="{_e(feature_name)}">'
            f'<td class="name">{_e(feature_name)}</td><td class="type">{_e(feature["type"])}{_shape(feature)}</td>'
            f'<td class="presence">{presence_bar(feature["present"], total)}</td>'
            f"<td>{_summary(feature)}</td><td>{_histograms(feature)}</td><td class=\"top\">{_top_values(feature)}</td></tr>"
        )
    return (
        f'<section class="split" data-split="{_e(name)}"><h2>Split {_e(name)} · {total:,} examples</h2>'
        '<table class="features"><thead><tr><th>Feature</th><th>Type</th><th>Present</th><th>Values</th>'
        "<th>Histogram</th><th>Top values</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>"
    )


def _shape(feature: Mapping[str, Any]) -> str:
    shape = feature.get("shape")
    if shape is None:
        return '<div class="note">variable</div>'
    return f'<div class="note">[{_e(", ".join(map(str, shape)))}]</div>' if shape else ""


def _comparison_section(drift: Mapping[str, Any]) -> str:
    rows = []
    for split, scores in drift.get("comparisons", {}).items():
        for feature, found in scores.items():
            if found is not None:
                rows.append((not found["flagged"], -found["score"], split, feature, found))
    if not rows:
        return ""
    rows.sort(key=lambda row: row[:4])
    body = []
    for _, _, split, feature, found in rows:
        badge = ('<span class="flag">drift</span>' if found["flagged"] else
                 f'<span class="small" title="two samples this small differ by up to {found["chance"]:.3g} by chance">'
                 'too few values</span>' if found.get("too_small") else '<span class="fine">ok</span>')
        width = min(found["score"] / max(found["threshold"], 1e-12), 2.0) * 60
        body.append(
            f'<tr class="drift-row{" flagged" if found["flagged"] else ""}" data-feature="{_e(feature)}" '
            f'data-split="{_e(split)}">'
            f'<td class="name">{_e(feature)}</td><td>{_e(split)} vs {_e(drift["baseline"])}</td>'
            f'<td>{_e(found["method"].replace("_", "-"))}</td><td class="num">{found["score"]:.4f} '
            f'<svg width="120" height="8"><rect width="120" height="8" fill="#e3e7ef"/>'
            f'<rect width="{width:.1f}" height="8" fill="{"#c8372d" if found["flagged"] else "#8fb0f0"}"/>'
            f'<rect x="60" width="1" height="8" fill="#1d2433"/></svg></td>'
            f'<td class="num">{found["threshold"]:g}</td><td>{badge}</td></tr>'
        )
    flagged = len(drift.get("flagged", []))
    return (
        f'<section class="comparison"><h2>Split comparison · {flagged} flagged</h2>'
        '<p class="note">L-infinity distance of the value distributions for categorical features, Jensen–Shannon '
        "divergence of 20-bucket histograms for numeric ones; the bar's tick marks the threshold. A score is drift "
        "only above what two samples of one distribution reach by chance at these sizes (5% level); splits too "
        "small for that to fall below the threshold say \u2018too few values\u2019.</p>"
        '<table class="drift"><thead><tr><th>Feature</th><th>Splits</th><th>Method</th><th>Score</th>'
        "<th>Threshold</th><th></th></tr></thead><tbody>" + "".join(body) + "</tbody></table></section>"
    )


def render_html(stats: Mapping[str, Any], title: str = "dataset") -> str:
    """The report page of a ``stats.json`` document."""
    splits = stats["splits"]
    chips = "".join(
        f'<span>{_e(name)}: <b class="num">{split["num_examples"]:,}</b> examples</span>' for name, split in splits.items()
    )
    features = len(next(iter(splits.values()))["features"]) if splits else 0
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Statistics · {_e(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>Statistics · {_e(title)}</h1>"
        f'<p class="sub">{features} features · {_e(stats.get("source") or "")} · '
        f'tfrbeam {_e(stats.get("tfrbeam_version", ""))}</p>'
        f'<div class="chips">{chips}</div>'
        + _comparison_section(stats.get("drift") or {})
        + "".join(_split_section(name, split) for name, split in splits.items())
        + "</main></body></html>\n"
    )
