"""Parallel readers: each worker (a thread or a process) reads and decodes the segments of its slots.

The interleave has ``cycle_length`` slots; slot ``s`` reads its list of segments one after the
other in blocks, and is served by worker ``s % num_workers``. A worker takes its slots in turn,
one block each (a slot that runs dry sends END once and leaves the turn), which is exactly the
order in which the consumer visits those slots, so one ordered channel per worker keeps the
interleave deterministic whatever the timing.

Threads share the GIL with the consumer; processes do not, and pass decoded blocks back as numpy
buffers. Both bound how far a worker runs ahead (``readahead`` blocks) and share a limit on how
many workers decode at once, which autotune moves.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing.connection
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tfrbeam.base.handoff import put_until_stopped
from tfrbeam.dataset.reader import BlockDecoder, Segment, SegmentBlock, read_segment

_LOG = logging.getLogger(__name__)

END = "end"  # a slot's segments are exhausted
DONE = "done"  # a worker finished its job
ERROR = "error"


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """What every worker needs for a whole dataset (sent to a process once)."""

    segments: tuple[Segment, ...]
    decoder: BlockDecoder
    block_length: int
    skip_corrupt: bool


@dataclasses.dataclass(frozen=True)
class SlotStart:
    """Where a slot starts: its segment indices, and the record to start at in the first one (None: its start)."""

    slot: int
    segments: tuple[int, ...]
    first_record: int | None = None


@dataclasses.dataclass(frozen=True)
class Job:
    """One epoch's work for one worker: its slots in turn order, decoding or ids only."""

    slots: tuple[SlotStart, ...]
    decode: bool


class _Limit:
    """How many thread workers may decode at once (autotune moves it)."""

    def __init__(self, value: int):
        self._allowed = value
        self._active = 0
        self._condition = threading.Condition()

    @property
    def allowed(self) -> int:
        return self._allowed

    def set_allowed(self, value: int) -> None:
        with self._condition:
            self._allowed = value
            self._condition.notify_all()

    def acquire(self) -> None:
        with self._condition:
            while self._active >= self._allowed:
                self._condition.wait()
            self._active += 1

    def release(self) -> None:
        with self._condition:
            self._active -= 1
            self._condition.notify_all()


def produce(plan: ReadPlan, job: Job, limit: Any = None) -> Iterator[tuple[int, SegmentBlock | str]]:
    """The messages of one worker for one job: (slot, block) in turn order, (slot, END) when a slot is done."""
    readers = {start.slot: _slot_blocks(plan, start, job.decode) for start in job.slots}
    turn = [start.slot for start in job.slots]
    while turn:
        for slot in list(turn):
            while True:
                if limit is not None:
                    limit.acquire()
                try:
                    item = next(readers[slot], None)
                finally:
                    if limit is not None:
                        limit.release()
                if item is None:
                    turn.remove(slot)
                    yield slot, END
                    break
                yield slot, item
                if len(item.ids):
                    break  # a block with records is the slot's turn; news of skipped bytes alone is not


def _slot_blocks(plan: ReadPlan, start: SlotStart, decode: bool) -> Iterator[SegmentBlock]:
    decoder = plan.decoder if decode else None
    for position, segment_index in enumerate(start.segments):
        first = start.first_record if position == 0 else None
        yield from read_segment(
            plan.segments[segment_index], segment_index, plan.block_length, decoder,
            skip_corrupt=plan.skip_corrupt, first=first,
        )


