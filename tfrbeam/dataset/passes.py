"""One pass over a dataset for the caller: batches made by a background thread, prefetched, autotuned."""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from tfrbeam.dataset.columns import Block
from tfrbeam.dataset.output import to_arrow, to_numpy
from tfrbeam.dataset.reader import dense_layout
from tfrbeam.dataset.workers import Cancelled

if TYPE_CHECKING:
    from tfrbeam.dataset.pipeline import Dataset

_LOG = logging.getLogger(__name__)

MAX_PREFETCH = 64


class _Producer:
    """The background half of a pass: batches into the queue until the data ends or ``stop`` is set.

    It holds no reference to its PassIterator, so an iterator the caller drops can be collected,
    and its finaliser stops the thread (and with it the reader workers' jobs).
    """

    def __init__(self, dataset: Dataset, position: dict[str, int]):
        self.dataset = dataset
        self.queue: queue.Queue = queue.Queue(max(1, dataset.options.prefetch))
        self.stop = threading.Event()
        self.layout = dense_layout(dataset.features)
        self.thread = threading.Thread(target=self.run, args=(position,), daemon=True, name="tfrbeam-dataset")

    def run(self, position: dict[str, int]) -> None:
        dataset = self.dataset
        try:
            epoch, batch, taken = position["epoch"], position["batch"], position["taken"]
            epochs, limit = dataset._epochs, dataset._limit
            while (epochs is None or epoch < position["pass_start"] + epochs) and (limit is None or taken < limit):
                for block in dataset._epoch_batches(epoch, skip=batch, cancel=self.stop):
                    if limit is not None and taken >= limit:
                        break
                    output = self.convert(block)
                    batch += 1
                    taken += 1
                    if not self.put(("batch", output, {"epoch": epoch, "batch": batch, "taken": taken})):
                        return
                    if self.stop.is_set():
                        return
                else:
                    epoch, batch = epoch + 1, 0
                    if not self.put(("epoch", None, {"epoch": epoch, "batch": 0, "taken": taken})):
                        return
                    if not dataset.segments:
                        break
                    continue
                break
            self.put(("end", None, None))
        except Cancelled:
            return
        except BaseException as exc:
            self.put(("error", exc, None))

    def convert(self, block: Block) -> Any:
        features = self.dataset.features
        block = self.layout.unpack(block)
        if self.dataset.options.output == "arrow":
            return to_arrow(block, features)
        options = self.dataset.options
        return to_numpy(block, features, options.padded, options.pad_values, options.return_mask)

    def put(self, item: tuple) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


class PassIterator:
    """One pass over a dataset: batches produced by a background thread, ``prefetch`` of them ahead."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        with dataset._lock:
            position = dict(dataset._position)
        self._producer = _Producer(dataset, position)
        self._queue = self._producer.queue
        self._stop = self._producer.stop
        self._finished = False
        self._tuner = Tuner(dataset, self._queue) if dataset.options.autotune else None
        weakref.finalize(self, self._stop.set)  # dropped without close(): the thread stops
        self._producer.thread.start()

    def __iter__(self) -> PassIterator:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        started = time.perf_counter()
        while True:
            if self._stop.is_set():
                raise RuntimeError(
                    "this pass over the dataset was closed (by dataset.close(), or because a newer "
                    "iter(dataset) replaced it: one pass at a time); start a new pass with iter(dataset)"
                )
            try:
                kind, payload, position = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if self._tuner is not None:
                self._tuner.observe(time.perf_counter() - started)
            if kind == "batch":
                self._advance(position)
                return payload
            if kind == "epoch":
                self._advance(position)
                started = time.perf_counter()
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
        """Stop the producer, wait for it, then drop what it queued (nothing can be queued after)."""
        self._stop.set()
        if self._producer.thread is not threading.current_thread():
            self._producer.thread.join(timeout=30)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break


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
