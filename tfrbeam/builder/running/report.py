"""What a build shows: its plan (``--dry-run``), progress while it runs (a bar on a terminal, else log lines) and the
summary table at the end.

Shared by ``tfrbeam build`` and the Python API (``tfrbeam.builder.run``, ``tfrbeam.write_dataset``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from tfrbeam.base.wording import counted
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.inputs.progress import WRITTEN, progress_dir, read_progress
from tfrbeam.builder.pipeline.plan import BuildPlan
from tfrbeam.builder.pipeline.splits import describe_split_source
from tfrbeam.builder.shuffle import MEMORY
from tfrbeam.layout.manifest_schema import Manifest

__all__ = ["PROGRESS_LOG_SECONDS", "build_progress", "describe_plan", "summary_table"]

PROGRESS_LOG_SECONDS = 10.0  # without a terminal: one progress line this often
_PROGRESS_BAR_SECONDS = 0.5


@contextlib.contextmanager
def build_progress(plan: BuildPlan):
    """While the pipeline runs: a progress bar on a terminal, else a log line every PROGRESS_LOG_SECONDS.

    Counts come from the workers' counter files in the staging directory (see build.progress), so
    multi-process workers count too: rows and bytes read against the inputs' size from planning,
    then examples written by the shard writers (the shuffle and write phase). Shown at info level:
    --quiet turns it off; remote staging has none.
    """
    directory = progress_dir(plan.staging_dir)
    if directory is None or not logging.getLogger("tfrbeam").isEnabledFor(logging.INFO):
        yield
        return
    total = sum(item.size for item in plan.input_files)
    display = _ProgressBar(total) if sys.stderr.isatty() else _ProgressLog(total)
    stop = threading.Event()
    read_offsets: dict[str, int] = {}
    written_offsets: dict[str, int] = {}
    read, written = [0, 0], [0, 0]

    def update() -> None:
        display.show(read_progress(directory, read_offsets, read),
                     read_progress(directory, written_offsets, written, WRITTEN))

    def poll() -> None:
        while not stop.wait(display.interval):
            update()

    thread = threading.Thread(target=poll, name="tfrbeam-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        update()
        display.close()


class _ProgressBar:
    """tqdm's bar over the input bytes while reading, then over the examples written; log lines print above it."""

    interval = _PROGRESS_BAR_SECONDS

    def __init__(self, total: int) -> None:
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.total = total
        self.bar = self._bar(total, "B", "reading")
        self.writing = False
        self._redirect = logging_redirect_tqdm()  # the root logger's stderr handler writes through tqdm.write
        self._redirect.__enter__()

    @staticmethod
    def _bar(total: int, unit: str, description: str):
        from tqdm import tqdm

        try:
            size = os.get_terminal_size(sys.stderr.fileno())
            sized = size.columns > 0 and size.lines > 0
        except OSError:
            sized = False
        # tqdm hides every bar on a terminal that reports no size (a bare pty): give it one.
        return tqdm(total=total, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                    desc=description, file=sys.stderr, dynamic_ncols=sized, ncols=None if sized else 100,
                    nrows=None if sized else 24, leave=False, mininterval=_PROGRESS_BAR_SECONDS)

    def show(self, read: tuple[int, int], written: tuple[int, int]) -> None:
        rows, size = read
        if not self.writing and (written[0] > 0 or size >= self.total):
            self.bar.close()  # reading is done: the rest of the run is the shuffle and the shard writers
            self.bar = self._bar(rows, " examples", "shuffling and writing")
            self.writing = True
        if self.writing:
            self.bar.update(min(written[0], int(self.bar.total)) - self.bar.n)
            return
        self.bar.set_postfix_str(counted(rows, "row", grouped=True), refresh=False)
        self.bar.update(min(size, self.total) - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        self._redirect.__exit__(None, None, None)


class _ProgressLog:
    """A log line every PROGRESS_LOG_SECONDS: rows, bytes of the total, rate and ETA; then the examples written."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.monotonic()
        self.interval = PROGRESS_LOG_SECONDS
        self._last_written = -1

    def show(self, read: tuple[int, int], written: tuple[int, int]) -> None:
        rows, size = read
        seconds = time.monotonic() - self.started
        done = min(size, self.total)
        log = logging.getLogger(__name__)
        if done < self.total and written[0] == 0:
            rate = done / seconds if seconds > 0 else 0.0
            eta = f", about {_duration((self.total - done) / rate)} left" if rate > 0 else ""
            share = 100.0 * done / self.total if self.total else 100.0
            log.info("read %s, %s of %s input bytes (%.0f%%) in %s, %s rows/s%s", counted(rows, "row", grouped=True),
                     f"{done:,}", f"{self.total:,}", share, _duration(seconds),
                     f"{rows / seconds:,.0f}" if seconds > 0 else "0", eta)
        elif written[0] != self._last_written:
            self._last_written = written[0]
            log.info("shuffle and write: %s (%s bytes) written of %s read, in %s",
                     counted(written[0], "example", grouped=True), f"{written[1]:,}", counted(rows, "row", grouped=True),
                     _duration(seconds))

    def close(self) -> None:
        """Nothing to tear down: the summary table follows."""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def summary_table(manifest: Manifest, seconds: float, run: BuildPlan) -> str:
    """The end-of-build table: rows read, examples, shards and bytes per split, bad rows, time and speed."""
    rows_read = manifest.rest["rows_read"]
    sequences = "sequence" in manifest.rest
    lines = [f"{'split':<12}{'sequences' if sequences else 'examples':>12}{'shards':>8}{'bytes':>16}"]
    for split in manifest.splits:
        lines.append(f"{split.name:<12}{split.num_examples:>12,}{len(split.shards):>8}{split.num_bytes or 0:>16,}")
    total_examples = sum(split.num_examples for split in manifest.splits)
    total_bytes = sum(split.num_bytes or 0 for split in manifest.splits)
    total_shards = sum(len(split.shards) for split in manifest.splits)
    lines.append(f"{'total':<12}{total_examples:>12,}{total_shards:>8}{total_bytes:>16,}")
    bad = manifest.rest["bad_records"]
    bad_line = f"bad rows:   {bad['count']:,} ({bad['action']})"
    if bad.get("dead_letter_path"):
        bad_line += f" -> {bad['dead_letter_path']}"
    rate = rows_read / seconds if seconds > 0 else 0.0
    ran = manifest.run
    lines += [f"rows read:  {rows_read:,}", *(_groups_lines(manifest) if sequences else []), bad_line,
        f"time:       {seconds:.1f} s ({rate:,.0f} rows/s, runner {ran.get('runner', 'unknown')}, "
        f"{_workers_text(ran.get('workers'))}piece store {ran.get('piece_store', 'auto')})",
        f"manifest:   {run.manifest_path}",
    ]
    return "\n".join(lines)


def _workers_text(workers: dict | None) -> str:
    """"2 worker processes, " / "in process, " for the summary's time line ("" in a manifest from before workers)."""
    if not workers:
        return ""
    if workers["mode"] == "multi_processing":
        return f"{workers['count']} worker processes, "
    return "in process, " if workers["mode"] == "in_process" else "the runner's workers, "


def _groups_lines(manifest: Manifest) -> list[str]:
    """The summary's lines on a sequence build: groups kept and dropped, steps per SequenceExample."""
    splits = [split.rest for split in manifest.splits]  # a sequence build's per-split figures
    kept, cut = sum(split["num_groups"] for split in splits), sum(split["split_groups"] for split in splits)
    few = sum(split["dropped_groups"]["too_few_steps"] for split in splits)
    bad = sum(split["dropped_groups"]["bad"] for split in splits)
    examples = sum(split.num_examples for split in manifest.splits)
    steps = sum(split["steps"]["total"] for split in splits)
    shortest = min((split.rest["steps"]["min"] for split in manifest.splits if split.num_examples), default=0)
    longest = max((split["steps"]["max"] for split in splits), default=0)
    truncated = sum(split["truncated_steps"] for split in splits)
    return [f"groups:     {kept:,} kept ({cut:,} cut by max_steps), {few:,} under min_steps, {bad:,} bad",
            f"steps:      {steps:,} ({shortest:,}..{longest:,} per sequence, mean {steps / max(examples, 1):.1f})"
            + (f", {truncated:,} truncated" if truncated else "")]


def _shown_kind(spec: FeatureSpec) -> str:
    if spec.time_unit is not None:
        return f"int64 ({spec.time_unit} since 1970 from {spec.time_format or 'ISO 8601'})"
    assert spec.type is not None  # a plan's features are resolved
    if spec.file is not None:  # from_file: the column holds paths
        return f"{spec.type} (the file's {'bytes' if spec.file.part == 'bytes' else 'image ' + spec.file.part})"
    return spec.type


def describe_plan(plan: BuildPlan) -> str:
    """What ``--dry-run`` prints: inputs, features, splits, shards, output, runner and piece store."""
    sizes = [item.size for item in plan.input_files]
    lines = ["dry run: nothing ran and nothing was written (the first input was sampled to settle the features)",
             f"inputs:      {counted(len(sizes), plan.config.input.format + ' file')}, {sum(sizes):,} bytes"]
    lines += [f"  {item.path}  {item.size:,} bytes" for item in plan.input_files[:_SHOWN_INPUTS]]
    if len(sizes) > _SHOWN_INPUTS:
        lines.append(f"  ... and {len(sizes) - _SHOWN_INPUTS} more")
    width = max(len(spec.name) for spec in plan.features)
    lines.append(f"features:    {len(plan.features)}")
    kinds = [_shown_kind(spec) for spec in plan.features]
    kind_width = max(len(kind) for kind in kinds)
    for spec, kind in zip(plan.features, kinds):
        source = f"  from {spec.source}" if spec.source != spec.name else ""
        lines.append(f"  {spec.name:<{width}}  {kind:<{kind_width}}  {_shape_text(spec.shape):<7}  {_null_text(spec)}{source}")
    if plan.config.split_by is not None:
        lines.append(f"splits:      {', '.join(plan.config.splits)} by {describe_split_source(plan.config, plan.input_splits)}")
    else:
        lines.append("splits:      " + ", ".join(f"{name} {fraction:g}" for name, fraction in zip(plan.config.splits,
                                                                                               plan.config.fractions))
                     + (f" (by {', '.join(plan.config.split_key)})" if plan.config.split_key else ""))
    sharding = plan.sharding
    if sharding.max_bytes_per_shard is not None:
        lines.append(f"shards:      as many per split as keep each under {sharding.max_bytes_per_shard:,} bytes")
    else:  # fixed counts: an int per split
        lines.append("shards:      " + ", ".join(f"{name} {counted(int(count), 'shard')}"  # type: ignore[arg-type]
                                               for name, count in zip(sharding.splits, sharding.num_shards)))
    lines += _sequence_text(plan)
    shuffle = plan.config.shuffle
    lines += [f"shuffle:     {'seed ' + str(shuffle.seed) if shuffle.enabled else 'off (input order)'}",
              f"output:      {plan.output_path} (compression {sharding.compression or 'none'}"
              f"{', replacing what is there' if plan.overwrite else ''})",
              f"bad rows:    {plan.config.errors.on_bad_record}, at most {plan.config.errors.max_bad_fraction:g} of rows",
              f"runner:      {plan.runner}",
              f"workers:     {plan.workers.describe()}"]
    piece_store = getattr(plan, "piece_store", None)
    if piece_store == MEMORY:
        held = plan.memory_store_bytes
        lines.append(f"piece store: memory (up to {held / (1 << 20):g} MiB held in this process, the rest spilled)")
    elif piece_store is not None:
        lines.append(f"piece store: {piece_store}")
    return "\n".join(lines)


_SHOWN_INPUTS = 20


def _sequence_text(plan: BuildPlan) -> list[str]:
    """The dry run's lines on a sequence build: grouping, ordering, context, cuts and the GroupByKey's buckets."""
    sequence = plan.config.sequence
    if sequence is None:
        return []
    ordered = ", ".join(sequence.order_by) + ", then" if sequence.order_by else "by"
    steps = sequence.sequence_features(plan.features)
    cut = (f"max_steps {sequence.max_steps} (overflow {sequence.overflow})" if sequence.max_steps is not None
           else "max_steps none")
    return [f"sequence:    one SequenceExample per {', '.join(sequence.group_by)}; steps ordered by {ordered} the row's "
            "content hash",
            f"  context:   {', '.join(sequence.context_features)}",
            f"  steps:     {', '.join(steps)}",
            f"  limits:    min_steps {sequence.min_steps}, {cut}, max_group_bytes {sequence.max_group_bytes:,}",
            f"  buckets:   {plan.sequence_buckets} (the GroupByKey of group keys; one worker holds one bucket)"]


def _shape_text(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "[any]"
    return "scalar" if shape == () else f"[{shape[0]}]"


def _null_text(spec) -> str:
    if spec.on_null == "omit":
        return "null -> omitted"
    if spec.on_null == "default":
        default = spec.default
        shown = [_plain(item) for item in default] if isinstance(default, tuple) else _plain(default)
        return f"null -> default {shown}"
    return "null -> bad row"


def _plain(value):
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
