"""One pass over a dataset for the caller: batches made by a background thread, prefetched, autotuned."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from tfrbeam.dataset.columns import Block
from tfrbeam.dataset.output import to_arrow, to_numpy
from tfrbeam.dataset.reader import dense_layout
from tfrbeam.dataset.workers import Cancelled

if TYPE_CHECKING:
    from tfrbeam.dataset.pipeline import Dataset

_LOG = logging.getLogger(__name__)

MAX_PREFETCH = 64


class PassIterator:
    """One pass over a dataset: batches produced by a background thread, ``prefetch`` of them ahead."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        options = dataset.options
        with dataset._lock:
            position = dict(dataset._position)
        self._queue: queue.Queue = queue.Queue(max(1, options.prefetch))
        self._stop = threading.Event()
        self._finished = False
        self._tuner = Tuner(dataset, self._queue) if options.autotune else None
        self._layout = dense_layout(dataset.features)
        self._thread = threading.Thread(target=self._produce, args=(position,), daemon=True, name="tfrbeam-dataset")
        self._thread.start()

    def _produce(self, position: dict[str, int]) -> None:
        dataset = self.dataset
        try:
            epoch, batch, taken = position["epoch"], position["batch"], position["taken"]
            epochs, limit = dataset._epochs, dataset._limit
            while (epochs is None or epoch < position["pass_start"] + epochs) and (limit is None or taken < limit):
                for block in dataset._epoch_batches(epoch, skip=batch, cancel=self._stop):
                    if limit is not None and taken >= limit:
                        break
                    output = self._convert(block)
                    batch += 1
                    taken += 1
                    if not self._put(("batch", output, {"epoch": epoch, "batch": batch, "taken": taken})):
                        return
                    if self._stop.is_set():
                        return
                else:
                    epoch, batch = epoch + 1, 0
                    self._put(("epoch", None, {"epoch": epoch, "batch": 0, "taken": taken}))
                    if not dataset.segments:
                        break
                    continue
                break
            self._put(("end", None, None))
        except Cancelled:
            return
        except BaseException as exc:
            self._put(("error", exc, None))

    def _convert(self, block: Block) -> Any:
        features = self.dataset.features
        block = self._layout.unpack(block)
        if self.dataset.options.output == "arrow":
            return to_arrow(block, features)
        return to_numpy(block, features, self.dataset.options.padded)

    def _put(self, item: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> _PassIterator:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        while True:
            started = time.perf_counter()
            kind, payload, position = self._queue.get()
            if self._tuner is not None:
                self._tuner.observe(time.perf_counter() - started)
            if kind == "batch":
                self._advance(position)
                return payload
            if kind == "epoch":
                self._advance(position)
                continue
            self._finish(kind == "end")
            if kind == "error":
                raise payload
            raise StopIteration

    def _advance(self, position: dict[str, int]) -> None:
        with self.dataset._lock:
            self.dataset._position.update(position)

    def _finish(self, completed: bool) -> None:
        self._finished = True
        self.close()
        if completed:
            with self.dataset._lock:
                current = self.dataset._position
                next_epoch = current["epoch"] + (1 if current["batch"] else 0)
                self.dataset._position = {"epoch": next_epoch, "batch": 0, "pass_start": next_epoch, "taken": 0}

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __del__(self) -> None:
        # A finaliser must not raise (Python would only print it, at an arbitrary moment); the
        # failure to clean up is logged instead. close() is the way to see such errors.
        try:
            self.close()
        except Exception:
            _LOG.warning("closing a prefetching pass that was never closed failed", exc_info=True)


class Tuner:
    """Autotune: grow the prefetch depth while the caller waits for batches; give workers back when it never does.

    Every window of about a second it looks at the share of time the caller spent waiting. Over
    10 %: the readers are the bottleneck, so one more worker may decode at once or, when all may
    already, the prefetch depth doubles (up to 64). Under 1 % with the prefetch queue full: the
    caller is the bottleneck, so one fewer worker decodes at a time (down to 1), leaving a core
    to the training step.
    """

    WINDOW = 1.0

    def __init__(self, dataset: Dataset, prefetch: queue.Queue, now: float | None = None):
        self.dataset = dataset
        self.prefetch = prefetch
        self.window_start = time.perf_counter() if now is None else now
        self.waited = 0.0

    def observe(self, waited: float, now: float | None = None) -> None:
        """Account ``waited`` seconds the caller spent blocked on the next batch; adjust at each window's end."""
        self.waited += waited
        now = time.perf_counter() if now is None else now
        elapsed = now - self.window_start
        if elapsed < self.WINDOW:
            return
        share = self.waited / elapsed
        self.window_start, self.waited = now, 0.0
        workers = self.dataset._workers
        if workers is None:
            return
        limit = workers.limit
        if share > 0.10:
            if limit.allowed < workers.num_workers:
                limit.set_allowed(limit.allowed + 1)
            elif self.prefetch.maxsize < MAX_PREFETCH:
                with self.prefetch.mutex:
                    self.prefetch.maxsize *= 2
                    self.prefetch.not_full.notify_all()
        elif share < 0.01 and self.prefetch.full() and limit.allowed > 1:
            limit.set_allowed(limit.allowed - 1)
        self.dataset.stats.update(workers_allowed=limit.allowed, prefetch=self.prefetch.maxsize)
        _LOG.debug("autotune: waited %.1f%%, workers allowed %d, prefetch %d", 100 * share, limit.allowed, self.prefetch.maxsize)
