"""``tfrbeam demo-data DIR`` writes the demo data and the build config that reads it, so a new user needs no clone."""

from __future__ import annotations

import json
import pathlib

import yaml

from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.main import main

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_demo_data_writes_the_config_that_builds_it_from_an_empty_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo-data", "demo_data"]) == 0
    said = capsys.readouterr().out
    assert said.endswith("tfrbeam build demo_data/demo.yaml\n"), said
    assert build_main(["demo_data/demo.yaml", "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "demo" / "tfrbeam_dataset.json").read_text())
    assert manifest["rows_read"] == 3000 and manifest["bad_records"]["count"] == 3
    assert sorted(path.name for path in tmp_path.iterdir()) == ["demo_data", "out"]


def test_the_written_config_is_configs_demo_yaml_for_its_directory(tmp_path, monkeypatch):
    """The same build as the repository's configs/demo.yaml (its copy in the package cannot drift from it)."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo-data", "elsewhere/data", "--rows", "30"]) == 0
    written = yaml.safe_load((tmp_path / "elsewhere" / "data" / "demo.yaml").read_text())
    repository = yaml.safe_load((REPO_ROOT / "configs" / "demo.yaml").read_text())
    assert written["input"]["path"] == "elsewhere/data/csv/flights-*.csv"
    assert written == {**repository, "input": {**repository["input"], "path": "elsewhere/data/csv/flights-*.csv"}}
