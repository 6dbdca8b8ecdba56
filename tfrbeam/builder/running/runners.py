"""Which runner a build runs on, what that means for where its workers are, and the piece store that fits.

The default runner (``DEFAULT_RUNNER``) is Beam's FnApiRunner, in this process: the engine the
DirectRunner itself falls back to, without the DirectRunner's first attempt to start Prism
(since Beam 2.68 it downloads a Prism binary when the machine is online, and waits and falls back
when it is not), so a build runs the same way on every machine. ``--piece_store`` (a pipeline
option, ``auto`` by default) chooses where the shuffle's pieces wait (``tfrbeam.builder.shuffle``).
"""

from __future__ import annotations

import dataclasses
import logging
import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, PortableOptions, StandardOptions

from tfrbeam.builder.config import parse_size
from tfrbeam.builder.shuffle import INLINE, MEMORY, PIECE_STORES, SPILL
from tfrbeam.errors import ConfigError

__all__ = [
    "AUTO", "DEFAULT_RUNNER", "IN_PROCESS", "PieceStoreOptions", "Prediction", "ScalingModel", "WorkerChoice",
    "WorkerCountOptions", "apply_workers",
    "choose_piece_store", "choose_workers", "held_piece_budget", "predicted_worker_gain", "runner_name", "uses_local_workers",
    "workers_as_given", "workers_share_this_process",
]

_LOG = logging.getLogger(__name__)

DEFAULT_RUNNER = "FnApiRunner"
AUTO = "auto"
# In-process local runs keep up to this many bytes of prepared pieces in memory (at most a quarter
# of RAM) and spill the rest: a fixed amount, so a build's peak does not grow with its dataset.
DEFAULT_HELD_PIECE_BYTES = 384 << 20

_LOCAL_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner", "PrismRunner")
_IN_PROCESS_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner")


class PieceStoreOptions(PipelineOptions):
    """``--piece_store auto|inline|spill|memory``: where the shuffle's prepared pieces wait for the shard writers."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--piece_store", "--piece-store", dest="piece_store", default=AUTO, choices=(AUTO, *PIECE_STORES),
            help="where the shuffle keeps prepared pieces: inline (through the runner's GroupByKey), spill (files "
            "under the staging dir), memory (this process; only when every worker runs in it) or auto (memory for "
            "in-process runners, spill for other local runners, inline elsewhere)",
        )
        parser.add_argument(
            "--memory_store_bytes", "--memory-store-bytes", dest="memory_store_bytes", default=None,
            help="how many bytes of prepared pieces (and of a sequence build's held rows) the memory store keeps in this "
            "process before it spills the rest to files (a size like 512MiB; default 384MiB or a quarter of RAM, "
            "whichever is smaller)",
        )


class WorkerCountOptions(PipelineOptions):
    """``--workers N|auto``: how many worker processes a build on this machine runs (auto: ``choose_workers``)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--workers", dest="build_workers", default=AUTO,
            help="worker processes for a build on this machine: N (1 runs in this process; 2 or more runs the "
            "FnApiRunner's multi_processing mode with N SDK worker processes) or auto (the default: workers only "
            "where the input is large enough and the machine has cores enough for them to pay, see docs/runners.md)",
        )


# What ``auto`` weighs, measured on the project's 2-core machine (2026-12-05, 20:10 UTC, docs/runners.md; `python -m
# benchmarks.build --rows 3000000 --formats parquet,csv --ours-only --workers 2 --repeats 3`, which fits them to its
# own run): out-of-process workers spend this much more CPU per row than the in-process build (beyond each one's
# one-row build), which itself keeps this many cores busy; the launching process carries every element between the
# workers' stages and spends this share of the in-process build's per-row CPU itself, on one core; and 2 workers
# reached this share of what those figures promise (busy cores run each other slower). Of each figure, the one of
# the two formats that promises workers less: CSV's ratio (Parquet 1.14), cores (Parquet 1.25) and efficiency
# (Parquet 0.88), Parquet's launcher share (CSV 0.055). The 22:48 run, with the fork server forked from the command,
# fitted 1.12, 1.44, 0.072 and 0.79 by the same rule: within 4 %, so these are kept.
OUT_OF_PROCESS_CPU_RATIO = 1.16
IN_PROCESS_CORES = 1.43
LAUNCHER_CPU_SHARE = 0.075
WORKER_EFFICIENCY = 0.80
# Workers must be predicted this much faster than the in-process build (the target for 2 workers), and
# the input big enough that the workers' start (a one-row build with 2 forked workers takes about 0.6 s and 1.5
# CPU-s more than in process, 2026-12-05) is a small part of the build.
WORKERS_MIN_GAIN = 1.3
WORKERS_MIN_INPUT_BYTES = 1 << 30
# A worker of the spill-store build peaks near 0.75 GB at 3M rows; leave each at least this much of the RAM.
WORKER_RAM_BYTES = 1 << 30


