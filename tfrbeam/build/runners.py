"""Which runner a build runs on, what that means for where its workers are, and the piece store that fits.

The default runner (``DEFAULT_RUNNER``) is Beam's FnApiRunner, in this process: the engine the
DirectRunner itself falls back to, without the DirectRunner's first attempt to start Prism
(since Beam 2.68 it downloads a Prism binary when the machine is online, and waits and falls back
when it is not), so a build runs the same way on every machine. ``--piece_store`` (a pipeline
option, ``auto`` by default) chooses where the shuffle's pieces wait (``tfrbeam.build.shuffle``).
"""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, PortableOptions, StandardOptions

from tfrbeam.build.config import parse_size
from tfrbeam.build.shuffle import INLINE, MEMORY, PIECE_STORES, SPILL
from tfrbeam.errors import ConfigError

__all__ = [
    "AUTO", "DEFAULT_RUNNER", "PieceStoreOptions", "choose_piece_store", "held_piece_budget", "runner_name",
    "uses_local_workers", "workers_share_this_process",
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
