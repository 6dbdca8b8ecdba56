"""`inspect` and `cat` read a dataset's shards as `verify` lists them: from the manifest, confined to the dataset
(issue 43 item 14: a split directory that is a symlink was silently left out), and a manifest naming a shard twice
fails every tool in one line (item 11)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.example_builds import build_examples
from tfrbeam.cli.main import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return build_examples(tmp_path_factory.mktemp("listing"), "demo.yaml")["demo"]


@pytest.fixture()
def dataset(demo, tmp_path):
    copy = tmp_path / "sandbox" / "ds"
    shutil.copytree(demo, copy)
    return copy


def _records(dataset) -> int:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return sum(split["num_examples"] for split in manifest["splits"].values())


def _inspected(capsys, *paths: str) -> dict:
    assert main(["inspect", "--json", *paths]) == 0
    return json.loads(capsys.readouterr().out)


def _split_as_symlink(dataset, split: str, target) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    (dataset / split).rename(target)
    (dataset / split).symlink_to(target, target_is_directory=True)


def test_inspect_counts_a_split_whose_directory_is_a_symlink_inside_the_dataset(capsys, dataset):
    expected = _inspected(capsys, str(dataset))
    assert expected["records"] == _records(dataset) and expected["files"] == 5
    _split_as_symlink(dataset, "eval", dataset / ".stored" / "eval")
    assert _inspected(capsys, str(dataset)) == expected  # before: the eval split was silently left out
    assert _inspected(capsys, str(dataset / "eval"))["records"] == json.loads(
        (dataset / "tfrbeam_dataset.json").read_text())["splits"]["eval"]["num_examples"]
    assert main(["verify", str(dataset)]) == 0
    capsys.readouterr()


def test_cat_reads_a_symlinked_split_too(capsys, dataset):
    assert main(["cat", str(dataset)]) == 0
    expected = capsys.readouterr().out
    _split_as_symlink(dataset, "eval", dataset / ".stored" / "eval")
    assert main(["cat", str(dataset)]) == 0
    assert capsys.readouterr().out == expected


@pytest.mark.parametrize("command", ["inspect", "cat"])
def test_a_split_directory_leading_out_of_the_dataset_is_refused_as_verify_refuses_it(capsys, dataset, command):
    _split_as_symlink(dataset, "eval", dataset.parent / "elsewhere" / "eval")
    assert main(["verify", str(dataset)]) == 1
    verified = capsys.readouterr().out
    assert main([command, str(dataset)]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "outside the dataset" in error and "outside the dataset" in verified


@pytest.mark.parametrize("command", ["verify", "cat", "inspect", "stats"])
def test_a_shard_listed_twice_fails_every_tool_in_one_line(capsys, dataset, command):
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    train = manifest["splits"]["train"]
    train["shards"].append(dict(train["shards"][1]))
    train["num_examples"] += train["shards"][1]["num_examples"]
    (dataset / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    assert main([command, str(dataset)]) == 1
    captured = capsys.readouterr()
    lines = [line for line in (captured.out if command == "verify" else captured.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "splits.train.shards[4].path" in lines[0] and "listed twice" in lines[0], captured
