"""Benchmark: the read path (TFRecord framing + CRCs, then Example -> Arrow decoding) vs. baselines.

Run by hand from the repository root (single-threaded; the machine may be shared, so each figure
is the median of --repeats runs, with their range and best):

    python -m benchmarks.read [--rows 1000000] [--batch-records 65536] [--baseline-records N]

Writes (once, cached) the --rows-record file of the benchmark table with our encoder and
RecordWriter, then measures:
(a) reading it with CRC checks: MB/s of ``read_records`` vs. Beam's own
    ``apache_beam.io.tfrecordio._TFRecordUtil.read_record`` loop over the same file;
(b) decoding the records to Arrow: records/s of ``examples_to_record_batch`` in batches of
    --batch-records vs. per-record protobuf parsing (``Example.FromString`` plus building Python
    lists, the usual hand-written decode) on the same records, unless --baseline-records asks
    for fewer (the output then says so).
The decoded values are checked against the table before any figure is printed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import pyarrow as pa

from benchmarks.table import make_benchmark_table
from benchmarks.timing import Runs, ratio, time_runs
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.encode import encode_record_batch
from tfrbeam.codec.protos import example_pb2
from tfrbeam.tfrecord.records import RecordWriter, frame_buffer, read_records

_ENCODE_BATCH = 65_536


def benchmark_file(rows: int, cache_dir: pathlib.Path) -> pathlib.Path:
    """The benchmark table's records as a TFRecord file, written on first use (atomically)."""
    path = cache_dir / f"benchmark-{rows}-seed0.tfrecord"
    if path.exists():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    table = make_benchmark_table(rows, seed=0)
    partial = path.with_suffix(".partial")
    with RecordWriter(str(partial)) as writer:
        for batch in table.to_batches(max_chunksize=_ENCODE_BATCH):
            encoded = encode_record_batch(batch)
            writer.write_framed(frame_buffer(encoded.data, encoded.offsets), len(encoded))
    os.replace(partial, path)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - start:.1f} s")
    return path


def beam_read_all(path: pathlib.Path) -> int:
    """The baseline reader: Beam's record-at-a-time loop (it checks both CRCs too)."""
    from apache_beam.io.tfrecordio import _TFRecordUtil

    count = 0
    with open(path, "rb") as handle:
        while _TFRecordUtil.read_record(handle) is not None:
            count += 1
    return count


def protobuf_decode(records: list[bytes]) -> list[dict]:
    """The decode baseline: parse each record with protobuf and build Python lists per feature."""
    out = []
    for record in records:
        example = example_pb2.Example.FromString(record)
        row = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            row[name] = list(getattr(feature, kind).value) if kind else []
        out.append(row)
    return out


def check_decoded(records: list[bytes], rows: int, batch_records: int) -> None:
    """Our decoded batches of ``records`` (the first of the file) equal the benchmark table of
    ``rows`` rows (floats as the float32 written)."""
    table = make_benchmark_table(rows, seed=0)
    floats = {name: pa.float32() for name in table.column_names if name.startswith("f")}
    want = table.cast(pa.schema([pa.field(f.name, floats.get(f.name, f.type)) for f in table.schema]))
    for start in range(0, len(records), batch_records):
        batch = examples_to_record_batch(records[start : start + batch_records], schema=want.schema)
        expected = want.slice(start, batch.num_rows)
        if not pa.Table.from_batches([batch]).equals(expected):
            raise SystemExit(f"MISMATCH: decoded batch at record {start} differs from the benchmark table")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-records", type=int, default=65_536)
    parser.add_argument("--baseline-records", type=int, default=None,
                        help="time the decode baseline on only the first N records (default: all, the same records)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "tfrbeam-bench")
    args = parser.parse_args(argv)

    path = benchmark_file(args.rows, args.cache_dir)
    size_mb = path.stat().st_size / 1e6
    print(f"file: {path} ({size_mb:.1f} MB, {args.rows:,} records); cpu count {os.cpu_count()} (machine may be "
          f"shared: wall-clock and CPU-time figures are medians of {args.repeats} runs)")

    records: list[bytes] = []
    read_times = time_runs(lambda: records.__setitem__(slice(None), list(read_records(str(path)))), args.repeats)
    beam_times = time_runs(lambda: beam_read_all(path), args.repeats)
    if len(records) != args.rows or beam_read_all(path) != args.rows:
        raise SystemExit("MISMATCH: record counts differ")
    ours_mb, beam_mb = ([runs.rates(size_mb) for runs in times] for times in (read_times, beam_times))
    report("(a) read + verify CRCs, read_records", ours_mb, "MB/s")
    report("    Beam _TFRecordUtil.read_record loop", beam_mb, "MB/s")
    print(f"    ratio: {ratio(ours_mb[0], beam_mb[0])} wall, {ratio(ours_mb[1], beam_mb[1])} cpu")

    check_decoded(records[: 3 * args.batch_records], args.rows, args.batch_records)
    batches = [records[start : start + args.batch_records] for start in range(0, len(records), args.batch_records)]
    decode_times = time_runs(lambda: [examples_to_record_batch(batch) for batch in batches], args.repeats)
    sample = records if args.baseline_records is None else records[: args.baseline_records]
    if len(sample) < len(records):
        print(f"NOTE: the decode baseline runs on {len(sample):,} of {len(records):,} records "
              "(--baseline-records): not the same records")
    baseline_times = time_runs(lambda: protobuf_decode(sample), args.repeats)
    mean = sum(map(len, sample)) / len(sample)
    ours_rate = [runs.rates(len(records)) for runs in decode_times]
    theirs_rate = [runs.rates(len(sample)) for runs in baseline_times]
    report(f"(b) decode to Arrow (batches of {args.batch_records:,}, mean record {mean:.0f} B), examples_to_record_batch",
           ours_rate, "records/s")
    report(f"    protobuf FromString + Python lists (on {len(sample):,} records)", theirs_rate, "records/s")
    print(f"    ratio: {ratio(ours_rate[0], theirs_rate[0])} wall, {ratio(ours_rate[1], theirs_rate[1])} cpu")


def report(what: str, rates: list[Runs], unit: str) -> None:
    wall, cpu = rates
    digits = 1 if unit == "MB/s" else 0
    print(f"{what}:\n        wall {wall.describe(unit, digits)}\n        cpu  {cpu.describe(unit, digits)}")

if __name__ == "__main__":
    main()
