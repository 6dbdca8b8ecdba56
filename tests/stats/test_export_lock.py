"""`tfrbeam export` takes the output's lock and publishes through a recoverable journal, as `build` does (issue 43, item 12).

Measured before: two concurrent ``export --overwrite`` runs into one output both exited 0, and in 3 of 8 runs the
output mixed the two exports (once 504 rows duplicated and 504 missing); a kill mid-publish left a mix for good.
Here the output is always exactly one export (its file set and its row multiset), the loser fails in one line naming
the holder, a killed export is rolled forward by the next one, and nothing outside the output changes.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tests.faults import CRASH_EXIT
from tfrbeam.cli.main import main as cli_main

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXIT_LOCKED = 1


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Two datasets with the same split names but other rows and shard counts (3 and 2 shards per split)."""
    root = tmp_path_factory.mktemp("export-lock")
    found = {}
    for name, start, rows, shards in (("a", 0, 3000, 3), ("b", 100_000, 2000, 2)):
        table = pa.table({"id": np.arange(start, start + rows, dtype=np.int64),
                          "name": [f"{name}{i}" for i in range(rows)],
                          "tags": [list(range(i % 4)) for i in range(rows)]})
        tfrbeam.write_dataset(table, str(root / name), splits={"train": 0.75, "eval": 0.25}, num_shards=shards,
                              progress=False)
        found[name] = root / name
    return found


@pytest.fixture(scope="module")
def expected(sources, tmp_path_factory) -> dict[str, tuple]:
    """What each export alone writes: (its Parquet files, relative; its rows in id order)."""
    root = tmp_path_factory.mktemp("export-lock-expected")
    return {name: _exported(_export_in_process(source, root / name)) for name, source in sources.items()}


def _export_in_process(source: pathlib.Path, out: pathlib.Path, *flags: str) -> pathlib.Path:
    assert cli_main(["export", str(source), str(out), *flags]) == 0
    return out


def _exported(out: pathlib.Path) -> tuple[tuple[str, ...], list[dict]]:
    files = sorted(path for path in out.rglob("*.parquet"))
    rows = [row for path in files for row in pq.read_table(path).to_pylist()]
    return tuple(str(path.relative_to(out)) for path in files), sorted(rows, key=lambda row: row["id"])


def _which(state: tuple, expected: dict[str, tuple]) -> str:
    """Which export the output holds; a mix (or anything else) fails, saying how it differs."""
    for name, export in expected.items():
        if state == export:
            return name
    ids = [row["id"] for row in state[1]]
    raise AssertionError(f"the output is neither export: files {state[0]}, {len(ids)} rows, "
                         f"{len(ids) - len(set(ids))} duplicated ids")


