"""The splittable TFRecord source: Beam's range contract, the read index, adversarial payloads, integrity, runners."""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import logging
import os
import random

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.io import source_test_utils
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from tests.helpers import corrupt_vectors_oracle, index_as_written_before, write_index
from tfrbeam.beam import ReadAllFromTFRecord, ReadExamples, ReadFromTFRecord, TFRecordSource, source as source_module
from tfrbeam.beam.examples_read import DecodeToDicts, DecodeToRecordBatches
from tfrbeam.beam.source import INDEXED, SCAN, WHOLE, DecodedBatchSource, ReadOptions, TFRecordFileSource, _ExpandIntoRanges
from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.encode import record_batch_to_examples
from tfrbeam.codec.example import decode_example, encode_example
from tfrbeam.errors import (
    ConfigError,
    CorruptRecordError,
    ExampleDecodeError,
    RecordError,
    TfrbeamError,
    TruncatedRecordError,
    UnsupportedCompressionError,
)
from tfrbeam.tfrecord.blocks import RecordBlock
from tfrbeam.tfrecord.read_index import INDEX_INTERVAL_BYTES, ReadIndexBuilder
from tfrbeam.tfrecord.records import RecordWriter, frame_records, read_records

# ---------------------------------------------------------------------------------------------
# helpers


def write_records(path, payloads, *, index=True, interval=INDEX_INTERVAL_BYTES, compression=None) -> list[int]:
    """Write ``payloads`` as a TFRecord file (with a read index unless told not to); return the record starts."""
    path = str(path)
    builder = ReadIndexBuilder(interval)
    starts = []
    with RecordWriter(path, compression) as writer:
        for number, payload in enumerate(payloads):
            starts.append(writer.bytes_written)
            builder.add(writer.bytes_written, number)
            writer.write(payload)
    if index:
        write_index(path, builder.to_bytes(os.path.getsize(path), os.path.getmtime(path)))
    return starts


def file_source(path, **kwargs) -> TFRecordFileSource:
    """The one-file source TFRecordSource splits into (what a worker reads)."""
    (bundle,) = list(TFRecordSource(str(path), **kwargs).split(float("inf")))
    return bundle.source


def read(source, start=None, stop=None) -> list:
    return list(source.read(source.get_range_tracker(start, stop)))


def read_pieces(source, cuts, size) -> list[list]:
    """Read the adjacent ranges [0, c1), [c1, c2), ..., [cn, size)."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < size}), size]
    return [read(source, lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def assert_pieces_exact(source, cuts, payloads, starts, size) -> None:
    """Each range [lo, hi) reads exactly the records whose true start lies in it, so any union is exact."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < size}), size]
    for (lo, hi), got in zip(zip(bounds, bounds[1:]), read_pieces(source, cuts, size)):
        want = payloads[bisect.bisect_left(starts, lo):bisect.bisect_left(starts, hi)]
        assert got == want, f"range [{lo}, {hi}) read {len(got)} records, expected {len(want)}"


def run_pipeline(build, *args: str):
    """Run a pipeline on the DirectRunner; return its result (for metrics)."""
    pipeline = beam.Pipeline(options=PipelineOptions(list(args)))
    build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    return result


def counters(result) -> dict[str, int]:
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace("tfrbeam"))["counters"]:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    return totals


def mixed_payloads(rng: random.Random, count: int, max_size: int) -> list[bytes]:
    """Random payloads, with runs of tiny and empty ones so that windows hold several record starts."""
    payloads = []
    for number in range(count):
        size = rng.randint(0, 24) if number % 10 < 3 else rng.randint(0, max_size)
        payloads.append(rng.randbytes(size))
    return payloads


# ---------------------------------------------------------------------------------------------
# Beam's source_test_utils


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """Two indexed files: fixed 50-byte payloads (66-byte records) and mixed sizes, with a dense index."""
    directory = tmp_path_factory.mktemp("small")
    rng = random.Random(7)
    fixed = [rng.randbytes(50) for _ in range(60)]
    mixed = mixed_payloads(rng, 80, 300)
    fixed_path, mixed_path = directory / "fixed.tfrecord", directory / "mixed.tfrecord"
    write_records(fixed_path, fixed, interval=256)
    write_records(mixed_path, mixed, interval=512)
    return {"fixed": (str(fixed_path), fixed), "mixed": (str(mixed_path), mixed)}


