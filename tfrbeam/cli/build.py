"""``tfrbeam build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``.

Also ``python -m tfrbeam.build``. Options this command does not know go to Beam's PipelineOptions;
the runner defaults to the FnApiRunner in this process (``--piece_store`` picks how pieces travel). Config and output-directory
problems are reported in one
line with exit status 2 before any pipeline starts; a failed build (a bad row with
``on_bad_record: fail``, too many bad rows) is reported in one line with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
    TestOptions,
    _BeamArgumentParser,
)

from tfrbeam import errors as tfrbeam_errors
from tfrbeam.beam.publish import OutputLock, abandon, committed_run
from tfrbeam.build import commit as build_commit
from tfrbeam.build.commit import discard_staging, recover_output
from tfrbeam.build.config import load_config
from tfrbeam.build.features import FeatureSpec
from tfrbeam.build.graph import build_pipeline
from tfrbeam.build.plan import BuildPlan, check_output_dir, plan_build
from tfrbeam.build.progress import WRITTEN, progress_dir, read_progress
from tfrbeam.build.runners import DEFAULT_RUNNER
from tfrbeam.build.shuffle import MEMORY
from tfrbeam.errors import (
    ConfigError,
    OutputExistsError,
    OutputLockedError,
    OutputNotWritableError,
    TfrbeamError,
    TooManyBadRecordsError,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_PROG = "tfrbeam build"
_OUR_ERROR_LINE = re.compile(
    r"(?:tfrbeam\.errors\.)?(" + "|".join(
        name for name, value in vars(tfrbeam_errors).items() if isinstance(value, type) and issubclass(value, TfrbeamError)
    ) + r"): (.+)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Build a shuffled, split, sharded TFRecord dataset from Parquet or CSV.", allow_abbrev=False,
        epilog="Other options (e.g. --runner DataflowRunner --project P --region R --temp_location gs://... "
        "--setup_file ./setup.py, or --direct_num_workers 2 --direct_running_mode multi_processing) go to Beam.",
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
    parser.add_argument("--quiet", action="store_true", help="log warnings only, and show no progress")
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
        return _run_locked(plan, options, started)
    finally:
        abandon(plan.staging_dir)  # whatever this run left is the next run's to remove, even in this process
        lock.release()


def _run_locked(plan: BuildPlan, options: PipelineOptions, started: float) -> int:
    """Holding the output's lock: recover what dead runs left, check the output again, run, report."""
    try:
        removed = recover_output(plan.output_root)
        if removed:
            logging.getLogger(__name__).info("removed what %d earlier, interrupted run(s) left", len(removed))
        check_output_dir(plan.output_root, plan.resolved_config, plan.overwrite, shown=plan.output_path)
        pipeline = beam.Pipeline(options=options)
        build_pipeline(pipeline, plan, publish=False)  # this process publishes, after the pipeline
    except (ConfigError, OutputExistsError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_USAGE)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_FAILED)
    logging.getLogger(__name__).info(
        "building %s from %d input file(s) with %s", plan.output_path, len(plan.inputs), plan.runner
    )
    try:
        with build_progress(plan):
            pipeline.run().wait_until_finish()
    except Exception as error:  # every runner wraps worker errors differently
        message = _one_line(error)
        # Too many bad rows keeps its dead letters for a look; the next run removes them.
        discard_staging(plan, keep_dead_letters=message.startswith(TooManyBadRecordsError.__name__))
        return _fail(message, EXIT_FAILED)
    if options.view_as(TestOptions).dry_run:
        discard_staging(plan)
        print(f"dry run: the job graph for {plan.output_path} was built; nothing ran")
        return EXIT_OK
    try:
        manifest = build_commit.commit_staged(plan)  # only the launcher publishes: never a worker it left behind
    except TfrbeamError as error:
        build_commit.discard_unpublished(plan)  # kept once the commit began: the next run finishes it
        return _fail(str(error), EXIT_FAILED)
    if manifest is None:
        discard_staging(plan)
        return _fail(f"the pipeline finished but staged no dataset for {plan.output_path} (the runner did not run its "
                     "Commit step); nothing was published", EXIT_FAILED)
    print(summary_table(manifest, time.monotonic() - started, plan))
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
    options = _pipeline_options(rest)
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
    """The parser Beam's PipelineOptions build from every options class (as get_all_options does)."""
    parser = _OneLineBeamParser(allow_abbrev=False)
    classes = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
    for cls in classes.values():
        cls._add_argparse_args(parser)  # the one way to learn Beam's options
    return parser


