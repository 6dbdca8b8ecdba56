"""``tfrbeam stats`` writes stats.json and stats.html into the dataset (or --output-dir) only, whatever lies beside them."""

from __future__ import annotations

import pathlib

import pytest

from tests.example_builds import build_examples
from tests.integration.sandbox import changed_outside, copy_dataset, snapshot
from tfrbeam.cli.main import main as cli_main


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> pathlib.Path:
    return build_examples(tmp_path_factory.mktemp("stats-writes"), "demo.yaml")["demo"]


@pytest.mark.parametrize("planted", [".stats.json.tmp", ".stats.html.tmp"])
def test_a_planted_temp_file_symlink_does_not_lead_the_write_outside(demo, tmp_path, capsys, planted):
    sandbox = tmp_path / "sandbox"
    dataset = copy_dataset(demo, sandbox)
    (sandbox / "precious.txt").write_text("the user's file")
    (dataset / planted).symlink_to(sandbox / "precious.txt")
    before = snapshot(sandbox)
    assert cli_main(["stats", str(dataset)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert (sandbox / "precious.txt").read_text() == "the user's file"
    assert changed_outside(before, snapshot(sandbox), ("ds",)) == {}
    assert (dataset / "stats.json").is_file() and not (dataset / "stats.json").is_symlink()
