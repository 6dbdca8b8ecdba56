"""Input formats: the names ``input.format`` takes, the file extensions that name one, and the ``input.format`` key,
which falls back to the format the path's extension (or a dataset directory) names."""

from __future__ import annotations

import os
from typing import Any

from tfrbeam.builder.config.keys import Checker, Kind, Scope
from tfrbeam.builder.config.split_keys import split_patterns
from tfrbeam.layout.names import MANIFEST_NAMES
from tfrbeam.tfrecord.records import compression_suffix

__all__ = [
    "FORMAT_EXTENSIONS",
    "INPUT_FORMATS",
    "ROWS_FORMAT",
    "InputFormat",
    "format_from_path",
    "without_compression_suffix",
]

INPUT_FORMATS = ("csv", "parquet", "jsonl", "orc", "avro", "tfrecord")
# input.format of a build whose rows come from no files (write_dataset, WriteDataset): given, never read from YAML.
ROWS_FORMAT = "arrow"
# The extensions that name a format when input.format is left out; each may carry a compression suffix.
FORMAT_EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet",
                     ".parq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".orc": "orc",
                     ".avro": "avro", ".tfrecord": "tfrecord"}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".lzma", ".zst", ".zstd", ".deflate")  # what Beam's AUTO detects


def format_from_path(path: str) -> str | None:
    """The input format a path's (or glob's) extension names, a compression suffix (.gz, ...) left aside; or None."""
    lower = without_compression_suffix(path).removesuffix(compression_suffix("zlib"))  # TFRecord's own ZLIB files
    return next((fmt for extension, fmt in FORMAT_EXTENSIONS.items() if lower.endswith(extension)), None)


def without_compression_suffix(path: str) -> str:
    lower = path.lower()
    suffix = next((suffix for suffix in _COMPRESSION_SUFFIXES if lower.endswith(suffix)), "")
    return lower[:len(lower) - len(suffix)]


class InputFormat(Kind):
    """``input.format``: one of INPUT_FORMATS; left out, the one input.path's extension names (or the first file
    pattern's, with file-pattern splits), or tfrecord for a local dataset directory."""

    empty = "csv"

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        patterns = split_patterns(scope.outer.raw.get("splits")) if scope.outer is not None else ()
        path = scope.value("path")
        given = scope.raw.get(name)
        fmt = given or format_from_path(path or (patterns[0][1] if patterns else "")) or _dataset_format(path)
        if patterns and not given:
            _check_pattern_formats(scope.check, patterns)
        if fmt is None and not path:
            return "csv"  # no input.path: that is the problem, reported as such
        if fmt is None:
            known = ", ".join(FORMAT_EXTENSIONS)
            scope.fail(name, f"is required: {path!r} does not end in an extension that names a format ({known}; "
                       f"each also with .gz, .bz2, .xz, .zst or .deflate), nor is it a tfrbeam dataset directory "
                       f"(allowed: {', '.join(INPUT_FORMATS)})")
            return "csv"
        return scope.check.choice({name: fmt}, name, scope.path, INPUT_FORMATS, "csv") or "csv"


def _dataset_format(path: str) -> str | None:
    """tfrecord for a local directory holding a dataset manifest (a tfrbeam dataset to re-split or re-shard)."""
    return "tfrecord" if path and any(os.path.isfile(os.path.join(path, name)) for name in MANIFEST_NAMES) else None


def _check_pattern_formats(check: Checker, patterns: tuple[tuple[str, str], ...]) -> None:
    """File-pattern splits read one format: globs whose extensions name different ones need input.format."""
    formats = [(name, format_from_path(pattern)) for name, pattern in patterns]
    if len({fmt for _, fmt in formats if fmt is not None}) > 1:
        check.fail("splits", f"the globs name different formats ({', '.join(f'{name}: {fmt}' for name, fmt in formats)}); "
                   "one build reads one input.format")
