"""The readers and files of the wrong kind: a FIFO shard or manifest is one error naming it, at once (issue 43 item 1);
a manifest listing one shard twice is refused, never read as duplicated records (item 11)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from benchmarks.shard_count_scaling import write_one_record_shards
from tests.planted import not_blocked_by
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.errors import ManifestError, RefusedFileError

SHARDS = 6


@pytest.fixture()
def dataset(tmp_path) -> pathlib.Path:
    return write_one_record_shards(tmp_path / "ds", SHARDS)


def _read_all(reader: str, root: pathlib.Path) -> list[int]:
    if reader == "open_dataset":
        batches = open_dataset(str(root), "train", batch_size=4, prefetch=0, executor="threads")
        return [int(value) for batch in batches for value in batch["x"]]
    records = open_random_access(str(root), "train")
    return [int(records[number]["x"]) for number in range(len(records))]


def _refused_in_time(path: pathlib.Path, reader: str, root: pathlib.Path, error: type[Exception]) -> str:
    with not_blocked_by(path), pytest.raises(error) as raised:
        _read_all(reader, root)
    return str(raised.value)


@pytest.mark.parametrize("reader", ["open_dataset", "open_random_access"])
def test_a_fifo_shard_is_refused_at_once_naming_it(dataset, reader):
    shard = dataset / "train" / f"train-00003-of-{SHARDS:05d}.tfrecord"
    shard.unlink()
    os.mkfifo(shard)
    message = _refused_in_time(shard, reader, dataset, RefusedFileError)
    assert message.startswith(f"{shard}: a FIFO") and len(message.splitlines()) == 1


@pytest.mark.parametrize("reader", ["open_dataset", "open_random_access"])
def test_a_fifo_manifest_is_refused_at_once_naming_it(dataset, reader):
    manifest = dataset / "tfrbeam_dataset.json"
    manifest.unlink()
    os.mkfifo(manifest)
    assert _refused_in_time(manifest, reader, dataset, ManifestError).startswith(f"{manifest}: a FIFO")


@pytest.mark.parametrize("reader", ["open_dataset", "open_random_access"])
def test_a_shard_listed_twice_is_refused_not_read_twice(dataset, reader):
    assert sorted(_read_all(reader, dataset)) == list(range(SHARDS))
    manifest_path = dataset / "tfrbeam_dataset.json"
    manifest = json.loads(manifest_path.read_text())
    split = manifest["splits"]["train"]
    split["shards"].append(dict(split["shards"][2]))
    split["num_examples"] += 1  # the counts add up, as in the attack
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[6\]\.path: .* listed twice"):
        _read_all(reader, dataset)
