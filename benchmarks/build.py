"""Benchmark: the whole dataset build against the typical Beam job, Parquet and CSV, as separate processes.

Run by hand from the repository root (the machine may be shared; best of --repeats is reported):

    python -m benchmarks.build [--rows 1000000] [--baseline-rows 50000] [--repeats 2] [--formats parquet,csv]

Ours: `python -m pipelines.build` on the benchmark table (benchmarks/table.py) written as
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
    import pyarrow.parquet as pq

    from benchmarks.table import make_benchmark_table

    table = make_benchmark_table(rows)
    parquet_path = directory / "table.parquet"
    pq.write_table(table, parquet_path, row_group_size=131072)
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


def run_measured(command: list[str]) -> tuple[float, int]:
    """Run a command; its wall time in seconds and peak RSS in bytes (from wait4's rusage)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode("utf-8", "replace")
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss * 1024


def run_ours(fmt: str, input_path: pathlib.Path, work: pathlib.Path) -> tuple[float, int, int]:
    output = work / f"ours-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / f"ours-{fmt}.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(fmt, input_path, output)))
    seconds, rss = run_measured([sys.executable, "-m", "pipelines.build", str(config_path), "--quiet"])
    manifest = json.loads((output / "dataset_info.json").read_text())
    size = sum(split["num_bytes"] for split in manifest["splits"].values())
    return seconds, rss, size


def run_baseline(fmt: str, input_path: pathlib.Path, work: pathlib.Path, rows: int) -> tuple[float, int]:
    output = work / f"baseline-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    source = work / f"baseline-input-{rows}.{ 'parquet' if fmt == 'parquet' else 'csv'}"
    if not source.exists():
        _head(fmt, input_path, source, rows)
    return run_measured([sys.executable, __file__, "--baseline-job", fmt, str(source), str(output / "part")])


def _head(fmt: str, input_path: pathlib.Path, target: pathlib.Path, rows: int) -> None:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(pq.read_table(input_path).slice(0, rows), target)
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
    parser.add_argument("--work-dir", default=None, help="keep inputs and outputs here (default: a temp dir)")
    parser.add_argument("--baseline-job", nargs=3, metavar=("FORMAT", "INPUT", "OUTPUT_PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_job:
        baseline_job(*args.baseline_job)
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-build-"))
    work.mkdir(parents=True, exist_ok=True)
    inputs = write_inputs(args.rows, work)
    print(f"{args.rows:,} rows (baseline: first {args.baseline_rows:,}); best of {args.repeats}; shared 2-core machine")
    header = f"{'input':<8}{'ours rows/s':>13}{'ours s':>9}{'peak RSS':>11}{'output':>10}{'RSS/out':>9}{'baseline rows/s':>17}{'ratio':>8}"
    print(header)
    for fmt in args.formats.split(","):
        ours = min((run_ours(fmt, inputs[fmt], work) for _ in range(args.repeats)), key=lambda result: result[0])
        base = min((run_baseline(fmt, inputs[fmt], work, args.baseline_rows) for _ in range(args.repeats)), key=lambda r: r[0])
        ours_rate, base_rate = args.rows / ours[0], args.baseline_rows / base[0]
        print(f"{fmt:<8}{ours_rate:>13,.0f}{ours[0]:>9.1f}{ours[1] / 2**20:>9.0f}MB{ours[2] / 2**20:>8.0f}MB"
              f"{ours[1] / ours[2]:>9.2f}{base_rate:>17,.0f}{ours_rate / base_rate:>7.1f}x", flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
