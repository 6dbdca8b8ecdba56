"""Reading datasets kept in a bucket: every tool and the training reader on gs:// and s3:// (issue 41, item 2).

A dataset is built locally, copied object by object into a bucket on a real storage API on
127.0.0.1 (tests/storage_servers.py), and read back from there; each read must give exactly what
the same read of the local copy gives. The CLI runs as a user runs it: a subprocess with only the
clients' own environment variables (``STORAGE_EMULATOR_HOST``, ``AWS_ENDPOINT_URL`` and ``AWS_*``).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tfrbeam.base.object_store import RangedFile, open_ranged
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.errors import ConfigError, CorruptRecordError, MissingShardError, ObjectNotFoundError
from tfrbeam.tfrecord.read_index import parse_read_index, starts_bytes

ROWS = 6000


@pytest.fixture(scope="module")
def local_datasets(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Two local builds of one table: uncompressed (4 shards a split, with indexes) and gzip (3 shards a split)."""
    where = tmp_path_factory.mktemp("object-store-reads")
    rng = np.random.default_rng(41)
    table = pa.table({
        "id": np.arange(ROWS, dtype=np.int64),
        "x": rng.random(ROWS).astype(np.float32),
        "name": [f"row {i}" for i in range(ROWS)],
        "tags": [list(range(i % 5)) for i in range(ROWS)],
    })
    built = {}
    for name, compression, shards in (("plain", None, 4), ("gzip", "gzip", 3)):
        built[name] = where / name
        tfrbeam.write_dataset(table, str(built[name]), splits={"train": 0.8, "eval": 0.2}, num_shards=shards,
                              compression=compression, progress=False)
    return built


