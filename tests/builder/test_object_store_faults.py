"""Faults of a real object store during a build's commit (issue 41): the server stopped mid-commit and restarted,
and objects planted in the bucket. Each leaves the old or the new dataset, whole, and the next run recovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import tfrbeam
from tests.builder.test_object_store_commit import _check_complete
from tests.storage_servers import StoreBucket, TcpProxy
from tfrbeam.base.object_store import forget_object_store_clients

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _table(rows: int) -> pa.Table:
    return pa.table({"id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]})


@pytest.fixture
def s3_behind_a_proxy(s3_server, monkeypatch):
    """A bucket on moto reached through a proxy the test can stop (connection refused) and start again."""
    proxy = TcpProxy(s3_server.port).start()
    env = {**s3_server.env, "AWS_ENDPOINT_URL": proxy.url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    forget_object_store_clients()
    bucket = StoreBucket(s3_server)
    yield bucket, proxy, env, [arg.replace(s3_server.url, proxy.url) for arg in bucket.pipeline_args()]
    proxy.stop()
    forget_object_store_clients()


def _wait_for(path: str, process: subprocess.Popen, seconds: float = 180) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    return False


# The commit's operations, each phase's: staging the manifest, moving an index in, the manifest's switch, and
# removing the old generation's first shard (operations 12 to 15 remove the old generation).
_PHASES = {2: ("write", "/tfrbeam_dataset.json"), 9: ("rename", ".index"), 11: ("rename", "/ds/tfrbeam_dataset.json"),
           14: ("delete", "/ds/train/train-00000-of-00002.tfrecord")}


@pytest.mark.parametrize("at", sorted(_PHASES))
def test_the_store_gone_mid_commit_and_back_leaves_a_whole_dataset_and_the_next_run_recovers(
        s3_behind_a_proxy, tmp_path, at):
    """At operation ``at`` of the commit the store stops answering (connection refused); the build fails in one line,
    a reader finds the old or the new dataset whole once the store is back, and the next build publishes."""
    bucket, proxy, env, pipeline_args = s3_behind_a_proxy
    assert tfrbeam.write_dataset(_table(30), bucket.url("ds"), num_shards=2, seed=1, progress=False,
                                 pipeline_options=pipeline_args) is not None
    pq.write_table(_table(300), tmp_path / "rows.parquet")
    config = tmp_path / "build.yaml"
    config.write_text(yaml.safe_dump({"input": {"path": str(tmp_path / "rows.parquet")},
                                      "output": {"path": bucket.url("ds"), "num_shards": 2}}))
    signal = str(tmp_path / "fault")
    command = [sys.executable, "-m", "tests.faults", "wait", str(at), signal, "--", "build", str(config),
               "--overwrite", "--quiet", *pipeline_args]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(signal + ".waiting", process), f"the build ended before its commit's operation {at}"
        proxy.stop()
        open(signal + ".go", "w").close()
        process.wait(240)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read() if process.stderr else ""
    operation = open(signal).read().splitlines()[at - 1].split()
    assert (operation[1], operation[2].endswith(_PHASES[at][1])) == (_PHASES[at][0], True), operation
    assert process.returncode not in (0, None)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert "did not answer" in stderr.strip().splitlines()[-1], stderr[-2000:]

    proxy.start()
    forget_object_store_clients()
    assert _check_complete(bucket, "ds") in (30, 300), "a reader found no whole dataset once the store was back"
    done = subprocess.run(["tfrbeam", "build", str(config), "--overwrite", "--quiet", *pipeline_args],
                          cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _check_complete(bucket, "ds") == 300
    assert not [key for key in bucket.listing() if ".ds.tfrbeam-" in key]


@pytest.mark.parametrize("planted", ["lock", "staging", "journal"])
def test_objects_planted_in_a_bucket_are_never_trusted(gcs_strict_bucket, planted):
    """A lock naming a live-looking run elsewhere refuses (it cannot be proved dead, its lease is fresh); a staging
    prefix or journal naming another output, or paths outside this one, is left alone with a warning; the bucket's
    other objects and the planted ones are unchanged and the build publishes."""
    bucket = gcs_strict_bucket
    assert tfrbeam.write_dataset(_table(20), bucket.url("ds"), num_shards=1, seed=1, progress=False,
                                 pipeline_options=bucket.pipeline_args()) is not None
    bucket.put("victim/data.bin", b"someone else's")
    foreign = {"run_id": "planted", "host": "elsewhere", "pid": 1, "started": "2026-01-01T00:00:00Z",
               "process_start": None, "command": "evil", "output": bucket.url("victim")}
    if planted == "lock":
        bucket.put(".ds.tfrbeam-lock", json.dumps({**foreign, "lease_expires": time.time() + 3600}).encode())
    elif planted == "staging":
        bucket.put(".ds.tfrbeam-planted/owner.json", json.dumps(foreign).encode())
    else:
        bucket.put(".ds.tfrbeam-planted/owner.json", json.dumps({**foreign, "output": bucket.url("ds")}).encode())
        bucket.put(".ds.tfrbeam-planted/abandoned.json", json.dumps({**foreign, "output": bucket.url("ds")}).encode())
        bucket.put(".ds.tfrbeam-planted/commit.json", json.dumps({
            "run_id": "planted", "target": bucket.url("ds"), "deletions": [bucket.url("victim/data.bin")],
            "moves": [], "switch": True, "replaces": None}).encode())
    before = bucket.listing()
    if planted == "lock":
        with pytest.raises(tfrbeam.errors.OutputLockedError, match="planted"):
            tfrbeam.write_dataset(_table(40), bucket.url("ds"), num_shards=1, seed=1, progress=False, overwrite=True,
                                  pipeline_options=bucket.pipeline_args())
        assert bucket.listing() == before
        return
    result = tfrbeam.write_dataset(_table(40), bucket.url("ds"), num_shards=1, seed=1, progress=False, overwrite=True,
                                   pipeline_options=bucket.pipeline_args())
    assert result is not None and _check_complete(bucket, "ds") == 40
    after = bucket.listing()
    assert after["victim/data.bin"] == before["victim/data.bin"]
    for key in before:
        if key.startswith(".ds.tfrbeam-planted/"):
            assert after.get(key) == before[key], f"{key} was changed or removed"
