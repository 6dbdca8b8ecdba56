"""The build command: config errors before any pipeline, runners giving identical bytes, Dataflow's job graph."""

from __future__ import annotations

import glob
import json
import logging
import os
import pathlib
import re

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.builder.config import load_config
from tfrbeam.builder.pipeline.graph import build_pipeline
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO_CONFIG = str(REPO_ROOT / "configs" / "demo.yaml")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("cli")
    write_demo_data(str(directory / "demo_data"), num_rows=600)
    return directory


@pytest.fixture(autouse=True)
def in_workdir(workdir, monkeypatch):
    monkeypatch.chdir(workdir)


def shard_bytes(dataset: pathlib.Path) -> dict[str, bytes]:
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {
        shard["path"]: (dataset / shard["path"]).read_bytes()
        for split in manifest["splits"].values()
        for shard in split["shards"]
    }


def test_config_errors_are_one_report_before_any_pipeline(workdir, capsys):
    code = build_main([DEMO_CONFIG, "--set", "features.dep_delay.on_null=zero", "--set", "output.path=out/bad"])
    assert code == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("tfrbeam build: error: ")
        and "features.dep_delay.on_null: 'zero' is not one of omit, default, error" in error
    )
    assert not (workdir / "out" / "bad").exists()
    assert build_main([DEMO_CONFIG, "--set", "split_key=[nope]", "--set", "output.path=out/bad"]) == 2
    assert "split_key: 'nope' is not a feature" in capsys.readouterr().err
    assert not (workdir / "out" / "bad").exists()


def test_multi_processing_workers_write_the_same_bytes(workdir):
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/inproc"]) == 0
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/multi",
                       "--direct_num_workers=2", "--direct_running_mode=multi_processing"]) == 0
    assert shard_bytes(workdir / "out" / "inproc") == shard_bytes(workdir / "out" / "multi")


def test_portable_runner_with_an_embedded_job_server(workdir, capsys):
    assert build_main([DEMO_CONFIG, "--set", "output.path=out/portable",
                       "--runner=PortableRunner", "--job_endpoint=embed"]) == 0
    assert "runner PortableRunner" in capsys.readouterr().out
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/direct"]) == 0
    assert shard_bytes(workdir / "out" / "portable") == shard_bytes(workdir / "out" / "direct")


@pytest.mark.parametrize("config_path, extra_steps", [
    (DEMO_CONFIG, ()), (str(REPO_ROOT / "configs" / "sequence_example.yaml"), ("GroupRowsByBucket", "EncodeSequences")),
], ids=["examples", "sequences"])
def test_dataflow_job_graph_builds_offline(workdir, config_path, extra_steps, gcs_bucket):
    """The Dataflow job graph of a build whose input and output are in a bucket (the GCS emulator), built offline."""
    config = load_config(config_path)
    for path in glob.glob(config.input.path):
        gcs_bucket.put(path, pathlib.Path(path).read_bytes())
    config = load_config(config_path, [f"input.path={gcs_bucket.url(config.input.path)}",
                                       f"output.path={gcs_bucket.url('out/dataflow')}"])
    options = PipelineOptions([
        "--runner=DataflowRunner", "--project=fake-project", "--region=us-central1",
        f"--temp_location={gcs_bucket.url('tmp')}", f"--setup_file={REPO_ROOT / 'setup.py'}", "--dry_run=True",
    ])
    pipeline = beam.Pipeline(options=options)
    run = build_pipeline(pipeline, config)
    result = pipeline.run()
    steps = {transform.unique_name for transform in result.job.proto_pipeline.components.transforms.values()}
    for name in ("ReadInputs", "Build/ConvertAndKey", "Build/Shuffle/WriteShardsThroughGroupByKey/GroupByShard",
                 "Build/Shuffle/WriteShardsThroughGroupByKey/WriteShards", "Build/Commit",
                 *(f"Build/{step}" for step in extra_steps)):
        assert name in steps
    assert run.runner == "DataflowRunner" and run.piece_store == "inline"
    assert not [key for key in gcs_bucket.listing() if key.startswith("out/dataflow/")]  # nothing published


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tfrbeam build: error: ")
    return lines[0]


