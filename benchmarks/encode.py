"""Benchmark: columnar Arrow -> tf.train.Example encoding against per-row protobuf serialization.

Run by hand from the repository root (single-threaded; the machine may be shared, so each figure
is the median of --repeats runs, with their range and best):

    python -m benchmarks.encode [--rows 1000000] [--batch-rows 65536] [--baseline-rows N]

Prints rows/s of `encode_record_batch` (buffer + offsets) and `record_batch_to_examples`
(one bytes per row) over the benchmark table in batches, rows/s of the baseline (generated
protobuf classes, one Example per row, SerializeToString(deterministic=True), on the same rows
unless --baseline-rows asks for fewer: the output then says so), and the ratios. Our bytes are
checked equal to the baseline's.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pyarrow as pa

from benchmarks.table import make_benchmark_table
from benchmarks.timing import ratio, time_runs
from tfrbeam.codec.encode import encode_record_batch, record_batch_to_examples
from tfrbeam.codec.protos import example_pb2


def protobuf_examples(rows: list[dict], schema: pa.Schema) -> list[bytes]:
    """The baseline: one generated-protobuf Example per row, deterministically serialized."""
    kinds = {field.name: _kind(field.type) for field in schema}
    out = []
    for row in rows:
        example = example_pb2.Example()
        features = example.features.feature
        for name, value in row.items():
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            kind = kinds[name]
            if kind == "int64":
                features[name].int64_list.value.extend(values)
            elif kind == "float":
                features[name].float_list.value.extend(values)
            else:
                features[name].bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
        out.append(example.SerializeToString(deterministic=True))
    return out


def _kind(arrow_type: pa.DataType) -> str:
    if pa.types.is_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_integer(arrow_type):
        return "int64"
    return "float" if pa.types.is_floating(arrow_type) else "bytes"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=65_536)
    parser.add_argument("--baseline-rows", type=int, default=None,
                        help="time the baseline on only the first N rows (default: all, the same rows as ours)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    table = make_benchmark_table(args.rows, seed=0)
    print(f"benchmark table: {table.num_rows:,} rows x {table.num_columns} columns, "
          f"built in {time.perf_counter() - start:.2f} s; cpu count {os.cpu_count()} (machine may be shared)")
    batches = table.to_batches(max_chunksize=args.batch_rows)

    buffer_seconds = time_runs(lambda: [encode_record_batch(batch) for batch in batches], args.repeats)
    list_seconds = time_runs(lambda: [record_batch_to_examples(batch) for batch in batches], args.repeats)

    sample = table if args.baseline_rows is None else table.slice(0, args.baseline_rows)
    if sample.num_rows < table.num_rows:
        print(f"NOTE: the baseline runs on {sample.num_rows:,} of {table.num_rows:,} rows (--baseline-rows): not the same rows")
    convert_start = time.perf_counter()
    rows = sample.to_pylist()
    convert_seconds = time.perf_counter() - convert_start
    baseline_seconds = time_runs(lambda: protobuf_examples(rows, table.schema), args.repeats)

    expected = protobuf_examples(rows, table.schema)
    ours = [record for batch in sample.to_batches(max_chunksize=args.batch_rows) for record in record_batch_to_examples(batch)]
    if ours != expected:
        mismatch = next(i for i, (a, b) in enumerate(zip(ours, expected)) if a != b)
        raise SystemExit(f"MISMATCH with protobuf at row {mismatch}")
    payload = sum(len(record) for record in expected)
    print(f"bytes identical to protobuf on the first {len(rows):,} rows (mean record {payload / len(rows):.0f} B)")
    print(f"to_pylist for the baseline (not counted): {len(rows) / convert_seconds:,.0f} rows/s")

    for clock, which in (("wall", 0), ("cpu", 1)):
        buffer_rate = buffer_seconds[which].rates(table.num_rows)
        list_rate = list_seconds[which].rates(table.num_rows)
        baseline_rate = baseline_seconds[which].rates(len(rows))
        print(f"[{clock}] encode_record_batch      : {buffer_rate.describe('rows/s')}")
        print(f"[{clock}] record_batch_to_examples : {list_rate.describe('rows/s')}")
        print(f"[{clock}] protobuf per-row baseline: {baseline_rate.describe('rows/s')} on {len(rows):,} rows")
        print(f"[{clock}] ratio record_batch_to_examples / baseline: {ratio(list_rate, baseline_rate)}; "
              f"encode_record_batch / baseline: {ratio(buffer_rate, baseline_rate)}")

if __name__ == "__main__":
    main()
