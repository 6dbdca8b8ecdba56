"""Builds of the example configs on the demo data, for tests that need a real dataset directory."""

from __future__ import annotations

import os
import pathlib

from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.demo_data import write_demo_data

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def build_examples(workdir: pathlib.Path, *configs: str) -> dict[str, pathlib.Path]:
    """Write the demo data in ``workdir`` and build each config there; returns {config stem: dataset directory}."""
    write_demo_data(str(workdir / "demo_data"))
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        built = {}
        for config in configs:
            name = config.removesuffix(".yaml")
            assert build_main([str(REPO_ROOT / "configs" / config), "--quiet", "--set", f"output.path=out/{name}"]) == 0
            built[name] = workdir / "out" / name
        return built
    finally:
        os.chdir(previous)
