"""Benchmark: ``tfrbeam.write_dataset`` of a table in memory against ``tfrbeam build`` of the same rows from Parquet.

Run by hand from the repository root (the machine may be shared; the median and range of --repeats
runs, the two interleaved run by run):

    python -m benchmarks.write_dataset [--rows 1000000] [--repeats 3]

Both are whole processes on the benchmark table (benchmarks/table.py) written as one Parquet file, as
``benchmarks.build`` writes it: shuffled (seed 0), one split, 8 shards, the default runner.

- ``tfrbeam build``: ``python -m tfrbeam.builder`` on a config naming the Parquet file.
- ``write_dataset``: a process that reads the same file into a ``pyarrow.Table`` (``pq.read_table``,
  the way a notebook's table comes to be in memory) and calls ``tfrbeam.write_dataset(table, ...)``
  with the same options; the time of the ``write_dataset`` call alone is printed beside it.

The two datasets must be byte-identical (same rows, same bytes); the benchmark checks it. The issue's
target: write_dataset within 1.2x of tfrbeam build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import NUM_SHARDS, build_config, compile_bytecode, run_measured


def _write_table(rows: int, path: pathlib.Path) -> None:
    from benchmarks.table import make_benchmark_table, write_parquet

    write_parquet(make_benchmark_table(rows), path, row_group_size=131072)


def _write_dataset_job(input_path: str, output: str, seconds_file: str) -> None:
    """The measured write_dataset process: read the Parquet file into memory, then write_dataset it."""
    import pyarrow.parquet as pq

    import tfrbeam

    table = pq.read_table(input_path)
    started = time.perf_counter()
    tfrbeam.write_dataset(table, output, num_shards=NUM_SHARDS, seed=0, progress=False)
    pathlib.Path(seconds_file).write_text(str(time.perf_counter() - started))


def _shard_digest(output: pathlib.Path) -> str:
    """One sha256 over every shard's bytes, in the manifest's order (the read indexes carry run mtimes)."""
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    digest = hashlib.sha256()
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            digest.update((output / shard["path"]).read_bytes())
    return digest.hexdigest()


def _spread(values: list[float], unit: str = " s") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", default=None, help="keep the input and outputs here (default: a temp dir)")
    parser.add_argument("--table", nargs=2, metavar=("ROWS", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--job", nargs=3, metavar=("INPUT", "OUTPUT", "SECONDS_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        _write_table(int(args.table[0]), pathlib.Path(args.table[1]))
        return
    if args.job:
        _write_dataset_job(*args.job)
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-write-dataset-"))
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table.parquet"
    # In a child process, so the measured runs do not inherit the table's peak RSS.
    subprocess.run([sys.executable, __file__, "--table", str(args.rows), str(table)], check=True)
    compile_bytecode()
    build_out, api_out, seconds_file = work / "built", work / "written", work / "call-seconds"
    config = work / "config.json"  # JSON is YAML
    config.write_text(json.dumps(build_config("parquet", table, build_out)))
    built, written, calls = [], [], []
    for _ in range(args.repeats):
        for output in (build_out, api_out):
            shutil.rmtree(output, ignore_errors=True)
        built.append(run_measured([sys.executable, "-m", "tfrbeam.builder", str(config), "--quiet"]))
        written.append(run_measured([sys.executable, __file__, "--job", str(table), str(api_out), str(seconds_file)]))
        calls.append(float(seconds_file.read_text()))
        if _shard_digest(build_out) != _shard_digest(api_out):
            raise SystemExit("write_dataset's shards differ from tfrbeam build's on the same rows")
    print(f"{args.rows:,} rows; median (range) of {args.repeats} runs each, interleaved; shards byte-identical")
    for label, runs in (("tfrbeam build (Parquet)", built), ("write_dataset (table)", written)):
        print(f"{label:<24} wall {_spread([run[0] for run in runs])}  cpu {_spread([run[2] for run in runs])}  "
              f"peak RSS {statistics.median(run[1] for run in runs) / 2**20:,.0f} MB", flush=True)
    ratios = [api[0] / build[0] for api, build in zip(written, built)]
    print(f"write_dataset / tfrbeam build, whole process: {_spread(ratios, 'x')}; the write_dataset call alone "
          f"{_spread(calls)}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
