"""Writing to real object-store APIs on 127.0.0.1: the sink, the lock, and their errors (issue 41).

Each test gets a bucket of its own on a server its fixture started (tests/storage_servers.py);
a test that writes under one prefix checks that no other object in the bucket changed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

import tfrbeam
from tfrbeam.base import object_store
from tfrbeam.beam import filesystem as fs
from tfrbeam.beam.publish import OutputLock, RunIdentity, this_run
from tfrbeam.errors import ObjectNotFoundError, OutputLockedError, PreconditionFailedError

RECORDS = [b"record %d" % i for i in range(100)]


def _options(bucket) -> PipelineOptions:
    return PipelineOptions(bucket.pipeline_args())


def _write_and_read_back(bucket, prefix: str) -> None:
    with beam.Pipeline(options=_options(bucket)) as pipeline:
        _ = pipeline | beam.Create(RECORDS) | tfrbeam.WriteToTFRecord(prefix, num_shards=2)
    with beam.Pipeline(options=_options(bucket)) as pipeline:
        assert_that(pipeline | tfrbeam.ReadFromTFRecord(prefix + "*"), equal_to(RECORDS))


def test_the_sink_writes_and_reads_back_every_record_where_beams_own_sink_does(bucket):
    bucket.put("elsewhere/keep.txt", b"a user's object")
    before = bucket.listing()
    _write_and_read_back(bucket, bucket.url("sink/part"))
    after = bucket.listing()
    assert {key: value for key, value in after.items() if not key.startswith("sink/")} == before
    shards = sorted(key for key in after if key.startswith("sink/part-"))
    assert shards == ["sink/part-00000-of-00002", "sink/part-00001-of-00002"]
    assert not [key for key in after if ".part.tfrbeam-" in key], "staging objects or the lock were left behind"


def test_a_missing_object_is_our_not_found_error_naming_it(bucket):
    fs.use_pipeline_options(_options(bucket))
    missing = bucket.url("no/such/object")
    with pytest.raises(ObjectNotFoundError, match="no/such/object"):
        fs.read_bytes(missing)
    assert fs.exists(missing) is False


def test_an_object_deleted_between_its_open_and_its_read_is_our_not_found_error(bucket):
    """Seen in the GCS kill sweep: a killed run's owner record, listed and opened, was gone when read, and GCS's own
    NotFound escaped the recovery. Reads, like opens, raise our StorageError (an OSError the recovery handles)."""
    fs.use_pipeline_options(_options(bucket))
    bucket.put("going/owner.json", b"{}" * 10)
    url = bucket.url("going/owner.json")
    with fs.open_read(url) as handle:
        fs.delete_files([url])
        with pytest.raises(ObjectNotFoundError, match=r"going/owner\.json"):
            handle.read()


@pytest.fixture(params=["gs", "s3"])
def strict_bucket(request):
    """A bucket on a server that honours conditional writes (fake-gcs-server for GCS, moto for S3)."""
    return request.getfixturevalue("gcs_strict_bucket" if request.param == "gs" else "s3_bucket")


def test_the_lock_is_a_create_if_absent_that_a_second_run_cannot_take(strict_bucket):
    target = strict_bucket.url("out/ds")
    first = OutputLock(target, this_run("run-one")).acquire()
    try:
        with pytest.raises(OutputLockedError, match="run-one"):
            OutputLock(target, dataclasses.replace(this_run("run-two"), pid=first.owner.pid)).acquire()
    finally:
        first.release()
    assert object_store.read_versioned(first.path, 1 << 16) is None
    second = OutputLock(target, this_run("run-two")).acquire()
    second.release()


def test_two_runs_racing_for_the_lock_never_both_win(strict_bucket):
    target = strict_bucket.url("out/race")
    path = OutputLock(target, this_run("x")).path
    object_store.create_if_absent(path, b"{}")
    with pytest.raises(PreconditionFailedError):
        object_store.create_if_absent(path, b"{}")


def _dead_run(run_id: str) -> RunIdentity:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return dataclasses.replace(this_run(run_id), pid=process.pid, process_start=1)


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(strict_bucket):
    target = strict_bucket.url("out/dead")
    dead = OutputLock(target, _dead_run("dead-run"), lease_seconds=3600).acquire()
    dead._lease._stop.set()  # the process "died": nothing renews or releases its lock
    taker = OutputLock(target, this_run("next-run")).acquire()
    try:
        data, _ = object_store.read_versioned(taker.path, 1 << 16)
        assert b"next-run" in data
    finally:
        taker.release()


def test_a_lock_of_another_host_is_taken_only_once_its_lease_ran_out(strict_bucket):
    target = strict_bucket.url("out/lease")
    remote = dataclasses.replace(this_run("remote-run"), host="another-host")
    held = OutputLock(target, remote, lease_seconds=2).acquire()
    held._lease._stop.set()  # its host went away: the lease is no longer renewed
    with pytest.raises(OutputLockedError, match="remote-run"):
        OutputLock(target, this_run("early")).acquire()
    time.sleep(2.5)
    taker = OutputLock(target, this_run("late")).acquire()
    taker.release()


def test_a_live_holder_renews_its_lease_and_is_never_taken_over(strict_bucket):
    target = strict_bucket.url("out/live")
    remote = dataclasses.replace(this_run("live-run"), host="another-host")
    held = OutputLock(target, remote, lease_seconds=1.2).acquire()
    try:
        for _ in range(3):
            time.sleep(0.9)
            with pytest.raises(OutputLockedError, match="live-run"):
                OutputLock(target, this_run("intruder")).acquire()
        held.check_held()
    finally:
        held.release()


def test_a_build_into_s3_takes_its_endpoint_from_the_pipeline_options(s3_bucket, tmp_path, monkeypatch):
    """Beam's --s3_endpoint_url alone (no AWS_ENDPOINT_URL): the checks before the pipeline use it too."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    object_store.forget_object_store_clients()
    import pyarrow as pa

    table = pa.table({"x": list(range(50))})
    result = tfrbeam.write_dataset(table, s3_bucket.url("wd"), num_shards=1, seed=1,
                                   pipeline_options=s3_bucket.pipeline_args(), progress=False)
    assert result is not None and sum(result.num_examples.values()) == 50
    assert "wd/tfrbeam_dataset.json" in s3_bucket.listing() or any(key.startswith("wd/") for key in s3_bucket.listing())