@pytest.mark.parametrize("name", ["fixed", "mixed"])
def test_sources_equal_reference_source_for_every_bundle_size(small_files, name):
    path, payloads = small_files[name]
    size = os.path.getsize(path)
    source = TFRecordSource(path)
    for desired in (1, 7, 13, 64, 65, 66, 67, size - 1, size, size + 1):
        bundles = list(source.split(desired_bundle_size=desired))
        assert max(1, size // desired) <= len(bundles) <= -(-size // desired)
        source_test_utils.assert_sources_equal_reference_source(
            (source, None, None), [(b.source, b.start_position, b.stop_position) for b in bundles]
        )
        in_order = [record for b in bundles for record in read(b.source, b.start_position, b.stop_position)]
        assert in_order == payloads


def test_bundles_carry_only_the_index_entries_they_need(small_files):
    path, _ = small_files["mixed"]
    bundles = list(TFRecordSource(path).split(desired_bundle_size=1000))
    assert len(bundles) > 3
    for bundle in bundles:
        plan = bundle.source.plan()
        assert plan.mode == INDEXED
        offsets = plan.index.offsets
        assert offsets[0] <= bundle.start_position
        assert all(bundle.start_position < offset < bundle.stop_position for offset in offsets[1:])


@pytest.mark.parametrize("files", ["idx", "offsets", "both", "none"])
def test_files_indexed_before_the_one_read_index_still_split_exactly(tmp_path, files):
    """A dataset written before the ``.index`` has an ``.idx`` (its split table), an ``.offsets`` (its record starts),
    both or neither beside each shard: ranges still start exactly on records, and read every record once."""
    rng = random.Random(5)
    payloads = [rng.randbytes(rng.randint(500, 1500)) for _ in range(3000)]  # ~3 MiB: three entries a MiB apart
    path = tmp_path / "old.tfrecord"
    write_records(path, payloads)
    index_as_written_before(path, files)
    bundles = list(TFRecordSource(str(path)).split(desired_bundle_size=100_000))
    plans = {bundle.source.plan().mode for bundle in bundles}
    assert (plans, len(bundles) > 20) == (({WHOLE}, False) if files == "none" else ({INDEXED}, True))
    assert [record for bundle in bundles for record in read(bundle.source, bundle.start_position,
                                                            bundle.stop_position)] == payloads


def test_a_split_reads_the_front_of_the_read_index_only(tmp_path, monkeypatch):
    """Planning ranges needs the split table (16 bytes a MiB), not the record starts (8 bytes a record) after it."""
    from tfrbeam.tfrecord.read_index import index_path_for

    payloads = [b"x" * 20] * 100_000  # 3.6 MB of 36-byte records: 800 kB of record starts
    path = tmp_path / "small-records.tfrecord"
    write_records(path, payloads)
    read_bytes: list[tuple[str, int]] = []
    open_read = source_module.open_read  # every file the source opens, it opens through the file systems' open_read

    class Counted:
        def __init__(self, opened: str):
            self.opened, self.handle = opened, open_read(opened)

        def read(self, size: int = -1) -> bytes:
            data = self.handle.read(size)
            read_bytes.append((self.opened, len(data)))
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc_info) -> None:
            self.handle.close()

    monkeypatch.setattr(source_module, "open_read", Counted)
    bundles = list(TFRecordSource(str(path)).split(desired_bundle_size=500_000))
    monkeypatch.undo()
    assert {bundle.source.plan().mode for bundle in bundles} == {INDEXED} and len(bundles) > 5
    assert read_bytes == [(index_path_for(str(path)), 52 + 16 * 4)]
    assert [record for bundle in bundles for record in read(bundle.source, bundle.start_position,
                                                            bundle.stop_position)] == payloads