# The reason of a WorkerChoice that Beam's own direct options made (Beam starts those workers its own way).
BEAM_DIRECT_OPTIONS = "--direct_num_workers"


@dataclasses.dataclass(frozen=True)
class WorkerChoice:
    """How many workers a build runs and where: ``mode`` is in_process, multi_processing or runner (the runner's own)."""

    count: int | None  # None: the runner decides (Dataflow, Flink, a portable job server)
    mode: str
    reason: str

    @property
    def set_by_beam_options(self) -> bool:
        """Whether Beam's own ``--direct_num_workers``/``--direct_running_mode`` chose these workers (not ``--workers``)."""
        return self.reason == BEAM_DIRECT_OPTIONS

    def describe(self) -> str:
        if self.mode == "runner":
            return f"the runner's own ({self.reason})"
        workers = "in this process" if self.mode == "in_process" else f"{self.count} worker processes"
        return f"{workers} ({self.reason})"


IN_PROCESS = WorkerChoice(1, "in_process", "the default")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


# The shard writers' share of the workers' busy time (`python -m benchmarks.stage_times --rows 3000000 --repeats 3`,
# 2026-12-05 20:21 UTC: 0.46 from Parquet, 0.29 from CSV; the larger kept): that stage runs on at most one worker
# per shard, so with fewer shards than cores it is what stops more cores from helping.
WRITE_STAGE_SHARE = 0.46


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A build's predicted wall seconds and rows/s on some cores, and the stage that sets the pace."""

    seconds: float
    rows_per_second: float
    cap: str


@dataclasses.dataclass(frozen=True)
class ScalingModel:
    """A build's wall time on N worker processes, from a measured fixed cost, per-row CPU and serial stage.

    The workers spread the out-of-process per-row CPU over the cores (the shard writers' part over at
    most one core per shard) at the measured efficiency, while the launching process carries every
    element between stages on its one core: the slower of the two sets the pace. The efficiency
    (fitted to the measured 2-worker build) also absorbs the workers' start.
    """

    fixed_seconds: float  # wall seconds of a one-row build: start-up, planning, runner, commit
    in_process_cpu_per_row: float  # CPU seconds per row of the in-process build beyond its fixed cost
    out_of_process_cpu_ratio: float = OUT_OF_PROCESS_CPU_RATIO
    launcher_cpu_share: float = LAUNCHER_CPU_SHARE
    worker_efficiency: float = WORKER_EFFICIENCY
    write_stage_share: float = WRITE_STAGE_SHARE
    in_process_cores: float = IN_PROCESS_CORES  # cores the in-process build keeps busy with its per-row work

    def stage_seconds(self, rows: int, cores: int, shards: int) -> dict[str, float]:
        """Wall seconds of the workers' reading side, their shard writers, and the launcher, beyond the fixed cost."""
        worker_cpu = rows * self.in_process_cpu_per_row * self.out_of_process_cpu_ratio / self.worker_efficiency
        return {
            "reading, converting and keying (spread over the workers)": worker_cpu * (1 - self.write_stage_share) / cores,
            "the shard writers (at most one core per shard)": worker_cpu * self.write_stage_share / min(cores, shards),
            "the launching process (one core carries every element between stages)":
                rows * self.in_process_cpu_per_row * self.launcher_cpu_share,
        }

    def predict(self, rows: int, cores: int, shards: int) -> Prediction:
        """The build of ``rows`` rows into ``shards`` shards on ``cores`` worker processes."""
        reading, writing, launcher = self.stage_seconds(rows, cores, shards).items()
        workers = (reading[0] if reading[1] >= writing[1] else writing[0], reading[1] + writing[1])
        cap, busy = max((workers, launcher), key=lambda stage: stage[1])
        seconds = self.fixed_seconds + busy
        return Prediction(seconds, rows / seconds, cap)

    def in_process_seconds(self, rows: int) -> float:
        """The in-process build's wall seconds: its per-row CPU over the cores it keeps busy."""
        return self.fixed_seconds + rows * self.in_process_cpu_per_row / self.in_process_cores


