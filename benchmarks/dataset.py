"""Benchmark: tfrbeam.dataset against tuned tf.data and the `tfrecord` package, same run, same rows.

Run by hand (the machine may be shared; --wait-idle helps):

    python benchmarks/dataset.py [--rows 1000000] [--shards 8] [--repeat 5] [--with-tf] [--with-tfrecord] [--wait-idle 300]

Writes the benchmark table (benchmarks/table.py) once as TFRecord shards with a tfrbeam_dataset.json,
cached in a temp directory. Then, --repeat times and interleaved (so the load of a shared machine
hits every reader alike), runs one full epoch of each reader in a fresh process
(benchmarks/dataset_readers.py): tfrbeam.dataset with thread and with process workers, and with
--with-tf a tuned tf.data pipeline, with --with-tfrecord the pure-Python `tfrecord` package. All
get the same work: shuffled files, 8 interleaved, shuffle buffer 10,000, batches of 1024 parsed
with the manifest's spec into numpy. The baselines run in throwaway virtualenvs created on first
use under --venv-dir (tensorflow-cpu resp. tfrecord: never tfrbeam dependencies).

For every reader it prints the median and range over the runs of: time to the first batch (from
building the pipeline, imports excluded and shown apart), steady-state records/s (first batch to
end of epoch), and the whole epoch's records/s (pipeline start to last batch), then the ratios of
medians. It also prints how long a resume half way through an epoch takes to its first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.table import make_benchmark_table
from benchmarks.timing import Runs, ratio
from tfrbeam.codec.encode import encode_record_batch
from tfrbeam.dataset import open_dataset
from tfrbeam.tfrecord.records import RecordWriter, frame_buffer

TARGET_RECORDS_PER_SECOND = 300_000
READERS_SCRIPT = pathlib.Path(__file__).resolve().with_name("dataset_readers.py")
BASELINE_PACKAGES = {"tf.data": ["tensorflow-cpu", "numpy"], "tfrecord": ["tfrecord", "numpy", "protobuf"]}


def write_dataset(rows: int, shards: int) -> pathlib.Path:
    """The benchmark table as ``shards`` TFRecord files plus a manifest, reused when already there."""
    root = pathlib.Path(tempfile.gettempdir()) / f"tfrbeam-bench-dataset-{rows}-{shards}"
    manifest = root / "tfrbeam_dataset.json"
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


def _machine_busy_seconds() -> float:
    """CPU seconds all processes on the machine have used (user + system + irq), from /proc/stat."""
    values = [int(value) for value in pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def wait_for_idle(limit_seconds: float) -> None:
    """On a shared machine: wait (at most ``limit_seconds``) until other processes use under 0.15 cores for a second."""
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        before = _machine_busy_seconds()
        time.sleep(1.0)
        if _machine_busy_seconds() - before < 0.15:
            return


def time_resume(root: pathlib.Path, shuffle_buffer: int, batches: int) -> float:
    """Seconds from ``load_state_dict`` (``batches`` batches into an epoch) to the first batch after it."""
    def make():
        return open_dataset(root, batch_size=1024, shuffle_files=True, shuffle_buffer=shuffle_buffer, seed=0, executor="threads")

    with make() as stopped:
        iterator = iter(stopped)
        for _ in range(batches):
            next(iterator)
        state = stopped.state_dict()
        iterator.close()
    with make() as resumed:
        resumed.load_state_dict(state)
        started = time.perf_counter()
        next(iter(resumed))
        return time.perf_counter() - started


def baseline_python(reader: str, venv_root: pathlib.Path, fresh: bool) -> pathlib.Path:
    """The python of a throwaway virtualenv holding ``reader``'s package, created (once) if needed."""
    venv = venv_root / reader.replace(".", "-")
    python = venv / "bin" / "python"
    marker = venv / "installed.txt"
    packages = BASELINE_PACKAGES[reader]
    if fresh and venv.exists():
        shutil.rmtree(venv)
    if not marker.exists():
        print(f"creating {venv} with {' '.join(packages)} (once; --fresh-venvs recreates it)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
        versions = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
        marker.write_text(versions)
    return python


def run_reader(python: pathlib.Path, reader: str, root: pathlib.Path) -> dict[str, float]:
    """One epoch of ``reader`` in a fresh process; adds the CPU seconds of its process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(python), str(READERS_SCRIPT), reader, str(root)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{reader} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def summarize(reader: str, runs: list[dict[str, float]]) -> Runs:
    """Prints one reader's figures; returns its steady-state rates."""
    records = runs[0]["records"]
    first = Runs(tuple(run["first_batch_s"] for run in runs))
    steady = Runs(tuple(run["steady_records"] / run["steady_s"] for run in runs))
    epoch = Runs(tuple(run["records"] / (run["first_batch_s"] + run["steady_s"]) for run in runs))
    imports = Runs(tuple(run["import_s"] for run in runs))
    cpu = Runs(tuple(run["cpu_s"] / records * 1e6 for run in runs))
    print(f"{reader}:\n"
          f"    steady state   {steady.describe('records/s')}\n"
          f"    first batch    {first.describe('s', 2, higher_is_better=False)} (imports apart: median {imports.median:.2f} s)\n"
          f"    whole epoch    {epoch.describe('records/s')}\n"
          f"    CPU per record {cpu.describe('us', 2, higher_is_better=False)} (whole process tree, start-up included)")
    return steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--with-tf", action="store_true", help="also run a tuned tf.data pipeline (tensorflow-cpu venv)")
    parser.add_argument("--with-tfrecord", action="store_true", help="also run the pure-Python `tfrecord` package (own venv)")
    parser.add_argument("--venv-dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "tfrbeam-bench-venvs")
    parser.add_argument("--fresh-venvs", action="store_true", help="recreate the baselines' virtualenvs")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                        help="before each run, wait up to this long for the rest of the machine to go idle")
    args = parser.parse_args()
    root = write_dataset(args.rows, args.shards)
    print(f"dataset: {root} ({args.rows:,} records, {args.shards} shards); cpus: {os.cpu_count()}; "
          f"{args.repeat} runs of each reader, interleaved", flush=True)
    readers = {"tfrbeam-threads": pathlib.Path(sys.executable), "tfrbeam-processes": pathlib.Path(sys.executable)}
    for flag, reader in ((args.with_tf, "tf.data"), (args.with_tfrecord, "tfrecord")):
        if flag:
            readers[reader] = baseline_python(reader, args.venv_dir, args.fresh_venvs)
            installed = (readers[reader].parents[1] / "installed.txt").read_text().splitlines()
            wanted = {package.replace("-", "_").lower() for package in BASELINE_PACKAGES[reader]}
            print(f"{reader} baseline: {', '.join(line for line in installed if line.split('==')[0].lower() in wanted)}")
    runs: dict[str, list[dict[str, float]]] = {reader: [] for reader in readers}
    for _ in range(args.repeat):
        for reader, python in readers.items():
            wait_for_idle(args.wait_idle)
            runs[reader].append(run_reader(python, reader, root))
    steady = {reader: summarize(reader, results) for reader, results in runs.items()}
    ours_name = max(("tfrbeam-threads", "tfrbeam-processes"), key=lambda name: steady[name].median)
    ours = steady[ours_name]
    verdict = "meets" if ours.median >= TARGET_RECORDS_PER_SECOND else "misses"
    print(f"ours ({ours_name}): median {ours.median:,.0f} records/s steady — {verdict} the "
          f"{TARGET_RECORDS_PER_SECOND:,} records/s target")
    for baseline in ("tf.data", "tfrecord"):
        if baseline in steady:
            print(f"ratio {ours_name} / {baseline}: steady state {ratio(ours, steady[baseline])}")
        else:
            print(f"{baseline}: not run (pass --with-{'tf' if baseline == 'tf.data' else 'tfrecord'})")
    resume_seconds = time_resume(root, 10_000, args.rows // 2048)
    print(f"resume half way through an epoch ({args.rows // 2048} batches in): first batch {resume_seconds:.2f} s "
          "after load_state_dict")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
