"""One decompress call of a compressed input never returns more than a bounded amount (issue 43, "What to build" 2).

A decompressor asked for everything its input holds hands a bomb's whole expansion back at once: 64 KiB of gzip
is 64 MiB of zeros, of xz about 450 MB, of bzip2 or zstd gigabytes. Reading the first MiB of each bomb must not
grow the reader's memory by more than a few MiB; reading on must give back every byte, checked to the end.
"""

from __future__ import annotations

import bz2
import lzma
import zlib

import pytest
import zstandard
from hypothesis import given, settings, strategies as st

from tests.builder.inputs.bounded import run_bounded
from tfrbeam.builder.inputs.compressed import open_checked

_ZEROS = 128 << 20


def _compressed_zeros(codec: str) -> bytes:
    """128 MiB of zeros in one stream of the codec: under 64 KiB for every codec but gzip (about 130 KB)."""
    chunk = bytes(16 << 20)
    if codec == "zst":
        compressor = zstandard.ZstdCompressor().compressobj(size=_ZEROS)
        return b"".join([*(compressor.compress(chunk) for _ in range(_ZEROS // len(chunk))), compressor.flush()])
    compressor = {"gz": lambda: zlib.compressobj(9, zlib.DEFLATED, 31), "bz2": lambda: bz2.BZ2Compressor(9),
                  "xz": lambda: lzma.LZMACompressor(preset=0)}[codec]()
    return b"".join([*(compressor.compress(chunk) for _ in range(_ZEROS // len(chunk))), compressor.flush()])


@pytest.mark.parametrize("codec", ["gz", "bz2", "xz", "zst"])
def test_reading_the_first_mib_of_a_bomb_holds_a_few_mib(tmp_path, codec):
    path = tmp_path / f"bomb.jsonl.{codec}"
    path.write_bytes(_compressed_zeros(codec))
    outcome = run_bounded(f"""
        handle = open_checked({str(path)!r})
        assert handle.read(1 << 20) == bytes(1 << 20)
    """, setup="from tfrbeam.builder.inputs.compressed import open_checked", budget=768 << 20, timeout=60)
    assert outcome.type is None, outcome
    assert outcome.rss_growth < 24 << 20, outcome


@settings(max_examples=40, deadline=None)
@given(codec=st.sampled_from(["gz", "bz2", "xz", "zst", "deflate"]), members=st.integers(1, 3),
       sizes=st.lists(st.integers(0, 3 << 20), min_size=1, max_size=3), read_size=st.sampled_from([1, 4099, 1 << 22]))
def test_bounded_decompression_gives_back_every_byte_of_every_member(tmp_path_factory, codec, members, sizes,
                                                                     read_size):
    """Members of zeros and of text, read in pieces of any size, come back exactly (zstd and deflate one member)."""
    compress = {"gz": lambda data: zlib.compress(data, 9, wbits=31), "bz2": bz2.compress, "xz": lzma.compress,
                "zst": zstandard.ZstdCompressor().compress, "deflate": zlib.compress}[codec]
    if codec == "deflate":
        members = 1
    parts = [bytes(size) if index % 2 else (b"%d," % index) * (size // 4) for index, size in enumerate(sizes)]
    text = b"".join(parts)
    path = tmp_path_factory.mktemp("members") / f"in.jsonl.{codec}"
    path.write_bytes(b"".join(compress(text) for _ in range(members)))
    with open_checked(str(path)) as handle:
        pieces = []
        while piece := handle.read(read_size if read_size > 1 else 1 << 16):
            assert len(piece) <= max(read_size, 1 << 16)
            pieces.append(piece)
    assert b"".join(pieces) == text * members
