"""Files of the wrong kind or size planted in a dataset: every tool refuses in one line, in seconds and little memory,
or (a bad index, which readers ignore) returns exactly the dataset's records; nothing outside the dataset changes.

Issue 43 item 1: a FIFO manifest hung every tool, a 5 GB sparse manifest (or one linked to ``/dev/zero``) took them
past 3 GB, a manifest linked to one outside the dataset was followed, and a FIFO shard or index hung the readers.
Each tool runs in a child process killed at its time limit or at 1 GiB, so a regression fails instead of hanging.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable

import pytest

from tests.integration.bounded_child import ChildRun, api_command, changed_outside, kind_snapshot, run_bounded, tool_command
from tests.integration.sandbox import copy_dataset

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = "tfrbeam_dataset.json"
SHARD = "train/train-00001-of-00004.tfrecord"
READ_INDEX = "train/.tfrbeam-index/train-00001-of-00004.tfrecord.index"
OLD_INDEX = "train/.tfrbeam-index/train-00001-of-00004.tfrecord.offsets"  # what datasets written before kept too
MAX_RSS_MB = 1024


def _replace_with_fifo(relative: str) -> Callable[[pathlib.Path], None]:
    def plant(dataset: pathlib.Path) -> None:
        (dataset / relative).unlink(missing_ok=True)
        os.mkfifo(dataset / relative)
    return plant


def _sparse_manifest(dataset: pathlib.Path) -> None:
    with open(dataset / MANIFEST, "r+b") as handle:
        handle.truncate(5 << 30)  # 5 GB that cost no disk


def _manifest_linked_to(target: Callable[[pathlib.Path], str]) -> Callable[[pathlib.Path], None]:
    def plant(dataset: pathlib.Path) -> None:
        link_target = target(dataset)
        (dataset / MANIFEST).unlink()
        (dataset / MANIFEST).symlink_to(link_target)
    return plant


def _manifest_outside(dataset: pathlib.Path) -> str:
    """A valid manifest outside the dataset (a copy of its own): following the link would read it without complaint."""
    outside = dataset.parent / "elsewhere"
    outside.mkdir()
    shutil.copy2(dataset / MANIFEST, outside / MANIFEST)
    return f"../elsewhere/{MANIFEST}"


PLANTS: dict[str, tuple[Callable[[pathlib.Path], None], str]] = {  # how to plant it, and what a refusal names
    "a FIFO manifest": (_replace_with_fifo(MANIFEST), MANIFEST),
    "a 5 GB sparse manifest": (_sparse_manifest, MANIFEST),
    "a manifest linked to /dev/zero": (_manifest_linked_to(lambda _: "/dev/zero"), MANIFEST),
    "a manifest linked to a manifest outside": (_manifest_linked_to(_manifest_outside), MANIFEST),
    "a FIFO shard": (_replace_with_fifo(SHARD), SHARD.rsplit("/", 1)[1]),
    "a FIFO read index": (_replace_with_fifo(READ_INDEX), READ_INDEX.rsplit("/", 1)[1]),
    "a FIFO offsets index of before": (_replace_with_fifo(OLD_INDEX), OLD_INDEX.rsplit("/", 1)[1]),
}
INDEXES = ("a FIFO read index", "a FIFO offsets index of before")  # readers ignore a bad index: they must give the same records

TOOLS: dict[str, Callable[[pathlib.Path, pathlib.Path], list[str]]] = {  # (dataset, the demo's work dir) -> command
    "verify": lambda dataset, _: tool_command("verify", str(dataset)),
    "cat": lambda dataset, _: tool_command("cat", str(dataset)),
    "inspect": lambda dataset, _: tool_command("inspect", str(dataset)),
    "stats": lambda dataset, _: tool_command("stats", str(dataset)),
    "open_dataset": lambda dataset, _: api_command("open_dataset", str(dataset)),
    "open_random_access": lambda dataset, _: api_command("open_random_access", str(dataset)),
    "build --overwrite": lambda dataset, _: tool_command(
        "build", str(REPO_ROOT / "configs" / "demo.yaml"), "--quiet", "--set", f"output.path={dataset}", "--overwrite"),
}


@pytest.fixture(scope="module")
def clean_outputs(demo_dataset, tmp_path_factory) -> dict[str, str]:
    """Each reading tool's output on the unchanged dataset (its path written as DS)."""
    outputs = {}
    dataset = copy_dataset(demo_dataset, tmp_path_factory.mktemp("clean"))
    for tool in ("cat", "inspect", "open_dataset", "open_random_access"):
        run = _run(tool, dataset, demo_dataset.parents[1])
        assert run.code == 0, run
        outputs[tool] = run.stdout.replace(str(dataset), "DS")
    return outputs


def _run(tool: str, dataset: pathlib.Path, workdir: pathlib.Path) -> ChildRun:
    timeout = 120.0 if tool == "build --overwrite" else 30.0
    return run_bounded(TOOLS[tool](dataset, workdir), cwd=workdir, timeout=timeout, max_rss_mb=MAX_RSS_MB)


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_planted_kind_is_refused_in_one_line_or_read_exactly(demo_dataset, clean_outputs, tmp_path, tool, plant):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    plant_it, named = PLANTS[plant]
    plant_it(dataset)
    before = kind_snapshot(sandbox)
    run = _run(tool, dataset, demo_dataset.parents[1])
    assert run.killed is None, f"{tool} on {plant}: killed at its {run.killed} limit after {run.seconds:.1f} s, " \
                               f"{run.peak_mb:.0f} MB: {run.stderr[-500:]}"
    assert "Traceback" not in run.stdout + run.stderr, run
    assert not changed_outside(before, kind_snapshot(sandbox), "ds")
    if tool == "build --overwrite" and plant not in PLANTS_REFUSED_BY_BUILD:
        assert run.code == 0, run  # the old dataset's own shard or index is replaced, never opened
        assert run_bounded(tool_command("verify", str(dataset))).code == 0
    elif plant in INDEXES and tool != "verify":
        assert run.code == 0, run
        if tool in clean_outputs:
            assert run.stdout.replace(str(dataset), "DS") == clean_outputs[tool]
    else:
        _assert_one_line_naming(run, named, tool)


PLANTS_REFUSED_BY_BUILD = tuple(name for name in PLANTS if "manifest" in name)


def _assert_one_line_naming(run: ChildRun, named: str, tool: str) -> None:
    assert run.code in (1, 2), run
    if tool == "verify":
        failures = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
        assert len(failures) == 1 and named in failures[0], run
    else:
        assert len(run.error_lines()) == 1 and named in run.error_lines()[0], run
