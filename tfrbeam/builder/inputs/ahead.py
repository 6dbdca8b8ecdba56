"""Reading ahead: the batches of a reader produced by a thread of their own while the caller works on the last one."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

from tfrbeam.base.handoff import put_until_stopped

__all__ = ["PREFETCH_BATCHES", "read_ahead"]

_T = TypeVar("_T")

# Batches parsed (CSV) or decoded (Parquet) ahead by a thread of their own; 0 reads in the
# caller's thread. The thread takes the parse (~0.9 CPU s per 1M CSV benchmark rows) or the
# decoding (~0.7 s from Parquet) off the caller's path when a core is free, and costs a little
# when none is.
PREFETCH_BATCHES = 2
_DONE = object()


def read_ahead(items: Generator[_T, None, None], thread_name: str = "tfrbeam-csv-read") -> Iterator[_T]:
    """The items, made by a thread up to PREFETCH_BATCHES ahead (see _ahead); the iterator itself when that is 0."""
    return _ahead(items, thread_name) if PREFETCH_BATCHES else items


def _ahead(items: Generator[_T, None, None], thread_name: str) -> Iterator[_T]:
    """The items of an iterator, produced by a thread up to PREFETCH_BATCHES ahead of the caller.

    pyarrow parses the next block (without the GIL) while the caller converts this one; the
    order and every row's numbering are the iterator's own. Errors reach the caller as raised.
    Closing early stops the thread after the item it is making and closes the iterator there.
    """
    handoff: queue.Queue = queue.Queue(maxsize=PREFETCH_BATCHES)
    stop = threading.Event()

    def put(item) -> bool:
        return put_until_stopped(handoff, item, stop)

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as error:  # handed to the caller, who raises it
            put((_DONE, error))
        finally:
            items.close()  # a generator's cleanup (closing pyarrow's reader) runs in the thread that ran it

    thread = threading.Thread(target=produce, name=thread_name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
