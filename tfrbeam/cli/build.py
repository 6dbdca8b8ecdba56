"""``tfrbeam build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``.

Also ``python -m tfrbeam.builder``. Options this command does not know go to Beam's PipelineOptions;
the runner defaults to the FnApiRunner in this process (``--piece_store`` picks how pieces travel). Config and output-directory
problems are reported in one
line with exit status 2 before any pipeline starts; a failed build (a bad row with
``on_bad_record: fail``, too many bad rows) is reported in one line with exit status 1.

The launcher's steps (lock, recover, run with progress, publish from this process, the summary)
are tfrbeam/builder/running/launch.py's, which ``tfrbeam.builder.run`` and ``tfrbeam.write_dataset`` share;
this module adds the command line, the dry run, exit statuses and interrupts.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

# Beam's import-time warnings about its optional extras are held back while this module imports Beam, so the imports
# below follow that block.
from tfrbeam.cli.beam_warnings import without_beam_import_warnings

with without_beam_import_warnings():
    import apache_beam.io  # noqa: F401  # imports tfrecordio, whose import may warn about crcmod
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        PipelineOptions,
        StandardOptions,
        TestOptions,
    )

from tfrbeam.base.wording import counted
from tfrbeam.beam.publish import OutputLock, abandon, committed_run
from tfrbeam.builder.config import load_config
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.pipeline.commit import discard_staging
from tfrbeam.builder.pipeline.graph import build_pipeline
from tfrbeam.builder.pipeline.plan import BuildPlan, plan_build
from tfrbeam.builder.pipeline.splits import describe_split_source
from tfrbeam.builder.running import launch as launcher
from tfrbeam.builder.running.fork_server_process import close_early_server
from tfrbeam.builder.running.forked_workers import worker_fork_server
from tfrbeam.builder.shuffle import MEMORY
from tfrbeam.errors import (
    ConfigError,
    OutputExistsError,
    OutputLockedError,
    OutputNotWritableError,
    TfrbeamError,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
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
    with _INTERRUPTS.handled():
        try:
            return _build(argv)
        except KeyboardInterrupt:
            _INTERRUPTS.signal = _INTERRUPTS.signal or signal.SIGINT
            return _INTERRUPTS.report()
        finally:
            close_early_server()  # started for this command line, not taken: a config error, a locked output


def _build(argv: list[str] | None) -> int:
    try:
        args, options = parse_command_line(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        return _fail(str(error), EXIT_USAGE)
    _configure_logging(args.quiet, args.verbose)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        return _fail(str(error), EXIT_USAGE)
    started = time.monotonic()
    try:
        plan = plan_build(config, options, overwrite=args.overwrite)
    except (ConfigError, OutputExistsError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_USAGE)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_FAILED)
    if args.dry_run:
        print(describe_plan(plan))
        return EXIT_OK
    _INTERRUPTS.published = lambda: committed_run(plan.output_root) == plan.run.run_id and plan.output_path
    try:
        lock = OutputLock(plan.output_root, plan.run).acquire()
    except (OutputLockedError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_FAILED)
    try:
        return _run_locked(plan, options, started, quiet=args.quiet)
    finally:
        abandon(plan.staging_dir)  # whatever this run left is the next run's to remove, even in this process
        lock.release()


def _run_locked(plan: BuildPlan, options: PipelineOptions, started: float, quiet: bool) -> int:
    """Holding the output's lock: the launcher's steps (tfrbeam.builder.running.launch), each failure one line with
    its exit status.

    The summary table goes to stdout unless ``quiet`` (which shows warnings and errors only).
    """
    # Started first: the workers' fork server imports Beam while this process builds the job graph.
    with worker_fork_server(options, plan.workers) as fork_server:
        try:
            pipeline = launcher.prepare(plan, options, lambda pipeline: build_pipeline(pipeline, plan, publish=False),
                                        fork_server)
        except (ConfigError, OutputExistsError, OutputNotWritableError) as error:
            return _fail(str(error), EXIT_USAGE)
        except TfrbeamError as error:
            return _fail(str(error), EXIT_FAILED)
        try:
            launcher.execute(plan, pipeline)
        except TfrbeamError as error:
            return _fail(str(error), EXIT_FAILED)
    if options.view_as(TestOptions).dry_run:
        discard_staging(plan)
        print(f"dry run: the job graph for {plan.output_path} was built; nothing ran")
        return EXIT_OK
    try:
        result = launcher.publish(plan, started)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_FAILED)
    if not quiet:
        print(result.summary)
    return EXIT_OK


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, PipelineOptions]:
    """Our arguments and Beam's options; any other argument is a ConfigError (did-you-mean included).

    Every option must be ours or one Beam's own parser knows (Beam would silently discard it),
    the runner must be one Beam can create, and Dataflow gets the options it cannot run without.
    """
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    _import_named_runner(rest)
    beam_parser = beam_argument_parser()
    _, unknown = beam_parser.parse_known_args(rest)
    if unknown:
        raise ConfigError(_unknown_argument(unknown[0], [*_option_strings(parser), *_option_strings(beam_parser)]))
    options = launcher.build_options(rest)
    check_runner(options)
    return args, options


def _import_named_runner(arguments: list[str]) -> None:
    """A runner given by module path (``--runner pkg.module.Class``) registers its options when imported."""
    runner = None
    for index, argument in enumerate(arguments):
        if argument.startswith("--runner="):
            runner = argument.split("=", 1)[1]
        elif argument == "--runner" and index + 1 < len(arguments):
            runner = arguments[index + 1]
    if runner and "." in runner:
        module = runner.rsplit(".", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"--runner: cannot import {module} ({error}); install the runner's package") from error


def beam_argument_parser() -> argparse.ArgumentParser:
    """The parser Beam builds from every options class, taken from ``get_all_options``' public callback.

    A bad value on it is one ConfigError line, not Beam's 129-line usage and exit.
    """
    parsers: list[argparse.ArgumentParser] = []

    def keep(parser: argparse.ArgumentParser) -> None:
        parser.error = _one_line_beam_error  # type: ignore[method-assign]
        parsers.append(parser)

    PipelineOptions([]).get_all_options(add_extra_args_fn=keep)
    return parsers[0]


def _one_line_beam_error(message: str) -> NoReturn:
    raise ConfigError(f"Beam option: {message}")


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [name for name in parser._option_string_actions if name.startswith("--")]  # Beam keeps no public list


def _unknown_argument(argument: str, known: list[str]) -> str:
    if not argument.startswith("-"):
        return f"unexpected argument {argument!r} (the config is the one positional argument; options start with --)"
    name = argument.split("=", 1)[0]
    return f"unknown option {name}{_did_you_mean(name, known, quote=False)}"


def _did_you_mean(word: str, choices: list[str], quote: bool = True) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not match:
        return ""
    return f"; did you mean {match[0]!r}?" if quote else f"; did you mean {match[0]}?"


_DATAFLOW_REQUIRED = (("project", "--project"), ("region", "--region"), ("temp_location", "--temp_location"))


def check_runner(options: PipelineOptions) -> None:
    """A runner Beam can create, and for Dataflow the project, region and temp_location it needs."""
    runner = options.view_as(StandardOptions).runner
    if not isinstance(runner, str):
        return
    known = {name.lower(): name for name in StandardOptions.KNOWN_RUNNER_NAMES}
    lowered = runner.lower()
    if "." not in runner and lowered not in known and lowered + "runner" not in known:
        raise ConfigError(f"--runner: {runner!r} is not a Beam runner"
                          f"{_did_you_mean(runner, list(StandardOptions.KNOWN_RUNNER_NAMES))} "
                          f"(runners: {', '.join(StandardOptions.KNOWN_RUNNER_NAMES)})")
    if lowered in ("dataflow", "dataflowrunner"):
        cloud = options.view_as(GoogleCloudOptions)
        missing = [flag for attribute, flag in _DATAFLOW_REQUIRED if not getattr(cloud, attribute)]
        if missing:
            listed = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
            raise ConfigError(f"--runner DataflowRunner needs {listed} "
                              "(e.g. --project my-project --region us-central1 --temp_location gs://my-bucket/tmp)")


def _shown_kind(spec: FeatureSpec) -> str:
    if spec.time_unit is not None:
        return f"int64 ({spec.time_unit} since 1970 from {spec.time_format or 'ISO 8601'})"
    assert spec.type is not None  # a plan's features are resolved
    if spec.file is not None:  # from_file: the column holds paths
        return f"{spec.type} (the file's {'bytes' if spec.file.part == 'bytes' else 'image ' + spec.file.part})"
    return spec.type


def describe_plan(plan: BuildPlan) -> str:
    """What ``--dry-run`` prints: inputs, features, splits, shards, output, runner and piece store."""
    sizes = [item.size for item in plan.input_files]
    lines = ["dry run: nothing ran and nothing was written (the first input was sampled to settle the features)",
             f"inputs:      {counted(len(sizes), plan.config.input.format + ' file')}, {sum(sizes):,} bytes"]
    lines += [f"  {item.path}  {item.size:,} bytes" for item in plan.input_files[:_SHOWN_INPUTS]]
    if len(sizes) > _SHOWN_INPUTS:
        lines.append(f"  ... and {len(sizes) - _SHOWN_INPUTS} more")
    width = max(len(spec.name) for spec in plan.features)
    lines.append(f"features:    {len(plan.features)}")
    kinds = [_shown_kind(spec) for spec in plan.features]
    kind_width = max(len(kind) for kind in kinds)
    for spec, kind in zip(plan.features, kinds):
        source = f"  from {spec.source}" if spec.source != spec.name else ""
        lines.append(f"  {spec.name:<{width}}  {kind:<{kind_width}}  {_shape_text(spec.shape):<7}  {_null_text(spec)}{source}")
    if plan.config.split_by is not None:
        lines.append(f"splits:      {', '.join(plan.config.splits)} by {describe_split_source(plan.config, plan.input_splits)}")
    else:
        lines.append("splits:      " + ", ".join(f"{name} {fraction:g}" for name, fraction in zip(plan.config.splits,
                                                                                               plan.config.fractions))
                     + (f" (by {', '.join(plan.config.split_key)})" if plan.config.split_key else ""))
    sharding = plan.sharding
    if sharding.max_bytes_per_shard is not None:
        lines.append(f"shards:      as many per split as keep each under {sharding.max_bytes_per_shard:,} bytes")
    else:  # fixed counts: an int per split
        lines.append("shards:      " + ", ".join(f"{name} {counted(int(count), 'shard')}"  # type: ignore[arg-type]
                                               for name, count in zip(sharding.splits, sharding.num_shards)))
    lines += _sequence_text(plan)
    shuffle = plan.config.shuffle
    lines += [f"shuffle:     {'seed ' + str(shuffle.seed) if shuffle.enabled else 'off (input order)'}",
              f"output:      {plan.output_path} (compression {sharding.compression or 'none'}"
              f"{', replacing what is there' if plan.overwrite else ''})",
              f"bad rows:    {plan.config.errors.on_bad_record}, at most {plan.config.errors.max_bad_fraction:g} of rows",
              f"runner:      {plan.runner}",
              f"workers:     {plan.workers.describe()}"]
    piece_store = getattr(plan, "piece_store", None)
    if piece_store == MEMORY:
        held = plan.memory_store_bytes
        lines.append(f"piece store: memory (up to {held / (1 << 20):g} MiB held in this process, the rest spilled)")
    elif piece_store is not None:
        lines.append(f"piece store: {piece_store}")
    return "\n".join(lines)


_SHOWN_INPUTS = 20


def _sequence_text(plan: BuildPlan) -> list[str]:
    """The dry run's lines on a sequence build: grouping, ordering, context, cuts and the GroupByKey's buckets."""
    sequence = plan.config.sequence
    if sequence is None:
        return []
    ordered = ", ".join(sequence.order_by) + ", then" if sequence.order_by else "by"
    steps = sequence.sequence_features(plan.features)
    cut = (f"max_steps {sequence.max_steps} (overflow {sequence.overflow})" if sequence.max_steps is not None
           else "max_steps none")
    return [f"sequence:    one SequenceExample per {', '.join(sequence.group_by)}; steps ordered by {ordered} the row's "
            "content hash",
            f"  context:   {', '.join(sequence.context_features)}",
            f"  steps:     {', '.join(steps)}",
            f"  limits:    min_steps {sequence.min_steps}, {cut}, max_group_bytes {sequence.max_group_bytes:,}",
            f"  buckets:   {plan.sequence_buckets} (the GroupByKey of group keys; one worker holds one bucket)"]


def _shape_text(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "[any]"
    return "scalar" if shape == () else f"[{shape[0]}]"


def _null_text(spec) -> str:
    if spec.on_null == "omit":
        return "null -> omitted"
    if spec.on_null == "default":
        default = spec.default
        shown = [_plain(item) for item in default] if isinstance(default, tuple) else _plain(default)
        return f"null -> default {shown}"
    return "null -> bad row"


def _plain(value):
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _configure_logging(quiet: bool, verbose: bool) -> None:
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    # Beam's PipelineOptions() has already called logging.basicConfig(): give the plain stream handler it made our
    # format. Like basicConfig, add one only to a root logger without handlers (an application's own are kept).
    if not logging.root.handlers:
        logging.root.addHandler(logging.StreamHandler())
    for handler in logging.root.handlers:
        if type(handler) is logging.StreamHandler and getattr(handler.formatter, "_fmt", None) in (None, logging.BASIC_FORMAT):
            handler.setFormatter(formatter)
    level = logging.WARNING if quiet else logging.INFO
    for name in ("pipelines", "tfrbeam"):
        logging.getLogger(name).setLevel(level)
    # Beam logs a failing DoFn's traceback before raising; the one-line error below says it all.
    logging.getLogger("apache_beam").setLevel(logging.INFO if verbose else logging.CRITICAL)


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


def _fail(message: str, code: int) -> int:
    if _INTERRUPTS.signal is not None:
        return _INTERRUPTS.report()
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return code
