"""Process start-up for the commands: heavy imports without the cyclic garbage collector.

Importing Apache Beam creates several hundred thousand objects, and the collector walks them all
again and again while they are made (~0.4 s of a build's CPU on a 2-core machine). None of them
is garbage, so the imports run with the collector paused and their objects are then frozen out
of later collections (``gc.freeze``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_without_gc() -> Iterator[None]:
    """Run the body (imports) with the collector paused, then freeze what it made."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
