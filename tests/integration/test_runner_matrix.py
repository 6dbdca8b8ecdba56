"""The demo, CSV example and SequenceExample builds on every runner tfrbeam supports: the same bytes and manifest everywhere.

Each multi-process runner runs with the piece store ``auto`` picks for it (spill) and with the
``inline`` store forced, so the path distributed runners take (frames through the GroupByKey)
runs end to end in separate worker processes too. Every worker pool or cluster is started here
and stopped here. Beam's DaskRunner loses elements (tests/beam/test_lossy_runners.py), so the build
refuses it in one line and publishes nothing.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil

import pytest

from tests.worker_pool import external_worker_pool, workers_started
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data
from tfrbeam.tfrecord.read_index import parse_read_index

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = {name: REPO_ROOT / "configs" / f"{name}.yaml" for name in ("demo", "csv_example", "sequence_example")}
INPUT_GLOBS = {"demo": "csv/flights-*.csv", "csv_example": "csv/*.csv", "sequence_example": "sequences/*.csv"}
MULTI_PROCESSING = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("matrix")
    write_demo_data(str(directory / "demo_data"))
    return directory


@pytest.fixture(scope="module")
def worker_pool(tmp_path_factory):
    """An EXTERNAL SDK worker pool in its own process (each worker it starts is another one), stopped after the module."""
    with external_worker_pool(tmp_path_factory.mktemp("pool") / "pool.log") as pool:
        yield pool


def _build(workdir: pathlib.Path, config: str, name: str, *args: str) -> pathlib.Path:
    # Absolute input paths: the worker pool's SDK workers run in the pool's directory, not this one.
    output = workdir / "out" / config / name
    status = build_main([
        str(CONFIGS[config]), "--quiet", "--set", f"output.path={output}",
        "--set", f"input.path={workdir / 'demo_data'}/{INPUT_GLOBS[config]}", *args,
    ])
    assert status == 0, f"{config} on {name} failed"
    return output


def _dataset(output: pathlib.Path) -> tuple[dict[str, bytes], dict]:
    """Every file of a dataset by relative path (shards, read indexes, dead letters), and its manifest without its run
    record (what differs between two runs of one build by design: when, which run, and how it ran)."""
    files = {
        str(path.relative_to(output)): _content(path)
        for path in sorted(output.rglob("*")) if path.is_file() and path.name != "tfrbeam_dataset.json"
    }
    manifest = json.loads((output / "tfrbeam_dataset.json").read_text().replace(str(output), "OUTPUT"))
    return files, {key: value for key, value in manifest.items() if key != "run"}


def _content(path: pathlib.Path) -> bytes | tuple:
    """A file's bytes; for an index, what it says but the shard's mtime (each run's shards have their own)."""
    if path.suffix == ".index":
        index = parse_read_index(path.read_bytes(), str(path))
        assert index.table is not None and index.starts is not None
        return (index.file_size, index.num_records, index.table.offsets, index.table.record_numbers,
                tuple(index.starts.offsets.tolist()), index.mtime is not None)
    return path.read_bytes()


@pytest.fixture(scope="module")
def reference(workdir):
    """Each config built by ``tfrbeam build``'s default runner (in this process, pieces held in memory)."""
    built = {config: _build(workdir, config, "default") for config in CONFIGS}
    for output in built.values():
        manifest = json.loads((output / "tfrbeam_dataset.json").read_text())
        assert (manifest["run"]["runner"], manifest["run"]["piece_store"]) == ("FnApiRunner", "memory")
    return {config: _dataset(output) for config, output in built.items()}


def _assert_same_as_reference(reference, output: pathlib.Path, config: str, runner: str, piece_store: str) -> None:
    files, manifest = _dataset(output)
    expected_files, expected_manifest = reference[config]
    assert sorted(files) == sorted(expected_files)
    assert [name for name in files if files[name] != expected_files[name]] == []
    assert manifest == expected_manifest
    written = json.loads((output / "tfrbeam_dataset.json").read_text())
    assert (written["run"]["runner"], written["run"]["piece_store"]) == (runner, piece_store)
    assert not glob.glob(str(output.parent / ".tfrbeam-*"))  # no staging, spill or lock files left


@pytest.mark.parametrize("config", list(CONFIGS))
def test_direct_runner_in_process(workdir, reference, config):
    output = _build(workdir, config, "direct", "--runner=DirectRunner")
    _assert_same_as_reference(reference, output, config, "DirectRunner", "memory")


@pytest.mark.parametrize("config", list(CONFIGS))
def test_direct_runner_multi_threading(workdir, reference, config):
    """Two worker threads share the memory store's pieces (its locks, each piece released once per shard)."""
    output = _build(workdir, config, "threads", "--direct_num_workers=2", "--direct_running_mode=multi_threading")
    _assert_same_as_reference(reference, output, config, "FnApiRunner", "memory")


@pytest.mark.parametrize("piece_store, workers", [("auto", ["--workers=2"]), ("inline", MULTI_PROCESSING)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_direct_runner_multi_processing(workdir, reference, config, piece_store, workers):
    """``tfrbeam build --workers 2`` and Beam's own direct options run the same 2 SDK worker processes."""
    output = _build(workdir, config, f"multi-{piece_store}", *workers, f"--piece_store={piece_store}")
    _assert_same_as_reference(reference, output, config, "FnApiRunner", "spill" if piece_store == "auto" else piece_store)
    recorded = json.loads((output / "tfrbeam_dataset.json").read_text())["run"]["workers"]
    assert (recorded["count"], recorded["mode"]) == (2, "multi_processing")


@pytest.mark.parametrize("piece_store", ["auto", "inline"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_portable_runner_with_workers_in_other_processes(workdir, reference, worker_pool, config, piece_store):
    address, log = worker_pool
    started_before = workers_started(log)
    output = _build(
        workdir, config, f"portable-{piece_store}", "--runner=PortableRunner", "--job_endpoint=embed",
        "--environment_type=EXTERNAL", f"--environment_config={address}", f"--piece_store={piece_store}",
    )
    assert workers_started(log) > started_before  # the pool ran this job's SDK worker processes
    _assert_same_as_reference(reference, output, config, "PortableRunner", "spill" if piece_store == "auto" else piece_store)


def _prism_binary() -> str | None:
    candidates = [os.environ.get("TFRBEAM_PRISM"), shutil.which("prism")]
    candidates += glob.glob(os.path.expanduser("~/.apache_beam/cache/prism/bin/*"))
    return next((path for path in candidates if path and os.access(path, os.X_OK) and os.path.isfile(path)), None)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_prism_runner_where_a_prism_binary_exists(workdir, reference, config):
    binary = _prism_binary()
    if binary is None:
        pytest.skip("no Prism binary (set TFRBEAM_PRISM, put prism on PATH, or let Beam download it once online)")
    output = _build(workdir, config, "prism", "--runner=PrismRunner", f"--prism_location={binary}")
    _assert_same_as_reference(reference, output, config, "PrismRunner", "spill")


def test_dask_runner_is_refused_in_one_line_and_nothing_is_published(workdir, capsys):
    distributed = pytest.importorskip("distributed", reason="needs dask[distributed] (the test extra)")
    output = workdir / "out" / "demo" / "dask"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        status = build_main([
            str(CONFIGS["demo"]), "--quiet", "--set", f"output.path={output}",
            "--set", f"input.path={workdir / 'demo_data' / 'csv'}/flights-*.csv",
            "--runner=apache_beam.runners.dask.dask_runner.DaskRunner", f"--dask_client_address={cluster.scheduler_address}",
        ])
        # What the build printed, read before the cluster shuts down: distributed's own shutdown logging goes to
        # whichever stderr its handlers were made with (an earlier test's, closed, under xdist), and is not ours.
        err = capsys.readouterr().err.strip()
    # distributed's own logging can fail on an earlier test's closed stderr under xdist ('--- Logging error ---'
    # blocks from its handlers); the build's output is every line that is not part of such a block.
    ours = [line for line in err.splitlines() if line.startswith("tfrbeam")]
    assert status == 1 and len(ours) == 1
    err = ours[0]
    assert err.startswith("tfrbeam build: error: tfrbeam build cannot run on the DaskRunner: Beam's DaskRunner merges")
    assert not output.exists() and not glob.glob(str(output.parent / ".tfrbeam-*"))


def test_bundle_based_direct_runner_is_refused_in_one_line(workdir, capsys):
    """It loses a tagged output read as a side input (tests/beam/test_lossy_runners.py has the plain-Beam evidence)."""
    output = workdir / "out" / "demo" / "bundle-based"
    status = build_main([
        str(CONFIGS["demo"]), "--quiet", "--set", f"output.path={output}",
        "--set", f"input.path={workdir / 'demo_data' / 'csv'}/flights-*.csv", "--runner=BundleBasedDirectRunner",
    ])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1
    assert "tfrbeam build cannot run on the BundleBasedDirectRunner: Beam's BundleBasedDirectRunner hands a side input" in err
    assert not output.exists()


# ---------------------------------------------------------------- WriteDataset in a pipeline of its user's

WRITE_DATASET_RUNNERS = {
    "direct": ["--runner=DirectRunner"],
    "threads": ["--direct_num_workers=2", "--direct_running_mode=multi_threading"],
    "multi-auto": MULTI_PROCESSING,
    "multi-inline": [*MULTI_PROCESSING, "--piece_store=inline"],
}


@pytest.fixture(scope="module")
def parquet_reference(workdir) -> tuple[list, dict[str, bytes]]:
    """The demo's Parquet files as record batches, and the shards ``tfrbeam build`` makes of those files."""
    import pyarrow.parquet as pq

    paths = sorted(glob.glob(str(workdir / "demo_data" / "parquet" / "*.parquet")))
    batches = [batch for path in paths for batch in pq.read_table(path).to_batches(max_chunksize=500)]
    config = workdir / "parquet.yaml"
    output = workdir / "out" / "parquet" / "default"
    config.write_text(json.dumps({"input": {"path": str(workdir / "demo_data" / "parquet" / "*.parquet")},
                                  "output": {"path": str(output), "num_shards": 2},
                                  "splits": {"train": 0.8, "eval": 0.2}, "shuffle": {"seed": 11}}))
    assert build_main([str(config), "--quiet"]) == 0
    return batches, _shards(output)


def _shards(output: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() for path in sorted(output.rglob("*.tfrecord"))}


def _write_dataset(workdir: pathlib.Path, batches: list, name: str, options: list[str]) -> pathlib.Path:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam import WriteDataset

    output = workdir / "out" / "write_dataset" / name
    with beam.Pipeline(options=PipelineOptions(options)) as pipeline:
        _ = (pipeline | beam.Create(batches)
             | WriteDataset(output, schema=batches[0].schema, splits={"train": 0.8, "eval": 0.2}, seed=11, num_shards=2))
    return output


@pytest.mark.parametrize("name", list(WRITE_DATASET_RUNNERS))
def test_write_dataset_gives_the_build_bytes_on_every_local_runner(workdir, parquet_reference, name):
    batches, expected = parquet_reference
    output = _write_dataset(workdir, batches, name, WRITE_DATASET_RUNNERS[name])
    assert _shards(output) == expected
    left = [path for path in glob.glob(str(output.parent / f".{name}.tfrbeam-*")) if not path.endswith("-lock")]
    assert left == []  # no staging directory or spill files left beside the output


def test_write_dataset_with_workers_in_other_processes(workdir, parquet_reference, worker_pool):
    address, log = worker_pool
    started_before = workers_started(log)
    batches, expected = parquet_reference
    output = _write_dataset(workdir, batches, "portable", [
        "--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
        f"--environment_config={address}"])
    assert workers_started(log) > started_before
    assert _shards(output) == expected