class _OneLineBeamParser(_BeamArgumentParser):
    """Beam's option parser, but a bad value is one ConfigError line, not Beam's 129-line usage and exit."""

    def error(self, message: str) -> NoReturn:
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
             f"inputs:      {len(sizes)} {plan.config.input.format} file(s), {sum(sizes):,} bytes"]
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
    lines.append("splits:      " + ", ".join(f"{name} {fraction:g}" for name, fraction in plan.config.splits.items())
                 + (f" (by {', '.join(plan.config.split_key)})" if plan.config.split_key else ""))
    sharding = plan.sharding
    if sharding.max_bytes_per_shard is not None:
        lines.append(f"shards:      as many per split as keep each under {sharding.max_bytes_per_shard:,} bytes")
    else:
        lines.append("shards:      " + ", ".join(f"{name} {count} shard{'s' if count != 1 else ''}"
                                               for name, count in zip(sharding.splits, sharding.num_shards)))
    lines += _sequence_text(plan)
    shuffle = plan.config.shuffle
    lines += [f"shuffle:     {'seed ' + str(shuffle.seed) if shuffle.enabled else 'off (input order)'}",
              f"output:      {plan.output_path} (compression {sharding.compression or 'none'}"
              f"{', replacing what is there' if plan.overwrite else ''})",
              f"bad rows:    {plan.config.errors.on_bad_record}, at most {plan.config.errors.max_bad_fraction:g} of rows",
              f"runner:      {plan.runner}"]
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


def _pipeline_options(beam_args: list[str]) -> PipelineOptions:
    """Beam options with our defaults: the FnApiRunner (the same on every machine, see tfrbeam.build.runners);
    an embedded job server runs its workers in this process."""
    options = PipelineOptions(beam_args)
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    portable = options.view_as(PortableOptions)
    if portable.job_endpoint == "embed" and not portable.environment_type:
        portable.environment_type = "LOOPBACK"  # the default would start a Docker container per worker
    return options


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


