"""The generation check reads the manifest once per open, then one stat per shard (issue 43 item 6), and still
catches every change of the manifest a reader must not mix across."""

from __future__ import annotations

import builtins
import os
import pathlib
import time

import pytest

from benchmarks.shard_count_scaling import write_one_record_shards
from tests.planted import not_blocked_by
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.errors import DatasetChangedError, RefusedFileError
from tfrbeam.layout.generation import Generation

SHARDS = 40


@pytest.fixture()
def many_shards(tmp_path) -> pathlib.Path:
    return write_one_record_shards(tmp_path / "ds", SHARDS)


@pytest.fixture()
def manifest_opens(monkeypatch) -> list[str]:
    """Every open of a file named tfrbeam_dataset.json from now on (through open() or os.open)."""
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith("tfrbeam_dataset.json"):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def counting_os_open(path, *args, **kwargs):
        if str(path).endswith("tfrbeam_dataset.json"):
            opened.append(str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(os, "open", counting_os_open)
    return opened


def test_reading_every_shard_opens_the_manifest_a_fixed_number_of_times(many_shards, manifest_opens):
    # Before: once to open the dataset and once more per shard (41 here), each a read and a hash of all of it.
    batches = list(open_dataset(str(many_shards), "train", batch_size=7, prefetch=0, executor="threads"))
    assert sum(len(batch["x"]) for batch in batches) == SHARDS
    assert len(manifest_opens) <= 2, manifest_opens  # the open's read, and the first shard's proof
    dataset = open_random_access(str(many_shards), "train")
    assert sorted(int(dataset[number]["x"]) for number in range(len(dataset))) == list(range(SHARDS))
    assert len(manifest_opens) <= 4, manifest_opens


def _pinned(root: pathlib.Path) -> Generation:
    generation = Generation.of(str(root), (root / "tfrbeam_dataset.json").read_bytes())
    generation.check()  # the first check: read, hashed and kept as the proof
    return generation


def test_a_manifest_rewritten_in_place_after_the_proof_is_caught(many_shards):
    generation = _pinned(many_shards)
    manifest = many_shards / "tfrbeam_dataset.json"
    data = manifest.read_bytes().replace(b'"run_id": "scaling-40"', b'"run_id": "other-run-1"')
    with open(manifest, "r+b") as handle:  # same inode, same size: only the content (and so the ctime) differ
        handle.write(data)
    with pytest.raises(DatasetChangedError, match="run scaling-40 when reading started, run other-run-1 now"):
        generation.check()


def test_a_manifest_replaced_by_a_new_file_is_caught(many_shards):
    generation = _pinned(many_shards)
    manifest = many_shards / "tfrbeam_dataset.json"
    data = manifest.read_bytes().replace(b'"run_id": "scaling-40"', b'"run_id": "other-run-2"')
    (many_shards / "new.json").write_bytes(data)
    os.replace(many_shards / "new.json", manifest)
    with pytest.raises(DatasetChangedError, match="run other-run-2 now"):
        generation.check()


def test_a_touched_manifest_with_the_same_bytes_is_still_the_pinned_generation(many_shards):
    generation = _pinned(many_shards)
    later = time.time() + 10
    os.utime(many_shards / "tfrbeam_dataset.json", (later, later))
    generation.check()
    copy = many_shards / "copy.json"  # the same bytes in a new file (a restore from a backup): the same generation
    copy.write_bytes((many_shards / "tfrbeam_dataset.json").read_bytes())
    os.replace(copy, many_shards / "tfrbeam_dataset.json")
    generation.check()


def test_a_manifest_gone_or_planted_after_the_proof_is_caught(many_shards):
    generation = _pinned(many_shards)
    manifest = many_shards / "tfrbeam_dataset.json"
    manifest.unlink()
    with pytest.raises(DatasetChangedError, match="the manifest is gone"):
        generation.check()
    os.mkfifo(manifest)
    with not_blocked_by(manifest), pytest.raises(RefusedFileError, match="FIFO"):
        generation.check()
