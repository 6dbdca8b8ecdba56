"""What the commit trusts (issue 23, "Nothing outside a dataset is ever touched"): the commit side.

Every test snapshots the output's parent directory (paths and contents) before and after and
checks that nothing but the output itself (and the run's own staging directory and lock, which
are gone after a success) changed.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import socket

import pytest

from tests.build.test_commit_faults import ROWS, _assert_clean, _build, _state
from tfrbeam.manifest import read_manifest

LOCK_NAME = ".ds.tfrbeam-lock"


@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> pathlib.Path:
    """The rows and config of test_commit_faults: 300 CSV rows built into out/ds in two splits of two shards."""
    with open(tmp_path / "rows.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "score", "name"])
        for i in range(ROWS):
            writer.writerow([i, i * 0.5, f"n{i % 7}"])
    (tmp_path / "cfg.yaml").write_text(
        "input: {format: csv, path: rows.csv}\nsplits: {train: 0.7, eval: 0.3}\noutput: {path: out/ds, num_shards: 2}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _parent_snapshot(output: pathlib.Path) -> dict[str, bytes | str]:
    """Every path under the output's parent but the output and its lock, with contents (symlinks by target)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(output.parent.rglob("*")):
        if path == output or output in path.parents or path.name == LOCK_NAME:
            continue
        found[str(path)] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return found


def _dead_pid() -> int:
    return next(pid for pid in range(4_000_000, 1, -1) if not os.path.exists(f"/proc/{pid}"))


def _owner(run_id: str, output: str | None, pid: int | None = None) -> str:
    """An owner.json of a dead run on this host, naming ``output`` (left out when None)."""
    record: dict = {"run_id": run_id, "host": socket.gethostname(), "pid": pid or _dead_pid(), "started": "x",
                    "process_start": None, "command": "x"}
    if output is not None:
        record["output"] = output
    return json.dumps(record)


def _warnings_naming(caplog, path: pathlib.Path) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelname == "WARNING" and str(path) in record.getMessage()]


# ------------------------------------------------------------------ 1. owner.json names the output


def _plant(workdir: pathlib.Path, name: str, owner: str | bytes | None) -> pathlib.Path:
    """A dead run's staging directory beside out/ds holding a journal that would delete and move user files."""
    (workdir / "out").mkdir(exist_ok=True)
    output = workdir / "out" / "ds"
    planted = workdir / "out" / name
    planted.mkdir()
    if owner is not None:
        (planted / "owner.json").write_bytes(owner.encode() if isinstance(owner, str) else owner)
    (planted / "keep.bin").write_bytes(b"someone's data")
    (workdir / "out" / "other.txt").write_text("not the dataset's")
    (planted / "commit.json").write_text(json.dumps({
        "run_id": "zz", "target": str(output), "deletions": [str(output / "NOTES.md")],
        "moves": [[str(planted / "keep.bin"), str(output / "keep.bin")]]}))
    return planted


def _check_left_alone(workdir: pathlib.Path, caplog, owner: str | bytes | None) -> None:
    output = workdir / "out" / "ds"
    assert _build() == 0
    (output / "NOTES.md").write_text("mine")
    planted = _plant(workdir, ".ds.tfrbeam-zz", owner)
    before = _parent_snapshot(output)
    caplog.clear()
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _parent_snapshot(output) == before  # the planted directory, its journal's targets: all untouched
    assert (output / "NOTES.md").read_text() == "mine" and not (output / "keep.bin").exists()
    assert _state(output)[1] == 7
    warned = _warnings_naming(caplog, planted)
    assert len(warned) == 1 and "left" in warned[0] and "alone" in warned[0], warned


def test_a_staging_dir_whose_owner_names_another_output_is_left_alone(workdir, caplog):
    _check_left_alone(workdir, caplog, _owner("zz", str(workdir / "elsewhere" / "ds")))


def test_a_staging_dir_without_owner_json_is_left_alone(workdir, caplog):
    _check_left_alone(workdir, caplog, None)


def test_a_staging_dir_with_an_unreadable_owner_json_is_left_alone(workdir, caplog):
    _check_left_alone(workdir, caplog, b"\xff{not json")


def test_a_staging_dir_whose_owner_names_no_output_is_left_alone(workdir, caplog):
    """An owner.json that does not say which output it belongs to (as before this was recorded) proves nothing."""
    _check_left_alone(workdir, caplog, _owner("zz", None))


def test_a_dead_runs_staging_dir_naming_this_output_is_recovered(workdir, caplog):
    output = workdir / "out" / "ds"
    assert _build() == 0
    before = _parent_snapshot(output)
    planted = workdir / "out" / ".ds.tfrbeam-zz"
    planted.mkdir()
    (planted / "owner.json").write_text(_owner("zz", str(output)))
    (planted / "part.tfrecord").write_bytes(b"partial")
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert not planted.exists() and _parent_snapshot(output) == before
    _assert_clean(output)


def test_the_owner_json_a_build_writes_names_its_output(workdir):
    from tfrbeam.beam.publish import StagingDir, this_run

    output = workdir / "out" / "ds"
    staging = StagingDir(str(workdir / "out" / ".ds.tfrbeam-abc"), this_run("abc"), str(output)).create()
    record = json.loads(pathlib.Path(staging.join("owner.json")).read_text())
    assert record["output"] == str(output) and record["run_id"] == "abc" and record["pid"] == os.getpid()


def test_recovery_acts_on_no_journal_whose_run_is_not_the_owners(workdir, caplog):
    """A journal naming another run than owner.json does is not this staging directory's commit."""
    output = workdir / "out" / "ds"
    assert _build() == 0
    (output / "NOTES.md").write_text("mine")
    planted = _plant(workdir, ".ds.tfrbeam-yy", _owner("yy", str(output)))
    before = _parent_snapshot(output)
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _parent_snapshot(output) == before and (output / "NOTES.md").read_text() == "mine"
    assert len(_warnings_naming(caplog, planted)) == 1
    assert read_manifest(str(output))["seed"] == 7


def test_a_staging_dir_holding_only_an_empty_owner_json_is_removed(workdir):
    """A run killed while it wrote owner.json (one small write: complete or empty) leaves nothing worth keeping."""
    output = workdir / "out" / "ds"
    assert _build() == 0
    before = _parent_snapshot(output)
    for name, empty_owner in ((".ds.tfrbeam-e1", True), (".ds.tfrbeam-e2", False)):
        (workdir / "out" / name).mkdir()
        if empty_owner:
            (workdir / "out" / name / "owner.json").write_bytes(b"")
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _parent_snapshot(output) == before
    _assert_clean(output)
