"""What the commit trusts (issue 23, "Nothing outside a dataset is ever touched"): the commit side.

Every test snapshots the output's parent directory (paths and contents) before and after and
checks that nothing but the output itself (and the run's own staging directory and lock, which
are gone after a success) changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket

import pytest

from tests.builder.pipeline.test_commit_faults import _assert_clean, _build, _state, write_rows_and_config
from tfrbeam.layout.manifest import read_manifest

LOCK_NAME = ".ds.tfrbeam-lock"


@pytest.fixture()
def workdir(tmp_path, monkeypatch) -> pathlib.Path:
    """The rows and config of test_commit_faults: 300 CSV rows built into out/ds in two splits of two shards."""
    write_rows_and_config(tmp_path)
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


def _any_run(text: str) -> str:
    """``text`` with every run's staging directory name made the same (each run has its own id)."""
    import re

    return re.sub(r"\.ds\.tfrbeam-[0-9a-f]{16}", ".ds.tfrbeam-RUN", text)


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
    assert read_manifest(str(output)).to_dict()["seed"] == 7


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


# ------------------------------------------------------------------ 2. only the launcher publishes

_PAUSE_AT_COMMIT = """
import importlib.abc, importlib.util, os, pathlib, sys, time

MARK, PAUSE = os.environ["TFRBEAM_TEST_COMMIT_MARK"], float(os.environ["TFRBEAM_TEST_COMMIT_PAUSE"])


def _patch(module):
    build_manifest = module.build_manifest  # called once the commit step has read all its inputs

    def paused(*args, **kwargs):
        manifest = build_manifest(*args, **kwargs)
        pathlib.Path(MARK).write_text(str(os.getpid()))
        time.sleep(PAUSE)
        return manifest

    module.build_manifest = paused


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tfrbeam.builder.pipeline.commit":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
"""


def _process_group_alive(group: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                alive.append(int(entry))
    return alive


@pytest.mark.parametrize("workers", [["--direct_running_mode=multi_processing", "--direct_num_workers=2"], ["--workers=2"]],
                         ids=["beam-workers", "forked-workers"])
def test_a_killed_multi_processing_launcher_leaves_no_worker_that_publishes(workdir, workers):
    """kill -9 of the launcher while a worker is at the commit step: nothing publishes afterwards, the rerun works.

    With Beam's own direct options Beam starts the workers; with ``--workers 2`` they are forked by the build's
    fork server, which leaves with its launcher too (and takes its socket with it)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.builder.pipeline.test_commit_faults import REPO_ROOT

    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    before = _parent_snapshot(output)
    hooks = workdir / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_PAUSE_AT_COMMIT)
    mark, pause = workdir / "at-commit.txt", 0.3  # short: a worker outlives its launcher by about 2 s
    env = dict(os.environ, PYTHONPATH=f"{hooks}{os.pathsep}{REPO_ROOT}", TFRBEAM_TEST_COMMIT_MARK=str(mark),
               TFRBEAM_TEST_COMMIT_PAUSE=str(pause))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfrbeam.builder", "cfg.yaml", "--quiet", "--overwrite", "--set", "shuffle.seed=7",
         *workers],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.02)
        assert mark.exists(), "the build never reached its commit step"
        assert int(mark.read_text() or 0) != launcher.pid  # the commit step runs in a worker process
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        time.sleep(pause + 4)  # the worker's pause ends; an orphan that publishes would have done so by now
        assert _state(output)[0] == old_run, "a worker published after its launcher was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _process_group_alive(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _process_group_alive(launcher.pid) == []
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0  # the second build recovers and publishes
    assert _state(output)[1] == 7
    assert _parent_snapshot(output) == before
    _assert_clean(output)


def test_recovery_completes_a_journal_whose_files_are_already_gone(tmp_path, monkeypatch):
    """Files the journal lists that are gone, or go while it runs (another process did that step): done, not an error."""
    from tfrbeam.beam import filesystem
    from tfrbeam.beam.publish import recover

    output = tmp_path / "out" / "ds"
    output.mkdir(parents=True)
    (output / "a.tfrecord").write_bytes(b"moved in by an earlier attempt")
    (output / "b.tfrecord").write_bytes(b"moved in while this recovery ran")
    staging = tmp_path / "out" / ".ds.tfrbeam-dd"
    staging.mkdir()
    (staging / "owner.json").write_text(_owner("dd", str(output)))
    (staging / "c.tfrecord").write_bytes(b"still staged")
    (tmp_path / "out" / "user.txt").write_text("mine")
    vanishing = {str(output / "old-1.tfrecord"), str(staging / "b.tfrecord")}  # seen, then gone when acted on
    (staging / "commit.json").write_text(json.dumps({
        "run_id": "dd", "target": str(output),
        "deletions": [str(output / "old-0.tfrecord"), str(output / "old-1.tfrecord")],
        "moves": [[str(staging / name), str(output / name)] for name in ("a.tfrecord", "b.tfrecord", "c.tfrecord")]}))
    real_exists = filesystem.exists
    monkeypatch.setattr(filesystem, "exists", lambda path: path in vanishing or real_exists(path))
    before = _parent_snapshot(output)
    assert recover(str(output)) == [str(staging)]
    assert sorted(os.listdir(output)) == ["a.tfrecord", "b.tfrecord", "c.tfrecord"]
    assert (output / "c.tfrecord").read_bytes() == b"still staged"
    after = _parent_snapshot(output)
    assert {path: value for path, value in before.items() if not path.startswith(str(staging))} == after


def test_a_lock_file_naming_this_run_is_no_proof_of_holding_the_lock(tmp_path):
    """The race measured: a dead launcher's lock file still names its run while a second run holds the lock."""
    import subprocess
    import sys

    import pytest

    from tfrbeam.beam.publish import held_or_taken, lock_path, this_run
    from tfrbeam.errors import OutputLockedError

    target = str(tmp_path / "ds")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tfrbeam.beam.publish import OutputLock, this_run\n"
         "OutputLock(sys.argv[1], this_run('second')).acquire()\nprint('held', flush=True)\ntime.sleep(30)", target],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parents[3])))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        first = this_run("first")
        pathlib.Path(lock_path(target)).write_bytes(first.to_json())  # what the file said before the second run wrote it
        published = []
        with pytest.raises(OutputLockedError), held_or_taken(target, first):
            published.append(True)
        assert published == []
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------ 3. user files inside split directories


