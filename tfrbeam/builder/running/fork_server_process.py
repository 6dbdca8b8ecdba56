"""The fork server process of a ``--workers N`` build, as the launching process holds it; standard library only.

When the command line alone says the build forks its workers (``--workers N``, N of at least 2, on
the default runner, on Linux), ``tfrbeam build`` starts the server as soon as it has imported Beam,
before it plans: the command forks itself, so the server starts with Beam already imported instead
of importing it again in a new interpreter (about 1.2 CPU-seconds of every such build), and only
imports what an SDK worker needs beyond it while the launcher plans. A process that may have other
threads or a started gRPC runtime (a library caller's, a test's) must not be forked: there the
server is a new ``python -m tfrbeam.builder.running.forked_worker_server``.
``tfrbeam.builder.running.forked_workers.worker_fork_server`` takes the early server, or starts one when the
plan chose forked workers itself (``--workers auto``).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from typing import NoReturn

from tfrbeam.errors import BuildFailedError

__all__ = ["CLIENT_SCRIPT", "SERVER_MODULE", "WorkerForkServer", "close_early_server", "command_line_forks_workers",
           "start_early_server", "take_early_server"]

CLIENT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_worker_client.py")
SERVER_MODULE = "tfrbeam.builder.running.forked_worker_server"
# Options after which the command line alone cannot tell that the build forks workers (Beam's own worker
# options, another runner) or after which no pipeline runs (a dry run, help).
_NOT_EARLY = ("--direct_num_workers", "--direct_running_mode", "--dry-run", "--dry_run", "-h", "--help")
_DEFAULT_RUNNERS = ("", "FnApiRunner")
# As long as a worker's client waits for the server (forked_worker_client.CONNECT_SECONDS): its imports, on a busy machine.
LISTEN_SECONDS = 120.0


class _ForkedServer:
    """A server forked from this process, with what ``WorkerForkServer`` uses of a ``subprocess.Popen``."""

    def __init__(self, pid: int):
        self.pid = pid
        self._status: int | None = None

    def poll(self) -> int | None:
        if self._status is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self._status = os.waitstatus_to_exitcode(status)
        return self._status

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        limit = math.inf if timeout is None else timeout
        deadline = time.monotonic() + limit
        while (status := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", limit)
            time.sleep(0.01)
        return status

    def _signal(self, number: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


def _forked_server(socket_path: str) -> _ForkedServer:
    """Fork this process into the fork server; the child serves ``socket_path`` and never returns here."""
    parent = os.getpid()
    sys.stdout.flush()  # else the child's workers would write what this process had buffered a second time
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _serve_in_child(socket_path, parent)
    return _ForkedServer(pid)


def _serve_in_child(socket_path: str, parent: int) -> NoReturn:
    """In the forked child: keep only stdout and stderr of this process's files (no lock, no log of the launcher's
    stays open in it), serve, and leave without this process's exit handlers (they clean up the launcher's files)."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        from tfrbeam.builder.running.forked_worker_server import serve

        serve(socket_path, parent)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 0
    except BaseException:  # the launcher sees a server that ended (its clients say so); this says why
        traceback.print_exc()
    finally:
        os._exit(code)


class WorkerForkServer:
    """The fork server process (started at once) and the command that gets a worker from it.

    ``fork_this_process``: the server is this process forked (it must have imported Beam and have no
    other thread: see the module's docstring); otherwise, or when another thread runs, a new interpreter.
    """

    def __init__(self, *, fork_this_process: bool = False) -> None:
        self._directory = tempfile.mkdtemp(prefix="tfrbeam-workers-")  # 0700: only this user reaches the socket
        self.socket_path = os.path.join(self._directory, "fork.sock")
        self.forked = fork_this_process and threading.active_count() == 1
        self._process: subprocess.Popen | _ForkedServer | None = (
            _forked_server(self.socket_path) if self.forked else
            subprocess.Popen([sys.executable, "-m", SERVER_MODULE, self.socket_path, str(os.getpid())],
                             stdin=subprocess.DEVNULL))

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait_until_listening(self, timeout: float = LISTEN_SECONDS) -> None:
        """Return once the server listens. BuildFailedError if it ended first or did not listen in ``timeout`` s:
        Beam's runner would wait for ever for workers that cannot start."""
        assert self._process is not None  # a closed server serves no build
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket_path):
            status = self._process.poll()
            if status is not None or time.monotonic() > deadline:
                ended = f"did not listen in {timeout:.0f} s" if status is None else f"ended with exit status {status}"
                raise BuildFailedError(
                    f"the SDK worker fork server {ended} before the build's workers could start (its error, if any, is "
                    f"on stderr above); run with --workers 1 to build in one process")
            time.sleep(0.01)

    def worker_command(self) -> str:
        """The shell command Beam runs for each SDK worker."""
        assert self._process is not None  # a closed server gives no more workers
        return shlex.join([sys.executable, "-S", CLIENT_SCRIPT, self.socket_path, str(self._process.pid)])

    def close(self) -> None:
        """Stop the server (the workers it forked ended with the pipeline) and remove its socket."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self._directory, ignore_errors=True)

    def __enter__(self) -> WorkerForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def command_line_forks_workers(argv: Sequence[str]) -> bool:
    """Whether a ``tfrbeam build`` command line by itself means forked workers: its last ``--workers`` is a count of
    at least 2, its runner (if any) the FnApiRunner, no Beam worker option or dry run, on Linux.

    Anything else (``--workers auto`` included) leaves the choice to the plan, which starts a server if it needs one.
    A guess made before Beam can be imported: ``forked_workers.forks_workers`` decides, and a server it does not
    need is stopped.
    """
    if not (sys.platform.startswith("linux") and hasattr(os, "fork")):
        return False
    workers, runner = "", ""
    for index, argument in enumerate(argv):
        name, has_value, value = argument.partition("=")
        if name in _NOT_EARLY:
            return False
        if name in ("--workers", "--runner"):
            if not has_value:
                value = argv[index + 1] if index + 1 < len(argv) else ""
            if name == "--workers":
                workers = value
            else:
                runner = value
    try:
        count = int(workers)
    except ValueError:
        return False  # auto, or not a count: the plan decides, or says what is wrong
    return count >= 2 and runner in _DEFAULT_RUNNERS


_early: WorkerForkServer | None = None


def start_early_server(argv: Sequence[str], *, fork_this_process: bool = False) -> None:
    """Start the fork server now if ``argv`` (a ``tfrbeam build`` command line) means forked workers.

    ``fork_this_process``: the command calls this right after importing Beam, from its only thread,
    before anything ran (``WorkerForkServer``). Whoever does not take the server (``take_early_server``:
    a config error, a locked output) stops it with ``close_early_server``; so does this process's exit,
    and the server leaves when this process dies.
    """
    global _early
    if _early is None and command_line_forks_workers(argv):
        _early = WorkerForkServer(fork_this_process=fork_this_process)
        atexit.register(close_early_server)


def take_early_server() -> WorkerForkServer | None:
    """The server ``start_early_server`` started, now the caller's to close; None if there is none (or it died)."""
    global _early
    server, _early = _early, None
    if server is not None and not server.running:
        server.close()
        return None
    return server


def close_early_server() -> None:
    """Stop the server ``start_early_server`` started, if nobody took it."""
    server = take_early_server()
    if server is not None:
        server.close()
