"""Benchmark: ``tfrbeam stats`` on the 1M-record benchmark table (20 features), in records/s.

Run by hand:  python benchmarks/stats.py [--rows 1000000] [--shards 8] [--repeat 3] [--wait-idle 300]

Writes the table (benchmarks/table.py) once as TFRecord shards with a tfrbeam_dataset.json (cached
in a temp directory, shared with benchmarks/dataset.py), then times, interleaved, ``repeat``
times each on the same files:
- ours: ``compute_stats`` (what ``tfrbeam stats`` runs: mergeable accumulators, one worker
  process per core) and the same with one process;
- decode only: reading and decoding every record with the columnar decoder (the floor any
  statistics on decoded columns pay);
- baseline: the exact in-memory computation with ``pyarrow.compute`` (min, max, mean, std,
  value counts, distinct counts, deciles) on the decoded table, after the same decoding.
Prints the median and range of records/s of each, and whether ours meets the target.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.dataset import wait_for_idle, write_dataset
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.stats.accumulators import stats_schema
from tfrbeam.stats.compute import compute_stats, resolve_input
from tfrbeam.tfrecord.blocks import record_blocks

TARGET_RECORDS_PER_SECOND = 300_000


def decode_all(root: pathlib.Path) -> list[pa.RecordBatch]:
    source = resolve_input(str(root))
    schema = stats_schema(source.feature_types)
    return [
        examples_to_record_batch((block.data, block.starts, block.ends), schema=schema)
        for files in source.splits.values() for path in files
        for block in record_blocks(path, None, block_length=8192)
    ]


def pyarrow_statistics(batches: list[pa.RecordBatch]) -> int:
    """The exact statistics of every column with pyarrow.compute on the whole (in-memory) table."""
    table = pa.Table.from_batches(batches)
    for column in table.columns:
        values = pc.list_flatten(column)
        pc.count(column)
        pc.list_value_length(column)
        if pa.types.is_binary(values.type):
            pc.value_counts(values)
            pc.count_distinct(values)
            pc.min_max(pc.binary_length(values))
            continue
        pc.min_max(values)
        pc.mean(values)
        pc.stddev(values)
        pc.quantile(values, q=[index / 10 for index in range(11)])
        if pa.types.is_integer(values.type):
            pc.value_counts(values)
            pc.count_distinct(values)
    return table.num_rows


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    root = write_dataset(args.rows, args.shards)
    cpus = os.cpu_count() or 1
    print(f"dataset: {root} ({args.rows:,} records, {args.shards} shards, 20 features); cpus: {cpus}")
    rates: dict[str, list[float]] = {f"tfrbeam stats ({cpus} processes)": [], "tfrbeam stats (1 process)": [],
                                     "decode only (1 process)": [], "baseline: decode + pyarrow.compute": []}
    names = list(rates)
    for _ in range(args.repeat):
        wait_for_idle(args.wait_idle)
        seconds, stats = timed(lambda: compute_stats(str(root), workers=cpus))
        assert stats["splits"]["train"]["num_examples"] == args.rows
        rates[names[0]].append(args.rows / seconds)
        wait_for_idle(args.wait_idle)
        seconds, _ = timed(lambda: compute_stats(str(root), workers=1))
        rates[names[1]].append(args.rows / seconds)
        wait_for_idle(args.wait_idle)
        seconds, batches = timed(lambda: decode_all(root))
        rates[names[2]].append(args.rows / seconds)
        wait_for_idle(args.wait_idle)
        more, rows = timed(lambda: pyarrow_statistics(batches))  # noqa: B023 - called at once, in this iteration
        assert rows == args.rows
        rates[names[3]].append(args.rows / (seconds + more))
    for name, values in rates.items():
        print(
            f"{name:<40} median {statistics.median(values):>11,.0f} records/s  (range {min(values):,.0f} .. {max(values):,.0f})"
        )
    ours = statistics.median(rates[names[0]])
    verdict = "meets" if ours >= TARGET_RECORDS_PER_SECOND else "misses"
    print(f"ours (median): {ours:,.0f} records/s — {verdict} the {TARGET_RECORDS_PER_SECOND:,} records/s target")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
