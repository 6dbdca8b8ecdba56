"""Benchmark: tfrbeam.dataset reading the 1M-record benchmark table into numpy batches, shuffled.

Run by hand:  python benchmarks/dataset.py [--rows 1000000] [--shards 8] [--repeat 3]

Writes the table (benchmarks/table.py) once as TFRecord shards with a dataset_info.json, cached in
a temp directory, then times full epochs of ``open_dataset`` (batches of 1024, all 20 features,
shuffle_files and a 10,000-record shuffle buffer) with thread and with process workers, and the
pure-Python ``tfrecord`` package (pip install tfrecord) on a slice of the same files as the
baseline. Prints records/s for each, and our best over the baseline. Timings on a shared machine
are noisy: the best of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.table import make_benchmark_table  # noqa: E402
from tfrbeam.columnar_encode import encode_record_batch  # noqa: E402
from tfrbeam.dataset import open_dataset  # noqa: E402
from tfrbeam.records import RecordWriter, frame_buffer  # noqa: E402

TARGET_RECORDS_PER_SECOND = 300_000
TARGET_RATIO = 25.0


def write_dataset(rows: int, shards: int) -> pathlib.Path:
    """The benchmark table as ``shards`` TFRecord files plus a manifest, reused when already there."""
    root = pathlib.Path(tempfile.gettempdir()) / f"tfrbeam-bench-dataset-{rows}-{shards}"
    manifest = root / "dataset_info.json"
    if manifest.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    table = make_benchmark_table(rows)
    entries = []
    for shard in range(shards):
        low, high = shard * rows // shards, (shard + 1) * rows // shards
        encoded = encode_record_batch(table.slice(low, high - low))
        name = f"train-{shard:05d}-of-{shards:05d}.tfrecord"
        with RecordWriter(str(root / name)) as writer:
            writer.write_framed(frame_buffer(encoded.data, encoded.offsets), len(encoded))
        entries.append({"path": name, "num_examples": high - low, "num_bytes": os.path.getsize(root / name), "sha256": ""})
    features = {f"i{k}": {"type": "int64", "shape": [], "always_present": True} for k in range(8)}
    features.update({f"f{k}": {"type": "float", "shape": [], "always_present": True} for k in range(8)})
    features.update({name: {"type": "bytes", "shape": [], "always_present": True} for name in ("s0", "s1")})
    features["emb"] = {"type": "float", "shape": [16], "always_present": True}
    features["n0"] = {"type": "int64", "shape": [], "always_present": False}
    info = {
        "format": "tfrbeam-dataset/1",
        "splits": {"train": {"num_examples": rows, "num_bytes": sum(e["num_bytes"] for e in entries), "shards": entries}},
        "compression": None,
        "features": features,
    }
    manifest.write_text(json.dumps(info, indent=1))
    return root


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process and by its finished children (the worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def time_ours(root: pathlib.Path, executor: str, shuffle_buffer: int, workers: int | None) -> dict[str, float]:
    """Records/s of one epoch after the first batch, and CPU microseconds per record (ours and workers')."""
    dataset = open_dataset(
        root, batch_size=1024, shuffle_files=True, shuffle_buffer=shuffle_buffer, seed=0,
        executor=executor, num_workers=workers,
    )
    own_before, children_before = _cpu_seconds()
    with dataset:
        iterator = iter(dataset)
        first = next(iterator)  # worker start-up is not part of the steady-state rate
        records = len(first["i0"])
        started = time.perf_counter()
        for batch in iterator:
            records += len(batch["i0"])
        elapsed = time.perf_counter() - started
    own_after, children_after = _cpu_seconds()
    return {
        "rate": (records - len(first["i0"])) / elapsed,
        "records": records,
        "main_us": (own_after - own_before) / records * 1e6,
        "workers_us": (children_after - children_before) / records * 1e6,
    }


def time_tfrecord_package(root: pathlib.Path, limit: int) -> float | None:
    """The `tfrecord` package's pure-Python reader + parser (no CRC checks) on ``limit`` records."""
    try:
        from tfrecord.reader import tfrecord_loader
    except ImportError:
        return None
    path = str(sorted(root.glob("train-*.tfrecord"))[0])
    description = {f"i{k}": "int" for k in range(8)}
    description.update({f"f{k}": "float" for k in range(8)})
    # n0 is left out: the package raises KeyError on a record that lacks a described feature.
    description.update({"s0": "byte", "s1": "byte", "emb": "float"})
    started = time.perf_counter()
    count = 0
    for _ in tfrecord_loader(path, None, description):
        count += 1
        if count >= limit:
            break
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shuffle-buffer", type=int, default=10_000)
    parser.add_argument("--baseline-records", type=int, default=50_000)
    args = parser.parse_args()
    root = write_dataset(args.rows, args.shards)
    print(f"dataset: {root} ({args.rows:,} records, {args.shards} shards); cpus: {os.cpu_count()}")
    results: dict[str, float] = {}
    for executor in ("threads", "processes"):
        runs = []
        for _ in range(args.repeat):
            run = time_ours(root, executor, args.shuffle_buffer, None)
            assert run["records"] == args.rows, f"read {run['records']} records, expected {args.rows}"
            runs.append(run)
        best = max(runs, key=lambda run: run["rate"])
        listed = ", ".join(f"{run['rate']:,.0f}" for run in runs)
        results[executor] = best["rate"]
        print(
            f"tfrbeam.dataset ({executor:9s}): best {best['rate']:>10,.0f} records/s  "
            f"(runs: {listed}); CPU per record in the best run: "
            f"{best['main_us']:.2f} us in this process + {best['workers_us']:.2f} us in worker processes"
        )
    ours = max(results.values())
    baseline = time_tfrecord_package(root, args.baseline_records)
    verdict = "meets" if ours >= TARGET_RECORDS_PER_SECOND else "misses"
    print(f"ours (best executor): {ours:,.0f} records/s — {verdict} the {TARGET_RECORDS_PER_SECOND:,} target")
    if baseline is None:
        print("baseline: the `tfrecord` package is not installed (pip install tfrecord) — no ratio")
        return
    ratio = ours / baseline
    print(f"baseline tfrecord package: {baseline:,.0f} records/s on {args.baseline_records:,} records")
    print(f"ratio: {ratio:.1f}x ({'meets' if ratio >= TARGET_RATIO else 'misses'} the {TARGET_RATIO:.0f}x target)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
