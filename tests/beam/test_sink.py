"""tfrbeam's TFRecord sink and WriteExamples: shard counts, size limits, exactly-once output, rerun rules, atomic finalize."""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import pathlib
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given, settings, strategies as st

from tests.helpers import index_as_written_before, shard_files as _shards
from tfrbeam.beam import sink
from tfrbeam.beam.examples_write import WriteExamples, _FrameExamplesFn
from tfrbeam.beam.sink import Finalizer, WriteToTFRecord, frame_batch, make_sink_spec
from tfrbeam.codec.encode import encode_record_batch
from tfrbeam.codec.example import encode_example
from tfrbeam.errors import (
    ArrowConversionError,
    ConfigError,
    ExampleEncodeError,
    OutputExistsError,
    TfrbeamError,
    UnsupportedCompressionError,
)
from tfrbeam.layout.names import ShardNaming
from tfrbeam.tfrecord import read_index
from tfrbeam.tfrecord.read_index import (
    INDEX_DIR_NAME,
    index_is_current,
    index_path_for,
    index_paths_for,
    load_offsets,
    load_split_table,
)
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordWriter, read_records

# Duplicates on purpose: "exactly once" is checked as multiset equality.
RECORDS = [b"r%04d" % (i % 450) * (1 + i % 9) for i in range(600)]


_OUTPUT_NAMES: dict[str, list[str]] = collections.defaultdict(list)


def _collect_name(name: str, key: str) -> None:
    """Record a transform's output in this process (a module function, so the in-process runner shares it)."""
    _OUTPUT_NAMES[key].append(name)


def _run(records, *writes, options=(), create_reshuffle=True):
    """Run one pipeline writing ``records`` with each ``(prefix, kwargs)``; return names per write and metrics."""
    pipeline = beam.Pipeline(options=PipelineOptions(list(options)))
    created = pipeline | beam.Create(records, reshuffle=create_reshuffle)
    for number, (prefix, kwargs) in enumerate(writes):
        _OUTPUT_NAMES.pop(prefix, None)
        names = created | f"Write{number}" >> WriteToTFRecord(prefix, **kwargs)
        names | f"Collect{number}" >> beam.Map(_collect_name, prefix)
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("tfrbeam"))["counters"]
    metrics = collections.Counter()
    for counter in counters:
        metrics[counter.key.metric.name] += counter.committed
    # A set: with --direct_runner_bundle_repeat the collecting step itself runs more than once.
    return [sorted(set(_OUTPUT_NAMES[prefix])) for prefix, _ in writes], metrics


def _read_all(paths, compression="auto"):
    return collections.Counter(record for path in paths for record in read_records(path, compression))


def _temp_dirs(directory):
    """Staging directories (and lock files) the commit protocol leaves beside a prefix."""
    return [name for name in os.listdir(directory) if name.startswith(".") and ".tfrbeam-" in name and name != INDEX_DIR_NAME]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _orphan(staging_dir) -> None:
    """Make a staging directory look like a killed run's: its owner process is gone."""
    owner = pathlib.Path(staging_dir) / "owner.json"
    data = json.loads(owner.read_text())
    data.update(pid=_dead_pid(), process_start=None)
    owner.write_text(json.dumps(data))


def _file_mtime(path):
    return os.stat(path).st_mtime


# --------------------------------------------------------------------------------------------
# Shard counts, exactly-once output, index files, metrics


