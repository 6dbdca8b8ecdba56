"""What a build into a bucket costs in requests, counted on the wire (issue 41 item 5: Dataflow users pay per request).

A small ``tfrbeam build`` and Beam's own ``WriteToTFRecord`` of the same records each run against a
real storage API (``gcp-storage-emulator``, ``moto_server``) behind the counting proxy of
``benchmarks/object_store_cost.py``, in the same test. Before the shards were written straight to their
final names, every shard and read index was staged, then copied into place and deleted one by one (27
copies and 31 deletes on GCS) and the build made 4.5x the requests of Beam's job per shard. Until each shard had
one read index file (``.index``) instead of two (``.idx`` and ``.offsets``), those two objects a shard were the gap
on GCS.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import tfrbeam
from benchmarks.build import NUM_SHARDS
from benchmarks.object_store_cost import JOBS, STORES, Requests, measure_store
from benchmarks.write_dataset import _write_table
from tfrbeam.beam import filesystem as fs
from tfrbeam.errors import TfrbeamError
from tfrbeam.layout.manifest import dataset_files
from tfrbeam.layout.manifest_schema import Manifest
from tfrbeam.layout.names import MANIFEST_NAME
from tfrbeam.tfrecord.read_index import index_path_for, parse_read_index

ROWS = 6_000  # 8 shards of ~40 KB: every object is small, so each costs one upload request


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("requests") / "table.parquet"
    _write_table(ROWS, path)
    return path


def _counted(scheme: str, table: pathlib.Path, work: pathlib.Path) -> tuple[Requests, Requests]:
    counted = measure_store(STORES[scheme], table, ROWS, work)  # also checks both outputs: 8 shards, every row
    return counted[JOBS[0]], counted[JOBS[1]]


def _lease_renewals(requests: Requests) -> int:
    """Uploads of the lock after it was taken: its lease is renewed every 30 s, however many shards there are."""
    return sum(1 for line in requests.trace if "tfrbeam-lock" in line and line.endswith("-> upload")) - 1


def _deleted(requests: Requests) -> list[str]:
    """The objects a job deleted, by name (GCS and S3 request lines, batch calls' sub-requests included)."""
    names = []
    for line in requests.trace:
        for request in line.split("\n"):
            found = re.match(r"\s*DELETE (\S+)", request)
            if found:
                names.append(found.group(1).split("?")[0].replace("%2F", "/"))
    return names


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_build_into_an_empty_bucket_output_copies_nothing_and_deletes_only_its_records(scheme, table, tmp_path):
    ours, _ = _counted(scheme, table, tmp_path)
    assert ours.kinds["copy"] == 0, ours.trace
    deleted = _deleted(ours)
    assert not [name for name in deleted if ".tfrecord" in name], deleted  # no shard or read index was staged
    assert sorted(name.rsplit("/", 1)[-1] for name in deleted) == [".ours.tfrbeam-lock", "commit-ready.json", "owner.json"]
    # One upload request per object: each shard and its read index, the lock, the run's record (written once, naming
    # the objects it writes), the commit record and the manifest.
    assert ours.kinds["upload"] == ours.objects_uploaded == 2 * NUM_SHARDS + 4 + _lease_renewals(ours)
    # Listings: dead runs' staging, the output once under the lock (its check and the direct writes' choice), the
    # split's shards as the commit checks them, and the run's staging as it is removed. No metadata GET of the
    # output's manifest: the listing says there is none.
    assert ours.kinds["list"] == 4, ours.trace
    assert not [line for line in ours.trace if MANIFEST_NAME in line and line.endswith("-> get")], ours.trace


def test_a_build_into_gcs_makes_no_more_requests_than_beams_own_job(table, tmp_path):
    """Same job, same server, same run. Per shard, Beam's job makes an upload, a rewrite and a delete; ours an upload
    of the shard and one of its read index (docs/performance.md#object-store-requests). Beam's bucket-metadata GETs
    ("other") are left out of its count: Beam 2.77 makes one per match, 2.72 none."""
    ours, beams = _counted("gs", table, tmp_path)
    assert ours.kinds["other"] == 0, ours.trace  # no background bucket-metadata GETs (google-cloud-storage 3.11+)
    assert ours.kinds["get"] <= 1, ours.trace  # the run's record, before the commit record is written
    beams_requests = beams.total - beams.kinds["other"]
    assert ours.total - _lease_renewals(ours) <= beams_requests, (ours.kinds, beams.kinds)


def test_a_build_into_a_bucket_writes_one_read_index_object_per_shard(bucket):
    """Each uncompressed shard has one read index beside it, ``.tfrbeam-index/<shard>.index`` (not an ``.idx`` and an
    ``.offsets``): one object, one request. Random access and a split read it, and it holds every record start."""
    table = pa.table({"id": list(range(3000)), "text": [f"row {i}" for i in range(3000)]})
    tfrbeam.write_dataset(table, bucket.url("ds"), num_shards=3, seed=1, progress=False,
                          pipeline_options=bucket.pipeline_args())
    manifest = json.loads(bucket.get(f"ds/{MANIFEST_NAME}"))
    shards = [shard["path"] for split in manifest["splits"].values() for shard in split["shards"]]
    indexes = sorted(key for key in bucket.listing() if "/.tfrbeam-index/" in key)
    assert indexes == sorted(f"ds/{index_path_for(path)}" for path in shards)
    for path in shards:
        index = parse_read_index(bucket.get(f"ds/{index_path_for(path)}"), path)
        assert index.table is not None and index.starts is not None
        assert int(index.starts.offsets[-1]) == len(bucket.get(f"ds/{path}"))


_KILLED_BEFORE_THE_SWITCH = """
import os, sys, pyarrow as pa, tfrbeam
from tfrbeam.builder.pipeline import commit
commit.publish_by_switch = lambda *args, **kwargs: os._exit(9)  # killed after the pipeline, before the manifest
table = pa.table({"id": list(range(3000)), "text": [f"row {i}" for i in range(3000)]})
tfrbeam.write_dataset(table, sys.argv[1], num_shards=3, seed=1, progress=False, pipeline_options=sys.argv[2:])
"""


def test_the_objects_a_killed_run_wrote_straight_into_the_output_are_removed_by_the_next_run(bucket):
    """A run's shards and read indexes go straight to their final names, with no dataset listing them until the
    manifest is written: a run killed before that leaves them, named in its owner record, and the next run into
    the output removes every one of them (here it writes 2 shards, so none of the dead run's 3 is overwritten)."""
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_THE_SWITCH, bucket.url("ds"), *bucket.pipeline_args()],
                          env={**os.environ, **bucket.env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 9, done.stderr[-3000:]
    left = {key for key in bucket.listing() if key.startswith("ds/")}
    assert {"ds/train/train-00000-of-00003.tfrecord", "ds/train/.tfrbeam-index/train-00002-of-00003.tfrecord.index"} \
        <= left, left  # written straight to their names, not staged
    assert "ds/tfrbeam_dataset.json" not in left

    table = pa.table({"id": list(range(500)), "text": [f"row {i}" for i in range(500)]})
    assert tfrbeam.write_dataset(table, bucket.url("ds"), num_shards=2, seed=2, progress=False,
                                 pipeline_options=bucket.pipeline_args()) is not None
    manifest = Manifest.from_bytes(bucket.get("ds/tfrbeam_dataset.json"), "ds/tfrbeam_dataset.json")
    listed = {"ds/tfrbeam_dataset.json"} | {f"ds/{path}" for path in dataset_files(manifest)
                                          if not path.startswith("dali/")
                                          and not path.endswith((".idx", ".offsets"))}  # index names of before
    assert {key for key in bucket.listing() if key.startswith(("ds/", ".ds."))} == listed


def test_a_dead_runs_record_naming_a_users_objects_in_the_output_deletes_none_of_them(bucket):
    """A planted or damaged owner record must not make recovery delete what the user keeps in the output: a dead
    run's record is trusted only for the shard and read-index names a build writes (docs/trust.md)."""
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_THE_SWITCH, bucket.url("ds"), *bucket.pipeline_args()],
                          env={**os.environ, **bucket.env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 9, done.stderr[-3000:]
    owner_key = next(key for key in bucket.listing() if key.startswith(".ds.tfrbeam-") and key.endswith("/owner.json"))
    owner = json.loads(bucket.get(owner_key))
    users = {"ds/train/NOTES.md": b"my notes", "ds/train/train-00000-of-00003.tfrecord.bak": b"a copy I keep",
             "ds/keep/data.bin": b"mine"}
    for key, data in users.items():
        bucket.put(key, data)
    owner["writes"] = [*owner["writes"], *(bucket.url(key) for key in users)]
    bucket.put(owner_key, json.dumps(owner).encode())
    before = bucket.listing()

    table = pa.table({"id": list(range(500)), "text": [f"row {i}" for i in range(500)]})
    assert tfrbeam.write_dataset(table, bucket.url("ds2"), num_shards=2, seed=2, progress=False,
                                 pipeline_options=bucket.pipeline_args()) is not None  # another output: untouched
    try:
        tfrbeam.write_dataset(table, bucket.url("ds"), num_shards=2, seed=2, progress=False, overwrite=True,
                              pipeline_options=bucket.pipeline_args())
    except TfrbeamError:
        pass  # refusing to build over a record it cannot trust is fine; deleting the user's objects is not
    after = bucket.listing()
    assert {key: after.get(key) for key in users} == {key: before[key] for key in users}


def test_a_failed_runs_staging_in_a_bucket_goes_with_its_owner_record_last(bucket, monkeypatch):
    """A staging prefix is deleted object by object, in any order unless told: the GCS kill sweep once left
    ``write-dataset-rows.arrow`` without the ``owner.json`` that makes the next run trust (and remove) it. The
    owner record goes last, so a kill at any delete leaves a prefix the next run's recovery removes."""
    from tfrbeam.base import object_store

    deleted: list[str] = []
    real_delete = object_store.delete_object

    def recorded(path: str, *args, **kwargs):
        deleted.append(path)
        return real_delete(path, *args, **kwargs)

    monkeypatch.setattr(object_store, "delete_object", recorded)
    table = pa.table({"id": [str(i) for i in range(300)] + ["not a number"]})
    with pytest.raises(TfrbeamError):
        tfrbeam.write_dataset(table, bucket.url("ds"), features={"id": {"type": "int64"}}, num_shards=2, seed=1,
                              progress=False, pipeline_options=bucket.pipeline_args())
    staged = [path for path in deleted if "/.ds.tfrbeam-" in path and "-lock" not in path]
    names = [path.rsplit("/", 1)[-1] for path in staged]
    assert "write-dataset-rows.arrow" in names and names[-1] == "owner.json", names
    assert not [key for key in bucket.listing() if key.startswith(".ds.")]


def test_an_object_written_through_fs_create_is_whole_whether_it_stays_small_or_grows(bucket, monkeypatch):
    """Small objects are put in one request when closed; one that outgrows the limit becomes Beam's streamed upload
    with the bytes kept so far first; a ``with`` block left by an error publishes no part of a small object."""
    monkeypatch.setattr(fs, "SMALL_OBJECT_BYTES", 1000)
    fs.use_pipeline_options(PipelineOptions(bucket.pipeline_args()))  # Beam's S3 IO takes its endpoint from them
    blocks = [bytes([index]) * 300 for index in range(7)]  # 2,100 bytes: streamed after the fourth block
    for key, parts in (("small.bin", blocks[:3]), ("grown.bin", blocks)):
        with fs.create(bucket.url(key)) as handle:
            for part in parts:
                handle.write(part)
            assert handle.tell() == sum(len(part) for part in parts)
        assert bucket.get(key) == b"".join(parts)
    with pytest.raises(RuntimeError), fs.create(bucket.url("failed.bin")) as handle:
        handle.write(b"half of it")
        raise RuntimeError("the writer failed")
    assert "failed.bin" not in bucket.listing()


@pytest.fixture(params=["gs", "s3"])
def strict_bucket(request):
    """A bucket on a server that honours conditional writes (fake-gcs-server for GCS, moto for S3)."""
    return request.getfixturevalue("gcs_strict_bucket" if request.param == "gs" else "s3_bucket")


def test_a_first_build_never_replaces_a_manifest_that_appeared_while_it_ran(strict_bucket, monkeypatch):
    """The switch of a first build is a create-if-absent: it does not read the output again before it, and a
    manifest that appeared meanwhile (by hand: no run could, under the lock) stays; the build publishes nothing
    and removes the shards it wrote."""
    from tfrbeam.builder.pipeline import commit

    planted = b'{"planted": "by hand"}'
    switch = commit.publish_by_switch

    def planting_first(*args, **kwargs):
        strict_bucket.put("ds/tfrbeam_dataset.json", planted)
        return switch(*args, **kwargs)

    monkeypatch.setattr(commit, "publish_by_switch", planting_first)
    table = pa.table({"id": list(range(300)), "text": [f"row {i}" for i in range(300)]})
    with pytest.raises(tfrbeam.errors.CommitError, match="a manifest appeared"):
        tfrbeam.write_dataset(table, strict_bucket.url("ds"), num_shards=2, seed=2, progress=False,
                              pipeline_options=strict_bucket.pipeline_args())
    assert strict_bucket.get("ds/tfrbeam_dataset.json") == planted
    assert {key for key in strict_bucket.listing() if key.startswith(("ds/", ".ds."))} == {"ds/tfrbeam_dataset.json"}
