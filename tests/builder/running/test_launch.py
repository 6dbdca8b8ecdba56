"""tfrbeam.builder.run: a config (path, dict or BuildConfig) built as ``tfrbeam build`` builds it, from Python.

The CLI runs on the same launcher (tfrbeam/builder/running/launch.py), so both give the same bytes, the same
one-line errors (as exceptions here), the same progress lines and the same summary.
"""

from __future__ import annotations

import json
import logging
import pathlib
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
import tfrbeam.builder
from tests.builder.pipeline.test_transform import _one_line, rows_table, shard_bytes
from tfrbeam.builder.config import load_config
from tfrbeam.builder.pipeline.plan import plan_build
from tfrbeam.builder.running.launch import BuildResult, build_options, launch, pipeline_error
from tfrbeam.cli.build import main as build_main
from tfrbeam.errors import BadRecordError, BuildFailedError, ConfigError, OutputLockedError, TooManyBadRecordsError


@pytest.fixture()
def config_file(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    pq.write_table(rows_table(600), tmp_path / "rows.parquet")
    config = {"input": {"path": "rows.parquet"}, "output": {"path": "out/cli", "num_shards": 2},
              "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 3}}
    (tmp_path / "cfg.yaml").write_text(json.dumps(config))
    return tmp_path / "cfg.yaml"


def test_run_takes_a_path_a_dict_or_a_build_config_and_gives_the_cli_bytes(config_file, capsys):
    assert build_main([str(config_file)]) == 0
    expected = shard_bytes(pathlib.Path("out/cli"))
    by_path = tfrbeam.builder.run(config_file, overrides=["output.path=out/path"], progress=False)
    raw = json.loads(config_file.read_text())
    by_dict = tfrbeam.builder.run({**raw, "output": {**raw["output"], "path": "out/dict"}}, ["--runner=FnApiRunner"],
                                progress=False)
    by_config = tfrbeam.builder.run(load_config(str(config_file), ["output.path=out/config"]), progress=False)
    for result, name in ((by_path, "path"), (by_dict, "dict"), (by_config, "config")):
        assert isinstance(result, BuildResult) and result.path == f"out/{name}"
        assert shard_bytes(pathlib.Path(result.path)) == expected
        assert sum(result.num_examples.values()) == 600 and result.manifest["rows_read"] == 600
    cli_summary = capsys.readouterr().out.splitlines()
    assert by_path.summary.splitlines()[:4] == cli_summary[:4]  # the per-split table: the same numbers
    assert str(by_path) == by_path.summary


def test_run_shows_the_cli_progress_and_summary_and_restores_logging(config_file, caplog):
    beam_level = logging.getLogger("apache_beam").level
    with caplog.at_level(logging.INFO, logger="tfrbeam"):
        tfrbeam.builder.run(config_file, overrides=["output.path=out/logged"])
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith("shuffle and write: ") and "examples" in message for message in messages), messages
    summary = next(message for message in messages if message.startswith("built out/logged:"))
    assert "rows read:  600" in summary and "manifest:   out/logged/tfrbeam_dataset.json" in summary
    assert logging.getLogger("apache_beam").level == beam_level
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfrbeam"):
        tfrbeam.builder.run(config_file, overrides=["output.path=out/quiet"], progress=False)
    assert not [record for record in caplog.records if record.levelno < logging.WARNING]


def test_run_raises_the_cli_errors_as_one_line_exceptions(config_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        tfrbeam.builder.run({"input": {"path": "rows.parquet"}, "output": {"path": "out/x", "num_shard": 2},
                           "splits": {"train": 0.5}})
    text = _one_line(caught.value)  # the CLI's problems, each named by its key, joined on one line
    assert text.startswith("<config>: 2 problems in the build config: splits: fractions train: 0.5 sum to 0.5, not 1; "
                           "output.num_shard: unknown key"), text
    with pytest.raises(ConfigError, match="expected a YAML path, a dict or a BuildConfig"):
        tfrbeam.builder.run(42)  # type: ignore[arg-type]
    pq.write_table(pa.table({"id": pa.array([1, None, 3], pa.int64())}), tmp_path / "nulls.parquet")
    config = {"input": {"path": "nulls.parquet"}, "output": {"path": "out/nulls"}, "features": {"id": {"type": "int64"}}}
    with pytest.raises(BadRecordError) as caught:
        tfrbeam.builder.run(config, progress=False)
    assert _one_line(caught.value).startswith("nulls.parquet:2: feature 'id': is null")
    config["errors"] = {"on_bad_record": "skip", "max_bad_fraction": 0.1}
    with pytest.raises(TooManyBadRecordsError) as caught:
        tfrbeam.builder.run(config, progress=False)
    assert "1 of 3 input rows (33.33%) were bad" in _one_line(caught.value)
    assert not (tmp_path / "out" / "nulls").exists()


def test_a_runner_failure_that_is_not_ours_is_a_build_failed_error():
    wrapped = RuntimeError("Pipeline failed:\nTraceback (most recent call last):\n  File x\nValueError: worker gone")
    assert str(pipeline_error(wrapped)) == "RuntimeError: ValueError: worker gone"
    assert isinstance(pipeline_error(wrapped), BuildFailedError)
    ours = RuntimeError("... raise tfrbeam.errors.OutputLockedError: out/ds is locked by run 1 [while running 'Commit']")
    found = pipeline_error(ours)
    assert type(found) is OutputLockedError and str(found) == "out/ds is locked by run 1"


@pytest.mark.parametrize("failure", [ConfigError("attach: refused"), TypeError("a graph Beam cannot build")])
def test_a_build_whose_graph_fails_to_attach_leaves_no_beam_temp_dir_behind(config_file, tmp_path, monkeypatch, failure):
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))  # where Beam's Pipeline makes its beam-pipeline-temp dir
    options = build_options(["--runner=FnApiRunner"])
    plan = plan_build(load_config(str(config_file), ["output.path=out/attach"]), options)

    def attach(pipeline):
        assert pathlib.Path(pipeline.local_tempdir).parent == system_temp
        raise failure

    with pytest.raises(type(failure)):
        launch(plan, options, attach)
    assert list(system_temp.iterdir()) == []
    assert not pathlib.Path("out/attach").exists() or list(pathlib.Path("out/attach").iterdir()) == []
    # And a build that runs leaves none either (Beam removes it when the pipeline runs).
    assert tfrbeam.builder.run(config_file, overrides=["output.path=out/ran"], progress=False) is not None
    assert list(system_temp.iterdir()) == []
