"""Benchmark: the whole dataset build against the typical Beam job, Parquet and CSV, as separate processes.

Run by hand from the repository root (the machine may be shared; the median and range of
--repeats runs are reported, the baseline's and ours interleaved run by run):

    python -m benchmarks.build [--rows 1000000] [--repeats 3] [--formats parquet,csv]
                               [--piece-store auto,memory,spill,inline] [--baseline-rows N] [--ours-only]
                               [--workers 2] [--external-pool]

Ours: `python -m tfrbeam.builder` on the benchmark table (benchmarks/table.py) written as
Parquet and as CSV: shuffled (seed 0), one split, 8 shards, the default runner, the whole
process timed (interpreter start, pipeline construction, run, manifest) with its peak RSS; once
per piece store asked for. Baseline, in the same run and on the same rows: `beam.io.ReadFromParquet`
(CSV: `ReadFromText` + the csv module) -> one Example per row built with the generated protobuf
classes -> `beam.Reshuffle()` -> `beam.io.WriteToTFRecord(num_shards=8)`, on the same runner as ours. --baseline-rows runs the
baseline on fewer rows for a quick look: its fixed start-up is then spread over fewer rows, so the
ratio comes out higher than it is. --ours-only skips the baseline (peak RSS at 5M rows, say).

--workers N also runs ours with `--workers N` (N SDK worker processes of the FnApiRunner's
multi_processing mode; docs/runners.md), and --external-pool runs ours (with the inline
piece store, what `auto` picks on Dataflow, and with the spill store, what it picks on this runner)
and the baseline on the path Dataflow runs:
`--runner PortableRunner --job_endpoint embed --environment_type EXTERNAL` with a
`worker_pool_main` pool of SDK worker processes
(benchmarks/dataflow_path.py measures their CPU from /proc). Each of ours' lines beyond the first
says its rows/s and CPU per row against ours in process, in the same repeat. With --workers N each
repeat also starts N in-process builds of the same rows at once, independent processes passing
nothing between them: their rows/s together, over one build's alone, is the most N busy cores of
this machine give for today's per-row work (cores slow each other down: shared caches, memory
bandwidth, the host), so the ceiling for N workers, printed beside what they reached.

CPU beyond the fixed cost: with --workers N and --external-pool each repeat also builds the one-row file on
that path, and each path's line says its CPU per row beyond its own one-row build over ours in process beyond
its one-row build, in all and split into user and system (kernel) CPU: what the rows cost apart from what a
second process costs once (an interpreter, Beam's import). The run starts by measuring this machine's kernel:
the system CPU of writing 512 MB to a new file into pages freed a moment before, and into pages freed 20 s
before. On a virtual machine whose host takes back the guest's free memory, the second costs several times the
first, and every build pays that on the bytes it writes and the memory it first touches (docs/performance.md).

The bound: each repeat also builds a one-row file of the same table (the build's fixed cost:
interpreter and Beam start-up, planning, starting the runner, the commit). Its wall time plus
ours' CPU seconds beyond its own, spread perfectly over the machine's cores with no overhead,
is the shortest this code's work could take here: no parallel runner or pool can make it
faster, only doing less work. The baseline's time over that is the highest ratio the current
code allows on this machine.
"""

from __future__ import annotations

import argparse
import csv
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

from benchmarks.timing import process_cpu

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
NUM_SHARDS = 8
# --external-pool runs ours with each: inline is what `auto` picks on Dataflow, spill what it picks on this runner.
POOL_STORES = ("inline", "spill")


