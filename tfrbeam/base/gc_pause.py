"""The cyclic garbage collector paused around work that makes many objects and no garbage."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused(*, freeze: bool = False) -> Iterator[None]:
    """Suspend the cyclic garbage collector for the body; with ``freeze``, then move what exists out of later
    collections (``gc.freeze``). A collector the caller had switched off stays off.

    Per-record loops (framing, hashing) create a million short-lived memoryviews, each counted towards
    the next collection, and inside a Beam worker every collection walks Beam's large heap too; the
    loops create no reference cycles. It lives here, not in the command's entry point, because
    workers in other processes never run that: 3.65-3.73 s of user CPU with it on the 1M-row Parquet
    benchmark build, 4.78-4.97 s without (two runs each). Importing Beam makes several hundred
    thousand objects that the collector would walk again and again while they are made (about 0.4 s
    of a build's CPU), none of them garbage: ``tfrbeam build`` imports it paused, then frozen.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()
