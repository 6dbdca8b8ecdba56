"""A record header's declared length is checked before anything is buffered for it (issue 43, item 2).

A gzip shard whose first header claims 2^40 bytes, followed by 1.5 GiB of zeros (1.6 MB compressed), made every
sequential reader buffer about 3.1 GB before it reported the bad length. Each reader runs here in a child process
with a memory budget and a time limit (tests/builder/inputs/bounded.py): it must refuse in one line naming the file,
the offset, the claimed length and the cap, in bounded time and memory.
"""

from __future__ import annotations

import gzip
import struct

import pytest

from tests.builder.inputs.bounded import run_bounded
from tfrbeam.tfrecord.records import MAX_PAYLOAD_SIZE, masked_crc32c

_ZEROS_MEMBER = gzip.compress(bytes(16 << 20), compresslevel=9)  # ~16 KB: 16 MiB of zeros
_BOMB_ZEROS = 1536 << 20  # 1.5 GiB of zeros after the header
_SETUP = "import collections\nfrom tfrbeam.tfrecord.records import read_records\n" \
         "from tfrbeam.tfrecord.blocks import record_blocks\n" \
         "from tfrbeam.builder.inputs.tfrecord import read_tfrecord_file\n"
_READERS = {
    "read_records": "collections.deque(read_records({path!r}), maxlen=0)",
    "record_blocks": "collections.deque(record_blocks({path!r}), maxlen=0)",
    "build_input": "collections.deque(read_tfrecord_file({path!r}, None, {compression!r}), maxlen=0)",
}
_MEMORY_GROWTH = 200 << 20  # a refusal before reading holds a few MiB of buffers


def _header(length: int) -> bytes:
    encoded = struct.pack("<Q", length)
    return encoded + struct.pack("<I", masked_crc32c(encoded))


def _gzip_bomb(path, length: int) -> None:
    """A gzip file (concatenated members, as gzip itself reads) of one header then 1.5 GiB of zeros, ~1.6 MB."""
    with open(path, "wb") as handle:
        handle.write(gzip.compress(_header(length)))
        for _ in range(_BOMB_ZEROS // (16 << 20)):
            handle.write(_ZEROS_MEMBER)


def _sparse_bomb(path, length: int) -> None:
    """An uncompressed file of one header then a 1.5 GiB hole (no disk blocks)."""
    with open(path, "wb") as handle:
        handle.write(_header(length))
        handle.truncate(12 + _BOMB_ZEROS)


@pytest.mark.parametrize("reader", sorted(_READERS))
@pytest.mark.parametrize("kind", ["gzip", "sparse"])
def test_a_header_claiming_2_to_the_40_bytes_is_refused_before_buffering(tmp_path, reader, kind):
    path = tmp_path / ("bomb.tfrecord.gz" if kind == "gzip" else "bomb.tfrecord")
    (_gzip_bomb if kind == "gzip" else _sparse_bomb)(path, 1 << 40)
    body = _READERS[reader].format(path=str(path), compression="gzip" if kind == "gzip" else None)
    outcome = run_bounded(body, setup=_SETUP, timeout=60)
    assert outcome.type in ("CorruptRecordError", "InputError"), outcome
    message = outcome.error
    assert "\n" not in message
    assert str(path) in message and "offset 0" in message
    assert f"claims {1 << 40} bytes" in message and f"at most {MAX_PAYLOAD_SIZE} bytes" in message
    assert outcome.rss_growth < _MEMORY_GROWTH, outcome
    assert outcome.seconds < 10, outcome


@pytest.mark.parametrize("reader", sorted(_READERS))
def test_a_length_under_the_cap_but_past_the_end_of_the_file_is_refused_without_reading(tmp_path, reader):
    path = tmp_path / "short.tfrecord"
    _sparse_bomb(path, MAX_PAYLOAD_SIZE)  # a legal length, 2 GiB - 1, in a file of 1.5 GiB
    outcome = run_bounded(_READERS[reader].format(path=str(path), compression=None), setup=_SETUP, timeout=60)
    assert outcome.type in ("TruncatedRecordError", "InputError"), outcome
    assert "\n" not in outcome.error and str(path) in outcome.error
    assert f"the header announces {MAX_PAYLOAD_SIZE} payload bytes, {_BOMB_ZEROS} are present" in outcome.error
    assert outcome.rss_growth < _MEMORY_GROWTH, outcome
    assert outcome.seconds < 10, outcome


def test_skip_corrupt_passes_over_an_absurd_length_and_reads_the_record_after_it(tmp_path):
    from tfrbeam.tfrecord.records import frame_record, read_records

    path = tmp_path / "mixed.tfrecord.gz"
    path.write_bytes(gzip.compress(_header(1 << 40) + bytes(100) + frame_record(b"kept")))
    skipped = []
    assert list(read_records(str(path), skip_corrupt=True, on_skip=skipped.append)) == [b"kept"]
    assert [(region.offset, region.reason) for region in skipped] == [(0, "length_too_large")]
