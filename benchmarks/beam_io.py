"""Benchmark: tfrbeam's Beam IO against apache_beam.io.tfrecordio on the DirectRunner, in one run.

Run by hand from the repository root (the machine may be shared: the median of --repeats runs is
reported, with their range and best):

    python -m benchmarks.beam_io [--records 1000000] [--repeats 3] [--workdir DIR]

Prints records/s, whole pipeline (construction + run), for:
- per-record write: records of ~400 bytes (380-420, random bytes) generated inside the pipeline
  (10,000 per element of a small Create) and written with tfrbeam's WriteToTFRecord vs Beam's.
  Both write with num_shards=0 (the default). "generate only" is the same pipeline without a
  write: what both pay before any IO.
- per-record read: the same 1M records in 4 uncompressed shards (written by tfrbeam, so they
  carry the read index; Beam's reader ignores it), read with tfrbeam's ReadFromTFRecord vs Beam's
  into a DoFn that only counts.
- WriteExamples from Arrow RecordBatches of the shared benchmark table (benchmarks/table.py,
  ~390-byte Examples, 20 columns) vs the baseline a Beam user writes today: rows to dicts,
  one generated-protobuf Example per row, Beam's WriteToTFRecord. Target: >= 150,000 rows/s.
- ReadExamples(output="record_batches") vs Beam's ReadFromTFRecord + protobuf parsing per row,
  when tfrbeam.beam.examples_read exists. Target: >= 300,000 records/s.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io import tfrecordio
from apache_beam.options.pipeline_options import PipelineOptions

from benchmarks.encode import protobuf_examples
from benchmarks.table import make_benchmark_table
from benchmarks.timing import Runs, ratio
from tfrbeam.beam.examples_write import WriteExamples
from tfrbeam.beam.sink import WriteToTFRecord
from tfrbeam.beam.source import ReadFromTFRecord

RECORDS_PER_CHUNK = 10_000
ROWS_PER_BATCH = 10_000


def make_records(chunk: int) -> Iterator[bytes]:
    """10,000 records of 380-420 random bytes, the same for the same chunk number."""
    rng = np.random.default_rng(chunk)
    lengths = rng.integers(380, 421, RECORDS_PER_CHUNK)
    blob = rng.bytes(int(lengths.sum()))
    offset = 0
    for length in lengths.tolist():
        yield blob[offset:offset + length]
        offset += length


def make_batch(number: int) -> pa.RecordBatch:
    return make_benchmark_table(ROWS_PER_BATCH, seed=number).to_batches()[0]


def rows_as_protobuf_examples(batch: pa.RecordBatch) -> list[bytes]:
    """The baseline's encoding: Python rows, one generated-protobuf Example each."""
    return protobuf_examples(batch.to_pylist(), batch.schema)


class CountFn(beam.DoFn):
    """Counts elements with the least per-element work, and checks the total at the end."""

    def start_bundle(self) -> None:
        self.count = 0

    def process(self, element) -> None:
        self.count += 1

    def finish_bundle(self) -> Iterator:
        yield beam.utils.windowed_value.WindowedValue(
            self.count, beam.transforms.window.GlobalWindow().max_timestamp(), [beam.transforms.window.GlobalWindow()]
        )


class RowCountFn(CountFn):
    def process(self, element) -> None:
        self.count += element.num_rows


def check_total(expected: int) -> Callable[[list[int]], None]:
    def check(counts: list[int]) -> None:
        if sum(counts) != expected:
            raise AssertionError(f"read {sum(counts)} records, expected {expected}")
    return check


def timed(build: Callable[[beam.Pipeline], None]) -> float:
    """Seconds to construct and run a DirectRunner pipeline (in-process, one worker)."""
    start = time.perf_counter()
    pipeline = beam.Pipeline(options=PipelineOptions(["--direct_num_workers=1"]))
    build(pipeline)
    pipeline.run().wait_until_finish()
    return time.perf_counter() - start


def rates(count: int, repeats: int, build: Callable[[beam.Pipeline], None], before: Callable[[], None] = lambda: None) -> Runs:
    times = []
    for _ in range(repeats):
        before()
        times.append(timed(build))
    return Runs(tuple(times)).rates(count)