def test_exact_shard_counts_records_once_and_read_index(tmp_path):
    prefixes = {count: str(tmp_path / f"n{count}") for count in (0, 1, 7)}
    names, metrics = _run(RECORDS, *[(prefix, {"num_shards": count}) for count, prefix in prefixes.items()])
    for (count, prefix), written in zip(prefixes.items(), names):
        files = _shards(prefix)
        assert written == files
        if count:
            assert len(files) == count
            assert files[0].endswith(f"-00000-of-{count:05d}")
        assert _read_all(files) == collections.Counter(RECORDS)
        for path in files:  # a current, correct read index for every uncompressed shard
            index = load_split_table(path, os.path.getsize(path), _file_mtime(path))
            assert index is not None and index.num_records == sum(1 for _ in read_records(path))
    seven = [sum(1 for _ in read_records(path)) for path in _shards(prefixes[7])]
    assert max(seven) - min(seven) <= 1  # one batch, split evenly
    assert metrics["records_written"] == 3 * len(RECORDS)
    assert metrics["shards_written"] == sum(len(n) for n in names)
    assert metrics["bytes_written"] == sum(os.path.getsize(p) for n in names for p in n)
    # The index lives where shard globs and TF never look, and temp directories are gone.
    everything = glob.glob(str(tmp_path / "*"))
    assert all(INDEX_DIR_NAME not in path for path in everything + glob.glob(str(tmp_path / "n7-*")))
    # One read index file per uncompressed shard, and nothing else beside them.
    assert sorted(os.listdir(tmp_path / INDEX_DIR_NAME)) == sorted(
        os.path.basename(path) + ".index" for written_by_one in names for path in written_by_one)
    assert _temp_dirs(tmp_path) == []


def test_index_offsets_are_record_starts_across_many_batches(tmp_path):
    payloads = [bytes([i % 251]) * (3000 + i % 17) for i in range(2500)]  # ~7.5 MB, several framed batches
    prefix = str(tmp_path / "big")
    (names,), _ = _run(payloads, (prefix, {"num_shards": 2}))
    for path in names:
        index = load_split_table(path, os.path.getsize(path), _file_mtime(path))
        assert index is not None and len(index.offsets) >= 3
        starts = []
        offset = 0
        for payload in read_records(path):
            starts.append(offset)
            offset += len(payload) + RECORD_OVERHEAD
        assert all(starts[number] == offset for offset, number in zip(index.offsets, index.record_numbers))


def test_read_indexes_come_from_the_writers_not_from_walking_the_shards_again(tmp_path, monkeypatch):
    """The writers collect every record start as they write; finalize only moves and stamps the index."""

    def walk_refused(path):
        raise AssertionError(f"finalize walked the headers of {path}")

    monkeypatch.setattr(read_index, "offsets_from_headers", walk_refused)
    monkeypatch.setattr(sink, "offsets_from_headers", walk_refused)
    payloads = [bytes([i % 251]) * (1 + i % 700) for i in range(3000)]
    prefixes = {count: str(tmp_path / f"n{count}") for count in (0, 3, 3000 + 5)}  # the last has empty shards
    _run(payloads, *[(prefix, {"num_shards": count}) for count, prefix in prefixes.items()])
    for prefix in prefixes.values():
        for path in _shards(prefix):
            assert index_is_current(path, index_path_for(path))[0]
            assert load_offsets(path, write=False).tolist() == _record_starts(path)
    assert _temp_dirs(tmp_path) == []


def _record_starts(path):
    starts, offset = [], 0
    for payload in read_records(path):
        starts.append(offset)
        offset += len(payload) + RECORD_OVERHEAD
    return starts + [offset]


def test_more_shards_than_records_gives_valid_empty_shards(tmp_path):
    prefix = str(tmp_path / "few")
    (names,), metrics = _run([b"a", b"b", b"c"], (prefix, {"num_shards": 7, "file_name_suffix": ".gz"}))
    assert names == _shards(prefix, ".gz") and len(names) == 7
    counts = [sum(1 for _ in read_records(path)) for path in names]
    assert sorted(counts) == [0, 0, 0, 0, 1, 1, 1]
    assert _read_all(names) == collections.Counter([b"a", b"b", b"c"])
    assert not os.path.exists(tmp_path / INDEX_DIR_NAME)  # compressed shards have no read index
    assert metrics["shards_written"] == 7 and metrics["records_written"] == 3


