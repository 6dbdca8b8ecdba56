"""Benchmark: open plus read of datasets of 100, 1,000 and 10,000 one-record shards (issue 43 item 6).

Run by hand:  python benchmarks/shard_count_scaling.py [--counts 100 1000 10000] [--repeat 3]

Each dataset is written once (one record per shard, a manifest listing every shard, no read
indexes), then read whole with ``open_dataset(dir, "train")`` (threads, no prefetch) and
``open_random_access(dir, "train")`` (every record by number). A read proves each shard it opens
belongs to the generation it pinned; that proof was a read and hash of the whole manifest per
shard, so the time grew with the square of the shard count (8,000 shards: 17 s). It is one read
per open now, then a ``stat`` per shard: the time per shard printed should stay about flat.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.tfrecord.records import frame_record


def write_one_record_shards(directory: pathlib.Path, count: int) -> pathlib.Path:
    """A dataset at ``directory`` whose split ``train`` has ``count`` shards of one Example each (``{"x": [i]}``)."""
    split = directory / "train"
    split.mkdir(parents=True)
    shards = []
    for number in range(count):
        name = f"train-{number:05d}-of-{count:05d}.tfrecord"
        data = frame_record(encode_example({"x": [number]}, {"x": "int64"}))
        (split / name).write_bytes(data)
        shards.append({"path": f"train/{name}", "num_examples": 1, "num_bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"format": "tfrbeam-dataset/1", "record_type": "Example", "run_id": f"scaling-{count}",
                "compression": "none", "splits": {"train": {"num_examples": count, "shards": shards}},
                "features": {"x": {"type": "int64", "shape": [], "always_present": True}}}
    (directory / MANIFEST_NAME).write_bytes(Manifest.from_dict(manifest, "<new manifest>", verifiable=True).to_bytes())
    return directory


def read_sequentially(directory: pathlib.Path) -> int:
    """Records read by ``open_dataset`` over the whole split."""
    batches = open_dataset(str(directory), "train", batch_size=1024, prefetch=0, executor="threads")
    return sum(len(batch["x"]) for batch in batches)


def read_by_number(directory: pathlib.Path) -> int:
    """Records read one by one by ``open_random_access``."""
    dataset = open_random_access(str(directory), "train")
    return sum(1 for number in range(len(dataset)) if dataset[number] is not None)


def measure(directory: pathlib.Path, count: int, repeat: int) -> list[str]:
    lines = []
    for name, read in (("open_dataset", read_sequentially), ("open_random_access", read_by_number)):
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            assert read(directory) == count
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        lines.append(f"{count:>6} shards  {name:<19} open+read {median:7.3f} s (min {min(times):.3f}, max "
                     f"{max(times):.3f}); {median / count * 1e6:7.1f} us per shard")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shard-scaling-") as temp:
        for count in args.counts:
            directory = write_one_record_shards(pathlib.Path(temp) / f"shards-{count}", count)
            for line in measure(directory, count, args.repeat):
                print(line, flush=True)
    print(f"(CPU count {os.cpu_count()}; run alone for stable figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
