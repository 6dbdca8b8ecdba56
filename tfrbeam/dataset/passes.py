"""One pass over a dataset for the caller: batches made by a background thread, prefetched, autotuned."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tfrbeam.dataset.columns import Block
from tfrbeam.dataset.options import COLUMNS_OUTPUT, Options
from tfrbeam.dataset.output import to_arrow, to_numpy
from tfrbeam.dataset.reader import dense_layout
from tfrbeam.dataset.workers import Cancelled, ProcessWorkers, ThreadWorkers

_LOG = logging.getLogger(__name__)

MAX_PREFETCH = 64
POSITION_FIELDS = ("epoch", "batch", "pass_start", "taken")


class Position:
    """Where a dataset's passes are: the epoch, batches delivered in it, the epoch the pass began at, batches taken.

    Shared by the Dataset (``state_dict``, ``load_state_dict``, starting a pass) and the pass that
    advances it as batches are handed out; every read and change holds its lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(POSITION_FIELDS, 0)
        self._resume_pending = False

    def snapshot(self) -> dict[str, int]:
        """A copy of the position, taken under the lock."""
        with self._lock:
            return dict(self._values)

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Set a saved position: the next pass continues exactly there."""
        with self._lock:
            self._values = {key: int(saved[key]) for key in POSITION_FIELDS}
            self._resume_pending = True

    def begin_pass(self) -> None:
        """A new pass starts with the epoch after the last pass, unless a restored position waits: then there."""
        with self._lock:
            values = self._values
            if not self._resume_pending and (values["batch"] or values["taken"] or values["epoch"] != values["pass_start"]):
                self._values = self._fresh(values["epoch"] + (1 if values["batch"] else 0))
            self._resume_pending = False

    def advance(self, values: Mapping[str, int]) -> None:
        """Record the position after a batch (or an epoch's end) the caller was handed."""
        with self._lock:
            self._values.update(values)

    def end_pass(self) -> None:
        """A pass read to its end: the next one starts with the next epoch."""
        with self._lock:
            current = self._values
            self._values = self._fresh(current["epoch"] + (1 if current["batch"] else 0))

    @staticmethod
    def _fresh(epoch: int) -> dict[str, int]:
        return {"epoch": epoch, "batch": 0, "pass_start": epoch, "taken": 0}


@dataclasses.dataclass(frozen=True)
class PassSettings:
    """What a pass reads and how, handed over by its Dataset (a pass never reaches into the Dataset)."""

    features: Mapping[str, Any]
    options: Options
    epochs: int | None  # epochs per pass (None: forever)
    limit: int | None  # batches per pass (None: no limit)
    empty: bool  # the dataset has no segments: a pass ends after one (empty) epoch
    epoch_batches: Callable[[int, int, threading.Event], Iterator[Block]]  # (epoch, skip, cancel) -> batches
    workers: Callable[[], ThreadWorkers | ProcessWorkers | None]  # the reader workers, once started (autotune)
    stats: dict[str, Any]  # the Dataset's stats, updated by autotune


class _Producer:
    """The background half of a pass: batches into the queue until the data ends or ``stop`` is set.

    It holds no reference to its PassIterator, so an iterator the caller drops can be collected,
    and its finaliser stops the thread (and with it the reader workers' jobs).
    """

    def __init__(self, settings: PassSettings, position: dict[str, int]):
        self.settings = settings
        self.queue: queue.Queue = queue.Queue(max(1, settings.options.prefetch))
        self.stop = threading.Event()
        self.layout = dense_layout(settings.features)
        self.thread = threading.Thread(target=self.run, args=(position,), daemon=True, name="tfrbeam-dataset")

    def run(self, position: dict[str, int]) -> None:
        settings = self.settings
        try:
            epoch, batch, taken = position["epoch"], position["batch"], position["taken"]
            epochs, limit = settings.epochs, settings.limit
            while (epochs is None or epoch < position["pass_start"] + epochs) and (limit is None or taken < limit):
                for block in settings.epoch_batches(epoch, batch, self.stop):
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
                    if settings.empty:
                        break
                    continue
                break
            self.put(("end", None, None))
        except Cancelled:
            return
        except BaseException as exc:
            self.put(("error", exc, None))

    def convert(self, block: Block) -> Any:
        features = self.settings.features
        block = self.layout.unpack(block)
        if self.settings.options.output == COLUMNS_OUTPUT:
            return block  # for a mix (mixing.py), which cuts batches from several datasets' rows, then converts
        if self.settings.options.output == "arrow":
            return to_arrow(block, features)
        options = self.settings.options
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

    def __init__(self, settings: PassSettings, position: Position):
        self.settings = settings
        self._position = position
        self._producer = _Producer(settings, position.snapshot())
        self._queue = self._producer.queue
        self._stop = self._producer.stop
        self._finished = False
        self._tuner = Tuner(settings.workers, settings.stats, self._queue) if settings.options.autotune else None
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
        self._position.advance(position)

    def _finish(self, completed: bool) -> None:
        self._finished = True
        self.close()
        if completed:
            self._position.end_pass()

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

    def __init__(self, workers: Callable[[], ThreadWorkers | ProcessWorkers | None], stats: dict[str, Any],
                 prefetch: queue.Queue, now: float | None = None):
        self.workers = workers
        self.stats = stats
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
        workers = self.workers()
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
        self.stats.update(workers_allowed=limit.allowed, prefetch=self.prefetch.maxsize)
        _LOG.debug("autotune: waited %.1f%%, workers allowed %d, prefetch %d", 100 * share, limit.allowed, self.prefetch.maxsize)
