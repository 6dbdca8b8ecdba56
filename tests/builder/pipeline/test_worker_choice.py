"""How many workers a build runs (tfrbeam/builder/pipeline/runners.py choose_workers): ``--workers N|auto`` and
Beam's own options."""

from __future__ import annotations

import json
import os
import pathlib
import threading

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from tfrbeam.builder.pipeline.runners import (
    AUTO_WORKERS,
    WorkerChoice,
    apply_workers,
    choose_workers,
    workers_as_given,
)
from tfrbeam.cli.build import child_processes, main as build_main
from tfrbeam.cli.demo_data import write_demo_data
from tfrbeam.errors import ConfigError

DEMO_CONFIG = pathlib.Path(__file__).resolve().parents[3] / "configs" / "demo.yaml"


def _choice(*args: str) -> WorkerChoice:
    return choose_workers(PipelineOptions(list(args)))


def test_an_explicit_count_is_what_runs():
    assert _choice("--workers=3") == WorkerChoice(3, "multi_processing", "--workers 3")
    assert _choice("--workers", "1") == WorkerChoice(1, "in_process", "--workers 1")
    assert _choice("--workers=AUTO").mode == "in_process"


@pytest.mark.parametrize("given", ["0", "-2", "two", "1.5"])
def test_a_count_that_is_not_positive_is_refused(given):
    with pytest.raises(ConfigError, match=rf"--workers: '{given}' is not a worker count \(give a positive integer"):
        _choice(f"--workers={given}")


def test_auto_runs_in_this_process():
    """The one rule of auto (docs/runners.md): this process, whatever the input, the cores and the RAM."""
    assert _choice() == _choice("--workers=auto") == AUTO_WORKERS
    assert (AUTO_WORKERS.count, AUTO_WORKERS.mode) == (1, "in_process") and AUTO_WORKERS.reason.startswith("auto: ")


def test_beams_own_direct_options_are_kept_and_a_contradiction_refused():
    assert _choice("--direct_num_workers=3", "--direct_running_mode=multi_processing") == \
        WorkerChoice(3, "multi_processing", "--direct_num_workers")
    assert _choice("--direct_num_workers=2", "--direct_running_mode=multi_threading").mode == "in_process"
    assert _choice("--workers=2", "--direct_num_workers=2", "--direct_running_mode=multi_processing").count == 2
    with pytest.raises(ConfigError, match="--workers 4 contradicts --direct_num_workers=2"):
        _choice("--workers=4", "--direct_num_workers=2", "--direct_running_mode=multi_processing")


def test_remote_runners_choose_their_own_workers():
    assert _choice("--runner=DataflowRunner").mode == "runner"
    with pytest.raises(ConfigError, match="Dataflow: --num_workers"):
        _choice("--runner=DataflowRunner", "--workers=4")


def test_applying_a_choice_sets_the_fnapirunners_options():
    options = PipelineOptions([])
    apply_workers(options, WorkerChoice(3, "multi_processing", "test"))
    direct = options.view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (3, "multi_processing")
    apply_workers(options, WorkerChoice(1, "in_process", "test"))
    assert (direct.direct_num_workers, direct.direct_running_mode) == (1, "in_memory")


def test_a_users_own_pipeline_is_described_never_changed():
    options = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert workers_as_given(options) == WorkerChoice(2, "multi_processing", "the pipeline's options")
    assert options.view_as(DirectOptions).direct_running_mode == "multi_processing"
    with pytest.raises(ConfigError, match="a pipeline of your own sets its runner's options"):
        workers_as_given(PipelineOptions(["--workers=2"]))


def test_the_choice_is_in_the_dry_run_the_summary_and_the_manifest(tmp_path, capsys, monkeypatch):
    write_demo_data(str(tmp_path / "demo_data"))
    monkeypatch.chdir(tmp_path)  # the demo config's paths are relative
    config = str(DEMO_CONFIG)
    assert build_main([config, "--dry-run", "--workers=2"]) == 0
    assert "workers:     2 worker processes (--workers 2)" in capsys.readouterr().out
    assert build_main([config, "--set", "output.path=out/one"]) == 0  # --quiet would print no summary
    assert "in process, piece store memory" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "one" / "tfrbeam_dataset.json").read_text())
    assert manifest["run"]["workers"]["count"] == 1 and manifest["run"]["workers"]["mode"] == "in_process"
    assert manifest["run"]["workers"]["chosen_by"].startswith("auto: ")
    assert build_main([config, "--dry-run", "--workers=0"]) == 2
    assert "--workers: '0' is not a worker count" in capsys.readouterr().err


def _commands_of(pids: set[int]) -> dict[int, str]:
    commands = {}
    for pid in pids:
        try:
            commands[pid] = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # ended meanwhile
            pass
    return commands


def test_workers_n_runs_beams_own_sdk_worker_processes(tmp_path, monkeypatch):
    """``--workers 2`` is Beam's FnApiRunner in multi_processing mode: its own ``sdk_worker_main`` processes, started
    by Beam as children of this process, write the in-process build's bytes."""
    write_demo_data(str(tmp_path / "demo_data"), num_rows=600)
    monkeypatch.chdir(tmp_path)
    seen: set[tuple[int, str]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            seen.update(_commands_of(set(child_processes(os.getpid()))).items())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert build_main([str(DEMO_CONFIG), "--quiet", "--set", "output.path=out/workers", "--workers=2"]) == 0
    finally:
        done.set()
        watcher.join()
    workers = {pid for pid, command in seen  # Beam starts each through /bin/sh -c, which is not counted
               if command.split()[1:3] == ["-m", "apache_beam.runners.worker.sdk_worker_main"]}
    assert len(workers) == 2, seen
    assert build_main([str(DEMO_CONFIG), "--quiet", "--set", "output.path=out/in_process"]) == 0
    assert _shards(tmp_path / "out" / "workers") == _shards(tmp_path / "out" / "in_process")


def _shards(dataset: pathlib.Path) -> dict[str, bytes]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {shard["path"]: (dataset / shard["path"]).read_bytes()
            for split in manifest["splits"].values() for shard in split["shards"]}
