"""An input file of the wrong kind or shape (issue 43): a FIFO hung the build (killed at 120 s), a link to /dev/zero
and a 5 GB sparse CSV of NULs took it past 1 GiB in 7-9 s (3.6 GB at 120 s for the sparse one: the header line was
read to its end). Each is now one line naming the file, in seconds, bounded in memory.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests.integration.bounded_child import run_bounded, tool_command

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture
def demo_inputs(tmp_path) -> pathlib.Path:
    done = run_bounded(tool_command("demo-data", str(tmp_path / "demo_data")), cwd=tmp_path, timeout=120)
    assert done.code == 0, done
    shutil.copy2(REPO_ROOT / "configs" / "demo.yaml", tmp_path / "demo.yaml")
    return tmp_path


def _plant(work: pathlib.Path, kind: str) -> pathlib.Path:
    target = sorted((work / "demo_data" / "csv").glob("flights-*.csv"))[0]
    head = target.read_bytes()[:64]
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    else:
        with open(target, "wb") as handle:
            handle.write(head)
            handle.truncate(5 << 30)  # 5 GB that cost no disk: one endless line
    return target


@pytest.mark.parametrize("kind,says", [("fifo", "a FIFO"), ("dev-zero", "a character device"),
                                       ("sparse", "no line break in its first 67108864 bytes")])
def test_an_input_of_the_wrong_kind_or_an_endless_line_is_one_line_naming_it(demo_inputs, kind, says):
    planted = _plant(demo_inputs, kind)
    run = run_bounded(tool_command("build", "demo.yaml", "--quiet"), cwd=demo_inputs, timeout=60, max_rss_mb=1024)
    assert run.killed is None, (kind, run.killed, run.seconds, run.peak_mb)
    assert run.code in (1, 2) and len(run.error_lines()) == 1, run
    assert planted.name in run.error_lines()[0] and says in run.error_lines()[0], run
    assert not (demo_inputs / "out" / "demo" / "tfrbeam_dataset.json").exists()
