"""``tfrbeam build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``.

Also ``python -m tfrbeam.builder`` and ``python -m pipelines.build_dataset``: every entry point calls
``main``. Options this command does not know go to Beam's PipelineOptions; the runner defaults to the
FnApiRunner in this process. Every error is one line with the exit status of ``tfrbeam.cli.exit_codes``.

The build itself is the launcher's (tfrbeam/builder/running/launch.py: lock, recover, run with
progress, publish from this process), which ``tfrbeam.builder.run`` and ``tfrbeam.write_dataset``
share; this module adds the command line, the dry run, exit statuses and interrupts. It imports
Beam and the builder only when a build starts, with the garbage collector paused (so ``--help`` is quick).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from tfrbeam.base.gc_pause import gc_paused
from tfrbeam.base.object_store import no_bucket_metadata_probes
from tfrbeam.cli.beam_warnings import without_beam_import_warnings
from tfrbeam.cli.exit_codes import EXIT_OK, report_error
from tfrbeam.errors import TfrbeamError

_PROG = "tfrbeam build"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, allow_abbrev=False,
        description="Build a shuffled, split, sharded TFRecord dataset from CSV, Parquet, JSON lines, ORC, Avro or TFRecord.",
        epilog="Other options (e.g. --runner DataflowRunner --project P --region R --temp_location gs://... "
        "--setup_file ./setup.py) go to Beam. --workers N|auto (default auto) sets the worker processes of a build "
        "on this machine (docs/runners.md).",
    )
    parser.add_argument("config", metavar="CONFIG.yaml", help="the build config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one config value (YAML syntax), e.g. --set shuffle.seed=7; repeatable")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a different dataset (or other files) in output.path")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and print the plan (inputs, features, splits, shards, output, runner); run nothing",
    )
    parser.add_argument("--quiet", action="store_true",
                        help="show warnings and errors only: no progress, no log lines, no summary table")
    parser.add_argument("--verbose", action="store_true", help="also show Beam's own log (worker tracebacks included)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a dataset build; returns the exit status (130 after Ctrl-C, 143 after SIGTERM)."""
    no_bucket_metadata_probes()
    with _INTERRUPTS.handled():
        try:
            return _build(sys.argv[1:] if argv is None else argv)
        except KeyboardInterrupt:
            _INTERRUPTS.signal = _INTERRUPTS.signal or signal.SIGINT
            return _INTERRUPTS.report()
        except (TfrbeamError, OSError) as error:
            if _INTERRUPTS.signal is not None:  # whatever a runner raised on its way out of an interruption
                return _INTERRUPTS.report()
            return report_error(_PROG, error)


def _build(argv: list[str]) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    # Beam and the builder make several hundred thousand objects on import, none of them garbage: the first import
    # runs without the collector and freezes them out of later collections; Beam's warnings about extras are dropped.
    with gc_paused(freeze="apache_beam" not in sys.modules), without_beam_import_warnings():
        from tfrbeam.beam.publish import committed_run
        from tfrbeam.builder.pipeline.plan import plan_build
        from tfrbeam.builder.running import launch
        from tfrbeam.builder.running.command_line import pipeline_options
        from tfrbeam.builder.running.report import describe_plan
    options = pipeline_options(rest, parser)
    started = time.monotonic()
    with launch.reporting(progress=not args.quiet, beam_log=args.verbose):
        plan = plan_build(launch.as_config(args.config, args.overrides), options, overwrite=args.overwrite,
                          launched=not args.dry_run)
        if args.dry_run:
            print(describe_plan(plan))
            return EXIT_OK
        _INTERRUPTS.published = lambda: committed_run(plan.output_root) == plan.run.run_id and plan.output_path
        result = launch.launch(plan, options, started=started)
    if result is None:  # Beam's own --dry_run: the job graph was built
        print(f"dry run: the job graph for {plan.output_path} was built; nothing ran")
    elif not args.quiet:  # --quiet: warnings and errors only
        print(result.summary)
    return EXIT_OK


class _Interrupts:
    """Ctrl-C (SIGINT) and SIGTERM end a build with one line and exit 128 + the signal's number.

    The handler records the signal and raises KeyboardInterrupt, which Beam may wrap into its
    own error on the way out; every failure reported after a signal is reported as the
    interruption instead. What the run staged beside the output is removed by the next run's
    recovery (a dead run's staging directory is never mistaken for a live one).
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self.published: Callable[[], str | bool | None] | None = None  # the output's path once this run's dataset is in place
        self._said = False
        self._reported = threading.Lock()
        self._watchdog: threading.Timer | None = None

    @contextlib.contextmanager
    def handled(self):
        self.signal = None
        self.published = None
        self._said = False
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                previous[number] = signal.signal(number, self._on_signal)
        try:
            yield self
        finally:
            if self._watchdog is not None and not _threads_outlive(self._watchdog):
                self._watchdog.cancel()  # unwound in time
            # else a runner thread outlived the interruption and the process could not exit while it runs:
            # the (daemon) watchdog ends the process when its grace is up.
            self._watchdog = None
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, number: int, frame) -> None:
        if self.signal is not None:  # a second signal: stop now
            self._force_exit()
        self.signal = number
        # A runner may swallow the KeyboardInterrupt while it waits for its workers: give it a
        # few seconds to unwind, then stop the workers and exit anyway.
        self._watchdog = threading.Timer(_UNWIND_SECONDS, self._force_exit)
        self._watchdog.daemon = True
        self._watchdog.start()
        raise KeyboardInterrupt

    def _force_exit(self) -> None:
        code = self.report()
        for pid in child_processes(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        sys.stderr.flush()
        os._exit(code)

    def report(self) -> int:
        assert self.signal is not None
        with self._reported:
            if not self._said:
                self._said = True
                print(self._message(signal.Signals(self.signal).name), file=sys.stderr)
        return 128 + self.signal


    def _message(self, name: str) -> str:
        """The interruption as it is: after the commit point the new dataset is published, not lost."""
        published = None
        with contextlib.suppress(Exception):  # reporting an interruption must never fail itself
            published = self.published() if self.published is not None else None
        if published:
            return (f"{_PROG}: interrupted ({name}) after the commit point: the new dataset is published at "
                    f"{published}; the next run removes what this one left beside it")
        return f"{_PROG}: interrupted ({name}); the next run removes (or completes) what this one left"


_UNWIND_SECONDS = 5.0


def _threads_outlive(watchdog: threading.Timer) -> bool:
    """Whether a non-daemon thread (e.g. a Beam worker thread) is still running after the build unwound.

    Such a thread would keep the interpreter from exiting; each gets a moment to end on its own first.
    """
    deadline = time.monotonic() + _THREAD_END_SECONDS
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread is watchdog or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return True
    return False


_THREAD_END_SECONDS = 1.0


def child_processes(pid: int) -> list[int]:
    """Every process below pid (e.g. a multi-process runner's workers), from /proc; none where /proc is absent."""
    parents: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{entry}/stat") as handle:
                        parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier and child not in found]
        found.extend(frontier)
    return found


_INTERRUPTS = _Interrupts()