def test_empty_input(tmp_path):
    default, fixed = str(tmp_path / "default"), str(tmp_path / "fixed")
    (names_default, names_fixed), _ = _run([], (default, {}), (fixed, {"num_shards": 3, "compression": "zlib"}))
    assert names_default == [default + "-00000-of-00001"] and os.path.getsize(names_default[0]) == 0
    assert names_fixed == _shards(fixed) and len(names_fixed) == 3
    assert _read_all(names_fixed, "zlib") == collections.Counter()


def test_unsharded_output_with_empty_template(tmp_path):
    path = str(tmp_path / "all.tfrecord")
    (names,), _ = _run(RECORDS, (path, {"shard_name_template": ""}))
    assert names == [path]
    assert sorted(os.listdir(tmp_path)) == sorted(["all.tfrecord", INDEX_DIR_NAME])
    assert _read_all(names) == collections.Counter(RECORDS)


# --------------------------------------------------------------------------------------------
# Size limits


def test_size_limits_are_never_exceeded(tmp_path):
    by_records, by_bytes = str(tmp_path / "rec"), str(tmp_path / "bytes")
    max_bytes = 700
    (rec_names, byte_names), _ = _run(
        RECORDS,
        (by_records, {"max_records_per_shard": 64}),
        (by_bytes, {"max_bytes_per_shard": max_bytes}),
    )
    rec_counts = [sum(1 for _ in read_records(path)) for path in rec_names]
    assert max(rec_counts) == 64 and sum(rec_counts) == len(RECORDS) and len(rec_names) == 10
    assert all(os.path.getsize(path) <= max_bytes for path in byte_names)
    assert len(byte_names) >= sum(len(r) + RECORD_OVERHEAD for r in RECORDS) // max_bytes
    assert _read_all(rec_names) == _read_all(byte_names) == collections.Counter(RECORDS)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), max_size=80),
    split_at=st.lists(st.integers(0, 80), max_size=4),
    max_records=st.one_of(st.none(), st.integers(1, 20)),
    max_bytes=st.one_of(st.none(), st.integers(316, 2000)),
)
def test_bundle_writer_splits_exactly_at_limits(tmp_path_factory, lengths, split_at, max_records, max_bytes):
    """Whatever the batch boundaries, shards respect both limits, are full but for the last, and keep order."""
    payloads = [bytes([i % 256]) * length for i, length in enumerate(lengths)]
    spec = make_sink_spec(
        str(tmp_path_factory.mktemp("limits") / "out"), max_records_per_shard=max_records, max_bytes_per_shard=max_bytes
    )
    writer = sink._WriteBundleShardsFn(spec)
    writer.setup()
    writer.start_bundle()
    shards = []
    bounds = sorted({0, len(payloads), *[min(s, len(payloads)) for s in split_at]})
    for start, stop in zip(bounds, bounds[1:]):
        shards.extend(writer.process(frame_batch(payloads[start:stop])))
    shards.extend(value.value for value in writer.finish_bundle())
    contents = [list(read_records(shard.path, None)) for shard in shards]
    assert [p for content in contents for p in content] == payloads
    for shard, content in zip(shards, contents):
        assert shard.records == len(content) and shard.framed_bytes == os.path.getsize(shard.path)
        assert max_records is None or shard.records <= max_records
        assert max_bytes is None or shard.framed_bytes <= max_bytes
    for shard, following in zip(shards, contents[1:]):  # a shard is closed only when the next record won't fit
        next_size = len(following[0]) + RECORD_OVERHEAD
        assert (max_records is not None and shard.records == max_records) or (
            max_bytes is not None and shard.framed_bytes + next_size > max_bytes
        )


def test_record_larger_than_max_bytes_is_refused(tmp_path):
    spec = make_sink_spec(str(tmp_path / "out"), max_bytes_per_shard=100)
    writer = sink._WriteBundleShardsFn(spec)
    writer.setup()
    writer.start_bundle()
    with pytest.raises(ConfigError, match="max_bytes_per_shard=100 is smaller than one record of 116 framed bytes"):
        list(writer.process(frame_batch([b"x" * 100])))


