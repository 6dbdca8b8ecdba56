"""A property over kinds, not just bytes (issue 43, what to build 6): any file a tool finds in or beside a dataset
(manifest, shard, read or offset index, the output's lock, a staging directory's owner record, an input file of the
build) replaced by a FIFO,
a link to /dev/zero, a 5 GB sparse file, a link out of the dataset, or a shard whose record header declares 2^40
bytes. Every tool and the build either refuse in one line within their time limit and under 1 GiB, or give exactly
what the unchanged dataset gives; nothing outside the dataset changes.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import struct

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.integration import test_planted_kinds as planted
from tests.integration.bounded_child import changed_outside, kind_snapshot, run_bounded, tool_command
from tests.integration.sandbox import copy_dataset
from tests.integration.test_planted_kinds import MAX_RSS_MB, OLD_INDEX, READ_INDEX, SHARD, TOOLS
from tfrbeam.tfrecord.records import masked_crc32c

TARGETS = {
    "manifest": "tfrbeam_dataset.json",
    "shard": SHARD,
    "read index": READ_INDEX,
    "old offset index": OLD_INDEX,
    "lock": "../.ds.tfrbeam-lock",
    "staging owner record": "../.ds.tfrbeam-0123456789abcdef/owner.json",
    "input file": "../input/flights-0.csv",  # the build's only: it reads the demo's CSV files from a copy here
}
clean_outputs = planted.clean_outputs  # the fixture: each reading tool's output on the unchanged dataset
KINDS = ("a FIFO", "a link to /dev/zero", "a 5 GB sparse file", "a link out of the dataset", "a huge declared length")


def _plant(dataset: pathlib.Path, target: str, kind: str) -> None:
    path = (dataset / TARGETS[target]).resolve() if TARGETS[target].startswith("..") else dataset / TARGETS[target]
    path.parent.mkdir(parents=True, exist_ok=True)
    original = path.read_bytes() if path.is_file() else b"{}"
    if os.path.lexists(path):
        path.unlink()
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "a 5 GB sparse file":
        with open(path, "wb") as handle:
            handle.write(original[:64])
            handle.truncate(5 << 30)
    elif kind == "a link out of the dataset":
        outside = dataset.parent / "elsewhere" / path.name
        outside.parent.mkdir(exist_ok=True)
        outside.write_bytes(original)
        path.symlink_to(outside)
    else:  # a TFRecord header claiming 2^40 bytes, then a little data: what a decompression bomb's first record says
        length = struct.pack("<Q", 1 << 40)
        path.write_bytes(length + struct.pack("<I", masked_crc32c(length)) + b"\0" * 4096)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(sorted(TARGETS)), kind=st.sampled_from(KINDS), tool=st.sampled_from(sorted(TOOLS)))
def test_a_planted_kind_anywhere_is_refused_in_one_line_or_read_exactly(demo_dataset, clean_outputs, tmp_path_factory,
                                                                         target, kind, tool):
    if target == "input file" and kind == "a huge declared length":
        kind = "a 5 GB sparse file"  # a declared length is a framing's; CSV text has none
    sandbox = tmp_path_factory.mktemp("planted")
    dataset = copy_dataset(demo_dataset, sandbox)
    command = TOOLS[tool](dataset, demo_dataset.parents[1])
    if target == "input file":
        tool = "build --overwrite"
        inputs = sorted((demo_dataset.parents[1] / "demo_data" / "csv").glob("flights-*.csv"))
        (sandbox / "input").mkdir()
        for index, path in enumerate(inputs):
            shutil.copy2(path, sandbox / "input" / f"flights-{index}.csv")
        command = [*TOOLS[tool](dataset, demo_dataset.parents[1]), "--set", f"input.path={sandbox}/input/flights-*.csv"]
    _plant(dataset, target, kind)
    before = kind_snapshot(sandbox)
    timeout = 120.0 if tool == "build --overwrite" else 30.0
    run = run_bounded(command, cwd=demo_dataset.parents[1], timeout=timeout, max_rss_mb=MAX_RSS_MB)
    described = f"{tool} with {kind} as the {target}"
    assert run.killed is None, f"{described}: killed at its {run.killed} limit ({run.seconds:.1f} s, {run.peak_mb:.0f} MB)"
    assert "Traceback" not in run.stdout + run.stderr, (described, run.stderr[-800:])
    changed = changed_outside(before, kind_snapshot(sandbox), "ds")
    if tool == "build --overwrite":  # what it owns beside the output (its lock, a dead run's staging) it may clear
        changed = {path: change for path, change in changed.items() if not path.startswith(".ds.")}
    assert not changed, (described, changed)
    if run.code == 0:
        if tool in clean_outputs:
            assert run.stdout.replace(str(dataset), "DS") == clean_outputs[tool], described
        if tool == "build --overwrite":
            assert run_bounded(tool_command("verify", str(dataset))).code == 0, described
    elif tool == "verify":  # a FAIL line a damaged file (a shard's indexes fail with their shard), naming the planted one
        failures = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
        assert run.code == 1 and any(pathlib.Path(TARGETS[target]).name in line for line in failures), (described, run)
    else:  # 3: the output is in use (a lock that is not ours to take)
        assert run.code in (1, 2, 3) and len(run.error_lines()) == 1, (described, run.stderr[-800:])
    shutil.rmtree(sandbox, ignore_errors=True)
