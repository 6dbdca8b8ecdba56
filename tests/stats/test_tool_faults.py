"""The fault sweep over `tfrbeam stats` and `tfrbeam export`: a crash or a full disk at every file operation.

Invariant: each file at a final name is whole (stats.json parses, every Parquet file reads with the
shard's row count), the dataset itself is untouched, nothing outside the dataset and the export's
output changes, and a rerun succeeds. The operations are the ones ``tests.faults`` numbers through
``layout.fileops.mutating``, the one layer every write, rename and delete goes through.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.example_builds import build_examples
from tests.integration.sandbox import snapshot
from tfrbeam.cli.main import main as cli_main

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    return build_examples(tmp_path_factory.mktemp("faults"), "demo.yaml")["demo"]


def _faulted(workdir: pathlib.Path, kind: str, at: int, *command: str) -> tuple[int, list[str], str]:
    log = workdir / f"ops-{command[0]}-{kind}-{at}.txt"
    result = subprocess.run([sys.executable, "-m", "tests.faults", kind, str(at), str(log), "--", *command],
                            cwd=workdir, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                            capture_output=True, text=True, timeout=180)
    operations = [line for line in log.read_text().splitlines() if line] if log.exists() else []
    return result.returncode, operations, result.stderr


def _dataset_files(root: pathlib.Path) -> dict[str, str]:
    return {name: digest for name, digest in snapshot(root).items() if not name.startswith("stats.")}


def _check_stats_whole(root: pathlib.Path) -> None:
    path = root / "stats.json"
    if path.exists():
        assert json.loads(path.read_text())["splits"], "stats.json at its final name is not whole"
    html = root / "stats.html"
    if html.exists():
        assert html.read_text().rstrip().endswith("</html>")


def _check_export_whole(out: pathlib.Path, expected_rows: dict[str, int]) -> None:
    for path in out.rglob("*.parquet"):
        relative = str(path.relative_to(out))
        assert pq.read_metadata(path).num_rows == expected_rows[relative], relative


@pytest.mark.parametrize("kind", ["crash", "enospc"])
def test_a_fault_at_any_stats_operation_leaves_whole_files_or_none(dataset, tmp_path, kind):
    workdir = dataset.parent
    code, operations, err = _faulted(workdir, "none", 0, "stats", str(dataset))
    assert code == 0 and len(operations) >= 4, (operations, err)  # temp create, write, rename, for each file
    assert {operation.split()[1] for operation in operations} >= {"create", "write", "rename"}
    before_dataset = _dataset_files(dataset)
    for at in range(1, len(operations) + 1):
        (dataset / "stats.json").unlink(missing_ok=True)
        (dataset / "stats.html").unlink(missing_ok=True)
        before_parent = {name: digest for name, digest in snapshot(workdir).items()
                         if not name.startswith(("ops-", dataset.name))}
        code, _, err = _faulted(workdir, kind, at, "stats", str(dataset))
        assert code != 0, (at, operations[at - 1])
        if kind == "enospc":
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        _check_stats_whole(dataset)
        assert _dataset_files(dataset) == before_dataset or _only_stats_temps(dataset, before_dataset)
        after_parent = {name: digest for name, digest in snapshot(workdir).items()
                        if not name.startswith(("ops-", dataset.name))}
        assert after_parent == before_parent
        assert cli_main(["stats", str(dataset)]) == 0
        _check_stats_whole(dataset)


def _only_stats_temps(root: pathlib.Path, before: dict[str, str]) -> bool:
    """A crash may leave our own mkstemp temps (.stats.json.XXXX.tmp); nothing else in the dataset may differ."""
    after = _dataset_files(root)
    extra = set(after) - set(before)
    return all(name.startswith(".stats.") and name.endswith(".tmp") for name in extra) and \
        all(after.get(name) == digest for name, digest in before.items())


@pytest.mark.parametrize("kind", ["crash", "enospc"])
def test_a_fault_at_any_export_operation_leaves_whole_parquet_files_or_none(dataset, tmp_path, kind):
    workdir = dataset.parent
    out = tmp_path / "exported"
    code, operations, err = _faulted(workdir, "none", 0, "export", str(dataset), str(out))
    assert code == 0 and operations, err
    expected_rows = {str(path.relative_to(out)): pq.read_metadata(path).num_rows for path in out.rglob("*.parquet")}
    assert expected_rows and sum(expected_rows.values()) == sum(
        split["num_examples"] for split in json.loads((dataset / "tfrbeam_dataset.json").read_text())["splits"].values())
    before_dataset = snapshot(dataset)
    for at in range(1, len(operations) + 1):
        target = tmp_path / f"out-{at}"
        code, _, err = _faulted(workdir, kind, at, "export", str(dataset), str(target))
        assert code != 0, (at, operations[at - 1])
        if kind == "enospc":
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        if target.exists():
            _check_export_whole(target, expected_rows)
        assert snapshot(dataset) == before_dataset
        assert cli_main(["export", str(dataset), str(target), "--overwrite"]) == 0
        _check_export_whole(target, expected_rows)
        assert sorted(str(path.relative_to(target)) for path in target.rglob("*.parquet")) == sorted(expected_rows)