def test_conflicting_sharding_arguments_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="num_shards=3 fixes the shard count"):
        WriteToTFRecord(str(tmp_path / "o"), num_shards=3, max_records_per_shard=10)
    with pytest.raises(ConfigError, match="one unsharded file"):
        WriteToTFRecord(str(tmp_path / "o"), shard_name_template="", max_bytes_per_shard=10)
    with pytest.raises(ValueError, match="no shard number placeholder"):
        WriteToTFRecord(str(tmp_path / "o"), shard_name_template="-NNN")
    with pytest.raises(ValueError, match="bounded PCollections only"):
        WriteToTFRecord(str(tmp_path / "o"), triggering_frequency=60)


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.integers(0, 40), min_size=1, max_size=6), shards=st.integers(1, 9))
def test_split_by_shard_is_balanced_and_loses_nothing(batches, shards):
    splitter = sink._SplitByShardFn(shards)
    splitter.start_bundle()
    payloads, emitted = [], []
    for size in batches:
        batch = [b"%d" % (len(payloads) + i) for i in range(size)]
        payloads += batch
        emitted.extend(splitter.process(frame_batch(batch)))
    emitted.extend(value.value for value in splitter.finish_bundle())
    per_shard = collections.Counter()
    seen = []
    for shard, (framed, lengths) in emitted:
        assert 0 <= shard < shards
        records = list(read_records(io.BytesIO(framed), None))
        assert [len(r) for r in records] == np.frombuffer(lengths, "<u4").tolist()
        per_shard[shard] += len(records)
        seen += records
    assert sorted(seen) == sorted(payloads)
    counts = [per_shard[shard] for shard in range(shards)]
    assert max(counts) - min(counts) <= len(batches)


# --------------------------------------------------------------------------------------------
# Compression


def test_gzip_and_zlib_are_byte_identical_to_tensorflow(tmp_path, tf_vectors):
    payloads = list(read_records(tf_vectors / "raw.tfrecord"))
    gz, zz = str(tmp_path / "raw.tfrecord.gz"), str(tmp_path / "raw.tfrecord.zlib")
    (gz_names, zz_names), _ = _run(
        payloads,
        (gz, {"shard_name_template": ""}),  # gzip by AUTO from the .gz extension, as Beam does
        (zz, {"shard_name_template": "", "compression": "zlib"}),
        create_reshuffle=False,  # keep TF's record order so whole files can be compared
    )
    assert gz_names == [gz] and zz_names == [zz]
    assert pathlib.Path(gz).read_bytes() == (tf_vectors / "raw.tfrecord.gz").read_bytes()
    assert pathlib.Path(zz).read_bytes() == (tf_vectors / "raw.tfrecord.zlib").read_bytes()
    assert list(read_records(gz)) == list(read_records(zz)) == payloads


def test_codecs_tensorflow_cannot_read_are_refused(tmp_path):
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
        WriteToTFRecord(str(tmp_path / "o"), compression_type=CompressionTypes.BZIP2)
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
        WriteToTFRecord(str(tmp_path / "o"), file_name_suffix=".zst")
    with pytest.raises(UnsupportedCompressionError):
        WriteToTFRecord(str(tmp_path / "o"), compression="snappy")
    assert make_sink_spec(str(tmp_path / "o"), compression_type=CompressionTypes.DEFLATE).codec() == "zlib"
    assert make_sink_spec(str(tmp_path / "o"), file_name_suffix=".zlib").codec() == "zlib"


def test_auto_goes_by_the_output_name_never_by_an_earlier_runs_file_there(tmp_path):
    """Measured (issue 44): "auto" looked inside the final file's path, so a GZIP file an earlier run left under a
    name without a suffix made the new run write GZIP too."""
    path = tmp_path / "out.tfrecord"
    with RecordWriter(str(path), "gzip") as writer:
        writer.write(b"old")
    assert make_sink_spec(str(path), shard_name_template="").codec() is None
    assert make_sink_spec(str(path), shard_name_template="", compression="gzip").codec() == "gzip"


