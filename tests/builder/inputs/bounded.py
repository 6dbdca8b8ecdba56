"""Run a piece of reading code in a child process with a memory budget and a time limit, and report what it did.

A bomb test must fail, not hang or exhaust the shared machine, when the code under test has no bound: the child
caps its address space at what it uses after its imports plus ``budget`` bytes (Beam's imports alone reserve
about 1.5 GB of address space, so a fixed RLIMIT_AS would refuse the imports), and the parent gives up after
``timeout`` seconds. The child reports the exception it ended with, its time and how much its peak RSS grew.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

_CHILD = """
import json, resource, sys, time
{setup}
def _vm_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
_hard = resource.getrlimit(resource.RLIMIT_AS)[1]
_cap = _vm_bytes() + {budget}
resource.setrlimit(resource.RLIMIT_AS, (_cap if _hard == resource.RLIM_INFINITY else min(_cap, _hard), _hard))
_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
_start = time.monotonic()
_outcome = {{"type": None, "error": None}}
def _body():
{body}
try:
    _body()
except BaseException as error:
    _outcome = {{"type": type(error).__name__, "error": str(error)}}
_outcome["seconds"] = time.monotonic() - _start
_outcome["rss_growth"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - _before) * 1024
print("OUTCOME " + json.dumps(_outcome))
"""


@dataclass(frozen=True)
class Outcome:
    """How the child's body ended: the exception's type name and message (None when it returned)."""

    type: str | None
    error: str | None
    seconds: float
    rss_growth: int  # bytes the peak RSS grew by while the body ran
    stderr: str = ""


def run_bounded(body: str, *, setup: str = "", budget: int = 1 << 30, timeout: float = 60.0) -> Outcome:
    """Run ``body`` (statements; ``setup`` runs first, before the memory cap) in a fresh interpreter."""
    script = _CHILD.format(setup=textwrap.dedent(setup), budget=int(budget),
                           body=textwrap.indent(textwrap.dedent(body).strip() or "pass", "    "))
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the read did not finish within {timeout} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    if not lines:
        pytest.fail(f"the child died (exit {done.returncode}) without an outcome: {done.stderr[-2000:]}")
    return Outcome(**json.loads(lines[-1].removeprefix("OUTCOME ")), stderr=done.stderr)
