"""The fork server process of a ``--workers N`` build, as the launching process holds it; standard library only.

So that ``tfrbeam build`` can start it before it imports Beam: when the command line alone says the
build forks its workers (``--workers N``, N of at least 2, on the default runner, on Linux), the
server imports Beam's SDK harness while the launching process imports Beam itself and plans, each on
a core of its own, instead of after them (about 0.8 s of every such build's wall time on this
project's machine). ``tfrbeam.build.forked_workers.worker_fork_server`` takes that server, or starts
one when the plan chose forked workers itself (``--workers auto``).
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["CLIENT_SCRIPT", "SERVER_MODULE", "WorkerForkServer", "close_early_server", "command_line_forks_workers",
           "start_early_server", "take_early_server"]

CLIENT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_worker_client.py")
SERVER_MODULE = "tfrbeam.build.forked_worker_server"
# Options after which the command line alone cannot tell that the build forks workers (Beam's own worker
# options, another runner) or after which no pipeline runs (a dry run, help).
_NOT_EARLY = ("--direct_num_workers", "--direct_running_mode", "--dry-run", "--dry_run", "-h", "--help")
_DEFAULT_RUNNERS = ("", "FnApiRunner")


class WorkerForkServer:
    """The fork server process (started at once) and the command that gets a worker from it."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="tfrbeam-workers-")  # short: a socket path has ~100 bytes
        self.socket_path = os.path.join(self._directory, "fork.sock")
        self._process: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, self.socket_path, str(os.getpid())], stdin=subprocess.DEVNULL)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

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


def start_early_server(argv: Sequence[str]) -> None:
    """Start the fork server now if ``argv`` (a ``tfrbeam build`` command line) means forked workers.

    Whoever does not take it (``take_early_server``: a config error, a locked output) stops it with
    ``close_early_server``; so does this process's exit, and the server leaves when this process dies.
    """
    global _early
    if _early is None and command_line_forks_workers(argv):
        _early = WorkerForkServer()
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