@pytest.mark.parametrize("files", ["index", "idx"])
def test_a_file_in_a_bucket_is_split_by_one_range_read_of_its_read_index(bucket, tmp_path, monkeypatch, files):
    """In a bucket the split table is read with one range read of the index's front (Beam's own reader would fetch a
    16 MiB buffer: the record starts too); a file of a dataset written before is split by its ``.idx``."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.beam import filesystem, source as source_module
    from tfrbeam.tfrecord.read_index import index_path_for, max_table_bytes, offsets_from_headers, read_index_bytes

    filesystem.use_pipeline_options(PipelineOptions(bucket.pipeline_args()))
    payloads = [b"record %07d" % number for number in range(150_000)]  # 4.2 MB of 30-byte records
    path = tmp_path / "f.tfrecord"
    write_records(path, payloads, index=False)
    write_index(path, read_index_bytes(offsets_from_headers(str(path)), None))  # an object's mtime is its own
    if files == "idx":
        index_as_written_before(path, "idx")
    for local in [path, *path.parent.glob(".tfrbeam-index/*")]:
        bucket.put(f"d/{local.relative_to(tmp_path).as_posix()}", local.read_bytes())
    asked: list[tuple[str, int]] = []
    open_ranged = source_module.open_ranged

    def recorded(object_path: str):
        handle = open_ranged(object_path)
        read_range = handle.read_range
        handle.read_range = lambda offset, length: asked.append((object_path, length)) or read_range(offset, length)
        return handle

    monkeypatch.setattr(source_module, "open_ranged", recorded)
    url = bucket.url("d/f.tfrecord")
    bundles = list(TFRecordSource(url).split(desired_bundle_size=1_000_000))
    assert {bundle.source.plan().mode for bundle in bundles} == {INDEXED} and len(bundles) > 3
    size = path.stat().st_size
    limit = max_table_bytes(size, INDEX_INTERVAL_BYTES) if files == "index" else max_table_bytes(size) + 1
    assert asked == [(index_path_for(url, ".index" if files == "index" else ".idx"), limit)]
    assert [record for bundle in bundles for record in read(bundle.source, bundle.start_position,
                                                            bundle.stop_position)] == payloads


@pytest.mark.parametrize("count", [5, 11, 20])
def test_split_at_fraction_exhaustive(tmp_path, count):
    rng = random.Random(count)
    path = tmp_path / "f.tfrecord"
    write_records(path, [rng.randbytes(rng.randint(0, 40)) for _ in range(count)], interval=64)
    source_test_utils.assert_split_at_fraction_exhaustive(file_source(path), perform_multi_threaded_test=False)


def test_split_at_fraction_exhaustive_unindexed_with_split_unindexed(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "f.tfrecord"
    write_records(path, [rng.randbytes(rng.randint(1, 40)) for _ in range(12)], index=False)
    source_test_utils.assert_split_at_fraction_exhaustive(
        file_source(path, split_unindexed=True), perform_multi_threaded_test=False
    )


def test_split_at_fraction_concurrent(tmp_path):
    path = tmp_path / "f.tfrecord"
    write_records(path, [bytes([n]) * 30 for n in range(8)], interval=64)
    source_test_utils.assert_split_at_fraction_exhaustive(file_source(path))


def test_reentrant_reads(small_files):
    for path, _ in small_files.values():
        source_test_utils.assert_reentrant_reads_succeed((file_source(path), None, None))


def test_progress_and_dynamic_split_during_a_read(small_files):
    path, payloads = small_files["fixed"]
    size = os.path.getsize(path)
    source = file_source(path)
    tracker = source.get_range_tracker(0, size)
    records = source.read(tracker)
    fractions = []
    got = []
    for record in records:
        got.append(record)
        fractions.append(tracker.fraction_consumed())
        if len(got) == 10:
            assert tracker.try_split(5 * 66 - 1) is None  # already past it
            split = tracker.try_split(30 * 66 + 5)
            assert split is not None and split[0] == 30 * 66 + 5
    assert got == payloads[:31]  # record 30 starts at 1980 < 1985: it belongs to the primary
    assert fractions == sorted(fractions) and 0 <= fractions[0] < 0.05 and fractions[-1] > 0.95
    assert read(source, 30 * 66 + 5, size) == payloads[31:]


# ---------------------------------------------------------------------------------------------
# a 10 MB indexed file, split everywhere


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    rng = random.Random(2024)
    payloads = mixed_payloads(rng, 1200, 24000)
    path = tmp_path_factory.mktemp("big") / "big.tfrecord"
    starts = write_records(path, payloads)
    size = os.path.getsize(path)
    assert 9_000_000 < size < 12_000_000
    return str(path), payloads, starts, size


def test_big_file_splits_exactly_near_record_boundaries_and_at_random_offsets(big_file):
    path, payloads, starts, size = big_file
    source = file_source(path)
    assert source.plan().mode == INDEXED and len(source.plan().index.offsets) >= 9
    rng = random.Random(5)
    indexed = list(source.plan().index.offsets[1:])
    boundaries = rng.sample(indexed, 8) + rng.sample(starts[1:], 12)
    near = {b + delta for b in boundaries for delta in range(-40, 41)}
    random_offsets = set(rng.sample(range(1, size), 2000))
    assert len(boundaries) == 20 and len(near) > 1500
    # Adjacent ranges [0, c1) [c1, c2) ... [cn, size): each must hold exactly the records starting in it.
    assert_pieces_exact(source, near | random_offsets, payloads, starts, size)
    # And literally [0, x) + [x, size) == whole for a sample of the offsets.
    for x in rng.sample(sorted(near), 6) + rng.sample(sorted(random_offsets), 4):
        assert read(source, 0, x) + read(source, x, size) == payloads


@pytest.mark.parametrize("dynamic_splitting", [False, True])
def test_big_file_read_by_pipelines_in_process_with_real_splits(big_file, dynamic_splitting, monkeypatch):
    path, payloads, _, size = big_file
    digests = [hashlib.sha256(p).hexdigest() for p in payloads]
    # Ranges of 3 MB: the default path cuts the 10 MB file into 4; Beam's Read cuts it into ~3 MB bundles.
    monkeypatch.setattr(source_module, "DEFAULT_DESIRED_BUNDLE_SIZE", 3 << 20)
    assert len(list(TFRecordSource(path).split(beam.io.iobase.Read.get_desired_chunk_size(size)))) >= 3
    transform = ReadFromTFRecord(path, dynamic_splitting=dynamic_splitting)
    result = run_pipeline(
        lambda p: assert_that(p | transform | beam.Map(lambda r: hashlib.sha256(r).hexdigest()), equal_to(digests))
    )
    assert counters(result) == {"records_read": len(payloads), "bytes_read": size}


# ---------------------------------------------------------------------------------------------
# adversarial payloads


def embedded_streams(rng: random.Random, count: int) -> list[bytes]:
    """Payloads that are themselves whole TFRecord streams (e.g. a TFRecord file stored as a record)."""
    return [frame_records([rng.randbytes(rng.randint(0, 12)) for _ in range(rng.randint(1, 4))]) for _ in range(count)]


ADVERSARIAL = {
    "eight_byte": lambda rng: [rng.randbytes(8) for _ in range(150)],
    "all_zero": lambda rng: [bytes(rng.randint(0, 40)) for _ in range(120)],
    "embedded_streams": lambda rng: embedded_streams(rng, 40),
}


@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
def test_adversarial_payloads_with_the_index_split_exactly_at_every_byte(tmp_path, kind):
    payloads = ADVERSARIAL[kind](random.Random(kind))
    path = tmp_path / "adversarial.tfrecord"
    starts = write_records(path, payloads, interval=200)
    size = os.path.getsize(path)
    source = file_source(path)
    assert source.plan().mode == INDEXED
    assert_pieces_exact(source, range(1, size), payloads, starts, size)
    assert_pieces_exact(source, range(3, size, 17), payloads, starts, size)
    for x in range(0, size, 97):
        assert read(source, 0, x) + read(source, x, size) == payloads


@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
def test_without_the_index_files_are_not_split_unless_asked(tmp_path, kind):
    payloads = ADVERSARIAL[kind](random.Random(kind))
    path = tmp_path / "adversarial.tfrecord"
    write_records(path, payloads, index=False)
    source = TFRecordSource(str(path))
    (bundle,) = list(source.split(desired_bundle_size=64))
    assert bundle.source.plan().mode == WHOLE
    assert read(bundle.source) == payloads
    tracker = bundle.source.get_range_tracker(None, None)
    assert list(bundle.source.read(tracker))[:1] == payloads[:1]
    assert tracker.try_split(100) is None  # dynamic splits are refused too
    with pytest.raises(TfrbeamError, match="no current read index"):
        read(bundle.source, 100, None)


@pytest.mark.parametrize("kind", ["eight_byte", "all_zero"])
def test_split_unindexed_scans_exactly_when_payloads_hold_no_framing(tmp_path, kind):
    payloads = ADVERSARIAL[kind](random.Random(kind))
    path = tmp_path / "adversarial.tfrecord"
    starts = write_records(path, payloads, index=False)
    size = os.path.getsize(path)
    source = file_source(path, split_unindexed=True)
    assert source.plan().mode == SCAN
    assert len(list(TFRecordSource(str(path), split_unindexed=True).split(desired_bundle_size=64))) > 10
    assert_pieces_exact(source, range(1, size, 3), payloads, starts, size)


def test_split_unindexed_documented_failure_on_embedded_streams(tmp_path):
    """The one known failure: a range boundary inside a payload that embeds TFRecord framing."""
    rng = random.Random(11)
    payloads = embedded_streams(rng, 6)
    path = tmp_path / "embedded.tfrecord"
    starts = write_records(path, payloads, index=False)
    size = os.path.getsize(path)
    x = starts[2] + 1  # inside record 2's header: the scan finds record 2's first embedded record
    inner = source_records_of(payloads[2])
    strict = file_source(path, split_unindexed=True)
    got = []
    with pytest.raises(CorruptRecordError, match=f"offset {starts[3] - 4}"):
        for record in strict.read(strict.get_range_tracker(x, size)):
            got.append(record)
    assert got == inner  # embedded records were read as if they were records of the file
    lenient = file_source(path, split_unindexed=True, skip_corrupt=True)
    union = read(lenient, 0, x) + read(lenient, x, size)
    assert union != payloads and union == payloads[:3] + inner + payloads[3:]
    # The read index removes the failure: the same split with an index is exact.
    write_records(path, payloads)
    indexed = file_source(path, split_unindexed=True)
    assert indexed.plan().mode == INDEXED
    assert read(indexed, 0, x) + read(indexed, x, size) == payloads


def source_records_of(stream: bytes) -> list[bytes]:
    return list(read_records(io.BytesIO(stream), None))


# ---------------------------------------------------------------------------------------------
# stale, garbage and lying indexes


def test_stale_or_garbage_index_is_ignored_and_logged(tmp_path, caplog):
    payloads = [bytes([n]) * 100 for n in range(50)]
    path = tmp_path / "f.tfrecord"
    write_records(path, payloads, interval=128)
    assert file_source(path).plan().mode == INDEXED
    with caplog.at_level(logging.WARNING):
        stat = os.stat(path)
        os.utime(path, (stat.st_atime, stat.st_mtime + 10))  # same size, new mtime
        assert file_source(path).plan().mode == WHOLE
        assert "stale" in caplog.text
        caplog.clear()
        write_records(path, payloads + [b"one more"], index=False)  # new size, old index left behind
        source = TFRecordSource(str(path))
        (bundle,) = list(source.split(desired_bundle_size=100))
        assert read(bundle.source) == payloads + [b"one more"]
        assert "stale" in caplog.text
        caplog.clear()
        write_index(path, b"\x00garbage" * 9)
        assert file_source(path).plan().mode == WHOLE
        assert "not a valid tfrbeam read index" in caplog.text
        caplog.clear()
        assert file_source(path, split_unindexed=True).plan().mode == SCAN


def test_damage_the_index_walk_crosses_raises_or_is_skipped_consistently(tmp_path):
    payloads = [bytes([n]) * (20 + n) for n in range(60)]
    path = tmp_path / "f.tfrecord"
    starts = write_records(path, payloads, interval=1000)
    victim = 30
    with open(path, "r+b") as handle:  # flip a bit in record 30's length CRC, keeping size and mtime
        stat = os.stat(path)
        handle.seek(starts[victim] + 9)
        byte = handle.read(1)
        handle.seek(starts[victim] + 9)
        handle.write(bytes([byte[0] ^ 4]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    size = os.path.getsize(path)
    strict = file_source(path)
    assert strict.plan().mode == INDEXED
    after = starts[victim] + 3
    with pytest.raises(CorruptRecordError, match=f"{path}: length CRC mismatch .* at offset {starts[victim]}"):
        read(strict, after, size)
    lenient = file_source(path, skip_corrupt=True)
    whole = read(lenient)
    assert whole == payloads[:victim] + payloads[victim + 1:]
    for x in range(starts[victim - 1] - 5, starts[victim + 2] + 5):
        assert read(lenient, 0, x) + read(lenient, x, size) == whole, x


def test_a_header_the_index_walk_crosses_is_judged_as_the_record_reader_judges_it(tmp_path):
    """Record 58's header is sound but claims a length that leaves its footer cut off by the end of the file: a range
    whose walk crosses it raises the very error (type, check, offset, words) of a reader of the whole file."""
    payloads = [bytes([n]) * (20 + n) for n in range(60)]
    path = tmp_path / "f.tfrecord"
    starts = write_records(path, payloads, interval=1000)
    stat, size = os.stat(path), os.path.getsize(path)
    with open(path, "r+b") as handle:  # same size and mtime: the index stays current
        handle.seek(starts[58])
        handle.write(frame_records([bytes(size - starts[58] - 14)])[:12])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(TruncatedRecordError) as whole:
        list(read_records(str(path), None))
    source = file_source(path)
    assert source.plan().mode == INDEXED
    with pytest.raises(TruncatedRecordError) as walked:
        read(source, starts[58] + 3, size)
    assert (walked.value.check, walked.value.offset) == ("truncated_footer", starts[58])
    assert (type(walked.value), str(walked.value)) == (type(whole.value), str(whole.value))


# ---------------------------------------------------------------------------------------------
# compression


def test_compressed_files_are_read_whole_and_never_split(tmp_path):
    payloads = [bytes([n]) * 500 for n in range(100)]
    for compression, name in (("gzip", "f.tfrecord.gz"), ("zlib", "f.tfrecord.zlib"), ("zlib", "f.deflate")):
        path = tmp_path / name
        write_records(path, payloads, compression=compression, index=False)
        (bundle,) = list(TFRecordSource(str(path)).split(desired_bundle_size=10))
        assert bundle.stop_position == float("inf")
        tracker = bundle.source.get_range_tracker(None, None)
        records = bundle.source.read(tracker)
        assert next(records) == payloads[0]
        assert tracker.try_split(1000) is None
        assert [payloads[0], *records] == payloads


def test_truncated_compressed_file_raises_instead_of_losing_records(tmp_path):
    path = tmp_path / "f.tfrecord.gz"
    write_records(path, [bytes([n]) * 1000 for n in range(50)], compression="gzip", index=False)
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # the gzip trailer is gone; Beam's reader returns every record silently
    with pytest.raises(TruncatedRecordError, match="compressed stream ends early"):
        read(file_source(path))


def test_compression_arguments(tmp_path):
    payloads = [b"a", b"bc"]
    plain = tmp_path / "noext"
    write_records(plain, payloads, compression="gzip", index=False)
    assert read(file_source(plain, compression="gzip")) == payloads
    assert read(file_source(plain, compression_type=CompressionTypes.GZIP, compression="gzip")) == payloads
    with pytest.raises(ConfigError, match="disagree"):
        TFRecordSource(str(plain), compression_type=CompressionTypes.GZIP, compression="zlib")
    for refused in ("bzip2", "zstd", "snappy", "lz4"):
        with pytest.raises(UnsupportedCompressionError):
            ReadFromTFRecord(str(plain), compression=refused)
    bz2 = tmp_path / "data.tfrecord.bz2"
    bz2.write_bytes(b"BZh9")
    with pytest.raises(UnsupportedCompressionError, match="BZIP2"):
        ReadFromTFRecord(str(tmp_path / "*.bz2"))
    with pytest.raises(UnsupportedCompressionError, match=r"data\.tfrecord\.bz2"):
        list(TFRecordSource(str(tmp_path / "data.*"), validate=False).split(100))
    zlib_named = tmp_path / "f.tfrecord.zlib"
    write_records(zlib_named, payloads, compression="zlib", index=False)
    assert read(file_source(zlib_named)) == payloads  # auto: .zlib is zlib (Beam's AUTO would say uncompressed)


def test_validate_refuses_a_pattern_that_matches_nothing_before_the_pipeline_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no files match"):
        ReadFromTFRecord(str(tmp_path / "nothing-*"))
    transform = ReadFromTFRecord(str(tmp_path / "nothing-*"), validate=False)
    run_pipeline(lambda p: assert_that(p | transform, equal_to([])))


# ---------------------------------------------------------------------------------------------
# TensorFlow-written vectors


VALID_VECTORS = {
    "raw.tfrecord": "expected.json",
    "raw.tfrecord.gz": "expected.json",
    "raw.tfrecord.zlib": "expected.json",
    "examples.tfrecord": "examples.json",
    "examples.tfrecord.gz": "examples.json",
    "examples_wire.tfrecord": "examples_wire.json",
    "sequence_examples.tfrecord": "sequence_examples.json",
}


def expected_digests(tf_vectors, json_name: str) -> list[str]:
    data = json.loads((tf_vectors / json_name).read_text())
    records = data.get("records") or data.get("examples") or data.get("sequence_examples")
    return [record.get("sha256") or record["record_sha256"] for record in sorted(records, key=lambda r: r["index"])]


def test_every_valid_tensorflow_vector_reads_through_a_pipeline(tf_vectors):
    expected = [
        (name, digest) for name, json_name in VALID_VECTORS.items() for digest in expected_digests(tf_vectors, json_name)
    ]

    def build(pipeline):
        reads = [
            pipeline | f"Read {name}" >> ReadFromTFRecord(str(tf_vectors / name), with_filename=True)
            for name in VALID_VECTORS
        ]
        digests = reads | beam.Flatten() | beam.MapTuple(lambda path, r: (os.path.basename(path), hashlib.sha256(r).hexdigest()))
        assert_that(digests, equal_to(expected))

    run_pipeline(build)
    for name, json_name in VALID_VECTORS.items():  # and in order, read directly
        assert [hashlib.sha256(r).hexdigest() for r in read(file_source(tf_vectors / name))] == expected_digests(
            tf_vectors, json_name
        )


CORRUPT_VECTORS = {
    "corrupt_a_data_crc_bitflip.tfrecord": (CorruptRecordError, "offset 164"),
    "corrupt_b_length_crc_bitflip.tfrecord": (CorruptRecordError, "offset 164"),
    "corrupt_c_payload_bitflip.tfrecord": (CorruptRecordError, "offset 164"),
    "corrupt_d_trunc_in_last_header.tfrecord": (TruncatedRecordError, "offset 1078023"),
    "corrupt_e_trunc_in_last_payload.tfrecord": (TruncatedRecordError, "offset 1078023"),
    "corrupt_f_trunc_in_last_data_crc.tfrecord": (TruncatedRecordError, "offset 1078023"),
    "corrupt_g_gzip_truncated.tfrecord.gz": (TruncatedRecordError, "decompressed offset 1243"),
}


@pytest.mark.parametrize(
    "name, dynamic_splitting",
    [(name, False) for name in sorted(CORRUPT_VECTORS)] + [("corrupt_a_data_crc_bitflip.tfrecord", True)],
)
def test_every_corrupt_vector_fails_a_pipeline_with_our_error(tf_vectors, name, dynamic_splitting):
    error_type, where = CORRUPT_VECTORS[name]
    path = str(tf_vectors / name)
    with pytest.raises(RecordError) as info:
        run_pipeline(lambda p: p | ReadFromTFRecord(path, dynamic_splitting=dynamic_splitting))
    assert type(info.value) is error_type
    assert path in str(info.value) and where in str(info.value)
    assert info.value.path == path and str(info.value.offset) in where


def test_skip_corrupt_reads_the_rest_and_counts_the_skips(tf_vectors):
    flat, oracle_skips = corrupt_vectors_oracle(tf_vectors)  # from the files' own framing
    reference = expected_digests(tf_vectors, "examples.json")  # what TensorFlow wrote
    assert {name for name, _ in flat} == set(CORRUPT_VECTORS)
    assert all(digest in reference for _, digest in flat)

    def build(pipeline):
        digests = (
            pipeline
            | beam.Create([str(tf_vectors / "corrupt_*")])
            | ReadAllFromTFRecord(with_filename=True, skip_corrupt=True)
            | beam.MapTuple(lambda path, r: (os.path.basename(path), hashlib.sha256(r).hexdigest()))
        )
        assert_that(digests, equal_to(flat))

    totals = counters(run_pipeline(build))
    # One skip per run of damaged records; the cut gzip file counts two: the broken stream and the partial record.
    assert totals["corrupt_records_skipped"] == oracle_skips
    assert totals["records_read"] == len(flat)


# ---------------------------------------------------------------------------------------------
# ReadAllFromTFRecord splitting and the multi-processing runner


def test_read_all_splits_large_indexed_files_into_ranges(tmp_path):
    rng = random.Random(1)
    payloads = mixed_payloads(rng, 300, 2000)
    indexed, unindexed = tmp_path / "indexed.tfrecord", tmp_path / "unindexed.tfrecord"
    write_records(indexed, payloads, interval=4096)
    write_records(unindexed, payloads, index=False)
    expand = _ExpandIntoRanges(ReadOptions(), desired_bundle_size=20_000)
    ranges = list(expand.process(str(indexed)))
    assert len(ranges) == -(-os.path.getsize(indexed) // 20_000)
    assert all(plan.mode == INDEXED for plan, _, _ in ranges)
    assert [(plan.mode, start) for plan, start, _ in expand.process(str(unindexed))] == [(WHOLE, 0)]
    result = run_pipeline(
        lambda p: assert_that(
            p | beam.Create([str(tmp_path / "*.tfrecord")]) | ReadAllFromTFRecord(desired_bundle_size=20_000),
            equal_to(payloads * 2),
        )
    )
    assert counters(result)["records_read"] == 600


def test_multi_processing_runner_reads_split_indexed_and_compressed_files(tmp_path):
    rng = random.Random(9)
    payloads = mixed_payloads(rng, 400, 20000)
    write_records(tmp_path / "a.tfrecord", payloads)
    write_records(tmp_path / "b.tfrecord.gz", payloads[:50], compression="gzip", index=False)
    assert len(list(TFRecordSource(str(tmp_path / "a.tfrecord")).split(1 << 20))) >= 3
    digests = [hashlib.sha256(p).hexdigest() for p in payloads + payloads[:50]]
    run_pipeline(
        lambda p: assert_that(
            p | ReadFromTFRecord(str(tmp_path / "*.tfrecord*")) | beam.Map(lambda r: hashlib.sha256(r).hexdigest()),
            equal_to(digests),
        ),
        "--direct_num_workers=2", "--direct_running_mode=multi_processing",
    )


def test_multi_processing_runner_reports_our_error_with_file_and_offset(tf_vectors):
    """Across Beam's worker boundary the error arrives as text: it still names our type, the file and the offset."""
    path = str(tf_vectors / "corrupt_b_length_crc_bitflip.tfrecord")
    with pytest.raises(Exception) as info:
        run_pipeline(lambda p: p | ReadFromTFRecord(path), "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    message = str(info.value)
    assert "CorruptRecordError" in message and f"{path}: length CRC mismatch" in message and "offset 164" in message


# ---------------------------------------------------------------------------------------------
# ReadExamples


EXAMPLE_SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32())), ("s", pa.binary())])


