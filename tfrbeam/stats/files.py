"""The names of the statistics files a dataset directory may hold beside its manifest."""

from __future__ import annotations

from tfrbeam.layout.names import STATS_HTML, STATS_JSON  # noqa: F401 (their home; re-exported here)