# --------------------------------------------------------------------------------------------
# Reruns into a prefix that holds an earlier run's shards


def _make_old_run(prefix, count):
    paths = [f"{prefix}-{i:05d}-of-{count:05d}" for i in range(count)]
    (names,), _ = _run([b"old-%d" % i for i in range(count * 4)], (prefix, {"num_shards": count}))
    assert names == paths
    return paths


def test_rerun_is_refused_before_the_pipeline_runs(tmp_path):
    prefix = str(tmp_path / "data")
    old = _make_old_run(prefix, 3)
    pipeline = beam.Pipeline()
    with pytest.raises(OutputExistsError, match=r"3 file\(s\) of an earlier run.*data-00000-of-00003.*overwrite=True"):
        _ = pipeline | beam.Create([b"new"]) | WriteToTFRecord(prefix, num_shards=2, overwrite=False)
    assert _shards(prefix) == old


def test_by_default_a_rerun_replaces_the_earlier_set_as_beam_does(tmp_path):
    prefix = str(tmp_path / "data")
    _make_old_run(prefix, 3)
    for _ in range(2):  # the same pipeline twice, as a README snippet run twice
        (names,), _ = _run([b"new-%d" % i for i in range(10)], (prefix, {"num_shards": 2}))
        assert _shards(prefix) == names and len(names) == 2
        assert _read_all(names) == collections.Counter(b"new-%d" % i for i in range(10))


def test_rerun_is_refused_again_at_finalize(tmp_path):
    prefix = str(tmp_path / "data")
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([b"new"] * 10) | WriteToTFRecord(prefix, num_shards=2, overwrite=False)  # nothing there yet
    old = _make_old_run(prefix, 3)  # an earlier run lands while this one is built
    with pytest.raises(Exception, match=r"OutputExistsError|of an earlier run"):
        pipeline.run().wait_until_finish()
    assert _shards(prefix) == old  # nothing renamed: no mix of -of-00003 and -of-00002
    assert _read_all(old) == collections.Counter(b"old-%d" % i for i in range(12))


def test_overwrite_replaces_the_old_set_and_its_index_files(tmp_path):
    prefix = str(tmp_path / "data")
    old = _make_old_run(prefix, 3)
    unrelated = [prefix + "-00000-of-00003.gz", prefix + "-extra", str(tmp_path / "other-00000-of-00001")]
    for path in unrelated:
        pathlib.Path(path).write_bytes(b"not ours")
    index_as_written_before(old[1], "both")  # a run of before the .index left these
    assert all(any(os.path.exists(index) for index in index_paths_for(path)) for path in old)
    (names,), _ = _run(RECORDS, (prefix, {"num_shards": 2, "overwrite": True}))
    assert _shards(prefix) == names == [prefix + "-00000-of-00002", prefix + "-00001-of-00002"]
    assert not any(os.path.exists(index) for path in old for index in index_paths_for(path))
    assert all(os.path.exists(index_path_for(path)) for path in names)
    assert all(pathlib.Path(path).read_bytes() == b"not ours" for path in unrelated)
    assert _read_all(names) == collections.Counter(RECORDS)


# --------------------------------------------------------------------------------------------
# Atomic, idempotent finalize


def _temp_shards(spec, groups):
    """Write temporary shards as the pipeline's writers would (one per group of payloads)."""
    shards = []
    for number, payloads in enumerate(groups):
        writer = sink._TempShardWriter(spec, spec.codec(), number if spec.num_shards else None)
        framed, lengths = frame_batch(payloads)
        writer.write(framed, np.frombuffer(lengths, "<u4"))
        shards.append(writer.close())
    return shards


