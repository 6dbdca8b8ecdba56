"""How long each stage of a `--workers N` build takes, by the launcher's clock.

Run by hand from the repository root (the machine otherwise idle):

    python -m benchmarks.stage_times [--rows 3000000] [--formats parquet,csv] [--workers 2] [--repeats 3]

Each run is one whole `python -m tfrbeam.builder --workers N` process of the benchmark table (benchmarks/table.py,
config as in `benchmarks.build`), started through this file with one change: Beam's FnApiRunner records the wall
time of every bundle it hands its workers (``FnApiRunner._execute_bundle``, a stage's bundles run on all the workers
at once). The stages are summed into the workers' reading, converting and keying (every stage before the shard
plan), routing (the pieces to their shards), the shard writers, and the rest. With fewer shards than cores, the
writers' share of the workers' busy time is what stops more cores from helping.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import REPO_ROOT, build_config, compile_bytecode, write_inputs

# Each stage goes to the first group one of whose markers its Beam name contains.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shard writers", ("GroupByShard/Read",)),
    ("routing", ("GroupPieces/Group/Read",)),
    ("reading, converting and keying", ("ReadInputs",)),  # the stage that reads also sorts and stores the pieces
    ("plan and commit", ("",)),
)


def group_of(stage: str) -> str:
    return next(name for name, markers in GROUPS if any(marker in stage for marker in markers))


def run_timed_build(config_path: pathlib.Path, workers: int) -> dict[str, float]:
    """One build with the bundle clock: wall seconds per group (and "first stage": it waits for the workers' start)."""
    result = subprocess.run([sys.executable, __file__, "--timed-build", str(config_path), str(workers)], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the build failed:\n{result.stderr[-3000:]}")
    stages = json.loads(result.stdout.strip().splitlines()[-1])
    seconds: dict[str, float] = {"first stage (the workers start)": stages[0][1]}
    for name, elapsed in stages[1:]:
        seconds[group_of(name)] = seconds.get(group_of(name), 0.0) + elapsed
    return seconds


def _timed_build(config_path: str, workers: int) -> None:
    """In the child: the build, with every bundle's wall time printed as JSON on the last line of stdout."""
    import contextlib
    import io
    import runpy
    import time

    from apache_beam.runners.portability.fn_api_runner import fn_runner

    stages: list[tuple[str, float]] = []
    execute = fn_runner.FnApiRunner._execute_bundle

    def timed(self, context, manager, bundle_input):
        started = time.perf_counter()
        try:
            return execute(self, context, manager, bundle_input)
        finally:
            stages.append((manager.stage.name, time.perf_counter() - started))

    fn_runner.FnApiRunner._execute_bundle = timed
    sys.argv = ["tfrbeam.builder", config_path, "--quiet", f"--workers={workers}"]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module("tfrbeam.builder", run_name="__main__")
        except SystemExit as exit_:
            if exit_.code:
                raise
    print(json.dumps(stages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--formats", default="parquet,csv")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", default=None, help="keep inputs and outputs here (default: a temp dir)")
    parser.add_argument("--timed-build", nargs=2, metavar=("CONFIG", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.timed_build:
        _timed_build(args.timed_build[0], int(args.timed_build[1]))
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-stages-"))
    work.mkdir(parents=True, exist_ok=True)
    inputs = write_inputs(args.rows, work)
    compile_bytecode()
    print(f"{args.rows:,} rows, --workers {args.workers}; wall seconds of each stage by the launcher's clock, "
          f"median (range) of {args.repeats} builds")
    for fmt in args.formats.split(","):
        output = work / f"stages-{fmt}"
        config_path = work / f"stages-{fmt}.json"
        config_path.write_text(json.dumps(build_config(fmt, inputs[fmt], output)))
        runs = []
        for _ in range(args.repeats):
            shutil.rmtree(output, ignore_errors=True)
            runs.append(run_timed_build(config_path, args.workers))
        for name in runs[0]:
            values = [run.get(name, 0.0) for run in runs]
            print(f"{fmt:<8} {name}: {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
        shares = [run["shard writers"] / (run["shard writers"] + run["reading, converting and keying"]) for run in runs]
        print(f"{fmt:<8} the shard writers' share of the workers' busy time: "
              f"{statistics.median(shares):.2f} ({min(shares):.2f}-{max(shares):.2f})", flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
