"""Benchmark: ``open_dataset`` over ``gs://`` against a raw read of the same bytes from the same server, same run.

Run by hand from the repository root (the machine may be shared; each figure is the median of
--repeat runs, with their range):

    python benchmarks/object_store_read.py [--rows 300000] [--shards 8] [--repeat 5]

Starts the GCS emulator (``gcp-storage-emulator``, as the tests do: tests/storage_servers.py) on
127.0.0.1, builds the benchmark table (benchmarks/table.py) into a dataset of --shards shards
(``tfrbeam.write_dataset``, cached in the temp directory), and copies it into a bucket. Then, --repeat times and
interleaved, so the load of a shared machine hits each alike:

- raw: every shard's bytes read from the server, one whole-object GET each, one shard at a time:
  plain GETs (``requests``, the body read into one ``bytes``): the server's bound, no reader can go
  faster; and, as earlier rounds measured it, through ``pyarrow.fs`` one at a time and
  --raw-threads at once (default 4: the emulator serves one request at a time and its listen
  backlog is 5, so more connections at once lose their SYNs and retry a second later). pyarrow's
  client checks the MD5 and CRC32C of every whole object it downloads (about 0.2 s of CPU for the
  8 shards), so it is 2-3x slower than a plain GET. The goal's ratio is taken against the fastest;
- records: one epoch of ``open_dataset('gs://…', split='train', raw=True)``: batches of 1024,
  8 files interleaved, shuffled files and a shuffle buffer of 10,000, every CRC checked, each
  record's bytes handed out (the reader's defaults otherwise): the reading path alone;
- decoded: the same epoch with every feature decoded into numpy;
- each of the two again on the local copy, for what the reader costs without a network.

Prints MB/s of shard bytes for each (median, range), and the ratios of the bucket's records
epoch to the raw read (goal: at least 0.7x) and of each bucket epoch to the same local one,
checking first that each bucket epoch gives the local one's records in the same order.

``--baseline DIR`` also times the four epochs with the tfrbeam in DIR (an export of an older
commit: ``git archive <commit> tfrbeam | tar -x -C DIR``), in a child process started after each
round of this one's epochs, so a before/after pair comes from the same run and the same server;
the child checks its epochs give the same records, in the same order, as this code's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np
import requests

import tfrbeam
from benchmarks.table import make_benchmark_table
from benchmarks.timing import Runs, ratio
from tests.storage_servers import GcsEmulator, StoreBucket, patched_env
from tfrbeam.base.object_store import forget_object_store_clients, pyarrow_filesystem
from tfrbeam.dataset import open_dataset
from tfrbeam.layout.names import MANIFEST_NAME

GOAL = 0.7
_READER = {"split": "train", "batch_size": 1024, "shuffle_files": True, "shuffle_buffer": 10_000, "seed": 0}
_KINDS = ("records", "decoded")


def local_dataset(rows: int, shards: int) -> pathlib.Path:
    """The benchmark table built into one split of ``shards`` shards, reused when already there."""
    root = pathlib.Path(tempfile.gettempdir()) / f"tfrbeam-bench-object-store-{rows}-{shards}"
    if not (root / MANIFEST_NAME).exists():
        tfrbeam.write_dataset(make_benchmark_table(rows), str(root), splits={"train": 1.0}, num_shards=shards,
                              progress=False, overwrite=True)
    return root


def upload(bucket: StoreBucket, local: pathlib.Path) -> list[str]:
    """Every file of the local dataset (indexes too) as an object under ``ds/``; returns the shards' keys."""
    keys = []
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"ds/{path.relative_to(local).as_posix()}"
            bucket.put(key, path.read_bytes())
            keys.append(key)
    return [key for key in keys if key.endswith(".tfrecord")]


def plain_read(bucket: StoreBucket, keys: list[str], session: requests.Session) -> int:
    """Bytes of one plain GET of each shard's media from the emulator, one at a time, each body read into a bytes."""
    endpoint = os.environ["STORAGE_EMULATOR_HOST"].rstrip("/")
    total = 0
    for key in keys:
        address = f"{endpoint}/download/storage/v1/b/{bucket.name}/o/{quote(key, safe='')}?alt=media"
        with session.get(address, stream=True, timeout=60) as response:
            response.raise_for_status()
            total += len(response.raw.read())
    return total


def raw_read(bucket: StoreBucket, keys: list[str], threads: int = 1) -> int:
    """Bytes of one whole-object GET of each shard through ``pyarrow.fs``, drained; ``threads`` GETs at once."""
    filesystem = pyarrow_filesystem(bucket.root + "/x")

    def get(key: str) -> int:
        with filesystem.open_input_stream(f"{bucket.name}/{key}") as stream:
            return len(stream.read())

    if threads == 1:
        return sum(map(get, keys))
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, keys))


def epoch(path: str, kind: str) -> tuple[int, int]:
    """(records, a checksum of what came out, in order) of one epoch: the work is done and its result kept."""
    records, checksum = 0, 0
    with open_dataset(path, raw=kind == "records", **_READER) as dataset:
        for number, batch in enumerate(dataset):
            column = batch["record"] if kind == "records" else batch["i4"]
            records += len(column)
            checksum += (number + 1) * (zlib.crc32(bytes(column[0])) if kind == "records" else int(np.sum(column)))
    return records, checksum


_BASELINE_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import tfrbeam
assert tfrbeam.__file__.startswith(sys.argv[1]), tfrbeam.__file__
sys.path.insert(1, sys.argv[2])
import benchmarks.object_store_read as bench
out = {}
for where, path in (("gs", sys.argv[3]), ("local", sys.argv[4])):
    for kind in bench._KINDS:
        result = bench.epoch(path, kind)  # warm: imports, clients and first-touch memory, as this process had
        started = time.perf_counter()
        again = bench.epoch(path, kind)
        out[f"{where} {kind}"] = [time.perf_counter() - started, result == again and list(result)]
