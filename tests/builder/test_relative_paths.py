"""A build with relative input and output paths runs where the SDK workers live in another directory."""

from __future__ import annotations

import json
import pathlib

from tests.worker_pool import external_worker_pool, workers_started
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_relative_paths_work_with_workers_started_in_another_directory(tmp_path, monkeypatch):
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    monkeypatch.chdir(pool_dir)  # the pool, and every SDK worker it starts, runs here
    with external_worker_pool(tmp_path / "pool.log") as (address, log):
        project = tmp_path / "project"
        write_demo_data(str(project / "demo_data"))
        monkeypatch.chdir(project)  # the launcher runs here, with paths relative to it
        status = build_main([
            str(REPO_ROOT / "configs" / "demo.yaml"), "--quiet", "--set", "output.path=out/demo",
            "--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
            f"--environment_config={address}",
        ])
        assert workers_started(log) > 0
    assert status == 0
    manifest = json.loads((project / "out" / "demo" / "tfrbeam_dataset.json").read_text())
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == manifest["rows_read"] - manifest[
        "bad_records"]["count"]
    assert [item["path"] for item in manifest["inputs"]] == [f"demo_data/csv/flights-0000{i}.csv" for i in range(3)]
    dead_letters = (project / "out" / "demo" / "_errors").glob("*.jsonl")
    assert {json.loads(line)["file"] for path in dead_letters for line in path.read_text().splitlines()} == {
        "demo_data/csv/flights-00001.csv"}  # named as the config gives them, not as the workers opened them
    assert not (pool_dir / "out").exists()
