"""The ``tfrbeam`` command: ``verify``, ``cat``, ``inspect``, ``index``, ``stats``, ``export``, ``build`` and ``infer-config``.

Errors are one line on stderr, never a traceback, with the exit status of ``tfrbeam.cli.exit_codes``
(1 when the data or the run failed, 2 when what was given must change). ``build`` is ``tfrbeam.cli.build``.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfrbeam import __version__
from tfrbeam.base.file_access import files_for
from tfrbeam.base.object_store import input_size, is_object_store, no_bucket_metadata_probes
from tfrbeam.base.wording import counted
from tfrbeam.cli import build
from tfrbeam.cli.beam_warnings import without_beam_import_warnings
from tfrbeam.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, report_error
from tfrbeam.errors import ConfigError, OutputNotWritableError, TfrbeamError
from tfrbeam.layout.names import DALI_INDEX_SUFFIX, SHARD_NAME

if TYPE_CHECKING:
    from tfrbeam.cli.file_tools import InspectReport

_PROG = "tfrbeam"
_PROGRESS_MIN_BYTES = 4 << 20


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfrbeam`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    no_bucket_metadata_probes()
    if argv and argv[0] == "build":
        return build.main(argv[1:])
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        # argparse blames the top-level parser; the command's own usage is the helpful one
        (getattr(args, "command_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extras)}")
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        with without_beam_import_warnings():  # a command that imports Beam (stats, export) prints none of its noise
            return args.run(args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # `tfrbeam cat | head` is fine
        return EXIT_OK
    except (TfrbeamError, OSError, KeyboardInterrupt) as error:  # a full disk, a refused write: never a traceback
        return report_error(_PROG, error)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfrbeam", description="TensorFlow-free TFRecord tools and dataset builds.")
    parser.add_argument("--version", action="version", version=f"tfrbeam {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    verify = commands.add_parser(
        "verify", help="check every record's CRCs (and Example parsing); a dataset directory is checked against its manifest",
        description="Read every record of each file and check its length and data CRCs; with --examples, also that "
        "each payload parses as a tf.train.Example. A dataset directory (one holding tfrbeam_dataset.json) is checked "
        "against its manifest: shard counts, sizes and sha256. Exit 1 when anything is damaged.")
    verify.add_argument("paths", nargs="+", metavar="PATH", help="files, globs or directories")
    verify.add_argument("--examples", action="store_true", help="also check that every payload parses as a tf.train.Example")
    verify.set_defaults(run=_run_verify)

    cat = commands.add_parser(
        "cat", help="print records as JSON lines (bytes as UTF-8 text, else {\"base64\": ...})",
        description="Print each tf.train.Example (or, with --sequence, SequenceExample) as one JSON line of "
        "feature name to values: bytes as UTF-8 text, else {\"base64\": ...}; floats as the shortest text that "
        "reads back as the same float32. With --raw, print each record's payload as it is, whatever it holds.")
    cat.add_argument("paths", nargs="+", metavar="PATH")
    cat.add_argument("--limit", type=_count, default=None, metavar="N", help="stop after N records")
    cat.add_argument("--kinds", action="store_true", help="print each feature as {\"kind\": ..., \"values\": [...]}")
    cat.add_argument("--sequence", action="store_true", help="records are tf.train.SequenceExample")
    cat.add_argument("--raw", action="store_true",
                     help="records are not Examples: print {\"offset\", \"size\", \"data\"} per record")
    cat.set_defaults(run=_run_cat)

    inspect = commands.add_parser(
        "inspect", help="record count, sizes, feature kinds, presence and a tf.io.parse_example spec",
        description="Summarise record files of tf.train.Example: record count, bytes on disk and in payloads, each "
        "feature's kind, how often it is present and how many values it holds, and a feature spec to paste "
        "into tf.io.parse_example.")
    inspect.add_argument("paths", nargs="+", metavar="PATH")
    inspect.add_argument("--limit", type=_count, default=None, metavar="N", help="look at the first N records only")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(run=_run_inspect)

    infer = commands.add_parser("infer-config", help="write a commented build config inferred from an input "
                                "(CSV, Parquet, JSON lines, ORC, Avro)")
    infer.add_argument("input", metavar="INPUT", help="a file or glob")
    # tfrbeam.builder.config.INPUT_FORMATS, not imported here (it loads pyarrow;
    # tests/builder/pipeline/test_infer.py checks they agree).
    infer.add_argument("--format", choices=("csv", "parquet", "jsonl", "orc", "avro", "tfrecord"), default=None,
                       help="the input's format (default: from the file's extension)")
    infer.add_argument("--sequence-by", default=None, metavar="COL",
                       help="write a SequenceExample build: one sequence per value of this feature")
    infer.add_argument("--order-by", default=None, metavar="COL", help="with --sequence-by: the steps' order")
    infer.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                       help="CSV: the first line is (--header) or is not (--no-header) the header (default: decided "
                       "from the first lines, with the reason in a comment)")
    infer.set_defaults(run=_run_infer_config)

    index = commands.add_parser(
        "index", help="write index files for other readers: --dali OUT_DIR writes NVIDIA DALI's tfrecord2idx files"
    )
    index.add_argument("paths", nargs="+", metavar="DIR_OR_GLOB", help="uncompressed TFRecord files, globs or directories")
    index.add_argument("--dali", required=True, metavar="OUT_DIR", help="write <OUT_DIR>/<file name>.idx for each file")
    index.set_defaults(run=_run_index)

    demo = commands.add_parser("demo-data", help="write the made-up flights data (CSV, Parquet) and DIR/demo.yaml, "
                               "the build config that reads it: tfrbeam build DIR/demo.yaml")
    demo.add_argument("out_dir", nargs="?", default="demo_data", metavar="DIR", help="directory to write (default: demo_data)")
    demo.add_argument("--rows", type=_count, default=3000, metavar="N", help="rows in total (default: 3000)")
    demo.set_defaults(run=_run_demo_data)

    _add_stats_commands(commands)
    commands.add_parser("build", help="run a dataset build: tfrbeam build CONFIG.yaml [--set key=value ...] [Beam options]")
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)
    return parser


def _worker_count(text: str) -> int:
    """An argparse type: a number of worker processes, 1 or more."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _count(text: str) -> int:
    """An argparse type: a whole number of records, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of records, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _run_verify(args: argparse.Namespace) -> int:
    from tfrbeam.cli import file_tools

    problems = 0
    for argument in args.paths:
        if (is_object_store(argument) or os.path.isdir(argument)) and _is_dataset_directory(argument):
            problems += _verify_dataset(argument)
            continue
        for path in file_tools.expand_record_paths([argument]):
            report = file_tools.verify_file(path, examples=args.examples, progress=_progress_printer(path))
            _clear_progress()
            status = "OK  " if report.problem is None else "FAIL"
            print(
                f"{status} {path}: {counted(report.records, 'record')}, {report.payload_bytes} payload bytes, "
                f"{report.file_bytes} file bytes"
            )
            if report.problem is not None:
                problems += 1
                print(f"     {report.problem}")
    return EXIT_FAILED if problems else EXIT_OK


def _is_dataset_directory(directory: str) -> bool:
    """A build's directory, finished or not: a manifest, a build's traces beside it, or split directories of shards.

    A directory of plain TFRecord files is checked file by file instead.
    """
    from tfrbeam.base.object_store import OBJECT_STORE_FILES, has_magic
    from tfrbeam.layout.manifest import find_manifest, write_leftovers

    files = files_for(directory)
    if is_object_store(directory) and (has_magic(directory) or OBJECT_STORE_FILES.is_file(directory)):
        return False  # a glob or an object: its files are checked one by one
    if find_manifest(directory, files) is not None or write_leftovers(directory, files):
        return True
    if is_object_store(directory):  # split "directories" of shards under the prefix
        below = [path[len(directory.rstrip("/")) + 1:].split("/") for path in OBJECT_STORE_FILES.list_files(directory)]
        return any(len(parts) == 2 and _SHARD_NAME.fullmatch(parts[1]) for parts in below)
    for name in os.listdir(directory):
        split_dir = os.path.join(directory, name)
        if os.path.isdir(split_dir) and any(_SHARD_NAME.fullmatch(entry) for entry in os.listdir(split_dir)):
            return True
    return False


_SHARD_NAME = SHARD_NAME


def _verify_dataset(directory: str) -> int:
    """A directory is checked as a dataset: no manifest, or one that disagrees with the files, fails."""
    from tfrbeam.layout.manifest import manifest_path, verify_dataset, write_leftovers

    files = files_for(directory)
    found = verify_dataset(directory, files)
    for problem in found:
        print(f"FAIL {directory}: {problem}")
    if found and any("no manifest" in problem for problem in found):
        print(
            f"     (to check TFRecord files that are not a tfrbeam dataset, name them: tfrbeam verify '{directory}/*.tfrecord*')"
        )
    for note in write_leftovers(directory, files):
        print(f"WARN {directory}: {note}")
    if not found:
        print(f"OK   {directory}: every shard matches {posixpath.basename(manifest_path(directory, files))} "
              "(counts, sha256, CRCs)")
    return len(found)


def _progress_printer(path: str) -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty() or input_size(path) < _PROGRESS_MIN_BYTES:
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done * 100 // max(total, 1):3d}% {os.path.basename(path)}")
        sys.stderr.flush()

    return show


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")


def _run_cat(args: argparse.Namespace) -> int:
    from tfrbeam.cli import file_tools

    paths = file_tools.expand_record_paths(args.paths)
    if args.raw:
        for line in file_tools.iter_raw_json(paths, args.limit):
            print(json.dumps(line, ensure_ascii=False))
        return EXIT_OK
    order = file_tools.source_order(args.paths)
    for count, (_, _, decoded) in enumerate(file_tools.iter_decoded(paths, sequence=args.sequence)):
        if args.limit is not None and count >= args.limit:
            break
        if args.sequence:
            context, feature_lists = decoded
            line = {
                "context": file_tools.features_to_json(context, args.kinds, order),
                "feature_lists": {
                    name: [file_tools.features_to_json({"": step}, args.kinds)[""] for step in feature_lists[name]]
                    for name in file_tools.in_source_order(feature_lists, order)
                },
            }
        else:
            line = file_tools.features_to_json(decoded, args.kinds, order)
        print(json.dumps(line, ensure_ascii=False, allow_nan=False))
    return EXIT_OK


def _run_inspect(args: argparse.Namespace) -> int:
    from tfrbeam.cli import file_tools
    from tfrbeam.stats.compute import require_example_dataset
    from tfrbeam.stats.text import format_fraction

    for argument in args.paths:
        require_example_dataset(argument)
    paths = file_tools.expand_record_paths(args.paths)
    report = file_tools.inspect_files(paths, limit=args.limit)
    spec = report.parse_example_spec()
    if args.json:
        features = {
            name: {"kind": stats.kind(), "present": stats.present, "min_values": stats.min_count, "max_values": stats.max_count}
            for name, stats in report.ordered_features()
        }
        summary = {"files": len(paths), "records": report.records, "file_bytes": report.file_bytes,
                   "payload_bytes": report.payload_bytes, "features": features, "parse_example_spec": spec}
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    print(
        f"{counted(len(paths), 'file')}, {counted(report.records, 'record')}, {report.file_bytes} bytes on disk, "
        f"{report.payload_bytes} payload bytes"
    )
    if report.features:
        print(f"\n{'feature':<24} {'kind':<8} {'present':>9} {'values/record':>14}")
        for name, stats in report.ordered_features():
            rate = format_fraction(stats.present, report.records)
            counts = f"{stats.min_count}..{stats.max_count}" if stats.min_count != stats.max_count else f"{stats.min_count}"
            print(f"{name or repr(name):<24} {stats.kind()!s:<8} {rate:>9} {counts:>14}")
        print("\nfeature_spec = {")
        for name, feature in spec.items():
            print(f"    {name!r}: {feature},")
        for name, why in report.unparseable().items():  # comments: the printed spec stays Python one can paste
            print(f"    # {name!r}: {why}: tf.io.parse_example cannot read it")
        print("}")
        _print_inspect_summary(file_tools.inspect_statistics(report, args.limit), report)
    return EXIT_OK


def _run_demo_data(args: argparse.Namespace) -> int:
    from tfrbeam.cli.demo_data import write_demo_data

    paths = write_demo_data(args.out_dir, args.rows)
    print(f"wrote {counted(len(paths), 'demo file')} under {args.out_dir}/: the same {counted(args.rows, 'row')} in csv/ "
          f"and in parquet/, a flight log per aircraft in sequences/, and the build config that reads the CSV files: "
          f"tfrbeam build {paths[-1]}")
    return EXIT_OK


def _run_index(args: argparse.Namespace) -> int:
    from tfrbeam.cli import file_tools
    from tfrbeam.tfrecord.read_index import write_dali_index
    from tfrbeam.tfrecord.records import compression_from_name

    paths = file_tools.expand_record_paths(args.paths)
    compressed = [path for path in paths if compression_from_name(path) is not None]
    if compressed:
        raise ConfigError(f"{compressed[0]}: DALI indexes describe uncompressed TFRecord files; this one is compressed")
    names = [os.path.basename(path) for path in paths]
    clashing = sorted({name for name in names if names.count(name) > 1})
    if clashing:
        raise ConfigError(
            f"several input files are named {clashing[0]!r}: their DALI indexes would overwrite each other in {args.dali}"
        )
    for path, name in zip(paths, names):
        out = os.path.join(args.dali, name + DALI_INDEX_SUFFIX)
        count = write_dali_index(path, out)
        print(f"OK   {path}: {counted(count, 'record')} -> {out}")
    return EXIT_OK


def _print_inspect_summary(stats: dict, report: InspectReport) -> None:
    """The per-feature value summary under inspect's table, features in the report's (the source's) order."""
    from tfrbeam.stats.report import in_source_order
    from tfrbeam.stats.text import feature_summary

    print("\nvalues (tfrbeam stats DATASET writes the full report):")
    features = stats["splits"]["files"]["features"]
    for name in in_source_order(features, report.order):
        print(f"  {name or repr(name):<24} {feature_summary(features[name])}")


def _add_stats_commands(commands) -> None:
    """The ``stats`` and ``export`` subcommands (statistics report; TFRecord -> Parquet)."""
    stats = commands.add_parser(
        "stats", help="write DATASET/stats.json and stats.html: per-split feature statistics and drift between splits"
    )
    stats.add_argument(
        "dataset", metavar="DATASET", help="a tfrbeam build directory, or TFRecord files (a glob; then give --output-dir)"
    )
    stats.add_argument(
        "--split",
        action="append",
        default=None,
        metavar="S",
        help="only this split (repeatable; the first is the drift baseline)",
    )
    stats.add_argument("--output-dir", default=None, metavar="DIR", help="where to write the two files (default: DATASET)")
    stats.add_argument("--drift-threshold", type=float, default=None, metavar="X",
                       help="flag features whose drift score is above X (default 0.1 for both methods)")
    stats.add_argument(
        "--workers", type=_worker_count, default=None, metavar="N",
        help="worker processes (default: CPUs for data over 64 MiB, else 1)"
    )
    stats.set_defaults(run=_run_stats)

    export = commands.add_parser("export", help="write each TFRecord shard as a Parquet file: OUTPUT_DIR/<split>/<shard>.parquet")
    export.add_argument("dataset", metavar="DATASET", help="a tfrbeam build directory, or TFRecord files (a glob)")
    export.add_argument("output_dir", metavar="OUTPUT_DIR")
    export.add_argument("--split", action="append", default=None, metavar="S", help="only this split (repeatable)")
    export.add_argument("--columns", nargs="+", default=None, metavar="NAME", help="only these features, in this order")
    export.add_argument(
        "--overwrite", action="store_true", help="replace Parquet files already in OUTPUT_DIR's split directories"
    )
    export.set_defaults(run=_run_export)


def _run_stats(args: argparse.Namespace) -> int:
    from tfrbeam.stats.compute import write_pinned_stats
    from tfrbeam.stats.text import summary_lines

    thresholds = (
        None if args.drift_threshold is None else {"l_infinity": args.drift_threshold, "jensen_shannon": args.drift_threshold}
    )
    if args.output_dir is None and is_object_store(args.dataset):
        raise ConfigError(f"{args.dataset} is in a bucket: stats writes stats.json and stats.html beside the manifest only "
                          "for a local dataset; pass --output-dir DIR to write them there")
    if args.output_dir is None and not os.path.isdir(args.dataset):
        raise ConfigError(
            f"{args.dataset} is not a dataset directory: pass --output-dir for the stats files of plain TFRecord files"
        )
    if args.output_dir is not None and not is_object_store(args.output_dir):
        _check_output_dir(args.output_dir)
    stats, json_path, html_path = write_pinned_stats(args.dataset, args.output_dir, splits=args.split,
                                                     thresholds=thresholds, workers=args.workers)
    for line in summary_lines(stats):
        print(line)
    print(f"\nwrote {json_path} and {html_path}")
    return EXIT_OK


def _check_output_dir(directory: str) -> None:
    """``--output-dir`` can become a directory this user writes in: checked, not made, before the statistics are
    computed, so a path under a file or in a read-only directory is one line now and nothing is left behind."""
    existing = directory
    while existing and not os.path.isdir(existing):
        if os.path.lexists(existing):
            raise OutputNotWritableError(f"--output-dir {directory}: {existing} is not a directory")
        existing = os.path.dirname(existing)
    if not os.access(existing or os.curdir, os.W_OK):
        raise OutputNotWritableError(f"--output-dir {directory}: this user cannot write in {existing or os.curdir}")


def _run_export(args: argparse.Namespace) -> int:
    from tfrbeam.cli.export_commit import export_locked

    show = _records_progress("export") if sys.stderr.isatty() else None
    paths = export_locked(args.dataset, args.output_dir, splits=args.split, columns=args.columns, progress=show,
                          overwrite=args.overwrite)
    _clear_progress()
    print(f"wrote {counted(len(paths), 'Parquet file')} under {args.output_dir}")
    return EXIT_OK


def _records_progress(label: str) -> Callable[[int, int | None], None]:
    """A one-line progress bar on stderr, by records (a count alone when the total is unknown)."""
    def show(done: int, total: int | None) -> None:
        if total:
            width = 30
            filled = int(width * done / total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,}/{counted(total, 'record', grouped=True)} "
                             f"{label}")
        else:
            sys.stderr.write(f"\r{counted(done, 'record', grouped=True)} {label}")
        sys.stderr.flush()

    return show


def _run_infer_config(args: argparse.Namespace) -> int:
    from tfrbeam.builder.pipeline.infer_config import infer_config

    sys.stdout.write(infer_config(args.input, format=args.format, sequence_by=args.sequence_by, order_by=args.order_by,
                                  header=args.header))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
