"""The names of the statistics files a dataset directory may hold beside its manifest."""

from __future__ import annotations

STATS_JSON = "stats.json"
STATS_HTML = "stats.html"
