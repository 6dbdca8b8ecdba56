"""SDK worker processes forked from one that imported Beam and tfrbeam once, for ``--workers N`` on the FnApiRunner.

Beam's ``multi_processing`` mode starts every SDK worker as ``python -m
apache_beam.runners.worker.sdk_worker_main``: about 2 CPU-seconds of imports each, before its first
element, paid again by every worker of every build (a one-row build took 5.2-5.6 s with 2 workers
against 1.9 s in process). Here the launching process starts a fork server
(``forked_worker_server``) as soon as it holds the output's lock; the server imports Beam's SDK
harness and tfrbeam while this process builds the job graph, on another core, and forks each worker
from there. Beam still runs a command per worker (``forked_worker_client.py``, standard library
only), so the FnApiRunner manages the workers' lifetime as before. Linux only (fork and
``PR_SET_PDEATHSIG``); elsewhere Beam starts its own workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from tfrbeam.build.runners import DEFAULT_RUNNER, WorkerChoice, runner_name

__all__ = ["ForkedWorkersRunner", "WorkerForkServer", "forks_workers", "worker_fork_server"]

_LOG = logging.getLogger(__name__)
CLIENT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forked_worker_client.py")
SERVER_MODULE = "tfrbeam.build.forked_worker_server"
# Beam warns that direct_num_workers > 1 wants multi_processing: this runner runs them so, by its own environment.
_MODE_WARNING = "If direct_num_workers is not equal to 1"


def forks_workers(options: PipelineOptions, workers: WorkerChoice) -> bool:
    """Whether a build with ``workers`` on ``options``' runner gets forked workers: ``--workers N`` (or auto) chose
    multi_processing on the FnApiRunner, on Linux. Beam's own direct options keep Beam's own worker processes."""
    return (workers.mode == "multi_processing" and not workers.set_by_beam_options
            and runner_name(options) == DEFAULT_RUNNER and sys.platform.startswith("linux") and hasattr(os, "fork"))


class WorkerForkServer:
    """The fork server process (started at once) and the command that gets a worker from it."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="tfrbeam-workers-")  # short: a socket path has ~100 bytes
        self.socket_path = os.path.join(self._directory, "fork.sock")
        self._process: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, self.socket_path, str(os.getpid())], stdin=subprocess.DEVNULL)

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


class _WithoutModeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_MODE_WARNING)


class ForkedWorkersRunner(FnApiRunner):
    """Beam's FnApiRunner whose SDK worker processes come from a ``WorkerForkServer``.

    The options' ``multi_processing`` mode would make the FnApiRunner replace this runner's
    environment by Beam's own worker command, so it runs with the in-memory mode set, and
    ``direct_num_workers`` workers of the fork server's environment, and the mode is restored after.
    """

    def __init__(self, server: WorkerForkServer):
        super().__init__(default_environment=SubprocessSDKEnvironment.from_command_string(server.worker_command()))

    def run_pipeline(self, pipeline, options):
        direct = options.view_as(DirectOptions)
        mode = direct.direct_running_mode
        direct.direct_running_mode = "in_memory"
        quiet = _WithoutModeWarning()
        runner_log = logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner")
        runner_log.addFilter(quiet)
        try:
            return super().run_pipeline(pipeline, options)
        finally:
            runner_log.removeFilter(quiet)
            direct.direct_running_mode = mode


@contextlib.contextmanager
def worker_fork_server(options: PipelineOptions, workers: WorkerChoice):
    """A started ``WorkerForkServer`` if this build forks its workers (``forks_workers``), else None; stopped after."""
    if not forks_workers(options, workers):
        yield None
        return
    with WorkerForkServer() as server:
        _LOG.info("forking %s SDK workers from %s", workers.count, server.socket_path)
        yield server
