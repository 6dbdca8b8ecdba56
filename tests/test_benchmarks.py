"""The arithmetic behind the ratios benchmarks/build.py prints, which the README quotes."""

from __future__ import annotations

from benchmarks.build import beyond_fixed


def _local(cpu: float, system: float) -> tuple[float, int, float, int, float]:
    return 1.0, 0, cpu, 0, system


def _pool(launcher: float, workers: float, system: float) -> dict:
    return {"launcher_cpu": launcher, "workers_cpu": workers, "system_cpu": system}


def test_cpu_beyond_the_one_row_builds_is_split_into_user_and_system_repeat_by_repeat():
    # In process: 11 CPU-s (3 system) on every row, 1 (0.5 system) on one row: 10 beyond, 7.5 user, 2.5 system.
    in_process, in_process_one = [_local(11.0, 3.0)] * 3, [_local(1.0, 0.5)] * 3
    # Two processes: 17 CPU-s (6 system), one row 3 (1 system): 14 beyond = 1.4x, user 9 = 1.2x, system 5 = 2x.
    workers, workers_one = [_local(17.0, 6.0)] * 3, [_local(3.0, 1.0)] * 3
    line = beyond_fixed(workers, workers_one, in_process, in_process_one)
    assert line == ("CPU per row beyond each one's one-row build: all 1.40x (1.40-1.40), user 1.20x (1.20-1.20), "
                    "system 2.00x (2.00-2.00)")


def test_pool_jobs_count_the_launcher_and_the_workers_and_ranges_span_the_repeats():
    in_process, in_process_one = [_local(11.0, 3.0), _local(21.0, 5.0)], [_local(1.0, 0.5)] * 2
    pool = [_pool(2.0, 10.0, 3.0), _pool(4.0, 17.0, 4.5)]  # 12 (3 system), 21 (4.5 system)
    pool_one = [_pool(1.0, 1.0, 0.5)] * 2  # 2 (0.5 system)
    line = beyond_fixed(pool, pool_one, in_process, in_process_one)
    # Repeat 1: 10/10 = 1.00x, user 7.5/7.5, system 2.5/2.5. Repeat 2: 19/20 = 0.95x, user 15/15.5, system 4/4.5.
    assert line == ("CPU per row beyond each one's one-row build: all 0.97x (0.95-1.00), user 0.98x (0.97-1.00), "
                    "system 0.94x (0.89-1.00)")