def _upload(bucket, local: pathlib.Path, prefix: str) -> str:
    """Every file of ``local`` (hidden ones too) as an object under ``prefix``; returns the dataset's URL."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            bucket.put(f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return bucket.url(prefix)


def _shards(local: pathlib.Path, split: str) -> list[str]:
    return sorted(path.name for path in (local / split).iterdir() if path.is_file())


def _cli(*arguments: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """``tfrbeam ARGUMENTS`` in a new process; its environment is this one's (the fixture's server variables)."""
    assert not [name for name in os.environ if name.startswith("TFRBEAM")], "no tfrbeam setting may be needed"
    return subprocess.run([sys.executable, "-m", "tfrbeam.cli.main", *arguments], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


# ----------------------------------------------------------------------------- the tools


def test_verify_checks_a_dataset_in_a_bucket_against_its_manifest(bucket, local_datasets):
    url = _upload(bucket, local_datasets["plain"], "ds")
    done = _cli("verify", url)
    assert done.returncode == 0, done.stderr
    assert f"OK   {url}: every shard matches tfrbeam_dataset.json" in done.stdout


def test_verify_finds_a_damaged_shard_in_a_bucket(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    shard = _shards(local, "train")[1]
    data = bytearray((local / "train" / shard).read_bytes())
    data[len(data) // 2] ^= 0x40
    bucket.put(f"ds/train/{shard}", bytes(data))
    done = _cli("verify", url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAIL {url}: {url}/train/{shard}" in done.stdout
    assert "Traceback" not in done.stderr


def test_verify_and_cat_take_shard_objects_and_globs(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    shards = _shards(local, "train")
    done = _cli("verify", "--examples", f"{url}/train/*.tfrecord")
    assert done.returncode == 0, done.stderr
    assert [line.split(": ")[0] for line in done.stdout.splitlines()] == [f"OK   {url}/train/{name}" for name in shards]
    remote = _cli("cat", f"{url}/train/{shards[0]}", f"{url}/eval/")
    assert remote.returncode == 0, remote.stderr
    here = _cli("cat", str(local / "train" / shards[0]), str(local / "eval"))
    assert remote.stdout == here.stdout and len(remote.stdout.splitlines()) > 1000


def test_inspect_of_a_split_in_a_bucket_is_the_local_inspect(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    remote = _cli("inspect", "--json", f"{url}/train")
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(_cli("inspect", "--json", str(local / "train")).stdout)


def test_stats_of_a_dataset_in_a_bucket_into_a_local_directory(bucket, local_datasets, tmp_path):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    done = _cli("stats", url, "--output-dir", str(tmp_path / "remote"))
    assert done.returncode == 0, done.stderr
    assert _cli("stats", str(local), "--output-dir", str(tmp_path / "local")).returncode == 0
    remote, here = (json.loads((tmp_path / name / "stats.json").read_text()) for name in ("remote", "local"))
    assert remote.pop("source") == url and here.pop("source") == str(local)
    assert remote == here and remote["splits"]["train"]["num_examples"] + remote["splits"]["eval"]["num_examples"] == ROWS


def test_stats_of_a_dataset_in_a_bucket_without_an_output_directory_says_what_to_do(bucket, local_datasets):
    url = _upload(bucket, local_datasets["plain"], "ds")
    done = _cli("stats", url)
    assert done.returncode == 2
    assert done.stderr == (f"tfrbeam: error: {url} is in a bucket: stats writes stats.json and stats.html beside the "
                           "manifest only for a local dataset; pass --output-dir DIR to write them there\n")


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_export_from_a_bucket_to_a_local_directory(bucket, local_datasets, tmp_path, kind):
    local = local_datasets[kind]
    url = _upload(bucket, local, "ds")
    done = _cli("export", url, str(tmp_path / "remote"))
    assert done.returncode == 0, done.stderr
    assert _cli("export", str(local), str(tmp_path / "local")).returncode == 0
    written = sorted(path.relative_to(tmp_path / "remote") for path in (tmp_path / "remote").rglob("*.parquet"))
    assert written == sorted(path.relative_to(tmp_path / "local") for path in (tmp_path / "local").rglob("*.parquet"))
    assert len(written) == len(_shards(local, "train")) + len(_shards(local, "eval"))
    for name in written:
        assert pq.read_table(tmp_path / "remote" / name).equals(pq.read_table(tmp_path / "local" / name))


# --------------------------------------------------------------------------- the library


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_read_records_of_a_shard_in_a_bucket(bucket, local_datasets, kind):
    local = local_datasets[kind]
    url = _upload(bucket, local, "ds")
    for name in _shards(local, "train"):
        expected = list(tfrbeam.read_records(str(local / "train" / name)))
        assert list(tfrbeam.read_records(f"{url}/train/{name}")) == expected and len(expected) > 1000


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_open_dataset_in_a_bucket_gives_the_local_batches_in_the_same_order(bucket, local_datasets, kind):
    local = local_datasets[kind]
    url = _upload(bucket, local, "ds")
    options = {"split": "train", "batch_size": 100, "shuffle_files": True, "shuffle_buffer": 500, "seed": 7,
               "num_parallel_reads": 3, "block_length": 256}
    with open_dataset(url, **options) as remote, open_dataset(str(local), **options) as here:
        assert remote.num_records == here.num_records
        remote_batches, local_batches = list(remote), list(here)
    assert len(remote_batches) == len(local_batches) == -(-here.num_records // 100)
    for got, want in zip(remote_batches, local_batches):
        assert got.keys() == want.keys()
        np.testing.assert_array_equal(got["id"], want["id"])
        np.testing.assert_array_equal(got["x"], want["x"])
        np.testing.assert_array_equal(got["name"], want["name"])
        np.testing.assert_array_equal(got["tags"].values, want["tags"].values)
        np.testing.assert_array_equal(got["tags"].offsets, want["tags"].offsets)
    assert sorted(np.concatenate([batch["id"] for batch in remote_batches]).tolist()) != list(range(ROWS))


def test_open_dataset_reads_a_glob_of_objects_and_resumes_from_a_position(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    options = {"batch_size": 64, "shuffle_buffer": 300, "seed": 3, "block_length": 128}
    remote = open_dataset(f"{url}/train/*.tfrecord", **options)
    here = open_dataset(str(local / "train" / "*.tfrecord"), **options)
    want = [batch["id"].tolist() for batch in here]
    iterator = iter(remote)
    first = [next(iterator)["id"].tolist() for _ in range(5)]
    state = remote.state_dict()
    iterator.close()
    resumed = open_dataset(f"{url}/train/*.tfrecord", **options)
    resumed.load_state_dict(state)
    assert first + [batch["id"].tolist() for batch in resumed] == want
    for dataset in (remote, here, resumed):
        dataset.close()


def test_large_objects_are_read_interleaved_with_bounded_range_requests(bucket, tmp_path):
    # Shards far larger than a socket's buffers, read 3 at a time: a reader that leaves a download half read (pyarrow's
    # GCS file opens one of the whole object on its first read) stalls a server that answers one request at a time.
    rng = np.random.default_rng(0)
    for number in range(3):
        path = tmp_path / f"big-{number}.tfrecord"
        with tfrbeam.RecordWriter(str(path)) as writer:
            writer.write_many([rng.bytes(64 << 10) for _ in range(200)])
        bucket.put(f"big/{path.name}", path.read_bytes())
    options = {"raw": True, "batch_size": 32, "num_parallel_reads": 3, "block_length": 8, "seed": 2}
    remote = [bytes(value) for batch in open_dataset(bucket.url("big/*.tfrecord"), **options) for value in batch["record"]]
    local = [bytes(value) for batch in open_dataset(str(tmp_path / "*.tfrecord"), **options) for value in batch["record"]]
    assert remote == local and len(local) == 600


def test_open_dataset_in_a_bucket_with_worker_processes(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    options = {"split": "eval", "batch_size": 50, "seed": 1, "executor": "processes", "num_workers": 2}
    with open_dataset(url, **options) as remote, open_dataset(str(local), **options) as here:
        assert [batch["id"].tolist() for batch in remote] == [batch["id"].tolist() for batch in here]
        assert remote.stats["executor"] == "processes"


def test_open_dataset_record_shards_of_a_bucket_cover_every_record_once(bucket, local_datasets):
    url = _upload(bucket, local_datasets["plain"], "ds")
    dataset = open_dataset(url, split="eval", batch_size=97, seed=0)
    parts = [dataset.shard(5, index, by="record") for index in range(5)]
    ids = [int(value) for part in parts for batch in part for value in batch["id"]]
    assert sorted(ids) == sorted(int(value) for batch in dataset for value in batch["id"])
    assert len(ids) == len(set(ids)) == dataset.num_records


def _delete(bucket, key: str) -> None:
    if bucket.root.startswith("s3"):
        bucket.server.client().delete_object(Bucket=bucket.name, Key=key)
    else:
        bucket.server.client().bucket(bucket.name).blob(key).delete()


@pytest.mark.parametrize("indexes", ["index", "offsets", "none"])
def test_open_random_access_reads_records_of_a_bucket_by_index(bucket, local_datasets, indexes):
    """By each shard's read index; a dataset written before the ``.index`` by its ``.offsets``; without one (shards
    copied in by other tools) by a walk of the headers."""
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    for key in [key for key in bucket.listing() if key.endswith(".index") and indexes != "index"]:
        if indexes == "offsets":
            parsed = parse_read_index(bucket.get(key), key)
            bucket.put(key[: -len(".index")] + ".offsets", starts_bytes(parsed.starts.offsets, parsed.mtime))
        _delete(bucket, key)
    remote = open_random_access(url, split="train")
    here = open_random_access(str(local), split="train")
    assert len(remote) == len(here) > 4000
    picks = np.random.default_rng(5).choice(len(here), 300, replace=False).tolist() + [0, len(here) - 1, 1, 2, 3]
    for got, want in zip(remote.__getitems__(picks), here.__getitems__(picks)):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    assert remote[17]["id"] == here[17]["id"]
    raw = open_random_access(url, split="eval", raw=True)
    assert raw[len(raw) - 1] == open_random_access(str(local), split="eval", raw=True)[len(raw) - 1]


def test_open_random_access_finds_a_damaged_record_in_a_bucket(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    shard = _shards(local, "eval")[0]
    data = bytearray((local / "eval" / shard).read_bytes())
    data[-10] ^= 0x01  # inside the last record's payload
    bucket.put(f"ds/eval/{shard}", bytes(data))
    dataset = open_random_access(url, split="eval", raw=True)
    assert dataset[0]
    count = open_random_access(str(local), split="eval").__len__()
    last_of_first = sum(1 for _ in tfrbeam.read_records(str(local / "eval" / shard))) - 1
    assert count > last_of_first
    with pytest.raises(CorruptRecordError, match=f"{shard}"):
        dataset[last_of_first]


# ------------------------------------------------------------------- range reads (issue 41 item 6)


def _python_calls(action) -> int:
    """Python function calls made while ``action()`` runs in this thread."""
    calls = 0

    def count(frame, event, argument):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


def test_a_gcs_range_reads_python_work_does_not_grow_with_its_size(gcs_bucket):
    # google-cloud-storage's download_as_bytes moved a body 8 KiB at a time in Python (some 3,500 calls per 8 MiB):
    # most of the GIL a gs:// epoch held. One GET streamed into the buffer costs the same calls for any size.
    data = np.random.default_rng(4).bytes(9 << 20)
    gcs_bucket.put("r/object", data)
    with open_ranged(gcs_bucket.url("r/object")) as handle:
        assert handle.read_range(0, 1) == data[:1]  # the session and its connection pool are made
        small = _python_calls(lambda: handle.read_range(5, 1 << 20))
        large = _python_calls(lambda: handle.read_range(5, 8 << 20))
        assert handle.read_range(5, 8 << 20) == data[5:5 + (8 << 20)]
    assert large < small + 200, (small, large)


def test_gcs_range_reads_look_up_the_environments_proxies_once(gcs_bucket, monkeypatch):
    # requests scanned every environment variable twice a request (a third of its CPU a request) for proxies
    # that do not change: the session takes them, and the CA bundle, once when it is made.
    import requests.utils

    from tfrbeam.base import object_store

    data = np.random.default_rng(7).bytes(100_000)
    gcs_bucket.put("r/object", data)
    looked_up: list[str] = []
    lookup = requests.utils.get_environ_proxies

    def recorded(url, no_proxy=None):
        looked_up.append(url)
        return lookup(url, no_proxy)

    monkeypatch.setattr(requests.utils, "get_environ_proxies", recorded)
    monkeypatch.setattr(requests.sessions, "get_environ_proxies", recorded)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    object_store.forget_object_store_clients()
    for _ in range(3):
        with open_ranged(gcs_bucket.url("r/object")) as handle:
            assert handle.read_range(10, 5000) == data[10:5010]
    assert len(looked_up) == 1, looked_up
    assert object_store._gcs_read_session().proxies == lookup(looked_up[0])


def test_many_threads_reading_gcs_ranges_at_once_keep_their_connections(gcs_bucket, caplog):
    # The client's pool kept 10 (then 32) connections: with more threads reading at once, urllib3 warned
    # "Connection pool is full, discarding connection" and the next request opened a new one.
    data = np.random.default_rng(6).bytes(1 << 20)
    gcs_bucket.put("r/object", data)
    threads = 48
    barrier, failures = threading.Barrier(threads), []

    def read() -> None:
        try:
            with open_ranged(gcs_bucket.url("r/object")) as handle:
                barrier.wait()
                if handle.read_range(7, 300_000) != data[7:300_007]:
                    failures.append("wrong bytes")
        except Exception as error:  # reported below, in the test's thread
            failures.append(repr(error))

    with caplog.at_level(logging.WARNING, logger="urllib3"):
        workers = [threading.Thread(target=read) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert failures == []
    assert not [record.getMessage() for record in caplog.records if "pool is full" in record.getMessage()]


def test_a_dataset_in_a_bucket_is_read_by_its_read_indexes_with_one_request_each(gcs_bucket, tmp_path, monkeypatch):
    # Each shard's record starts come from its read index (one GET, no metadata request first), checked against
    # the headers, instead of a walk over the headers in Python: a fifth of a raw epoch's CPU.
    import requests

    import tfrbeam.tfrecord.blocks as blocks_module

    table = pa.table({"id": np.arange(24_000, dtype=np.int64)})
    tfrbeam.write_dataset(table, str(tmp_path / "ds"), splits={"train": 1.0}, num_shards=2, progress=False)
    url = _upload(gcs_bucket, tmp_path / "ds", "ds")
    requested: list[str] = []
    request = requests.Session.request

    def recorded(self, method, address, *args, **kwargs):
        requested.append(f"{method} {address}")
        return request(self, method, address, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", recorded)
    walked = blocks_module.records_walked()
    with open_dataset(url, split="train", batch_size=1000, seed=2) as dataset:
        ids = np.concatenate([batch["id"] for batch in dataset])
    assert sorted(ids.tolist()) == list(range(24_000))
    assert len([line for line in requested if ".tfrbeam-index" in line]) == 2, requested
    assert blocks_module.records_walked() == walked


def _indexed_dataset(tmp_path: pathlib.Path) -> pathlib.Path:
    """A local build of two shards of 12,000 records, enough for a read to cut their blocks by their read indexes."""
    rng = np.random.default_rng(12)
    table = pa.table({"id": np.arange(24_000, dtype=np.int64), "blob": [rng.bytes(int(n)) for n in rng.integers(0, 40, 24_000)]})
    tfrbeam.write_dataset(table, str(tmp_path / "ds"), splits={"train": 1.0}, num_shards=2, progress=False)
    return tmp_path / "ds"


def test_a_shard_in_a_bucket_is_read_in_spans_of_whole_blocks_each_into_a_buffer_of_its_own(gcs_bucket, tmp_path,
                                                                                         monkeypatch):
    # Each range went into a bytes object, was copied into a read window, and each block copied out of that: now the
    # socket writes a span of whole blocks (cut by the read index) into its buffer, and the blocks are checked there.
    import requests
    import urllib3

    import tfrbeam.tfrecord.blocks as blocks_module

    local = _indexed_dataset(tmp_path)
    url = _upload(gcs_bucket, local, "ds")
    ranges: dict[str, list[tuple[int, int]]] = {}
    request = requests.Session.request

    def recorded(self, method, address, *args, **kwargs):
        asked = (kwargs.get("headers") or {}).get("Range", "")
        if ".tfrecord?" in address and asked:
            first, last = asked.removeprefix("bytes=").split("-")
            ranges.setdefault(address.split("?")[0], []).append((int(first), int(last) + 1))
        return request(self, method, address, *args, **kwargs)

    # A read window (and a header walk or RecordReader after it) reads a shard through its file interface, which
    # copies each range it gets into the window; spans are read through read_spans, straight into their buffers.
    through_file: list[str] = []

    def spied(method: str):
        original = getattr(RangedFile, method)

        def called(self, *args, **kwargs):
            if self.name.endswith(".tfrecord"):  # a shard (the manifest is read whole through read)
                through_file.append(f"{method} {self.name}")
            return original(self, *args, **kwargs)

        return called

    for method in ("read", "readinto"):
        monkeypatch.setattr(RangedFile, method, spied(method))
    bodies_read = []
    body_read = urllib3.response.HTTPResponse.read

    def counted_read(self, amt=None, *args, **kwargs):
        bodies_read.append(amt)
        return body_read(self, amt, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", recorded)
    monkeypatch.setattr(urllib3.response.HTTPResponse, "read", counted_read)
    monkeypatch.setattr(blocks_module, "SPAN_BYTES", 150_000, raising=False)  # several spans a shard, of two blocks
    options = {"split": "train", "raw": True, "batch_size": 1000, "block_length": 1500, "seed": 3, "shuffle_buffer": 3000}
    with open_dataset(url, **options) as remote, open_dataset(str(local), **options) as here:
        assert [batch["record"].tolist() for batch in remote] == [batch["record"].tolist() for batch in here]
    assert through_file == []
    assert not [amount for amount in bodies_read if amount is None or amount > 1 << 16], bodies_read
    assert len(ranges) == 2
    for address, requested in ranges.items():
        name, asked = address.rsplit("%2F", 1)[-1], sorted(requested)  # requested ahead, on several threads
        blocks = list(record_blocks_of(local / "train" / name, 1500))
        ends = {int(block.offsets[0]) for block in blocks} | {(local / "train" / name).stat().st_size}
        assert asked[0][0] == 0 and all(a[1] == b[0] for a, b in zip(asked, asked[1:])), asked  # every byte once
        assert {end for _, end in asked} <= ends and asked[-1][1] == (local / "train" / name).stat().st_size
        assert 2 < len(asked) < len(blocks), asked  # spans of several whole blocks


def record_blocks_of(path: pathlib.Path, block_length: int):
    from tfrbeam.tfrecord.blocks import record_blocks

    return record_blocks(str(path), None, 0, block_length)


def test_a_damaged_record_of_a_shard_in_a_bucket_fails_as_it_fails_locally(bucket, tmp_path, monkeypatch):
    # A span's block whose CRC does not match is read again by the header walk, which names the record as a local
    # read does; the blocks before it were handed on.
    import tfrbeam.tfrecord.blocks as blocks_module

    local = _indexed_dataset(tmp_path)
    shard = _shards(local, "train")[1]
    data = bytearray((local / "train" / shard).read_bytes())
    data[len(data) * 2 // 3] ^= 0x20
    (local / "train" / shard).write_bytes(bytes(data))
    url = _upload(bucket, local, "ds")
    monkeypatch.setattr(blocks_module, "SPAN_BYTES", 60_000, raising=False)
    options = {"split": "train", "raw": True, "batch_size": 500, "block_length": 1500, "seed": 1}
    failures = []
    for where in (url, str(local)):
        seen = []
        with pytest.raises(CorruptRecordError) as failure, open_dataset(where, **options) as dataset:
            for batch in dataset:
                seen.extend(batch["record"].tolist())
        failures.append((type(failure.value), os.path.basename(failure.value.path), failure.value.offset,
                         failure.value.check, len(seen)))
    assert failures[0] == failures[1] and failures[0][2] > 0 and failures[0][4] > 0, failures


def test_a_shards_read_index_is_requested_while_the_shard_is_opened(gcs_bucket, tmp_path, monkeypatch):
    # The index was requested only once the object's metadata had come: two round trips in a row before a shard's
    # first block. The metadata answers late here; the index request must not wait for it.
    import time

    import requests

    local = _indexed_dataset(tmp_path)
    url = _upload(gcs_bucket, local, "ds")
    events: list[tuple[str, str, str]] = []
    request = requests.Session.request

    def timed(self, method, address, *args, **kwargs):
        name = address.split("?")[0].rsplit("%2F", 1)[-1].split(".tfrecord")[0]
        kind = ("metadata" if "size,generation" in str(kwargs.get("params")) else
                "index" if ".tfrbeam-index" in address else None)
        if kind is None:
            return request(self, method, address, *args, **kwargs)
        events.append((name, kind, "asked"))
        if kind == "metadata":
            time.sleep(0.3)
        try:
            return request(self, method, address, *args, **kwargs)
        finally:
            events.append((name, kind, "answered"))

    monkeypatch.setattr(requests.Session, "request", timed)
    with open_dataset(url, split="train", raw=True, batch_size=4000, num_parallel_reads=1) as dataset:
        assert sum(len(batch["record"]) for batch in dataset) == 24_000
    shards = {name for name, _, _ in events if name.startswith("train-")}
    assert len(shards) == 2, events
    for name in shards:
        mine = [(kind, what) for shard, kind, what in events if shard == name]
        assert ("index", "asked") in mine and ("metadata", "answered") in mine, events
        assert mine.index(("index", "asked")) < mine.index(("metadata", "answered")), events


def test_a_reader_checks_the_manifests_generation_on_the_read_session(gcs_bucket, tmp_path, monkeypatch):
    # Every shard opened checks the manifest object's generation: google-cloud-storage's get_blob spent half as much
    # CPU again as one GET of the generation on the session the ranges use.
    from google.cloud import storage

    from tfrbeam.base.object_store import object_version
    from tfrbeam.layout.names import MANIFEST_NAME

    url = _upload(gcs_bucket, _indexed_dataset(tmp_path), "ds")
    looked_up = []
    get_blob = storage.Bucket.get_blob

    def counted(self, *args, **kwargs):
        looked_up.append(args)
        return get_blob(self, *args, **kwargs)

    monkeypatch.setattr(storage.Bucket, "get_blob", counted)
    with open_dataset(url, split="train", raw=True, batch_size=4000) as dataset:
        assert sum(len(batch["record"]) for batch in dataset) == 24_000
    assert looked_up == []
    manifest = gcs_bucket.server.client().bucket(gcs_bucket.name).get_blob(f"ds/{MANIFEST_NAME}")
    assert object_version(f"{url}/{MANIFEST_NAME}") == str(manifest.generation)
    assert object_version(f"{url}/no-such-object") is None


# ------------------------------------------------------------------------------ errors


def test_a_missing_object_is_one_line_naming_it(bucket, local_datasets):
    _upload(bucket, local_datasets["plain"], "ds")
    missing = bucket.url("ds/train/no-such-shard.tfrecord")
    with pytest.raises(ObjectNotFoundError, match="no-such-shard"):
        list(tfrbeam.read_records(missing))
    for command in (("cat", missing), ("verify", missing), ("inspect", missing), ("cat", bucket.url("nothing/here/"))):
        done = _cli(*command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and command[1] in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_missing_dataset_or_shard_in_a_bucket_is_named(bucket, local_datasets):
    local = local_datasets["plain"]
    url = _upload(bucket, local, "ds")
    with pytest.raises(ConfigError, match="no-such-dataset"):
        open_dataset(bucket.url("no-such-dataset"), split="train")
    shard = _shards(local, "train")[2]
    if bucket.root.startswith("s3"):
        bucket.server.client().delete_object(Bucket=bucket.name, Key=f"ds/train/{shard}")
    else:
        bucket.server.client().bucket(bucket.name).blob(f"ds/train/{shard}").delete()
    with pytest.raises(MissingShardError, match=shard):
        list(open_dataset(url, split="train", batch_size=500))
    done = _cli("verify", url)
    assert done.returncode == 1 and f"{url}/train/{shard}: listed in the manifest but missing" in done.stdout


def test_the_reader_of_a_bucket_does_not_import_beam(bucket, local_datasets):
    url = _upload(bucket, local_datasets["plain"], "ds")
    program = (
        "import sys\n"
        "from tfrbeam.dataset import open_dataset, open_random_access\n"
        f"total = sum(len(batch['id']) for batch in open_dataset({url!r}, split='train', batch_size=256))\n"
        f"total += len(open_random_access({url!r}, split='eval')[:5])\n"
        "print(total, sorted(name for name in sys.modules if name.split('.')[0] == 'apache_beam'))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, beam_modules = done.stdout.split(" ", 1)
    assert int(count) > 4000 + 5 and beam_modules.strip() == "[]"
