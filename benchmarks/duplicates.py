"""Benchmark: a build of a table whose rows repeat against a build of the same number of distinct rows.

Run by hand from the repository root (the machine may be shared; the median and range of --repeats runs,
the three tables' builds interleaved run by run):

    python -m benchmarks.duplicates [--rows 1000000] [--repeats 3] [--copies 2,10] [--format parquet]
                                    [--workers N]

Each table has --rows rows of the benchmark table (benchmarks/table.py), written as one Parquet file
(or CSV) as `benchmarks.build` writes it: the first --rows rows (all distinct), and for each K in
--copies the first --rows/K rows written K times each (every row appears K times, in an order
shuffled once). Each is built by `python -m tfrbeam.builder` with the same config (shuffled, one
split, 8 shards, the default runner and piece store, or ``--workers N`` and the spill store), the
whole process timed. Equal rows give equal records; the tally of copies gives each copy a key of
its own, and the pieces whose copies moved are put in order again
(tfrbeam/builder/shuffle/copies.py): what that costs is the time over the distinct table's. The
output's record count is checked against the rows.
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

from benchmarks.build import build_config, compile_bytecode, run_measured


def write_tables(rows: int, copies: list[int], fmt: str, directory: pathlib.Path) -> dict[int, pathlib.Path]:
    """The distinct table (key 1) and, per K in ``copies``, its first rows/K rows K times each, ``rows`` rows in all."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from benchmarks.table import make_benchmark_table, write_parquet

    table = make_benchmark_table(rows)
    paths = {}
    for count in [1, *copies]:
        distinct = rows // count
        take = np.repeat(np.arange(distinct), count)
        np.random.default_rng(count).shuffle(take)
        repeated = table.take(pa.array(take)) if count > 1 else table
        path = directory / f"copies-{count}.{fmt}"
        if fmt == "parquet":
            write_parquet(repeated, path, row_group_size=131072)
        else:
            emb_text = pc.binary_join(pc.cast(repeated.column("emb"), pa.list_(pa.string())), ";")
            repeated = repeated.set_column(repeated.schema.get_field_index("emb"), "emb", emb_text)
            pacsv.write_csv(repeated, path, pacsv.WriteOptions(quoting_style="needed"))
        paths[count] = path
    return paths


def build(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int = 1) -> tuple[float, int, float, int]:
    """One whole-process build of ``input_path``: wall s, peak RSS, CPU s and the examples written."""
    output = work / f"out-{input_path.stem}"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / f"{input_path.stem}.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(fmt, input_path, output)))
    command = [sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet"]
    if workers > 1:
        command.append(f"--workers={workers}")  # Beam's SDK worker processes, the spill store
    seconds, rss, cpu, _ = run_measured(command)
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    return seconds, rss, cpu, sum(split["num_examples"] for split in manifest["splits"].values())


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", default="2,10", help="comma-separated counts: every row appears K times")
    parser.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    parser.add_argument("--workers", type=int, default=1, help="build with --workers N (the spill store)")
    parser.add_argument("--work-dir", default=None, help="keep inputs and outputs here (default: a temp dir)")
    parser.add_argument("--write-tables", nargs=2, metavar=("ROWS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    copies = [int(count) for count in args.copies.split(",")]
    if args.write_tables:
        write_tables(int(args.write_tables[0]), copies, args.format, pathlib.Path(args.write_tables[1]))
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-duplicates-"))
    work.mkdir(parents=True, exist_ok=True)
    # In a child process, so the measured builds do not inherit the table's peak RSS.
    subprocess.run([sys.executable, __file__, "--write-tables", str(args.rows), str(work), "--copies", args.copies,
                    "--format", args.format], check=True)
    compile_bytecode()
    counts = [1, *copies]
    runs: dict[int, list] = {count: [] for count in counts}
    for _ in range(args.repeats):
        for count in counts:
            runs[count].append(build(args.format, work / f"copies-{count}.{args.format}", work, args.workers))
    where = f", --workers {args.workers}" if args.workers > 1 else ""
    print(f"{args.rows:,} rows of {args.format} in every table{where}; median (range) of {args.repeats} runs each, "
          "interleaved")
    distinct = [run[0] for run in runs[1]]
    for count in counts:
        wall = [run[0] for run in runs[count]]
        written = {run[3] for run in runs[count]}
        label = "distinct rows" if count == 1 else f"every row {count} times"
        line = (f"{label:<22} wall {_spread(wall)}  cpu {_spread([run[2] for run in runs[count]])}  "
                f"peak RSS {statistics.median(run[1] for run in runs[count]) / 2**20:,.0f} MB  examples {sorted(written)}")
        if count > 1:
            ratios = [ours / base for ours, base in zip(wall, distinct)]
            line += f"  time / distinct's: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        print(line, flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
