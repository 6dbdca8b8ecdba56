"""Running a planned build from this process, as ``tfrbeam build`` does: lock, recover, run the pipeline, publish, report.

``launch`` is the one way a launcher runs a build (the CLI, ``tfrbeam.builder.run`` and
``tfrbeam.write_dataset`` all call it): it takes the output's lock before the pipeline starts,
runs the pipeline with its Commit step only staging, shows progress, and then publishes from this
process (docs/commit.md: only the launcher publishes). Every failure is raised as one of our
``TfrbeamError`` classes with a one-line message, never as a runner's traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions, TestOptions

from tfrbeam import errors as tfrbeam_errors
from tfrbeam.base import object_store
from tfrbeam.base.wording import counted
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.publish import OutputLock, abandon
from tfrbeam.builder.config import BuildConfig, apply_overrides, load_config, one_line, parse_config
from tfrbeam.builder.pipeline import commit as build_commit
from tfrbeam.builder.pipeline.commit import discard_staging, recover_output
from tfrbeam.builder.pipeline.graph import build_pipeline
from tfrbeam.builder.pipeline.plan import BuildPlan, check_output_dir, plan_build
from tfrbeam.builder.pipeline.runners import DEFAULT_RUNNER
from tfrbeam.builder.running.report import build_progress, summary_table
from tfrbeam.errors import BuildFailedError, ConfigError, TfrbeamError, TooManyBadRecordsError
from tfrbeam.layout.manifest_schema import Manifest

__all__ = [
    "BuildResult", "as_config", "build_options", "execute", "launch", "pipeline_error", "prepare", "publish",
    "reporting", "run",
]

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """A published dataset: its manifest as written, where it is, how long the build took, and the plan it ran."""

    manifest: dict[str, Any]
    plan: BuildPlan
    seconds: float

    @property
    def path(self) -> str:
        return self.plan.output_path

    @property
    def manifest_path(self) -> str:
        return self.plan.manifest_path

    @property
    def num_examples(self) -> dict[str, int]:
        """Examples (SequenceExamples) per split."""
        return {split.name: split.num_examples for split in self._checked.splits}

    @property
    def summary(self) -> str:
        """The table ``tfrbeam build`` prints at the end: per split examples, shards and bytes; bad rows; time."""
        return summary_table(self._checked, self.seconds, self.plan)

    @functools.cached_property
    def _checked(self) -> Manifest:
        """``manifest`` (the JSON object written) as the one ``Manifest`` the layout reads it as."""
        return Manifest.from_dict(self.manifest, self.plan.manifest_path)

    def __str__(self) -> str:
        return self.summary


def run(config: str | os.PathLike | Mapping[str, Any] | BuildConfig,
        pipeline_options: PipelineOptions | Sequence[str] | Mapping[str, Any] | None = None, *,
        overrides: Sequence[str] = (), overwrite: bool = False, progress: bool = True) -> BuildResult | None:
    """Run the build of ``config`` (a YAML path, the config as a dict, or a ``BuildConfig``) like ``tfrbeam build``.

    ``pipeline_options``: Beam's (a PipelineOptions, a list of ``--flag=value`` strings, or a dict);
    the runner defaults to the FnApiRunner in this process. ``overrides`` are ``--set`` values
    (``"shuffle.seed=7"``). Returns the published dataset's manifest and summary (None only when
    Beam's own ``--dry_run`` built the job graph without running it). Raises our one-line
    ``TfrbeamError`` subclasses (a config's problems joined by "; "): ConfigError, OutputExistsError,
    OutputNotWritableError before anything runs; OutputLockedError, TooManyBadRecordsError, BadRecordError, CommitError and
    the like (BuildFailedError for a runner's own failure) after.
    """
    options = build_options(pipeline_options)
    started = time.monotonic()
    try:
        plan = plan_build(as_config(config, overrides), options, overwrite=overwrite, launched=True)
    except ConfigError as error:
        raise one_line(error) from None
    with reporting(progress):
        result = launch(plan, options, started=started)
        if result is not None:
            _LOG.info("built %s:\n%s", result.path, result.summary)
    return result


def as_config(config: str | os.PathLike | Mapping[str, Any] | BuildConfig, overrides: Sequence[str] = ()) -> BuildConfig:
    """A BuildConfig from a YAML path, a dict in the YAML's form, or a BuildConfig (overrides only with the first two)."""
    if isinstance(config, BuildConfig):
        if overrides:
            raise ConfigError("overrides apply to a config path or dict, not to a BuildConfig (use dataclasses.replace)")
        return config
    if isinstance(config, (str, os.PathLike)):
        return load_config(os.fspath(config), list(overrides))
    if isinstance(config, Mapping):
        return parse_config(apply_overrides(dict(config), list(overrides)))
    raise ConfigError(f"config: expected a YAML path, a dict or a BuildConfig, got {type(config).__name__}")


def build_options(given: PipelineOptions | Sequence[str] | Mapping[str, Any] | None) -> PipelineOptions:
    """Beam options with the build's defaults: the FnApiRunner, and LOOPBACK workers for an embedded job server."""
    if isinstance(given, PipelineOptions):
        options = given
    elif isinstance(given, Mapping):
        options = PipelineOptions(**given)
    else:
        options = PipelineOptions(list(given or ()))
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    portable = options.view_as(PortableOptions)
    if portable.job_endpoint == "embed" and not portable.environment_type:
        portable.environment_type = "LOOPBACK"  # the default would start a Docker container per worker
    return options


def launch(plan: BuildPlan, options: PipelineOptions, attach: Callable[[beam.Pipeline], Any] | None = None,
           started: float | None = None) -> BuildResult | None:
    """Holding the output's lock: ``prepare``, ``execute`` and ``publish`` the build, as ``tfrbeam build`` does.

    ``attach`` adds the build to the new pipeline with its Commit step only staging
    (``publish=False``): this process publishes after the pipeline. By default it is the plan's
    own graph (``build_pipeline``). None: Beam's ``--dry_run`` built the job graph and ran nothing.
    """
    started = time.monotonic() if started is None else started
    if attach is None:
        def attach(pipeline: beam.Pipeline) -> Any:
            return build_pipeline(pipeline, plan, publish=False)
    lock = OutputLock(plan.output_root, plan.run).acquire()
    try:
        try:
            pipeline = prepare(plan, options, attach)
        except TfrbeamError:
            discard_staging(plan)  # what attaching staged (write_dataset's rows), as a failed run's
            raise
        execute(plan, pipeline)
        if options.view_as(TestOptions).dry_run:
            discard_staging(plan)
            return None
        return publish(plan, started)
    finally:
        abandon(plan.staging_dir)  # whatever this run left is the next run's to remove, even in this process
        lock.release()


def prepare(plan: BuildPlan, options: PipelineOptions, attach: Callable[[beam.Pipeline], Any]) -> beam.Pipeline:
    """Holding the lock: recover what dead runs left, check the output again, and make the build's pipeline."""
    removed = recover_output(plan.output_root)
    if removed:
        _LOG.info("removed what %d earlier, interrupted run(s) left", len(removed))
    # In a bucket one listing, after the recovery, serves the output's check and the choice of direct writes.
    listing = fs.list_objects(plan.output_root) if object_store.is_object_store(plan.output_root) else None
    check_output_dir(plan.output_root, plan.resolved_config, plan.overwrite, shown=plan.output_path, listing=listing)
    if listing is not None:
        build_commit.direct_writes(plan, listing=listing)  # decided once per run: the graph asks again
    pipeline = beam.Pipeline(options=options)
    try:
        attach(pipeline)
    except BaseException:
        # Beam removes the pipeline's local temp dir only when it runs; one that never runs would leave it in /tmp.
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
        raise
    return pipeline


def execute(plan: BuildPlan, pipeline: beam.Pipeline) -> None:
    """Run the pipeline with progress; a failure removes what it staged and raises ``pipeline_error``'s one-line error.

    A TooManyBadRecordsError keeps its dead letters in the staging directory for a look; the next run removes them.
    """
    _LOG.info("building %s from %s with %s", plan.output_path, counted(len(plan.inputs), "input file"), plan.runner)
    try:
        with build_progress(plan):
            pipeline.run().wait_until_finish()
    except Exception as error:  # every runner wraps worker errors differently
        failure = pipeline_error(error)
        discard_staging(plan, keep_dead_letters=isinstance(failure, TooManyBadRecordsError))
        raise failure from None


def publish(plan: BuildPlan, started: float) -> BuildResult:
    """After the pipeline, from this process: publish what its Commit step staged (docs/commit.md)."""
    try:
        manifest = build_commit.commit_staged(plan)  # only the launcher publishes: never a worker it left behind
    except TfrbeamError:
        build_commit.discard_unpublished(plan)  # kept once the commit began: the next run finishes it
        raise
    if manifest is None:
        discard_staging(plan)
        raise BuildFailedError(f"the pipeline finished but staged no dataset for {plan.output_path} (the runner did "
                               "not run its Commit step); nothing was published")
    return BuildResult(manifest, plan, time.monotonic() - started)


_OUR_ERROR_LINE = re.compile(
    r"(?:tfrbeam\.errors\.)?(" + "|".join(
        name for name, value in vars(tfrbeam_errors).items() if isinstance(value, type) and issubclass(value, TfrbeamError)
    ) + r"): (.+)"
)
_WHILE_RUNNING = re.compile(r"\s*\[while running '[^\]]*'\]\s*$")


def pipeline_error(error: BaseException) -> TfrbeamError:
    """Our error from whatever a runner raised (the exception chain first, then its text), with a one-line message.

    The error's class is ours when one of ours is found (a TooManyBadRecordsError stays one);
    otherwise BuildFailedError naming the runner's error and its last line.
    """
    name, message = _our_error(error)
    found = getattr(tfrbeam_errors, name, None) if name else None
    if isinstance(found, type) and issubclass(found, TfrbeamError):
        return _instance(found, message)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return BuildFailedError(f"{type(error).__name__}: {lines[-1] if lines else repr(error)}")


def _our_error(error: BaseException) -> tuple[str | None, str]:
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TfrbeamError):
            return type(current).__name__, _WHILE_RUNNING.sub("", str(current)).strip()
        current = current.__cause__ or current.__context__
    matches = _OUR_ERROR_LINE.findall(str(error))
    if matches:
        name, message = matches[-1]
        return name, _WHILE_RUNNING.sub("", message).strip()
    return None, ""


def _instance(cls: type[TfrbeamError], message: str) -> TfrbeamError:
    """``cls(message)``; classes whose constructor takes other arguments (RecordError) keep the message as it is."""
    try:
        return cls(message)
    except TypeError:
        failure = Exception.__new__(cls)
        Exception.__init__(failure, message)
        return failure


_LOG_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


@contextlib.contextmanager
def reporting(progress: bool = True, beam_log: bool = False) -> Iterator[None]:
    """While a build runs: the logging of ``tfrbeam build`` and of the Python API, put back as it was after.

    ``progress``: the ``tfrbeam`` logger shows info lines (progress, then the summary), else
    warnings only. ``beam_log``: Beam's own log shows too; by default it is quiet, as Beam logs
    a failing DoFn's traceback before raising and the one-line error raised says it all. The lines
    go to the handlers there are, a plain stream handler (the one Beam's ``PipelineOptions`` gives
    the root logger) in the command's format meanwhile; with none, to stderr.
    """
    beam_logger, our_logger = logging.getLogger("apache_beam"), logging.getLogger("tfrbeam")
    levels = [(beam_logger, beam_logger.level), (our_logger, our_logger.level)]
    beam_logger.setLevel(logging.INFO if beam_log else logging.CRITICAL)
    our_logger.setLevel(logging.INFO if progress else logging.WARNING)
    plain = [(handler, handler.formatter) for handler in logging.root.handlers if type(handler) is logging.StreamHandler
             and getattr(handler.formatter, "_fmt", None) in (None, logging.BASIC_FORMAT)]
    for handler, _ in plain:
        handler.setFormatter(_LOG_FORMAT)
    added = None
    if not logging.root.handlers and not our_logger.handlers:
        added = logging.StreamHandler()
        added.setFormatter(_LOG_FORMAT)
        our_logger.addHandler(added)
    try:
        yield
    finally:
        for logger, level in levels:
            logger.setLevel(level)
        for handler, formatter in plain:
            handler.setFormatter(formatter)
        if added is not None:
            our_logger.removeHandler(added)
