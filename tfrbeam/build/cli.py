"""``tfrbeam build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``.

Also ``tfrbeam build ...``. Options this command does not know go to Beam's PipelineOptions; the
runner defaults to the DirectRunner. Config and output-directory problems are reported in one
line with exit status 2 before any pipeline starts; a failed build (a bad row with
``on_bad_record: fail``, too many bad rows) is reported in one line with exit status 1.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions, PipelineOptions, PortableOptions, StandardOptions, TestOptions, _BeamArgumentParser,
)

from tfrbeam.build.config import load_config
from tfrbeam.beam.filesystem import BEAM_FILES
from tfrbeam.beam.publish import OutputLock, recover
from tfrbeam.build.commit import NEW_DATASET_DIR, OLD_DATASET_DIR, discard_staging
from tfrbeam.build.graph import build_pipeline
from tfrbeam.build.plan import BuildPlan, check_output_dir, plan_build
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
        prog=_PROG, description="Build a shuffled, split, sharded TFRecord dataset from Parquet or CSV.", allow_abbrev=False,
        epilog="Other options (e.g. --runner DataflowRunner --project P --region R --temp_location gs://... "
        "--setup_file ./setup.py, or --direct_num_workers 2 --direct_running_mode multi_processing) go to Beam.",
    )
    parser.add_argument("config", metavar="CONFIG.yaml", help="the build config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one config value (YAML syntax), e.g. --set shuffle.seed=7; repeatable")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a different dataset (or other files) in output.path")
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything and print the plan (inputs, features, splits, shards, output, runner); run nothing")
    parser.add_argument("--quiet", action="store_true", help="log warnings only, and show no progress")
    parser.add_argument("--verbose", action="store_true", help="also show Beam's own log (worker tracebacks included)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a dataset build; returns the exit status."""
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
    try:
        lock = OutputLock(plan.output_root, plan.run).acquire()
    except (OutputLockedError, OutputNotWritableError) as error:
        return _fail(str(error), EXIT_FAILED)
    try:
        return _run_locked(plan, options, started)
    finally:
        lock.release()


def _run_locked(plan: BuildPlan, options: PipelineOptions, started: float) -> int:
    """Holding the output's lock: recover what dead runs left, check the output again, run, report."""
    try:
        removed = recover(plan.output_root, new_name=NEW_DATASET_DIR, old_name=OLD_DATASET_DIR)
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


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, PipelineOptions]:
    """Our arguments and Beam's options; any other argument is a ConfigError (did-you-mean included).

    Every option must be ours or one Beam's own parser knows (Beam would silently discard it),
    the runner must be one Beam can create, and Dataflow gets the options it cannot run without.
    """
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    beam_parser = beam_argument_parser()
    _, unknown = beam_parser.parse_known_args(rest)
    if unknown:
        raise ConfigError(_unknown_argument(unknown[0], [*_option_strings(parser), *_option_strings(beam_parser)]))
    options = _pipeline_options(rest)
    check_runner(options)
    return args, options


def beam_argument_parser() -> argparse.ArgumentParser:
    """The parser Beam's PipelineOptions build from every options class (as get_all_options does)."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    classes = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
    for cls in classes.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - the one way to learn Beam's options
    return parser


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [name for name in parser._option_string_actions if name.startswith("--")]  # noqa: SLF001


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
    for spec in plan.features:
        source = f"  from {spec.source}" if spec.source != spec.name else ""
        kind = spec.type if spec.time_unit is None else f"int64 ({spec.time_unit} since 1970 from {spec.time_format or 'ISO 8601'})"
        lines.append(f"  {spec.name:<{width}}  {kind:<5}  {_shape_text(spec.shape):<7}  {_null_text(spec)}{source}")
    lines.append("splits:      " + ", ".join(f"{name} {fraction:g}" for name, fraction in plan.config.splits.items())
                 + (f" (by {', '.join(plan.config.split_key)})" if plan.config.split_key else ""))
    sharding = plan.sharding
    if sharding.max_bytes_per_shard is not None:
        lines.append(f"shards:      as many per split as keep each under {sharding.max_bytes_per_shard:,} bytes")
    else:
        lines.append("shards:      " + ", ".join(f"{name} {count} shard{'s' if count != 1 else ''}"
                                               for name, count in zip(sharding.splits, sharding.num_shards)))
    shuffle = plan.config.shuffle
    lines += [f"shuffle:     {'seed ' + str(shuffle.seed) if shuffle.enabled else 'off (input order)'}",
              f"output:      {plan.output_path} (compression {sharding.compression or 'none'}"
              f"{', replacing what is there' if plan.overwrite else ''})",
              f"bad rows:    {plan.config.errors.on_bad_record}, at most {plan.config.errors.max_bad_fraction:g} of rows",
              f"runner:      {plan.runner}"]
    piece_store = getattr(plan, "piece_store", None)
    if piece_store is not None:
        lines.append(f"piece store: {piece_store}")
    return "\n".join(lines)


_SHOWN_INPUTS = 20


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
    """Beam options with our defaults: the DirectRunner; an embedded job server runs its workers in this process."""
    options = PipelineOptions(beam_args)
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = "DirectRunner"
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
        f"time:       {seconds:.1f} s ({rate:,.0f} rows/s, runner {manifest['runner']})",
        f"manifest:   {run.manifest_path}",
    ]
    return "\n".join(lines)