def example_table(count: int) -> pa.RecordBatch:
    rng = random.Random(count)
    return pa.record_batch(
        [
            pa.array(range(count), pa.int64()),
            pa.array([[rng.random() for _ in range(n % 4)] for n in range(count)], pa.list_(pa.float32())),
            pa.array([rng.randbytes(n % 50) for n in range(count)], pa.binary()),
        ],
        schema=EXAMPLE_SCHEMA,
    )


def test_read_examples_record_batches_split_anywhere_give_the_exact_table(tmp_path):
    table = example_table(1500)
    path = tmp_path / "examples.tfrecord"
    write_records(path, record_batch_to_examples(table), interval=4096)
    size = os.path.getsize(path)
    source = DecodedBatchSource(str(path), DecodeToRecordBatches(EXAMPLE_SCHEMA), 97)
    for desired in (size, 10_000, 777):
        bundles = list(source.split(desired_bundle_size=desired))
        batches = [b for bundle in bundles for b in read(bundle.source, bundle.start_position, bundle.stop_position)]
        assert all(0 < b.num_rows <= 97 and b.schema == EXAMPLE_SCHEMA for b in batches)
        assert pa.Table.from_batches(batches).equals(pa.Table.from_batches([table])), desired
    # A batch is claimed whole: a dynamic split lands between batches, and the two parts are exact.
    (bundle,) = list(source.split(desired_bundle_size=size))
    tracker = bundle.source.get_range_tracker(0, size)
    reading = bundle.source.read(tracker)
    first = next(reading)
    split = tracker.try_split(size // 2)
    assert split is not None
    rest = list(reading)
    residual = read(bundle.source, size // 2, size)
    assert pa.Table.from_batches([first, *rest, *residual]).equals(pa.Table.from_batches([table]))


def test_read_examples_pipelines_give_record_batches_and_dicts(tmp_path, tf_vectors):
    table = example_table(700)
    path = tmp_path / "examples.tfrecord"
    write_records(path, record_batch_to_examples(table))
    vectors = str(tf_vectors / "examples.tfrecord")
    expected_dicts = [repr(decode_example(record)) for record in read_records(vectors)]
    expected_rows = [tuple(row.values()) for row in table.to_pylist()]

    def build(pipeline):
        batches = pipeline | "Batches" >> ReadExamples(str(path), output="record_batches", batch_size=64, schema=EXAMPLE_SCHEMA)
        assert_that(batches | beam.Map(lambda b: b.num_rows <= 64), equal_to([True] * 11), label="BatchSizes")
        rows = batches | beam.FlatMap(lambda b: [tuple(row.values()) for row in b.to_pylist()])
        assert_that(rows, equal_to(expected_rows), label="Rows")
        inferred = pipeline | "Inferred" >> ReadExamples(str(path), output="record_batches")
        assert_that(inferred | beam.Map(lambda b: b.equals(examples_to_record_batch(record_batch_to_examples(table)))),
                    equal_to([True]), label="Inferred")
        dicts = pipeline | "Dicts" >> ReadExamples(vectors)
        assert_that(dicts | beam.Map(repr), equal_to(expected_dicts), label="Dicts")

    run_pipeline(build)


def test_read_examples_names_the_file_and_offset_of_a_malformed_example(tmp_path):
    good = record_batch_to_examples(example_table(3))
    path = tmp_path / "bad.tfrecord"
    starts = write_records(path, [good[0], good[1], b"\x0a\x05\x0a\x03", good[2]])
    for decoder in (DecodeToRecordBatches(), DecodeToRecordBatches(EXAMPLE_SCHEMA)):
        source = DecodedBatchSource(str(path), decoder, 10)
        with pytest.raises(ExampleDecodeError, match=f"{path}: the record at offset {starts[2]}: "):
            read(file_source_of(source))
    with pytest.raises(ExampleDecodeError, match=f"{path}: the record at offset {starts[2]}: "):
        run_pipeline(lambda p: p | ReadExamples(str(path)))


def test_dict_decoder_matches_decode_example_and_falls_back_on_mixed_kinds(tf_vectors):
    for name in ("examples.tfrecord", "examples_wire.tfrecord"):
        records = list(read_records(str(tf_vectors / name)))
        decoded = list(DecodeToDicts()(name, RecordBlock.from_payloads(records, range(len(records)))))
        assert repr(decoded) == repr([decode_example(record) for record in records])  # repr: NaN != NaN
    mixed = [encode_example({"a": [1], "b": [b"x"]}), encode_example({"a": [1.5]})]  # "a": int64, then float
    assert list(DecodeToDicts()("f", RecordBlock.from_payloads(mixed, [0, 20]))) == [{"a": [1], "b": [b"x"]}, {"a": [1.5]}]


def file_source_of(source):
    (bundle,) = list(source.split(float("inf")))
    return bundle.source


def test_read_examples_refuses_bad_arguments(tmp_path):
    path = tmp_path / "x.tfrecord"
    write_records(path, [b""])
    with pytest.raises(ConfigError, match="output"):
        ReadExamples(str(path), output="tensors")
    with pytest.raises(ConfigError, match="batch_size"):
        ReadExamples(str(path), output="record_batches", batch_size=0)
    with pytest.raises(ConfigError, match="schema"):
        ReadExamples(str(path), output="dicts", schema=EXAMPLE_SCHEMA)
    with pytest.raises(UnsupportedCompressionError):
        ReadExamples(str(path), compression="bzip2")
    with pytest.raises(FileNotFoundError):
        ReadExamples(str(tmp_path / "missing-*"))