@pytest.mark.parametrize("argv, expected", [
    (["--sett", "shuffle.seed=3"], "unknown option --sett; did you mean --set?"),
    (["--runnr", "DataflowRunner"], "unknown option --runnr; did you mean --runner?"),
    (["--dry-rn"], "unknown option --dry-rn; did you mean --dry-run?"),
    (["--direct_num_worker=2"], "unknown option --direct_num_worker; did you mean --direct_num_workers?"),
    (["--over"], "unknown option --over; did you mean --overwrite?"),
    (["--runner", "DirectRuner"], "--runner: 'DirectRuner' is not a Beam runner; did you mean 'DirectRunner'?"),
    (["--runner", "DataflowRunner"], "--runner DataflowRunner needs --project, --region and --temp_location"),
    (["--runner", "DataflowRunner", "--project", "p", "--temp_location", "gs://b/t"],
     "--runner DataflowRunner needs --region"),
])
def test_unknown_options_and_runner_problems_are_one_line_before_anything_runs(workdir, capsys, argv, expected):
    code = build_main([DEMO_CONFIG, "--set", "output.path=out/never", *argv])
    assert code == 2
    assert expected in _one_error_line(capsys)
    assert not (workdir / "out" / "never").exists()


def test_a_stray_argument_is_an_error(workdir, capsys):
    assert build_main([DEMO_CONFIG, "shuffle.seed=3", "--set", "output.path=out/never"]) == 2
    assert "unexpected argument 'shuffle.seed=3'" in _one_error_line(capsys)


def test_beam_options_are_still_accepted(workdir, capsys):
    code = build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/beam_opts", "--direct_num_workers", "1",
                       "--max_num_workers=3"])
    assert code == 0, capsys.readouterr().err


def test_dry_run_prints_the_plan_and_runs_nothing(workdir, capsys):
    code = build_main([DEMO_CONFIG, "--dry-run", "--set", "output.path=out/dry"])
    assert code == 0
    out = capsys.readouterr().out
    for expected in ("demo_data/csv/flights-00000.csv", "bytes", "dep_delay", "float", "null -> default 0.0",
                     "tailnum", "null -> omitted", "embedding", "[4]", "train", "0.9", "eval", "4 shards",
                     "1 shard", "out/dry", "FnApiRunner", "piece store: memory"):
        assert expected in out, (expected, out)
    assert not (workdir / "out" / "dry").exists()
    leftovers = os.listdir(workdir / "out") if (workdir / "out").exists() else []
    assert not [name for name in leftovers if "dry" in name]


SEQUENCE_CONFIG = str(REPO_ROOT / "configs" / "sequence_example.yaml")


def test_dry_run_of_a_sequence_build_prints_its_settings_and_bucket_count(workdir, capsys):
    assert build_main([SEQUENCE_CONFIG, "--dry-run", "--set", "output.path=out/seq-dry"]) == 0
    out = capsys.readouterr().out
    assert "sequence:    one SequenceExample per tailnum; steps ordered by sched_dep, then the row's content hash" in out
    assert "  context:   tailnum, carrier\n  steps:     sched_dep, origin, dest, distance, dep_delay\n" in out
    assert "  limits:    min_steps 3, max_steps 32 (overflow split), max_group_bytes 67,108,864\n" in out
    assert "  buckets:   1 (the GroupByKey of group keys; one worker holds one bucket)" in out
    assert "splits:      train 0.8, eval 0.2 (by tailnum)" in out
    assert not (workdir / "out" / "seq-dry").exists()