def test_the_cli_builds_into_a_bucket_with_only_the_clients_environment(bucket, tmp_path):
    """`tfrbeam build` into gs:// and s3:// with the env the clients honour; the bucket's other objects untouched."""
    subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", "demo-data", str(tmp_path / "demo_data")], check=True,
                   cwd=tmp_path, capture_output=True)
    bucket.put("notes/keep.md", b"kept")
    before = bucket.listing()
    output = bucket.url("demo")
    env = {**os.environ, **bucket.env}
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")
    done = subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", "build", os.path.abspath(config),
                           "--set", f"output.path={output}", "--quiet", *bucket.pipeline_args()],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = bucket.listing()
    assert {key: value for key, value in after.items() if not key.startswith("demo/")} == before
    assert "demo/tfrbeam_dataset.json" in after
    assert any(key.startswith("demo/train/") and key.endswith(".tfrecord") for key in after)


def test_a_holder_whose_lease_was_taken_over_publishes_nothing(strict_bucket):
    """A run that could not renew its lease in time (another run took the lock) learns so before it commits."""
    from tfrbeam.errors import CommitError

    target = strict_bucket.url("out/lost")
    remote = dataclasses.replace(this_run("slow-run"), host="another-host")
    slow = OutputLock(target, remote, lease_seconds=0.8).acquire()
    slow._lease._stop.set()  # stalled: it renews no more
    time.sleep(1.0)
    taker = OutputLock(target, this_run("taker")).acquire()
    slow._lease._stop.clear()
    assert slow._lease.renew() is False
    try:
        with pytest.raises(CommitError, match="lost its lock"):
            slow.check_held()  # what held_or_taken asks before every commit of the run
    finally:
        taker.release()


def test_an_oversized_object_planted_as_the_lock_is_refused_in_one_line_and_never_read_whole(strict_bucket):
    """A 2 MiB object where the lock goes: not tfrbeam's; the run is refused naming it, and nothing in the bucket
    changes (the lock is read with a ranged GET of at most 64 KiB + 1)."""
    target = strict_bucket.url("out/planted")
    lock_key = OutputLock(target, this_run("x")).path.split("/", 3)[3]
    strict_bucket.put(lock_key, b"{" + b" " * (2 << 20) + b"}")
    before = strict_bucket.listing()
    with pytest.raises(OutputLockedError, match="larger than any object tfrbeam writes") as error:
        OutputLock(target, this_run("run-one")).acquire()
    assert "\n" not in str(error.value)
    assert strict_bucket.listing() == before
