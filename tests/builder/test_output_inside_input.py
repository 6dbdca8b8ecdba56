"""A build never reads its own output (issue 43, item 10).

Measured: with the output inside the input glob (``d/**.tfrecord`` -> ``d/out``), same-config rebuilds gave
1,000 -> 2,000 -> 3,000 rows, exit 0. Such a build is refused at plan time, in one line naming the glob and the
output, locally and for gs:// and s3:// paths, before it reads or writes anything.
"""

from __future__ import annotations

import pathlib

import pytest

from tfrbeam.builder import run
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.pipeline.plan import check_output_outside_inputs
from tfrbeam.errors import ConfigError
from tfrbeam.layout.manifest import read_manifest


def _tfrecord_dataset(tmp_path: pathlib.Path, rows: int = 40) -> pathlib.Path:
    """``d/src``: a dataset of ``rows`` examples, built from a CSV file outside ``d``."""
    source = tmp_path / "rows.csv"
    source.write_text("id\n" + "".join(f"{i}\n" for i in range(rows)))
    run({"input": {"format": "csv", "path": str(source)}, "splits": {"train": 1.0},
         "output": {"path": str(tmp_path / "d" / "src"), "num_shards": 1}}, progress=False)
    return tmp_path / "d"


def _rebuild_config(pattern: str, output: pathlib.Path | str) -> dict:
    return {"input": {"format": "tfrecord", "path": pattern}, "splits": {"train": 1.0},
            "output": {"path": str(output), "num_shards": 1}}


def _snapshot(root: pathlib.Path) -> dict[str, bytes | None]:
    return {str(path): path.read_bytes() if path.is_file() else None for path in sorted(root.rglob("*"))}


def test_an_output_inside_the_input_glob_is_refused_before_anything_runs(tmp_path):
    """Item 10: d/**.tfrecord -> d/out. The first build would pass and each rebuild read the last one's shards; the
    plan refuses it in one line naming the glob and the output, and nothing is written."""
    directory = _tfrecord_dataset(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError) as raised:
        run(_rebuild_config(f"{directory}/**.tfrecord", directory / "out"), progress=False)
    message = str(raised.value)
    assert f"{directory}/**.tfrecord" in message and str(directory / "out") in message and "\n" not in message
    assert _snapshot(tmp_path) == before


def test_a_glob_that_leaves_the_output_out_builds_and_rebuilds_the_same_rows(tmp_path):
    """The same layout with a glob that cannot reach d/out: builds, and a same-config rebuild has the same rows."""
    directory = _tfrecord_dataset(tmp_path)
    config = _rebuild_config(f"{directory}/src/**.tfrecord", directory / "out")
    counts = []
    for _ in range(2):
        run(config, progress=False)
        counts.append(read_manifest(str(directory / "out")).split("train").num_examples)
    assert counts == [40, 40]


def test_a_relative_glob_and_a_directory_input_are_refused_as_well(tmp_path, monkeypatch):
    """A relative glob reaching the output, and a CSV input given as the directory the output is in (its files)."""
    _tfrecord_dataset(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'d/\*\*' matches files this build writes"):
        run(_rebuild_config("d/**", "d/out"), progress=False)
    (tmp_path / "csvs").mkdir()
    (tmp_path / "csvs" / "a.csv").write_text("id\n1\n")
    csv_config = {"input": {"format": "csv", "path": "csvs"}, "splits": {"train": 1.0},
                  "output": {"path": "csvs", "num_shards": 1}}
    with pytest.raises(ConfigError, match="matches files this build writes"):
        run(csv_config, progress=False)


def test_a_dataset_input_that_is_the_output_is_refused(tmp_path):
    """input.path naming the very dataset the build replaces: its shards are the output's own files."""
    directory = _tfrecord_dataset(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match="cannot read its own output"):
        run(_rebuild_config(str(directory / "src"), directory / "src"), overwrite=True, progress=False)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_an_object_store_output_inside_the_input_glob_is_refused(scheme):
    """The same check on bucket paths (a pure check of names: no request is made)."""
    config = parse_config(_rebuild_config(f"{scheme}://bucket/d/**.tfrecord", f"{scheme}://bucket/d/out"))
    with pytest.raises(ConfigError, match=f"{scheme}://bucket/d/out"):
        check_output_outside_inputs(config, [])
    check_output_outside_inputs(parse_config(_rebuild_config(f"{scheme}://bucket/d/src/*.tfrecord",
                                                             f"{scheme}://bucket/d/out")), [])


def test_split_globs_reaching_the_output_are_refused(tmp_path):
    """splits given as globs (splits: {train: GLOB}): each is checked, the message names its key."""
    config = parse_config({"input": {"format": "tfrecord"}, "splits": {"train": str(tmp_path / "d" / "**.tfrecord")},
                           "output": {"path": str(tmp_path / "d" / "out"), "num_shards": 1}})
    with pytest.raises(ConfigError, match=r"splits\.train"):
        check_output_outside_inputs(config, [])