def test_user_files_inside_split_and_errors_directories_survive_a_rebuild(workdir):
    """A same-config rebuild (no --overwrite) and a replace both keep the user's files in train/ and _errors/."""
    output = workdir / "out" / "ds"
    assert _build() == 0
    mine = {"train/NOTES.md": b"my notes", "_errors/mine.txt": b"my errors", "eval/sub/deep.txt": b"deep",
            "NOTES.txt": b"top"}
    for relative, data in mine.items():
        (output / relative).parent.mkdir(parents=True, exist_ok=True)
        (output / relative).write_bytes(data)
    before = _parent_snapshot(output)
    for args in ((), ("--overwrite", "--set", "shuffle.seed=7")):
        assert _build(*args) == 0
        assert {relative: (output / relative).read_bytes() for relative in mine} == mine, args
        assert _parent_snapshot(output) == before
        _assert_clean(output)
    manifest = read_manifest(str(output)).to_dict()
    assert manifest["seed"] == 7 and all((output / shard["path"]).exists()
                                         for split in manifest["splits"].values() for shard in split["shards"])
    assert not list(output.rglob("*.previous"))


# ------------------------------------------------------------------ 4. a full disk at the commit names the path


def test_a_full_disk_at_any_commit_write_names_the_path_and_says_the_old_dataset_is_intact(workdir, capsys):
    from tests.faults import injected

    output = workdir / "out" / "ds"
    assert _build() == 0
    old_run, _ = _state(output)
    before = _parent_snapshot(output)
    log: list[str] = []
    with injected(None, 0, log):
        assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _build("--overwrite") == 0  # the first config again: the old dataset for every fault below
    old_run, _ = _state(output)
    kinds = [line.split()[1] for line in log]
    exchange = kinds.index("exchange") + 1
    for at in range(1, exchange + 1):
        capsys.readouterr()
        faulted: list[str] = []  # this run's own numbering: steps in threads (index stamping) vary in order
        with injected("enospc", at, faulted):
            assert _build("--overwrite", "--set", "shuffle.seed=7") == 1, log[at - 1]
        error = capsys.readouterr().err.strip()
        path = _any_run(faulted[at - 1].split(" ", 2)[2])
        assert "\n" not in error and path in _any_run(error) and "disk is full" in error, (log[at - 1], error)
        assert "the old dataset at out/ds is intact" in error, (log[at - 1], error)
        assert _state(output)[0] == old_run
        assert _parent_snapshot(output) == before


