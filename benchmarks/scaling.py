"""Benchmark: how a build's time, CPU and memory grow with its rows (issue 45), with the machine's own I/O as yardstick.

Run by hand from the repository root, the machine otherwise idle:

    python -m benchmarks.scaling [--millions 3,6,12,24] [--paths in-process,sequence,workers,external]
                                 [--data-dir /tmp/tfrbeam-scaling] [--repeat 1]

The input: files of 3M distinct rows each of the benchmark table (benchmarks/table.py, a seed and a
``row_id`` offset per file; about 390-byte Examples), written once into --data-dir and reused.
A build of N million rows reads the first N/3 files. Each build is one whole
``python -m tfrbeam.builder`` process: every column inferred, shuffled (seed 0), one split, 16
shards (32 from 24M rows), timed with its peak RSS and its user and system CPU (wait4's rusage;
for the external pool, the launcher's rusage plus its workers' CPU sampled from /proc).

The paths:
- ``in-process``: the default runner and piece store (what ``auto`` picks: memory, spilling past its budget);
- ``sequence``: a SequenceExample build of the same rows, 100 rows per user (``user = row_id // 100``), in i7 order;
- ``workers``: ``--workers 2`` (Beam's SDK worker processes; the spill store);
- ``external``: the PortableRunner on an EXTERNAL pool of 2 SDK workers (the path Dataflow runs; the spill store).

For every row count it also writes, then reads back, as many bytes as that build's shards hold, with
plain file I/O in a child process (8 MiB blocks, then the file deleted): what this machine charges
per GB written and read, beside the builds. Each line gives the figures and, from the second row
count on, each per-row figure over the smallest build's. With ``--repeat N`` each build runs N times
(the machine is often shared): the line is the run of median wall time, followed by the range of
rows/s over the N runs, and the ratios compare medians.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import REPO_ROOT, compile_bytecode, run_measured

ROWS_PER_FILE = 3_000_000
PATHS = ("in-process", "sequence", "workers", "external")

_RAW_IO = """
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
block = os.urandom(8 << 20)
with open(path, "wb") as handle:
    for _ in range(size // len(block)):
        handle.write(block)
    handle.write(block[:size % len(block)])
    handle.flush()
    os.fsync(handle.fileno())
with open(path, "rb") as handle:
    while handle.read(8 << 20):
        pass
os.unlink(path)
"""


def write_inputs(count: int, directory: pathlib.Path) -> list[pathlib.Path]:
    """``count`` Parquet files of ROWS_PER_FILE distinct rows (written once, then reused)."""
    import numpy as np
    import pyarrow as pa

    from benchmarks.table import make_benchmark_table, write_parquet

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = directory / f"rows-{index:03d}.parquet"
        if not path.exists():
            table = make_benchmark_table(ROWS_PER_FILE, seed=100 + index)
            row_id = np.arange(ROWS_PER_FILE, dtype=np.int64) + index * ROWS_PER_FILE
            table = table.append_column("row_id", pa.array(row_id))
            table = table.append_column("user", pa.array(row_id // 100))
            partial = path.with_suffix(".partial")
            write_parquet(table, str(partial), row_group_size=131072)
            partial.rename(path)
        paths.append(path)
    return paths


def build_config(inputs: pathlib.Path, output: pathlib.Path, rows: int, sequence: bool) -> dict:
    config: dict = {
        "input": {"format": "parquet", "path": str(inputs / "*.parquet")},
        "shuffle": {"enabled": True, "seed": 0},
        "output": {"path": str(output), "num_shards": 32 if rows >= 24_000_000 else 16},
    }
    if sequence:
        config["sequence"] = {"group_by": ["user"], "order_by": ["i7"]}
    return config


def run_build(path: str, files: list[pathlib.Path], rows: int, work: pathlib.Path) -> dict:
    """One build of ``rows`` rows on ``path``: wall s, peak RSS, user and system CPU s, output bytes and examples."""
    inputs = work / "inputs"
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir()
    for file in files:
        (inputs / file.name).symlink_to(file)
    output = work / "out"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / "config.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(inputs, output, rows, path == "sequence")))
    command = [sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet"]
    if path == "workers":
        command.append("--workers=2")
    if path == "external":
        from benchmarks.dataflow_path import run_job

        job = run_job(command, work, f"scaling-{rows}")
        measured = {"wall": job["wall"], "rss": max(job["launcher_peak"], job["worker_peak"]),
                    "cpu": job["launcher_cpu"] + job["workers_cpu"], "system": job["system_cpu"]}
    else:
        wall, rss, cpu, system = run_measured(command)
        measured = {"wall": wall, "rss": rss, "cpu": cpu, "system": system}
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    measured["bytes"] = sum(split["num_bytes"] for split in manifest["splits"].values())
    measured["examples"] = sum(split["num_examples"] for split in manifest["splits"].values())
    shutil.rmtree(output, ignore_errors=True)
    return measured


def raw_io(size: int, work: pathlib.Path) -> dict:
    """Write ``size`` bytes to a new file, fsync, read them back and delete it, in a child: wall, user and system s."""
    wall, _, cpu, system = run_measured([sys.executable, "-c", _RAW_IO, str(work / "raw.bin"), str(size)])
    return {"wall": wall, "cpu": cpu, "system": system}


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle one of an even count), with every run's rows/s range beside."""
    ordered = sorted(runs, key=lambda run: run["wall"])
    return dict(ordered[(len(ordered) - 1) // 2], slowest=ordered[-1]["wall"], fastest=ordered[0]["wall"], runs=len(runs))


def describe(label: str, rows: int, run: dict, first: tuple[int, dict] | None) -> str:
    user = run["cpu"] - run["system"]
    line = (f"{label:<11} {rows / 1e6:>5.0f}M  {rows / run['wall']:>10,.0f} rows/s  RSS {run['rss'] / 1e6:>6,.0f} MB  "
            f"user {user / rows * 1e6:>5.2f} us/row  system {run['system'] / rows * 1e6:>5.2f} us/row")
    if first is not None:
        base_rows, base = first
        line += (f"  | x{(rows / run['wall']) / (base_rows / base['wall']):.2f} rows/s, "
                 f"x{(run['cpu'] / rows) / (base['cpu'] / base_rows):.2f} CPU/row, x{run['rss'] / base['rss']:.2f} RSS")
    if run.get("runs", 1) > 1:
        line += (f"  | median of {run['runs']}: {rows / run['slowest']:,.0f}..{rows / run['fastest']:,.0f} rows/s")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--millions", default="3,6,12,24")
    parser.add_argument("--paths", default="in-process")
    parser.add_argument("--data-dir", default=str(pathlib.Path(tempfile.gettempdir()) / "tfrbeam-scaling"))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each build; the median one is shown")
    args = parser.parse_args()
    sizes = [int(float(value) * 1_000_000) for value in args.millions.split(",")]
    paths = args.paths.split(",")
    unknown = set(paths) - set(PATHS)
    if unknown or any(size % ROWS_PER_FILE for size in sizes) or args.repeat < 1:
        parser.error(f"--paths are {', '.join(PATHS)}; --millions must be multiples of 3; --repeat at least 1")
    # In a child: a fork of a parent that made the tables would count their pages in every build's peak RSS.
    count, data_dir = max(sizes) // ROWS_PER_FILE, pathlib.Path(args.data_dir)
    subprocess.run([sys.executable, "-c", f"from benchmarks.scaling import write_inputs; "
                    f"write_inputs({count}, __import__('pathlib').Path({str(data_dir)!r}))"], cwd=REPO_ROOT, check=True)
    files = [data_dir / f"rows-{index:03d}.parquet" for index in range(count)]
    compile_bytecode()
    print(f"inputs: {args.data_dir} ({len(files)} files of {ROWS_PER_FILE:,} rows); repository {REPO_ROOT}")
    for path in paths:
        first: tuple[int, dict] | None = None
        for rows in sizes:
            with tempfile.TemporaryDirectory(prefix="tfrbeam-scaling-") as temp:
                run = median_run([run_build(path, files[:rows // ROWS_PER_FILE], rows, pathlib.Path(temp))
                                  for _ in range(args.repeat)])
                raw = raw_io(run["bytes"], pathlib.Path(temp))
            print(describe(path, rows, run, first), flush=True)
            print(f"{'':<11} {'':>6}  raw I/O of the shards' {run['bytes'] / 1e9:.2f} GB: write+fsync+read "
                  f"{run['bytes'] / raw['wall'] / 1e6:,.0f} MB/s, system {raw['system'] / run['bytes'] * 1e9:.2f} s/GB",
                  flush=True)
            first = first or (rows, run)


if __name__ == "__main__":
    main()
