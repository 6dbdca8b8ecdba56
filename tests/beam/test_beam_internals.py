"""The private Beam APIs tfrbeam/beam/source.py relies on still exist in the installed Beam, with the meaning it assumes."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.io.filebasedsource import FileBasedSource
from apache_beam.io.range_trackers import OffsetRangeTracker

from tfrbeam.beam.source import TFRecordSource, _RecordRangeTracker
from tfrbeam.tfrecord.records import RecordWriter


def test_offset_range_tracker_fields_are_the_ones_the_block_claim_updates():
    tracker = OffsetRangeTracker(0, 100)
    for name in ("_lock", "_stop_offset", "_last_attempted_record_start", "_offset_of_last_split_point",
                 "_last_record_start", "_split_points_seen"):
        assert hasattr(tracker, name), name
    ours = _RecordRangeTracker(0, 100, lambda: True)
    assert ours.try_claim_prefix([0, 10, 20, 150]) == 3
    assert ours.last_record_start == 20 and ours.split_points()[0] == 2
    assert ours.try_split(50) is not None  # Beam's own split logic still reads the fields we wrote


def test_file_based_source_private_hooks_exist_and_ours_are_used(tmp_path):
    assert callable(FileBasedSource._validate) and callable(FileBasedSource._get_concat_source)
    with pytest.raises(FileNotFoundError, match="pass validate=False"):
        TFRecordSource(str(tmp_path / "missing-*"))
    with RecordWriter(str(tmp_path / "a.tfrecord")) as writer:
        writer.write_many([b"x", b"y"])
    source = TFRecordSource(str(tmp_path / "a.tfrecord"))
    assert hasattr(source, "_concat_source")
    assert len(source._get_concat_source().sources) == 1


def test_tagged_with_step_lets_our_error_reach_the_caller_as_is(tmp_path):
    from tfrbeam.beam.source import ReadFromTFRecord
    from tfrbeam.errors import CorruptRecordError

    path = tmp_path / "bad.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([b"x" * 100, b"y" * 100])
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first payload: its data CRC fails
    path.write_bytes(bytes(data))
    pipeline = beam.Pipeline()
    _ = pipeline | ReadFromTFRecord(str(path))
    with pytest.raises(CorruptRecordError, match=r"bad\.tfrecord"):  # our type, not a RuntimeError rebuilt from text
        pipeline.run().wait_until_finish()