def test_library_callers_publish_in_the_pipeline_or_from_their_launcher(workdir):
    """build_pipeline's default publishes in the Commit step; publish=False stages it for commit_staged."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.commit import commit_staged
    from tfrbeam.builder.pipeline.graph import build_pipeline
    from tfrbeam.layout.names import COMMIT_RECORD

    output = workdir / "out" / "ds"
    before = _parent_snapshot(output)
    config = load_config("cfg.yaml", [])
    with beam.Pipeline(options=PipelineOptions([])) as pipeline:
        plan = build_pipeline(pipeline, config)
    assert read_manifest(str(output)).run_id == plan.run.run_id
    staged_config = load_config("cfg.yaml", ["shuffle.seed=7"])
    with beam.Pipeline(options=PipelineOptions([])) as pipeline:
        plan = build_pipeline(pipeline, staged_config, overwrite=True, publish=False)
    assert read_manifest(str(output)).to_dict()["seed"] != 7  # staged, not published
    assert (pathlib.Path(plan.staging_dir) / COMMIT_RECORD).exists()
    manifest = commit_staged(plan)
    assert manifest is not None and read_manifest(str(output)).run_id == plan.run.run_id
    assert _parent_snapshot(output) == before
    _assert_clean(output)


def test_the_in_pipeline_commit_refuses_when_its_launcher_has_ended(workdir):
    import dataclasses

    import pytest

    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.commit import CommitDataset, discard_staging
    from tfrbeam.builder.pipeline.plan import plan_build
    from tfrbeam.errors import CommitError

    plan = plan_build(load_config("cfg.yaml", []))
    ended = dataclasses.replace(plan, run=dataclasses.replace(plan.run, pid=_dead_pid(), process_start=None))
    with pytest.raises(CommitError, match=r"has ended, so this worker published nothing to out/ds"):
        next(CommitDataset(ended).process(None, [], [], []))
    assert not (workdir / "out" / "ds").exists()
    discard_staging(plan)


def test_a_full_disk_between_the_two_renames_of_a_swap_keeps_the_old_dataset_for_recovery(workdir, monkeypatch, capsys):
    """Where the filesystem cannot exchange, a failure after the old dataset was moved aside keeps it (never discarded)."""
    import errno

    from tests.faults import injected
    from tfrbeam.beam import filesystem

    def no_exchange(first, second):
        raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here", second)

    monkeypatch.setattr(filesystem, "exchange", no_exchange)
    output = workdir / "out" / "ds"
    assert _build() == 0
    (output / "NOTES.txt").write_text("mine")
    before = _parent_snapshot(output)
    log: list[str] = []
    with injected(None, 0, log):
        assert _build("--overwrite", "--set", "shuffle.seed=7") == 0
    assert _build("--overwrite") == 0
    old_run, _ = _state(output)
    into_place = [number for number, line in enumerate(log, 1) if line.split(" ", 2)[1:] == ["rename", str(output)]]
    assert len(into_place) == 1  # target -> staging/old goes elsewhere; staging/dataset -> target is this one
    capsys.readouterr()
    with injected("enospc", into_place[0], []):
        assert _build("--overwrite", "--set", "shuffle.seed=7") == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "disk is full" in error and "holds no complete dataset now" in error, error
    assert not output.exists()
    kept = [path for path in (workdir / "out").glob(".ds.tfrbeam-*/old") if read_manifest(str(path)).run_id == old_run]
    assert kept, "the old dataset was discarded"
    assert _build("--overwrite", "--set", "shuffle.seed=7") == 0  # recovery completes the swap, then this run replaces it
    assert _state(output)[1] == 7 and (output / "NOTES.txt").read_text() == "mine"
    assert _parent_snapshot(output) == before
    _assert_clean(output)


# ------------------------------------------------------------------ on object stores: the same rules, by prefix


@pytest.mark.parametrize("owner", ["missing", "another output", "this output"])  # the journal is hostile in all
def test_on_an_object_store_recovery_trusts_only_a_staging_prefix_owned_by_this_output(owner, caplog):
    """memfs:// has no directories, as gs:// and s3:// have none: a staging "directory" is a key prefix."""
    from tests import memfs
    from tfrbeam.beam.publish import recover

    bucket = f"memfs://trust-{owner.replace(' ', '-')}"
    memfs.clear(bucket)
    output, planted = f"{bucket}/out/ds", f"{bucket}/out/.ds.tfrbeam-zz"
    memfs._FILES[f"{bucket}/important.txt"] = (b"the user's", 0.0)
    memfs._FILES[f"{output}/NOTES.md"] = (b"mine", 0.0)
    memfs._FILES[f"{planted}/part.tfrecord"] = (b"partial", 0.0)
    if owner != "missing":
        named = output if owner == "this output" else f"{bucket}/elsewhere/ds"
        memfs._FILES[f"{planted}/owner.json"] = (_owner("zz", named).encode(), 0.0)
    memfs._FILES[f"{planted}/commit.json"] = (json.dumps({
        "run_id": "zz", "target": output, "deletions": [f"{bucket}/important.txt"], "moves": []}).encode(), 0.0)
    before = memfs.files_under(bucket)
    caplog.clear()
    with caplog.at_level("WARNING"):
        recover(output, prefix_output=True)
    after = memfs.files_under(bucket)
    # Unproven, or proven this output's but with a journal naming a key outside its staging prefix and output:
    # everything is left as it was, with one warning naming the prefix.
    assert after == before
    warned = [record.getMessage() for record in caplog.records if planted in record.getMessage()]
    assert len(warned) == 1 and "alone" in warned[0], warned
    memfs.clear(bucket)