print(json.dumps(out))
"""


def baseline_epochs(directory: str, url: str, local: str) -> dict[str, tuple[float, list]]:
    """Seconds of each epoch with the tfrbeam in ``directory`` (a child process), with its (records, checksum)."""
    repository = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([directory, repository]))
    done = subprocess.run([sys.executable, "-c", _BASELINE_CHILD, directory, repository, url, local],
                          env=env, check=True, capture_output=True, text=True)
    return {name: (seconds, result) for name, (seconds, result) in json.loads(done.stdout.splitlines()[-1]).items()}


def listen_overflows() -> int:
    """Connections this machine's listening sockets dropped (``TcpExtListenOverflows``): each costs its client a
    second before its SYN is sent again. 0 where ``/proc/net/netstat`` is not there."""
    try:
        lines = pathlib.Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split())).get("ListenOverflows", 0))
    return 0


_DROPPED: dict[str, int] = {}


def timed(function, *arguments, name: str = "") -> tuple[float, object]:
    dropped = listen_overflows()
    started = time.perf_counter()
    result = function(*arguments)
    took = time.perf_counter() - started
    _DROPPED[name] = _DROPPED.get(name, 0) + listen_overflows() - dropped
    return took, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--raw-threads", type=int, default=4, help="GETs at once of the second raw read")
    parser.add_argument("--baseline", help="a directory holding an older tfrbeam/ to time alongside (see above)")
    args = parser.parse_args()
    local = local_dataset(args.rows, args.shards)
    shard_bytes = sum(path.stat().st_size for path in local.glob("train/*.tfrecord"))
    with GcsEmulator() as server, patched_env(server.env):
        forget_object_store_clients()
        bucket = StoreBucket(server)
        keys = upload(bucket, local)
        url = bucket.url("ds")
        expected = {kind: epoch(str(local), kind) for kind in _KINDS}
        for kind in _KINDS:
            if epoch(url, kind) != expected[kind]:
                raise SystemExit(f"the bucket's {kind} epoch differs from the local copy's")
        names = [f"{where} {kind}" for kind in _KINDS for where in ("gs", "local")]
        raws = ("raw", "raw pyarrow", "raw pyarrow parallel")
        seconds: dict[str, list[float]] = {**{name: [] for name in raws}, **{name: [] for name in names}}
        session = requests.Session()
        if args.baseline:
            seconds.update({f"{name} (baseline)": [] for name in names})
        for _ in range(args.repeat):
            for name, read, arguments in (("raw", plain_read, (session,)), ("raw pyarrow", raw_read, (1,)),
                                          ("raw pyarrow parallel", raw_read, (args.raw_threads,))):
                took, size = timed(read, bucket, keys, *arguments, name=name)
                assert size == shard_bytes
                seconds[name].append(took)
            for kind in _KINDS:
                seconds[f"gs {kind}"].append(timed(epoch, url, kind, name=f"gs {kind}")[0])
                seconds[f"local {kind}"].append(timed(epoch, str(local), kind)[0])
            if args.baseline:
                for name, (took, result) in baseline_epochs(args.baseline, url, str(local)).items():
                    if tuple(result or ()) != expected[name.split()[1]]:
                        raise SystemExit(f"the baseline's {name} epoch gave {result}, this code's {expected[name.split()[1]]}")
                    seconds[f"{name} (baseline)"].append(took)
    rates = {name: Runs(tuple(values)).rates(shard_bytes / 1e6) for name, values in seconds.items()}
    print(f"{args.rows:,} records in {args.shards} shards, {shard_bytes / 1e6:.1f} MB; gcp-storage-emulator on 127.0.0.1; "
          f"{os.cpu_count()} CPUs")
    print(f"  {'raw plain GETs':<30} {rates['raw'].describe('MB/s', 1)}")
    print(f"  {'raw GETs, pyarrow':<30} {rates['raw pyarrow'].describe('MB/s', 1)}")
    print(f"  {f'raw, pyarrow, {args.raw_threads} at once':<30} {rates['raw pyarrow parallel'].describe('MB/s', 1)}")
    for name in seconds:
        if not name.startswith("raw"):
            print(f"  {'open_dataset ' + name:<30} {rates[name].describe('MB/s', 1)}")
    raw = max(raws, key=lambda name: rates[name].median)
    share = rates["gs records"].median / rates[raw].median
    print(f"records epoch over gs:// / the fastest raw read ({raw}): {ratio(rates['gs records'], rates[raw])} "
          f"(goal {GOAL}x: {'met' if share >= GOAL else 'not met'})")
    for kind in _KINDS:
        print(f"{kind} epoch over gs:// / the same local epoch: {ratio(rates[f'gs {kind}'], rates[f'local {kind}'])}")
    print(f"records epoch over gs:// / pyarrow's raw read, one at a time (earlier rounds' baseline): "
          f"{ratio(rates['gs records'], rates['raw pyarrow'])}")
    dropped = {name: count for name, count in _DROPPED.items() if name and count}
    print(f"connections dropped on this machine while timed (any process's; each a second's wait for its client): "
          f"{dropped or 'none'}")
    if args.baseline:
        print(f"baseline records epoch over gs:// / the fastest raw read: {ratio(rates['gs records (baseline)'], rates[raw])}")
        for name in names:
            print(f"{name}: this code / the baseline: {ratio(rates[name], rates[f'{name} (baseline)'])}")


if __name__ == "__main__":
    main()
