"""The decode limit shared by reader processes: a pipe of permits."""

from __future__ import annotations

import os
import time

import pytest

from tfrbeam.dataset.workers import _PipeLimit


def _permits(limit: _PipeLimit) -> int:
    os.set_blocking(limit.fds[0], False)
    try:
        return len(os.read(limit.fds[0], 1 << 16))
    except BlockingIOError:
        return 0
    finally:
        os.set_blocking(limit.fds[0], True)


def test_permits_are_taken_and_given_back():
    limit = _PipeLimit(3)
    limit.acquire()
    limit.acquire()
    limit.release()
    assert _permits(limit) == 2


def test_lowering_the_limit_takes_back_every_permit():
    limit = _PipeLimit(5)
    limit.set_allowed(1)
    deadline = time.monotonic() + 5
    while _permits_peek(limit) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limit.allowed == 1 and _permits(limit) == 1


def _permits_peek(limit: _PipeLimit) -> int:
    count = _permits(limit)
    if count:
        os.write(limit.fds[1], b"x" * count)
    return count


def test_acquire_after_the_consumer_is_gone_raises_instead_of_spinning():
    limit = _PipeLimit(0)
    os.close(limit.fds[1])
    with pytest.raises(BrokenPipeError, match="consumer has exited"):
        limit.acquire()
