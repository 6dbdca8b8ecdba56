"""tfrbeam.base.gc_pause: the collector paused around a body, and the build command's imports made under it and frozen."""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

CHECK = """
import gc
from tfrbeam.base.gc_pause import gc_paused
with gc_paused():
    paused = gc.isenabled()
print(paused, gc.isenabled(), gc.get_freeze_count())
with gc_paused(freeze=True):
    import json, email.parser  # anything not imported yet
print(gc.isenabled(), gc.get_freeze_count() > 0)
gc.disable()
with gc_paused(freeze=True):
    import csv  # a collector the caller had switched off stays off
print(gc.isenabled())
"""


def test_the_collector_is_paused_inside_restored_after_and_frozen_only_when_asked():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True", "0", "True", "True", "False"]


ENTRY = """
import gc, runpy, sys
sys.argv = ["build", *sys.argv[1:]]
try:
    {call}
except SystemExit:
    pass
print(gc.get_freeze_count() > 100_000, "apache_beam" in sys.modules)
"""

ENTRY_POINTS = (
    "runpy.run_module('tfrbeam.builder', run_name='__main__')",
    "runpy.run_path('pipelines/build_dataset.py', run_name='__main__')",
    "sys.exit(__import__('tfrbeam.cli.main').cli.main.main(sys.argv))",
)


def _entry(call: str, *argv: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", ENTRY.format(call=call), *argv], capture_output=True, text=True,
                            check=True, cwd=REPO_ROOT)
    return result.stdout.split()[-2:]


def test_every_build_entry_point_imports_beam_under_the_pause_and_help_imports_none():
    for call in ENTRY_POINTS:
        assert _entry(call, "no-such-config.yaml") == ["True", "True"], call  # Beam imported, then frozen
        assert _entry(call, "--help") == ["False", "False"], call
