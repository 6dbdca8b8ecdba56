"""Benchmark: the whole dataset build against the typical Beam job, Parquet and CSV, as separate processes.

Run by hand from the repository root (the machine may be shared; best of --repeats is reported):

    python -m benchmarks.build [--rows 1000000] [--baseline-rows 50000] [--repeats 2] [--formats parquet,csv]

Ours: `python -m tfrbeam.build` on the benchmark table (benchmarks/table.py) written as
Parquet and as CSV: shuffled (seed 0), one split, 8 shards, DirectRunner, the whole process
timed (interpreter start, pipeline construction, run, manifest) with its peak RSS.
Baseline, in the same run: `beam.io.ReadFromParquet` (CSV: `ReadFromText` + the csv module) ->
one Example per row built with the generated protobuf classes -> `beam.Reshuffle()` ->
`beam.io.WriteToTFRecord(num_shards=8)`, on the first --baseline-rows rows (it is ~100x slower).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
NUM_SHARDS = 8


def write_inputs(rows: int, directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """The benchmark table as one Parquet file (row groups of 131072) and one CSV file (emb as ';'-joined text)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from benchmarks.table import make_benchmark_table, write_parquet

    table = make_benchmark_table(rows)
    parquet_path = directory / "table.parquet"
    write_parquet(table, parquet_path, row_group_size=131072)
    emb_text = pc.binary_join(pc.cast(table.column("emb"), pa.list_(pa.string())), ";")
    csv_table = table.set_column(table.schema.get_field_index("emb"), "emb", emb_text)
    csv_path = directory / "table.csv"
    pacsv.write_csv(csv_table, csv_path, pacsv.WriteOptions(quoting_style="needed"))
    return {"parquet": parquet_path, "csv": csv_path}


def build_config(fmt: str, input_path: pathlib.Path, output_path: pathlib.Path) -> dict:
    """Our config: every column (CSV: declared, emb split on ';'), shuffled, 8 shards, one split."""
    config = {
        "input": {"format": fmt, "path": str(input_path)},
        "shuffle": {"enabled": True, "seed": 0},
        "output": {"path": str(output_path), "num_shards": NUM_SHARDS},
    }
    if fmt == "csv":
        features = {f"i{i}": {"type": "int64"} for i in range(8)}
        features.update({f"f{i}": {"type": "float"} for i in range(8)})
        features.update({"s0": {"type": "bytes"}, "s1": {"type": "bytes"},
                         "emb": {"type": "float", "separator": ";", "length": 16},
                         "n0": {"type": "int64", "on_null": "omit"}})
        config["features"] = features
        config["input"]["csv"] = {"null_values": [""]}
    return config