class ThreadWorkers:
    """Workers as threads in this process."""

    def __init__(self, plan: ReadPlan, num_workers: int, readahead: int):
        self.plan = plan
        self.num_workers = num_workers
        self.readahead = readahead
        self.limit = _Limit(num_workers)
        self._threads: list[threading.Thread] = []
        self._queues: list[queue.Queue] = []
        self._shared: queue.Queue | None = None
        self._stop = threading.Event()

    def start(self, jobs: Sequence[Job], ordered: bool) -> None:
        self.stop()
        self._stop = threading.Event()
        self._queues = [queue.Queue(self.readahead) for _ in jobs]
        self._shared = None if ordered else queue.Queue(self.readahead * max(len(jobs), 1))
        self._threads = []
        for number, job in enumerate(jobs):
            out = self._queues[number] if ordered else self._shared
            thread = threading.Thread(
                target=self._run, args=(job, out, number, self._stop), daemon=True, name=f"tfrbeam-reader-{number}"
            )
            thread.start()
            self._threads.append(thread)

    def _run(self, job: Job, out: queue.Queue, number: int, stop: threading.Event) -> None:
        try:
            for message in produce(self.plan, job, self.limit):
                if not _put(out, (number, message), stop):
                    return
            _put(out, (number, (None, DONE)), stop)
        except BaseException as exc:  # handed to the consumer, which raises it
            _put(out, (number, (None, (ERROR, exc))), stop)

    def get(self, worker: int | None, cancel: threading.Event | None = None) -> tuple[int, tuple[int | None, Any]]:
        """The next message of ``worker`` (None: of any worker) as (worker, (slot, payload))."""
        source = self._shared if worker is None else self._queues[worker]
        assert source is not None
        return _get(source, cancel)

    def stop(self) -> None:
        self._stop.set()
        for out in self._queues + ([self._shared] if self._shared else []):
            _drain(out)
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    close = stop


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    return put_until_stopped(out, item, stop, poll_seconds=0.1)


class Cancelled(Exception):
    """The consumer gave up waiting: its pass over the data was closed."""


def _get(source: queue.Queue, cancel: threading.Event | None, check: Callable[[], None] | None = None) -> Any:
    """``source.get()``, giving up with ``Cancelled`` once ``cancel`` is set; ``check`` may raise while waiting."""
    while True:
        try:
            return source.get(timeout=0.1)
        except queue.Empty:
            if cancel is not None and cancel.is_set():
                raise Cancelled from None
            if check is not None:
                check()


def _drain(out: queue.Queue) -> None:
    while True:
        try:
            out.get_nowait()
        except queue.Empty:
            return