def _one_line(error: BaseException) -> str:
    """Our error's message from whatever a runner raised: the exception chain first, then its text."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TfrbeamError):
            return f"{type(current).__name__}: {_WHILE_RUNNING.sub('', str(current)).strip()}"
        current = current.__cause__ or current.__context__
    matches = _OUR_ERROR_LINE.findall(str(error))
    if matches:
        name, message = matches[-1]
        return f"{name}: {_WHILE_RUNNING.sub('', message).strip()}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else error!r}"


_WHILE_RUNNING = re.compile(r"\s*\[while running '[^\]]*'\]\s*$")


PROGRESS_LOG_SECONDS = 10.0  # without a terminal: one progress line this often
_PROGRESS_BAR_SECONDS = 0.5


@contextlib.contextmanager
def build_progress(plan: BuildPlan):
    """While the pipeline runs: a progress bar on a terminal, else a log line every PROGRESS_LOG_SECONDS.

    Counts come from the workers' counter files in the staging directory (see build.progress), so
    multi-process workers count too: rows and bytes read against the inputs' size from planning,
    then examples written by the shard writers (the shuffle and write phase). Shown at info level:
    --quiet turns it off; remote staging has none.
    """
    directory = progress_dir(plan.staging_dir)
    if directory is None or not logging.getLogger("tfrbeam").isEnabledFor(logging.INFO):
        yield
        return
    total = sum(item.size for item in plan.input_files)
    display = _ProgressBar(total) if sys.stderr.isatty() else _ProgressLog(total)
    stop = threading.Event()
    read_offsets: dict[str, int] = {}
    written_offsets: dict[str, int] = {}
    read, written = [0, 0], [0, 0]

    def update() -> None:
        display.show(read_progress(directory, read_offsets, read),
                     read_progress(directory, written_offsets, written, WRITTEN))

    def poll() -> None:
        while not stop.wait(display.interval):
            update()

    thread = threading.Thread(target=poll, name="tfrbeam-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        update()
        display.close()


class _ProgressBar:
    """tqdm's bar over the input bytes while reading, then over the examples written; log lines print above it."""

    interval = _PROGRESS_BAR_SECONDS

    def __init__(self, total: int) -> None:
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.total = total
        self.bar = self._bar(total, "B", "reading")
        self.writing = False
        self._redirect = logging_redirect_tqdm()  # the root logger's stderr handler writes through tqdm.write
        self._redirect.__enter__()

    @staticmethod
    def _bar(total: int, unit: str, description: str):
        from tqdm import tqdm

        try:
            size = os.get_terminal_size(sys.stderr.fileno())
            sized = size.columns > 0 and size.lines > 0
        except OSError:
            sized = False
        # tqdm hides every bar on a terminal that reports no size (a bare pty): give it one.
        return tqdm(total=total, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                    desc=description, file=sys.stderr, dynamic_ncols=sized, ncols=None if sized else 100,
                    nrows=None if sized else 24, leave=False, mininterval=_PROGRESS_BAR_SECONDS)

    def show(self, read: tuple[int, int], written: tuple[int, int]) -> None:
        rows, size = read
        if not self.writing and (written[0] > 0 or size >= self.total):
            self.bar.close()  # reading is done: the rest of the run is the shuffle and the shard writers
            self.bar = self._bar(rows, " examples", "shuffling and writing")
            self.writing = True
        if self.writing:
            self.bar.update(min(written[0], int(self.bar.total)) - self.bar.n)
            return
        self.bar.set_postfix_str(f"{rows:,} rows", refresh=False)
        self.bar.update(min(size, self.total) - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        self._redirect.__exit__(None, None, None)


class _ProgressLog:
    """A log line every PROGRESS_LOG_SECONDS: rows, bytes of the total, rate and ETA; then the examples written."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.interval = PROGRESS_LOG_SECONDS
        self._last_written = -1

    def show(self, read: tuple[int, int], written: tuple[int, int]) -> None:
        rows, size = read
        seconds = time.monotonic() - self.started
        done = min(size, self.total)
        log = logging.getLogger(__name__)
        if done < self.total and written[0] == 0:
            rate = done / seconds if seconds > 0 else 0.0
            eta = f", about {_duration((self.total - done) / rate)} left" if rate > 0 else ""
            share = 100.0 * done / self.total if self.total else 100.0
            log.info("read %s rows, %s of %s input bytes (%.0f%%) in %s, %s rows/s%s", f"{rows:,}", f"{done:,}",
                     f"{self.total:,}", share, _duration(seconds), f"{rows / seconds:,.0f}" if seconds > 0 else "0", eta)
        elif written[0] != self._last_written:
            self._last_written = written[0]
            log.info("shuffle and write: %s examples (%s bytes) written of %s rows read, in %s", f"{written[0]:,}",
                     f"{written[1]:,}", f"{rows:,}", _duration(seconds))

    def close(self) -> None:
        """Nothing to tear down: the summary table follows."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


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
            if self._watchdog is not None:
                self._watchdog.cancel()  # unwound in time
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


def summary_table(manifest: dict, seconds: float, run: BuildPlan) -> str:
    """The end-of-build table: rows read, examples, shards and bytes per split, bad rows, time and speed."""
    rows_read = manifest["rows_read"]
    sequences = "sequence" in manifest
    lines = [f"{'split':<12}{'sequences' if sequences else 'examples':>12}{'shards':>8}{'bytes':>16}"]
    for name, split in manifest["splits"].items():
        lines.append(f"{name:<12}{split['num_examples']:>12,}{len(split['shards']):>8}{split['num_bytes']:>16,}")
    total_examples = sum(split["num_examples"] for split in manifest["splits"].values())
    total_bytes = sum(split["num_bytes"] for split in manifest["splits"].values())
    total_shards = sum(len(split["shards"]) for split in manifest["splits"].values())
    lines.append(f"{'total':<12}{total_examples:>12,}{total_shards:>8}{total_bytes:>16,}")
    bad = manifest["bad_records"]
    bad_line = f"bad rows:   {bad['count']:,} ({bad['action']})"
    if bad.get("dead_letter_path"):
        bad_line += f" -> {bad['dead_letter_path']}"
    rate = rows_read / seconds if seconds > 0 else 0.0
    lines += [f"rows read:  {rows_read:,}", *(_groups_lines(manifest) if sequences else []), bad_line,
        f"time:       {seconds:.1f} s ({rate:,.0f} rows/s, runner {manifest['runner']}, "
        f"piece store {manifest.get('piece_store', 'auto')})",
        f"manifest:   {run.manifest_path}",
    ]
    return "\n".join(lines)


def _groups_lines(manifest: dict) -> list[str]:
    """The summary's lines on a sequence build: groups kept and dropped, steps per SequenceExample."""
    splits = manifest["splits"].values()
    kept, cut = sum(split["num_groups"] for split in splits), sum(split["split_groups"] for split in splits)
    few = sum(split["dropped_groups"]["too_few_steps"] for split in splits)
    bad = sum(split["dropped_groups"]["bad"] for split in splits)
    examples = sum(split["num_examples"] for split in splits)
    steps = sum(split["steps"]["total"] for split in splits)
    shortest = min((split["steps"]["min"] for split in splits if split["num_examples"]), default=0)
    longest = max((split["steps"]["max"] for split in splits), default=0)
    truncated = sum(split["truncated_steps"] for split in splits)
    return [f"groups:     {kept:,} kept ({cut:,} cut by max_steps), {few:,} under min_steps, {bad:,} bad",
            f"steps:      {steps:,} ({shortest:,}..{longest:,} per sequence, mean {steps / max(examples, 1):.1f})"
            + (f", {truncated:,} truncated" if truncated else "")]
