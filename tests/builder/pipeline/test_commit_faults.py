"""The build's publish under faults: a crash or a full disk at every file operation of the commit, kill -9, concurrent runs.

Invariants checked after every fault:
- the output holds the complete old dataset or the complete new one (verify finds nothing wrong,
  and no split directory holds shards of two builds);
- rerunning the same command succeeds without --overwrite beyond what the command had, and
  leaves nothing beside the output (no staging directory, no lock file).
"""

from __future__ import annotations

import csv
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.faults import injected
from tfrbeam.cli.build import main as build_main
from tfrbeam.layout.manifest import read_manifest, verify_dataset, write_leftovers

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
ROWS = 300


@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> pathlib.Path:
    write_rows_and_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_rows_and_config(tmp_path: pathlib.Path) -> None:
    """ROWS CSV rows and cfg.yaml building them into out/ds, in two splits of two shards."""
    with open(tmp_path / "rows.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "score", "name"])
        for i in range(ROWS):
            writer.writerow([i, i * 0.5, f"n{i % 7}"])
    (tmp_path / "cfg.yaml").write_text(
        "input: {format: csv, path: rows.csv}\nsplits: {train: 0.7, eval: 0.3}\noutput: {path: out/ds, num_shards: 2}\n"
    )


def _build(*args: str) -> int:
    return build_main(["cfg.yaml", "--quiet", *args])


def _faulted(workdir: pathlib.Path, kind: str, at: int, *args: str) -> tuple[int, list[str]]:
    """Run the build with one fault at commit operation ``at``; returns (exit code, operations).

    A crash needs a fresh process (it ends it); a full disk or a refused write is injected here.
    """
    if kind in ("enospc", "eacces", "none"):
        log: list[str] = []
        with injected(None if kind == "none" else kind, at, log):
            code = _build(*args)
        return code, log
    log = workdir / f"ops-{kind}-{at}.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "tests.faults", kind, str(at), str(log), "--", "build", "cfg.yaml", "--quiet", *args],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
    )
    return result.returncode, [line for line in log.read_text().splitlines() if line] if log.exists() else []


def _state(output: pathlib.Path) -> tuple[str | None, int | None]:
    """(run id, seed) of the valid dataset in ``output``; (None, None) when there is none. Fails on anything else."""
    found = read_manifest(str(output)) if output.exists() else None
    manifest = None if found is None else found.to_dict()
    if manifest is None:
        assert not output.exists() or not list(output.rglob("*.tfrecord")), f"shards without a manifest in {output}"
        return None, None
    assert verify_dataset(str(output)) == [], verify_dataset(str(output))
    return manifest["run"]["run_id"], manifest["seed"]


def _assert_clean(output: pathlib.Path) -> None:
    assert write_leftovers(str(output)) == []
    assert [name for name in os.listdir(output.parent) if name.startswith(".")] == []


def test_every_commit_operation_is_listed_and_a_clean_replace_uses_one_exchange(workdir):
    assert _build() == 0
    code, ops = _faulted(workdir, "none", 0, "--overwrite", "--set", "shuffle.seed=7")
    assert code == 0
    kinds = [line.split()[1] for line in ops]
    assert kinds.count("exchange") == 1 and kinds[-1] == "delete" and "write" in kinds
    # nothing of the old dataset is removed before the exchange: the old dataset is whole until the commit point
    assert all(kind != "delete" for kind in kinds[: kinds.index("exchange")])
    assert _state(workdir / "out" / "ds")[1] == 7


@pytest.fixture()
def sequence_workdir(workdir) -> pathlib.Path:
    """The same rows built as SequenceExamples: one per name, steps by id (and a dead-letter directory to publish)."""
    (workdir / "cfg.yaml").write_text(
        "input: {format: csv, path: rows.csv}\nsplits: {train: 0.7, eval: 0.3}\noutput: {path: out/ds, num_shards: 2}\n"
        "features: {id: {type: int64}, score: {type: float}, name: {type: bytes}}\n"
        "sequence: {group_by: [name], order_by: [id], max_steps: 20}\n"
        "errors: {on_bad_record: dead_letter, max_bad_fraction: 0.5}\n"
    )
    with open(workdir / "rows.csv", "a") as handle:
        handle.write("x,1.5,n0\n")  # an id that is no int64: a bad row, so the commit also moves a dead-letter file
    return workdir


