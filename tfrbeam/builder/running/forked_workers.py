"""SDK worker processes forked from one that imported Beam and tfrbeam once, for ``--workers N`` on the FnApiRunner.

Beam's ``multi_processing`` mode starts every SDK worker as ``python -m
apache_beam.runners.worker.sdk_worker_main``: about 2 CPU-seconds of imports each, before its first
element, paid again by every worker of every build (a one-row build took 5.2-5.6 s with 2 workers
against 1.9 s in process). Here a fork server (``forked_worker_server``) imports Beam's SDK harness
and tfrbeam once and forks each worker from there. ``tfrbeam build --workers N`` forks it from the
command itself once Beam is imported (``fork_server_process.start_early_server``); otherwise
(``--workers auto`` choosing workers, ``tfrbeam.builder.run``) the launching process starts it as a new
interpreter as soon as it holds the output's lock, while it builds the job graph. Beam still runs a command per worker
(``forked_worker_client.py``, standard library only), so the FnApiRunner manages the workers'
lifetime as before. Linux only (fork and ``PR_SET_PDEATHSIG``); elsewhere Beam starts its own workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from tfrbeam.builder.running.fork_server_process import WorkerForkServer, take_early_server
from tfrbeam.builder.running.runners import DEFAULT_RUNNER, WorkerChoice, runner_name

__all__ = ["ForkedWorkersRunner", "forks_workers", "worker_fork_server"]

_LOG = logging.getLogger(__name__)
# Beam warns that direct_num_workers > 1 wants multi_processing: this runner runs them so, by its own environment.
_MODE_WARNING = "If direct_num_workers is not equal to 1"


def forks_workers(options: PipelineOptions, workers: WorkerChoice) -> bool:
    """Whether a build with ``workers`` on ``options``' runner gets forked workers: ``--workers N`` (or auto) chose
    multi_processing on the FnApiRunner, on Linux. Beam's own direct options keep Beam's own worker processes."""
    return (workers.mode == "multi_processing" and not workers.set_by_beam_options
            and runner_name(options) == DEFAULT_RUNNER and sys.platform.startswith("linux") and hasattr(os, "fork"))


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
        self._server = server

    def run_pipeline(self, pipeline, options):
        self._server.wait_until_listening()  # a server that cannot serve fails the build here, instead of hanging it
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
    """A started ``WorkerForkServer`` if this build forks its workers (``forks_workers``), else None; stopped after.

    The server the command line started before planning (``start_early_server``) is taken
    if there is one, and stopped here too when the plan forks no workers after all.
    """
    early = take_early_server()
    if not forks_workers(options, workers):
        if early is not None:
            early.close()
        yield None
        return
    with early or WorkerForkServer() as server:
        _LOG.info("forking %s SDK workers from %s%s", workers.count, server.socket_path,
                  "" if early is None else " (forked from this command)" if early.forked else " (started for this command line)")
        yield server
