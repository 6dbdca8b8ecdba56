"""Shared test fixtures: where the third-party test data lives."""

from __future__ import annotations

import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTDATA = REPO_ROOT.parent / "shared" / "testdata"


def _testdata_dir(name: str) -> pathlib.Path:
    path = TESTDATA / name
    if not path.is_dir():
        pytest.skip(f"third-party test data {path} is absent (expected at ../shared/testdata/{name} from the repo root)")
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