def test_on_an_object_store_a_dead_runs_staging_prefix_owned_by_this_output_is_removed_and_nothing_else():
    from tests import memfs
    from tfrbeam.beam.publish import recover

    bucket = "memfs://trust-owned"
    memfs.clear(bucket)
    output, planted = f"{bucket}/out/ds", f"{bucket}/out/.ds.tfrbeam-zz"
    memfs._FILES[f"{bucket}/out/.ds.tfrbeam-zzz-not-staging.txt"] = (b"a look-alike name", 0.0)
    memfs._FILES[f"{output}/NOTES.md"] = (b"mine", 0.0)
    memfs._FILES[f"{planted}/part.tfrecord"] = (b"partial", 0.0)
    memfs._FILES[f"{planted}/owner.json"] = (_owner("zz", output).encode(), 0.0)
    before = memfs.files_under(bucket)
    removed = recover(output, prefix_output=True)
    after = memfs.files_under(bucket)
    assert removed == [planted]
    assert after == {name: data for name, data in before.items() if not name.startswith("out/.ds.tfrbeam-zz/")}
    memfs.clear(bucket)


def test_a_lock_held_by_a_run_that_has_not_said_who_it_is_is_refused_saying_so(tmp_path, monkeypatch):
    """A holder takes the lock, then writes its identity: a run refused in between waits for it, then says it could
    not learn who holds the output, never that the lock file is damaged."""
    import fcntl

    import pytest

    from tfrbeam.beam import publish
    from tfrbeam.errors import OutputLockedError

    target = str(tmp_path / "ds")
    monkeypatch.setattr(publish, "_HOLDER_WAITS", 3)
    fd = os.open(publish.lock_path(target), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held (flock is per open file), nothing written yet
        with pytest.raises(OutputLockedError, match=r"is in use by another run \(its lock file does not say which"):
            publish.OutputLock(target, publish.this_run("second")).acquire()
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == [os.path.basename(publish.lock_path(target))]


@pytest.mark.parametrize("plant", ["fifo", "sparse"])
def test_a_commit_record_planted_as_a_fifo_or_a_huge_file_is_refused_in_one_line(workdir, plant):
    """The staged commit record is read bounded and typed (issue 43): a FIFO hung commit_staged, a sparse 5 GB file
    was read whole; now either is refused naming the record, and nothing is published."""
    import threading

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.config import load_config
    from tfrbeam.builder.pipeline.commit import commit_staged
    from tfrbeam.builder.pipeline.graph import build_pipeline
    from tfrbeam.errors import CommitError
    from tfrbeam.layout.names import COMMIT_RECORD

    config = load_config("cfg.yaml", [])
    with beam.Pipeline(options=PipelineOptions([])) as pipeline:
        plan = build_pipeline(pipeline, config, publish=False)
    record = pathlib.Path(plan.staging_dir) / COMMIT_RECORD
    record.unlink()
    if plant == "fifo":
        os.mkfifo(record)
    else:
        with open(record, "wb") as handle:
            handle.truncate(5 << 30)
    outcome: list[BaseException | object] = []

    def commit() -> None:
        try:
            outcome.append(commit_staged(plan))
        except BaseException as error:  # the test inspects whatever it raised
            outcome.append(error)

    worker = threading.Thread(target=commit, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "commit_staged still reading the planted record after 30 s"
    assert isinstance(outcome[0], CommitError) and str(record) in str(outcome[0]), outcome
    assert "\n" not in str(outcome[0])
    assert not (workdir / "out" / "ds" / "tfrbeam_dataset.json").exists()