def test_the_summary_of_a_sequence_build_says_groups_and_steps(workdir, capsys):
    assert build_main([SEQUENCE_CONFIG, "--set", "output.path=out/seq"]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((workdir / "out" / "seq" / "tfrbeam_dataset.json").read_text())
    splits = manifest["splits"].values()
    examples = sum(split["num_examples"] for split in splits)
    steps = sum(split["steps"]["total"] for split in splits)
    assert out.splitlines()[0].split() == ["split", "sequences", "shards", "bytes"]
    assert (f"groups:     {sum(split['num_groups'] for split in splits)} kept "
            f"({sum(split['split_groups'] for split in splits)} cut by max_steps), 1 under min_steps, 1 bad") in out
    assert f"steps:      {steps:,} (2..32 per sequence, mean {steps / examples:.1f})" in out


def _write_config(path: pathlib.Path, input_path: str, output: str, extra: str = "") -> str:
    path.write_text(f"input: {{path: '{input_path}'}}\noutput: {{path: '{output}', num_shards: 1}}\n"
                    "splits: {train: 1.0}\n" + extra)
    return str(path)


def test_a_header_only_csv_warns_and_allow_empty_false_fails_it(workdir, capsys, caplog):
    (workdir / "empty").mkdir(exist_ok=True)
    (workdir / "empty" / "a.csv").write_text("x,y\n")
    (workdir / "empty" / "b.csv").write_text("x,y\n\n")
    config = _write_config(workdir / "empty.yaml", "empty/*.csv", "out/empty", "features: {x: {type: int64}}\n")
    with caplog.at_level("WARNING"):
        assert build_main([config]) == 0
    assert "the input files hold no rows (2 files, only header lines: empty/a.csv, ...)" in caplog.text
    assert "errors.allow_empty: false" in caplog.text
    capsys.readouterr()
    assert build_main([config, "--set", "output.path=out/empty_refused", "--set", "errors.allow_empty=false"]) == 1
    line = _one_error_line(capsys)
    assert "the input files hold no rows" in line and "errors.allow_empty is false" in line
    assert not (workdir / "out" / "empty_refused").exists()


def _entries_beside(directory: pathlib.Path) -> list[str]:
    return sorted(name for name in os.listdir(directory))


@pytest.fixture(scope="module")
def big_demo_data(tmp_path_factory) -> pathlib.Path:
    """Enough rows that a build runs for a few seconds (to be interrupted)."""
    directory = tmp_path_factory.mktemp("big_demo") / "demo_data"
    write_demo_data(str(directory), num_rows=300_000)
    return directory


def _descendants(pid: int) -> set[int]:
    from tfrbeam.cli.build import child_processes

    return set(child_processes(pid))


@pytest.mark.parametrize("signal_name, code, runner_args", [
    ("SIGINT", 130, []), ("SIGTERM", 143, []),
    ("SIGTERM", 143, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
])
def test_a_signal_mid_build_is_one_line_and_a_rerun_succeeds_leaving_nothing_extra(tmp_path, big_demo_data,
                                                                                     signal_name, code, runner_args):
    import signal as signals
    import subprocess
    import sys
    import time

    os.symlink(big_demo_data, tmp_path / "demo_data")
    (tmp_path / "out").mkdir()
    command = [sys.executable, "-m", "tfrbeam.builder", DEMO_CONFIG, "--set", "output.path=out/demo",
               "--set", "errors.max_bad_fraction=0.5", *runner_args]
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=environment)
    seen = ""
    while "building out/demo" not in seen:  # logged just before the pipeline runs
        line = process.stderr.readline()
        assert line, f"the build ended before it started running: {seen}"
        seen += line
    time.sleep(0.3)  # the pipeline has started; 300k rows keep it busy for well over a second after this
    assert process.poll() is None, "the build finished before the signal; give it more rows"
    workers = _descendants(process.pid)
    process.send_signal(getattr(signals, signal_name))
    _, rest = process.communicate(timeout=90)
    assert process.returncode == code
    deadline = time.monotonic() + 20
    while workers & _descendants(1) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not workers & _descendants(1), "worker processes outlived the interrupted build"
    ours = [line for line in rest.splitlines() if line.startswith("tfrbeam build:")]
    assert ours == [f"tfrbeam build: interrupted ({signal_name}); the next run removes (or completes) what this one left"]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    assert not (tmp_path / "out" / "demo" / "tfrbeam_dataset.json").exists()
    rerun = subprocess.run(command + ["--quiet"], cwd=tmp_path, capture_output=True, text=True, env=environment)
    assert rerun.returncode == 0, rerun.stderr
    clean = tmp_path / "clean"
    (clean / "out").mkdir(parents=True)
    os.symlink(big_demo_data, clean / "demo_data")
    fresh = subprocess.run(command + ["--quiet"], cwd=clean, capture_output=True, text=True, env=environment)
    assert fresh.returncode == 0, fresh.stderr
    assert _entries_beside(tmp_path / "out") == _entries_beside(clean / "out")
    assert _entries_beside(tmp_path / "out" / "demo") == _entries_beside(clean / "out" / "demo")
    assert shard_bytes(tmp_path / "out" / "demo") == shard_bytes(clean / "out" / "demo")


_LINGERING_RUNNER = """
import os, signal, sys, threading, time
import tfrbeam.cli.build as cli_build

def build(argv):
    # A runner thread that never ends (as a Beam worker thread can after an interrupt), then the signal.
    threading.Thread(target=threading.Event().wait, name="runner-thread").start()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    return 0

cli_build._build = build
sys.exit(cli_build.main([]))
"""


def test_an_interrupted_build_exits_even_when_a_runner_thread_lingers(tmp_path):
    """A non-daemon thread left running after Ctrl-C must not keep the process alive past the unwind grace."""
    import subprocess
    import sys

    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", _LINGERING_RUNNER], capture_output=True, text=True,
                          env=environment, timeout=60, cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == [
        "tfrbeam build: interrupted (SIGINT); the next run removes (or completes) what this one left"]


def test_progress_is_logged_without_a_terminal_with_counts_from_worker_processes(workdir, capsys, caplog, monkeypatch):
    import re

    import tfrbeam.builder.running.report as build_report

    monkeypatch.setattr(build_report, "PROGRESS_LOG_SECONDS", 0.05)
    with caplog.at_level("INFO"):
        assert build_main([DEMO_CONFIG, "--set", "output.path=out/progress", "--direct_num_workers=2",
                           "--direct_running_mode=multi_processing"]) == 0
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("read ")]
    assert lines, caplog.text
    pattern = re.compile(r"read ([\d,]+) rows, ([\d,]+) of ([\d,]+) input bytes \((\d+)%\) in \d+ s, [\d,]+ rows/s")
    counts = [pattern.match(line) for line in lines]
    assert all(counts), lines
    assert int(counts[-1].group(3).replace(",", "")) == sum(os.path.getsize(workdir / "demo_data" / "csv" / name)
                                                           for name in os.listdir(workdir / "demo_data" / "csv"))
    # Then the shuffle and write phase, counted by the shard writers (in the worker processes too).
    writes = [re.match(r"shuffle and write: ([\d,]+) examples \(([\d,]+) bytes\) written of ([\d,]+) rows read",
                       record.getMessage()) for record in caplog.records]
    writes = [match for match in writes if match]
    assert writes, caplog.text
    manifest = json.loads((workdir / "out" / "progress" / "tfrbeam_dataset.json").read_text())
    assert int(writes[-1].group(1).replace(",", "")) == sum(split["num_examples"] for split in manifest["splits"].values())
    caplog.clear()
    with caplog.at_level("INFO"):
        assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/progress_quiet"]) == 0
    assert not [record for record in caplog.records if record.getMessage().startswith("read ")]