@pytest.mark.parametrize("kind", ["crash", "enospc", "eacces"])
def test_a_fault_at_any_commit_operation_of_a_replace_leaves_old_or_new(workdir, kind):
    _sweep_faults_over_a_replace(workdir, kind)


def test_a_crash_at_any_commit_operation_of_a_sequence_build_leaves_old_or_new(sequence_workdir):
    _sweep_faults_over_a_replace(sequence_workdir, "crash")
    found = read_manifest(str(sequence_workdir / "out" / "ds"))
    assert found is not None
    manifest = found.to_dict()
    assert manifest["record_type"] == "SequenceExample"
    assert manifest["bad_records"]["files"] == ["_errors/00000-rows.csv.jsonl"]


def _sweep_faults_over_a_replace(workdir: pathlib.Path, kind: str) -> None:
    """A fault of ``kind`` at each commit operation of a replace in turn: old or new dataset, and the rerun recovers."""
    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    template = workdir / "template"
    shutil.copytree(output, template, symlinks=True)
    _, ops = _faulted(workdir, "none", 0, "--overwrite", "--set", "shuffle.seed=7")
    exchange = [line.split()[1] for line in ops].index("exchange") + 1
    shutil.rmtree(output)
    shutil.copytree(template, output, symlinks=True)
    outcomes = []
    for at in range(1, len(ops) + 1):
        code, _ = _faulted(workdir, kind, at, "--overwrite", "--set", "shuffle.seed=7")
        # After the commit point a cleanup fault is only a warning: the dataset is published.
        assert code == (137 if kind == "crash" else 1 if at <= exchange else 0), (at, ops[at - 1])
        run, seed = _state(output)
        assert run is not None, f"no dataset after a {kind} at {ops[at - 1]}"
        outcomes.append("old" if run == old_run else "new" if seed == 7 else "other")
        assert _build("--overwrite", "--set", "shuffle.seed=7") == 0  # the same command recovers
        assert _state(output)[1] == 7
        _assert_clean(output)
        shutil.rmtree(output)
        shutil.copytree(template, output, symlinks=True)
    # Until the exchange has run the old dataset stands; once it has, the new one: never neither, never a mix.
    assert outcomes[:exchange] == ["old"] * exchange
    assert outcomes[exchange:] == ["new"] * (len(ops) - exchange)


def test_a_crash_at_any_commit_operation_of_a_first_build_is_recovered_by_the_same_command(workdir):
    output = workdir / "out" / "ds"
    _, ops = _faulted(workdir, "none", 0)
    publish = [number for number, line in enumerate(ops, 1) if line.split()[2] == str(output)]
    assert [ops[number - 1].split()[1] for number in publish] == ["rename"]  # one rename publishes a first build
    shutil.rmtree(workdir / "out")
    for at in range(1, len(ops) + 1):
        code, _ = _faulted(workdir, "crash", at)
        assert code == 137
        run, _ = _state(output)
        assert (run is not None) == (at > publish[0]), at
        assert _build() == 0  # no --overwrite needed: a half-published first build never blocks the next one
        assert _state(output)[0] is not None
        _assert_clean(output)
        shutil.rmtree(workdir / "out")


def test_full_disk_at_the_start_is_reported_before_anything_runs(workdir, monkeypatch, capsys):
    import errno

    import tfrbeam.builder.pipeline.plan as plan

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(plan, "open", full, raising=False)
    assert _build() == 2
    error = capsys.readouterr().err
    assert "the disk is full" in error and "out/ds" in error and error.count("\n") == 1


def test_output_that_is_a_file_or_read_only_is_reported_before_anything_runs(workdir, capsys):
    (workdir / "out").mkdir()
    (workdir / "out" / "ds").write_text("a file")
    assert _build() == 2
    assert "out/ds is a file, not a directory" in capsys.readouterr().err
    (workdir / "out" / "ds").unlink()
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories; the read-only case needs a non-root user")
    (workdir / "out").chmod(0o555)
    try:
        assert _build() == 2
        assert "cannot write in" in capsys.readouterr().err
    finally:
        (workdir / "out").chmod(0o755)