@pytest.mark.parametrize("num_shards", [0, 4])
def test_finalize_is_idempotent(tmp_path, num_shards):
    spec = make_sink_spec(str(tmp_path / "out"), num_shards=num_shards)
    groups = [[b"a", b"bb"], [b"ccc"], [b"dddd"] * 3]
    shards = _temp_shards(spec, groups)
    first = Finalizer(spec).run(shards)
    contents = {path: pathlib.Path(path).read_bytes() for path in first}
    indexes = {path: pathlib.Path(index_path_for(path)).read_bytes() for path in first}
    second = Finalizer(spec).run(shards)  # e.g. the runner retries the finalize bundle
    assert first == second == _shards(str(tmp_path / "out"))
    assert len(first) == (num_shards or len(groups))
    assert {path: pathlib.Path(path).read_bytes() for path in first} == contents
    assert {path: pathlib.Path(index_path_for(path)).read_bytes() for path in first} == indexes
    assert _read_all(first) == collections.Counter(p for group in groups for p in group)
    assert _temp_dirs(tmp_path) == []


def test_finalize_completes_an_interrupted_finalize(tmp_path):
    spec = make_sink_spec(str(tmp_path / "out"), num_shards=3)
    shards = _temp_shards(spec, [[b"x"], [b"y"], [b"z"]])
    finalizer = Finalizer(spec)
    moves = finalizer.plan(shards)
    os.rename(moves[0].shard.path, moves[0].dst)  # an earlier attempt renamed one shard, then died
    pathlib.Path(moves[1].dst).write_bytes(pathlib.Path(moves[1].shard.path).read_bytes())  # copied, not deleted
    assert finalizer.run(shards) == [move.dst for move in moves]
    assert [list(read_records(move.dst)) for move in moves] == [[b"x"], [b"y"], [b"z"]]
    assert _temp_dirs(tmp_path) == []


def test_bundle_repeat_leaves_no_temporary_files(tmp_path):
    """--direct_runner_bundle_repeat replays every bundle (writers and finalize) with real side effects."""
    prefixes = [str(tmp_path / "auto"), str(tmp_path / "fixed"), str(tmp_path / "limited")]
    names, metrics = _run(
        RECORDS,
        (prefixes[0], {}),
        (prefixes[1], {"num_shards": 3}),
        (prefixes[2], {"max_records_per_shard": 100, "file_name_suffix": ".gz"}),
        options=["--direct_runner_bundle_repeat=2"],
    )
    assert sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(path) for n in names for path in n] + [INDEX_DIR_NAME]
    )
    for written, prefix, suffix in zip(names, prefixes, ["", "", ".gz"]):
        assert written == _shards(prefix, suffix)
        assert _read_all(written) == collections.Counter(RECORDS)
    assert metrics["records_written"] == 3 * len(RECORDS)


def _payload_or_fail(number):
    if number == 200:
        raise ValueError("the pipeline fails after some shards were written")
    return b"%06d" % number * 5_000


def test_failed_pipeline_leaves_no_final_shard(tmp_path):
    prefix = str(tmp_path / "out")
    pipeline = beam.Pipeline()
    _ = (
        pipeline
        | beam.Create(range(201), reshuffle=False)
        | beam.Map(_payload_or_fail)  # 30 kB records: 4 MiB batches, so temp shards exist before the failure
        | WriteToTFRecord(prefix, max_records_per_shard=40)
    )
    with pytest.raises(Exception, match="the pipeline fails after some shards were written"):
        pipeline.run().wait_until_finish()
    assert _shards(prefix) == []
    assert not os.path.exists(tmp_path / INDEX_DIR_NAME)
    leftover = _temp_dirs(tmp_path)
    assert len(leftover) == 1 and os.listdir(tmp_path / leftover[0])  # Beam has no failure hook: it stays, hidden
    (names,), _ = _run([b"ok"], (prefix, {}))  # its owner (this process) lives: a later run leaves it alone
    assert names == _shards(prefix) and _temp_dirs(tmp_path) == leftover
    _orphan(tmp_path / leftover[0])  # once its owner is gone, the next run into the prefix removes it
    (names,), _ = _run([b"ok"], (prefix, {"overwrite": True}))
    assert names == _shards(prefix) and _temp_dirs(tmp_path) == []


# --------------------------------------------------------------------------------------------
# Naming


