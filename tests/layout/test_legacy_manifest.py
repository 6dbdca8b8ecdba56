"""Datasets built before still open everywhere: manifests of format 1 (how the run went at the top level, not in a
``run`` record), under their own name or the one they had before TFDS output took it (``dataset_info.json``).

A dataset of today is turned into one of before by writing its manifest back in format 1 (and renaming it); every
reader and tool must find it, and a build replacing it must leave no stale manifest (locally and in a bucket) nor
touch the user's files.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.beam.publish import committed_run
from tfrbeam.errors import ManifestError
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.manifest import find_manifest, read_manifest
from tfrbeam.layout.names import LEGACY_MANIFEST_NAME, MANIFEST_NAME

ROWS = 120


def _table(offset: int = 0) -> pa.Table:
    return pa.table({"id": list(range(offset, offset + ROWS)), "text": [f"row {i}" for i in range(offset, offset + ROWS)]})


def _format_1(data: bytes) -> bytes:
    """A manifest of today as a build before wrote it: format 1, the run record's keys at the top level."""
    manifest = json.loads(data)
    run = manifest.pop("run")
    return (json.dumps({**manifest, "format": "tfrbeam-dataset/1", **run}, indent=2) + "\n").encode()


def _legacy_dataset(tmp_path: pathlib.Path, name: str = LEGACY_MANIFEST_NAME) -> pathlib.Path:
    dataset = tmp_path / "old"
    tfrbeam.write_dataset(_table(), str(dataset), splits={"train": 0.75, "eval": 0.25}, num_shards=2, seed=5,
                          progress=False)
    data = _format_1((dataset / MANIFEST_NAME).read_bytes())
    os.remove(dataset / MANIFEST_NAME)
    (dataset / name).write_bytes(data)
    return dataset


def _cli(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", *args], cwd=cwd, capture_output=True, text=True)


def _ids(dataset) -> list[int]:
    return sorted(int(value) for batch in dataset for value in batch["id"])


@pytest.mark.parametrize("name", [LEGACY_MANIFEST_NAME, MANIFEST_NAME])
def test_a_dataset_built_before_opens_in_the_reader_random_access_and_every_tool(tmp_path, name):
    dataset = _legacy_dataset(tmp_path, name)
    assert find_manifest(str(dataset)) == str(dataset / name)
    run_id = json.loads((dataset / name).read_text())["run_id"]
    assert committed_run(str(dataset)) == run_id  # what a build replacing it or recovering a crash asks
    assert Generation.of(str(dataset), (dataset / name).read_bytes(), name).run_id == run_id
    assert _ids(tfrbeam.open_dataset(str(dataset), split="train+eval", batch_size=32)) == list(range(ROWS))
    assert len(tfrbeam.open_random_access(str(dataset), split="train")) == read_manifest(str(dataset)).split(
        "train").num_examples
    for command in (["verify", str(dataset)], ["inspect", str(dataset)], ["cat", str(dataset), "--limit", "2"],
                    ["stats", str(dataset), "--output-dir", str(tmp_path / "stats")]):
        result = _cli(*command, cwd=tmp_path)
        assert result.returncode == 0, (command, result.stderr)


def test_a_dataset_built_before_is_an_input_of_a_build(tmp_path):
    dataset = _legacy_dataset(tmp_path)
    rebuilt = tmp_path / "rebuilt"
    result = tfrbeam.builder.run({"input": {"path": str(dataset), "format": "tfrecord"},
                                  "output": {"path": str(rebuilt), "num_shards": 1}}, progress=False)
    assert result is not None and sum(result.num_examples.values()) == ROWS


@pytest.mark.parametrize("name", [LEGACY_MANIFEST_NAME, MANIFEST_NAME])
def test_a_replace_of_a_dataset_built_before_leaves_one_manifest_and_the_users_files(tmp_path, name):
    dataset = _legacy_dataset(tmp_path, name)
    (dataset / "NOTES.md").write_text("mine")
    result = tfrbeam.write_dataset(_table(1000), str(dataset), num_shards=2, seed=5, progress=False, overwrite=True)
    assert (dataset / MANIFEST_NAME).is_file() and not (dataset / LEGACY_MANIFEST_NAME).exists()
    assert committed_run(str(dataset)) == result.plan.run.run_id
    assert (dataset / "NOTES.md").read_text() == "mine"
    assert _ids(tfrbeam.open_dataset(str(dataset), split="train", batch_size=64)) == list(
        range(1000, 1000 + ROWS))


def test_a_replace_with_tfds_output_puts_tfds_files_where_the_old_manifest_was(tmp_path):
    dataset = _legacy_dataset(tmp_path)
    tfrbeam.write_dataset(_table(), str(dataset), num_shards=2, seed=5, progress=False, overwrite=True, tfds="rows")
    assert json.loads((dataset / LEGACY_MANIFEST_NAME).read_text())["name"] == "rows"
    assert read_manifest(str(dataset)).to_dict()["tfds"] == {"name": "rows", "version": "1.0.0"}
    assert _cli("verify", str(dataset), cwd=tmp_path).returncode == 0


def test_a_directory_tfds_wrote_is_refused_in_one_line_naming_its_file(tmp_path):
    tfds_dir = tmp_path / "tfds"
    tfds_dir.mkdir()
    (tfds_dir / LEGACY_MANIFEST_NAME).write_text(json.dumps({"name": "mnist", "version": "3.0.1", "fileFormat": "tfrecord",
                                                             "splits": [{"name": "train", "shardLengths": ["10"]}]}))
    with pytest.raises(ManifestError) as raised:
        tfrbeam.open_dataset(str(tfds_dir), split="train")
    message = str(raised.value)
    assert str(tfds_dir / LEGACY_MANIFEST_NAME) in message and "TFDS" in message and "\n" not in message


@pytest.mark.parametrize("with_tfds, name", [(False, LEGACY_MANIFEST_NAME), (True, LEGACY_MANIFEST_NAME),
                                             (False, MANIFEST_NAME)])
def test_a_replace_in_a_bucket_of_a_dataset_built_before(bucket, with_tfds, name):
    options = {"num_shards": 2, "seed": 5, "progress": False, "pipeline_options": bucket.pipeline_args()}
    tfrbeam.write_dataset(_table(), bucket.url("ds"), **options)
    data = _format_1(bucket.get(f"ds/{MANIFEST_NAME}"))
    bucket.delete(f"ds/{MANIFEST_NAME}")
    bucket.put(f"ds/{name}", data)
    bucket.put("ds/NOTES.md", b"mine")
    bucket.put("elsewhere/keep.bin", b"\x01")
    assert _ids(tfrbeam.open_dataset(bucket.url("ds"), split="train", batch_size=64)) == list(range(ROWS))
    before = bucket.listing()

    tfrbeam.write_dataset(_table(500), bucket.url("ds"), overwrite=True, **({"tfds": "rows"} if with_tfds else {}),
                          **options)
    after = bucket.listing()
    assert after["ds/NOTES.md"] == before["ds/NOTES.md"] and after["elsewhere/keep.bin"] == before["elsewhere/keep.bin"]
    assert f"ds/{MANIFEST_NAME}" in after
    if with_tfds:
        assert json.loads(bucket.get(f"ds/{LEGACY_MANIFEST_NAME}"))["name"] == "rows"
    else:
        assert f"ds/{LEGACY_MANIFEST_NAME}" not in after, "the replaced dataset's manifest was left behind"
    assert _ids(tfrbeam.open_dataset(bucket.url("ds"), split="train", batch_size=64)) == list(
        range(500, 500 + ROWS))
