"""``tfrbeam build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``.

Also ``python -m tfrbeam.build``. Options this command does not know go to Beam's PipelineOptions;
the runner defaults to the FnApiRunner in this process (``--piece_store`` picks how pieces travel). Config and output-directory problems are reported in one
line with exit status 2 before any pipeline starts; a failed build (a bad row with
``on_bad_record: fail``, too many bad rows) is reported in one line with exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions, TestOptions

from tfrbeam.build.config import load_config
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.beam.publish import OutputLock, abandon
from tfrbeam.build.commit import discard_staging, recover_output
from tfrbeam.build.graph import build_pipeline
from tfrbeam.build.plan import BuildPlan, check_output_dir, plan_build
from tfrbeam.build.runners import DEFAULT_RUNNER
from tfrbeam.manifest import read_manifest
from tfrbeam import errors as tfrbeam_errors
from tfrbeam.errors import (
    ConfigError, OutputExistsError, OutputLockedError, OutputNotWritableError, TfrbeamError, TooManyBadRecordsError,
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
        prog=_PROG, description="Build a shuffled, split, sharded TFRecord dataset from Parquet or CSV.",
        epilog="Other options (e.g. --runner DataflowRunner --project P --region R --temp_location gs://... "
        "--setup_file ./setup.py, or --direct_num_workers 2 --direct_running_mode multi_processing) go to Beam.",
    )
    parser.add_argument("config", metavar="CONFIG.yaml", help="the build config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one config value (YAML syntax), e.g. --set shuffle.seed=7; repeatable")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a different dataset (or other files) in output.path")
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
    parser.add_argument("--verbose", action="store_true", help="also show Beam's own log (worker tracebacks included)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a dataset build; returns the exit status."""
    args, beam_args = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    _configure_logging(args.quiet, args.verbose)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        return _fail(str(error), EXIT_USAGE)
    options = _pipeline_options(beam_args)
    started = time.monotonic()
    try:
        plan = plan_build(config, options, overwrite=args.overwrite)
    except (ConfigError, OutputExistsError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_USAGE)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_FAILED)
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
        build_pipeline(pipeline, plan)
    except (ConfigError, OutputExistsError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_USAGE)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_FAILED)
    logging.getLogger(__name__).info(
        "building %s from %d input file(s) with %s", plan.output_path, len(plan.inputs), plan.runner
    )
    try:
        pipeline.run().wait_until_finish()
    except Exception as error:  # noqa: BLE001 - every runner wraps worker errors differently
        message = _one_line(error)
        # Too many bad rows keeps its dead letters for a look; the next run removes them.
        discard_staging(plan, keep_dead_letters=message.startswith(TooManyBadRecordsError.__name__))
        return _fail(message, EXIT_FAILED)
    if options.view_as(TestOptions).dry_run:
        discard_staging(plan)
        print(f"dry run: the job graph for {plan.output_path} was built; nothing ran")
        return EXIT_OK
    manifest = read_manifest(plan.output_root, BEAM_FILES)
    if manifest is None or manifest.get("run_id") != plan.run.run_id:
        print(f"submitted; the manifest will be {plan.manifest_path} when the job finishes")
        return EXIT_OK
    print(summary_table(manifest, time.monotonic() - started, plan))
    return EXIT_OK


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
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
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


def _fail(message: str, code: int) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return code


def summary_table(manifest: dict, seconds: float, run: BuildPlan) -> str:
    """The end-of-build table: rows read, examples, shards and bytes per split, bad rows, time and speed."""
    rows_read = manifest["rows_read"]
    lines = [f"{'split':<12}{'examples':>12}{'shards':>8}{'bytes':>16}"]
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
    lines += [
        f"rows read:  {rows_read:,}",
        bad_line,
        f"time:       {seconds:.1f} s ({rate:,.0f} rows/s, runner {manifest['runner']}, "
        f"piece store {manifest.get('piece_store', 'auto')})",
        f"manifest:   {run.manifest_path}",
    ]
    return "\n".join(lines)
