"""The ``tfrbeam`` command: ``verify``, ``cat``, ``inspect``, ``build`` and ``infer-config``.

Errors are one line on stderr, never a traceback: exit 1 when data is bad, 2 for usage or
config errors. ``build`` and ``infer-config`` are handed to the pipelines package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from tfrbeam import __version__
from tfrbeam.errors import ConfigError, TfrbeamError
from tfrbeam.startup import imports_without_gc

EXIT_OK, EXIT_BAD_DATA, EXIT_USAGE = 0, 1, 2
_PROGRESS_MIN_BYTES = 4 << 20


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfrbeam`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "build":
        with imports_without_gc():
            from tfrbeam.build.cli import main as build_main

        return build_main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # `tfrbeam cat | head` is fine
        return EXIT_OK
    except (FileNotFoundError, ConfigError) as error:
        return _fail(str(error), EXIT_USAGE)
    except TfrbeamError as error:
        return _fail(str(error), EXIT_BAD_DATA)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def _fail(message: str, code: int) -> int:
    print(f"tfrbeam: error: {message}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfrbeam", description="TensorFlow-free TFRecord tools and dataset builds.")
    parser.add_argument("--version", action="version", version=f"tfrbeam {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    verify = commands.add_parser(
        "verify", help="check every record's CRCs (and Example parsing); a dataset directory is checked against its manifest",
        description="Read every record of each file and check its length and data CRCs; with --examples, also that "
        "each payload parses as a tf.train.Example. A dataset directory (one holding dataset_info.json) is checked "
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
    cat.add_argument("--limit", type=int, default=None, metavar="N", help="stop after N records")
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
    inspect.add_argument("--limit", type=int, default=None, metavar="N", help="look at the first N records only")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(run=_run_inspect)

    infer = commands.add_parser("infer-config", help="write a commented build config inferred from a CSV or Parquet input")
    infer.add_argument("input", metavar="INPUT", help="a file or glob")
    infer.add_argument("--format", choices=("csv", "parquet"), default=None)
    infer.set_defaults(run=_run_infer_config)

    commands.add_parser("build", help="run a dataset build: tfrbeam build CONFIG.yaml [--set key=value ...] [Beam options]")
    return parser


def _run_verify(args: argparse.Namespace) -> int:
    from tfrbeam import file_tools

    problems = 0
    for argument in args.paths:
        if os.path.isfile(os.path.join(argument, file_tools.MANIFEST_NAME)):
            problems += _verify_dataset(argument)
            continue
        for path in file_tools.expand_record_paths([argument]):
            report = file_tools.verify_file(path, examples=args.examples, progress=_progress_printer(path))
            _clear_progress()
            status = "OK  " if report.problem is None else "FAIL"
            print(f"{status} {path}: {report.records} records, {report.payload_bytes} payload bytes, {report.file_bytes} file bytes")
            if report.problem is not None:
                problems += 1
                print(f"     {report.problem}")
    return EXIT_BAD_DATA if problems else EXIT_OK


def _verify_dataset(directory: str) -> int:
    from tfrbeam.manifest import verify_dataset

    found = verify_dataset(directory)
    for problem in found:
        print(f"FAIL {directory}: {problem}")
    if not found:
        print(f"OK   {directory}: every shard matches dataset_info.json (counts, sha256, CRCs)")
    return len(found)


def _progress_printer(path: str) -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty() or os.path.getsize(path) < _PROGRESS_MIN_BYTES:
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
    from tfrbeam import file_tools

    paths = file_tools.expand_record_paths(args.paths)
    if args.raw:
        for line in file_tools.iter_raw_json(paths, args.limit):
            print(json.dumps(line, ensure_ascii=False))
        return EXIT_OK
    for count, (_, _, decoded) in enumerate(file_tools.iter_decoded(paths, sequence=args.sequence)):
        if args.limit is not None and count >= args.limit:
            break
        if args.sequence:
            context, feature_lists = decoded  # type: ignore[misc]
            line = {
                "context": file_tools.features_to_json(context, args.kinds),
                "feature_lists": {
                    name: [file_tools.features_to_json({"": step}, args.kinds)[""] for step in steps]
                    for name, steps in sorted(feature_lists.items())
                },
            }
        else:
            line = file_tools.features_to_json(decoded, args.kinds)  # type: ignore[arg-type]
        print(json.dumps(line, ensure_ascii=False, allow_nan=False))
    return EXIT_OK


def _run_inspect(args: argparse.Namespace) -> int:
    from tfrbeam import file_tools

    paths = file_tools.expand_record_paths(args.paths)
    report = file_tools.inspect_files(paths, limit=args.limit)
    spec = report.parse_example_spec()
    if args.json:
        features = {
            name: {"kind": stats.kind(), "present": stats.present, "min_values": stats.min_count, "max_values": stats.max_count}
            for name, stats in sorted(report.features.items())
        }
        summary = {"files": len(paths), "records": report.records, "file_bytes": report.file_bytes,
                   "payload_bytes": report.payload_bytes, "features": features, "parse_example_spec": spec}
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    print(f"{len(paths)} file(s), {report.records} records, {report.file_bytes} bytes on disk, {report.payload_bytes} payload bytes")
    if report.features:
        print(f"\n{'feature':<24} {'kind':<8} {'present':>9} {'values/record':>14}")
        for name, stats in sorted(report.features.items()):
            rate = f"{100.0 * stats.present / max(report.records, 1):.1f}%"
            counts = f"{stats.min_count}..{stats.max_count}" if stats.min_count != stats.max_count else f"{stats.min_count}"
            print(f"{name or repr(name):<24} {str(stats.kind()):<8} {rate:>9} {counts:>14}")
        print("\nfeature_spec = {")
        for name, feature in spec.items():
            print(f"    {name!r}: {feature},")
        print("}")
    return EXIT_OK


def _run_infer_config(args: argparse.Namespace) -> int:
    from tfrbeam.build.infer import infer_config

    sys.stdout.write(infer_config(args.input, format=args.format))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
