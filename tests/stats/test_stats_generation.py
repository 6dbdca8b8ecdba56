"""`tfrbeam stats` pins the dataset's generation end to end (issue 43, item 13).

Measured: `stats` racing a replace failed with `[Errno 2] No such file or directory` (exit 2) instead of
DatasetChangedError naming both runs, and write_dataset_stats did not check the generation before writing.
Here the replace is made to happen at the worst moments (while the shards are read, and between the last
check and the write) and nothing may be written, into the old dataset or the new one.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import tfrbeam.stats.compute as compute
from tfrbeam.builder import run
from tfrbeam.cli.main import main as cli_main
from tfrbeam.errors import DatasetChangedError
from tfrbeam.layout.manifest import read_manifest


@pytest.fixture()
def dataset(tmp_path) -> pathlib.Path:
    (tmp_path / "rows.csv").write_text("id,score\n" + "".join(f"{i},{i / 2}\n" for i in range(80)))
    _build(tmp_path, shards=2)
    return tmp_path / "ds"


def _build(tmp_path: pathlib.Path, shards: int) -> str:
    """Build (or replace) tmp_path/ds; the shard count sets the shard names, so a replace removes the old ones."""
    run({"input": {"format": "csv", "path": str(tmp_path / "rows.csv")}, "splits": {"train": 0.5, "eval": 0.5},
         "output": {"path": str(tmp_path / "ds"), "num_shards": shards}}, overwrite=True, progress=False)
    return read_manifest(str(tmp_path / "ds")).run_id


def test_stats_racing_a_replace_names_both_runs_and_writes_nothing(dataset, monkeypatch, capsys):
    """The replace lands while stats reads the shards: their old names are gone. One line naming both runs, exit 1."""
    first = read_manifest(str(dataset)).run_id
    replaced: list[str] = []
    original = compute.check_shard_sizes  # the first look at the shards, after the dataset was resolved

    def replace_first(segments: Any) -> Any:
        replaced.append(_build(dataset.parent, shards=3))
        return original(segments)

    monkeypatch.setattr(compute, "check_shard_sizes", replace_first)
    assert cli_main(["stats", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert first in err and replaced[0] in err and "No such file" not in err and len(err.strip().splitlines()) == 1
    assert not (dataset / "stats.json").exists() and not (dataset / "stats.html").exists()


def test_a_replace_between_the_check_and_the_write_leaves_no_statistics_in_the_new_dataset(dataset, monkeypatch):
    """The replace lands after the statistics were computed and checked, as the files are written: they go with the
    old directory, not beside the new manifest, and DatasetChangedError names both runs."""
    first = read_manifest(str(dataset)).run_id
    replaced: list[str] = []
    original = compute.write_stats_files

    def replace_then_write(stats: Any, output_dir: str, title: str | None = None) -> Any:
        replaced.append(_build(dataset.parent, shards=3))
        return original(stats, output_dir, title)

    monkeypatch.setattr(compute, "write_stats_files", replace_then_write)
    with pytest.raises(DatasetChangedError) as raised:
        compute.write_dataset_stats(str(dataset))
    assert (raised.value.pinned, raised.value.found) == (first, replaced[0])
    assert not (dataset / "stats.json").exists() and not (dataset / "stats.html").exists()
    assert [path.name for path in dataset.parent.iterdir() if path.name.startswith(".")] == []


def test_stats_of_an_unchanged_dataset_are_written_beside_its_manifest(dataset):
    json_path, html_path = compute.write_dataset_stats(str(dataset))
    assert (json_path, html_path) == (str(dataset / "stats.json"), str(dataset / "stats.html"))
    assert (dataset / "stats.json").stat().st_size > 0 and (dataset / "stats.html").stat().st_size > 0