def report(name: str, ours: Runs, baseline: Runs, target: str = "") -> None:
    print(f"{name}: {ratio(ours, baseline)} {target}\n    ours     {ours.describe('/s')}\n    baseline {baseline.describe('/s')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    chunks = max(args.records // RECORDS_PER_CHUNK, 1)
    records = chunks * RECORDS_PER_CHUNK
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="tfrbeam-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def fresh(name: str) -> Callable[[], None]:
        return lambda: shutil.rmtree(workdir / name, ignore_errors=True)

    def generated(pipeline: beam.Pipeline) -> beam.PCollection:
        return pipeline | beam.Create(range(chunks), reshuffle=False) | beam.FlatMap(make_records)

    print(f"{records:,} records of ~400 bytes, DirectRunner in-process, medians of {args.repeats} runs; machine shared (2 cores)")
    generate_only = rates(records, args.repeats, lambda p: generated(p) | beam.ParDo(CountFn()))
    print(f"generate only (both pay this): {generate_only.describe('/s')}")

    ours = rates(records, args.repeats, lambda p: generated(p) | WriteToTFRecord(str(workdir / "w-ours/out")),
                     fresh("w-ours"))
    beams = rates(records, args.repeats, lambda p: generated(p) | tfrecordio.WriteToTFRecord(str(workdir / "w-beam/out")),
                      fresh("w-beam"))
    report("per-record write (WriteToTFRecord)", ours, beams, "(target >= 1.5x)")

    shards = workdir / "shards"
    timed(lambda p: generated(p) | WriteToTFRecord(str(shards / "data"), num_shards=4, overwrite=True))
    pattern = str(shards / "data-*")
    ours = rates(records, args.repeats, lambda p: p | ReadFromTFRecord(pattern) | beam.ParDo(CountFn())
                     | beam.combiners.ToList() | beam.Map(check_total(records)))
    beams = rates(records, args.repeats, lambda p: p | tfrecordio.ReadFromTFRecord(pattern) | beam.ParDo(CountFn())
                      | beam.combiners.ToList() | beam.Map(check_total(records)))
    report("per-record read (ReadFromTFRecord)", ours, beams, "(target >= 1.5x)")

    batches = max(args.records // ROWS_PER_BATCH, 1)
    rows = batches * ROWS_PER_BATCH

    def arrow_batches(pipeline: beam.Pipeline) -> beam.PCollection:
        return pipeline | "Batches" >> beam.Create(range(batches), reshuffle=False) | beam.Map(make_batch)

    ours = rates(rows, args.repeats, lambda p: arrow_batches(p) | WriteExamples(str(workdir / "e-ours/out")),
                     fresh("e-ours"))
    beams = rates(rows, args.repeats, lambda p: arrow_batches(p) | beam.FlatMap(rows_as_protobuf_examples)
                      | tfrecordio.WriteToTFRecord(str(workdir / "e-beam/out")), fresh("e-beam"))
    report("WriteExamples from RecordBatches", ours, beams, "(target >= 150,000 rows/s)")

    try:
        from tfrbeam.beam.examples_read import ReadExamples
    except ImportError as exc:
        print(f"ReadExamples(output='record_batches'): not measured, tfrbeam.beam.examples_read is missing ({exc})")
    else:
        from tfrbeam.codec.protos import example_pb2

        examples = workdir / "e-ours"
        timed(lambda p: arrow_batches(p) | WriteExamples(str(examples / "out"), num_shards=4, overwrite=True))
        pattern = str(examples / "out-*")
        ours = rates(rows, args.repeats, lambda p: p | ReadExamples(pattern, output="record_batches")
                         | beam.ParDo(RowCountFn()) | beam.combiners.ToList() | beam.Map(check_total(rows)))
        beams = rates(rows, args.repeats, lambda p: p | tfrecordio.ReadFromTFRecord(pattern)
                          | beam.Map(example_pb2.Example.FromString) | beam.ParDo(CountFn())
                          | beam.combiners.ToList() | beam.Map(check_total(rows)))
        report("ReadExamples(output='record_batches')", ours, beams, "(target >= 300,000 records/s)")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