def test_progress_bar_on_a_terminal(tmp_path, big_demo_data):
    import pty
    import re
    import subprocess
    import sys

    os.symlink(big_demo_data, tmp_path / "demo_data")
    import fcntl
    import struct
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    process = subprocess.Popen([sys.executable, "-m", "tfrbeam.builder", DEMO_CONFIG, "--set", "output.path=out/bar",
                                "--set", "errors.max_bad_fraction=0.5"], cwd=tmp_path, stderr=secondary,
                               stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: the build ended
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=120) == 0
    os.close(primary)
    text = seen.decode("utf-8", "replace")
    bars = [part for part in text.split("\r") if part.startswith("reading")]
    assert bars, text[-2000:]
    assert any(" rows" in bar and "B/s" in bar and "%|" in bar for bar in bars), bars[-3:]
    # Log lines are printed above the bar, never appended to a bar's text.
    segments = re.split(r"[\r\n]", text)
    logged = [segment for segment in segments if " INFO " in segment or " WARNING " in segment]
    assert logged, text[-2000:]
    torn = [segment for segment in logged if not re.match(r"\s*(\x1b\[[0-9;]*[A-Za-z])*\d\d:\d\d:\d\d ", segment)]
    assert not torn, torn[:3]


def test_the_memory_store_budget_is_an_option_checked_before_the_build(workdir, capsys):
    code = build_main([DEMO_CONFIG, "--dry-run", "--set", "output.path=out/budget", "--memory_store_bytes=64MiB"])
    assert code == 0
    assert "piece store: memory (up to 64 MiB held in this process, the rest spilled)" in capsys.readouterr().out
    assert build_main([DEMO_CONFIG, "--set", "output.path=out/budget", "--memory_store_bytes=lots"]) == 2
    assert "--memory_store_bytes: 'lots' is not a size" in _one_error_line(capsys)
    assert not (workdir / "out" / "budget").exists()
    # Every piece spilled (budget 0): the same shards as the default run.
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/budget0", "--memory_store_bytes=0"]) == 0
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/budget_default"]) == 0
    assert shard_bytes(workdir / "out" / "budget0") == shard_bytes(workdir / "out" / "budget_default")


