"""Benchmark: a SequenceExample build of 1M rows in 10,000 groups against the typical Beam job, as separate processes.

Run by hand from the repository root (the machine may be shared; the median and range of
--repeats runs are reported):

    python -m benchmarks.sequence [--rows 1000000] [--groups 10000] [--repeats 3] [--ours-only]

The input: the shared benchmark table (benchmarks/table.py, the rows benchmarks/build.py uses)
with a ``user`` column of ``--groups`` users (their shares of the rows drawn from an exponential
distribution, 100 rows per user on average) and a ``country`` constant per user, in no order,
as one Parquet file (row groups of 131072). The steps are ordered by ``i7`` (epoch seconds).

Ours: ``python -m tfrbeam.builder`` with ``sequence: {group_by: [user], order_by: [i7], context:
[country]}``, shuffled (seed 0), one split, 8 shards, the default runner; the whole process timed
(interpreter start, pipeline construction, run, manifest). Baseline, in the same run and on the
same rows, on the same runner: ``beam.io.ReadFromParquet`` -> key each row dict by user ->
``beam.GroupByKey()`` -> sort each group's rows by i7 in Python -> one ``SequenceExample`` per
user built with the generated protobuf classes -> ``beam.io.WriteToTFRecord(num_shards=8)``. Both
write the same SequenceExamples (as multisets of decoded records; checked on a small run), in
other orders and shards. The baseline's runs and ours alternate, and each repeat also builds the
first row alone, for the bound that benchmarks/build.py describes.
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

from benchmarks.build import compile_bytecode, describe_bound, run_measured
from benchmarks.timing import Runs, ratio

NUM_SHARDS = 8
ORDER_BY = "i7"
_COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG")


def write_input(rows: int, groups: int, path: pathlib.Path, seed: int = 0) -> None:
    """The benchmark table with a user (``groups`` of them) and a country per user, rows shuffled, as Parquet."""
    import numpy as np
    import pyarrow as pa

    from benchmarks.table import make_benchmark_table, write_parquet

    rng = np.random.default_rng(seed)
    weights = rng.exponential(size=groups)
    sizes = rng.multinomial(rows - groups, weights / weights.sum()) + 1  # every user at least one row; rows in all
    user = rng.permutation(np.repeat(np.arange(groups), sizes))
    table = make_benchmark_table(rows, seed)
    table = table.append_column("user", pa.array(np.char.add("user-", user.astype(str))))
    table = table.append_column("country", pa.array(np.asarray(_COUNTRIES)[user % len(_COUNTRIES)]))
    write_parquet(table, str(path), row_group_size=131072)


def build_config(input_path: pathlib.Path, output_path: pathlib.Path) -> dict:
    """Ours: every column, one sequence per user in i7 order, country as context, shuffled, 8 shards, one split."""
    return {
        "input": {"format": "parquet", "path": str(input_path)},
        "sequence": {"group_by": ["user"], "order_by": [ORDER_BY], "context": ["country"]},
        "shuffle": {"enabled": True, "seed": 0},
        "output": {"path": str(output_path), "num_shards": NUM_SHARDS},
    }


def run_ours(input_path: pathlib.Path, work: pathlib.Path) -> tuple[float, int, float, dict]:
    output = work / "ours"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / "ours.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(input_path, output)))
    seconds, rss, cpu, _ = run_measured([sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet"])
    return seconds, rss, cpu, json.loads((output / "tfrbeam_dataset.json").read_text())


def run_baseline(input_path: pathlib.Path, work: pathlib.Path) -> tuple[float, int, float, float]:
    output = work / "baseline"
    shutil.rmtree(output, ignore_errors=True)
    return run_measured([sys.executable, __file__, "--baseline-job", str(input_path), str(output / "part")])


# ----------------------------------------------------------------------------- the baseline job


def _sequence_example(item: tuple) -> bytes:
    """One user's rows, sorted by i7 in Python, as a SequenceExample built with the protobuf classes."""
    from tfrbeam.codec.protos import example_pb2

    user, rows = item
    steps = sorted(rows, key=lambda row: row[ORDER_BY])
    example = example_pb2.SequenceExample()
    context = example.context.feature
    context["user"].bytes_list.value.append(user.encode("utf-8"))
    context["country"].bytes_list.value.append(steps[0]["country"].encode("utf-8"))
    lists = example.feature_lists.feature_list
    for name in steps[0]:
        if name in ("user", "country"):
            continue
        feature_list = lists[name].feature
        for row in steps:
            value, step = row[name], feature_list.add()
            if value is None:
                step.int64_list.SetInParent()  # a null step: an empty list of the feature's kind
            elif isinstance(value, list):
                step.float_list.value.extend(value)
            elif isinstance(value, float):
                step.float_list.value.append(value)
            elif isinstance(value, int):
                step.int64_list.value.append(value)
            else:
                step.bytes_list.value.append(value.encode("utf-8"))
    return example.SerializeToString()


