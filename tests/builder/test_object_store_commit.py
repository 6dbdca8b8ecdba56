"""Publishing a build into a real object store (issue 41): what a replace removes, and what a dead run leaves.

The servers are real (tests/storage_servers.py); each test lists its bucket with every object's
hash before and after, and nothing outside the dataset's own objects may change.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading

import pyarrow as pa

import tfrbeam
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.tfrecord.read_index import index_path_for, parse_read_index


def _table(rows: int, offset: int = 0) -> pa.Table:
    return pa.table({"id": list(range(offset, offset + rows)), "text": [f"row {i}" for i in range(offset, offset + rows)]})


def _write(bucket, key: str, table: pa.Table, **options):
    return tfrbeam.write_dataset(table, bucket.url(key), num_shards=2, seed=3, progress=False,
                                 pipeline_options=bucket.pipeline_args(), **options)


def _manifest(bucket, key: str) -> dict:
    return json.loads(bucket.get(f"{key}/{MANIFEST_NAME}"))


def _dataset_objects(manifest: dict) -> set[str]:
    return {shard["path"] for split in manifest["splits"].values() for shard in split["shards"]}


def test_a_replace_in_a_bucket_keeps_the_users_objects_in_split_folders(bucket):
    first = _write(bucket, "ds", _table(40))
    assert first is not None
    bucket.put("ds/train/NOTES.md", b"my notes")
    bucket.put("ds/README.txt", b"about this dataset")
    bucket.put("other/keep.bin", b"\x00\x01")
    before = bucket.listing()
    old_objects = {f"ds/{path}" for path in _dataset_objects(_manifest(bucket, "ds"))}

    second = _write(bucket, "ds", _table(60, offset=100), overwrite=True)
    assert second is not None and sum(second.num_examples.values()) == 60
    after = bucket.listing()
    for kept in ("ds/train/NOTES.md", "ds/README.txt", "other/keep.bin"):
        assert after[kept] == before[kept]
    new_objects = {f"ds/{path}" for path in _dataset_objects(_manifest(bucket, "ds"))}
    assert not (old_objects - new_objects) & set(after), "an old shard the new dataset does not list was left behind"
    assert not [key for key in after if ".ds.tfrbeam-" in key], "staging objects or the lock were left behind"


def test_a_missing_dataset_in_a_bucket_is_one_line_naming_it(bucket, tmp_path):
    env = {**os.environ, **bucket.env}
    done = subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", "verify", bucket.url("nothing-here")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "nothing-here" in done.stderr.strip().splitlines()[-1]


_KILLED_BUILD = """
import sys, pyarrow as pa, tfrbeam
table = pa.table({"id": list(range(3000)), "text": [f"row {i}" for i in range(3000)]})
tfrbeam.write_dataset(table, sys.argv[1], num_shards=3, seed=int(sys.argv[2]), overwrite=True, progress=False,
                      pipeline_options=sys.argv[3:])
