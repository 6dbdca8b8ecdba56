"""Beam's own read tests from apache_beam/io/tfrecordio_test.py, run against tfrbeam's transforms.

The module's ``ReadFromTFRecord`` and ``ReadAllFromTFRecord`` names are patched with tfrbeam's, so
Beam's test bodies run unchanged: switching is a change of import. Every test of
``TestReadFromTFRecord`` and ``TestReadAllFromTFRecord`` runs; none is left out. That includes
the two ``test_process_deflate`` tests: Beam's DEFLATE is a zlib-wrapped stream (what TensorFlow
calls ZLIB), so tfrbeam reads it. The codecs tfrbeam refuses on purpose (BZIP2, ZSTD, LZMA) have
no read test in Beam's module; their refusal is tested below and in tests/test_beam_source.py.
"""

from __future__ import annotations

import apache_beam.io.tfrecordio_test as beam_tests
import pytest
from apache_beam.io.filesystem import CompressionTypes

from tfrbeam.beam import ReadAllFromTFRecord, ReadFromTFRecord, source as tfrbeam_source
from tfrbeam.errors import UnsupportedCompressionError


@pytest.fixture(autouse=True)
def _tfrbeam_transforms(monkeypatch):
    monkeypatch.setattr(beam_tests, "ReadFromTFRecord", ReadFromTFRecord)
    monkeypatch.setattr(beam_tests, "ReadAllFromTFRecord", ReadAllFromTFRecord)


class TestReadFromTFRecordWithTfrbeam(beam_tests.TestReadFromTFRecord):
    """Beam's TestReadFromTFRecord: single/multiple records, DEFLATE, GZIP with and without coder, AUTO."""


class TestReadAllFromTFRecordWithTfrbeam(beam_tests.TestReadAllFromTFRecord):
    """Beam's TestReadAllFromTFRecord: patterns, globs, an empty file, with_filename, DEFLATE, GZIP, AUTO."""


def test_the_patched_names_are_ours():
    """Guards the patching itself: Beam's test bodies must resolve to tfrbeam's classes."""
    assert beam_tests.ReadFromTFRecord is tfrbeam_source.ReadFromTFRecord
    assert beam_tests.ReadAllFromTFRecord is tfrbeam_source.ReadAllFromTFRecord


def test_beam_test_classes_are_collected_in_full():
    """No Beam read test is silently dropped: every test_* method of both classes runs here."""
    for ours, theirs in (
        (TestReadFromTFRecordWithTfrbeam, beam_tests.TestReadFromTFRecord),
        (TestReadAllFromTFRecordWithTfrbeam, beam_tests.TestReadAllFromTFRecord),
    ):
        names = {name for name in dir(theirs) if name.startswith("test_")}
        assert names and all(callable(getattr(ours, name)) for name in names)
    assert len([n for n in dir(beam_tests.TestReadFromTFRecord) if n.startswith("test_")]) == 7
    assert len([n for n in dir(beam_tests.TestReadAllFromTFRecord) if n.startswith("test_")]) == 9


@pytest.mark.parametrize("codec", [CompressionTypes.BZIP2, CompressionTypes.ZSTD, CompressionTypes.LZMA])
def test_codecs_tensorflow_cannot_read_are_refused_where_beam_accepts_them(codec, tmp_path):
    """The intended difference: Beam's transforms accept these codecs, ours refuse them at construction."""
    from apache_beam.io import tfrecordio

    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"")
    tfrecordio.ReadFromTFRecord(str(path), compression_type=codec)
    tfrecordio.ReadAllFromTFRecord(compression_type=codec)
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow reads TFRecord files only"):
        ReadFromTFRecord(str(path), compression_type=codec)
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow reads TFRecord files only"):
        ReadAllFromTFRecord(compression_type=codec)
