"""Handing items from a producer thread to a consumer that may stop listening."""

from __future__ import annotations

import queue
import threading
from typing import Any


def put_until_stopped(out: queue.Queue, item: Any, stop: threading.Event, poll_seconds: float = 0.05) -> bool:
    """Put ``item`` on a bounded queue, waiting while it is full; False once ``stop`` is set (the consumer left)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=poll_seconds)
            return True
        except queue.Full:
            continue
    return False
