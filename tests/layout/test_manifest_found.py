"""The manifest as a found file: of the wrong kind or size it is one ManifestError line, at once (issue 43 item 1),
and one that lists a shard twice is invalid, in the one validator every tool uses (item 11)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time

import pytest

from tests.planted import not_blocked_by
from tfrbeam.errors import ManifestError
from tfrbeam.layout.manifest import check_manifest_file, load_manifest, read_manifest, verify_dataset
from tfrbeam.layout.manifest_schema import Manifest


@pytest.fixture()
def dataset(demo_dataset, tmp_path):
    """A copy of the demo build (train: 4 shards, eval: 1) in ``tmp_path/sandbox/ds``."""
    copy = tmp_path / "sandbox" / "ds"
    shutil.copytree(demo_dataset, copy)
    return copy


@pytest.fixture(scope="module")
def demo_dataset(tmp_path_factory):
    from tests.example_builds import build_examples

    return build_examples(tmp_path_factory.mktemp("manifest-found"), "demo.yaml")["demo"]


def _plant_fifo(path) -> None:
    path.unlink()
    os.mkfifo(path)


def test_a_fifo_manifest_is_refused_at_once_by_every_reader_of_it(dataset):
    manifest = dataset / "tfrbeam_dataset.json"
    _plant_fifo(manifest)
    with not_blocked_by(manifest):
        with pytest.raises(ManifestError, match="FIFO") as refused:
            load_manifest(str(manifest))
        with pytest.raises(ManifestError, match="FIFO"):
            read_manifest(str(dataset))
        problems = verify_dataset(str(dataset))
    assert str(manifest) in str(refused.value)
    assert len(problems) == 1 and "FIFO" in problems[0] and str(manifest) in problems[0]


def test_a_sparse_5_gb_manifest_is_refused_from_its_size_without_reading_it(dataset):
    manifest = dataset / "tfrbeam_dataset.json"
    with open(manifest, "r+b") as handle:
        handle.truncate(5 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(ManifestError, match=f"{5 << 30} bytes, larger than any manifest"):
        read_manifest(str(dataset))
    assert time.monotonic() - started < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB


@pytest.mark.parametrize("target", ["/dev/zero", "outside"])
def test_a_manifest_that_is_a_symlink_is_refused_wherever_it_leads(dataset, target):
    manifest = dataset / "tfrbeam_dataset.json"
    if target == "outside":  # a valid manifest outside the dataset: following the link would read it happily
        outside = dataset.parent / "other.json"
        shutil.copy2(manifest, outside)
        target = str(outside)
    manifest.unlink()
    manifest.symlink_to(target)
    with pytest.raises(ManifestError, match=f"symbolic link \\(to '{target}'\\)"):
        read_manifest(str(dataset))


def test_a_dangling_manifest_link_is_refused_not_taken_for_no_manifest(dataset):
    (dataset / "tfrbeam_dataset.json").unlink()
    (dataset / "tfrbeam_dataset.json").symlink_to("nowhere.json")
    with pytest.raises(ManifestError, match="symbolic link"):
        read_manifest(str(dataset))


def test_build_overwrite_asks_before_touching_anything(dataset):
    check_manifest_file(str(dataset))  # a real manifest: fine
    check_manifest_file(str(dataset / "train"))  # no manifest at all: fine
    _plant_fifo(dataset / "tfrbeam_dataset.json")
    with pytest.raises(ManifestError, match="FIFO"):
        check_manifest_file(str(dataset))


def _manifest_listing(dataset, *paths_by_split: tuple[str, list[int]]) -> bytes:
    """The dataset's manifest with each split's shards replaced by the given entries (by number) of train's."""
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    train = manifest["splits"]["train"]["shards"]
    for split, numbers in paths_by_split:
        shards = [dict(train[number]) for number in numbers]
        manifest["splits"][split] = {"num_examples": sum(shard["num_examples"] for shard in shards), "shards": shards}
    return json.dumps(manifest).encode()


def test_a_shard_listed_twice_in_one_split_is_invalid(dataset):
    data = _manifest_listing(dataset, ("train", [0, 1, 2, 1]))  # counts adjusted to add up, as the attack did
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[3\]\.path: .*listed twice \(first at "
                                            r"splits\.train\.shards\[1\]\.path\)"):
        Manifest.from_bytes(data, "ds/tfrbeam_dataset.json")


def test_a_shard_listed_in_two_splits_is_invalid(dataset):
    data = _manifest_listing(dataset, ("train", [0, 1, 2, 3]), ("eval", [3]))
    with pytest.raises(ManifestError, match=r"splits\.eval\.shards\[0\]\.path: .*listed twice"):
        Manifest.from_bytes(data, "ds/tfrbeam_dataset.json", verifiable=True)
    (dataset / "tfrbeam_dataset.json").write_bytes(data)
    problems = verify_dataset(str(dataset))
    assert len(problems) == 1 and "listed twice" in problems[0]