def predicted_worker_gain(workers: int) -> float:
    """The model's figure for ``workers`` worker processes against the in-process build, for a large input: the
    workers' CPU spread over them at the measured efficiency, or the launcher's share on its one core, whichever
    is slower (each shard a writer of its own)."""
    model, rows = ScalingModel(fixed_seconds=0.0, in_process_cpu_per_row=1.0), 1_000_000
    return model.in_process_seconds(rows) / model.predict(rows, workers, shards=workers).seconds


def choose_workers(options: PipelineOptions, input_bytes: int, cores: int | None = None,
                   ram_bytes: int | None = None, *, auto: bool = True) -> WorkerChoice:
    """The workers of a build on ``options``' runner: ``--workers N``, Beam's own direct options, or ``auto``.

    ``auto`` runs workers only on a local in-process-capable runner, for inputs of at least
    WORKERS_MIN_INPUT_BYTES, when ``predicted_worker_gain`` of one worker per core (at most one per
    WORKER_RAM_BYTES of RAM) reaches WORKERS_MIN_GAIN; otherwise it stays in this process: on 2 cores
    (2 workers measured 1.11x-1.22x the in-process build at 3M rows), workers from 3 cores.
    With ``auto=False`` (rows already in this process's memory) ``auto`` keeps what the options say.
    Raises ConfigError for a count that is not a positive integer, ``--workers`` on a remote runner,
    or a ``--workers`` that contradicts ``--direct_num_workers``/``--direct_running_mode``.
    """
    requested = str(options.view_as(WorkerCountOptions).build_workers or AUTO).strip().lower()
    count = _requested_count(requested)
    direct = options.view_as(DirectOptions)
    name = runner_name(options)
    if name not in _IN_PROCESS_RUNNERS:
        if count is not None:
            raise ConfigError(
                f"--workers {requested}: sets the worker processes of a build on this machine, but the runner is "
                f"{name}; set its own worker options instead (Dataflow: --num_workers, --max_num_workers; "
                "Flink and Spark: --parallelism)")
        return WorkerChoice(None, "runner", f"{name} decides")
    given_count = options.get_all_options(retain_unknown_options=False).get("direct_num_workers")
    given_mode = direct.direct_running_mode
    if count is not None and _direct_options_given(options):
        wanted = (1, "in_memory") if count == 1 else (count, "multi_processing")
        if (given_count or 1, given_mode) != wanted:
            raise ConfigError(
                f"--workers {count} contradicts --direct_num_workers={given_count} --direct_running_mode={given_mode}; "
                "give one of the two")
    if count is None and _direct_options_given(options):
        if given_mode == "multi_processing":
            return WorkerChoice(given_count or _cores(), "multi_processing", BEAM_DIRECT_OPTIONS)
        return WorkerChoice(1, "in_process", f"--direct_running_mode {given_mode}")
    if count is not None:
        if count == 1:
            return WorkerChoice(1, "in_process", "--workers 1")
        return WorkerChoice(count, "multi_processing", f"--workers {count}")
    if not auto:
        return WorkerChoice(1, "in_process", "rows held in this process")
    return _auto_workers(input_bytes, _cores() if cores is None else cores, _ram_bytes() if ram_bytes is None else ram_bytes)


def workers_as_given(options: PipelineOptions) -> WorkerChoice:
    """The workers a pipeline of the user's own runs with (WriteDataset): its options as they are, never changed."""
    requested = str(options.view_as(WorkerCountOptions).build_workers or AUTO).strip().lower()
    if requested != AUTO:
        raise ConfigError(f"--workers {requested}: sets the workers of tfrbeam build and tfrbeam.write_dataset; a "
                          "pipeline of your own sets its runner's options (--direct_num_workers, --direct_running_mode)")
    name = runner_name(options)
    if name not in _IN_PROCESS_RUNNERS:
        return WorkerChoice(None, "runner", f"{name} decides")
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "multi_processing":
        return WorkerChoice(direct.direct_num_workers or _cores(), "multi_processing", "the pipeline's options")
    return WorkerChoice(1, "in_process", "the pipeline's options")


def _requested_count(requested: str) -> int | None:
    if requested == AUTO:
        return None
    try:
        count = int(requested)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"--workers: {requested!r} is not a worker count (give a positive integer, or auto)")
    return count


def _direct_options_given(options: PipelineOptions) -> bool:
    """Whether the user set Beam's own ``--direct_num_workers`` or ``--direct_running_mode``."""
    given = options.get_all_options(drop_default=True)
    return "direct_num_workers" in given or "direct_running_mode" in given


