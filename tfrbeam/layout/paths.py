"""Paths a manifest names, confined to the dataset directory.

A manifest is data found on disk or in a bucket, not something tfrbeam just wrote, so every path
it gives (a shard, a split name) is resolved here: relative, "/"-separated, no ``..``, no empty,
``.``, backslash or NUL component, and, on a local disk, no symlink that leads out of the dataset.
Remote (``scheme://``) paths are confined by prefix: object stores have no symlinks.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from tfrbeam.base.file_access import is_remote
from tfrbeam.errors import UnsafePathError

MAX_COMPONENT = 255  # bytes of one path component on common filesystems
MAX_PATH = 4096


def path_problem(value: object) -> str | None:
    """Why ``value`` is not a safe relative "/"-path inside a dataset, or None when it is."""
    if not isinstance(value, str):
        return f"expected a relative path (a string), got {_show(value)}"
    if not value:
        return "expected a relative path, got an empty string"
    if len(value) > MAX_PATH:
        return f"a path of {len(value)} characters is longer than {MAX_PATH}"
    if "\x00" in value:
        return f"{_show(value)} holds a NUL character"
    if "\\" in value:
        return f"{_show(value)} holds a backslash; manifest paths are '/'-separated"
    if value.startswith("/") or is_remote(value) or (len(value) > 1 and value[1] == ":"):
        return f"{_show(value)} is absolute; manifest paths are relative to the dataset directory"
    for part in value.split("/"):
        if part in ("", ".", ".."):
            return f"{_show(value)} has a {part or 'empty'!r} component; it must name a file inside the dataset"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT:
            return f"{_show(value)} has a component longer than {MAX_COMPONENT} bytes"
    return None


def name_problem(value: object) -> str | None:
    """Why ``value`` is not a safe single directory name inside a dataset (a split name), or None."""
    problem = path_problem(value)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if "/" in value:
        return f"{_show(value)} holds '/'; it must be one directory name"
    if value.startswith("."):
        return f"{_show(value)} starts with '.', which names tfrbeam's hidden files"
    return None


def check_relative(value: object, key: str) -> str:
    """``value`` when it is a safe relative path, else ``UnsafePathError`` naming ``key`` and the value."""
    problem = path_problem(value)
    if problem is not None:
        raise UnsafePathError(f"{key}: {problem}")
    assert isinstance(value, str)
    return value


def confined_path(root: str, relative: object, key: str,
                  join: Callable[..., str] | None = None) -> str:
    """``root`` joined with the manifest's ``relative`` path, proven to stay inside ``root``.

    Local paths are resolved with their symlinks; one that leads outside ``root`` is refused.
    ``join`` joins paths of another filesystem (remote paths are checked by prefix only).
    """
    relative = check_relative(relative, key)
    parts = relative.split("/")
    if is_remote(root):
        joined = (join or posixpath.join)(root, *parts)
        prefix = root.rstrip("/") + "/"
        if not joined.startswith(prefix):
            raise UnsafePathError(f"{key}: {relative!r} resolves to {joined}, outside the dataset {root}")
        return joined
    joined = (join or os.path.join)(root, *parts)
    real = escapes(root, joined)
    if real is not None:
        raise UnsafePathError(
            f"{key}: {relative!r} resolves to {real}, outside the dataset {os.path.realpath(root)} (a symlink leads out "
            "of it); tfrbeam reads only files inside the dataset directory"
        )
    return joined


def escapes(root: str, joined: str) -> str | None:
    """The real path of the local ``joined`` when its symlinks lead it outside ``root``, else None."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(joined)
    if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
        return None
    return real


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
