"""A planted or damaged manifest: every tool refuses in one line (no traceback) and touches nothing outside the dataset."""

from __future__ import annotations

import copy
import hashlib
import json
import pathlib
import shutil

import pytest

from tests.example_builds import build_examples
from tfrbeam.cli.main import main as cli_main


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> pathlib.Path:
    return build_examples(tmp_path_factory.mktemp("hostile"), "demo.yaml")["demo"]


def _first_feature(manifest: dict) -> dict:
    return next(iter(manifest["features"].values()))


MUTATIONS = {
    "shape is a string": lambda m: _first_feature(m).__setitem__("shape", "abc"),
    "shape of 2**40": lambda m: _first_feature(m).__setitem__("shape", [2**40]),
    "features as a list": lambda m: m.__setitem__("features", list(m["features"])),
    "an unknown type": lambda m: _first_feature(m).__setitem__("type", "weird"),
    "an absolute shard path": lambda m: m["splits"]["train"]["shards"][0].__setitem__("path", "/etc/hostname"),
    "a shard path with ..": lambda m: m["splits"]["train"]["shards"][0].__setitem__("path", "../x.tfrecord"),
    "a shard count that is text": lambda m: m["splits"]["train"]["shards"][0].__setitem__("num_bytes", "abc"),
    "a negative count": lambda m: m["splits"]["train"]["shards"][0].__setitem__("num_examples", -5),
    "deeply nested JSON": None,
}


def _snapshot(root: pathlib.Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            for path in sorted(root.rglob("*"))}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_every_tool_refuses_a_hostile_manifest_in_one_line_and_writes_nothing_outside(demo, tmp_path, capsys, mutation):
    dataset = tmp_path / "sandbox" / "ds"
    shutil.copytree(demo, dataset)
    manifest_file = dataset / "tfrbeam_dataset.json"
    if MUTATIONS[mutation] is None:
        manifest_file.write_text('{"a":' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        manifest = copy.deepcopy(json.loads(manifest_file.read_text()))
        MUTATIONS[mutation](manifest)
        manifest_file.write_text(json.dumps(manifest))
    before = _snapshot(tmp_path / "sandbox")
    shard = dataset / "train" / "train-00001-of-00004.tfrecord"
    for command in (["verify", str(dataset)], ["stats", str(dataset)],
                    ["export", str(dataset), str(tmp_path / "exported"), "--overwrite"], ["inspect", str(shard)]):
        code = cli_main(command)
        captured = capsys.readouterr()
        assert code in (1, 2), (command, captured)
        assert "Traceback" not in captured.err + captured.out
        if command[0] != "verify":
            assert len(captured.err.strip().splitlines()) == 1, (command, captured.err)
        else:
            assert "FAIL" in captured.out + captured.err
    written = set(_snapshot(tmp_path / "sandbox")) - set(before)
    assert all(name.startswith("ds/") for name in written), written  # only the dataset's own derived files, if any
    assert {name: digest for name, digest in _snapshot(tmp_path / "sandbox").items() if name in before} == before
    assert not (tmp_path / "exported").exists() or not list((tmp_path / "exported").rglob("*.parquet"))