def _auto_workers(input_bytes: int, cores: int, ram_bytes: int) -> WorkerChoice:
    workers = min(cores, max(1, ram_bytes // WORKER_RAM_BYTES)) if ram_bytes else cores
    gain = predicted_worker_gain(workers)
    if input_bytes < WORKERS_MIN_INPUT_BYTES:
        return WorkerChoice(1, "in_process", f"auto: {input_bytes / 2**20:,.0f} MiB of input is too little for "
                            f"workers to pay for their start (from {WORKERS_MIN_INPUT_BYTES >> 30} GiB)")
    if gain < WORKERS_MIN_GAIN:
        return WorkerChoice(1, "in_process", f"auto: {workers} worker(s) on {cores} core(s) would be about "
                            f"{gain:.2f}x the in-process build (workers from {WORKERS_MIN_GAIN}x)")
    return WorkerChoice(workers, "multi_processing", f"auto: {cores} cores, {input_bytes / 2**30:,.1f} GiB of input, "
                        f"predicted up to {gain:.1f}x")


def apply_workers(options: PipelineOptions, choice: WorkerChoice) -> None:
    """Set Beam's direct options so the FnApiRunner runs ``choice``'s workers (nothing for the runner's own)."""
    direct = options.view_as(DirectOptions)
    if choice.mode == "multi_processing":
        direct.direct_num_workers = choice.count
        direct.direct_running_mode = "multi_processing"
    elif choice.mode == "in_process" and direct.direct_running_mode == "multi_processing":
        direct.direct_num_workers = 1
        direct.direct_running_mode = "in_memory"


def runner_name(options: PipelineOptions | None) -> str:
    """The runner's class name (``DirectRunner`` when none is set), without its module path."""
    runner = options.view_as(StandardOptions).runner if options is not None else None
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else "DirectRunner"
    return name.rsplit(".", 1)[-1]


def uses_local_workers(options: PipelineOptions) -> bool:
    """Whether every worker runs on this machine (Beam's local runners, or a portable job server embedded here)."""
    name = runner_name(options)
    if name in _LOCAL_RUNNERS:
        return True
    return name == "PortableRunner" and options.view_as(PortableOptions).job_endpoint == "embed"


def workers_share_this_process(options: PipelineOptions) -> bool:
    """Whether every worker runs inside this process: the FnApiRunner / DirectRunner in_memory or multi_threading.

    (When the DirectRunner hands the job to Prism, Prism's default LOOPBACK environment runs the
    Python workers in this process too.)
    """
    if runner_name(options) not in _IN_PROCESS_RUNNERS:
        return False
    return options.view_as(DirectOptions).direct_running_mode in ("in_memory", "multi_threading")


def held_piece_budget(options: PipelineOptions | None = None) -> int:
    """Bytes of prepared pieces a memory store keeps in this process, per run: ``--memory_store_bytes``, or
    DEFAULT_HELD_PIECE_BYTES (a quarter of RAM when that is less)."""
    given = options.view_as(PieceStoreOptions).memory_store_bytes if options is not None else None
    if given is not None:
        try:
            budget = parse_size(given)
        except ValueError as error:
            raise ConfigError(f"--memory_store_bytes: {given!r} is not a size (give bytes, or a size like 512MiB or "
                              "2GB)") from error
        if budget < 0:
            raise ConfigError(f"--memory_store_bytes: {given!r} is negative (0 spills every piece)")
        return budget
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0
    return min(DEFAULT_HELD_PIECE_BYTES, physical // 4)


def choose_piece_store(options: PipelineOptions | None) -> str:
    """The piece store of a build on ``options``' runner: ``--piece_store``, or for ``auto`` the fastest that is safe.

    auto: memory when every worker shares this process; spill when they run on this machine (the
    local runners copy every element several times through their data plane and hold a stage's
    output in memory, which would cost several times the dataset in RAM); inline elsewhere
    (distributed runners shuffle the bytes themselves). ``memory`` on a runner whose workers are
    other processes is refused: they could not see this process's memory.
    """
    options = options or PipelineOptions([])
    requested = options.view_as(PieceStoreOptions).piece_store or AUTO
    if requested == AUTO:
        if workers_share_this_process(options):
            return MEMORY
        return SPILL if uses_local_workers(options) else INLINE
    if requested == MEMORY and not workers_share_this_process(options):
        raise ConfigError(
            f"--piece_store memory keeps pieces in this process, but the {runner_name(options)} (as configured) runs "
            "workers in other processes; use --piece_store spill or inline (or auto)"
        )
    return requested
