"""``open_random_access`` trusts what ``open_dataset`` trusts: the one manifest validator, confined paths, one generation.

Measured (issue 23): it accepted ``num_examples: -5`` and wrote its offsets index beside an outside
file. Its offsets index is written only inside the dataset directory (or beside the files a glob
named); where that path would lead out (a symlinked ``.tfrbeam-index``) the index stays in memory.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from tests.integration.sandbox import changed_outside, copy_dataset, edit_manifest, snapshot
from tfrbeam.dataset import open_random_access
from tfrbeam.errors import DatasetChangedError, ManifestError, UnsafePathError

EVAL = "eval/eval-00000-of-00001.tfrecord"


@pytest.mark.parametrize("key", ["split", "shard"])
def test_a_negative_count_is_refused_by_the_manifest_validator(demo_dataset, tmp_path, key):
    dataset = copy_dataset(demo_dataset, tmp_path / "sandbox")
    entry = (lambda m: m["splits"]["eval"]) if key == "split" else (lambda m: m["splits"]["eval"]["shards"][0])
    edit_manifest(dataset, lambda manifest: entry(manifest).__setitem__("num_examples", -5))
    with pytest.raises(ManifestError, match=r"num_examples: expected a non-negative integer, got -5"):
        open_random_access(str(dataset), split="eval")


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_a_shard_outside_the_dataset_is_refused_and_no_index_is_written_beside_it(demo_dataset, tmp_path, how):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    outside = sandbox / "elsewhere" / "x.tfrecord"
    outside.parent.mkdir()
    outside.write_bytes((dataset / EVAL).read_bytes())
    if how == "symlink":
        (dataset / EVAL).unlink()
        (dataset / EVAL).symlink_to(outside)
    else:
        path = str(outside) if how == "absolute" else "../elsewhere/x.tfrecord"
        edit_manifest(dataset, lambda manifest: manifest["splits"]["eval"]["shards"][0].__setitem__("path", path))
    before = snapshot(sandbox)
    with pytest.raises(UnsafePathError if how == "symlink" else ManifestError, match=r"outside|absolute|'\.\.'"):
        open_random_access(str(dataset), split="eval")[0]
    assert snapshot(sandbox) == before


def test_the_read_index_is_never_written_through_a_symlink_leading_out(demo_dataset, tmp_path):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    index_dir = dataset / "eval" / ".tfrbeam-index"
    for name in os.listdir(index_dir):
        (index_dir / name).unlink()
    index_dir.rmdir()
    (sandbox / "victim").mkdir()
    index_dir.symlink_to(sandbox / "victim", target_is_directory=True)
    before = snapshot(sandbox)
    records = open_random_access(str(dataset), split="eval", raw=True)
    assert len(records) == 283 and len(records[282]) > 0  # read, the index kept in memory
    assert changed_outside(before, snapshot(sandbox), ()) == {}


def test_the_read_index_is_written_inside_the_dataset(demo_dataset, tmp_path):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo_dataset, sandbox)
    offsets = dataset / "eval" / ".tfrbeam-index" / "eval-00000-of-00001.tfrecord.index"
    offsets.unlink(missing_ok=True)
    before = snapshot(sandbox)
    assert len(open_random_access(str(dataset), split="eval", raw=True)[:3]) == 3
    assert offsets.is_file()
    assert set(changed_outside(before, snapshot(sandbox), ())) == {str(offsets.relative_to(sandbox))}


def test_a_dataset_replaced_after_opening_is_refused_naming_both_runs(demo_dataset, tmp_path):
    dataset = copy_dataset(demo_dataset, tmp_path / "sandbox")
    records = open_random_access(str(dataset), split="eval")
    old_run = json.loads((dataset / "tfrbeam_dataset.json").read_text())["run"]["run_id"]
    edit_manifest(dataset, lambda manifest: manifest["run"].__setitem__("run_id", "the-next-build"))
    with pytest.raises(DatasetChangedError, match=rf"run {old_run} when reading started, run the-next-build now"):
        records[0]


def test_a_glob_of_files_keeps_its_index_beside_them(demo_dataset, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "a.tfrecord").write_bytes((demo_dataset / EVAL).read_bytes())
    assert len(open_random_access(str(files / "*.tfrecord"), raw=True)) == 283
    assert (files / ".tfrbeam-index" / "a.tfrecord.index").is_file()


def test_open_random_access_reads_exactly_the_manifests_records(demo_dataset, tmp_path):
    dataset = copy_dataset(demo_dataset, tmp_path / "sandbox")
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    records = open_random_access(str(dataset), split="train")
    assert len(records) == manifest["splits"]["train"]["num_examples"] == 2714
    assert sorted(records[len(records) - 1]) == sorted(manifest["features"])
    assert pathlib.Path(dataset / "train").is_dir()
