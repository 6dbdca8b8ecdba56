"""Benchmark: a SequenceExample build of 1M rows in 10,000 groups against the typical Beam job, as separate processes.

Run by hand from the repository root (the machine may be shared; the median and range of
--repeats runs are reported):

    python -m benchmarks.sequence [--rows 1000000] [--groups 10000] [--repeats 3] [--ours-only]

The input: one Parquet file (row groups of 131072) of ``--rows`` events of ``--groups`` users,
100 per user on average (user shares drawn from an exponential distribution), in no order: user (string),
ts (int64, the step order), country (constant per user: the context), item (int64), price
(float), category (string) and tags (a list of strings).

Ours: ``python -m tfrbeam.build`` with ``sequence: {group_by: [user], order_by: [ts], context:
[country]}``, shuffled (seed 0), one split, 8 shards, the default runner; the whole process timed
(interpreter start, pipeline construction, run, manifest). Baseline, in the same run and on the
same rows, on the same runner: ``beam.io.ReadFromParquet`` -> key each row dict by user ->
``beam.GroupByKey()`` -> sort each group's rows by ts in Python -> one ``SequenceExample`` per
user built with the generated protobuf classes -> ``beam.io.WriteToTFRecord(num_shards=8)``.
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

from benchmarks.build import run_measured
from benchmarks.timing import Runs, ratio

NUM_SHARDS = 8
_COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG")
_CATEGORIES = ("books", "music", "garden", "toys", "food")


def write_input(rows: int, groups: int, path: pathlib.Path, seed: int = 0) -> None:
    """The events table: ``rows`` rows of ``groups`` users, shuffled, written as Parquet."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    weights = rng.exponential(size=groups)
    sizes = rng.multinomial(rows - groups, weights / weights.sum()) + 1  # every user at least one row; rows in all
    user = np.repeat(np.arange(groups), sizes)
    order = rng.permutation(len(user))
    user = user[order]
    tag_counts = rng.integers(0, 4, len(user))
    tags = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(tag_counts)]).astype(np.int32)),
        pa.array(rng.choice(["new", "sale", "gift", "bulk"], int(tag_counts.sum()))))
    table = pa.table({
        "user": pa.array(np.char.add("user-", user.astype(str))),
        "ts": pa.array(rng.integers(1_700_000_000, 1_710_000_000, len(user))),
        "country": pa.array(np.asarray(_COUNTRIES)[user % len(_COUNTRIES)]),
        "item": pa.array(rng.integers(0, 1_000_000, len(user))),
        "price": pa.array(np.round(rng.gamma(2.0, 20.0, len(user)), 2).astype(np.float32)),
        "category": pa.array(rng.choice(_CATEGORIES, len(user))),
        "tags": tags,
    })
    pq.write_table(table, path, row_group_size=131072)


def build_config(input_path: pathlib.Path, output_path: pathlib.Path) -> dict:
    """Ours: every column, one sequence per user in ts order, country as context, shuffled, 8 shards, one split."""
    return {
        "input": {"format": "parquet", "path": str(input_path)},
        "sequence": {"group_by": ["user"], "order_by": ["ts"], "context": ["country"]},
        "shuffle": {"enabled": True, "seed": 0},
        "output": {"path": str(output_path), "num_shards": NUM_SHARDS},
    }


def run_ours(input_path: pathlib.Path, work: pathlib.Path) -> tuple[float, int, float, dict]:
    output = work / "ours"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / "ours.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(input_path, output)))
    seconds, rss, cpu = run_measured([sys.executable, "-m", "tfrbeam.build", str(config_path), "--quiet"])
    return seconds, rss, cpu, json.loads((output / "dataset_info.json").read_text())


def run_baseline(input_path: pathlib.Path, work: pathlib.Path) -> tuple[float, int, float]:
    output = work / "baseline"
    shutil.rmtree(output, ignore_errors=True)
    return run_measured([sys.executable, __file__, "--baseline-job", str(input_path), str(output / "part")])


# ----------------------------------------------------------------------------- the baseline job


def _sequence_example(item: tuple) -> bytes:
    """One user's rows, sorted by ts in Python, as a SequenceExample built with the protobuf classes."""
    from tfrbeam.protos import example_pb2

    user, rows = item
    steps = sorted(rows, key=lambda row: row["ts"])
    example = example_pb2.SequenceExample()
    context = example.context.feature
    context["user"].bytes_list.value.append(user.encode("utf-8"))
    context["country"].bytes_list.value.append(steps[0]["country"].encode("utf-8"))
    lists = example.feature_lists.feature_list
    for row in steps:
        lists["ts"].feature.add().int64_list.value.append(row["ts"])
        lists["item"].feature.add().int64_list.value.append(row["item"])
        lists["price"].feature.add().float_list.value.append(row["price"])
        lists["category"].feature.add().bytes_list.value.append(row["category"].encode("utf-8"))
        lists["tags"].feature.add().bytes_list.value.extend(tag.encode("utf-8") for tag in row["tags"])
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
    print(f"{args.rows:,} rows in {args.groups:,} groups; {args.repeats} runs each; rows/s, by wall clock and by CPU second")
    base_wall = base_cpu = None
    if not args.ours_only:
        base = [run_baseline(input_path, work) for _ in range(args.repeats)]
        base_wall, base_cpu = Runs(tuple(args.rows / run[0] for run in base)), Runs(tuple(args.rows / run[2] for run in base))
        print(f"baseline: wall {base_wall.describe('rows/s')}\n          cpu  {base_cpu.describe('rows/s')}\n"
              f"          peak RSS {max(run[1] for run in base) / 2**20:,.0f} MB", flush=True)
    ours = [run_ours(input_path, work) for _ in range(args.repeats)]
    wall, cpu = Runs(tuple(args.rows / run[0] for run in ours)), Runs(tuple(args.rows / run[2] for run in ours))
    manifest = ours[0][3]
    sequences = sum(split["num_examples"] for split in manifest["splits"].values())
    print(f"ours:     wall {wall.describe('rows/s')}\n          cpu  {cpu.describe('rows/s')}\n"
          f"          peak RSS {max(run[1] for run in ours) / 2**20:,.0f} MB; {sequences:,} SequenceExamples", flush=True)
    if base_wall is not None and base_cpu is not None:
        print(f"ratio:    wall {ratio(wall, base_wall)}; cpu {ratio(cpu, base_cpu)}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
