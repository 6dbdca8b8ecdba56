"""What a build shows while it runs and when it ends: progress (a bar on a terminal, else log lines) and the summary table.

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
from tfrbeam.builder.pipeline.plan import BuildPlan
from tfrbeam.builder.running.progress import WRITTEN, progress_dir, read_progress

__all__ = ["PROGRESS_LOG_SECONDS", "build_progress", "summary_table"]

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


def summary_table(manifest: dict, seconds: float, run: BuildPlan) -> str:
    """The end-of-build table: rows read, examples, shards and bytes per split, bad rows, time and speed."""
    rows_read = manifest["rows_read"]
    sequences = "sequence" in manifest
    lines = [f"{'split':<12}{'sequences' if sequences else 'examples':>12}{'shards':>8}{'bytes':>16}"]
    for name, split in manifest["splits"].items():
        lines.append(f"{name:<12}{split['num_examples']:>12,}{len(split['shards']):>8}{split['num_bytes']:>16,}")
    total_examples = sum(split["num_examples"] for split in manifest["splits"].values())
    total_bytes = sum(split["num_bytes"] for split in manifest["splits"].values())
    total_shards = sum(len(split["shards"]) for split in manifest["splits"].values())
    lines.append(f"{'total':<12}{total_examples:>12,}{total_shards:>8}{total_bytes:>16,}")
    bad = manifest["bad_records"]
    bad_line = f"bad rows:   {bad['count']:,} ({bad['action']})"
    if bad.get("dead_letter_path"):
        bad_line += f" -> {bad['dead_letter_path']}"
    rate = rows_read / seconds if seconds > 0 else 0.0
    lines += [f"rows read:  {rows_read:,}", *(_groups_lines(manifest) if sequences else []), bad_line,
        f"time:       {seconds:.1f} s ({rate:,.0f} rows/s, runner {manifest['runner']}, "
        f"{_workers_text(manifest.get('workers'))}piece store {manifest.get('piece_store', 'auto')})",
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


def _groups_lines(manifest: dict) -> list[str]:
    """The summary's lines on a sequence build: groups kept and dropped, steps per SequenceExample."""
    splits = manifest["splits"].values()
    kept, cut = sum(split["num_groups"] for split in splits), sum(split["split_groups"] for split in splits)
    few = sum(split["dropped_groups"]["too_few_steps"] for split in splits)
    bad = sum(split["dropped_groups"]["bad"] for split in splits)
    examples = sum(split["num_examples"] for split in splits)
    steps = sum(split["steps"]["total"] for split in splits)
    shortest = min((split["steps"]["min"] for split in splits if split["num_examples"]), default=0)
    longest = max((split["steps"]["max"] for split in splits), default=0)
    truncated = sum(split["truncated_steps"] for split in splits)
    return [f"groups:     {kept:,} kept ({cut:,} cut by max_steps), {few:,} under min_steps, {bad:,} bad",
            f"steps:      {steps:,} ({shortest:,}..{longest:,} per sequence, mean {steps / max(examples, 1):.1f})"
            + (f", {truncated:,} truncated" if truncated else "")]