def test_shard_naming_follows_beam_templates():
    naming = ShardNaming("gs://b/out", ".tfrecord", "-SSSSS-of-NNNNN")
    assert naming.name(3, 12) == "gs://b/out-00003-of-00012.tfrecord"
    assert naming.name(123456, 200000) == "gs://b/out-123456-of-200000.tfrecord"
    assert naming.glob() == "gs://b/out-*-of-*.tfrecord"
    assert naming.matches("gs://b/out-00001-of-00002.tfrecord")
    assert not naming.matches("gs://b/out-00001-of-00002.tfrecord.gz")
    assert not naming.matches("gs://b/out-x-of-00002.tfrecord")
    assert not naming.matches("gs://b/out-001-of-002.tfrecord")
    short = ShardNaming("p", "", "_SS")
    assert short.name(7, 9) == "p_07" and short.matches("p_07") and not short.matches("p_07-of-09")
    single = ShardNaming("/d/file.gz", "", "")
    assert single.name(0, 1) == "/d/file.gz" == single.glob() and single.matches("/d/file.gz")


# --------------------------------------------------------------------------------------------
# WriteExamples


def test_write_examples_from_record_batches_and_dicts(tmp_path):
    batch = pa.record_batch({
        "id": pa.array(range(40), pa.int64()),
        "tags": pa.array([[b"a"] * (i % 3) for i in range(40)], pa.list_(pa.binary())),
        "score": pa.array([i / 8 for i in range(40)], pa.float32()),
    })
    dicts = [{"id": 1000 + i, "score": [float(i)], "tags": []} for i in range(5)]
    kinds = {"id": "int64", "score": "float", "tags": "bytes"}
    prefix = str(tmp_path / "examples")
    pipeline = beam.Pipeline()
    _ = (
        pipeline
        | beam.Create([batch, batch.slice(0, 0), pa.Table.from_batches([batch.slice(5, 3)])] + dicts)
        | WriteExamples(prefix, kinds=kinds, num_shards=2)
    )
    pipeline.run().wait_until_finish()
    expected = encode_record_batch(batch).to_list() + encode_record_batch(batch.slice(5, 3)).to_list()
    expected += [encode_example(example, kinds) for example in dicts]
    assert _read_all(_shards(prefix)) == collections.Counter(expected)  # byte for byte the codec's output


def test_write_examples_refuses_what_it_cannot_encode():
    encoder = _FrameExamplesFn({"id": "float"})
    encoder.start_bundle()
    with pytest.raises(ArrowConversionError, match=r"column 'id' has Arrow type int64.*kinds declares 'float'"):
        list(encoder.process(pa.record_batch({"id": pa.array([1], pa.int64())})))
    with pytest.raises(ExampleEncodeError, match=r"takes dicts .* or pyarrow RecordBatches/Tables, got a int"):
        list(encoder.process(42))


def test_finalize_refuses_a_final_file_it_did_not_write(tmp_path):
    spec = make_sink_spec(str(tmp_path / "out"), num_shards=1)
    (shard,) = _temp_shards(spec, [[b"ours"]])
    os.remove(shard.path)  # our temporary file vanished...
    pathlib.Path(spec.naming().name(0, 1)).write_bytes(b"x" * 3)  # ...and a different file holds the name
    with pytest.raises(TfrbeamError, match="another run wrote into the same prefix"):
        Finalizer(spec).run([shard])


def test_a_failed_bundles_temp_shard_is_discarded_when_the_instance_is_reused(tmp_path):
    """A bundle that fails leaves its temp shard open; the next bundle on the same DoFn instance deletes it."""
    spec = make_sink_spec(str(tmp_path / "out"))
    fn = sink._WriteBundleShardsFn(spec)
    fn.setup()
    fn.start_bundle()
    list(fn.process(frame_batch([b"a", b"bc"])))  # then the bundle fails: finish_bundle never runs
    leftover = fn._writer.path
    assert os.path.exists(leftover)
    fn.start_bundle()
    assert not os.path.exists(leftover) and fn._writer is None
    fn.teardown()
