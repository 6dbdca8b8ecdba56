"""Shared test fixtures: the third-party test data in tests/data/, and the hypothesis profiles.

Hypothesis profiles:
  ci       (the default) derandomized: every run tests the same examples, so a landing never depends on luck.
  explore  random, ten times the examples, with a local example database: for long runs that find new cases
           (`python -m pytest --hypothesis-profile=explore tests/codec/test_example.py`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.emulator_site.sitecustomize import prime_beam_credentials_for_emulator
from tests.storage_servers import FakeGcsServer, GcsEmulator, MotoS3, StoreBucket
from tfrbeam.base.object_store import forget_object_store_clients

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTDATA = pathlib.Path(__file__).resolve().parent / "data"

EXPLORE_FACTOR = 10

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    deadline=None,
    max_examples=100 * EXPLORE_FACTOR,
    phases=list(Phase),
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# --hypothesis-profile=NAME (handled by hypothesis' pytest plugin, after this file) overrides this default;
# HYPOTHESIS_PROFILE=NAME does too. CI=true always means the fixed profile.
settings.load_profile("ci" if os.environ.get("CI") == "true" else os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the explore profile, multiply the examples of tests that pin their own max_examples."""
    if config.getoption("hypothesis_profile", None) != "explore":
        return
    for item in items:
        function = getattr(item, "obj", None)
        # hypothesis keeps a test's @settings on this attribute; when a release renames it, explore
        # still runs, at each test's own max_examples.
        pinned = getattr(function, "_hypothesis_internal_use_settings", None)
        if isinstance(pinned, settings) and pinned.max_examples < 100 * EXPLORE_FACTOR:
            function._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                pinned, max_examples=pinned.max_examples * EXPLORE_FACTOR, derandomize=False
            )


@pytest.fixture(scope="session", autouse=True)
def _temp_dir_of_this_session(tmp_path_factory) -> Iterator[None]:
    """This session's temp directory, for this process and every process a test starts (TMPDIR), inside pytest's
    own base temp: a child killed on purpose (kill -9, an injected crash) leaves its temp files there, not in /tmp."""
    directory = tmp_path_factory.getbasetemp() / "system-temp"
    directory.mkdir(exist_ok=True)
    saved_env, saved_module = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(directory), str(directory)
    yield
    tempfile.tempdir = saved_module
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(autouse=True)
def _no_beam_temp_dir_left(monkeypatch) -> Iterator[None]:
    """Removes the beam-pipeline-temp dirs of the test's Pipelines: Beam makes one in /tmp per Pipeline and removes
    it only when the pipeline runs, so every test that builds a graph without running it would leave one."""
    module = sys.modules.get("apache_beam.pipeline")  # only where the test's module imported Beam
    if module is None:
        yield
        return
    made: list[str] = []
    init = module.Pipeline.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self.local_tempdir)

    monkeypatch.setattr(module.Pipeline, "__init__", recording_init)
    yield
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


def _testdata_dir(name: str) -> pathlib.Path:
    path = TESTDATA / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"test data {path} is missing: it is part of the repository (tests/data/{name}); restore it with git checkout"
        )
    return path


@pytest.fixture(scope="session")
def tf_vectors() -> pathlib.Path:
    """TensorFlow-written TFRecord / Example files with their expected contents."""
    return _testdata_dir("tf-vectors")


@pytest.fixture(scope="session")
def parquet_testing() -> pathlib.Path:
    """Apache parquet-testing files, incl. malformed ones in bad_data/."""
    return _testdata_dir("parquet-testing")


@pytest.fixture(scope="session")
def csv_spectrum() -> pathlib.Path:
    """CSV quoting edge cases with the JSON each should parse to."""
    return _testdata_dir("csv-spectrum")


# --- object stores: real servers on 127.0.0.1 (tests/storage_servers.py), one per kind and test process ---


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsEmulator]:
    with GcsEmulator() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_precondition_server() -> Iterator[FakeGcsServer]:
    with FakeGcsServer() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


def _bucket_of(server, monkeypatch) -> StoreBucket:
    """A new bucket, with the clients' environment pointing at its server for this test (and its child processes)."""
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    if "STORAGE_EMULATOR_HOST" in server.env:
        prime_beam_credentials_for_emulator()  # what the started processes' sitecustomize does, in this one
    forget_object_store_clients()
    return StoreBucket(server)


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch) -> Iterator[StoreBucket]:
    yield _bucket_of(gcs_server, monkeypatch)
    forget_object_store_clients()


@pytest.fixture
def gcs_strict_bucket(gcs_precondition_server, monkeypatch) -> Iterator[StoreBucket]:
    yield _bucket_of(gcs_precondition_server, monkeypatch)
    forget_object_store_clients()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> Iterator[StoreBucket]:
    yield _bucket_of(s3_server, monkeypatch)
    forget_object_store_clients()


@pytest.fixture(params=["gs", "s3"])
def bucket(request) -> StoreBucket:
    """A bucket on each kind of object store, in turn."""
    return request.getfixturevalue("gcs_bucket" if request.param == "gs" else "s3_bucket")
