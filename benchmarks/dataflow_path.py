"""Benchmark: the build as Dataflow runs it, on this machine: a PortableRunner job on an EXTERNAL pool of SDK workers.

Run by hand from the repository root (nothing else running: the workers' CPU is read from /proc):

    python -m benchmarks.dataflow_path [--rows 3000000] [--repeats 1] [--ours-only] [--piece-store inline,spill]

Each run starts Beam's ``worker_pool_main`` (an EXTERNAL environment: every SDK worker a separate
``python`` process, as on Dataflow's VMs), runs one job on ``--runner PortableRunner --job_endpoint
embed --environment_type EXTERNAL --direct_num_workers N`` and stops the pool. Beam 2.77's embedded
job server asks the pool for one SDK worker process whatever N (``--direct_num_workers``,
``--sdk_worker_parallelism`` and ``--direct_running_mode`` tried); "workers started" in the report
counts them from the pool's log, so the figures are per SDK worker process, as on one Dataflow core. Ours is
``python -m tfrbeam.builder`` on the benchmark table (benchmarks/table.py) as one Parquet file
(shuffled, one split, 8 shards) with each piece store of --piece-store in turn, on the same pool and
rows: inline (the one ``auto`` picks on Dataflow: the frames travel through the runner's GroupByKey)
and spill (the one ``auto`` picks on this runner: the frames wait in files under the staging
directory, 12 bytes a record cross the runner). The baseline, unless --ours-only, is the
typical Beam job of ``benchmarks.build`` (ReadFromParquet -> protobuf per row -> Reshuffle ->
WriteToTFRecord) on the same runner, pool and rows.

Reported per job, median (range) over --repeats runs:
- CPU-seconds per million rows: the launching process (its rusage; it hosts the job server, which
  carries every element between stages) plus the pool and every SDK worker it started (utime + stime from
  /proc, sampled every 0.1 s: a worker's last 0.1 s before it exits can be missed);
- peak RSS of the launcher and of the largest SDK worker (VmHWM from /proc);
- ours' bytes shuffled per row: the manifest's ``shuffled_bytes`` (both crossings of the runner: the pieces
  into the routing stage and the slices to the shard writers; the inline store's frames compressed);
- and, projected from the inline store's figures (labelled as such), CPU-hours and shuffle GB per billion rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import REPO_ROOT, baseline_job, build_config, compile_bytecode
from benchmarks.timing import process_cpu
from tests.worker_pool import external_worker_pool


class _Sampler:
    """Samples the CPU seconds (all, and system alone) and peak RSS of every descendant of a process but one, every
    0.1 s, in a thread."""

    def __init__(self, root: int):
        self._root = root
        self.skip: set[int] = set()
        self.cpu: dict[int, float] = {}
        self.system: dict[int, float] = {}
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._descendants():
                if pid not in self.skip:
                    self._sample(pid)
            self._stop.wait(0.1)

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
                    parent = int(stat.rsplit(")", 1)[1].split()[1])
                    children.setdefault(parent, []).append(int(entry))
        found, todo = [], list(children.get(self._root, []))
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found

    def _sample(self, pid: int) -> None:
        with contextlib.suppress(OSError, IndexError, ValueError):
            self.cpu[pid], self.system[pid] = process_cpu(pid)
            for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak[pid] = max(self.peak.get(pid, 0), int(line.split()[1]) * 1024)


def _portable_args(address: str, workers: int) -> list[str]:
    return ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
            f"--environment_config={address}", f"--direct_num_workers={workers}"]


def run_job(command: list[str], work: pathlib.Path, name: str, workers: int = 2) -> dict:
    """One job on a fresh pool: wall s, launcher CPU s and peak, workers' CPU s and the largest worker's peak."""
    with external_worker_pool(work / f"pool-{name}.log") as (address, _log):
        started = time.perf_counter()
        # The pool and its SDK workers are this process's descendants; the launcher's CPU comes from its rusage.
        with _Sampler(os.getpid()) as sampler:
            process = subprocess.Popen([*command, *_portable_args(address, workers)], cwd=REPO_ROOT,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            sampler.skip.add(process.pid)
            _, status, usage = os.wait4(process.pid, 0)
        for samples in (sampler.cpu, sampler.system, sampler.peak):
            samples.pop(process.pid, None)  # sampled before it was skipped; its rusage counts it
        seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode("utf-8", "replace") if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-3000:]}")
    log = (work / f"pool-{name}.log").read_text(errors="replace")
    return {"wall": seconds, "launcher_cpu": usage.ru_utime + usage.ru_stime, "launcher_peak": usage.ru_maxrss * 1024,
            "workers_cpu": sum(sampler.cpu.values()), "worker_peak": max(sampler.peak.values(), default=0),
            "system_cpu": usage.ru_stime + sum(sampler.system.values()),
            "workers_started": log.count("Starting worker with command")}


def _spread(values: list[float], fmt: str = ",.2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report_pool_runs(label: str, runs: list[dict], rows: int) -> dict:
    """Prints one job's runs on the pool (median and range); returns its median CPU-s per million rows and B/row shuffled."""
    per_million = [(run["launcher_cpu"] + run["workers_cpu"]) / rows * 1e6 for run in runs]
    launcher = _spread([run["launcher_cpu"] / rows * 1e6 for run in runs])
    workers = _spread([run["workers_cpu"] / rows * 1e6 for run in runs])
    rate = _spread([rows / run["wall"] for run in runs], ",.0f")
    launcher_peak = statistics.median(run["launcher_peak"] for run in runs) / 2**20
    worker_peak = statistics.median(run["worker_peak"] for run in runs) / 2**20
    line = (f"{label:<12} wall {_spread([run['wall'] for run in runs])} s  rows/s {rate}  CPU-s per million rows "
            f"{_spread(per_million)} (launcher {launcher}, workers {workers})  peak RSS: launcher "
            f"{launcher_peak:,.0f} MB, largest worker {worker_peak:,.0f} MB  workers started "
            f"{sorted({run['workers_started'] for run in runs})}")
    if "shuffled_per_row" in runs[0]:
        line += f"  shuffled {_spread([run['shuffled_per_row'] for run in runs], ',.0f')} B/row"
    print(line, flush=True)
    return {"cpu_per_million": statistics.median(per_million),
            "shuffled_per_row": statistics.median(run.get("shuffled_per_row", 0) for run in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--piece-store", default="inline,spill", help="piece stores to run ours with, comma-separated")
    parser.add_argument("--ours-only", action="store_true")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--table", nargs=2, metavar=("ROWS", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--baseline-job", nargs=2, metavar=("INPUT", "OUTPUT_PREFIX"), help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.table:
        from benchmarks.table import make_benchmark_table, write_parquet

        write_parquet(make_benchmark_table(int(args.table[0])), pathlib.Path(args.table[1]), row_group_size=131072)
        return
    if args.baseline_job:
        baseline_job("parquet", args.baseline_job[0], args.baseline_job[1], rest)
        return
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-dataflow-path-"))
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table.parquet"
    if not table.exists():
        subprocess.run([sys.executable, __file__, "--table", str(args.rows), str(table)], check=True)
    compile_bytecode()
    output, config = work / "ours", work / "ours.json"
    config.write_text(json.dumps(build_config("parquet", table, output)))
    stores = args.piece_store.split(",")
    ours: dict[str, list[dict]] = {store: [] for store in stores}
    baseline: list[dict] = []
    for repeat in range(args.repeats):
        for store in stores:  # interleaved, so the machine's drift falls on every store alike
            shutil.rmtree(output, ignore_errors=True)
            run = run_job([sys.executable, "-m", "tfrbeam.builder", str(config), "--quiet", f"--piece_store={store}"],
                          work, f"ours-{store}-{repeat}", args.workers)
            manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
            run["shuffled_per_row"] = manifest["run"]["shuffled_bytes"] / manifest["rows_read"]
            ours[store].append(run)
        if not args.ours_only:
            shutil.rmtree(work / "baseline", ignore_errors=True)
            baseline.append(run_job([sys.executable, __file__, "--baseline-job", str(table), str(work / "baseline" / "part")],
                                    work, f"baseline-{repeat}", args.workers))
    print(f"{args.rows:,} rows of Parquet; PortableRunner, EXTERNAL pool, {args.workers} SDK workers; median (range) of "
          f"{args.repeats} run(s)")
    figures = {store: report_pool_runs(f"ours {store}", runs, args.rows) for store, runs in ours.items()}
    if baseline:
        base = report_pool_runs("baseline", baseline, args.rows)
        for store, figure in figures.items():
            print(f"ours {store} / baseline, CPU per row: {figure['cpu_per_million'] / base['cpu_per_million']:.2f}x")
    if "inline" in figures:
        inline = figures["inline"]
        print(f"projected from the inline store's figures (not measured at that size): per billion rows "
              f"{inline['cpu_per_million'] * 1000 / 3600:,.1f} CPU-hours and {inline['shuffled_per_row']:,.0f} GB shuffled")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
