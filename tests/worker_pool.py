"""An EXTERNAL Beam SDK worker pool in a separate process, for tests (and benchmarks/dataflow_path.py) of the
PortableRunner with out-of-process workers."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def external_worker_pool(log: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """Start ``worker_pool_main`` (it starts each SDK worker as a ``python`` subprocess); yields (address, its log).

    Pass ``--environment_type=EXTERNAL --environment_config=ADDRESS`` to a PortableRunner job.
    The pool is stopped with SIGINT, which stops its server and kills the workers it started.
    """
    port = _free_port()
    # The pool runs workers as "python": this interpreter, so they import this tfrbeam and Beam.
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    with open(log, "wb") as output:
        pool = subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
            stdout=output, stderr=subprocess.STDOUT, env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("localhost", port)) == 0:
                    break
            if pool.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker pool did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"localhost:{port}", log
    finally:
        pool.send_signal(signal.SIGINT)
        try:
            pool.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pool.kill()
            pool.wait()


def workers_started(log: pathlib.Path) -> int:
    """How many SDK worker processes the pool has started so far."""
    return log.read_text(errors="replace").count("Starting worker with command")