def _env() -> dict[str, str]:
    """This process's environment (a bucket fixture's server settings too), with the repository importable."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))


def _start(source: pathlib.Path, out: pathlib.Path | str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tfrbeam.cli.main", "export", str(source), str(out), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _under_fault(kind: str, at: int, log: pathlib.Path, source: pathlib.Path, out: pathlib.Path,
                 *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults", kind, str(at), str(log), "--", "export", str(source), str(out), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _publish_operations(log: pathlib.Path, out: pathlib.Path) -> list[tuple[int, str, str]]:
    """(number, operation, path) of each deletion or rename of a Parquet file at its place in ``out``."""
    found = []
    for line in log.read_text().splitlines():
        if line:
            number, op, path = line.split(" ", 2)
            if op in ("delete", "rename") and path.startswith(str(out) + os.sep) and path.endswith(".parquet"):
                found.append((int(number), op, path))
    return found


def _assert_refused_naming(code: int, stderr: str, holder_pid: int | None = None) -> None:
    line = stderr.strip()
    assert code == EXIT_LOCKED and "\n" not in line and "is in use by run" in line, (code, stderr[-2000:])
    if holder_pid is not None:
        assert f"pid {holder_pid} " in line, line


def _beside(out: pathlib.Path) -> list[str]:
    """What the run left beside the output: its lock file or a staging directory (hidden, ``.out.tfrbeam-*``)."""
    return sorted(name for name in os.listdir(out.parent) if name.startswith(f".{out.name}.tfrbeam-"))


def test_two_concurrent_overwrites_leave_exactly_one_export(sources, expected, tmp_path):
    out = tmp_path / "out"
    for round_number in range(4):
        names = ["a", "b"] if round_number % 2 == 0 else ["b", "a"]
        runs = {name: _start(sources[name], out, "--overwrite") for name in names}
        results = {name: (run.wait(timeout=120), run.communicate()[1]) for name, run in runs.items()}
        winners = [name for name, (code, _) in results.items() if code == 0]
        assert winners, results
        for code, stderr in results.values():
            if code != 0:
                _assert_refused_naming(code, stderr, runs[winners[0]].pid)
        held = _which(_exported(out), expected)
        assert held in winners, (held, results)
        assert _beside(out) == []


def test_an_export_started_while_another_publishes_is_refused_and_never_mixed_in(sources, expected, tmp_path):
    """Deterministic: the first export is paused after its first Parquet file reached its place."""
    out = _export_in_process(sources["b"], tmp_path / "out")
    log = tmp_path / "ops.txt"
    assert _under_fault("none", 0, log, sources["a"], out, "--overwrite").wait(timeout=120) == 0
    second_rename = [number for number, op, _ in _publish_operations(log, out) if op == "rename"][1]
    _export_in_process(sources["b"], out, "--overwrite")
    signal = tmp_path / "signal"
    first = _under_fault("wait", second_rename, signal, sources["a"], out, "--overwrite")
    deadline = time.monotonic() + 120
    while not pathlib.Path(f"{signal}.waiting").exists() and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()
        time.sleep(0.02)
    second = _start(sources["b"], out, "--overwrite")
    try:
        second.wait(timeout=15)  # a loser that waited for the lock would still run: then it goes after the first
    except subprocess.TimeoutExpired:
        pass
    pathlib.Path(f"{signal}.go").touch()
    assert first.wait(timeout=120) == 0, first.communicate()[1][-2000:]
    second_code = second.wait(timeout=120)
    if second_code != 0:
        _assert_refused_naming(second_code, second.communicate()[1], first.pid)
        assert _which(_exported(out), expected) == "a"
    else:
        assert _which(_exported(out), expected) == "b"
    assert _beside(out) == []


def test_a_kill_mid_publish_leaves_one_export_once_the_next_run_recovers(sources, expected, tmp_path):
    """kill -9 (``os._exit`` inside the operation) at each deletion and rename of the publish: the next export into the
    output rolls the journal forward before it even looks at the output (here it is then refused, without
    ``--overwrite``), so the output is the old export or the new one, whole; the user's files are kept."""
    out = _export_in_process(sources["b"], tmp_path / "out")
    (out / "notes.md").write_text("mine")
    (out / "train" / "keep.csv").write_text("a,b\n")
    log = tmp_path / "ops.txt"
    assert _under_fault("none", 0, log, sources["a"], out, "--overwrite").wait(timeout=120) == 0
    operations = _publish_operations(log, out)
    assert len(operations) >= 6, operations  # 2 stale files deleted, 6 renamed over or beside the old ones
    points = sorted({operations[0][0] - 1, operations[0][0], operations[1][0], operations[len(operations) // 2][0],
                     operations[-1][0]})
    seen = set()
    for at in points:
        _export_in_process(sources["b"], out, "--overwrite")
        crashed = _under_fault("crash", at, tmp_path / f"ops-{at}.txt", sources["a"], out, "--overwrite")
        assert crashed.wait(timeout=120) == CRASH_EXIT, crashed.communicate()
        assert cli_main(["export", str(sources["b"]), str(out)]) == 2  # recovers first, then refuses: no --overwrite
        seen.add(_which(_exported(out), expected))
        assert _beside(out) == [], at
        assert (out / "notes.md").read_text() == "mine" and (out / "train" / "keep.csv").read_text() == "a,b\n"
    assert seen == {"a", "b"}  # killed before its journal: the old export; after: rolled forward to the new one
    _export_in_process(sources["a"], out, "--overwrite")
    assert _which(_exported(out), expected) == "a"


def _tree(root: pathlib.Path) -> dict[str, tuple[int, str]]:
    """Every path below ``root`` (links not followed): its mode and its content's sha256 ("dir", "link -> ...")."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = pathlib.Path(directory, name)
            info = path.lstat()
            if path.is_symlink():
                what = "link -> " + os.readlink(path)
            elif path.is_dir():
                what = "dir"
            else:
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = (info.st_mode, what)
    return found


def test_an_export_changes_nothing_outside_its_output_and_keeps_the_users_files(sources, expected, tmp_path):
    parent = tmp_path / "parent"
    (parent / "other").mkdir(parents=True)
    (parent / "sibling.txt").write_text("beside the output")
    (parent / "sibling.txt").chmod(0o600)
    (parent / "other" / "data.parquet").write_bytes(b"not an export")
    (parent / "other").chmod(0o700)
    out = parent / "out"
    (out / "train").mkdir(parents=True)
    (out / "notes.md").write_text("mine")
    (out / "notes.md").chmod(0o640)
    (out / "train" / "mine.txt").write_text("kept")
    (out / ".hidden").write_text("kept too")
    out.chmod(0o2750)
    before = _tree(parent)
    _export_in_process(sources["a"], out, "--overwrite")
    assert cli_main(["export", str(sources["b"]), str(out)]) == 2  # refused (no --overwrite): leaves nothing beside
    _export_in_process(sources["b"], out, "--overwrite")
    after = _tree(parent)
    assert _which(_exported(out), expected) == "b"
    assert {name: entry for name, entry in after.items() if not (name.startswith("out/") and name.endswith(".parquet"))} == {
        **before, "out/eval": after["out/eval"]}  # the one new folder: the export's eval/
    assert after["out"] == before["out"] and after["out/train"] == before["out/train"]


@pytest.fixture(params=["gs", "s3"])
def strict_bucket(request):
    """A bucket on a server that honours conditional writes (fake-gcs-server for GCS, moto for S3): the lock needs them."""
    return request.getfixturevalue("gcs_strict_bucket" if request.param == "gs" else "s3_bucket")


def test_an_export_into_a_bucket_takes_the_same_lock(sources, expected, strict_bucket, tmp_path):
    """A live run holding the prefix's lock (a build, say) refuses the export in one line; once released, the export
    runs and leaves no lock or staging object behind."""
    from tfrbeam.beam.publish import OutputLock, this_run

    target = strict_bucket.url("exports/parquet")
    strict_bucket.put("exports/keep.txt", b"beside the output")
    before = strict_bucket.listing()
    lock = OutputLock(target, this_run("holder-run")).acquire()
    try:
        refused = _start(sources["a"], target, "--overwrite")
        code, stderr = refused.wait(timeout=120), refused.communicate()[1]
        _assert_refused_naming(code, stderr, os.getpid())
        assert "holder-run" in stderr
        assert {key for key in strict_bucket.listing() if key.startswith("exports/parquet/")} == set()
    finally:
        lock.release()
    done = _start(sources["a"], target, "--overwrite")
    assert done.wait(timeout=120) == 0, done.communicate()[1][-2000:]
    after = strict_bucket.listing()
    assert sorted(key[len("exports/parquet/"):] for key in after if key.startswith("exports/parquet/")) == \
        list(expected["a"][0])
    assert {key: digest for key, digest in after.items() if not key.startswith("exports/parquet/")} == before
