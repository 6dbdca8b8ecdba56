"""tfrbeam.base.startup: commands import Beam with the garbage collector paused, then freeze what they imported."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc
from tfrbeam.base.startup import imports_without_gc
before = gc.get_freeze_count()
with imports_without_gc():
    inside = gc.isenabled()
    import json, email.parser  # anything not imported yet
print(inside, gc.isenabled(), gc.get_freeze_count() > before)
gc.disable()
with imports_without_gc():
    import csv  # a collector the caller had switched off stays off
print(gc.isenabled())
"""


def test_collector_paused_inside_restored_after_and_imports_frozen():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True", "True", "False"]


ENTRY = """
import gc, runpy, sys
sys.argv = ["build", "--help"]
try:
    {call}
except SystemExit:  # --help exits once it has printed
    pass
print(gc.get_freeze_count() > 1000, "apache_beam" in sys.modules)
"""


def test_build_entry_points_import_beam_under_the_pause():
    for call in (
        "runpy.run_module('tfrbeam.builder', run_name='__main__')",
        "__import__('tfrbeam.cli.main').cli.main.main(['build', '--help'])",
    ):
        result = subprocess.run([sys.executable, "-c", ENTRY.format(call=call)], capture_output=True, text=True, check=True)
        assert result.stdout.split()[-2:] == ["True", "True"], (call, result.stdout, result.stderr)
