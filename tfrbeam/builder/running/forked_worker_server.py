"""The fork server of a ``--workers N`` build: imports Beam's SDK harness and tfrbeam once, then forks each SDK worker.

``serve`` runs in the command's own process forked once it imported Beam, or as ``python -m
tfrbeam.builder.running.forked_worker_server SOCKET PARENT_PID`` (``tfrbeam.builder.running.fork_server_process.WorkerForkServer``
decides), while the launcher plans and builds the job graph, so the imports are paid once, not once per worker. Each
client (``forked_worker_client.py``, the command Beam runs per worker) sends its environment; the
server forks, the child takes that environment and runs Beam's ``sdk_worker_main``, and the
child's exit status goes back to the client. It serves on one thread (no lock can be held by another
thread at a fork) and exits when its parent does.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import traceback

# What an SDK worker of a build imports anyway: imported once here, shared by every fork.
PRELOADED = (
    "apache_beam.runners.worker.sdk_worker_main",
    "tfrbeam.builder.pipeline.graph",
    "tfrbeam.builder.shuffle",
    "tfrbeam.builder.pipeline.sequence",
    "tfrbeam.builder.pipeline.commit",
    "pyarrow.parquet",
    "pyarrow.csv",
)
_PR_SET_PDEATHSIG = 1


def _exit_with_parent(parent: int) -> None:
    """Be sent SIGTERM when the launching process dies (Linux); leave at once if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(0)


def _read_request(connection: socket.socket) -> dict[str, str]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the client left before sending its environment")
        data += chunk
    return json.loads(data)


def _run_worker(environment: dict[str, str]) -> None:
    """In the forked child: become an SDK worker with the client's environment; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(environment)
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main([])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # a worker's failure is reported by its exit status, as a worker process's would be
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Tell each client whose worker ended its exit status."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError), connection:
                connection.sendall(str(os.waitstatus_to_exitcode(status)).encode("ascii"))


def _leave(*_) -> None:
    raise SystemExit(0)


def serve(path: str, parent: int) -> None:
    """Import, listen on ``path``, and fork an SDK worker per client until stopped or the parent process is gone.

    Removes its socket and, if that leaves it empty, the socket's directory (the launcher made it) on the way out.
    """
    signal.signal(signal.SIGTERM, _leave)
    # Ctrl-C reaches the whole process group: the launcher reports it and stops this server with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _exit_with_parent(parent)
        for module in PRELOADED:
            importlib.import_module(module)
        # The imported objects live as long as every worker: out of the collector's sight, a worker's collections
        # do not walk them, and do not touch (copy) the pages it shares with this process.
        gc.freeze()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _bind_from_directory(listener, path)
        listener.listen(64)
        _accept_until_orphaned(listener, parent)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def _bind_from_directory(listener: socket.socket, path: str) -> None:
    """Bind to ``path`` through its directory's descriptor (``/proc/self/fd/N/NAME``): an AF_UNIX address holds about
    107 bytes, a deep TMPDIR more."""
    directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        listener.bind(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
    finally:
        os.close(directory)


def _accept_until_orphaned(listener: socket.socket, parent: int) -> None:
    waiting: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            connection, _ = listener.accept()
            try:
                environment = _read_request(connection)
            except (OSError, ValueError):
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a worker takes signals as Beam's own workers do
                signal.signal(signal.SIGINT, signal.default_int_handler)
                listener.close()
                for other in waiting.values():
                    other.close()
                connection.close()
                _run_worker(environment)
            waiting[pid] = connection
        _reap(waiting)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
