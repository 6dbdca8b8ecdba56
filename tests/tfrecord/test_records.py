"""TFRecord framing: TensorFlow's vectors, corruption and truncation rules, and framing properties."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import subprocess
import sys
import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.errors import CorruptRecordError, RecordTooLargeError, TruncatedRecordError, UnsupportedCompressionError
from tfrbeam.tfrecord.records import (
    RecordReader,
    RecordWriter,
    find_record_start,
    frame_buffer,
    frame_record,
    frame_records,
    masked_crc32c,
    read_records,
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ShortReads(io.RawIOBase):
    """A file object that returns at most a few bytes per read call, cycling through ``sizes``."""

    def __init__(self, data: bytes, sizes: list[int]):
        self._data = data
        self._pos = 0
        self._sizes = sizes
        self._calls = 0
        self.name = "short-reads"

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        limit = self._sizes[self._calls % len(self._sizes)]
        self._calls += 1
        if size is None or size < 0:
            size = len(self._data)
        chunk = self._data[self._pos:self._pos + min(size, limit)]
        self._pos += len(chunk)
        return chunk


def _encode(payloads: list[bytes], compression: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with RecordWriter(buffer, compression) as writer:
        for payload in payloads:
            writer.write(payload)
    return buffer.getvalue()


def _read(data: bytes, compression: str | None = None, **kwargs) -> list[bytes]:
    return list(read_records(io.BytesIO(data), compression, **kwargs))


# --- TensorFlow's vectors -------------------------------------------------------------------


def test_crc_vectors_match_tensorflow(tf_vectors):
    vectors = json.loads((tf_vectors / "crc.json").read_text())["vectors"]
    assert len(vectors) == 7
    for vector in vectors:
        data = bytes.fromhex(vector["data_hex"])
        assert masked_crc32c(data) == int(vector["masked_crc32c"], 16), vector["name"]
        length_field = bytes.fromhex(vector["length_field_hex"])
        assert masked_crc32c(length_field) == int(vector["length_masked_crc32c"], 16), vector["name"]
        assert frame_record(data).hex() == vector["tfrecord_hex"], vector["name"]


@pytest.mark.parametrize("name, compression",
                         [("raw.tfrecord", None), ("raw.tfrecord.gz", "gzip"), ("raw.tfrecord.zlib", "zlib")])
def test_reads_tensorflow_raw_files_and_writes_them_back_byte_for_byte(tf_vectors, name, compression):
    expected = json.loads((tf_vectors / "expected.json").read_text())
    path = tf_vectors / name
    payloads = list(read_records(str(path)))  # compression picked by extension
    assert [len(p) for p in payloads] == [r["length"] for r in expected["records"]]
    assert [_sha(p) for p in payloads] == [r["sha256"] for r in expected["records"]]
    assert [p[:16].hex() for p in payloads] == [r["first16_hex"] for r in expected["records"]]
    assert _encode(payloads, compression) == path.read_bytes()


def test_record_offsets_and_crcs_match_tensorflow(tf_vectors):
    expected = json.loads((tf_vectors / "expected.json").read_text())["records"]
    with RecordReader(str(tf_vectors / "raw.tfrecord")) as reader:
        offsets = [offset for offset, _ in reader.records_with_offsets()]
    assert offsets == [r["offset_in_raw_tfrecord"] for r in expected]
    data = (tf_vectors / "raw.tfrecord").read_bytes()
    for record in expected:
        start = record["offset_in_raw_tfrecord"] + 12
        framed = frame_record(data[start:start + record["length"]])
        assert int.from_bytes(framed[8:12], "little") == _as_int(record["length_masked_crc"])
        assert int.from_bytes(framed[-4:], "little") == _as_int(record["data_masked_crc"])


def _as_int(value: int | str) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)


def test_examples_files_match_and_gzip_output_is_tensorflows(tf_vectors):
    examples = json.loads((tf_vectors / "examples.json").read_text())["examples"]
    plain = list(read_records(str(tf_vectors / "examples.tfrecord")))
    gzipped = list(read_records(str(tf_vectors / "examples.tfrecord.gz")))
    assert [_sha(p) for p in plain] == [e["record_sha256"] for e in examples]
    assert gzipped == plain
    assert _encode(plain, "gzip") == (tf_vectors / "examples.tfrecord.gz").read_bytes()
    assert _encode(plain) == (tf_vectors / "examples.tfrecord").read_bytes()


# --- the corrupted files TensorFlow was run on ----------------------------------------------

CORRUPT_CASES = {
    # case: (error type, check, record offset we report, records before the error)
    "a": (CorruptRecordError, "data_crc", 164, 3),
    "b": (CorruptRecordError, "length_crc", 164, 3),
    "c": (CorruptRecordError, "data_crc", 164, 3),
    "d": (TruncatedRecordError, "truncated_header", 1078023, 19),
    "e": (TruncatedRecordError, "truncated_payload", 1078023, 19),
    "f": (TruncatedRecordError, "truncated_footer", 1078023, 19),
    "g": (TruncatedRecordError, "truncated_stream", 1243, 11),
}


def _corrupt_cases(tf_vectors) -> dict[str, dict]:
    return {case["case"]: case for case in json.loads((tf_vectors / "corrupt.json").read_text())["cases"]}


@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_every_corrupted_file_raises_our_documented_error(tf_vectors, case):
    info = _corrupt_cases(tf_vectors)[case]
    error_type, check, offset, good = CORRUPT_CASES[case]
    path = str(tf_vectors / info["file"])
    seen = []
    with pytest.raises(error_type) as raised:
        for payload in read_records(path):
            seen.append(payload)
    error = raised.value
    assert (error.path, error.check, error.offset) == (path, check, offset)
    assert path in str(error) and str(offset) in str(error)
    # We stop exactly where TensorFlow stops (TF yields the same first records, then errs or ends).
    assert len(seen) == good == info["tf_TFRecordDataset"]["records_yielded"]
    original = list(read_records(str(tf_vectors / "examples.tfrecord")))
    assert seen == original[:good]


def test_tf_compatible_eof_accepts_exactly_what_tensorflow_accepts(tf_vectors):
    cases = _corrupt_cases(tf_vectors)
    for case in "abcdef":
        path = str(tf_vectors / cases[case]["file"])
        tf_raised = cases[case]["tf_TFRecordDataset"]["exception"] is not None
        yielded = []
        try:
            for payload in read_records(path, tf_compatible_eof=True):
                yielded.append(payload)
        except (CorruptRecordError, TruncatedRecordError):
            assert tf_raised, case
        else:
            assert not tf_raised, case
        assert len(yielded) == cases[case]["tf_TFRecordDataset"]["records_yielded"], case


def test_truncation_sweep_strict_and_tf_compatible(tf_vectors, tmp_path):
    sweep = json.loads((tf_vectors / "corrupt.json").read_text())["truncation_sweep"]
    originals = {name: (tf_vectors / name).read_bytes() for name in ("examples.tfrecord", "examples.tfrecord.gz")}
    last_offset = sweep["last_record_offset"]
    assert len(sweep["cuts"]) == 23
    for cut in sweep["cuts"]:
        data = originals[cut["file"]][:cut["truncate_to"]]
        compressed = cut["compression_type"] == "GZIP"
        tf_yielded, tf_error = cut["tf"]["records_yielded"], cut["tf"]["exception"]
        at_boundary = not compressed and cut["truncate_to"] == last_offset
        if at_boundary:
            assert len(_read(data)) == 19 and tf_error is None
            continue
        with pytest.raises(TruncatedRecordError) as raised:
            _read(data, "gzip" if compressed else None)
        if compressed:
            # TF accepts a gzip file whose CRC32/ISIZE trailer is missing; we never do.
            assert raised.value.check == "truncated_stream" and tf_error is None and tf_yielded == 20
            continue
        assert raised.value.offset == last_offset
        kept = []
        try:
            for payload in read_records(io.BytesIO(data), None, tf_compatible_eof=True):
                kept.append(payload)
        except TruncatedRecordError:
            assert tf_error is not None, cut["cut"]
        else:
            assert tf_error is None, cut["cut"]
        assert len(kept) == tf_yielded, cut["cut"]


@pytest.mark.parametrize("case, kept", [("a", 19), ("b", 19), ("c", 19), ("d", 19), ("e", 19), ("f", 19)])
def test_skip_corrupt_skips_only_the_bad_record_and_reports_it(tf_vectors, case, kept, caplog):
    info = _corrupt_cases(tf_vectors)[case]
    original = list(read_records(str(tf_vectors / "examples.tfrecord")))
    reported = []
    with caplog.at_level(logging.WARNING, logger="tfrbeam.tfrecord.records"):
        payloads = list(read_records(str(tf_vectors / info["file"]), skip_corrupt=True, on_skip=reported.append))
    bad = 3 if case in "abc" else 19
    assert payloads == original[:bad] + original[bad + 1:]
    assert len(payloads) == kept
    assert len(reported) == 1
    region = reported[0]
    assert region.offset == CORRUPT_CASES[case][2] and region.reason == CORRUPT_CASES[case][1]
    if case in "abc":
        assert region.length == 147 + 16
    assert info["file"] in caplog.text and str(region.offset) in caplog.text


def test_skip_corrupt_on_a_truncated_gzip_keeps_what_precedes_and_reports_the_loss(tf_vectors):
    reader = RecordReader(str(tf_vectors / "corrupt_g_gzip_truncated.tfrecord.gz"), skip_corrupt=True)
    payloads = list(reader)
    original = list(read_records(str(tf_vectors / "examples.tfrecord")))
    assert payloads == original[:11]
    assert {region.reason for region in reader.stats.skipped} == {"truncated_stream", "truncated_payload"}


# --- framing properties ---------------------------------------------------------------------

payload_lists = st.lists(
    st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\x00" * 8, b"\xff" * 8]), st.binary(min_size=8, max_size=8)),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(payloads=payload_lists, compression=st.sampled_from([None, "gzip", "zlib"]))
def test_round_trip(payloads, compression):
    data = _encode(payloads, compression)
    assert _read(data, compression) == payloads
    if compression == "gzip":
        assert gzip.decompress(data) == frame_records(payloads)
    elif compression == "zlib":
        assert zlib.decompress(data) == frame_records(payloads)


@settings(max_examples=100, deadline=None)
@given(payloads=payload_lists, sizes=st.lists(st.integers(1, 20), min_size=1, max_size=5),
       compression=st.sampled_from([None, "gzip", "zlib"]))
def test_short_reads_never_change_the_result(payloads, sizes, compression):
    data = _encode(payloads, compression)
    assert list(read_records(ShortReads(data, sizes), compression)) == payloads


def test_short_reads_of_a_five_megabyte_record():
    big = hashlib.sha256(b"seed").digest() * (5 * 1024 * 1024 // 32)
    payloads = [b"a", big, b"", big[:1000]]
    for compression in (None, "gzip"):
        data = _encode(payloads, compression)
        assert list(read_records(ShortReads(data, [1, 7, 20, 3]), compression)) == payloads


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(st.binary(max_size=24), min_size=1, max_size=5), data=st.data())
def test_any_single_flipped_byte_is_detected(payloads, data):
    framed = bytearray(frame_records(payloads))
    position = data.draw(st.integers(0, len(framed) - 1))
    framed[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises((CorruptRecordError, TruncatedRecordError)):
        _read(bytes(framed))


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=20), min_size=1, max_size=5))
def test_cutting_at_every_byte_ends_cleanly_only_at_record_boundaries(payloads):
    framed = frame_records(payloads)
    boundaries = {0}
    for payload in payloads:
        boundaries.add(max(boundaries) + 16 + len(payload))
    record_starts = sorted(boundaries)
    for cut in range(len(framed) + 1):
        data = framed[:cut]
        if cut in boundaries:
            assert _read(data) == payloads[:record_starts.index(cut)]
            continue
        start = max(b for b in boundaries if b < cut)
        with pytest.raises(TruncatedRecordError) as raised:
            _read(data)
        into = cut - start
        payload_end = 12 + len(payloads[record_starts.index(start)])
        expected_check = "truncated_header" if into < 12 else ("truncated_footer" if into >= payload_end else "truncated_payload")
        assert (raised.value.offset, raised.value.check) == (start, expected_check)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=30), min_size=2, max_size=6),
    garbage=st.binary(min_size=1, max_size=40),
    where=st.integers(0, 5),
)
def test_skip_corrupt_resynchronises_past_garbage(payloads, garbage, where):
    where = min(where, len(payloads))
    data = frame_records(payloads[:where]) + garbage + frame_records(payloads[where:])
    reader = RecordReader(io.BytesIO(data), None, skip_corrupt=True)
    assert list(reader) == payloads
    assert reader.stats.skipped_bytes == len(garbage)
    assert reader.stats.records == len(payloads)


def test_strict_mode_names_the_file_and_hints_at_offset_zero(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a tfrecord file at all, just text")
    with pytest.raises(CorruptRecordError) as raised:
        list(read_records(str(path)))
    message = str(raised.value)
    assert str(path) in message and "offset 0" in message and "may not be a TFRecord" in message


def test_write_many_equals_single_writes_and_tracks_offsets():
    payloads = [b"x" * n for n in (0, 1, 8, 300)]
    one = io.BytesIO()
    with RecordWriter(one) as writer:
        starts = []
        for payload in payloads:
            starts.append(writer.bytes_written)
            writer.write(payload)
        assert writer.records_written == 4
    many = io.BytesIO()
    with RecordWriter(many) as writer:
        writer.write_many(iter(payloads))
        assert writer.bytes_written == len(one.getvalue())
    assert one.getvalue() == many.getvalue()
    with RecordReader(io.BytesIO(one.getvalue()), None) as reader:
        assert [offset for offset, _ in reader.records_with_offsets()] == starts


def test_frame_buffer_equals_frame_records():
    payloads = [b"", b"abc", b"\x00" * 9]
    data = b"".join(payloads)
    assert frame_buffer(data, [0, 0, 3, 12]) == frame_records(payloads)


def test_records_over_two_gib_are_refused():
    class Huge:
        def __len__(self) -> int:
            return 2**31

    with pytest.raises(RecordTooLargeError, match="2 GiB - 1"):
        frame_record(Huge())  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", ["bzip2", "snappy", "zstd", "lz4", "deflate64"])
def test_codecs_tensorflow_cannot_read_are_refused(codec):
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
        RecordWriter(io.BytesIO(), codec)
    with pytest.raises(UnsupportedCompressionError, match="TensorFlow"):
        list(read_records(io.BytesIO(b""), codec))


def test_auto_compression_by_extension(tmp_path):
    payloads = [b"one", b"two"]
    for name, compression in (("a.tfrecord.gz", "gzip"), ("a.tfrecord.zlib", "zlib"), ("a.zz", "zlib"), ("a.tfrecord", None)):
        path = tmp_path / name
        with RecordWriter(str(path), "auto") as writer:
            writer.write_many(payloads)
        assert writer.compression == compression
        assert list(read_records(str(path))) == payloads
    assert (tmp_path / "a.tfrecord.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "a.zz").read_bytes()[:2] == b"\x78\x9c"


def test_trailing_garbage_after_a_zlib_stream_is_an_error():
    data = _encode([b"abc"], "zlib") + b"junk"
    with pytest.raises(CorruptRecordError, match="trailing data"):
        _read(data, "zlib")


def test_concatenated_gzip_members_are_one_stream():
    data = _encode([b"a", b"b"], "gzip") + _encode([b"c"], "gzip")
    assert _read(data, "gzip") == [b"a", b"b", b"c"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=40), max_size=4), min_size=1, max_size=12))
def test_every_member_of_many_small_gzip_members_is_read(members):
    """Several members ending inside one read (`cat a.gz b.gz c.gz`): none is dropped."""
    data = b"".join(_encode(payloads, "gzip") for payloads in members)
    assert _read(data, "gzip") == [payload for payloads in members for payload in payloads]


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=6), compression=st.sampled_from(["gzip", "zlib"]),
       data=st.data())
def test_a_compressed_stream_cut_anywhere_before_its_trailer_raises_truncated_stream(payloads, compression, data):
    """Without the TF vectors: a cut that falls between framed records must not pass as a clean end of file."""
    encoded = _encode(payloads, compression)
    trailer = 8 if compression == "gzip" else 4  # CRC32 + ISIZE, or Adler-32
    cut = data.draw(st.integers(1, len(encoded) - 1), label="cut")
    with pytest.raises((TruncatedRecordError, CorruptRecordError)) as caught:
        _read(encoded[:cut], compression)
    if cut > len(encoded) - trailer:  # only the trailer is missing: every record decompressed
        assert caught.value.check == "truncated_stream"


def test_the_mask_is_the_formats_rotation_plus_its_constant():
    """Without the TF vectors: mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, mod 2^32, of crc32c."""
    import crc32c

    for payload in (b"", b"a", b"hello world", bytes(range(256))):
        crc = crc32c.crc32c(payload)
        assert masked_crc32c(payload) == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc32c(b"") == 0xA282EAD8  # crc32c(b"") is 0, so the mask of nothing is the constant itself


def test_find_record_start_skips_to_the_next_valid_record():
    payloads = [b"first record", b"second", b"third!"]
    data = frame_records(payloads)
    second = 16 + len(payloads[0])
    assert find_record_start(io.BytesIO(data), 0) == 0
    assert find_record_start(io.BytesIO(data), 1) == second
    assert find_record_start(io.BytesIO(data), second) == second
    assert find_record_start(io.BytesIO(data), len(data) - 3) is None
    assert find_record_start(io.BytesIO(data), 1, limit=second) is None


def _import_output(hardware_crc: bool) -> str:
    """What importing the record module prints in a fresh process where crc32c reports hardware support or not."""
    code = f"import crc32c\ncrc32c.hardware_based = {hardware_crc}\nimport tfrbeam.tfrecord.records"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, check=True)
    return done.stderr


def test_missing_hardware_crc_warns_loudly():
    """Without hardware CRC32C every record is several times slower: importing tfrbeam says so, as a warning and a log."""
    printed = _import_output(hardware_crc=False)
    assert "RuntimeWarning: tfrbeam: the crc32c package found no hardware CRC32C support" in printed
    assert printed.count("several times slower") == 2  # the warning, and the log record
    assert _import_output(hardware_crc=True) == ""


def test_resync_ignores_candidates_whose_length_does_not_fit_the_file():
    # The first 8 bytes of an 8-byte payload pass as a header with a valid length CRC (the payload's
    # data CRC follows them); the length they announce must not send the reader past the file.
    payloads = [hashlib.sha256(str(i).encode()).digest()[:8] for i in range(100)]
    framed = bytearray(frame_records(payloads))
    framed[10 * 24 + 8] ^= 0x01  # the length CRC of record 10
    reader = RecordReader(io.BytesIO(bytes(framed)), None, skip_corrupt=True)
    assert list(reader) == payloads[:10] + payloads[11:]
    assert reader.stats.skipped_bytes == 24
    assert find_record_start(io.BytesIO(bytes(framed)), 1) == 24


def test_short_read_streams_without_seek_still_resync():
    payloads = [b"abcdefgh"] * 5
    data = frame_records(payloads[:2]) + b"\x00junk" + frame_records(payloads[2:])
    reader = RecordReader(ShortReads(data, [3]), None, skip_corrupt=True)
    assert list(reader) == payloads and reader.stats.skipped_bytes == 5
