"""One timed epoch of one training reader over a tfrbeam dataset directory; prints one JSON line.

Run by benchmarks/dataset.py, each run in a fresh process so that every reader pays its own
start-up; the baselines run in their own virtualenvs (TensorFlow and the ``tfrecord`` package are
never tfrbeam dependencies), so this file imports neither tfrbeam nor them at the top.

    python benchmarks/dataset_readers.py {tfrbeam-threads,tfrbeam-processes,tf.data,tfrecord} DATASET_DIR

Every reader gets the same work: the split's files in a shuffled order, 8 files interleaved, a
10,000-record shuffle buffer, batches of 1024 Examples parsed with the manifest's feature spec
and turned into numpy arrays. Measured: import seconds, seconds from building the pipeline to
the first batch, and records/s from the first batch to the end of the epoch (steady state).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

BATCH = 1024
CYCLE = 8
SHUFFLE_BUFFER = 10_000
SEED = 0


def _manifest(root: pathlib.Path) -> tuple[list[str], dict[str, dict], int]:
    info = json.loads((root / "tfrbeam_dataset.json").read_text())
    split = info["splits"]["train"]
    return [str(root / shard["path"]) for shard in split["shards"]], info["features"], int(split["num_examples"])


def _count(batch: dict[str, Any]) -> int:
    return len(batch["i0"])


def _time_epoch(make: Callable[[], Iterable[dict[str, Any]]]) -> dict[str, float]:
    started = time.perf_counter()
    iterator = iter(make())
    first_records = _count(next(iterator))
    first = time.perf_counter()
    records = 0
    for batch in iterator:
        records += _count(batch)
    done = time.perf_counter()
    return {"first_batch_s": first - started, "steady_s": done - first, "steady_records": records,
            "records": first_records + records}


def tfrbeam_reader(root: pathlib.Path, executor: str) -> Callable[[], Iterable[dict[str, Any]]]:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from tfrbeam.dataset import open_dataset

    def make() -> Iterator[dict[str, Any]]:
        with open_dataset(str(root), batch_size=BATCH, num_parallel_reads=CYCLE, shuffle_files=True,
                          shuffle_buffer=SHUFFLE_BUFFER, seed=SEED, executor=executor) as dataset:
            yield from dataset  # numpy arrays (Ragged for the optional feature)

    return make


def tf_data_reader(root: pathlib.Path) -> Callable[[], Iterable[dict[str, Any]]]:
    """A tuned tf.data pipeline, as the TensorFlow guide's input-pipeline advice has it."""
    import tensorflow as tf

    paths, features, _ = _manifest(root)
    dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}
    spec = {}
    for name, entry in features.items():
        if entry.get("shape") is not None and entry.get("always_present", True):
            spec[name] = tf.io.FixedLenFeature(entry["shape"], dtypes[entry["type"]])
        else:
            spec[name] = tf.io.VarLenFeature(dtypes[entry["type"]])
    autotune = tf.data.AUTOTUNE

    def to_numpy(batch: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in batch.items():
            if isinstance(value, tf.SparseTensor):
                out[name] = (value.values.numpy(), value.indices.numpy())
            else:
                out[name] = value.numpy()
        return out

    def make() -> Iterator[dict[str, Any]]:
        files = tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths), seed=SEED)
        records = files.interleave(tf.data.TFRecordDataset, cycle_length=CYCLE, num_parallel_calls=autotune)
        batches = (records.shuffle(SHUFFLE_BUFFER, seed=SEED).batch(BATCH)
                   .map(lambda serialized: tf.io.parse_example(serialized, spec), num_parallel_calls=autotune)
                   .prefetch(autotune))
        for batch in batches:
            yield to_numpy(batch)

    return make


def tfrecord_package_reader(root: pathlib.Path) -> Callable[[], Iterable[dict[str, Any]]]:
    """The pure-Python ``tfrecord`` package: its multi-file loader (random interleave) and shuffle buffer."""
    import numpy as np
    from tfrecord.iterator_utils import shuffle_iterator
    from tfrecord.reader import multi_tfrecord_loader

    paths, features, _ = _manifest(root)
    kinds = {"int64": "int", "float": "float", "bytes": "byte"}
    # An optional feature is left out: the package raises KeyError on a record that lacks a described feature.
    description = {name: kinds[entry["type"]] for name, entry in features.items() if entry.get("always_present", True)}
    pattern = str(pathlib.Path(paths[0]).parent / "{}")
    splits = {pathlib.Path(path).name: 1.0 / len(paths) for path in paths}

    def make() -> Iterator[dict[str, Any]]:
        np.random.seed(SEED)
        loader = multi_tfrecord_loader(pattern, None, splits, description, infinite=False)
        pending: list[dict[str, Any]] = []
        for record in shuffle_iterator(loader, SHUFFLE_BUFFER):
            pending.append(record)
            if len(pending) == BATCH:
                yield {name: np.stack([row[name] for row in pending]) for name in description}
                pending = []
        if pending:
            yield {name: np.stack([row[name] for row in pending]) for name in description}

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reader", choices=["tfrbeam-threads", "tfrbeam-processes", "tf.data", "tfrecord"])
    parser.add_argument("root", type=pathlib.Path)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.reader.startswith("tfrbeam-"):
        make = tfrbeam_reader(args.root, args.reader.split("-", 1)[1])
    elif args.reader == "tf.data":
        make = tf_data_reader(args.root)
    else:
        make = tfrecord_package_reader(args.root)
    imported = time.perf_counter() - started
    result = _time_epoch(make)
    expected = _manifest(args.root)[2]
    if result["records"] != expected:
        raise SystemExit(f"{args.reader} read {result['records']} records, the manifest says {expected}")
    print(json.dumps({"reader": args.reader, "import_s": imported, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
