"""Every file tfrbeam publishes is made with the user's umask (mode 0666 & ~umask), so the tools of another user work.

Measured (issue 42): under umask 022 the shards and the manifest were 0644, but the read indexes
(``.tfrbeam-index/*``), ``stats.json``, ``stats.html`` and every exported Parquet file were 0600
(temp files from ``mkstemp``, renamed); another user's ``tfrbeam verify`` then failed with
"Permission denied" and called the dataset damaged.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator

import pytest

from tests.example_builds import build_examples
from tfrbeam.cli.main import main as cli_main

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SECOND_USER = "nobody"


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _published(workdir: pathlib.Path, mask: int) -> dict[str, pathlib.Path]:
    """Build the demo, write its stats and export it, all under ``mask``: one file of each kind tfrbeam publishes."""
    with _umask(mask):
        dataset = build_examples(workdir, "demo.yaml")["demo"]
        assert cli_main(["stats", str(dataset)]) == 0
        assert cli_main(["export", str(dataset), str(workdir / "exported")]) == 0
    index_dir = dataset / "train" / ".tfrbeam-index"
    return {
        "shard": dataset / "train" / "train-00000-of-00004.tfrecord",
        "manifest": dataset / "tfrbeam_dataset.json",
        "read index": next(index_dir.glob("*.index")),
        "dead letters": next((dataset / "_errors").iterdir()),
        "stats.json": dataset / "stats.json",
        "stats.html": dataset / "stats.html",
        "export": workdir / "exported" / "train" / "train-00000-of-00004.parquet",
    }


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_every_kind_of_published_file_has_the_mode_the_umask_gives(tmp_path, mask):
    files = _published(tmp_path, mask)
    modes = {kind: oct(stat.S_IMODE(path.stat().st_mode)) for kind, path in files.items()}
    assert modes == {kind: oct(0o666 & ~mask) for kind in files}


@pytest.fixture
def shared_dir() -> Iterator[pathlib.Path]:
    """A directory every user can reach (pytest's own temp directories are 0700, this user's only)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="tfrbeam-second-user-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _as_second_user(uid: int, gid: int):
    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return drop


def _second_user_python(entry, env: dict[str, str]) -> str | None:
    """An interpreter of this Python version that the second user may run and that imports tfrbeam there.

    This venv's own interpreter may live where only its owner can go (a pyenv under /root): then the
    system's interpreter of the same version, with this venv's packages on its path, runs the tools.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, shutil.which(version), f"/usr/bin/{version}"]
    for candidate in dict.fromkeys(path for path in candidates if path):
        try:
            result = subprocess.run([candidate, "-c", "import tfrbeam, pyarrow"], cwd="/", env=env,
                                    capture_output=True, timeout=120,
                                    preexec_fn=_as_second_user(entry.pw_uid, entry.pw_gid))
        except OSError:
            continue
        if result.returncode == 0:
            return candidate
    return None


_READ_EVERYTHING = """
import sys
import pyarrow.parquet as pq
import tfrbeam
dataset, exported = sys.argv[1], sys.argv[2]
for split in ("train", "eval"):
    rows = sum(len(batch["flight_id"]) for batch in tfrbeam.open_dataset(dataset, split=split, batch_size=64))
    print(split, rows)
print("parquet", pq.read_table(exported).num_rows)
"""


def test_another_user_reads_the_dataset_its_stats_and_its_export(shared_dir):
    if os.geteuid() != 0:
        pytest.skip("running the tools as a second user needs root (to switch to that user); this test runs as "
                    f"uid {os.geteuid()}")
    try:
        import pwd
        entry = pwd.getpwnam(SECOND_USER)
    except KeyError:
        pytest.skip(f"no user {SECOND_USER!r} on this machine to run the tools as")
    packages = dict.fromkeys([str(REPO_ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent", "PYTHONPATH": os.pathsep.join(packages),
           "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": "/tmp"}
    python = _second_user_python(entry, env)
    if python is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that user {SECOND_USER!r} may run "
                    f"({sys.executable} is not reachable for it) to run the tools with")
    files = _published(shared_dir, 0o022)
    dataset, exported = files["manifest"].parent, shared_dir / "exported"
    commands = [
        ["verify", str(dataset)],
        ["cat", str(dataset / "train" / "train-00000-of-00004.tfrecord")],
        ["inspect", str(dataset / "eval")],
    ]
    for command in commands:
        result = subprocess.run([python, "-m", "tfrbeam.cli.main", *command], cwd="/", env=env,
                                capture_output=True, text=True, timeout=300,
                                preexec_fn=_as_second_user(entry.pw_uid, entry.pw_gid))
        assert result.returncode == 0, (command, result.stderr)
        assert "Permission denied" not in result.stderr
    result = subprocess.run([python, "-c", _READ_EVERYTHING, str(dataset), str(exported)], cwd="/", env=env,
                            capture_output=True, text=True, timeout=300,
                            preexec_fn=_as_second_user(entry.pw_uid, entry.pw_gid))
    assert result.returncode == 0, result.stderr
    counts = dict(line.split() for line in result.stdout.splitlines())
    assert int(counts["train"]) + int(counts["eval"]) == int(counts["parquet"]) > 0
