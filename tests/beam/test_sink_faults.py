"""WriteToTFRecord's finalize under faults: a crash or a full disk at every file operation, kill -9, concurrent writes.

The sink has no manifest, so its guarantee is the one a journal gives: a fault before the
journal is written leaves the earlier run's shards untouched; a fault after it is completed by
the next run into the same prefix before that run does anything else. A finished write is
always exactly one run's complete set of shards, and nothing is left beside them.
"""

from __future__ import annotations

import glob
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.faults import _sink_main, injected
from tfrbeam.tfrecord.records import read_records

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _write(workdir: pathlib.Path, kind: str, at: int, count: int, shards: int, log_name: str = "ops.txt"):
    """Run a sink pipeline with one fault at finalize operation ``at``; (exit code, operations).

    A crash needs a fresh process; a full disk is injected in this one.
    """
    if kind in ("enospc", "none"):
        log: list[str] = []
        try:
            with injected(None if kind == "none" else kind, at, log):
                code = _sink_main([str(workdir / "out"), str(count), str(shards)])
        except Exception:  # the runner wraps the injected OSError
            code = 1
        return code, log
    log = workdir / log_name
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "tests.faults", kind, str(at), str(log), "--", "sink", str(workdir / "out"), str(count),
         str(shards)], cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
    )
    return result.returncode, [line for line in log.read_text().splitlines() if line] if log.exists() else []


def _shard_set(workdir: pathlib.Path) -> dict[str, list[bytes]]:
    return {os.path.basename(path): list(read_records(path)) for path in sorted(glob.glob(str(workdir / "out-*")))}


def _complete(workdir: pathlib.Path, count: int, shards: int) -> bool:
    found = _shard_set(workdir)
    names = {f"out-{i:05d}-of-{shards:05d}" for i in range(shards)}
    records = sorted(record for values in found.values() for record in values)
    return set(found) == names and records == sorted(b"%d-%d" % (count, i) for i in range(count))


def _files(workdir: pathlib.Path) -> dict[str, bytes]:
    """The shards and their index files, by path."""
    paths = glob.glob(str(workdir / "out-*")) + glob.glob(str(workdir / ".tfrbeam-index" / "*"))
    return {path: pathlib.Path(path).read_bytes() for path in paths}


def _reset(workdir: pathlib.Path, files: dict[str, bytes]) -> None:
    for path in _files(workdir):
        os.unlink(path)
    for path, data in files.items():
        pathlib.Path(path).write_bytes(data)


def _leftovers(workdir: pathlib.Path) -> list[str]:
    return [name for name in os.listdir(workdir) if ".tfrbeam-" in name and name != ".tfrbeam-index"]


@pytest.mark.parametrize("kind", ["crash", "enospc"])
def test_a_fault_at_any_finalize_operation_is_completed_by_the_next_run(tmp_path, kind):
    assert _write(tmp_path, "none", 0, 30, 3)[0] == 0
    code, ops = _write(tmp_path, "none", 0, 20, 2)
    assert code == 0 and _complete(tmp_path, 20, 2)
    journal = next(number for number, line in enumerate(ops, 1) if line.split()[2].endswith("commit.json"))
    _reset(tmp_path, {})
    assert _write(tmp_path, "none", 0, 30, 3)[0] == 0
    earlier = _files(tmp_path)
    for at in range(1, len(ops) + 1):
        _reset(tmp_path, earlier)
        code, _ = _write(tmp_path, kind, at, 20, 2)
        if code == 0:  # the step had a second way (an offset index rebuilt from the shard's headers): published whole
            assert kind == "enospc" and _complete(tmp_path, 20, 2) and _leftovers(tmp_path) == [], (at, ops[at - 1])
            continue
        if at <= journal:  # the commit had not begun: the earlier run's shards are whole
            assert _complete(tmp_path, 30, 3), (at, ops[at - 1])
        assert _write(tmp_path, "none", 0, 20, 2)[0] == 0, (at, ops[at - 1])  # the same pipeline again
        assert _complete(tmp_path, 20, 2), (at, ops[at - 1])
        assert _leftovers(tmp_path) == [], (at, ops[at - 1])


def test_kill_9_during_a_write_then_the_rerun_publishes_one_complete_set(tmp_path):
    assert _write(tmp_path, "none", 0, 30, 3)[0] == 0
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for delay in (0.5, 1.5, 2.5):
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults", "none", "0", str(tmp_path / "k.txt"), "--", "sink", str(tmp_path / "out"),
             "20000", "2"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert _write(tmp_path, "none", 0, 20, 2)[0] == 0
        assert _complete(tmp_path, 20, 2) and _leftovers(tmp_path) == []


def test_two_concurrent_writes_leave_exactly_one_complete_set(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    runs = [
        subprocess.Popen([sys.executable, "-m", "tests.faults", "none", "0", str(tmp_path / f"c{n}.txt"), "--", "sink",
                          str(tmp_path / "out"), str(count), str(shards)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n, (count, shards) in enumerate([(3000, 3), (2000, 2)])
    ]
    results = [(run.wait(timeout=120), run.stderr.read()) for run in runs]
    assert any(code == 0 for code, _ in results)
    for code, error in results:  # a run that lost the race says the prefix is held (and by whom, once the holder wrote it)
        assert code == 0 or "is in use by" in error
    assert _complete(tmp_path, 3000, 3) or _complete(tmp_path, 2000, 2)
    assert _leftovers(tmp_path) == []