def write_inputs(rows: int, directory: pathlib.Path) -> dict[str, pathlib.Path]:
    """The benchmark table as one Parquet file (row groups of 131072) and one CSV file (emb as ';'-joined text)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from benchmarks.table import make_benchmark_table, write_parquet

    table = make_benchmark_table(rows)
    parquet_path = directory / "table.parquet"
    write_parquet(table, parquet_path, row_group_size=131072)
    emb_text = pc.binary_join(pc.cast(table.column("emb"), pa.list_(pa.string())), ";")
    csv_table = table.set_column(table.schema.get_field_index("emb"), "emb", emb_text)
    csv_path = directory / "table.csv"
    pacsv.write_csv(csv_table, csv_path, pacsv.WriteOptions(quoting_style="needed"))
    return {"parquet": parquet_path, "csv": csv_path}


def build_config(fmt: str, input_path: pathlib.Path, output_path: pathlib.Path) -> dict:
    """Our config: every column (CSV: declared, emb split on ';'), shuffled, 8 shards, one split."""
    config = {
        "input": {"format": fmt, "path": str(input_path)},
        "shuffle": {"enabled": True, "seed": 0},
        "output": {"path": str(output_path), "num_shards": NUM_SHARDS},
    }
    if fmt == "csv":
        features = {f"i{i}": {"type": "int64"} for i in range(8)}
        features.update({f"f{i}": {"type": "float"} for i in range(8)})
        features.update({"s0": {"type": "bytes"}, "s1": {"type": "bytes"},
                         "emb": {"type": "float", "separator": ";", "length": 16},
                         "n0": {"type": "int64", "on_null": "omit"}})
        config["features"] = features
        config["input"]["csv"] = {"null_values": [""]}
    return config


def run_measured(command: list[str]) -> tuple[float, int, float, float]:
    """Run a command; its wall time, peak RSS in bytes, CPU seconds (user + system) and system CPU seconds alone
    (from wait4's rusage)."""
    return run_measured_with_own_cpu(command)[:4]


def run_measured_with_own_cpu(command: list[str]) -> tuple[float, int, float, float, float]:
    """``run_measured``, and the CPU seconds the command's process spent itself, its children apart (a build's
    launcher without its workers): its last reading in /proc, taken every 20 ms until it exits."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    own = _OwnCpu(process.pid)
    own.start()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    own.join()
    stderr = process.stderr.read().decode("utf-8", "replace")
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, usage.ru_stime, own.seconds


class _OwnCpu(threading.Thread):
    """Reads one process's own CPU seconds (``process_cpu``: its threads, not its children) until it is gone: a
    build's launcher without its workers, to the last 20 ms."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self._pid, self.seconds = pid, 0.0

    def run(self) -> None:
        while True:
            try:
                self.seconds = process_cpu(self._pid)[0]
            except (OSError, IndexError, ValueError):
                return
            time.sleep(0.02)


def compile_bytecode() -> None:
    """Write the package's bytecode once, before any timed run, as installing it from a wheel does.

    An installed tfrbeam (and Beam) imports cached bytecode. A checkout under
    PYTHONDONTWRITEBYTECODE=1 (this machine sets it) would instead compile every tfrbeam module in
    every measured process, ~0.2 s that no installed user pays, in ours and in the baseline's
    import of tfrbeam.codec.protos alike.
    """
    import compileall

    for package in ("tfrbeam", "benchmarks"):
        compileall.compile_dir(str(REPO_ROOT / package), quiet=1)


def _ours_command(fmt: str, input_path: pathlib.Path, work: pathlib.Path, name: str, workers: int = 1,
                  piece_store: str = "auto") -> tuple[list[str], pathlib.Path]:
    """The command of one of ours' builds into ``work/name`` (emptied first), and that output directory."""
    output = work / name
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / f"{name}.json"  # JSON is YAML
    config_path.write_text(json.dumps(build_config(fmt, input_path, output)))
    command = [sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet", f"--piece_store={piece_store}"]
    if workers > 1:
        command.append(f"--workers={workers}")  # tfrbeam's option: Beam's multi_processing workers
    return command, output


def run_ours(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int = 1,
             piece_store: str = "auto") -> tuple[float, int, float, int, float, float]:
    """Ours on ``input_path``: wall s, peak RSS, CPU s, output bytes, system CPU s and the launching process's own CPU s."""
    command, output = _ours_command(fmt, input_path, work, f"ours-{fmt}", workers, piece_store)
    seconds, rss, cpu, system, launcher = run_measured_with_own_cpu(command)
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    size = sum(split["num_bytes"] for split in manifest["splits"].values())
    return seconds, rss, cpu, size, system, launcher


def run_side_by_side(fmt: str, input_path: pathlib.Path, work: pathlib.Path, copies: int) -> tuple[float, int, float, int]:
    """``copies`` in-process builds of the same rows started at once: wall until the last ends, largest peak, CPU of all.

    Independent processes with nothing passed between them: what ``copies`` busy cores of this machine do
    for today's per-row work. No scheme of ``copies`` workers over the same rows can beat their rows/s.
    """
    commands = [_ours_command(fmt, input_path, work, f"side-{fmt}-{copy}")[0] for copy in range(copies)]
    started = time.perf_counter()
    logs = [work / f"side-{fmt}-{copy}.log" for copy in range(copies)]
    processes = []
    for command, log in zip(commands, logs):
        with log.open("wb") as stderr:  # a file, not a pipe: no build waits on a full pipe while another is awaited
            processes.append(subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr))
    peak, cpu = 0, 0.0
    for process, log in zip(processes, logs):
        _, status, usage = os.wait4(process.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"a side-by-side build failed:\n{log.read_text(errors='replace')[-3000:]}")
        peak, cpu = max(peak, usage.ru_maxrss * 1024), cpu + usage.ru_utime + usage.ru_stime
    return time.perf_counter() - started, peak, cpu, copies


def run_baseline(fmt: str, input_path: pathlib.Path, work: pathlib.Path, rows: int) -> tuple[float, int, float, float]:
    output = work / f"baseline-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    source = work / f"baseline-input-{rows}.{ 'parquet' if fmt == 'parquet' else 'csv'}"
    if not source.exists():
        _head_in_child(fmt, input_path, source, rows)
    return run_measured([sys.executable, __file__, "--baseline-job", fmt, str(source), str(output / "part")])


def one_row_input(fmt: str, input_path: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """The first row of the table alone, as a file of ``fmt`` (written once)."""
    one_row = work / f"one-row.{'parquet' if fmt == 'parquet' else 'csv'}"
    if not one_row.exists():
        _head_in_child(fmt, input_path, one_row, 1)
    return one_row


def run_fixed_cost(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int = 1,
                   piece_store: str = "auto") -> tuple[float, int, float, int, float, float]:
    """Ours on the first row only: the build's fixed cost (start-up, planning, runner, commit), whole process."""
    return run_ours(fmt, one_row_input(fmt, input_path, work), work, workers, piece_store)


def _head_in_child(fmt: str, input_path: pathlib.Path, target: pathlib.Path, rows: int) -> None:
    """``_head`` in a child process: Linux keeps a process's peak RSS across fork and exec, so reading the
    table here would pass its size on to every run measured after it."""
    subprocess.run([sys.executable, __file__, "--head", fmt, str(input_path), str(target), str(rows)], check=True)


def _head(fmt: str, input_path: pathlib.Path, target: pathlib.Path, rows: int) -> None:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        from benchmarks.table import write_parquet

        write_parquet(pq.read_table(input_path).slice(0, rows), target)
        return
    with open(input_path, encoding="utf-8") as source, open(target, "w", encoding="utf-8") as out:
        for index, line in enumerate(source):
            if index > rows:
                break
            out.write(line)


# ----------------------------------------------------------------------------- the baseline job


def _example_from_row(row: dict) -> bytes:
    from tfrbeam.codec.protos import example_pb2

    example = example_pb2.Example()
    feature = example.features.feature
    for name, value in row.items():
        if value is None or value == "":
            continue
        if name.startswith("i") or name == "n0":
            feature[name].int64_list.value.append(int(value))
        elif name.startswith("f"):
            feature[name].float_list.value.append(float(value))
        elif name == "emb":
            items = value if isinstance(value, list) else [float(item) for item in value.split(";")]
            feature[name].float_list.value.extend(items)
        else:
            feature[name].bytes_list.value.append(value.encode("utf-8") if isinstance(value, str) else value)
    return example.SerializeToString()


def _csv_row(line: str, names: list[str]) -> dict:
    return dict(zip(names, next(csv.reader([line]))))


def baseline_job(fmt: str, input_path: str, output_prefix: str, runner_args: list[str] | None = None) -> None:
    """The typical Beam job: read rows, build each Example with protobuf classes, Reshuffle, WriteToTFRecord.

    ``runner_args``: Beam options of the runner to run it on (default: the FnApiRunner, as ours).
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    # The runner ours uses by default (the DirectRunner would first spend seconds trying Prism offline).
    with beam.Pipeline(options=PipelineOptions(runner_args or ["--runner=FnApiRunner"])) as pipeline:
        if fmt == "parquet":
            rows = pipeline | beam.io.ReadFromParquet(input_path)
        else:
            with open(input_path, encoding="utf-8") as handle:
                names = next(csv.reader([handle.readline()]))
            rows = pipeline | beam.io.ReadFromText(input_path, skip_header_lines=1) | beam.Map(_csv_row, names)
        _ = (
            rows
            | beam.Map(_example_from_row)
            | beam.Reshuffle()
            | beam.io.WriteToTFRecord(output_prefix, num_shards=NUM_SHARDS)
        )


# ------------------------------------------------------------------------------------------ main


def _spread(values: list[float]) -> str:
    """Median and range of rows/s figures: ``median (min-max)``."""
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--baseline-rows", type=int, default=None,
                        help="run the baseline on the first N rows only (default: all --rows); fewer rows inflate the ratio")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="parquet,csv")
    parser.add_argument("--piece-store", default="auto", help="comma-separated piece stores to run ours with")
    parser.add_argument("--ours-only", action="store_true", help="skip the baseline (e.g. peak RSS of a 5M-row build)")
    parser.add_argument("--workers", type=int, default=1,
                        help="also run ours with --workers N (N SDK worker processes of the FnApiRunner; CPU and RSS "
                        "of the main process and its workers together)")
    parser.add_argument("--external-pool", action="store_true",
                        help="also run ours (inline and spill piece stores) and the baseline on the PortableRunner with an "
                        "EXTERNAL pool of --workers SDK worker processes, as Dataflow runs them")
    parser.add_argument("--work-dir", default=None, help="keep inputs and outputs here (default: a temp dir)")
    parser.add_argument("--baseline-job", nargs=3, metavar=("FORMAT", "INPUT", "OUTPUT_PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--write-inputs", nargs=2, metavar=("ROWS", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--head", nargs=4, metavar=("FORMAT", "INPUT", "TARGET", "ROWS"), help=argparse.SUPPRESS)
    parser.add_argument("--page-probe", metavar="DIR", help=argparse.SUPPRESS)
    args, runner_args = parser.parse_known_args()
    if runner_args and not args.baseline_job:
        parser.error(f"unrecognized arguments: {' '.join(runner_args)}")
    if args.baseline_job:
        baseline_job(*args.baseline_job, runner_args)
        return
    if args.write_inputs:
        write_inputs(int(args.write_inputs[0]), pathlib.Path(args.write_inputs[1]))
        return
    if args.head:
        _head(args.head[0], pathlib.Path(args.head[1]), pathlib.Path(args.head[2]), int(args.head[3]))
        return
    if args.page_probe:
        print(page_probe(pathlib.Path(args.page_probe)))
        return
    baseline_rows = args.rows if args.baseline_rows is None else min(args.baseline_rows, args.rows)
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-build-"))
    work.mkdir(parents=True, exist_ok=True)
    # In a child process: Linux keeps a process's peak RSS across exec, so a parent holding the
    # table would pass its size on to every measured child.
    subprocess.run([sys.executable, __file__, "--write-inputs", str(args.rows), str(work)], check=True)
    inputs = {"parquet": work / "table.parquet", "csv": work / "table.csv"}
    compile_bytecode()
    print(f"{args.rows:,} rows; median (range) of {args.repeats} runs each; shared 2-core machine")
    probe = subprocess.run([sys.executable, __file__, "--page-probe", str(work)], check=True, capture_output=True, text=True)
    print(probe.stdout.strip())
    if not args.ours_only and baseline_rows < args.rows:
        print(f"NOTE: the baseline runs on the first {baseline_rows:,} rows only: its fixed start-up is spread over "
              "fewer rows, which INFLATES the ratio; leave out --baseline-rows for the real figure")
    print("rows/s by wall clock (and by CPU second of the process, fairer when other work shares the cores)")
    stores = args.piece_store.split(",")
    for fmt in args.formats.split(","):
        # Interleaved (baseline, then each of ours, per repeat): a machine whose speed drifts during
        # the run then moves both sides alike instead of the ratio.
        base: list = []
        fixed: list = []
        fixed_workers: list = []
        side_by_side: list = []
        ours: dict[tuple[str, int], list] = {(store, workers): [] for store in stores
                                             for workers in sorted({1, args.workers})}
        pool: dict[str, list] = {**{f"ours {store}": [] for store in POOL_STORES}, "baseline": []}
        pool_fixed: dict[str, list] = {store: [] for store in POOL_STORES}
        for repeat in range(args.repeats):
            if not args.ours_only:
                base.append(run_baseline(fmt, inputs[fmt], work, baseline_rows))
            for store, workers in ours:
                ours[store, workers].append(run_ours(fmt, inputs[fmt], work, workers, store))
            fixed.append(run_fixed_cost(fmt, inputs[fmt], work))
            if args.workers > 1:
                fixed_workers.append(run_fixed_cost(fmt, inputs[fmt], work, args.workers, stores[0]))
                side_by_side.append(run_side_by_side(fmt, inputs[fmt], work, args.workers))
            if args.external_pool:
                one_row = one_row_input(fmt, inputs[fmt], work)
                for store in POOL_STORES:
                    pool[f"ours {store}"].append(run_ours_on_pool(fmt, inputs[fmt], work, args.workers, repeat, store))
                    pool_fixed[store].append(run_ours_on_pool(fmt, one_row, work, args.workers, repeat, store, "one-row"))
                if not args.ours_only:
                    pool["baseline"].append(run_baseline_on_pool(fmt, inputs[fmt], work, args.workers, repeat))
        base_wall = base_cpu = None
        if base:
            base_wall = [baseline_rows / run[0] for run in base]
            base_cpu = [baseline_rows / run[2] for run in base]
            print(f"{fmt:<8} baseline ({baseline_rows:,} rows): wall {_spread(base_wall)}  cpu {_spread(base_cpu)}  "
                  f"peak RSS {statistics.median(run[1] for run in base) / 2**20:,.0f} MB", flush=True)
        in_process = ours[stores[0], 1]
        for (store, workers), runs in ours.items():
            label = f"ours, {store}" + (f", {workers} workers" if workers > 1 else "")
            _report(fmt, label, args.rows, runs, base_wall, base_cpu)
            if (store, workers) != (stores[0], 1):
                print(f"{fmt:<8}   {label} / ours in process: {_against(runs, in_process)}", flush=True)
            if (store, workers) == (stores[0], args.workers) and workers > 1:
                print(f"{fmt:<8}   {label} / ours in process, {beyond_fixed(runs, fixed_workers, in_process, fixed)}",
                      flush=True)
        if args.external_pool:
            _report_pool(fmt, args.rows, args.workers, pool, in_process, pool_fixed, fixed)
        if args.workers > 1:
            print(f"{fmt:<8} {describe_side_by_side(side_by_side, in_process, ours[stores[0], args.workers])}",
                  flush=True)
        print(f"{fmt:<8} {describe_bound(ours[stores[0], 1], fixed, [run[0] * args.rows / baseline_rows for run in base])}",
              flush=True)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


def _report(fmt: str, label: str, rows: int, runs: list, base_wall: list[float] | None, base_cpu: list[float] | None) -> None:
    wall = [rows / run[0] for run in runs]
    cpu = [rows / run[2] for run in runs]
    line = (
        f"{fmt:<8} {label}: wall {_spread(wall)}  cpu {_spread(cpu)}  "
        f"peak RSS {statistics.median(run[1] for run in runs) / 2**20:,.0f} MB (max {max(run[1] for run in runs) / 2**20:,.0f})  "
        f"output {runs[0][3] / 2**20:,.0f} MB"
    )
    if base_wall:
        line += (f"  ratio of medians: wall {statistics.median(wall) / statistics.median(base_wall):.1f}x, "
                 f"cpu {statistics.median(cpu) / statistics.median(base_cpu):.1f}x")
    print(line, flush=True)


def _cpu_and_system(run: tuple | dict) -> tuple[float, float]:
    """A run's CPU seconds (user + system) and system CPU seconds: a local run's tuple or a pool job's dict."""
    if isinstance(run, dict):
        return run["launcher_cpu"] + run["workers_cpu"], run["system_cpu"]
    return run[2], run[4]


def beyond_fixed(runs: list, fixed: list, in_process: list, fixed_in_process: list) -> str:
    """CPU per row beyond each path's own one-row build, over ours in process beyond its one-row build, repeat by repeat.

    What the rows cost, without what a second process costs once (its interpreter, Beam's import), split into
    user and system (kernel) CPU: this machine's kernel charges for memory it first touches (see page_probe).
    """
    shares: dict[str, list[float]] = {"all": [], "user": [], "system": []}
    for run, one, reference, reference_one in zip(runs, fixed, in_process, fixed_in_process):
        cpu, system = (a - b for a, b in zip(_cpu_and_system(run), _cpu_and_system(one)))
        reference_cpu, reference_system = (a - b for a, b in zip(_cpu_and_system(reference), _cpu_and_system(reference_one)))
        shares["all"].append(cpu / reference_cpu)
        shares["user"].append((cpu - system) / (reference_cpu - reference_system))
        shares["system"].append(system / reference_system)
    cells = [f"{name} {statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"
             for name, values in shares.items()]
    return "CPU per row beyond each one's one-row build: " + ", ".join(cells)


def page_probe(directory: pathlib.Path, megabytes: int = 512, idle_seconds: float = 20.0) -> str:
    """The kernel CPU this machine spends writing ``megabytes`` to a new file into pages freed a moment before, and
    into pages freed ``idle_seconds`` before.

    A virtual machine whose host takes back the guest's free memory (a balloon device's free page reporting)
    charges the second far more than the first, and every build pays that on the bytes it writes (shards,
    spill files) and on the memory it first touches.
    """
    import resource

    block = os.urandom(4 << 20)
    path = directory / "page-probe.bin"

    def write_new_file() -> float:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        with open(path, "wb") as out:
            for _ in range(megabytes // 4):
                out.write(block)
        seconds = resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
        path.unlink()
        return seconds

    write_new_file()  # frees its pages a moment before the next write
    warm = write_new_file()
    time.sleep(idle_seconds)
    cold = write_new_file()
    return (f"this machine's kernel: writing {megabytes} MB to a new file took {warm:.2f} s of system CPU into pages "
            f"freed a moment before, {cold:.2f} s into pages freed {idle_seconds:.0f} s before")


def _against(runs: list, in_process: list) -> str:
    """Rows/s and CPU per row of ``runs`` over ours' in process, repeat by repeat (median and range)."""
    speed = [one[0] / run[0] for run, one in zip(runs, in_process)]
    cpu = [run[2] / one[2] for run, one in zip(runs, in_process)]
    return (f"rows/s {statistics.median(speed):.2f}x ({min(speed):.2f}-{max(speed):.2f}), "
            f"CPU per row {statistics.median(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f})")


def run_ours_on_pool(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int, repeat: int,
                     store: str, label: str = "") -> dict:
    """Ours with piece store ``store`` on the PortableRunner and an EXTERNAL pool (benchmarks/dataflow_path.py)."""
    from benchmarks.dataflow_path import run_job

    output = work / f"pool-ours-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    config_path = work / f"pool-ours-{fmt}.json"
    config_path.write_text(json.dumps(build_config(fmt, input_path, output)))
    run = run_job([sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet", f"--piece_store={store}"],
                  work, f"ours-{store}-{fmt}-{repeat}{'-' + label if label else ''}", workers)
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
    run["shuffled_per_row"] = manifest["run"]["shuffled_bytes"] / manifest["rows_read"]
    return run


def run_baseline_on_pool(fmt: str, input_path: pathlib.Path, work: pathlib.Path, workers: int, repeat: int) -> dict:
    """The baseline job on the same PortableRunner and pool as ``run_ours_on_pool``, on the same rows."""
    from benchmarks.dataflow_path import run_job

    output = work / f"pool-baseline-{fmt}"
    shutil.rmtree(output, ignore_errors=True)
    return run_job([sys.executable, __file__, "--baseline-job", fmt, str(input_path), str(output / "part")],
                   work, f"baseline-{fmt}-{repeat}", workers)


def _report_pool(fmt: str, rows: int, workers: int, pool: dict[str, list], in_process: list,
                 pool_fixed: dict[str, list], fixed: list) -> None:
    """The pool runs' lines, ours' CPU per row against the baseline's on the pool and against ours in process
    (also beyond each path's one-row build)."""
    from benchmarks.dataflow_path import report_pool_runs

    print(f"{fmt:<8} PortableRunner, EXTERNAL pool ({workers} SDK workers asked for):", flush=True)
    figures = {}
    for store in POOL_STORES:
        runs = pool[f"ours {store}"]
        figures[store] = report_pool_runs(f"{fmt:<8}   ours {store}", runs, rows)
        per_row = [(run["launcher_cpu"] + run["workers_cpu"]) / one[2] for run, one in zip(runs, in_process)]
        speed = [one[0] / run["wall"] for run, one in zip(runs, in_process)]
        print(f"{fmt:<8}   ours {store} on the pool / ours in process: CPU per row {statistics.median(per_row):.2f}x "
              f"({min(per_row):.2f}-{max(per_row):.2f}), rows/s {statistics.median(speed):.2f}x "
              f"({min(speed):.2f}-{max(speed):.2f})", flush=True)
        print(f"{fmt:<8}   ours {store} on the pool / ours in process, "
              f"{beyond_fixed(runs, pool_fixed[store], in_process, fixed)}", flush=True)
    if pool["baseline"]:
        base = report_pool_runs(f"{fmt:<8}   baseline", pool["baseline"], rows)
        for store, figure in figures.items():
            print(f"{fmt:<8}   ours {store} / baseline on the pool, CPU per row: "
                  f"{figure['cpu_per_million'] / base['cpu_per_million']:.2f}x", flush=True)


def describe_side_by_side(side_by_side: list, in_process: list, with_workers: list) -> str:
    """The ceiling that ``copies`` independent builds at once set, against ours in process and ours on workers.

    Per repeat: the copies' rows/s together (each built all ``rows``) over the in-process build's, and the
    workers' rows/s over the same in-process build's; medians and ranges.
    """
    copies = side_by_side[0][3]
    ceiling = [copies * one[0] / run[0] for run, one in zip(side_by_side, in_process)]
    reached = [one[0] / run[0] for run, one in zip(with_workers, in_process)]
    cpu = [run[2] / (copies * one[2]) for run, one in zip(side_by_side, in_process)]
    return (f"{copies} in-process builds at once (the most {copies} busy cores give for today's per-row work): "
            f"{statistics.median(ceiling):.2f}x ({min(ceiling):.2f}-{max(ceiling):.2f}) the rows/s of one alone, each at "
            f"{statistics.median(cpu):.2f}x its CPU per row; {copies} workers reached {statistics.median(reached):.2f}x "
            f"({min(reached):.2f}-{max(reached):.2f}) = {statistics.median(reached) / statistics.median(ceiling):.0%} "
            "of that ceiling")


def describe_bound(runs: list, fixed: list, base_seconds: list[float]) -> str:
    """The fixed cost and the shortest time this code's per-row CPU allows on this machine's cores (see the docstring).

    ``runs`` and ``fixed`` are (wall s, peak RSS, cpu s, ...) of ours on every row and on one row, repeat by
    repeat (as are ``base_seconds``, the baseline's): each repeat gives a bound, reported as median (range).
    """
    cores = len(os.sched_getaffinity(0))
    per_row = [run[2] - one[2] for run, one in zip(runs, fixed)]
    bounds = [one[0] + cpu / cores for one, cpu in zip(fixed, per_row)]
    line = (f"fixed cost (a one-row build): wall {_seconds([one[0] for one in fixed])}, "
            f"cpu {_seconds([one[2] for one in fixed])}; ours' per-row cpu {_seconds(per_row)}; "
            f"on {cores} cores at best fixed wall + per-row cpu / {cores} = {_seconds(bounds)}")
    if base_seconds:
        ratios = [base / bound for base, bound in zip(base_seconds, bounds)]
        line += (f" = at most {statistics.median(ratios):.1f}x the baseline "
                 f"({min(ratios):.1f}-{max(ratios):.1f}x)")
    return line


def _seconds(values: list[float]) -> str:
    """Median and range of seconds: ``1.23 s (1.20-1.31)``."""
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
