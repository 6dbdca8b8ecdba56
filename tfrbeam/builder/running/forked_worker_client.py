"""The command Beam runs for each SDK worker of a ``--workers N`` build: asks the fork server to fork one, waits for it.

Run as a script (``python -S path/to/forked_worker_client.py SOCKET SERVER_PID``), so it imports nothing but the
standard library: it starts in milliseconds where ``python -m apache_beam.runners.worker.sdk_worker_main``
spends about 2 CPU-seconds importing Beam. It sends this process's environment (Beam passes the
worker's control and logging endpoints and the pipeline options in it) and exits with the worker's
exit status; the worker itself is forked by ``tfrbeam.builder.running.forked_workers.serve``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

# The fork server imports Beam and tfrbeam before it listens: a client started before that waits.
CONNECT_SECONDS = 120.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _connect(path: str, server: int) -> socket.socket:
    """Connect to the server, waiting while it imports; fails at once if the server process has ended.

    Connects through the socket's directory's descriptor, as the server bound it: an AF_UNIX address holds about
    107 bytes, a deep TMPDIR more.
    """
    directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _connect_by(f"/proc/self/fd/{directory}/{os.path.basename(path)}", server)
    finally:
        os.close(directory)


def _connect_by(address: str, server: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(address)
            return client
        except (FileNotFoundError, ConnectionRefusedError):
            client.close()
            if time.monotonic() > deadline:
                raise
            if not _alive(server):
                raise ConnectionError(f"the fork server (process {server}) has ended") from None
            time.sleep(0.02)


def request_worker(argv: list[str]) -> int:
    """Connect to the fork server at argv[1] (process argv[2]), send this environment, wait for the forked worker;
    its exit status."""
    path, server = argv[1], int(argv[2])
    try:
        client = _connect(path, server)
    except OSError as error:
        print(f"tfrbeam: the SDK worker fork server at {path} did not answer ({error}); the build's worker processes "
              "could not start (run with --workers 1 to build in one process)", file=sys.stderr)
        return 1
    with client:
        client.sendall(json.dumps(dict(os.environ)).encode("utf-8") + b"\n")
        reply = b""
        while True:
            chunk = client.recv(64)
            if not chunk:
                break
            reply += chunk
    try:
        return int(reply.decode("ascii").strip())
    except ValueError:
        print("tfrbeam: the SDK worker fork server stopped before its worker ended", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(request_worker(sys.argv))
