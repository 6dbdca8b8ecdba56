"""Which runner a build runs on, what that means for where its workers are, and the piece store that fits.

The default runner (``DEFAULT_RUNNER``) is Beam's FnApiRunner, in this process: the engine the
DirectRunner itself falls back to, without the DirectRunner's first attempt to start Prism
(since Beam 2.68 it downloads a Prism binary when the machine is online, and waits and falls back
when it is not), so a build runs the same way on every machine. ``--piece_store`` (a pipeline
option, ``auto`` by default) chooses where the shuffle's pieces wait (``tfrbeam.builder.shuffle``).
"""

from __future__ import annotations

import dataclasses
import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, PortableOptions, StandardOptions

from tfrbeam.builder.config import parse_size
from tfrbeam.builder.shuffle import INLINE, MEMORY, PIECE_STORES, SPILL
from tfrbeam.errors import ConfigError

__all__ = [
    "AUTO", "AUTO_WORKERS", "DEFAULT_RUNNER", "IN_PROCESS", "PieceStoreOptions", "WorkerChoice", "WorkerCountOptions",
    "apply_workers", "choose_piece_store", "choose_workers", "held_piece_budget", "known_runner", "runner_name",
    "uses_local_workers", "workers_as_given", "workers_share_this_process",
]


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
            "FnApiRunner's multi_processing mode with N SDK worker processes) or auto (the default: in this "
            "process, see docs/runners.md)",
        )


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
# ``--workers auto``: this process, whatever the input and the cores (the rule and its measurements: docs/runners.md).
AUTO_WORKERS = WorkerChoice(1, "in_process", "auto: --workers N starts worker processes")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_workers(options: PipelineOptions) -> WorkerChoice:
    """The workers of a build on ``options``' runner: ``--workers N``, Beam's own direct options, or ``auto``.

    ``auto`` (AUTO_WORKERS) runs the build in this process: on the machine it was measured on, Beam's
    worker processes were no faster than one process (docs/runners.md#worker-processes---workers-nauto).
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
    if count is None:
        return AUTO_WORKERS
    if count == 1:
        return WorkerChoice(1, "in_process", "--workers 1")
    return WorkerChoice(count, "multi_processing", f"--workers {count}")


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


def apply_workers(options: PipelineOptions, choice: WorkerChoice) -> None:
    """Set Beam's direct options so the FnApiRunner runs ``choice``'s workers (nothing for the runner's own)."""
    direct = options.view_as(DirectOptions)
    if choice.mode == "multi_processing":
        direct.direct_num_workers = choice.count
        direct.direct_running_mode = "multi_processing"
    elif choice.mode == "in_process" and direct.direct_running_mode == "multi_processing":
        direct.direct_num_workers = 1
        direct.direct_running_mode = "in_memory"


def known_runner(name: str) -> str | None:
    """The class name Beam creates for a ``--runner`` value of its own (any case, "Runner" optional: ``dataflow``),
    or None when the value is no runner Beam knows by name."""
    known = {runner.lower(): runner for runner in StandardOptions.KNOWN_RUNNER_NAMES}
    lowered = name.lower()
    return known.get(lowered) or known.get(lowered + "runner")


def runner_name(options: PipelineOptions | None) -> str:
    """The runner's class name, as Beam resolves ``--runner`` (``DirectRunner`` when none is set), without its module
    path: every check of ours that depends on the runner asks this, so ``--runner dataflow`` is DataflowRunner."""
    runner = options.view_as(StandardOptions).runner if options is not None else None
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else "DirectRunner"
    return known_runner(name) or name.rsplit(".", 1)[-1]


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