"""


def _index_is_of(index: bytes, shard: bytes) -> bool:
    """Whether a read index describes these shard bytes (its record starts and end)."""
    try:
        parsed = parse_read_index(index, "index")
    except Exception:
        return False
    return parsed.starts is not None and int(parsed.starts.offsets[-1]) == len(shard)


def _check_complete(bucket, key: str) -> int | None:
    """The examples of the dataset a reader finds at ``key`` now (None: no manifest); every listed shard is whole."""
    try:
        manifest = _manifest(bucket, key)
    except Exception:
        return None
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            data = bucket.get(f"{key}/{shard['path']}")
            assert len(data) == shard["num_bytes"], f"{shard['path']} is not the shard its manifest lists"
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert _index_is_of(bucket.get(f"{key}/{index_path_for(shard['path'])}"), data), shard["path"]
    return sum(split["num_examples"] for split in manifest["splits"].values())


def test_kill_9_at_spread_moments_of_builds_into_a_bucket_never_leaves_a_torn_dataset_or_a_blocking_lock(s3_bucket):
    """20 builds into S3 killed at spread moments: a reader always finds the old or the new dataset, whole (never
    neither: the manifest's one write is the switch); a dead run's lock never blocks the next run (same host, dead
    pid), and the last build publishes and leaves nothing behind but the user's own object.

    On the GCS emulator each new process spends its first ~20 s in Beam's own credential retries, so kills there
    would land before any object operation; the commit goes through the same boundary on both stores.
    """
    bucket = s3_bucket
    output = bucket.url("killed")
    _write(bucket, "killed", _table(30))
    bucket.put("killed/train/NOTES.md", b"kept through every kill")
    env = {**os.environ, **bucket.env}
    found: list[int | None] = []
    for attempt in range(20):
        process = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, output, str(attempt), *bucket.pipeline_args()],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            process.wait(1.0 + 0.4 * attempt)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
        stderr = process.stderr.read().decode() if process.stderr else ""
        assert "in use by" not in stderr, f"attempt {attempt} was refused by a dead run's lock: {stderr[-500:]}"
        found.append(_check_complete(bucket, "killed"))
        assert found[-1] in (30, 3000), f"after a kill at attempt {attempt} a reader found no dataset"
    done = tfrbeam.write_dataset(_table(500), output, num_shards=2, seed=99, overwrite=True, progress=False,
                                 pipeline_options=bucket.pipeline_args())
    assert done is not None and _check_complete(bucket, "killed") == 500
    listing = bucket.listing()
    assert not [key for key in listing if ".killed.tfrbeam-" in key], "staging objects or the lock were left behind"
    assert bucket.get("killed/train/NOTES.md") == b"kept through every kill"


def test_a_reader_during_replaces_in_a_bucket_always_finds_the_old_or_the_new_dataset_whole(s3_bucket):
    """While replaces run, a reader that opens the manifest finds it every time, and every shard it lists has the
    listed bytes, or is gone only because the manifest moved on to the next generation (never neither, never a mix)."""
    bucket = s3_bucket
    _write(bucket, "live", _table(200))
    errors: list[BaseException] = []

    def replace_three_times() -> None:
        try:
            for seed in range(3):
                tfrbeam.write_dataset(_table(200 + 50 * (seed + 1), offset=1000 * (seed + 1)), bucket.url("live"),
                                      num_shards=3, seed=seed, overwrite=True, progress=False,
                                      pipeline_options=bucket.pipeline_args())
        except BaseException as error:
            errors.append(error)

    writer = threading.Thread(target=replace_three_times)
    writer.start()
    reads, moved_on = 0, 0
    client = bucket.server.client()
    while writer.is_alive() or reads == 0:
        manifest_bytes = bucket.get(f"live/{MANIFEST_NAME}")  # raises if a reader ever found none
        manifest = json.loads(manifest_bytes)
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                try:
                    data = bucket.get(f"live/{shard['path']}")
                except client.exceptions.NoSuchKey:
                    assert bucket.get(f"live/{MANIFEST_NAME}") != manifest_bytes, f"{shard['path']} vanished under its manifest"
                    moved_on += 1
                    continue
                assert hashlib.sha256(data).hexdigest() == shard["sha256"], f"{shard['path']} is not its manifest's"
        reads += 1
    writer.join()
    assert not errors, errors
    assert reads > 3
    assert _check_complete(bucket, "live") == 350


_ONE_BUILD = """
import sys, pyarrow as pa, tfrbeam
from tfrbeam.errors import TfrbeamError
rows = int(sys.argv[2])
table = pa.table({"id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]})
try:
    tfrbeam.write_dataset(table, sys.argv[1], num_shards=2, seed=1, overwrite=True, progress=False,
                          pipeline_options=sys.argv[3:])
except TfrbeamError as error:
    print(f"refused: {error}", file=sys.stderr)
    sys.exit(3)
"""


def test_two_concurrent_builds_into_one_gcs_output_never_interleave(gcs_strict_bucket):
    """Two processes build into one gs:// output at once, on a GCS server that honours preconditions: the lock's
    create-if-absent lets one in; the output holds one build's dataset, whole; nothing else in the bucket changes."""
    bucket = gcs_strict_bucket
    bucket.put("elsewhere/keep.txt", b"a user's object")
    before = bucket.listing()
    env = {**os.environ, **bucket.env}
    runs = [subprocess.Popen([sys.executable, "-c", _ONE_BUILD, bucket.url("shared"), str(rows), *bucket.pipeline_args()],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for rows in (400, 700)]
    results = [(run.wait(300), run.stderr.read() if run.stderr else "") for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 3]), results
    for code, stderr in results:
        if code == 3:
            assert "in use by run" in stderr.strip().splitlines()[-1]
    assert _check_complete(bucket, "shared") in (400, 700)
    after = bucket.listing()
    assert {key: value for key, value in after.items() if not key.startswith(("shared/", ".shared.", "."))} == before
    assert not [key for key in after if ".shared.tfrbeam-" in key], "staging objects or the lock were left behind"