def _start_build(workdir: pathlib.Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen([sys.executable, "-m", "tfrbeam.builder", "cfg.yaml", "--quiet", *args], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("delay", [0.6, 1.2, 1.8, 2.4])
def test_kill_9_at_any_moment_leaves_old_or_new_and_the_rerun_recovers(workdir, delay):
    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    process = _start_build(workdir, "--overwrite", "--set", "shuffle.seed=7")
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    run, seed = _state(output)
    assert run == old_run or seed == 7
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _state(output)[1] == 7
    _assert_clean(output)


def test_two_concurrent_builds_one_publishes_the_other_names_it(workdir):
    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    signal_path = workdir / "first.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    first = subprocess.Popen(  # paused inside its commit, holding the lock
        [sys.executable, "-m", "tests.faults", "wait", "1", str(signal_path), "--", "build", "cfg.yaml", "--quiet",
         "--overwrite", "--set", "shuffle.seed=7"], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 120
    while not pathlib.Path(str(signal_path) + ".waiting").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    second = _start_build(workdir, "--overwrite", "--set", "shuffle.seed=8")
    _, second_err = second.communicate(timeout=120)
    assert second.returncode == 1
    line = second_err.strip()
    assert "\n" not in line and "is in use by run" in line and f"pid {first.pid}" in line, line
    assert _state(output)[0] == old_run  # the refused run touched nothing
    pathlib.Path(str(signal_path) + ".go").touch()
    _, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert _state(output)[1] == 7
    _assert_clean(output)


def test_a_stale_lock_of_a_killed_build_is_taken_over(workdir):
    output = workdir / "out" / "ds"
    process = _start_build(workdir)
    deadline = time.monotonic() + 30
    while not (workdir / "out" / ".ds.tfrbeam-lock").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert _build() == 0
    assert _state(output)[0] is not None
    _assert_clean(output)


def test_the_users_own_files_survive_a_replace(workdir):
    output = workdir / "out" / "ds"
    assert _build() == 0
    (output / "NOTES.txt").write_text("mine")
    (output / "stats.json").write_text("{}")  # derived from the old dataset: replaced with it
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert (output / "NOTES.txt").read_text() == "mine" and not (output / "stats.json").exists()
    assert _state(output)[1] == 7


def test_verify_fails_on_a_half_published_directory_and_a_damaged_manifest(workdir, capsys):
    from tfrbeam.cli.main import main as tfrbeam_main

    output = workdir / "out" / "ds"
    assert _build() == 0
    manifest_file = output / "tfrbeam_dataset.json"
    text = manifest_file.read_text()
    manifest_file.unlink()  # the state the old commit left after a kill: shards, no manifest
    capsys.readouterr()
    assert tfrbeam_main(["verify", str(output)]) == 1
    assert "no manifest" in capsys.readouterr().out
    manifest_file.write_text(text.replace('"sha256"', '"sha"', 1))
    assert tfrbeam_main(["verify", str(output)]) == 1
    out = capsys.readouterr().out
    assert "sha256 is missing" in out and "Traceback" not in out
    manifest_file.write_text(text)
    (workdir / "out" / ".ds.tfrbeam-0123456789abcdef").mkdir()
    assert tfrbeam_main(["verify", str(output)]) == 0
    assert "WARN" in capsys.readouterr().out  # a leftover staging directory is reported, the dataset is fine


def test_a_full_disk_while_writing_shards_names_the_file_and_keeps_the_old_dataset(workdir, monkeypatch, capsys):
    import errno

    from tfrbeam.builder.shuffle import write

    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    capsys.readouterr()
    with monkeypatch.context() as patched:
        patched.setattr(write._HashingFile, "write", full)
        assert _build("--overwrite", "--set", "shuffle.seed=7") == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "No space left on device" in error and "writing shard" in error and ".ds.tfrbeam-" in error
    assert _state(output)[0] == old_run
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    _assert_clean(output)


# ---------------------------------------------------------------- a sequence build's spilled held rows


def _held_row_operations(monkeypatch, fail_at: int | None = None) -> list[str]:
    """Log (and optionally fail with ENOSPC at number ``fail_at``) every file operation on spilled held rows: the
    spilling store's one writer and reader of spill files, and the file system's deletes."""
    import errno

    from tfrbeam.beam import filesystem as fs
    from tfrbeam.builder.shuffle import held
    from tfrbeam.layout.names import HELD_ROWS_DIR

    log: list[str] = []
    real_write, real_read, real_delete, real_unlink = held.write_spill_file, held.read_spilled, fs.delete_files, fs.unlink_local

    def step(op: str, path: str) -> None:
        log.append(f"{op} {path}")
        if len(log) == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

    def ours(path: str) -> bool:  # held rows' run files; the pieces' spill files and the rest are not counted here
        return f"{os.sep}{HELD_ROWS_DIR}{os.sep}" in path

    def write(path, blocks, overlap=False):
        if ours(path):
            step("write", path)
        return real_write(path, blocks, overlap)

    def read(path, offset, size, what):
        if ours(path):
            step("read", path)
        return real_read(path, offset, size, what)

    def delete(paths):
        paths = list(paths)
        for path in paths:
            if ours(path):
                step("delete", path)
        real_delete(paths)

    def unlink(path):  # local spill files are unlinked one call each
        if ours(path):
            step("delete", path)
        real_unlink(path)

    monkeypatch.setattr(held, "write_spill_file", write)
    monkeypatch.setattr(held, "read_spilled", read)
    monkeypatch.setattr(fs, "delete_files", delete)
    monkeypatch.setattr(fs, "unlink_local", unlink)
    return log


def test_a_fault_at_any_held_rows_operation_of_a_sequence_replace_leaves_old_or_new(sequence_workdir, monkeypatch):
    """--memory_store_bytes=0 spills every held batch. ENOSPC at each spill write, read back or delete in turn: a
    failed write or read fails the build with the old dataset whole; a failed delete only warns (new dataset);
    the rerun recovers and nothing is left beside the output."""
    output = sequence_workdir / "out" / "ds"
    assert _build() == 0
    with monkeypatch.context() as patched:
        clean = _held_row_operations(patched)
        assert _build("--overwrite", "--set", "shuffle.seed=7", "--memory_store_bytes=0") == 0
    kinds = [line.split()[0] for line in clean]
    assert {"write", "read", "delete"} <= set(kinds), kinds
    for at, kind in enumerate(kinds, 1):
        assert _build("--overwrite", "--set", "shuffle.seed=8") == 0  # a fresh old dataset for each fault
        old_run, _ = _state(output)
        with monkeypatch.context() as patched:
            _held_row_operations(patched, fail_at=at)
            code = _build("--overwrite", "--set", "shuffle.seed=7", "--memory_store_bytes=0")
        run, seed = _state(output)
        if kind == "delete":
            assert code == 0 and seed == 7, (at, kind)
        else:
            assert code == 1 and run == old_run, (at, kind)
        _assert_clean(output)
        assert _build("--overwrite", "--set", "shuffle.seed=7", "--memory_store_bytes=0") == 0
        assert _state(output)[1] == 7
        _assert_clean(output)


_PAUSE_AFTER_FIRST_SPILL = """
import pathlib, sys, time
from tfrbeam.builder.shuffle import held
real = held.write_spill_file
def write(path, blocks, overlap=False):
    real(path, blocks, overlap)
    if "held-rows" in path:
        pathlib.Path(sys.argv[1]).touch()
        time.sleep(120)
held.write_spill_file = write
from tfrbeam.cli.build import main
sys.exit(main(sys.argv[2:]))
"""


def test_kill_9_while_held_rows_are_spilled_leaves_old_and_the_rerun_recovers(sequence_workdir):
    """A sequence build killed with a spilled held-rows file on disk: the old dataset stays whole, the rerun
    publishes, and neither the held-rows file nor its staging directory stays behind."""
    output = sequence_workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    spilled = sequence_workdir / "spilled.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, "-c", _PAUSE_AFTER_FIRST_SPILL, str(spilled), "cfg.yaml", "--quiet", "--overwrite", "--set",
         "shuffle.seed=7", "--memory_store_bytes=0"], cwd=sequence_workdir, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not spilled.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert spilled.exists(), process.communicate()
    assert list((sequence_workdir / "out").glob(".ds.tfrbeam-*/held-rows/*.arrows"))
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert _state(output)[0] == old_run
    assert _build("--overwrite", "--set", "shuffle.seed=7", "--memory_store_bytes=0") == 0
    assert _state(output)[1] == 7
    _assert_clean(output)
    assert not list((sequence_workdir / "out").rglob("*.arrows"))


def test_two_concurrent_sequence_builds_spilling_held_rows_leave_one_valid_dataset(sequence_workdir):
    """Two processes spill held rows beside the same output at once: each into its own staging directory; the
    lock lets one publish at a time (or refuses the other, naming it), and one whole dataset remains."""
    output = sequence_workdir / "out" / "ds"
    assert _build() == 0
    builds = [_start_build(sequence_workdir, "--overwrite", "--set", f"shuffle.seed={seed}", "--memory_store_bytes=0")
              for seed in (7, 8)]
    results = [(build.wait(timeout=180), build.communicate()[1]) for build in builds]
    assert all(code == 0 or (code == 1 and "is in use by run" in err) for code, err in results), results
    assert any(code == 0 for code, _ in results)
    assert _state(output)[1] in {seed for seed, (code, _) in zip((7, 8), results) if code == 0}
    _assert_clean(output)
    assert not list((sequence_workdir / "out").rglob("*.arrows"))


# ---------------------------------------------------------------- planted files beside the output (issue 23)


def _snapshot(root: pathlib.Path, skip: pathlib.Path) -> dict[str, bytes | str]:
    """Every path under ``root`` but ``skip`` (the output) with its contents (symlinks by target)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents or path.name.startswith(".ds.tfrbeam-lock"):
            continue
        found[str(path)] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return found


def test_a_planted_journal_beside_the_output_touches_nothing_outside_it(workdir, caplog):
    import json

    (workdir / "important.txt").write_text("keep me")
    (workdir / "app.conf").write_text("conf")
    planted = workdir / "out" / ".ds.tfrbeam-zz"
    planted.mkdir(parents=True)
    (planted / "commit.json").write_text(json.dumps({
        "run_id": "z", "target": "x", "deletions": [str(workdir / "important.txt")],
        "moves": [[str(workdir / "app.conf"), str(workdir / "stolen.conf")]]}))
    before = _snapshot(workdir, workdir / "out" / "ds")
    assert _build() == 0
    assert _snapshot(workdir, workdir / "out" / "ds") == before
    assert "commit.json" in caplog.text


def test_a_planted_staging_dir_with_a_symlinked_old_dataset_moves_nothing_in(workdir, caplog):
    import json
    import socket

    output = workdir / "out" / "ds"
    assert _build() == 0
    run_id = read_manifest(str(output)).run_id
    victim = workdir / "victim"
    victim.mkdir()
    (victim / "secret.txt").write_text("secret")
    planted = workdir / "out" / ".ds.tfrbeam-yy"
    planted.mkdir()
    pid = next(p for p in range(4_000_000, 1, -1) if not os.path.exists(f"/proc/{p}"))
    (planted / "owner.json").write_text(json.dumps({"run_id": run_id, "host": socket.gethostname(), "pid": pid,
                                                    "started": "x", "process_start": None, "command": "x"}))
    (planted / "old").symlink_to(victim)
    before = _snapshot(workdir, output)
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _snapshot(workdir, output) == before
    assert not (output / "secret.txt").exists()
    assert "symbolic link" in caplog.text


def test_a_lock_file_that_is_a_symlink_is_refused_in_one_line(workdir, capsys):
    (workdir / "victim.txt").write_text("victim")
    (workdir / "out").mkdir()
    (workdir / "out" / ".ds.tfrbeam-lock").symlink_to(workdir / "victim.txt")
    assert _build() == 2  # OutputNotWritableError: what was given must change (tfrbeam/cli/exit_codes.py)
    assert (workdir / "victim.txt").read_text() == "victim"
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "symbolic link" in error and ".ds.tfrbeam-lock" in error


def test_a_sigterm_after_the_commit_point_says_the_new_dataset_is_published(workdir):
    output = workdir / "out" / "ds"
    assert _build() == 0
    _, ops = _faulted(workdir, "none", 0, "--overwrite", "--set", "shuffle.seed=7")
    after_exchange = [line.split()[1] for line in ops].index("exchange") + 2  # 1-based: the operation after the swap
    signal_path = workdir / "paused"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.faults", "wait", str(after_exchange), str(signal_path), "--", "build", "cfg.yaml",
         "--quiet", "--overwrite", "--set", "shuffle.seed=8"], cwd=workdir, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not pathlib.Path(str(signal_path) + ".waiting").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143
    ours = [line for line in err.splitlines() if line.startswith("tfrbeam build:")]
    assert len(ours) == 1 and "after the commit point: the new dataset is published at out/ds" in ours[0], err
    assert _state(output)[1] == 8  # it was published, as the line says
    assert _build("--overwrite", "--set", "shuffle.seed=8") == 0
    _assert_clean(output)