def baseline_job(input_path: str, output_prefix: str) -> None:
    """The typical Beam job: rows as dicts, GroupByKey by user, a Python sort, protobuf SequenceExamples, WriteToTFRecord."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        _ = (
            pipeline
            | beam.io.ReadFromParquet(input_path)
            | beam.Map(lambda row: (row["user"], row))
            | beam.GroupByKey()
            | beam.Map(_sequence_example)
            | beam.io.WriteToTFRecord(output_prefix, num_shards=NUM_SHARDS)
        )


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ours-only", action="store_true", help="skip the baseline")
    parser.add_argument("--work-dir", default=None, help="keep the input and outputs here (default: a temp dir)")
    parser.add_argument("--baseline-job", nargs=2, metavar=("INPUT", "OUTPUT_PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--write-input", nargs=3, metavar=("ROWS", "GROUPS", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_job:
        baseline_job(*args.baseline_job)
        return
    if args.write_input:
        write_input(int(args.write_input[0]), int(args.write_input[1]), pathlib.Path(args.write_input[2]))
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-sequence-"))
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / "events.parquet"
    # In a child process: Linux keeps a process's peak RSS across exec, so a parent holding the
    # table would pass its size on to every measured child.
    subprocess.run([sys.executable, __file__, "--write-input", str(args.rows), str(args.groups), str(input_path)],
                   check=True)
    compile_bytecode()
    print(f"{args.rows:,} rows in {args.groups:,} groups; {args.repeats} runs each; rows/s, by wall clock and by CPU second")
    one_row = work / "one-row.parquet"
    subprocess.run([sys.executable, __file__, "--write-input", "1", "1", str(one_row)], check=True)
    base, ours, fixed = [], [], []
    for _ in range(args.repeats):  # interleaved: a machine whose speed drifts moves both sides, not the ratio
        if not args.ours_only:
            base.append(run_baseline(input_path, work))
        ours.append(run_ours(input_path, work))
        fixed.append(run_ours(one_row, work))
    base_wall = base_cpu = None
    if base:
        base_wall, base_cpu = Runs(tuple(args.rows / run[0] for run in base)), Runs(tuple(args.rows / run[2] for run in base))
        print(f"baseline: wall {base_wall.describe('rows/s')}\n          cpu  {base_cpu.describe('rows/s')}\n"
              f"          peak RSS {max(run[1] for run in base) / 2**20:,.0f} MB", flush=True)
    wall, cpu = Runs(tuple(args.rows / run[0] for run in ours)), Runs(tuple(args.rows / run[2] for run in ours))
    manifest = ours[0][3]
    sequences = sum(split["num_examples"] for split in manifest["splits"].values())
    print(f"ours:     wall {wall.describe('rows/s')}\n          cpu  {cpu.describe('rows/s')}\n"
          f"          peak RSS {max(run[1] for run in ours) / 2**20:,.0f} MB; {sequences:,} SequenceExamples", flush=True)
    if base_wall is not None and base_cpu is not None:
        print(f"ratio:    wall {ratio(wall, base_wall)}; cpu {ratio(cpu, base_cpu)}")
    print(f"bound:    {describe_bound(ours, fixed, [run[0] for run in base])}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
