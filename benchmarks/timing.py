"""Repeated timings and how the benchmarks print them: median, range and best of N runs.

The median is the figure to quote (the README's Performance table gives medians and the number
of runs); the range shows how noisy the shared machine was; the best is kept for comparison
with older figures, which were best-of-N.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Runs:
    """The values of repeated runs of one measurement (seconds, or a rate)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def rates(self, count: float) -> Runs:
        """These runs (seconds) as ``count`` per second."""
        return Runs(tuple(count / seconds for seconds in self.values))

    def describe(self, unit: str = "", digits: int = 0, higher_is_better: bool = True) -> str:
        """E.g. ``median 1,234 records/s (range 1,100-1,300, best 1,300, 3 runs)``."""
        def show(value: float) -> str:
            return f"{value:,.{digits}f}"

        best = self.high if higher_is_better else self.low
        suffix = f" {unit}" if unit else ""
        return (f"median {show(self.median)}{suffix} (range {show(self.low)}-{show(self.high)}, best {show(best)}, "
                f"{len(self.values)} run{'s' if len(self.values) != 1 else ''})")


def time_runs(function: Callable[[], object], repeats: int) -> tuple[Runs, Runs]:
    """Wall-clock and CPU (this process) seconds of ``repeats`` calls of ``function``.

    On a shared machine the CPU time is the steadier figure: it leaves out time spent waiting
    for a core (it still includes slowdowns from caches and memory shared with others).
    """
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return Runs(tuple(walls)), Runs(tuple(cpus))


def ratio(ours: Runs, baseline: Runs) -> str:
    """The ratio of two rates' medians, and the widest it could be from the two ranges (worst/best run pairs)."""
    spread = f" (bounds {ours.low / baseline.high:.2f}-{ours.high / baseline.low:.2f}x)" if len(ours.values) > 1 else ""
    return f"{ours.median / baseline.median:.2f}x of medians{spread}"


def runs_of(values: Sequence[float]) -> Runs:
    return Runs(tuple(values))


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> tuple[float, float]:
    """A process's own CPU seconds (user + system) and its system CPU seconds alone, from /proc/PID/stat (fields 14
    and 15: its own threads; what its reaped children spent is in fields 16 and 17). OSError once it is gone."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    user, system = int(fields[11]) / _TICKS, int(fields[12]) / _TICKS
    return user + system, system