def run_measured(command: list[str]) -> tuple[float, int, float]:
    """Run a command; its wall time, peak RSS in bytes and CPU seconds (user + system, from wait4's rusage)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode("utf-8", "replace")
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def run_ours(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int = 1) -> tuple[float, int, float, int]:
    output = work / f"ours-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / f"ours-{fmt}.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(fmt, input_path, output)))
    command = [sys.executable, "-m", "tfrbeam.build", str(config_path), "--quiet"]
    if workers > 1:
        command += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    seconds, rss, cpu = run_measured(command)
    manifest = json.loads((output / "dataset_info.json").read_text())
    size = sum(split["num_bytes"] for split in manifest["splits"].values())
    return seconds, rss, cpu, size


def run_baseline(fmt: str, input_path: pathlib.Path, work: pathlib.Path, rows: int) -> tuple[float, int, float]:
    output = work / f"baseline-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    source = work / f"baseline-input-{rows}.{ 'parquet' if fmt == 'parquet' else 'csv'}"
    if not source.exists():
        _head(fmt, input_path, source, rows)
    return run_measured([sys.executable, __file__, "--baseline-job", fmt, str(source), str(output / "part")])


def _head(fmt: str, input_path: pathlib.Path, target: pathlib.Path, rows: int) -> None:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        from benchmarks.table import write_parquet

        write_parquet(pq.read_table(input_path).slice(0, rows), target)
        return
    with open(input_path, encoding="utf-8") as source, open(target, "w", encoding="utf-8") as out:
        for index, line in enumerate(source):
            if index > rows:
                break
            out.write(line)


# ----------------------------------------------------------------------------- the baseline job


def _example_from_row(row: dict) -> bytes:
    from tfrbeam.protos import example_pb2

    example = example_pb2.Example()
    feature = example.features.feature
    for name, value in row.items():
        if value is None or value == "":
            continue
        if name.startswith("i") or name == "n0":
            feature[name].int64_list.value.append(int(value))
        elif name.startswith("f"):
            feature[name].float_list.value.append(float(value))
        elif name == "emb":
            items = value if isinstance(value, list) else [float(item) for item in value.split(";")]
            feature[name].float_list.value.extend(items)
        else:
            feature[name].bytes_list.value.append(value.encode("utf-8") if isinstance(value, str) else value)
    return example.SerializeToString()


def _csv_row(line: str, names: list[str]) -> dict:
    return dict(zip(names, next(csv.reader([line]))))


def baseline_job(fmt: str, input_path: str, output_prefix: str) -> None:
    """The typical Beam job: read rows, build each Example with protobuf classes, Reshuffle, WriteToTFRecord."""
    import apache_beam as beam

    with beam.Pipeline() as pipeline:
        if fmt == "parquet":
            rows = pipeline | beam.io.ReadFromParquet(input_path)
        else:
            with open(input_path, encoding="utf-8") as handle:
                names = next(csv.reader([handle.readline()]))
            rows = pipeline | beam.io.ReadFromText(input_path, skip_header_lines=1) | beam.Map(_csv_row, names)
        _ = (
            rows
            | beam.Map(_example_from_row)
            | beam.Reshuffle()
            | beam.io.WriteToTFRecord(output_prefix, num_shards=NUM_SHARDS)
        )


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--baseline-rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--formats", default="parquet,csv")
    parser.add_argument("--workers", type=int, default=1,
                        help="also run ours with --direct_num_workers=N --direct_running_mode=multi_processing (CPU and RSS of "
                        "the main process and its workers together)")
    parser.add_argument("--work-dir", default=None, help="keep inputs and outputs here (default: a temp dir)")
    parser.add_argument("--baseline-job", nargs=3, metavar=("FORMAT", "INPUT", "OUTPUT_PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--write-inputs", nargs=2, metavar=("ROWS", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_job:
        baseline_job(*args.baseline_job)
        return
    if args.write_inputs:
        write_inputs(int(args.write_inputs[0]), pathlib.Path(args.write_inputs[1]))
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-build-"))
    work.mkdir(parents=True, exist_ok=True)
    # In a child process: Linux keeps a process's peak RSS across exec, so a parent holding the
    # table would pass its size on to every measured child.
    subprocess.run([sys.executable, __file__, "--write-inputs", str(args.rows), str(work)], check=True)
    inputs = {"parquet": work / "table.parquet", "csv": work / "table.csv"}
    print(f"{args.rows:,} rows (baseline: first {args.baseline_rows:,}); best of {args.repeats}; shared 2-core machine")
    print("rows/s by wall clock, and by CPU second of the process (fairer when other work shares the cores)")
    print(f"{'input':<8}{'ours wall':>11}{'ours cpu':>10}{'base wall':>11}{'base cpu':>10}{'ratio wall':>12}{'ratio cpu':>11}"
          f"{'ours s':>8}{'peak RSS':>10}{'output':>9}{'RSS/out':>9}")
    for fmt in args.formats.split(","):
        ours = min((run_ours(fmt, inputs[fmt], work) for _ in range(args.repeats)), key=lambda result: result[0])
        base = min((run_baseline(fmt, inputs[fmt], work, args.baseline_rows) for _ in range(args.repeats)), key=lambda r: r[0])
        ours_wall, ours_cpu = args.rows / ours[0], args.rows / ours[2]
        base_wall, base_cpu = args.baseline_rows / base[0], args.baseline_rows / base[2]
        print(f"{fmt:<8}{ours_wall:>11,.0f}{ours_cpu:>10,.0f}{base_wall:>11,.0f}{base_cpu:>10,.0f}"
              f"{ours_wall / base_wall:>11.1f}x{ours_cpu / base_cpu:>10.1f}x{ours[0]:>8.1f}"
              f"{ours[1] / 2**20:>8.0f}MB{ours[3] / 2**20:>7.0f}MB{ours[1] / ours[3]:>9.2f}", flush=True)
        if args.workers > 1:
            multi = min((run_ours(fmt, inputs[fmt], work, args.workers) for _ in range(args.repeats)), key=lambda r: r[0])
            multi_wall = args.rows / multi[0]
            print(f"{fmt + f'/{args.workers}w':<8}{multi_wall:>11,.0f}{args.rows / multi[2]:>10,.0f}{'':>21}"
                  f"{multi_wall / base_wall:>11.1f}x{'':>11}{multi[0]:>8.1f}{multi[1] / 2**20:>8.0f}MB (largest process)", flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
