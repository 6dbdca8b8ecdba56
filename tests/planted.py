"""Planting files of the wrong kind in tests: a FIFO whose blocked reader the test itself releases."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

SOON = 5.0  # seconds after which a blocked open of a planted FIFO is released by the test itself


def unblock_fifo_later(path: str, seconds: float = SOON) -> threading.Timer:
    """Open ``path``'s write end after ``seconds`` (and close it): a reader blocked on the FIFO then sees its end."""
    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # nobody is reading: nothing is blocked
            pass
    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


@contextlib.contextmanager
def not_blocked_by(fifo: str | os.PathLike[str], seconds: float = SOON) -> Iterator[None]:
    """Run the block with ``fifo`` released after ``seconds``; fail when the block took that long (it waited on it).

    A reader that opens a FIFO without care waits for a writer forever: with this, a test of such
    a reader fails in seconds instead of hanging the suite.
    """
    timer = unblock_fifo_later(os.fspath(fifo), seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        timer.cancel()
    assert time.monotonic() - started < seconds, f"blocked on the FIFO {os.fspath(fifo)} until the test released it"