def test_quiet_prints_nothing_on_stdout_not_even_the_summary(workdir, capsys):
    assert build_main([DEMO_CONFIG, "--quiet", "--set", "output.path=out/quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads((workdir / "out" / "quiet" / "tfrbeam_dataset.json").read_text())["rows_read"] == 600


def test_a_failed_build_is_one_plain_line_without_a_class_name(workdir, capsys):
    argv = [DEMO_CONFIG, "--quiet", "--set", "errors.on_bad_record=fail", "--set", "output.path=out/failing"]
    assert build_main(argv) == 1
    line = _one_error_line(capsys)
    assert line.startswith("tfrbeam build: error: demo_data/csv/flights-00001.csv:19: feature 'distance': 'unknown' "
                           "is not a number"), line
    assert "Error" not in line


_SINGULAR_WRONG = re.compile(r"(?<![\d,.])1 (?!byte)[a-z]+s\b(?!/)|\(s\)")


def test_counts_of_one_read_as_singulars_in_every_line_a_build_shows(workdir, capsys, caplog):
    (workdir / "one.csv").write_text("flight_id,carrier\n1,AA\n")
    config = _write_config(workdir / "one.yaml", "one.csv", "out/one",
                           "features: {flight_id: {type: int64}, carrier: {type: bytes}}\n")
    with caplog.at_level("INFO"):
        assert build_main([config, "--dry-run"]) == 0
        assert build_main([config]) == 0
    shown = capsys.readouterr().out + caplog.text
    assert "1 csv file, 23 bytes" in shown and "1 example, " in shown
    assert _SINGULAR_WRONG.findall(shown) == [], shown


_WITHOUT_APITOOLS = """
import logging, sys

class NoApitools:  # an install without Beam's gcp extra: apitools is not there
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "apitools":
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, NoApitools())
from tfrbeam.cli.main import main
code = main(sys.argv[1:])
logging.warning("a warning of the application's own")
sys.exit(code)
"""


def test_a_plain_install_shows_no_apitools_warning_and_other_warnings_still_show(workdir):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _WITHOUT_APITOOLS, "build", DEMO_CONFIG, "--quiet",
                             "--set", "output.path=out/no_apitools"], cwd=workdir, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "apitools" not in result.stderr
    assert "a warning of the application's own" in result.stderr


def test_only_the_apitools_warning_is_held_back_while_beam_is_imported(caplog):
    from tfrbeam.cli.beam_warnings import without_beam_import_warnings

    with caplog.at_level("WARNING"), without_beam_import_warnings():
        logging.warning("apitools not found, and bigquery client libraries are not available despite the import "
                        "not raising an ImportError.")
        logging.warning("crcmod package not found. This package is required if python-snappy or google-crc32c are "
                        "not installed. To ensure crcmod is installed, install the tfrecord extra: pip install "
                        "apache-beam[tfrecord]")  # Beam 2.72's tfrecordio, on import
        logging.warning("apitools is fine, this is another warning")
    assert [record.getMessage() for record in caplog.records] == ["apitools is fine, this is another warning"]
    with caplog.at_level("WARNING"):
        logging.warning("apitools not found, outside a build's import")
    assert caplog.records[-1].getMessage() == "apitools not found, outside a build's import"
