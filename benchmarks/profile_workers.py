"""Where a build's CPU goes, in process and on out-of-process workers: py-spy samples by stage.

Run by hand from the repository root, with py-spy installed (``pip install py-spy``; not a dependency):

    python -m benchmarks.profile_workers [--rows 1000000] [--format parquet] [--workers 2]
                                         [--runs inprocess,inprocess_spill,workers,multi_processing]

Each run is one whole `python -m tfrbeam.builder` process of the benchmark table (benchmarks/table.py,
config as in `benchmarks.build`) under ``py-spy record --subprocesses`` at 100 samples a second, on-CPU
Python threads only (a thread waiting on a lock or a socket is not sampled). ``inprocess`` is the
default runner (every worker in this process, memory store); ``inprocess_spill`` the same with the spill
store; ``workers`` is ``tfrbeam build --workers N`` (Beam's SDK worker processes, spill store); ``multi_processing``
is the DirectRunner with --workers worker processes Beam starts itself (spill store): the paths whose
workers, like Dataflow's, are other processes. Every sample goes to the first stage that claims a
frame of its stack, read from the leaf up (so a numpy call made by the hashing code counts as
hashing), and the table prints CPU seconds per million rows for each stage, split between the
launching process and its workers. Samples are counted per thread: two threads busy at once give
two samples. Kernel time (system CPU) is not in these samples: see benchmarks.build's user and
system split.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import REPO_ROOT, build_config, compile_bytecode

RATE = 100  # samples per second and thread

# (stage, substrings of a frame), tried in this order on each frame from the leaf up; the first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("coders (ours)", ("tfrbeam/builder/shuffle/coders.py", "tfrbeam/beam/arrow_coder.py")),
    ("read input", ("tfrbeam/builder/inputs/",)),
    ("convert to Examples", ("tfrbeam/builder/features/convert.py", "tfrbeam/codec/encode.py")),
    ("hash, key and split", ("tfrbeam/builder/shuffle/keys.py", "tfrbeam/builder/pipeline/graph.py")),
    ("sort and frame pieces", ("tfrbeam/builder/shuffle/pieces.py", "tfrbeam/builder/shuffle/stores.py",
                               "tfrbeam/tfrecord/frames.py")),
    ("plan and route", ("tfrbeam/builder/shuffle/balance.py", "tfrbeam/builder/shuffle/route.py")),
    ("write shards", ("tfrbeam/builder/shuffle/write.py", "tfrbeam/builder/shuffle/received.py",
                      "tfrbeam/builder/shuffle/order.py", "tfrbeam/tfrecord/", "tfrbeam/base/")),
    ("commit and stats", ("tfrbeam/builder/pipeline/commit.py", "tfrbeam/beam/publish.py", "tfrbeam/layout/")),
    ("coders (Beam)", ("apache_beam/coders/",)),
    ("data plane (Fn API, gRPC)", ("apache_beam/runners/worker/data_plane.py", "grpc/", "apache_beam/runners/worker/channel",
                                   "apache_beam/runners/portability/fn_api_runner/worker_handlers.py")),
    ("imports and start-up", ("<frozen importlib", "_find_and_load", "(importlib/")),
    ("Beam runner and bundles", ("apache_beam/",)),
)


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, markers in STAGES:
            if any(marker in frame for marker in markers):
                return stage
    return "other"


def profile(command: list[str], out: pathlib.Path) -> dict[tuple[str, str], float]:
    """CPU seconds by (role, stage): role is 'launcher' for the first process, 'workers' for any other."""
    spy = ["py-spy", "record", "--subprocesses", "--gil", "--format", "raw", "-r", str(RATE), "-o", str(out), "--"]
    subprocess.run([*spy, *command],
                   cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        processes = [frame for frame in frames if frame.startswith("process ")]
        role = "launcher" if len(processes) <= 1 else "workers"
        seconds[role, stage_of(frames[len(processes):])] += int(count) / RATE
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", default="inprocess,multi_processing")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("benchmarks.profile_workers needs py-spy: pip install py-spy")
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "build.py"), "--write-inputs", str(args.rows), str(work)],
                   check=True)
    compile_bytecode()
    runs = {
        "inprocess": [],
        "inprocess_spill": ["--piece_store", "spill"],
        "workers": ["--workers", str(args.workers)],
        "multi_processing": [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"],
    }
    results = {}
    for name in args.runs.split(","):
        output = work / f"out-{name}"
        config = work / f"{name}.json"  # JSON is YAML
        config.write_text(json.dumps(build_config(args.format, work / f"table.{args.format}", output)))
        command = [sys.executable, "-m", "tfrbeam.builder", str(config), "--quiet", *runs[name]]
        results[name] = profile(command, work / f"{name}.txt")
    _print_table(results, args.rows, args.format, args.workers)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


def _print_table(results: dict[str, dict[tuple[str, str], float]], rows: int, fmt: str, workers: int) -> None:
    per_million = 1e6 / rows
    names = list(results)
    print(f"CPU seconds per million rows by stage ({rows:,} rows of {fmt}; multi_processing with {workers} workers)")
    header = "| stage | " + " | ".join(f"{name}: launcher | {name}: workers" for name in names) + " |"
    print(header)
    print("|---" * (1 + 2 * len(names)) + "|")
    stages = [stage for stage, _ in STAGES] + ["other"]
    totals = {name: [0.0, 0.0] for name in names}
    for stage in stages:
        cells = []
        for name in names:
            for index, role in enumerate(("launcher", "workers")):
                value = results[name].get((role, stage), 0.0) * per_million
                totals[name][index] += value
                cells.append(f"{value:.2f}")
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print("| **total** | " + " | ".join(f"**{value:.2f}**" for name in names for value in totals[name]) + " |")


if __name__ == "__main__":
    main()