class _PipeLimit:
    """The decode limit across processes: a pipe holding one byte per free permit (a counting semaphore)."""

    def __init__(self, value: int, fds: tuple[int, int] | None = None):
        if fds is None:
            fds = os.pipe()
            os.write(fds[1], b"x" * value)
        self.fds = fds
        self._allowed = value

    @property
    def allowed(self) -> int:
        return self._allowed

    def set_allowed(self, value: int) -> None:
        """Add permits, or take some back (in the background, as busy workers return them)."""
        change, self._allowed = value - self._allowed, value
        if change > 0:
            os.write(self.fds[1], b"x" * change)
        elif change < 0:
            threading.Thread(target=self._take, args=(-change,), daemon=True).start()

    def acquire(self) -> None:
        """Take one permit, waiting for it."""
        self._take(1)

    def _take(self, count: int) -> None:
        """Take ``count`` permits (a pipe read may return fewer bytes than asked, so loop)."""
        while count > 0:
            taken = os.read(self.fds[0], count)
            if not taken:  # every write end is closed: the consumer process has gone
                raise BrokenPipeError("the decode-limit pipe was closed: the dataset's consumer has exited")
            count -= len(taken)

    def release(self) -> None:
        os.write(self.fds[1], b"x")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class ProcessWorkers:
    """Workers as separate Python processes (started once, reused every epoch).

    They are plain subprocesses running this module, talking over socket pairs, so they never
    import the caller's ``__main__`` (no ``if __name__ == "__main__"`` guard needed, unlike
    multiprocessing's spawn). A receiver thread per worker drains results, so a worker decodes
    its next block while the previous one waits to be consumed. POSIX only.
    """

    def __init__(self, plan: ReadPlan, num_workers: int, readahead: int):
        self.plan = plan
        self.num_workers = num_workers
        self.readahead = readahead
        self.limit = _PipeLimit(num_workers)
        self._job = 0
        self._connections: list[Any] = []
        self._processes: list[subprocess.Popen] = []
        self._queues: list[queue.Queue] = [queue.Queue() for _ in range(num_workers)]
        self._shared: queue.Queue = queue.Queue()
        self._ordered = True
        self._active: set[int] = set()
        self._send_lock = threading.Lock()
        self._dead: dict[int, str] = {}
        self._closing = False
        blob = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path and os.path.isdir(path)))
        for number in range(num_workers):
            ours, theirs = socket.socketpair()
            # A process-wide socket.setdefaulttimeout (Beam's GCS auth sets 60 s) makes new sockets non-blocking
            # underneath; the worker reads its end as a plain blocking pipe.
            ours.setblocking(True)
            theirs.setblocking(True)
            fds = (theirs.fileno(), *self.limit.fds)
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from tfrbeam.dataset.workers import _process_main; _process_main(*map(int, sys.argv[1:]))",
                    *map(str, fds),
                ],
                pass_fds=fds,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            connection = multiprocessing.connection.Connection(ours.detach())
            connection.send_bytes(blob)
            self._connections.append(connection)
            self._processes.append(process)
            threading.Thread(
                target=self._receive, args=(number, connection), daemon=True, name=f"tfrbeam-receiver-{number}"
            ).start()

    def _receive(self, number: int, connection: Any) -> None:
        while True:
            try:
                job, message = connection.recv()
            except (EOFError, OSError):
                if self._closing:
                    return
                try:
                    code = self._processes[number].wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                self._dead[number] = f"tfrbeam reader process {number} exited unexpectedly (exit code {code})"
                _LOG.error("%s", self._dead[number])
                return
            if job == self._job:
                (self._queues[number] if self._ordered else self._shared).put((number, message))

    def _send(self, number: int, command: tuple) -> None:
        """Send a command; a worker that is gone is reported by its receiver thread, not here."""
        with self._send_lock:
            try:
                self._connections[number].send(command)
            except OSError:
                _LOG.debug("reader process %d did not take a command; its receiver thread reports why", number)

    def start(self, jobs: Sequence[Job], ordered: bool) -> None:
        self.stop()
        self._raise_if_dead()
        self._job += 1
        self._ordered = ordered
        for out in self._queues + [self._shared]:
            _drain(out)
        self._active = set(range(len(jobs)))
        for number, job in enumerate(jobs):
            self._send(number, ("job", self._job, job, self.readahead))

    def _raise_if_dead(self) -> None:
        if self._dead:
            raise RuntimeError("; ".join(self._dead.values()) + " (it may have run out of memory); open the dataset again")

    def get(self, worker: int | None, cancel: threading.Event | None = None) -> tuple[int, tuple[int | None, Any]]:
        number, message = _get(self._shared if worker is None else self._queues[worker], cancel, self._raise_if_dead)
        if message[1] == DONE:
            self._active.discard(number)
        elif number in self._active:
            self._send(number, ("credit", self._job, None, 1))
        return number, message

    def stop(self) -> None:
        for number in self._active:
            self._send(number, ("stop", self._job, None, 0))
        self._active = set()
        self._job += 1  # messages still in flight are dropped by the receivers

    def close(self) -> None:
        if not self._processes:
            return
        self._closing = True
        self.stop()
        for number in range(len(self._connections)):
            self._send(number, ("exit", 0, None, 0))
        for process in self._processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for connection in self._connections:
            connection.close()
        self.limit.close()
        self._connections = []
        self._processes = []


def _process_main(fd: int, token_read: int, token_write: int) -> None:
    """A worker process: receive the plan, then run jobs, sending each message as long as it has credit."""
    connection = multiprocessing.connection.Connection(fd)
    plan: ReadPlan = pickle.loads(connection.recv_bytes())
    limit = _PipeLimit(0, (token_read, token_write))
    try:
        _serve(connection, plan, limit)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the consumer went away: nothing left to do


def _serve(connection: Any, plan: ReadPlan, limit: _PipeLimit) -> None:
    pending: tuple | None = None
    while True:
        command = pending or connection.recv()
        pending = None
        kind, job_id, job, credits = command
        if kind == "exit":
            return
        if kind != "job":
            continue  # a credit or stop for a job that is over
        try:
            for message in produce(plan, job, limit):
                while credits <= 0 or connection.poll():
                    control = connection.recv()
                    if control[0] == "credit" and control[1] == job_id:
                        credits += control[3]
                    elif control[0] in ("stop", "exit", "job"):
                        pending = None if control[0] == "stop" else control
                        raise _Stopped
                connection.send((job_id, message))
                credits -= 1
            connection.send((job_id, (None, DONE)))
        except _Stopped:
            continue
        except (BrokenPipeError, ConnectionResetError):
            raise
        except BaseException as exc:  # sent to the consumer, which raises it
            try:
                connection.send((job_id, (None, (ERROR, exc))))
            except Exception:
                connection.send((job_id, (None, (ERROR, RuntimeError(f"reader process failed: {exc!r}")))))


class _Stopped(Exception):
    """The consumer stopped or replaced the job a worker was producing for."""
