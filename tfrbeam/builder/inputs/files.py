"""Listing the input files of a build (any Beam filesystem) and opening them for reading."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.beam import filesystem
from tfrbeam.builder.inputs.compressed import open_checked
from tfrbeam.errors import ConfigError, InputError

__all__ = ["InputFile", "is_compressed", "list_inputs", "open_input", "openable"]


@dataclass(frozen=True)
class InputFile:
    """One input file and its fingerprint for the manifest."""

    path: str
    size: int
    mtime: float | None


def list_inputs(pattern: str, key: str = "input.path") -> list[InputFile]:
    """The files matching a glob (any Beam filesystem), sorted by path, with size and mtime; errors name ``key``.

    A local directory means the files under it, with or without a trailing "/" (Beam matches "dir" as the
    directory itself, which no reader can open).
    """
    if not pattern.endswith("/") and filesystem.scheme_of(pattern) is None and os.path.isdir(pattern):
        pattern += "/"
    try:
        matches = filesystem.match_pattern(pattern)
    except Exception as error:  # Beam raises BeamIOError and friends, with the cause inside
        raise ConfigError(f"{key}: cannot list {pattern!r}: {error}") from error
    files = sorted((InputFile(m.path, int(m.size_in_bytes), getattr(m, "last_updated_in_seconds", None))
                    for m in matches), key=lambda f: f.path)
    if not files:
        raise ConfigError(f"{key}: {pattern!r} matches no files")
    return files


def open_input(path: str) -> BinaryIO:
    """The input file's bytes; a compressed one decompressed and checked to its end (see inputs.compressed)."""
    try:
        return open_checked(path)  # type: ignore[return-value]  # file-like: read, seek, tell, close
    except Exception as error:
        raise InputError(f"{path}: cannot open: {error}") from error


def is_compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


def openable(path: str) -> str:
    """A local path that opens from any working directory; other filesystems' paths as they are."""
    return path if filesystem.scheme_of(path) is not None else os.path.abspath(path)
