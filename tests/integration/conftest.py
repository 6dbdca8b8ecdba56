"""A real small dataset (the demo build) shared by the tests of what reading tools trust."""

from __future__ import annotations

import pathlib

import pytest

from tests.example_builds import build_examples


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory) -> pathlib.Path:
    """The demo build (splits train, 4 shards, and eval, 1 shard); copy it before changing anything."""
    return build_examples(tmp_path_factory.mktemp("trust-demo"), "demo.yaml")["demo"]
