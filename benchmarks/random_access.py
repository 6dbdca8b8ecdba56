"""Benchmark: random access, 1024 random records at a time decoded to numpy, tfrbeam vs ArrayRecord.

Run by hand:  pip install -e ".[bench]"   # array-record, the baseline
              python benchmarks/random_access.py [--rows 1000000] [--shards 8] [--batches 200] [--repeat 5]

Writes the benchmark table (benchmarks/table.py) once as uncompressed TFRecord shards with a
manifest (as benchmarks/dataset.py does), and converts the same records into ArrayRecord files
(``group_size:1``, one record per chunk: the setting for random access). Each run draws
``--batches`` sets of 1024 random indices (seeded) and reads them:

- ours: ``open_random_access(dir, "train").__getitems__(indices)`` — records as dicts of numpy values;
- baseline: ``ArrayRecordDataSource(files).__getitems__(indices)``, the same payloads decoded to
  the same dicts by the same decoder (``decode_rows``), so the figures compare the storage layers;
- both again for raw bytes (no decoding).

Runs alternate between ours and the baseline; the median and range (min..max) of ``--repeat``
runs are printed as records/s. Targets: at least the baseline's rate, and 150,000 records/s.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.dataset import write_dataset
from tfrbeam.dataset import open_random_access
from tfrbeam.dataset.random_access import decode_rows
from tfrbeam.tfrecord.records import read_records

BATCH = 1024
TARGET_RECORDS_PER_SECOND = 150_000


def write_array_records(root: pathlib.Path) -> list[str]:
    """The dataset's records, shard by shard, as ArrayRecord files with group_size 1 (reused when there)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    paths = []
    for shard in sorted(root.glob("train-*.tfrecord")):
        target = shard.with_suffix(".array_record")
        if not target.exists():
            partial = target.with_suffix(".array_record.partial")
            writer = ArrayRecordWriter(str(partial), "group_size:1")
            for payload in read_records(str(shard)):
                writer.write(payload)
            writer.close()
            partial.rename(target)
        paths.append(str(target))
    return paths


def rate(read: Callable[[list[int]], list], batches: list[list[int]]) -> float:
    """Records/s of reading every batch of indices once."""
    started = time.perf_counter()
    for indices in batches:
        read(indices)
    return BATCH * len(batches) / (time.perf_counter() - started)


def summary(name: str, rates: list[float]) -> str:
    return (f"{name:<34} median {statistics.median(rates):>10,.0f} records/s  "
            f"(range {min(rates):,.0f}..{max(rates):,.0f}, {len(rates)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200, help="sets of 1024 random indices per run")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    root = write_dataset(args.rows, args.shards)
    ours = open_random_access(root, "train")
    ours_raw = open_random_access(root, "train", raw=True)
    baseline = ArrayRecordDataSource(write_array_records(root))
    assert len(ours) == len(baseline) == args.rows
    decoder = ours._decoder

    def baseline_decoded(indices: list[int]) -> list:
        payloads = baseline.__getitems__(indices)
        lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        bounds = np.concatenate(([0], np.cumsum(lengths)))
        return decode_rows(decoder, [np.frombuffer(b"".join(payloads), np.uint8)], bounds, np.asarray(indices), "array_record")

    rng = np.random.default_rng(0)
    check = rng.integers(0, args.rows, BATCH).tolist()
    assert ours_raw.__getitems__(check) == baseline.__getitems__(check), "the two stores hold different records"
    mine = ours.__getitems__(check)
    theirs = baseline_decoded(check)
    assert all(a["i3"] == b["i3"] and a["s0"] == b["s0"] for a, b in zip(mine, theirs))
    contenders: dict[str, Callable[[list[int]], list]] = {
        "tfrbeam open_random_access": ours.__getitems__,
        "ArrayRecordDataSource + decode": baseline_decoded,
        "tfrbeam raw bytes": ours_raw.__getitems__,
        "ArrayRecordDataSource raw bytes": baseline.__getitems__,
    }
    for read in contenders.values():  # warm up: open every shard, fill the page cache
        read(rng.integers(0, args.rows, BATCH).tolist())
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeat):
        batches = [rng.integers(0, args.rows, BATCH).tolist() for _ in range(args.batches)]
        for name, read in contenders.items():
            rates[name].append(rate(read, batches))
    print(f"{args.rows:,} records in {args.shards} shards ({root}); {args.batches} x {BATCH} random indices per run")
    for name, values in rates.items():
        print(summary(name, values))
    ratio = statistics.median(rates["tfrbeam open_random_access"]) / statistics.median(rates["ArrayRecordDataSource + decode"])
    ours_median = statistics.median(rates["tfrbeam open_random_access"])
    verdict = "meets" if ours_median >= TARGET_RECORDS_PER_SECOND and ratio >= 1.0 else "misses"
    print(
        f"decoded: ours / ArrayRecord = {ratio:.2f}x; {verdict} the target (>= 1x and >= {TARGET_RECORDS_PER_SECOND:,} records/s)"
    )


if __name__ == "__main__":
    main()
